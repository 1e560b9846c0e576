"""The real OCR (rapidocr + onnxruntime) on Pillow-drawn pictures of three layout classes the
old layout misread with every letter right: a right-aligned table column beside a left-aligned
one, captions under two side-by-side pictures, drawn bullet marks (docs/ocr-layout.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from streamfuse.testing import run_stage
from streamfuse.vision import KeyFrame, OcrConfig, OcrStage, RapidOcrEngine

pytestmark = pytest.mark.integration

FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
INK = (25, 25, 35)


def font(size: int) -> ImageFont.FreeTypeFont:
    if FONT.exists():
        return ImageFont.truetype(str(FONT), size)
    return ImageFont.load_default(size=size)  # Pillow's bundled scalable font


@pytest.fixture(scope="module")
def engine() -> RapidOcrEngine:
    e = RapidOcrEngine(OcrConfig(intra_op_threads=2))
    e.load()
    return e


def read(engine: RapidOcrEngine, img: Image.Image) -> list[str]:
    image = np.asarray(img)
    h, w = image.shape[:2]
    stage = OcrStage(OcrConfig(calibrate=False), engine=engine)
    key = KeyFrame(t_media=0.0, image=image, changed_bbox=(0, 0, w, h), reason="first")
    events = asyncio.run(run_stage(stage, [key]))
    return [ln.text for ln in events[-1].payload.lines]


def test_a_right_aligned_column_beside_a_left_aligned_one(engine: RapidOcrEngine) -> None:
    rows = [("Part", "Mass", "Unit"), ("Frame", "12.5", "kg"), ("Wheel", "3.2", "kg")]
    rows += [("Motor", "7.9", "kg")]
    img = Image.new("RGB", (1280, 720), (252, 252, 250))
    d = ImageDraw.Draw(img)
    f = font(28)
    x0, widths, pad, row_h = 100, (300, 200, 200), 14, 60
    for r, row in enumerate(rows):
        y = 150 + r * row_h
        d.line((x0, y, x0 + sum(widths), y), fill=(60, 60, 60), width=2)
        x = x0
        for c, (cell, cw) in enumerate(zip(row, widths, strict=True)):
            tw = d.textlength(cell, font=f)
            tx = x + cw - pad - tw if c == 1 else x + pad  # "Mass" right-aligned
            d.text((tx, y + 14), cell, font=f, fill=INK)
            x += cw
    d.line((x0, 150 + 4 * row_h, x0 + sum(widths), 150 + 4 * row_h), fill=(60, 60, 60), width=2)
    assert read(engine, img) == [" | ".join(row) for row in rows]


def test_captions_under_two_pictures_and_drawn_bullets(engine: RapidOcrEngine) -> None:
    img = Image.new("RGB", (1280, 720), (246, 244, 238))
    d = ImageDraw.Draw(img)
    d.rectangle((90, 60, 590, 330), fill=(120, 150, 110))
    d.rectangle((690, 60, 1190, 330), fill=(150, 120, 100))
    d.text((90, 345), "North gate at noon", font=font(26), fill=INK)
    d.text((690, 345), "South gate at dusk", font=font(26), fill=INK)
    bullets = ["Both gates were open", "Nobody was seen"]
    for i, text in enumerate(bullets):
        y = 470 + 60 * i
        d.text((150, y), text, font=font(32), fill=INK)
        d.rectangle((118, y + 12, 134, y + 28), fill=(30, 90, 200))  # a drawn square mark
    assert read(engine, img) == ["North gate at noon", "South gate at dusk", *bullets]
