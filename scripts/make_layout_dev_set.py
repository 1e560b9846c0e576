#!/usr/bin/env python
"""Dev slides for four layout classes of issue 14 and their neighbours that must not break.

Contract: the slides of ``make_ocr_hard_set`` (same drawing, truth and encoding) in faces no
other generator uses (URW base35, Debian package fonts-urw-base35) and photo seeds from 50000
up; ``--out DIR`` writes ``DIR/layout-dev/layout-dev_NN.mp4`` + truth like the OCR set (so
``streamfuse eval DIR/layout-dev --no-realtime`` scores them), ``--png-dir`` the slides as PNG.
These slides are for choosing layout rules; no fresh set (``scripts/fresh_sets.py``) is.

Classes (docs/ocr-layout.md): a right-aligned table column next to a left-aligned one; captions
under side-by-side photos; 2 x 2 quadrants of text blocks; drawn bullet marks (squares, dots,
dashes: shapes, never text, so the truth has no bullet). Neighbours: two text columns, tables
with and without rules, a title with bullets, a caption under one photo, a footer with a page
number on its baseline.

    PYTHONPATH=src python scripts/make_layout_dev_set.py --out /tmp/layout [--png-dir /tmp/png]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from PIL import Image, ImageDraw

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_ocr_hard_set as hard  # noqa: E402 - a sibling script, not a package
from make_demo_clip import FONTS, RGB, _font  # noqa: E402
from make_ocr_hard_set import INK, WHITE, HardSlide, Photo, Table, _tb  # noqa: E402

logger = logging.getLogger("make_layout_dev_set")

SPLIT = "layout-dev"

_URW = Path("/usr/share/fonts/opentype/urw-base35")
# Faces no other generator uses (absolute paths: FONT_DIR / an absolute path is that path).
FONTS.update(
    {
        "urw-sans": str(_URW / "NimbusSans-Regular.otf"),
        "urw-sans-bold": str(_URW / "NimbusSans-Bold.otf"),
        "urw-narrow": str(_URW / "NimbusSansNarrow-Regular.otf"),
        "urw-narrow-bold": str(_URW / "NimbusSansNarrow-Bold.otf"),
        "urw-roman": str(_URW / "NimbusRoman-Regular.otf"),
        "urw-roman-bold": str(_URW / "NimbusRoman-Bold.otf"),
        "urw-mono": str(_URW / "NimbusMonoPS-Regular.otf"),
        "urw-mono-bold": str(_URW / "NimbusMonoPS-Bold.otf"),
        "urw-c059": str(_URW / "C059-Roman.otf"),
        "urw-c059-bold": str(_URW / "C059-Bold.otf"),
        "urw-p052": str(_URW / "P052-Roman.otf"),
        "urw-p052-bold": str(_URW / "P052-Bold.otf"),
        "urw-gothic": str(_URW / "URWGothic-Book.otf"),
        "urw-gothic-bold": str(_URW / "URWGothic-Demi.otf"),
        "urw-bookman": str(_URW / "URWBookman-Light.otf"),
        "urw-bookman-bold": str(_URW / "URWBookman-Demi.otf"),
    }
)

Mark = Literal["square", "dot", "ring", "dash", "triangle"]


@dataclass(frozen=True)
class Bullets:
    """Lines with a drawn mark (a shape, never text) before each, `gap_px` from the text."""

    lines: tuple[str, ...]
    font: str
    size_px: int
    color: RGB
    x: int
    y: int
    mark: Mark
    mark_color: RGB
    gap_px: int = 18
    spacing: float = 1.5


def _draw_bullets(img: Image.Image, b: Bullets) -> None:
    draw = ImageDraw.Draw(img)
    font = _font(b.font, b.size_px)
    step = round(b.size_px * b.spacing)
    for i, text in enumerate(b.lines):
        y = b.y + i * step
        draw.text((b.x, y), text, font=font, fill=b.color)
        # The mark sits on the middle of the x-height, like a typeset bullet.
        _, top, _, bottom = draw.textbbox((b.x, y), "x", font=font)
        cy = (top + bottom) / 2
        r = max(4.0, b.size_px / 6)
        x1 = b.x - b.gap_px
        if b.mark == "square":
            draw.rectangle((x1 - 2 * r, cy - r, x1, cy + r), fill=b.mark_color)
        elif b.mark == "dot":
            draw.ellipse((x1 - 2 * r, cy - r, x1, cy + r), fill=b.mark_color)
        elif b.mark == "ring":
            draw.ellipse((x1 - 2 * r, cy - r, x1, cy + r), outline=b.mark_color, width=2)
        elif b.mark == "dash":
            draw.rectangle((x1 - 3 * r, cy - r / 3, x1, cy + r / 3), fill=b.mark_color)
        else:
            draw.polygon([(x1 - 2 * r, cy - r), (x1, cy), (x1 - 2 * r, cy + r)], fill=b.mark_color)


def render(slide: HardSlide) -> Image.Image:
    """`make_ocr_hard_set.render` plus drawn bullet lists."""
    plain = HardSlide(
        slide.name, slide.background, tuple(i for i in slide.items if not isinstance(i, Bullets))
    )
    img = hard.render(plain)
    for item in slide.items:
        if isinstance(item, Bullets):
            _draw_bullets(img, item)
    return img


def truth_lines(slide: HardSlide) -> list[str]:
    out: list[str] = []
    for item in slide.items:
        if isinstance(item, Bullets):
            out.extend(item.lines)  # the marks are shapes: no bullet in the truth
        else:
            out.extend(HardSlide(slide.name, slide.background, (item,)).truth_lines())
    return out


def _table(
    x: int,
    y: int,
    widths: tuple[int, ...],
    rows: tuple[tuple[str, ...], ...],
    font: str,
    size: int,
    style: Literal["grid", "rules", "zebra"],
    right: tuple[int, ...] = (),
    band: RGB = (232, 238, 228),
) -> Table:
    return Table(
        x, y, widths, rows, font, f"{font}-bold", size, style, INK, (70, 70, 70), band, right
    )


def slides() -> list[HardSlide]:
    teal: RGB = (0, 100, 110)
    return [
        # -- class 1: a right-aligned column next to a left-aligned one ---------------------
        HardSlide(
            "grid_right_then_left",
            (253, 253, 250),
            (
                _tb(["Pump test"], "urw-sans-bold", 46, teal, 80, 40),
                _table(
                    80,
                    140,
                    (300, 180, 180, 260),
                    (
                        ("Stage", "Flow", "Head", "Comment"),
                        ("Inlet", "14.2", "3.5", "stable"),
                        ("Filter", "13.9", "2.8", "slight drop"),
                        ("Outlet", "13.7", "1.1", "as planned"),
                    ),
                    "urw-sans",
                    26,
                    "grid",
                    right=(1, 2),
                ),
            ),
        ),
        HardSlide(
            "rules_amount_then_text",
            WHITE,
            (
                _tb(["Field trip costs"], "urw-roman-bold", 46, INK, 80, 40),
                _table(
                    100,
                    150,
                    (260, 200, 380),
                    (
                        ("Item", "Amount", "Paid by"),
                        ("Bus", "310 USD", "the faculty"),
                        ("Lunch", "95 USD", "each student"),
                        ("Tickets", "1,020 USD", "a sponsor"),
                    ),
                    "urw-roman",
                    30,
                    "rules",
                    right=(1,),
                ),
            ),
        ),
        HardSlide(
            "zebra_numbers_then_units",
            (248, 250, 252),
            (
                _tb(["Cell readings"], "urw-narrow-bold", 48, (40, 60, 120), 640, 40, "center"),
                _table(
                    260,
                    150,
                    (260, 160, 160, 180),
                    (
                        ("Cell", "Low", "High", "Unit"),
                        ("North", "2.9", "4.1", "volt"),
                        ("South", "118", "164", "kelvin"),
                        ("East", "0.4", "0.9", "amp"),
                        ("West", "71", "93", "watt"),
                    ),
                    "urw-narrow",
                    28,
                    "zebra",
                    right=(1, 2),
                    band=(222, 230, 244),
                ),
            ),
        ),
        # -- class 2: captions under side-by-side photos ------------------------------------
        HardSlide(
            "two_photos_captions",
            (250, 248, 244),
            (
                _tb(["Before and after the flood"], "urw-c059-bold", 44, INK, 640, 30, "center"),
                Photo((100, 110, 600, 460), seed=50011),
                Photo((680, 110, 1180, 460), seed=50012),
                _tb(["River bank in June"], "urw-c059", 26, INK, 100, 480),
                _tb(["Same bank in August"], "urw-c059", 26, INK, 680, 480),
            ),
        ),
        HardSlide(
            "three_photos_captions",
            (30, 30, 36),
            (
                _tb(["Three cameras"], "urw-gothic-bold", 44, WHITE, 80, 30),
                Photo((80, 120, 420, 420), seed=50021),
                Photo((470, 120, 810, 420), seed=50022),
                Photo((860, 120, 1200, 420), seed=50023),
                _tb(["Gate camera"], "urw-gothic", 24, (220, 220, 220), 250, 440, "center"),
                _tb(["Yard camera"], "urw-gothic", 24, (220, 220, 220), 640, 440, "center"),
                _tb(["Roof camera"], "urw-gothic", 24, (220, 220, 220), 1030, 440, "center"),
            ),
        ),
        # -- class 3: 2 x 2 quadrants -------------------------------------------------------
        HardSlide(
            "quadrants_headed",
            WHITE,
            (
                _tb(["Planning a survey"], "urw-bookman-bold", 44, INK, 80, 40),
                _tb(["Scope"], "urw-bookman-bold", 30, (150, 60, 0), 120, 160),
                _tb(["Pick the region", "Set a budget"], "urw-bookman", 24, INK, 120, 215),
                _tb(["Sample"], "urw-bookman-bold", 30, (150, 60, 0), 680, 160),
                _tb(["Draw households", "Plan the visits"], "urw-bookman", 24, INK, 680, 215),
                _tb(["Ask"], "urw-bookman-bold", 30, (150, 60, 0), 120, 420),
                _tb(["Short questions", "One topic each"], "urw-bookman", 24, INK, 120, 475),
                _tb(["Report"], "urw-bookman-bold", 30, (150, 60, 0), 680, 420),
                _tb(["Tables first", "Then the story"], "urw-bookman", 24, INK, 680, 475),
            ),
        ),
        HardSlide(
            "quadrants_plain",
            (240, 246, 240),
            (
                _tb(["Strengths and risks"], "urw-p052-bold", 44, (20, 80, 40), 640, 40, "center"),
                _tb(["Fast to build", "Cheap to run"], "urw-p052", 28, INK, 140, 170),
                _tb(["Needs a test rig", "Slow to certify"], "urw-p052", 28, INK, 720, 170),
                _tb(["Open standard", "Many suppliers"], "urw-p052", 28, INK, 140, 420),
                _tb(["Patent unclear", "Supplier may quit"], "urw-p052", 28, INK, 720, 420),
            ),
        ),
        # -- class 4: drawn bullet marks ----------------------------------------------------
        HardSlide(
            "bullets_squares",
            (18, 30, 48),
            (
                _tb(["Outline"], "urw-sans-bold", 54, (250, 210, 90), 100, 50),
                Bullets(
                    ("Why sampling matters", "Two designs", "A worked example", "Pitfalls"),
                    "urw-sans",
                    34,
                    (230, 236, 245),
                    150,
                    180,
                    "square",
                    (250, 210, 90),
                ),
            ),
        ),
        HardSlide(
            "bullets_dots_dashes",
            WHITE,
            (
                _tb(["What we learned"], "urw-roman-bold", 48, INK, 90, 50),
                Bullets(
                    ("Small rooms echo less", "Carpet helps a lot"),
                    "urw-roman",
                    32,
                    INK,
                    140,
                    170,
                    "dot",
                    (40, 40, 40),
                ),
                Bullets(
                    ("Windows let in traffic noise", "Fans hum at low pitch"),
                    "urw-roman",
                    32,
                    INK,
                    140,
                    330,
                    "dash",
                    (160, 30, 30),
                ),
                Bullets(
                    ("Measure before you buy",),
                    "urw-roman",
                    32,
                    INK,
                    140,
                    490,
                    "triangle",
                    (30, 90, 160),
                    gap_px=14,
                ),
            ),
        ),
        HardSlide(
            "bullets_small_rings",
            (250, 246, 236),
            (
                _tb(["Reading list"], "urw-c059-bold", 44, (90, 40, 20), 90, 40),
                Bullets(
                    ("Chapter two, sections one to four", "The appendix on error bars"),
                    "urw-c059",
                    22,
                    INK,
                    120,
                    150,
                    "ring",
                    (90, 40, 20),
                    gap_px=12,
                ),
                Bullets(
                    ("Notes from week three", "The short survey paper"),
                    "urw-c059",
                    22,
                    INK,
                    120,
                    300,
                    "dot",
                    (90, 40, 20),
                    gap_px=10,
                ),
            ),
        ),
        # -- neighbours that must not break -------------------------------------------------
        HardSlide(
            "two_text_columns",
            (252, 250, 245),
            (
                _tb(["Two methods"], "urw-gothic-bold", 46, INK, 80, 40),
                _tb(
                    ["Survey", "Asks many people", "Cheap per answer", "Shallow detail"],
                    "urw-gothic",
                    28,
                    INK,
                    80,
                    160,
                ),
                _tb(
                    ["Interview", "Asks a few people", "Costly per answer", "Rich detail"],
                    "urw-gothic",
                    28,
                    INK,
                    660,
                    160,
                ),
                _tb(["Slide 7 of 20"], "urw-gothic", 16, (110, 110, 110), 80, 670),
            ),
        ),
        HardSlide(
            "grid_table_left_aligned",
            WHITE,
            (
                _tb(["Team roles"], "urw-sans-bold", 46, INK, 80, 40),
                _table(
                    80,
                    140,
                    (260, 300, 300),
                    (
                        ("Name", "Role", "Office"),
                        ("Ines", "Field lead", "Room 12"),
                        ("Omar", "Data manager", "Room 14"),
                        ("Ruth", "Analyst", "Remote"),
                    ),
                    "urw-sans",
                    28,
                    "grid",
                ),
            ),
        ),
        HardSlide(
            "rules_table_numbers",
            (248, 248, 248),
            (
                _tb(["Response rates"], "urw-mono-bold", 42, INK, 80, 40),
                _table(
                    80,
                    140,
                    (260, 200, 200, 200),
                    (
                        ("Wave", "Sent", "Back", "Rate"),
                        ("First", "1200", "530", "44 %"),
                        ("Second", "1150", "610", "53 %"),
                        ("Third", "1100", "420", "38 %"),
                    ),
                    "urw-mono",
                    26,
                    "rules",
                    right=(1, 2, 3),
                ),
            ),
        ),
        HardSlide(
            "title_and_bullets_plain",
            (236, 242, 250),
            (
                _tb(["Next steps"], "urw-p052-bold", 52, (20, 40, 110), 640, 50, "center"),
                Bullets(
                    ("Clean the raw files", "Fit the first model", "Write up by Friday"),
                    "urw-p052",
                    36,
                    INK,
                    300,
                    200,
                    "square",
                    (20, 40, 110),
                    gap_px=22,
                ),
                _tb(["Course notes, week five"], "urw-p052", 18, (90, 90, 90), 80, 660),
            ),
        ),
        HardSlide(
            "one_photo_caption_and_list",
            WHITE,
            (
                _tb(["The test site"], "urw-narrow-bold", 48, INK, 80, 40),
                Photo((80, 130, 640, 520), seed=50031),
                # Truth in the documented order: text high on the right before a caption low
                # on the left (the text alone cannot show that the photo makes a column).
                _tb(
                    ["Clay soil", "Flat ground", "Close to the road"],
                    "urw-narrow",
                    30,
                    INK,
                    700,
                    150,
                ),
                _tb(["The north field seen from the tower"], "urw-narrow", 22, INK, 80, 540),
            ),
        ),
        HardSlide(
            "footer_with_page_number",
            (255, 252, 240),
            (
                _tb(["Summary"], "urw-bookman-bold", 50, INK, 80, 50),
                _tb(
                    ["Three sites were surveyed", "Two need a second visit", "Data is online"],
                    "urw-bookman",
                    30,
                    INK,
                    80,
                    170,
                ),
                _tb(["Field methods, spring term"], "urw-bookman", 18, (100, 100, 100), 80, 665),
                _tb(["14"], "urw-bookman", 18, (100, 100, 100), 1200, 665, "right"),
            ),
        ),
    ]


def build(out_dir: Path, png_dir: Path | None, slide_s: float = 4.0, crf: int = 20) -> list[Path]:
    """Write the clips (three slides each) and truth, as `make_ocr_hard_set.build_split`."""
    all_slides = slides()
    folder = out_dir / SPLIT
    folder.mkdir(parents=True, exist_ok=True)
    per = round(slide_s * hard.FPS)
    written = []
    for k in range(0, len(all_slides), 3):
        group = all_slides[k : k + 3]
        item = f"{SPLIT}_{k // 3 + 1:02d}"
        images = [render(s) for s in group]
        if png_dir is not None:
            png_dir.mkdir(parents=True, exist_ok=True)
            for s, img in zip(group, images, strict=True):
                img.save(png_dir / f"{s.name}.png")
        n_frames = hard.encode_stills(folder / f"{item}.mp4", images, slide_s, crf)
        truth = {
            "duration_s": round(n_frames / hard.FPS, 3),
            "ocr": [
                {
                    "t_start": round(i * per / hard.FPS, 3),
                    "t_end": round((i + 1) * per / hard.FPS, 3),
                    "name": s.name,
                    "lines": truth_lines(s),
                }
                for i, s in enumerate(group)
            ],
            "asr": [],
        }
        (folder / f"{item}.truth.json").write_text(json.dumps(truth, indent=2) + "\n")
        written.append(folder / f"{item}.mp4")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--png-dir", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for path in build(args.out, args.png_dir):
        logger.info("wrote %s (%.1f KiB)", path, path.stat().st_size / 1024)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
