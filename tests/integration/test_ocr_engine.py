"""The real OCR (rapidocr + onnxruntime) on a Pillow-drawn slide with known text: words read,
boxes in original pixels, reading order across two columns."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont
from rapidfuzz.distance import Levenshtein

from streamfuse.frames import EventFrame
from streamfuse.testing import run_stage
from streamfuse.vision import KeyFrame, OcrConfig, OcrStage, RapidOcrEngine

pytestmark = pytest.mark.integration

FONT_DIR = Path("/usr/share/fonts/truetype")

TITLE = "Quarterly network report"
LEFT = ["Edge devices", "Latency 42 ms", "Packets lost 3"]
RIGHT = ["Cloud nodes", "Throughput 870 MB", "Uptime 99 days"]


def font(size: int, bold: bool = False) -> ImageFont.FreeTypeFont:
    name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
    path = FONT_DIR / "dejavu" / name
    if path.exists():
        return ImageFont.truetype(str(path), size)
    return ImageFont.load_default(size=size)  # Pillow's bundled scalable font


def draw_slide(width: int, height: int) -> tuple[np.ndarray, dict[str, tuple[int, int, int, int]]]:
    """A title over two columns; returns the RGB image and each line's drawn bbox."""
    scale = width / 1280
    img = Image.new("RGB", (width, height), (250, 248, 240))
    d = ImageDraw.Draw(img)
    boxes: dict[str, tuple[int, int, int, int]] = {}

    def put(text: str, x: float, y: float, size: int, bold: bool = False) -> None:
        f = font(round(size * scale), bold)
        xy = (round(x * scale), round(y * scale))
        d.text(xy, text, font=f, fill=(25, 25, 35))
        x0, y0, x1, y1 = d.textbbox(xy, text, font=f)
        boxes[text] = (int(x0), int(y0), int(x1), int(y1))

    put(TITLE, 300, 60, 52, bold=True)
    for i, text in enumerate(LEFT):
        put(text, 110, 200 + 60 * i, 34)
    for i, text in enumerate(RIGHT):
        put(text, 700, 200 + 60 * i, 34)
    return np.asarray(img), boxes


@pytest.fixture(scope="module", params=["int8", "fp32"])
def engine(request: pytest.FixtureRequest) -> RapidOcrEngine:
    e = RapidOcrEngine(OcrConfig(intra_op_threads=2, precision=request.param))
    e.load()
    # The shipped INT8 detector matches the pinned rapidocr: no silent fallback to FP32.
    assert e.precision == request.param
    return e


def run_ocr(engine: RapidOcrEngine, image: np.ndarray) -> EventFrame:
    stage = OcrStage(OcrConfig(), engine=engine)
    h, w = image.shape[:2]
    key = KeyFrame(t_media=1.5, image=image, index=45, changed_bbox=(0, 0, w, h), reason="first")

    events = asyncio.run(run_stage(stage, [key]))
    assert len(events) == 1 and isinstance(events[0], EventFrame), events
    return events[0]


def iou(a: list[int] | tuple[int, ...], b: tuple[int, int, int, int]) -> float:
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


@pytest.mark.parametrize("size", [(1280, 720), (1920, 1080)])
def test_reads_a_drawn_two_column_slide(engine: RapidOcrEngine, size: tuple[int, int]) -> None:
    image, drawn = draw_slide(*size)
    ev = run_ocr(engine, image)
    lines = ev.payload.fields()["lines"]
    got = [ln["text"] for ln in lines]
    expected = [TITLE, *LEFT, *RIGHT]  # title, then the left column, then the right one
    assert len(got) == len(expected), got
    for g, e in zip(got, expected, strict=True):
        assert Levenshtein.distance(g.casefold(), e.casefold()) <= 1, (g, e)
    # Boxes are in the original frame's pixels (not the detector's 960-px input).
    for ln, text in zip(lines, expected, strict=True):
        assert iou(ln["box"], drawn[text]) > 0.5, (text, ln["box"], drawn[text])
        assert 0.5 <= ln["conf_raw"] <= 1.0 and 0.0 <= ln["conf"] <= 1.0  # raw, calibrated
    # The detector ran at the default 960-px long side, whatever the frame size.
    assert max(ev.payload.fields()["resolution"]) == 960
    assert ev.t_media == 1.5 and ev.payload.fields()["frame_index"] == 45


def test_detector_resolution_follows_the_plan(engine: RapidOcrEngine) -> None:
    image, _ = draw_slide(1280, 720)
    low = engine.read(image, 480)
    assert low.resolution == (480, 256)  # long side to 480, each side on the 32-px grid
    assert TITLE in [ln.text for ln in low.lines]
    # Recognition reads the full-resolution crops: boxes stay in original pixels.
    title = next(ln for ln in low.lines if ln.text == TITLE)
    assert title.box[2] > 900


def test_blank_picture_gives_no_lines(engine: RapidOcrEngine) -> None:
    blank = np.full((360, 640, 3), 240, dtype=np.uint8)
    assert engine.read(blank, 960).lines == ()


def test_unloadable_int8_file_falls_back_to_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from streamfuse.vision import ocr
    from streamfuse.vision.config import OcrConfig

    broken = tmp_path / "det.onnx"
    broken.write_bytes(b"not an onnx model")
    monkeypatch.setattr(ocr, "int8_model_paths", lambda rapid: {"det": broken})
    engine = ocr.RapidOcrEngine(OcrConfig(intra_op_threads=1, precision="int8"))
    with caplog.at_level(logging.WARNING):
        engine.load()
    assert engine.precision == "fp32"
    assert "reading in FP32" in caplog.text and "det.onnx" in caplog.text
