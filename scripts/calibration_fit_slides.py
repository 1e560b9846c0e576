"""Fit slides for the OCR line calibrator with the layouts the OCR layout gets wrong.

The calibration fit data (benchmarks/calibration.py) had no table without drawn rules, no two
text columns, no 2 x 2 quadrants, no captions side by side and no symbol-heavy code, so a
calibrator could not learn what those layouts' misreadings look like (docs/calibration.md).
These slides have them, drawn in the fit faces only (the benchmark's `SLIDE_FONTS`), with photo
seeds 6100-6199 (fit side: every fresh set's seeds are 40,000 and up). Text and layouts are
written here, not taken from any held-out, fresh or layout dev slide.
"""

from __future__ import annotations

from make_layout_dev_set import Bullets
from make_ocr_hard_set import INK, WHITE, HardSlide, Photo, Table, _tb

BG = (250, 250, 250)


def _plain(
    x: int,
    y: int,
    widths: tuple[int, ...],
    rows: tuple[tuple[str, ...], ...],
    right: tuple[int, ...] = (),
    bg: tuple[int, int, int] = BG,
) -> Table:
    """A table without rules or bands: only its alignment shows the columns."""
    return Table(
        x,
        y,
        widths,
        rows,
        "dejavu-sans",
        "dejavu-sans-bold",
        28,
        "zebra",
        INK,
        (0, 0, 0),
        band=bg,
        right=right,
    )


def layout_fit_slides() -> list[HardSlide]:
    return [
        HardSlide(
            "fit_plain_table_servers",
            BG,
            (
                _tb(["Server load"], "dejavu-sans-bold", 46, INK, 80, 40),
                _plain(
                    80,
                    140,
                    (300, 200, 200),
                    (
                        ("Host", "CPU", "Memory"),
                        ("alpha", "31 %", "12 GB"),
                        ("bravo", "78 %", "40 GB"),
                        ("charlie", "5 %", "3 GB"),
                    ),
                    right=(1, 2),
                ),
            ),
        ),
        HardSlide(
            "fit_plain_table_menu",
            (255, 250, 240),
            (
                _tb(["Lunch menu"], "liberation-serif-bold", 48, INK, 640, 40, "center"),
                _plain(
                    240,
                    150,
                    (360, 200, 240),
                    (
                        ("Dish", "Price", "Diet"),
                        ("Lentil soup", "4.50", "vegan"),
                        ("Fish pie", "9.20", "none"),
                        ("Green salad", "6.00", "vegan"),
                        ("Apple tart", "3.80", "vegetarian"),
                    ),
                    right=(1,),
                    bg=(255, 250, 240),
                ),
            ),
        ),
        HardSlide(
            "fit_plain_table_two_cols",
            BG,
            (
                _tb(["Opening hours"], "liberation-sans-bold", 44, INK, 80, 40),
                _plain(
                    120,
                    150,
                    (320, 260),
                    (
                        ("Day", "Hours"),
                        ("Weekdays", "8 to 18"),
                        ("Saturday", "9 to 13"),
                        ("Sunday", "closed"),
                    ),
                    right=(1,),
                ),
            ),
        ),
        HardSlide(
            "fit_two_columns_compare",
            (244, 248, 255),
            (
                _tb(["Cache or database"], "dejavu-serif-bold", 44, INK, 80, 40),
                _tb(["Cache"], "dejavu-serif-bold", 30, (20, 60, 140), 120, 180),
                _tb(["Fast reads", "Lost on restart"], "dejavu-serif", 26, INK, 120, 240),
                _tb(["Database"], "dejavu-serif-bold", 30, (20, 60, 140), 700, 180),
                _tb(["Durable writes", "Slower queries"], "dejavu-serif", 26, INK, 700, 240),
            ),
        ),
        HardSlide(
            "fit_two_columns_plain",
            BG,
            (
                _tb(["Pros and cons"], "liberation-sans-bold", 46, INK, 640, 40, "center"),
                _tb(
                    ["Low running cost", "Easy to test", "Few moving parts"],
                    "liberation-sans",
                    26,
                    INK,
                    140,
                    180,
                ),
                _tb(
                    ["Hard to scale", "One point of failure", "Slow deploys"],
                    "liberation-sans",
                    26,
                    INK,
                    720,
                    180,
                ),
            ),
        ),
        HardSlide(
            "fit_quadrants_plan",
            (250, 248, 240),
            (
                _tb(["Project phases"], "liberation-serif-bold", 44, INK, 80, 30),
                _tb(["Discover"], "liberation-serif-bold", 28, (140, 40, 40), 140, 150),
                _tb(["Interview users", "Map the problem"], "liberation-serif", 22, INK, 140, 200),
                _tb(["Design"], "liberation-serif-bold", 28, (140, 40, 40), 700, 150),
                _tb(["Sketch options", "Pick one"], "liberation-serif", 22, INK, 700, 200),
                _tb(["Build"], "liberation-serif-bold", 28, (140, 40, 40), 140, 420),
                _tb(["Write the code", "Test each part"], "liberation-serif", 22, INK, 140, 470),
                _tb(["Ship"], "liberation-serif-bold", 28, (140, 40, 40), 700, 420),
                _tb(["Release slowly", "Watch the logs"], "liberation-serif", 22, INK, 700, 470),
            ),
        ),
        HardSlide(
            "fit_photos_side_captions",
            (240, 240, 240),
            (
                Photo((100, 100, 600, 440), seed=6101),
                Photo((680, 100, 1180, 440), seed=6102),
                _tb(["Site before"], "dejavu-sans", 24, INK, 350, 470, "center"),
                _tb(["Site after"], "dejavu-sans", 24, INK, 930, 470, "center"),
            ),
        ),
        HardSlide(
            "fit_three_photos_captions",
            (28, 28, 28),
            (
                Photo((60, 120, 420, 420), seed=6111),
                Photo((460, 120, 820, 420), seed=6112),
                Photo((860, 120, 1220, 420), seed=6113),
                _tb(["North gate"], "liberation-sans", 22, (220, 220, 220), 240, 450, "center"),
                _tb(["East wall"], "liberation-sans", 22, (220, 220, 220), 640, 450, "center"),
                _tb(["South yard"], "liberation-sans", 22, (220, 220, 220), 1040, 450, "center"),
            ),
        ),
        HardSlide(
            "fit_bullets_squares",
            BG,
            (
                _tb(["Checklist"], "dejavu-sans-bold", 46, INK, 80, 40),
                Bullets(
                    ("Back up the disk", "Update the drivers", "Restart twice"),
                    "dejavu-sans",
                    28,
                    INK,
                    140,
                    170,
                    "square",
                    (200, 60, 0),
                ),
            ),
        ),
        HardSlide(
            "fit_bullets_dots",
            (245, 250, 245),
            (
                _tb(["Today"], "liberation-serif-bold", 46, INK, 80, 40),
                Bullets(
                    ("Warm up", "Group work", "Short quiz", "Questions"),
                    "liberation-serif",
                    28,
                    INK,
                    150,
                    170,
                    "dot",
                    (0, 110, 60),
                ),
            ),
        ),
        HardSlide(
            "fit_code_symbols",
            (30, 30, 36),
            (
                _tb(["Update rules"], "dejavu-sans-bold", 42, WHITE, 80, 40),
                _tb(
                    [
                        "count += 1",
                        "scale *= 0.5",
                        "if a != b:",
                        "    mask &= ~(1 << k)",
                        "total -= cost * n",
                        "return {k: v}",
                    ],
                    "dejavu-mono",
                    26,
                    (240, 220, 150),
                    100,
                    140,
                    spacing=1.5,
                ),
            ),
        ),
        HardSlide(
            "fit_code_shell",
            BG,
            (
                _tb(["Shell basics"], "liberation-sans-bold", 42, INK, 80, 40),
                _tb(
                    [
                        "ls -la ~/data",
                        "grep -n TODO *.py",
                        "echo $PATH",
                        "cat a.txt > b.txt",
                        "x=$((x + 2))",
                    ],
                    "dejavu-mono",
                    26,
                    INK,
                    100,
                    140,
                    spacing=1.5,
                ),
            ),
        ),
        HardSlide(
            "fit_labels_one_row",
            BG,
            (
                _tb(["Signal path"], "dejavu-serif-bold", 44, INK, 80, 40),
                _tb(["Input"], "dejavu-serif", 30, INK, 120, 220),
                _tb(["Filter"], "dejavu-serif", 30, INK, 640, 220, "center"),
                _tb(["Output"], "dejavu-serif", 30, INK, 1160, 220, "right"),
                _tb(["Each stage adds a little delay"], "dejavu-serif", 24, INK, 120, 400),
            ),
        ),
        HardSlide(
            "fit_zebra_table_scores",
            WHITE,
            (
                _tb(["Match results"], "liberation-sans-bold", 44, INK, 80, 40),
                Table(
                    80,
                    140,
                    (320, 160, 160),
                    (
                        ("Team", "Won", "Lost"),
                        ("Rovers", "7", "2"),
                        ("United", "5", "4"),
                        ("Athletic", "3", "6"),
                    ),
                    "liberation-sans",
                    "liberation-sans-bold",
                    28,
                    "zebra",
                    INK,
                    (0, 0, 0),
                    band=(225, 235, 250),
                    right=(1, 2),
                ),
            ),
        ),
    ]
