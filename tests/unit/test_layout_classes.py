"""Four layout classes that the old layout misread with every letter right (docs/ocr-layout.md,
docs/calibration.md "Fresh-a results"), and their neighbours that must not change: a
right-aligned table column beside a left-aligned one, captions under side-by-side pictures,
2 x 2 quadrants of text blocks, drawn bullet marks read as characters. Boxes as the real
recognizer gives them (word extents included), laid out by the real layout."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from streamfuse.vision import OcrConfig, OcrLine
from streamfuse.vision.layout import LayoutLine, Rules, layout
from streamfuse.vision.ocr import clean_lines, drop_bullets, drop_double_reads, join_lines

pytestmark = pytest.mark.unit


def words_line(
    text: str, x0: float, y0: float, y1: float, char_px: float = 14.0, space_px: float = 8.0
) -> OcrLine:
    """A recognized box whose words are laid out left to right from `x0` (`char_px` a letter,
    `space_px` between words), as rapidocr's word boxes give them."""
    words = []
    x = x0
    for w in text.split(" "):
        words.append((w, x, x + char_px * len(w)))
        x += char_px * len(w) + space_px
    return OcrLine(text, (x0, y0, words[-1][2], y1), 0.99, tuple(words))


def texts(lines: Sequence[LayoutLine[OcrLine]]) -> list[str]:
    return [ln.text for ln in join_lines(lines)]


def ruled(rows: Sequence[float], x0: float = 80, x1: float = 1000) -> Rules:
    """Horizontal rules between consecutive rows (row middles `rows`)."""
    return Rules(
        horizontal=tuple(((a + b) / 2, x0, x1) for a, b in zip(rows, rows[1:], strict=False))
    )


# -- a right-aligned column beside a left-aligned one ------------------------------------------


def test_a_right_aligned_column_keeps_its_separator_from_a_left_aligned_one() -> None:
    # "Max" is right-aligned to x = 640, "Unit" left-aligned from x = 664: the detector boxes
    # them as one phrase in some rows and as two boxes closer than a cell gap in others.
    ys = [150, 210, 270, 330]
    items = [
        words_line("Sensor", 90, 135, 165),
        words_line("Min", 398, 135, 165),
        words_line("Max Unit", 598, 135, 165, space_px=24),
        words_line("Pressure", 90, 195, 225),
        words_line("0.8", 398, 195, 225),
        words_line("1.3", 598, 195, 225),
        words_line("bar", 664, 195, 225),  # 22 px after "1.3": one cell by the gap alone
        words_line("Humidity", 90, 255, 285),
        words_line("21", 412, 255, 285),
        words_line("87 %", 612, 255, 285, space_px=24),
        words_line("Current", 90, 315, 345),
        words_line("12", 412, 315, 345),
        words_line("480 mA", 598, 315, 345, space_px=24),
    ]
    got = texts(layout(items, rules=ruled(ys)))
    assert got == [
        "Sensor | Min | Max | Unit",
        "Pressure | 0.8 | 1.3 | bar",
        "Humidity | 21 | 87 | %",
        "Current | 12 | 480 | mA",
    ]


def test_a_number_and_unit_column_whose_header_covers_the_gap_stays_one_cell() -> None:
    # Right-aligned "4.8 %" under a header as wide as the cells: the space between number and
    # unit lines up in every body row, but the header's word runs across it.
    ys = [150, 210, 270]
    items = [
        words_line("Speaker", 90, 135, 165),
        words_line("Error rate", 400, 135, 165),
        words_line("Anna", 90, 195, 225),
        words_line("4.8 %", 470, 195, 225, space_px=14),
        words_line("Ben", 90, 255, 285),
        words_line("7.2 %", 470, 255, 285, space_px=14),
    ]
    got = texts(layout(items, rules=ruled(ys)))
    assert got == ["Speaker | Error rate", "Anna | 4.8 %", "Ben | 7.2 %"]


def test_word_gaps_that_do_not_line_up_do_not_split_a_column() -> None:
    ys = [150, 210, 270]
    items = [
        words_line("Name", 90, 135, 165),
        words_line("Role", 400, 135, 165),
        words_line("Ines", 90, 195, 225),
        words_line("Field lead", 400, 195, 225, space_px=20),
        words_line("Omar", 90, 255, 285),
        words_line("Data manager", 400, 255, 285, space_px=20),
    ]
    got = texts(layout(items, rules=ruled(ys)))
    assert got == ["Name | Role", "Ines | Field lead", "Omar | Data manager"]


# -- captions under side-by-side pictures ------------------------------------------------------


def test_captions_under_two_pictures_are_two_lines() -> None:
    items = [
        words_line("Two samples", 500, 30, 80),
        words_line("Sample A, day one", 90, 490, 520),  # under the left picture
        words_line("Sample B, day nine", 690, 490, 520),  # under the right one
    ]
    assert texts(layout(items)) == ["Two samples", "Sample A, day one", "Sample B, day nine"]


def test_a_footer_and_its_page_number_are_two_lines_but_a_spread_line_is_one() -> None:
    items = [
        words_line("Summary", 80, 50, 100),
        words_line("Field methods, spring term", 80, 665, 688),
        words_line("14", 1180, 665, 688),
    ]
    assert texts(layout(items))[-2:] == ["Field methods, spring term", "14"]
    # Words far apart on one baseline under a line that runs across the gap: one line.
    spread = [
        words_line("Every stage keeps up with the stream", 121, 322, 365, char_px=22),
        words_line("Latency budget", 123, 376, 420),
        words_line("300 ms", 700, 376, 420),
    ]
    assert texts(layout(spread)) == [
        "Every stage keeps up with the stream",
        "Latency budget 300 ms",
    ]


# -- 2 x 2 quadrants ---------------------------------------------------------------------------


QUADRANTS = [
    words_line("Four steps", 80, 40, 100),
    words_line("Collect", 140, 170, 205),
    words_line("Record the room", 140, 225, 255),
    words_line("Note the time", 140, 260, 290),
    words_line("Label", 700, 170, 205),
    words_line("Mark each word", 700, 225, 255),
    words_line("Check twice", 700, 260, 290),
    words_line("Train", 140, 430, 465),
    words_line("Small model first", 140, 485, 515),
    words_line("Then scale up", 140, 520, 550),
    words_line("Deploy", 700, 430, 465),
    words_line("Watch the errors", 700, 485, 515),
    words_line("Keep the logs", 700, 520, 550),
]
QUADRANT_ORDER = [
    "Four steps",
    "Collect",
    "Record the room",
    "Note the time",
    "Label",
    "Mark each word",
    "Check twice",
    "Train",
    "Small model first",
    "Then scale up",
    "Deploy",
    "Watch the errors",
    "Keep the logs",
]


def test_quadrants_are_read_block_by_block_top_pair_first() -> None:
    assert texts(layout(QUADRANTS)) == QUADRANT_ORDER


def test_quadrants_with_a_rule_across_the_band_between_them_are_not_a_table() -> None:
    # A divider drawn across the empty band between the top and bottom pair is not a table
    # rule: a table's rows follow each other.
    rules = Rules(horizontal=((360.0, 80.0, 1200.0),))
    lines = layout(QUADRANTS, rules=rules)
    assert not any(ln.is_table_row for ln in lines)
    assert texts(lines) == QUADRANT_ORDER


def test_two_text_columns_without_a_band_are_still_read_column_by_column() -> None:
    left = ["Survey", "Asks many people", "Cheap per answer", "Shallow detail"]
    right = ["Interview", "Asks a few people", "Costly per answer", "Rich detail"]
    items = [words_line("Two methods", 80, 40, 100)]
    for i, (a, b) in enumerate(zip(left, right, strict=True)):
        y = 170 + 45 * i
        items += [words_line(a, 80, y, y + 35), words_line(b, 660, y, y + 35)]
    assert texts(layout(items)) == ["Two methods", *left, *right]


# -- drawn bullet marks ------------------------------------------------------------------------


def test_a_bullet_mark_boxed_on_its_own_before_a_line_is_dropped() -> None:
    lines = [
        OcrLine("Agenda", (100, 60, 300, 120), 1.0),
        OcrLine("■", (117, 187, 135, 205), 0.95),
        OcrLine("Why sampling matters", (142, 169, 493, 222), 1.0),
        OcrLine("-", (110, 240, 130, 250), 0.95),
        OcrLine("Two designs", (142, 221, 343, 268), 1.0),
    ]
    assert [ln.text for ln in drop_bullets(lines)] == [
        "Agenda",
        "Why sampling matters",
        "Two designs",
    ]


def test_a_bullet_mark_read_into_the_line_is_stripped() -> None:
    lines = clean_lines(
        [
            OcrLine(
                "▪ Results",
                (140, 200, 300, 240),
                0.99,
                (("▪", 140.0, 152.0), ("Results", 170.0, 300.0)),
            ),
            OcrLine("o Chapter two", (97, 144, 300, 174), 0.98),
            OcrLine("■Why sampling matters", (117, 300, 493, 340), 0.97),
        ],
        OcrConfig(),
    )
    got = drop_bullets(lines)
    assert [ln.text for ln in got] == [
        "Results",
        "Chapter two",
        "Why sampling matters",
    ]
    assert got[0].box[0] == 170.0 and got[0].words == (("Results", 170.0, 300.0),)


def test_marks_that_are_text_are_kept() -> None:
    lines = [
        OcrLine("- name: camera", (100, 100, 400, 130), 0.99),  # code: a dash read into its line
        OcrLine("Price", (100, 200, 200, 230), 0.99),
        OcrLine("■", (215, 205, 233, 225), 0.95),  # mid-line: not at a line's start
        OcrLine("-5 degrees", (100, 300, 260, 330), 0.99),
        OcrLine("•", (500, 400, 515, 415), 0.95),  # a mark with no text after it
        OcrLine("oAuth tokens", (100, 500, 300, 530), 0.99),
        OcrLine("o-ring seals", (100, 560, 300, 590), 0.99),
    ]
    assert [ln.text for ln in drop_bullets(lines)] == [
        "- name: camera",
        "Price",
        "■",
        "-5 degrees",
        "•",
        "oAuth tokens",
        "o-ring seals",
    ]


def test_a_split_line_keeps_its_words_and_text() -> None:
    ln = words_line("240 EUR one spare set", 400, 100, 130, space_px=10)
    x = (ln.words[1][2] + ln.words[2][1]) / 2
    parts = ln.split_at(x)
    assert parts is not None
    assert [p.text for p in parts] == ["240 EUR", "one spare set"]
    assert parts[0].box[2] == ln.words[1][2] and parts[1].box[0] == ln.words[2][1]
    assert ln.split_at(ln.box[0] - 5) is None


def test_glyphs_two_overlapping_boxes_both_read_are_kept_once() -> None:
    lines = [
        OcrLine(
            "310 USD t",
            (429, 224, 581, 256),
            0.98,
            (("310", 433.0, 482.0), ("USD", 486.0, 541.0), ("t", 572.0, 581.0)),
        ),
        OcrLine(
            "the faculty",
            (565, 224, 704, 259),
            0.99,
            (("the", 573.0, 615.0), ("faculty", 619.0, 702.0)),
        ),
        # Not a copy: a word of its own that only touches the next box.
        OcrLine(
            "in 2024", (100, 300, 230, 330), 0.99, (("in", 100.0, 125.0), ("2024", 140.0, 230.0))
        ),
        OcrLine(
            "2024 data",
            (228, 300, 400, 330),
            0.99,
            (("2024", 240.0, 300.0), ("data", 320.0, 400.0)),
        ),
    ]
    assert [ln.text for ln in drop_double_reads(lines)] == [
        "310 USD",
        "the faculty",
        "in 2024",
        "2024 data",
    ]


# -- layout confidence features ----------------------------------------------------------------


def test_layout_lines_tell_the_gap_they_bridged_and_the_cuts_only_words_showed() -> None:
    spread = [
        words_line("Every stage keeps up with the stream", 121, 322, 365, char_px=22),
        words_line("Latency budget", 123, 376, 420),
        words_line("300 ms", 700, 376, 420),
    ]
    lines = layout(spread)
    assert lines[0].gap_bridged == 0.0  # one box
    gap = 700 - spread[1].box[2]
    assert lines[1].gap_bridged == pytest.approx(gap / 44)  # the joined gap, in line heights
    ys = [150, 210, 270]

    def boxed(right_aligned: str, left_aligned: str, y0: float) -> OcrLine:
        """A right-aligned cell ending at x = 560 and a left-aligned one from x = 590, read
        as one box."""
        a = words_line(right_aligned, 0, y0, y0 + 30)
        a = words_line(right_aligned, 560 - a.box[2], y0, y0 + 30)
        b = words_line(left_aligned, 590, y0, y0 + 30)
        return OcrLine(
            f"{a.text} {b.text}", (a.box[0], y0, b.box[2], y0 + 30), 0.99, a.words + b.words
        )

    table = [
        words_line("Item", 90, 135, 165),
        boxed("Cost", "Notes", 135),
        words_line("Cables", 90, 195, 225),
        boxed("240 EUR", "one spare set", 195),
        words_line("Travel", 90, 255, 285),
        boxed("1,600 EUR", "two site visits", 255),
    ]
    rows = layout(table, rules=ruled(ys))
    assert [ln.inferred_cuts for ln in rows] == [1, 1, 1]
    joined = join_lines(rows)
    assert [ln.text for ln in joined][1] == "Cables | 240 EUR | one spare set"
    assert joined[1].inferred_cuts == 1 and layout(table)[0].inferred_cuts == 0


def test_the_layout_features_reach_the_calibration_features_and_the_event() -> None:
    from streamfuse.text.calibration import ocr_line_features, shipped

    plain = ocr_line_features(
        "Sample A", (0, 0, 100, 30), 0.99, scale=1.0, mean_conf=None, n_lines=3
    )
    wide = ocr_line_features(
        "Sample A",
        (0, 0, 100, 30),
        0.99,
        scale=1.0,
        mean_conf=None,
        n_lines=3,
        gap_bridged=9.0,
        inferred_cuts=2,
    )
    assert plain["gap_bridged"] == 0.0 and wide["gap_bridged"] == 6.0  # capped
    assert wide["inferred_cuts"] == 2.0
    line = OcrLine("Sample A Sample B", (90, 490, 900, 520), 0.99, (), 12.5, 0)
    record = line.to_payload(shipped("ocr"), scale=1.0, mean_conf=0.99, n_lines=3)
    assert record.gap_bridged == 12.5 and record.inferred_cuts == 0
    # The shipped calibrator (third change rule, docs/calibration.md) reads gap_bridged, which
    # is 0 on nearly every fit line: a bridged gap lowers the line's conf, but the cap on
    # standardized features keeps it from 0 however wide the gap (the second rule's map gave 0.0).
    same = OcrLine("Sample A Sample B", (90, 490, 900, 520), 0.99)
    plain_conf = same.to_payload(shipped("ocr"), scale=1.0, mean_conf=0.99, n_lines=3).conf
    assert 0.3 < record.conf < plain_conf
    # one line height is already beyond 3 fit sd: capped, it counts as much as 12.5
    narrower = OcrLine("Sample A Sample B", (90, 490, 900, 520), 0.99, (), 1.0, 0)
    assert (
        narrower.to_payload(shipped("ocr"), scale=1.0, mean_conf=0.99, n_lines=3).conf
        == record.conf
    )
