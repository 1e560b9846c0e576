#!/usr/bin/env python
"""Generate the harder OCR evaluation set: still slides played as silent video, with truth.

Contract: writes ``<out>/<split>/<item>.mp4`` (1280x720, 30 fps H.264, video only, each slide
held ``--slide-s`` seconds) and ``<item>.truth.json`` in the demo clip's truth schema
(``duration_s``, ``ocr`` with one entry per slide, ``asr`` empty), for two splits drawn from
disjoint fonts, layouts, contents and seeds: ``dev`` (pick parameters here) and ``heldout``
(report only). The output is deterministic for a given toolchain and font set.

Truth lines follow the scoring rules of ``streamfuse.evaluation`` (docs/ocr-layout.md):
lines in reading order (top to bottom, a multi-column block column by column); a table row is
ONE line, its cells in column order joined by ``" | "``; text on one baseline is one line.

    .venv/bin/python scripts/make_ocr_hard_set.py --out assets/eval/ocr [--png-dir out/png]

Slide drawing (fonts, text blocks, encoder settings) is ``make_demo_clip``'s; this script adds
tables (grid, horizontal rules, zebra stripes), code, footers and captions, dark and coloured
themes, procedural "photos" (smooth colour fields and shapes, no glyphs) with text on them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from streamfuse.vision.layout import CELL_SEPARATOR  # a table row's form, event and truth alike

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo_clip import (  # noqa: E402 - a sibling script, not a package
    FONTS,
    FPS,
    HEIGHT_PX,
    RGB,
    WIDTH_PX,
    X264_OPTIONS,
    AssetBuildError,
    TextBlock,
    _draw_block,
    _font,
)

logger = logging.getLogger("make_ocr_hard_set")

# Faces the demo clip does not use (same Debian packages): the held-out split draws from these.
FONTS.update(
    {
        "dejavu-sans-condensed": "dejavu/DejaVuSansCondensed.ttf",
        "dejavu-sans-condensed-bold": "dejavu/DejaVuSansCondensed-Bold.ttf",
        "dejavu-serif-condensed": "dejavu/DejaVuSerifCondensed.ttf",
        "dejavu-serif-condensed-bold": "dejavu/DejaVuSerifCondensed-Bold.ttf",
        "dejavu-mono-bold": "dejavu/DejaVuSansMono-Bold.ttf",
        "liberation-mono-bold": "liberation/LiberationMono-Bold.ttf",
        "liberation-narrow-bold": "liberation/LiberationSansNarrow-Bold.ttf",
        "liberation-sans-italic": "liberation/LiberationSans-Italic.ttf",
        "liberation-serif-italic": "liberation/LiberationSerif-Italic.ttf",
        "dejavu-serif-italic": "dejavu/DejaVuSerif-Italic.ttf",
    }
)


TableStyle = Literal["grid", "rules", "zebra"]


@dataclass(frozen=True)
class Table:
    """A table at (x, y): ``rows[0]`` is the header. Cells are left aligned, or right aligned
    in the columns listed in ``right``."""

    x: int
    y: int
    col_widths: tuple[int, ...]
    rows: tuple[tuple[str, ...], ...]
    font: str
    header_font: str
    size_px: int
    style: TableStyle
    ink: RGB
    line: RGB
    band: RGB = (230, 236, 245)  # zebra stripe / header band colour
    right: tuple[int, ...] = ()
    row_pad: float = 0.55  # vertical padding per row, in text heights

    @property
    def row_h(self) -> int:
        return round(self.size_px * (1 + 2 * self.row_pad))

    def lines(self) -> list[str]:
        return [CELL_SEPARATOR.join(row) for row in self.rows]


@dataclass(frozen=True)
class Photo:
    """A procedural photo-like picture in ``box`` (smooth colour field, blobs, grain) with text
    on it: on a dark translucent banner (``banner``) or in outlined letters."""

    box: tuple[int, int, int, int]
    seed: int
    text: tuple[str, ...] = ()
    font: str = "dejavu-sans-bold"
    size_px: int = 40
    banner: bool = True


Item = TextBlock | Table | Photo


@dataclass(frozen=True)
class HardSlide:
    name: str
    background: RGB
    items: tuple[Item, ...]  # drawn in this order; truth lines in this order too

    def truth_lines(self) -> list[str]:
        out: list[str] = []
        for item in self.items:
            if isinstance(item, Table):
                out.extend(item.lines())
            else:
                out.extend(item.lines if isinstance(item, TextBlock) else item.text)
        return out


# --------------------------------------------------------------------------------------------
# Drawing


def _draw_table(draw: ImageDraw.ImageDraw, t: Table) -> None:
    body = _font(t.font, t.size_px)
    head = _font(t.header_font, t.size_px)
    width = sum(t.col_widths)
    rh = t.row_h
    for r, row in enumerate(t.rows):
        y0 = t.y + r * rh
        if t.style == "zebra" and (r == 0 or r % 2 == 0):
            draw.rectangle((t.x, y0, t.x + width, y0 + rh), fill=t.band)
        if t.style == "grid" or (t.style == "rules" and r in (0, 1)):
            draw.line((t.x, y0, t.x + width, y0), fill=t.line, width=2)
        x = t.x
        for c, (cell, cw) in enumerate(zip(row, t.col_widths, strict=True)):
            font = head if r == 0 else body
            x0, _, x1, _ = draw.textbbox((0, 0), cell, font=font)
            pad = round(0.5 * t.size_px)
            if x1 - x0 > cw - 2 * pad:
                raise AssetBuildError(f"cell {cell!r} does not fit its column ({cw} px)")
            tx = x + cw - pad - (x1 - x0) if c in t.right else x + pad
            draw.text((tx, y0 + round(t.row_pad * t.size_px)), cell, font=font, fill=t.ink)
            x += cw
    bottom = t.y + len(t.rows) * rh
    if t.style in ("grid", "rules"):
        draw.line((t.x, bottom, t.x + width, bottom), fill=t.line, width=2)
    if t.style == "grid":
        x = t.x
        for cw in (0, *t.col_widths):
            x += cw
            draw.line((x, t.y, x, bottom), fill=t.line, width=2)
    if bottom > HEIGHT_PX - 10 or t.x + width > WIDTH_PX - 10:
        raise AssetBuildError(f"table at ({t.x}, {t.y}) does not fit on the slide")


def _photo(p: Photo) -> Image.Image:
    """A smooth random colour field with soft blobs and grain: photo-like, free of glyphs."""
    rng = np.random.default_rng(p.seed)
    w, h = p.box[2] - p.box[0], p.box[3] - p.box[1]
    coarse = rng.uniform(40, 220, size=(3, 4, 3)).astype(np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC))
    img = Image.fromarray(field)
    draw = ImageDraw.Draw(img)
    for _ in range(7):
        cx, cy = rng.uniform(0, w), rng.uniform(0, h)
        r = rng.uniform(0.08, 0.3) * min(w, h)
        colour = tuple(int(v) for v in rng.uniform(30, 230, size=3))
        draw.ellipse((cx - r, cy - r * 0.7, cx + r, cy + r * 0.7), fill=colour)
    img = img.filter(ImageFilter.GaussianBlur(radius=6))
    grain = rng.normal(0, 6, size=(h, w, 3))
    arr = np.clip(np.asarray(img).astype(np.float64) + grain, 0, 255).astype(np.uint8)
    return Image.fromarray(arr)


def _draw_photo(img: Image.Image, p: Photo) -> None:
    img.paste(_photo(p), p.box[:2])
    if not p.text:
        return
    font = _font(p.font, p.size_px)
    draw = ImageDraw.Draw(img, "RGBA")
    step = round(p.size_px * 1.4)
    x = p.box[0] + round(0.6 * p.size_px)
    y = p.box[3] - step * len(p.text) - round(0.6 * p.size_px)
    if p.banner:
        draw.rectangle(
            (p.box[0], y - round(0.3 * p.size_px), p.box[2], p.box[3]), fill=(0, 0, 0, 150)
        )
    for i, line in enumerate(p.text):
        x0, _, x1, _ = draw.textbbox((0, 0), line, font=font)
        if x + x1 - x0 > p.box[2]:
            raise AssetBuildError(f"photo text {line!r} does not fit")
        stroke = {} if p.banner else {"stroke_width": 3, "stroke_fill": (0, 0, 0)}
        draw.text((x, y + i * step), line, font=font, fill=(255, 255, 255), **stroke)


def render(slide: HardSlide) -> Image.Image:
    img = Image.new("RGB", (WIDTH_PX, HEIGHT_PX), slide.background)
    for item in slide.items:
        if isinstance(item, Photo):
            _draw_photo(img, item)
        elif isinstance(item, Table):
            _draw_table(ImageDraw.Draw(img), item)
        else:
            _draw_block(ImageDraw.Draw(img), item)
    return img


# --------------------------------------------------------------------------------------------
# Content: two splits with disjoint fonts, layouts, words and photo seeds

INK: RGB = (25, 25, 35)
WHITE: RGB = (255, 255, 255)


def _tb(
    lines: Sequence[str],
    font: str,
    size: int,
    color: RGB,
    x: int,
    y: int,
    align: Literal["left", "center", "right"] = "left",
    spacing: float = 1.45,
) -> TextBlock:
    return TextBlock(tuple(lines), font, size, color, x, y, align, spacing)


def dev_slides() -> list[HardSlide]:
    return [
        HardSlide(
            "grid_table",
            WHITE,
            (
                _tb(["Model comparison"], "dejavu-sans-bold", 48, INK, 90, 50),
                Table(
                    90,
                    150,
                    (300, 220, 220, 240),
                    (
                        ("Model", "Params", "Latency", "Accuracy"),
                        ("tiny", "39 M", "120 ms", "81.5 %"),
                        ("base", "74 M", "210 ms", "86.2 %"),
                        ("small", "244 M", "640 ms", "90.1 %"),
                        ("medium", "769 M", "1.9 s", "92.4 %"),
                    ),
                    "dejavu-sans",
                    "dejavu-sans-bold",
                    28,
                    "grid",
                    INK,
                    (90, 90, 110),
                ),
                _tb(
                    ["Measured on 4 CPU cores, batch size 1, English test set"],
                    "dejavu-sans",
                    16,
                    (90, 90, 100),
                    90,
                    660,
                ),
            ),
        ),
        HardSlide(
            "code_dark",
            (30, 30, 30),
            (
                _tb(["Reading frames"], "dejavu-sans-bold", 44, (230, 230, 230), 90, 50),
                _tb(
                    [
                        "def read_frames(path, fps=30):",
                        "    cap = open_video(path)",
                        "    while cap.ok():",
                        "        frame = cap.next()",
                        "        yield frame.to_rgb()",
                    ],
                    "dejavu-mono",
                    28,
                    (156, 220, 254),
                    110,
                    170,
                    spacing=1.5,
                ),
                _tb(["video.py, line 12"], "dejavu-sans", 18, (150, 150, 150), 1180, 640, "right"),
            ),
        ),
        HardSlide(
            "zebra_table",
            (248, 248, 244),
            (
                _tb(["Memory per stage"], "liberation-sans-bold", 46, INK, 640, 50, "center"),
                Table(
                    190,
                    150,
                    (330, 280, 290),
                    (
                        ("Stage", "Peak memory", "Share"),
                        ("Decoder", "1.5 GB", "42 %"),
                        ("Encoder", "820 MB", "23 %"),
                        ("Vision", "640 MB", "18 %"),
                        ("Output", "96 MB", "3 %"),
                    ),
                    "liberation-sans",
                    "liberation-sans-bold",
                    28,
                    "zebra",
                    INK,
                    (0, 0, 0),
                    band=(214, 228, 246),
                    right=(1, 2),
                ),
                _tb(
                    ["Table 2: Peak resident memory of each stage"],
                    "liberation-sans",
                    18,
                    (80, 80, 90),
                    640,
                    560,
                    "center",
                ),
            ),
        ),
        HardSlide(
            "photo_banner",
            (16, 16, 20),
            (
                _tb(["Field recording"], "dejavu-sans-bold", 44, (240, 240, 240), 90, 40),
                # The list (top right) lies above the photo's banner (bottom left): text that
                # does not share its heights is read top down (docs/ocr-layout.md).
                _tb(
                    ["Wind noise", "Camera shake", "Low light"],
                    "dejavu-sans",
                    32,
                    (220, 220, 220),
                    840,
                    200,
                ),
                Photo(
                    (90, 130, 790, 600),
                    seed=11,
                    text=("Harbour crane at dusk", "Photo: city archive, 2019"),
                    size_px=30,
                ),
            ),
        ),
        HardSlide(
            "teal_mixed_sizes",
            (0, 98, 105),
            (
                _tb(["Adaptive resolution"], "dejavu-sans-bold", 60, WHITE, 90, 60),
                _tb(
                    ["Read small text at full size", "Save work on large titles"],
                    "dejavu-sans",
                    34,
                    (220, 245, 240),
                    90,
                    190,
                ),
                _tb(
                    ["Note: the detector needs about ten pixels per line"],
                    "dejavu-sans",
                    22,
                    (190, 230, 225),
                    90,
                    360,
                ),
                _tb(
                    ["Department of Computing, course notes week 5"],
                    "dejavu-sans",
                    14,
                    (170, 215, 210),
                    90,
                    670,
                ),
            ),
        ),
        HardSlide(
            "two_columns",
            (252, 249, 240),
            (
                _tb(["Offline and live"], "dejavu-serif-bold", 48, INK, 640, 50, "center"),
                _tb(["Offline"], "dejavu-serif-bold", 34, (150, 50, 30), 110, 170),
                _tb(
                    ["Whole file at once", "Beam search", "High accuracy"],
                    "dejavu-serif",
                    28,
                    INK,
                    110,
                    230,
                ),
                _tb(["Live"], "dejavu-serif-bold", 34, (30, 100, 60), 690, 170),
                _tb(
                    ["Short windows", "Greedy decoding", "Low delay"],
                    "dejavu-serif",
                    28,
                    INK,
                    690,
                    230,
                ),
                _tb(["Slide 14 of 30"], "dejavu-serif", 16, (110, 110, 110), 640, 670, "center"),
            ),
        ),
        HardSlide(
            "rules_table_kv",
            WHITE,
            (
                _tb(["Run settings"], "liberation-sans-bold", 46, INK, 90, 50),
                Table(
                    90,
                    150,
                    (420, 300),
                    (
                        ("Setting", "Value"),
                        ("Sample rate", "16 kHz"),
                        ("Window length", "25 ms"),
                        ("Hop length", "10 ms"),
                        ("Threads", "2"),
                    ),
                    "liberation-sans",
                    "liberation-sans-bold",
                    28,
                    "rules",
                    INK,
                    (40, 40, 40),
                    right=(1,),
                ),
                _tb(
                    ["Defaults from the config file"], "liberation-sans", 18, (90, 90, 90), 90, 600
                ),
            ),
        ),
        HardSlide(
            "purple_bullets_footer",
            (60, 30, 90),
            (
                _tb(["Three lessons"], "dejavu-sans-bold", 52, (255, 214, 90), 640, 70, "center"),
                _tb(
                    ["Measure before tuning", "Keep the queues bounded", "Fail one frame, not all"],
                    "dejavu-sans",
                    36,
                    (240, 230, 250),
                    640,
                    220,
                    "center",
                ),
                _tb(
                    ["Questions: office hours on Friday at 3 pm"],
                    "dejavu-sans",
                    17,
                    (200, 180, 220),
                    640,
                    640,
                    "center",
                ),
            ),
        ),
        HardSlide(
            "small_print_light",
            WHITE,
            (
                _tb(["Related work"], "liberation-sans-bold", 46, INK, 90, 50),
                _tb(
                    ["Streaming speech models", "Layout analysis of slides"],
                    "liberation-sans",
                    30,
                    (40, 40, 40),
                    90,
                    160,
                ),
                _tb(
                    [
                        "Smith and Lee 2021, Proceedings of the Speech Workshop, pages 112 to 119",
                        "Garcia et al. 2023, Journal of Document Analysis, volume 8",
                    ],
                    "liberation-sans",
                    12,
                    (70, 70, 70),
                    90,
                    620,
                ),
            ),
        ),
    ]


def heldout_slides() -> list[HardSlide]:
    return [
        HardSlide(
            "grid_table_wide",
            (250, 250, 250),
            (
                _tb(["Results by noise type"], "liberation-serif-bold", 46, INK, 640, 40, "center"),
                Table(
                    70,
                    140,
                    (250, 220, 220, 220, 220),
                    (
                        ("Noise", "Clean", "Cafe", "Street", "Music"),
                        ("WER", "8.2", "14.7", "19.3", "11.0"),
                        ("CER", "3.1", "6.5", "9.8", "4.4"),
                        ("Delay", "0.9 s", "1.1 s", "1.2 s", "1.0 s"),
                    ),
                    "liberation-serif",
                    "liberation-serif-bold",
                    30,
                    "grid",
                    INK,
                    (120, 120, 120),
                    right=(1, 2, 3, 4),
                ),
                _tb(
                    ["Lower is better. Averages over five runs."],
                    "liberation-serif-italic",
                    17,
                    (80, 80, 80),
                    70,
                    520,
                ),
            ),
        ),
        HardSlide(
            "code_light",
            (245, 245, 238),
            (
                _tb(["Bounded queue"], "liberation-narrow-bold", 50, (20, 40, 90), 80, 40),
                _tb(
                    [
                        "queue = Queue(maxsize=8)",
                        "if queue.full():",
                        "    queue.get_nowait()",
                        "queue.put(frame)",
                    ],
                    "liberation-mono",
                    30,
                    (120, 30, 30),
                    100,
                    160,
                    spacing=1.55,
                ),
                _tb(
                    ["Drop the oldest frame when the consumer is slow"],
                    "liberation-narrow",
                    24,
                    (60, 60, 60),
                    100,
                    420,
                ),
            ),
        ),
        HardSlide(
            "zebra_table_dark",
            (24, 28, 40),
            (
                _tb(["Energy per hour"], "dejavu-sans-condensed-bold", 46, (250, 250, 250), 80, 40),
                Table(
                    80,
                    140,
                    (360, 260, 260),
                    (
                        ("Device", "Idle", "Busy"),
                        ("Laptop", "6 W", "28 W"),
                        ("Phone", "0.4 W", "3.5 W"),
                        ("Board", "2 W", "7 W"),
                    ),
                    "dejavu-sans-condensed",
                    "dejavu-sans-condensed-bold",
                    30,
                    "zebra",
                    (235, 235, 235),
                    (0, 0, 0),
                    band=(52, 60, 84),
                    right=(1, 2),
                ),
                _tb(
                    ["Source: vendor data sheets"],
                    "dejavu-sans-condensed",
                    16,
                    (160, 165, 180),
                    1200,
                    660,
                    "right",
                ),
            ),
        ),
        HardSlide(
            "photo_outline_text",
            (235, 232, 225),
            (
                Photo(
                    (0, 0, 1280, 560),
                    seed=907,
                    text=("Mountain pass, north face",),
                    font="liberation-sans-bold",
                    size_px=44,
                    banner=False,
                ),
                _tb(
                    ["Figure 3: Test scene with low contrast text"],
                    "liberation-sans-italic",
                    20,
                    (60, 60, 60),
                    640,
                    600,
                    "center",
                ),
            ),
        ),
        HardSlide(
            "orange_mixed_sizes",
            (255, 236, 210),
            (
                _tb(
                    ["Word timing"],
                    "dejavu-serif-condensed-bold",
                    64,
                    (120, 50, 0),
                    1190,
                    60,
                    "right",
                ),
                _tb(
                    ["Commit words early", "Correct them at pauses"],
                    "dejavu-serif-condensed",
                    36,
                    (80, 40, 10),
                    1190,
                    200,
                    "right",
                ),
                _tb(
                    ["Median delay goal 1.5 seconds"],
                    "dejavu-serif-condensed",
                    24,
                    (110, 60, 20),
                    1190,
                    350,
                    "right",
                ),
                _tb(
                    ["Draft version 0.3, do not cite"],
                    "dejavu-serif-condensed",
                    14,
                    (140, 90, 50),
                    80,
                    680,
                ),
            ),
        ),
        HardSlide(
            "three_columns",
            (238, 246, 255),
            (
                _tb(
                    ["Three inputs"], "liberation-narrow-bold", 50, (10, 30, 80), 640, 40, "center"
                ),
                _tb(["Camera"], "liberation-narrow-bold", 32, (10, 60, 140), 80, 170),
                _tb(["Frames", "Motion", "Faces"], "liberation-narrow", 28, INK, 80, 230),
                _tb(["Microphone"], "liberation-narrow-bold", 32, (10, 60, 140), 480, 170),
                _tb(["Speech", "Music", "Silence"], "liberation-narrow", 28, INK, 480, 230),
                _tb(["Screen"], "liberation-narrow-bold", 32, (10, 60, 140), 880, 170),
                _tb(["Slides", "Code", "Charts"], "liberation-narrow", 28, INK, 880, 230),
            ),
        ),
        HardSlide(
            "rules_table_schedule",
            WHITE,
            (
                _tb(["Course plan"], "dejavu-serif-bold", 46, INK, 80, 40),
                Table(
                    80,
                    140,
                    (160, 520, 260),
                    (
                        ("Week", "Topic", "Lab"),
                        ("1", "Streams and clocks", "Lab A"),
                        ("2", "Speech recognition", "Lab B"),
                        ("3", "Reading slides", "Lab C"),
                    ),
                    "dejavu-serif",
                    "dejavu-serif-bold",
                    28,
                    "rules",
                    INK,
                    (30, 30, 30),
                ),
                _tb(["Labs are due on Mondays"], "dejavu-serif", 18, (90, 90, 90), 80, 480),
            ),
        ),
        HardSlide(
            "green_caption_row",
            (18, 70, 45),
            (
                _tb(
                    ["Sensor gallery"],
                    "liberation-sans-bold",
                    48,
                    (240, 250, 240),
                    640,
                    40,
                    "center",
                ),
                Photo((80, 140, 420, 440), seed=31),
                Photo((470, 140, 810, 440), seed=32),
                Photo((860, 140, 1200, 440), seed=33),
                _tb(["Microphone array"], "liberation-sans", 20, (220, 240, 225), 80, 460),
                _tb(["Wide angle camera"], "liberation-sans", 20, (220, 240, 225), 470, 460),
                _tb(["Thermal sensor"], "liberation-sans", 20, (220, 240, 225), 860, 460),
            ),
        ),
        HardSlide(
            "small_print_dark",
            (40, 40, 46),
            (
                _tb(["Next steps"], "dejavu-serif-bold", 48, (240, 240, 240), 1190, 50, "right"),
                _tb(
                    ["Test on real lectures", "Publish the data set"],
                    "dejavu-serif",
                    30,
                    (225, 225, 225),
                    1190,
                    170,
                    "right",
                ),
                _tb(
                    [
                        "All figures are preliminary and subject to change",
                        "Licensed under a Creative Commons license, version 4.0",
                    ],
                    "dejavu-serif-condensed",
                    12,
                    (190, 190, 195),
                    80,
                    630,
                ),
            ),
        ),
    ]


def fresh_slides() -> list[HardSlide]:
    """Written after every rule and parameter was fixed and measured once, unchanged after."""
    return [
        HardSlide(
            "rules_table_results",
            (250, 250, 247),
            (
                _tb(["Error rates by speaker"], "dejavu-sans-bold", 44, INK, 80, 40),
                Table(
                    80,
                    130,
                    (300, 200, 200, 200),
                    (
                        ("Speaker", "Words", "Errors", "Rate"),
                        ("Anna", "1204", "58", "4.8 %"),
                        ("Ben", "987", "71", "7.2 %"),
                        ("Chen", "1530", "95", "6.2 %"),
                        ("Dara", "812", "33", "4.1 %"),
                    ),
                    "dejavu-mono",
                    "dejavu-mono-bold",
                    26,
                    "rules",
                    INK,
                    (60, 60, 60),
                    right=(1, 2, 3),
                ),
                _tb(
                    ["Rates rounded to one decimal place"],
                    "dejavu-sans",
                    15,
                    (100, 100, 100),
                    80,
                    600,
                ),
            ),
        ),
        HardSlide(
            "header_band_table",
            (20, 24, 30),
            (
                _tb(["Build times"], "liberation-sans-bold", 50, (255, 200, 80), 640, 40, "center"),
                Table(
                    240,
                    150,
                    (340, 220, 240),
                    (
                        ("Target", "Debug", "Release"),
                        ("Engine", "42 s", "1 min 10 s"),
                        ("Server", "18 s", "31 s"),
                        ("Tests", "2 min", "2 min"),
                    ),
                    "liberation-sans",
                    "liberation-sans-bold",
                    30,
                    "zebra",
                    (230, 230, 230),
                    (0, 0, 0),
                    band=(60, 70, 90),
                ),
            ),
        ),
        HardSlide(
            "code_with_caption",
            (250, 252, 255),
            (
                _tb(["Parsing a config"], "dejavu-serif-bold", 46, (20, 40, 100), 80, 40),
                _tb(
                    [
                        "config = load(path)",
                        "for key, value in config.items():",
                        "    print(key, value)",
                    ],
                    "liberation-mono-bold",
                    28,
                    (30, 30, 30),
                    100,
                    170,
                    spacing=1.6,
                ),
                _tb(
                    ["Listing 4: every entry is printed once"],
                    "dejavu-serif-italic",
                    18,
                    (90, 90, 90),
                    100,
                    360,
                ),
            ),
        ),
        HardSlide(
            "two_columns_pink",
            (250, 228, 236),
            (
                _tb(["Before and after"], "liberation-serif-bold", 50, (110, 20, 60), 80, 40),
                _tb(["Before"], "liberation-serif-bold", 32, (110, 20, 60), 80, 160),
                _tb(
                    ["Fixed resolution", "One column only", "No tables"],
                    "liberation-serif",
                    28,
                    INK,
                    80,
                    220,
                ),
                _tb(["After"], "liberation-serif-bold", 32, (110, 20, 60), 660, 160),
                _tb(
                    ["Text height decides", "Columns in order", "Rows stay rows"],
                    "liberation-serif",
                    28,
                    INK,
                    660,
                    220,
                ),
                _tb(["Page 21"], "liberation-serif", 15, (120, 70, 90), 1200, 680, "right"),
            ),
        ),
        HardSlide(
            "photo_two_captions",
            (245, 245, 245),
            (
                _tb(["Two cameras"], "dejavu-sans-condensed-bold", 46, INK, 640, 30, "center"),
                Photo((80, 110, 620, 520), seed=5151, text=("Front door",), size_px=32),
                Photo((660, 110, 1200, 520), seed=6262, text=("Back garden",), size_px=32),
                _tb(
                    ["Both recorded at night with infrared light"],
                    "dejavu-sans-condensed",
                    20,
                    (70, 70, 70),
                    640,
                    560,
                    "center",
                ),
            ),
        ),
        HardSlide(
            "small_print_blue",
            (10, 60, 120),
            (
                _tb(["Thank you"], "liberation-sans-bold", 64, WHITE, 640, 200, "center"),
                _tb(
                    ["Slides and code are online"],
                    "liberation-sans",
                    32,
                    (200, 220, 245),
                    640,
                    320,
                    "center",
                ),
                _tb(
                    ["Copyright 2026 the authors. Reuse allowed with credit."],
                    "liberation-sans",
                    12,
                    (170, 195, 230),
                    640,
                    680,
                    "center",
                ),
            ),
        ),
    ]


SPLITS = {"dev": dev_slides, "heldout": heldout_slides, "fresh": fresh_slides}


# --------------------------------------------------------------------------------------------
# Encoding


def encode_stills(path: Path, images: Sequence[Image.Image], slide_s: float, crf: int) -> int:
    """Each image held ``slide_s`` seconds, H.264 with the demo clip's settings, no audio;
    returns the frame count."""
    per = round(slide_s * FPS)
    with av.open(str(path), mode="w", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH_PX, HEIGHT_PX, "yuv420p"
        stream.codec_context.time_base = Fraction(1, FPS)
        stream.options = {"crf": str(crf), **X264_OPTIONS}
        index = 0
        for img in images:
            frame = av.VideoFrame.from_image(img).reformat(format="yuv420p")
            for _ in range(per):
                frame.pts = index
                frame.time_base = Fraction(1, FPS)
                container.mux(stream.encode(frame))
                index += 1
        container.mux(stream.encode(None))
    return index


def build_split(
    split: str, out_dir: Path, slide_s: float, per_item: int, crf: int, png_dir: Path | None
) -> list[Path]:
    slides = SPLITS[split]()
    folder = out_dir / split
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for k in range(0, len(slides), per_item):
        group = slides[k : k + per_item]
        item = f"{split}_{k // per_item + 1:02d}"
        images = [render(s) for s in group]
        if png_dir is not None:
            png_dir.mkdir(parents=True, exist_ok=True)
            for s, img in zip(group, images, strict=True):
                img.save(png_dir / f"{split}_{s.name}.png")
        n_frames = encode_stills(folder / f"{item}.mp4", images, slide_s, crf)
        per = round(slide_s * FPS)
        truth = {
            "duration_s": round(n_frames / FPS, 3),
            "ocr": [
                {
                    "t_start": round(i * per / FPS, 3),
                    "t_end": round((i + 1) * per / FPS, 3),
                    "name": s.name,
                    "lines": s.truth_lines(),
                }
                for i, s in enumerate(group)
            ],
            "asr": [],
        }
        path = folder / f"{item}.truth.json"
        path.write_text(json.dumps(truth, indent=2) + "\n")
        written.append(folder / f"{item}.mp4")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("assets/eval/ocr"))
    parser.add_argument("--split", choices=[*SPLITS, "all"], default="all")
    parser.add_argument("--slide-s", type=float, default=4.0, help="seconds each slide shows")
    parser.add_argument("--per-item", type=int, default=3, help="slides per clip")
    parser.add_argument("--crf", type=int, default=20, help="x264 constant rate factor")
    parser.add_argument("--png-dir", type=Path, help="also save every slide as PNG here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for split in SPLITS if args.split == "all" else [args.split]:
        for path in build_split(
            split, args.out, args.slide_s, args.per_item, args.crf, args.png_dir
        ):
            logger.info("wrote %s (%.1f KiB)", path, path.stat().st_size / 1024)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
