"""Layout-aware OCR: tables read row by row with cells in column order, boxes on one baseline
joined, titles and footers set apart from columns, the rung floor from text height, the
re-read of low-confidence lines, and how table rows are scored. The OCR engine is a scripted
fake (the model boundary) that reads a scene of lines placed on a real picture."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import pytest

from streamfuse.evaluation import Truth, ocr_cer
from streamfuse.testing import run_stage
from streamfuse.vision import (
    FixedResolution,
    KeyFrame,
    OcrConfig,
    OcrEngine,
    OcrLine,
    OcrReading,
    OcrStage,
)
from streamfuse.vision.layout import CELL_SEPARATOR, Rules, find_rules, layout
from streamfuse.vision.textsize import floor_side_px, smallest_text_height_px

pytestmark = pytest.mark.unit

W, H = 1280, 720


def line(text: str, x0: float, y0: float, x1: float, y1: float, conf: float = 0.99) -> OcrLine:
    return OcrLine(text, (x0, y0, x1, y1), conf)


class SceneEngine(OcrEngine):
    """Reads `scene` (lines in frame pixels) from whatever part of `frame` it is given.

    A line listed in `small` is cut short, with low confidence, when it is less than
    `legible_px` high at the detector's input - what a real detector does to small text at a
    low rung.
    """

    def __init__(
        self,
        frame: np.ndarray,
        scene: Sequence[OcrLine],
        small: dict[str, str] | None = None,
        legible_px: float = 6.0,
        hidden: frozenset[str] = frozenset(),
    ) -> None:
        self.frame = frame
        self.scene = list(scene)
        self.small = small or {}
        self.legible_px = legible_px
        #: Lines only found in a small crop (a short cell the full-frame read misses).
        self.hidden = hidden
        self.sides: list[int] = []
        self.shapes: list[tuple[int, ...]] = []

    def read(self, image: np.ndarray, det_max_side_px: int) -> OcrReading:
        self.sides.append(det_max_side_px)
        self.shapes.append(image.shape)
        # Where the image lies in the frame (the stage passes views of the frame).
        offset = image.__array_interface__["data"][0] - self.frame.__array_interface__["data"][0]
        oy, rest = divmod(offset, self.frame.strides[0])
        ox = rest // self.frame.strides[1]
        h, w = image.shape[:2]
        scale = min(1.0, det_max_side_px / max(w, h))
        out = []
        for ln in self.scene:
            x0, y0, x1, y1 = ln.box
            if x0 < ox or y0 < oy or x1 > ox + w or y1 > oy + h:
                continue
            text, conf = ln.text, ln.conf
            if ln.text in self.hidden and w * h > 0.25 * self.frame.shape[0] * self.frame.shape[1]:
                continue
            if ln.text in self.small and (y1 - y0) * scale < self.legible_px:
                text, conf = self.small[ln.text], 0.6
                x1 = x0 + (x1 - x0) * len(text) / len(ln.text)
            out.append(OcrLine(text, (x0 - ox, y0 - oy, x1 - ox, y1 - oy), conf))
        return OcrReading(tuple(out), (round(w * scale), round(h * scale)), 5.0)


def key(image: np.ndarray) -> KeyFrame:
    h, w = image.shape[:2]
    return KeyFrame(
        t_media=0.0, arrival_wall=100.0, image=image, changed_bbox=(0, 0, w, h), reason="first"
    )


def read_text(stage: OcrStage, image: np.ndarray) -> list[str]:
    events = asyncio.run(run_stage(stage, [key(image)]))
    assert len(events) == 1
    return str(events[0].payload.fields()["text"]).split("\n")


def blank() -> np.ndarray:
    return np.full((H, W, 3), 255, np.uint8)


def grid(image: np.ndarray, xs: Sequence[int], ys: Sequence[int]) -> None:
    for x in xs:
        cv2.line(image, (x, ys[0]), (x, ys[-1]), (90, 90, 110), 2)
    for y in ys:
        cv2.line(image, (xs[0], y), (xs[-1], y), (90, 90, 110), 2)


# A 3-column table at rows y = 150 + 60 k, columns x = 90 | 390 | 610 | 830.
TABLE = [
    line("Model comparison", 90, 50, 585, 105),
    line("Model", 104, 165, 200, 200),
    line("Params", 404, 165, 522, 200),
    line("Latency", 624, 165, 748, 200),
    line("tiny", 104, 225, 158, 260),
    line("39", 404, 225, 440, 260),  # number and unit boxed apart: one cell
    line("M", 447, 225, 473, 260),
    line("120 ms", 624, 225, 730, 260),
    line("base", 104, 285, 172, 320),
    line("74 M", 404, 285, 472, 320),
    line("210 ms", 624, 285, 730, 320),
    line("Measured on 4 CPU cores", 90, 656, 400, 681),
]
TABLE_ROWS = [
    "Model comparison",
    "Model | Params | Latency",
    "tiny | 39 M | 120 ms",
    "base | 74 M | 210 ms",
    "Measured on 4 CPU cores",
]


def shuffled(lines: Sequence[OcrLine]) -> list[OcrLine]:
    order = np.random.default_rng(7).permutation(len(lines))
    return [lines[i] for i in order]


def test_a_ruled_table_is_read_row_by_row_with_cells_in_column_order() -> None:
    image = blank()
    grid(image, [90, 390, 610, 830], [150, 210, 270, 330])
    engine = SceneEngine(image, shuffled(TABLE))
    assert read_text(OcrStage(engine=engine), image) == TABLE_ROWS


def test_a_striped_table_without_rules_is_a_table_too() -> None:
    image = blank()
    for y in (150, 270):  # header band and every other row shaded, no lines drawn
        image[y : y + 60, 90:830] = (214, 228, 246)
    engine = SceneEngine(image, shuffled(TABLE))
    assert read_text(OcrStage(engine=engine), image) == TABLE_ROWS


def test_aligned_rows_without_separators_read_as_columns_with_the_footer_last() -> None:
    # Two text columns whose lines happen to align (as on the bundled clip), a footer under
    # the left column: no drawn separator, so not a table; the footer is not part of the
    # left column.
    lines = [
        line("Offline and live", 440, 50, 840, 100),
        line("Offline", 110, 170, 230, 210),
        line("Live", 690, 170, 760, 210),
        line("Whole file at once", 110, 230, 380, 262),
        line("Short windows", 690, 230, 900, 262),
        line("Beam search", 110, 272, 290, 304),
        line("Greedy decoding", 690, 272, 930, 304),
        line("Slide 14 of 30", 110, 600, 260, 622),
    ]
    image = blank()
    engine = SceneEngine(image, shuffled(lines))
    assert read_text(OcrStage(engine=engine), image) == [
        "Offline and live",
        "Offline",
        "Whole file at once",
        "Beam search",
        "Live",
        "Short windows",
        "Greedy decoding",
        "Slide 14 of 30",
    ]


def test_a_title_centred_over_three_columns_is_read_first() -> None:
    lines = [
        line("Three inputs", 520, 40, 760, 95),
        *(
            line(word, x, y, x + 140, y + 34)
            for x, words in (
                (80, ("Camera", "Frames", "Motion")),
                (480, ("Mic", "Speech", "Music")),
            )
            for y, word in zip((170, 225, 270), words, strict=True)
        ),
        *(
            line(w, 880, y, 1000, y + 34)
            for y, w in zip((170, 225, 270), ("Screen", "Slides", "Code"), strict=True)
        ),
    ]
    image = blank()
    text = read_text(OcrStage(engine=SceneEngine(image, shuffled(lines))), image)
    assert text[0] == "Three inputs"
    assert text[1:4] == ["Camera", "Frames", "Motion"] and text[-1] == "Code"


def test_boxes_on_one_baseline_are_one_line_left_to_right() -> None:
    lines = [
        line("Every stage keeps up", 121, 322, 808, 365),
        line("300 ms", 700, 376, 800, 420),
        line("Latency budget", 123, 376, 420, 420),
        line("words", 430, 378, 520, 418),
    ]
    image = blank()
    text = read_text(OcrStage(engine=SceneEngine(image, lines)), image)
    assert text == ["Every stage keeps up", "Latency budget words 300 ms"]


def test_layout_marks_table_rows_and_keeps_empty_cells() -> None:
    items = [ln for ln in TABLE if ln.text not in ("74 M",)]
    rules = Rules(horizontal=((210.0, 90.0, 830.0), (270.0, 90.0, 830.0)))
    lines = layout(items, rules=rules)
    rows = [ln for ln in lines if ln.is_table_row]
    assert len(rows) == 3 and not lines[0].is_table_row
    assert rows[2].cells is not None
    assert [[it.text for it in cell] for cell in rows[2].cells] == [["base"], [], ["210 ms"]]
    # Without any separator the same boxes are not a table.
    assert not any(ln.is_table_row for ln in layout(items, rules=Rules()))


def test_find_rules_sees_rules_and_stripe_edges_but_not_text() -> None:
    image = blank()
    grid(image, [90, 390, 610], [150, 210, 270])
    image[400:460, 90:830] = (214, 228, 246)
    cv2.putText(image, "Some text here", (100, 600), cv2.FONT_HERSHEY_SIMPLEX, 1.5, (0, 0, 0), 3)
    rules = find_rules(image)
    ys = sorted(round(y) for y, _, _ in rules.horizontal)
    assert all(any(abs(y - want) <= 2 for y in ys) for want in (150, 210, 270, 400, 460))
    assert not any(560 <= y <= 620 for y in ys)
    # A drawn rule has two edges, one each side of it.
    xs = [round(x) for x, _, _ in rules.vertical]
    assert {min((90, 390, 610), key=lambda want: abs(x - want)) for x in xs} == {90, 390, 610}
    assert all(min(abs(x - want) for want in (90, 390, 610)) <= 3 for x in xs)
    # Only inside a region, in frame pixels.
    inside = find_rules(image, (60, 380, 900, 480))
    assert {round(y) for y, _, _ in inside.horizontal} <= {399, 400, 401, 459, 460, 461}
    assert len(inside.horizontal) >= 2


# -- rung floor and re-read -------------------------------------------------------------------


def small_text_slide() -> tuple[np.ndarray, float]:
    image = blank()
    cv2.putText(image, "Big title", (90, 120), cv2.FONT_HERSHEY_SIMPLEX, 2.5, (0, 0, 0), 5)
    cv2.putText(
        image, "a small footer line", (90, 680), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1
    )
    footer_h = smallest_text_height_px(image)
    assert footer_h is not None
    return image, footer_h


def test_the_smallest_text_is_measured_not_the_largest() -> None:
    image, footer_h = small_text_slide()
    assert 6 <= footer_h <= 14  # Hershey 0.45: ~10 px glyphs; the title is ~60 px
    assert smallest_text_height_px(blank()) is None
    rules_only = blank()
    grid(rules_only, [90, 390, 610], [150, 210, 270])
    assert smallest_text_height_px(rules_only) is None  # lines are not text
    assert floor_side_px(10.0, 1280, min_text_px=7.0) == 896
    assert floor_side_px(4.0, 1280, min_text_px=7.0) == 1280  # never above the frame
    assert floor_side_px(None, 1280, min_text_px=7.0) is None


def test_small_text_raises_the_detector_side_above_the_policy_rung() -> None:
    image, footer_h = small_text_slide()
    scene = [line("Big title", 90, 60, 500, 125), line("a small footer line", 90, 668, 300, 684)]
    engine = SceneEngine(image, scene, small={"a small footer line": "a small fo"})
    stage = OcrStage(engine=engine, policy=FixedResolution(384))
    assert read_text(stage, image) == ["Big title", "a small footer line"]
    floor = floor_side_px(footer_h, W, min_text_px=OcrConfig().min_text_px or 0)
    assert floor is not None and engine.sides[0] == floor > 384
    # With the floor off the policy's rung stands (and the footer is cut short, then re-read).
    engine = SceneEngine(image, scene, small={"a small footer line": "a small fo"})
    stage = OcrStage(OcrConfig(min_text_px=None), engine=engine, policy=FixedResolution(384))
    assert read_text(stage, image)[1] == "a small footer line"
    assert engine.sides[0] == 384


def test_a_low_confidence_line_is_read_again_from_a_full_resolution_crop() -> None:
    image = blank()
    scene = [line("Title", 90, 60, 500, 125), line("Department of Computing", 90, 600, 500, 640)]
    small = {"Department of Computing": "Department of"}
    cfg = OcrConfig(min_text_px=None)
    engine = SceneEngine(image, scene, small=small, legible_px=25)
    assert read_text(OcrStage(cfg, engine=engine, policy=FixedResolution(640)), image) == [
        "Title",
        "Department of Computing",
    ]
    assert engine.sides[0] == 640
    strip_h, strip_w = engine.shapes[1][:2]
    assert strip_h < 100 and engine.sides[1] == max(strip_h, strip_w)  # native: no downscale
    # Off: the cut reading stands.
    engine = SceneEngine(image, scene, small=small, legible_px=25)
    cfg = OcrConfig(min_text_px=None, reread_below_conf=None)
    text = read_text(OcrStage(cfg, engine=engine, policy=FixedResolution(640)), image)
    assert text == ["Title", "Department of"] and len(engine.sides) == 1


def test_a_letter_read_into_a_picture_is_dropped() -> None:
    image = blank()
    scene = [
        line("Sensor gallery", 467, 39, 808, 103),
        line("H", 432, 110, 841, 472, conf=0.95),
        line("Microphone array", 78, 490, 237, 517),
    ]
    text = read_text(OcrStage(engine=SceneEngine(image, scene)), image)
    assert text == ["Sensor gallery", "Microphone array"]


# -- scoring ----------------------------------------------------------------------------------


def test_table_rows_are_scored_strictly_with_their_separators() -> None:
    truth = Truth(
        duration_s=4.0,
        ocr=[{"t_start": 0.0, "t_end": 4.0, "lines": ["Decoder | 1.5 GB", "Encoder | 820 MB"]}],  # type: ignore[list-item]
    )

    def score(lines: list[str]) -> dict[str, Any]:
        event = {
            "type": "ocr",
            "stream_id": "s",
            "t_start": 0.5,
            "t_end": 0.5,
            "latency_ms": 1.0,
            "lines": [{"text": t, "box": [0, 0, 1, 1], "conf": 1.0} for t in lines],
            "text": "\n".join(lines),
            "n_lines": len(lines),
            "resolution": [640, 360],
            "scale": 0.5,
            "roi": [0, 0, 1280, 720],
            "ocr_ms": 1.0,
            "mean_conf": 1.0,
            "frame_index": 0,
            "t_changed": 0.4,
            "reason": "first",
        }
        slide: dict[str, Any] = ocr_cer(truth, [event])["ocr_slides"][0]
        return slide

    assert score(["Decoder | 1.5 GB", "Encoder | 820 MB"])["edits"] == 0
    assert CELL_SEPARATOR == " | "
    # Each missing separator costs 2 characters.
    assert score(["Decoder 1.5 GB", "Encoder 820 MB"])["edits"] == 4
    column_order = score(["Decoder", "Encoder", "1.5 GB", "820 MB"])
    assert column_order["chars"] == 33 and column_order["cer"] > 0.3


def test_text_high_on_one_side_and_low_on_the_other_is_read_top_down() -> None:
    # A list at the top right, small print at the bottom left: not two columns side by side.
    lines = [
        line("Next steps", 897, 49, 1197, 110),
        line("Test on real lectures", 871, 163, 1197, 209),
        line("Publish the data set", 878, 208, 1199, 251),
        line("All figures are preliminary", 75, 628, 352, 648),
        line("Licensed under CC BY 4.0", 75, 645, 395, 664),
    ]
    image = blank()
    assert read_text(OcrStage(engine=SceneEngine(image, shuffled(lines))), image) == [
        ln.text for ln in lines
    ]


def test_an_empty_cell_of_a_filled_column_is_read_again_from_its_crop() -> None:
    image = blank()
    grid(image, [90, 390, 610, 830], [150, 210, 270, 330])
    engine = SceneEngine(image, shuffled(TABLE), hidden=frozenset({"120 ms"}))
    assert read_text(OcrStage(engine=engine), image) == TABLE_ROWS
    cell_h, cell_w = engine.shapes[-1][:2]
    assert cell_w < 400 and cell_h < 100  # the cell's crop, not the frame
