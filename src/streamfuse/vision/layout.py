"""Layout of recognized text boxes: tables, reading order, lines (docs/ocr-layout.md).

`layout(items)` returns the lines of a slide in reading order. A `LayoutLine` is either the
boxes on one baseline, left to right (one text line, however the detector split it), or one
row of a table: its cells in column order (`cells`, a cell may be empty), written with
`CELL_SEPARATOR` between cells. Steps:

1. Rows: boxes clustered by vertical overlap.
2. Tables: a run of consecutive rows with at least two cells each (boxes further apart than
   `cell_gap` text heights), not broken by an empty band `block_gap` text heights high, whose
   cells fall into at least two common columns, is a table when the picture shows a separator:
   a horizontal rule, stripe or band edge across the run between two of its rows, or a vertical
   rule in a gutter between its columns (`find_rules`). Aligned rows without any drawn
   separator are read as text columns (a two-column slide looks the same). A column is split
   at a gutter no row's words cross, `cell_gutter` text heights wide at the median row, where
   the words beside it line up (`cell_align`) on one side: a right-aligned column beside a
   left-aligned one, which the detector boxes as one phrase. Items that give their word
   extents (`HasWords`) are split there.
3. Reading order of the rest (each table row counts as one full-width box): a top row with a
   wide empty band under it (`band_gap` text heights: a title) and a bottom row with one above
   it (a footer) are read first / last; then an empty band across everything, `block_gap` text
   heights high with two or more rows on each side, cuts blocks (quadrants: the top pair before
   the bottom pair); then rows with a vertical gutter (`column_gap` text heights wide, two or
   more rows on each side) are split into columns, left before right, recursively; else cut
   into bands of rows sharing a gutter, top to bottom.
4. Lines: a row of one column is one line, left to right, broken where two boxes lie
   `column_gap` text heights apart (captions under side-by-side pictures, a footer and a page
   number: separate text blocks on one baseline).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, Self, TypeVar

import numpy as np


class HasBox(Protocol):
    @property
    def box(self) -> tuple[float, float, float, float]: ...


class HasWords(HasBox, Protocol):
    """An item that knows where its words lie and can be cut between two of them (optional:
    items without these are never split)."""

    def word_spans(self) -> Sequence[tuple[float, float]]:
        """The x-extents (x0, x1) of its words, left to right, frame pixels."""
        ...

    def split_at(self, x: float) -> tuple[Self, Self] | None:
        """The words left of `x` and the words right of it as two items (None: no word
        boundary there)."""
        ...


T = TypeVar("T", bound=HasBox)

#: How a table row is written: its cells in column order joined by this (the OCR event's text
#: and the evaluation truth use the same form).
CELL_SEPARATOR = " | "

_MAX_ROWS_FOR_BANDS = 120

Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class Rules:
    """Drawn separators found in the picture, frame pixels: horizontal (y, x0, x1) and
    vertical (x, y0, y1) segments."""

    horizontal: tuple[tuple[float, float, float], ...] = ()
    vertical: tuple[tuple[float, float, float], ...] = ()


#: The picture's separators: found already, or found on demand inside a region (x0, y0, x1, y1;
#: `find_rules` on the frame), only where a table is possible.
RulesSource = Rules | Callable[[Box], Rules]


@dataclass(frozen=True, slots=True)
class LayoutLine(Generic[T]):
    """One line of the reading order: `items` left to right, and for a table row `cells`
    (one tuple of items per column, in column order; empty for an empty cell)."""

    items: tuple[T, ...]
    cells: tuple[tuple[T, ...], ...] | None = None
    #: A table row's column intervals (x0, x1), the same for every row of its table.
    columns: tuple[tuple[float, float], ...] | None = None
    #: How many of its table's column boundaries only word gutters showed (`cell_gutter`:
    #: no box boundary a cell gap wide, no drawn rule needed for them): inferred, less sure.
    inferred_cuts: int = 0

    @property
    def is_table_row(self) -> bool:
        return self.cells is not None

    @property
    def gap_bridged(self) -> float:
        """The widest empty gap between two boxes this line joined into one phrase (for a
        table row: inside one cell), in multiples of the line's median box height; 0.0 for
        a single box. A wide one is where a join may have merged two things."""
        groups = self.cells if self.cells is not None else (self.items,)
        height = _median_height(self.items) if self.items else 1.0
        widest = 0.0
        for group in groups:
            boxes = _sorted_x(group)
            reach = boxes[0].box[2] if boxes else 0.0
            for it in boxes[1:]:
                widest = max(widest, it.box[0] - reach)
                reach = max(reach, it.box[2])
        return widest / height

    @property
    def box(self) -> tuple[float, float, float, float]:
        return _union([it.box for it in self.items])


@dataclass(frozen=True, slots=True)
class LayoutConfig:
    """Thresholds, in multiples of the median text height unless stated."""

    #: Two boxes share a row when their vertical overlap is this fraction of the shorter one.
    row_overlap: float = 0.5
    #: Minimum empty vertical gutter between two text columns.
    column_gap: float = 2.0
    #: Boxes of one row further apart than this (x the row's text height) are separate cells.
    cell_gap: float = 0.6
    #: An empty horizontal band at least this high sets a title (top) or footer (bottom) apart.
    band_gap: float = 1.0
    #: A horizontal separator must span this fraction of a table's width.
    rule_span: float = 0.8
    #: An empty horizontal band at least this high, with two or more rows above and below it,
    #: separates blocks of text (read the upper first) and ends a table.
    block_gap: float = 2.0
    #: A gutter inside a table column that no row's words cross, this wide in the median row,
    #: with words on both sides in half the rows or more, splits the column in two when the
    #: words left of it end, or those right of it start, within `cell_align` of each other.
    cell_gutter: float = 0.2
    cell_align: float = 0.3


@dataclass
class _Unit(Generic[T]):
    """A box to order: one recognized item, or a table row (`cells` set, box = its extent)."""

    box: tuple[float, float, float, float]
    items: tuple[T, ...]
    cells: tuple[tuple[T, ...], ...] | None = None
    columns: tuple[tuple[float, float], ...] | None = None
    inferred_cuts: int = 0


def layout(
    items: Sequence[T],
    config: LayoutConfig | None = None,
    rules: RulesSource | None = None,
) -> list[LayoutLine[T]]:
    """The lines of `items` (boxes x0, y0, x1, y1) in reading order; `rules`: the picture's
    drawn separators (None: no table is detected)."""
    cfg = config or LayoutConfig()
    if not items:
        return []
    text_h = _median_height(items)
    rows = _rows(list(items), cfg.row_overlap)
    units: list[_Unit[T]] = []
    tables = _find_tables(rows, cfg, rules)
    in_table: set[int] = set()
    for first, last, columns in tables:
        extent = _union([it.box for r in rows[first : last + 1] for it in r])
        columns, cuts = _split_at_gutters(rows[first : last + 1], columns, cfg)
        for r in range(first, last + 1):
            rows[r] = _cut_items(rows[r], cuts)
            cells = _assign(rows[r], columns, cfg.cell_gap, cuts)
            y0 = min(it.box[1] for it in rows[r])
            y1 = max(it.box[3] for it in rows[r])
            units.append(
                _Unit(
                    (extent[0], y0, extent[2], y1),
                    tuple(_sorted_x(rows[r])),
                    tuple(cells),
                    tuple(columns),
                    len(cuts),
                )
            )
            in_table.add(r)
    for r, row in enumerate(rows):
        if r not in in_table:
            units.extend(_Unit(it.box, (it,)) for it in row)
    ordered = _order(
        units,
        cfg.row_overlap,
        cfg.column_gap * text_h,
        cfg.band_gap * text_h,
        cfg.block_gap * text_h,
    )
    out: list[LayoutLine[T]] = []
    for row_units in ordered:
        plain: list[T] = []
        for u in row_units:
            far = bool(plain) and _apart(plain, u, units, cfg, text_h)
            if plain and (u.cells is not None or far):
                out.append(LayoutLine(tuple(plain)))
                plain = []
            if u.cells is not None:
                out.append(LayoutLine(u.items, u.cells, u.columns, u.inferred_cuts))
            else:
                plain.extend(u.items)
        if plain:
            out.append(LayoutLine(tuple(plain)))
    return out


def _apart(
    left: Sequence[HasBox], right: _Unit[T], units: Sequence[_Unit[T]], cfg: LayoutConfig, h: float
) -> bool:
    """Whether `right` starts a separate text block on the baseline of `left` (captions under
    two pictures, a footer and its page number): `column_gap` text heights apart, and no text
    on a neighbouring line (closer than `band_gap`) runs across the gap (then it is one line
    spread wide)."""
    x0 = max(it.box[2] for it in left)
    x1 = right.box[0]
    if x1 - x0 < cfg.column_gap * h:
        return False
    y0 = min(it.box[1] for it in left) - cfg.band_gap * h
    y1 = max(it.box[3] for it in left) + cfg.band_gap * h
    mid = (x0 + x1) / 2
    return not any(
        u.box[0] < mid < u.box[2] and u.box[1] < y1 and u.box[3] > y0 and u is not right
        for u in units
    )


def reading_order(
    items: Sequence[T], *, row_overlap: float = 0.5, column_gap: float = 2.0
) -> list[T]:
    """`items` sorted in reading order by their `box` (x0, y0, x1, y1), no table detection."""
    cfg = LayoutConfig(row_overlap=row_overlap, column_gap=column_gap)
    return [it for line in layout(items, cfg) for it in line.items]


# -- reading order --------------------------------------------------------------------------


def _order(
    units: list[_Unit[T]],
    row_overlap: float,
    min_gutter: float,
    band_gap: float,
    block_gap: float,
) -> list[list[_Unit[T]]]:
    """Rows of units in reading order, each row left to right."""
    if not units:
        return []
    rows = _rows(units, row_overlap)
    if len(rows) == 1:
        return [_sorted_x(rows[0])]

    def again(part: list[_Unit[T]]) -> list[list[_Unit[T]]]:
        return _order(part, row_overlap, min_gutter, band_gap, block_gap)

    # A title over the body, a footer under it: set apart by a wide empty band, read first/last.
    if _gap_below(rows[0], rows[1]) >= band_gap:
        return [_sorted_x(rows[0]), *again(_flat(rows[1:]))]
    if _gap_below(rows[-2], rows[-1]) >= band_gap:
        return [*again(_flat(rows[:-1])), _sorted_x(rows[-1])]
    # Blocks over blocks (2 x 2 quadrants): a wide empty band across everything, with a block
    # of two or more rows on each side, is read top part first, even where columns line up.
    gaps = [(_gap_below(rows[i], rows[i + 1]), i) for i in range(1, len(rows) - 2)]
    widest = max(gaps, default=None)
    if widest is not None and widest[0] >= block_gap:
        cut = widest[1] + 1
        return [*again(_flat(rows[:cut])), *again(_flat(rows[cut:]))]
    cols = _split_columns(units, rows, min_gutter)
    if cols is not None:
        return [row for col in cols for row in again(col)]
    if len(rows) > _MAX_ROWS_FOR_BANDS:  # pathological input: plain row order
        return [_sorted_x(row) for row in rows]
    # No gutter runs through everything (e.g. a line spans the columns): cut the rows into
    # bands, each the longest run of rows that shares a gutter, or a single row.
    out: list[list[_Unit[T]]] = []
    i = 0
    while i < len(rows):
        j = next(
            (
                j
                for j in range(len(rows) - 1, i, -1)
                if _split_columns(_flat(rows[i : j + 1]), rows[i : j + 1], min_gutter)
            ),
            i,
        )
        if j == i:
            out.append(_sorted_x(rows[i]))
        else:
            band = _flat(rows[i : j + 1])
            cols = _split_columns(band, rows[i : j + 1], min_gutter)
            assert cols is not None
            for col in cols:
                out.extend(again(col))
        i = j + 1
    return out


B = TypeVar("B", bound=HasBox)


def _sorted_x(row: Sequence[B]) -> list[B]:
    return sorted(row, key=lambda it: it.box[0])


def _flat(rows: list[list[B]]) -> list[B]:
    return [it for row in rows for it in row]


def _gap_below(upper: Sequence[HasBox], lower: Sequence[HasBox]) -> float:
    return min(it.box[1] for it in lower) - max(it.box[3] for it in upper)


def _middle(row: Sequence[HasBox]) -> float:
    mids = sorted((it.box[1] + it.box[3]) / 2 for it in row)
    return mids[len(mids) // 2]


def _median_height(items: Sequence[HasBox]) -> float:
    heights = sorted(max(1.0, it.box[3] - it.box[1]) for it in items)
    return heights[len(heights) // 2]


def _union(boxes: Sequence[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def same_row(a: Box, b: Box, overlap: float = 0.5) -> bool:
    """Whether two boxes share a text row: their vertical overlap is at least `overlap` of the
    shorter one's height."""
    shared = min(a[3], b[3]) - max(a[1], b[1])
    return shared >= overlap * min(a[3] - a[1], b[3] - b[1])


def ocr_context_features(lines: Sequence[tuple[str, Sequence[float]]]) -> list[dict[str, float]]:
    """The calibration's context features (`text.calibration.OCR_CONTEXT_FEATURES`) per line of
    one reading ((text, box) in the order the event lists them): `row_peers`, how many other
    lines share its text row (`same_row`; capped at 4: a table without rules read cell by
    cell, side-by-side captions, two text columns); `cell_rows`, for a table row, how many of
    the reading's lines have its cell count (capped at 6; 0 for a line without cells: a real
    table has a header and rows, two columns joined into "rows" make two or three); and
    `cells_vs_neighbours`, how far its cell count is from the mean of the lines listed just
    before and after it (capped at 6: a fragment of a row among whole rows, a line read as two
    cells among plain lines)."""
    boxes = [_box(b) for _, b in lines]
    cells = [t.count(CELL_SEPARATOR.strip()) for t, _ in lines]
    out = []
    for i, box in enumerate(boxes):
        peers = sum(1 for j, b in enumerate(boxes) if j != i and same_row(box, b))
        same = sum(1 for c in cells if c == cells[i]) if cells[i] else 0
        near = [cells[j] for j in (i - 1, i + 1) if 0 <= j < len(lines)]
        gap = abs(cells[i] - sum(near) / len(near)) if near else 0.0
        out.append(
            {
                "row_peers": float(min(peers, 4)),
                "cell_rows": float(min(same, 6)),
                "cells_vs_neighbours": min(gap, 6.0),
            }
        )
    return out


def _box(b: Sequence[float]) -> Box:
    return (float(b[0]), float(b[1]), float(b[2]), float(b[3]))


def _rows(items: list[B], row_overlap: float) -> list[list[B]]:
    """Cluster boxes into text rows by vertical overlap, top to bottom."""
    rows: list[list[B]] = []
    spans: list[tuple[float, float]] = []
    for it in sorted(items, key=lambda it: (it.box[1] + it.box[3]) / 2):
        y0, y1 = it.box[1], it.box[3]
        if rows:
            r0, r1 = spans[-1]
            if same_row(it.box, (0.0, r0, 0.0, r1), row_overlap):
                rows[-1].append(it)
                spans[-1] = (min(r0, y0), max(r1, y1))
                continue
        rows.append([it])
        spans.append((y0, y1))
    return rows


def _split_columns(
    items: list[_Unit[T]], rows: list[list[_Unit[T]]], min_gutter: float
) -> list[list[_Unit[T]]] | None:
    """Split at the widest empty vertical gutter if it separates a real multi-row layout."""
    spans = sorted((it.box[0], it.box[2]) for it in items)
    best: tuple[float, float] | None = None  # (gap width, cut x)
    reach = spans[0][1]
    for x0, x1 in spans[1:]:
        gap = x0 - reach
        if gap >= min_gutter and (best is None or gap > best[0]):
            best = (gap, (reach + x0) / 2)
        reach = max(reach, x1)
    if best is None:
        return None
    cut = best[1]
    left = [it for it in items if it.box[2] <= cut]
    right = [it for it in items if it.box[0] >= cut]
    # A row split in two by the detector is not a column layout: demand several rows per side.
    rows_left = sum(1 for row in rows if any(it.box[2] <= cut for it in row))
    rows_right = sum(1 for row in rows if any(it.box[0] >= cut for it in row))
    if rows_left < 2 or rows_right < 2:
        return None
    # Columns stand side by side: text on the left and text on the right that do not share
    # their heights (a caption low on one side, a list high on the other) are read top down.
    ly0, ly1 = min(it.box[1] for it in left), max(it.box[3] for it in left)
    ry0, ry1 = min(it.box[1] for it in right), max(it.box[3] for it in right)
    if min(ly1, ry1) - max(ly0, ry0) < 0.5 * min(ly1 - ly0, ry1 - ry0):
        return None
    return [left, right]


# -- tables ---------------------------------------------------------------------------------


def _cells(row: Sequence[T], cell_gap: float, cuts: Sequence[float] = ()) -> list[list[T]]:
    """A row's boxes grouped into cells: a new cell where the gap exceeds `cell_gap` x the
    row's text height, or across a column cut (`_split_at_gutters`)."""
    boxes = _sorted_x(row)
    limit = cell_gap * _median_height(boxes)
    cells: list[list[T]] = [[boxes[0]]]
    reach = boxes[0].box[2]
    for prev, it in zip(boxes, boxes[1:], strict=False):
        mid_prev, mid = (prev.box[0] + prev.box[2]) / 2, (it.box[0] + it.box[2]) / 2
        if it.box[0] - reach > limit or any(mid_prev < x < mid for x in cuts):
            cells.append([it])
        else:
            cells[-1].append(it)
        reach = max(reach, it.box[2])
    return cells


def _columns(rows: Sequence[Sequence[T]], cell_gap: float) -> list[tuple[float, float]]:
    """Column intervals of a run of rows: the union of overlapping cell x-extents."""
    spans = sorted(
        (min(it.box[0] for it in c), max(it.box[2] for it in c))
        for row in rows
        for c in _cells(row, cell_gap)
    )
    cols: list[tuple[float, float]] = [spans[0]]
    for x0, x1 in spans[1:]:
        if x0 < cols[-1][1]:
            cols[-1] = (cols[-1][0], max(cols[-1][1], x1))
        else:
            cols.append((x0, x1))
    return cols


def _assign(
    row: Sequence[T],
    columns: list[tuple[float, float]],
    cell_gap: float,
    cuts: Sequence[float] = (),
) -> list[tuple[T, ...]]:
    """The row's boxes per column (cells falling into one column are joined)."""
    out: list[list[T]] = [[] for _ in columns]
    for cell in _cells(row, cell_gap, cuts):
        cx = (min(it.box[0] for it in cell) + max(it.box[2] for it in cell)) / 2
        k = min(
            range(len(columns)),
            key=lambda i: (
                0.0
                if columns[i][0] <= cx <= columns[i][1]
                else min(abs(cx - columns[i][0]), abs(cx - columns[i][1]))
            ),
        )
        out[k].extend(cell)
    return [tuple(_sorted_x(c)) for c in out]


def _word_spans(it: HasBox) -> list[tuple[float, float]]:
    spans = getattr(it, "word_spans", None)
    got = list(spans()) if callable(spans) else []
    return got or [(it.box[0], it.box[2])]


def _split_at_gutters(
    run: Sequence[Sequence[T]], columns: list[tuple[float, float]], cfg: LayoutConfig
) -> tuple[list[tuple[float, float]], list[float]]:
    """The table's columns with each split where no row has a word across a gutter (the
    rows' gaps there `cell_gutter` text heights wide at the median; words on both sides in
    half the rows or more, and at least two rows; those words aligned on one side of it); and
    the x of every such cut.
    A right-aligned column beside a left-aligned one leaves only a narrow gap, which the
    detector often boxes over."""
    text_h = _median_height([it for row in run for it in row])
    need = cfg.cell_gutter * text_h
    out: list[tuple[float, float]] = []
    cuts: list[float] = []
    for c0, c1 in columns:
        per_row = [
            [sp for it in row if c0 <= (it.box[0] + it.box[2]) / 2 <= c1 for sp in _word_spans(it)]
            for row in run
        ]
        merged: list[list[float]] = []
        for a, b in sorted(sp for spans in per_row for sp in spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        start = c0
        for (_, left_end), (right_start, _) in zip(merged, merged[1:], strict=False):
            x = (left_end + right_start) / 2
            both = [sp for sp in per_row if _sides(sp, start, x)]
            if len(both) < max(2, (len(run) + 1) // 2):
                continue
            ends = [max(b for a, b in sp if start <= a and b <= x) for sp in both]
            starts = [min(a for a, _ in sp if a >= x) for sp in both]
            # Word extents are estimates (a few pixels off): the row's typical gap must be
            # wide, and the column's cells line up on one side of it - the left part's ends
            # (right-aligned) or the right part's starts (left-aligned); running text doesn't.
            gaps = sorted(b - a for a, b in zip(ends, starts, strict=True))
            aligned = min(max(ends) - min(ends), max(starts) - min(starts))
            if gaps[len(gaps) // 2] >= need and aligned <= cfg.cell_align * text_h:
                out.append((start, left_end))
                cuts.append(x)
                start = right_start
        out.append((start, c1))
    return out, cuts


def _sides(spans: Sequence[tuple[float, float]], start: float, x: float) -> bool:
    """Whether a row has words both between `start` and `x` and right of `x`."""
    return any(start <= a and b <= x for a, b in spans) and any(a >= x for a, _ in spans)


def _cut_items(row: Sequence[T], cuts: Sequence[float]) -> list[T]:
    """The row's items, each one whose words lie on both sides of a cut split there."""
    out: list[T] = []
    todo = list(row)
    while todo:
        it = todo.pop()
        spans = _word_spans(it)
        x = next((x for x in cuts if spans[0][0] < x < spans[-1][1]), None)
        split = getattr(it, "split_at", None)
        parts = split(x) if x is not None and callable(split) else None
        if parts is None:
            out.append(it)
        else:
            todo.extend(parts)
    return out


def _find_tables(
    rows: list[list[T]], cfg: LayoutConfig, rules: RulesSource | None
) -> list[tuple[int, int, list[tuple[float, float]]]]:
    """(first row, last row, column intervals) of each table, top to bottom."""
    multi = [len(_cells(row, cfg.cell_gap)) >= 2 for row in rows]
    text_h = _median_height([it for row in rows for it in row])
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(rows):
        if not multi[i]:
            i += 1
            continue
        j = i
        # A table's rows follow each other; a wide empty band ends it (blocks of text below
        # blocks, such as quadrants, are not one table).
        while (
            j + 1 < len(rows)
            and multi[j + 1]
            and _gap_below(rows[j], rows[j + 1]) < cfg.block_gap * text_h
        ):
            j += 1
        if j > i:
            runs.append((i, j))
        i = j + 1
    if not runs or rules is None:
        return []
    tables = []
    for first, last in runs:
        run = rows[first : last + 1]
        x0, y0, x1, y1 = _union([it.box for row in run for it in row])
        pad = _median_height([it for row in run for it in row])
        found = rules((x0 - pad, y0 - pad, x1 + pad, y1 + pad)) if callable(rules) else rules
        columns = _columns(run, cfg.cell_gap)
        if len(columns) < 2:
            continue
        # Columns most rows fill: a gutter between two real columns, not a stray box.
        filled = [
            sum(1 for row in run if any(c[0] <= (it.box[0] + it.box[2]) / 2 <= c[1] for it in row))
            for c in columns
        ]
        if sum(1 for n in filled if 2 * n >= len(run)) < 2:
            continue
        if _separated(run, columns, found, cfg.rule_span):
            tables.append((first, last, columns))
    return tables


def _separated(
    run: list[list[T]], columns: list[tuple[float, float]], rules: Rules, rule_span: float
) -> bool:
    """Whether a drawn separator lies between two rows of the run or between two columns."""
    x0 = min(it.box[0] for row in run for it in row)
    x1 = max(it.box[2] for row in run for it in row)
    need = rule_span * (x1 - x0)
    for upper, lower in zip(run, run[1:], strict=False):
        # Between the rows' middles: a detector reading a small picture pads its boxes, so
        # the boxes of neighbouring rows can overlap the separator (and each other).
        top = _middle(upper)
        bottom = _middle(lower)
        for y, a, b in rules.horizontal:
            if top <= y <= bottom and min(b, x1) - max(a, x0) >= need:
                return True
    y_top = min(it.box[1] for it in run[0])
    y_bottom = max(it.box[3] for it in run[-1])
    for left, right in zip(columns, columns[1:], strict=False):
        for x, a, b in rules.vertical:
            if left[1] - 2 <= x <= right[0] + 2 and min(b, y_bottom) - max(a, y_top) >= 0.5 * (
                y_bottom - y_top
            ):
                return True
    return False


def find_rules(
    image: np.ndarray,
    region: tuple[float, float, float, float] | None = None,
    *,
    min_len_px: float | None = None,
    min_step: int = 12,
) -> Rules:
    """Long straight edges of an RGB (or grey) image, optionally only inside `region` (x0, y0,
    x1, y1; segments are returned in image pixels): table rules, cell borders, the edges of row
    stripes and header bands. An edge is a step of at least `min_step` grey levels over two
    pixels that runs straight for at least `min_len_px` (default: a tenth of the image width
    for horizontal, of its height for vertical edges); glyph strokes are far shorter."""
    import cv2

    h_img, w_img = image.shape[:2]
    x0, y0, x1, y1 = (0, 0, w_img, h_img) if region is None else (int(v) for v in region)
    x0, y0 = max(0, x0), max(0, y0)
    x1, y1 = min(w_img, x1), min(h_img, y1)
    if x1 - x0 < 8 or y1 - y0 < 8:
        return Rules()
    crop = image[y0:y1, x0:x1]
    grey = crop if crop.ndim == 2 else cv2.cvtColor(crop, cv2.COLOR_RGB2GRAY)
    h, w = grey.shape
    # Two-pixel steps: a compressed video blurs a sharp edge over two rows or columns.
    horiz: np.ndarray = np.zeros((h, w), np.uint8)
    vert: np.ndarray = np.zeros((h, w), np.uint8)
    horiz[1:-1] = cv2.absdiff(grey[2:], grey[:-2]) >= min_step
    vert[:, 1:-1] = cv2.absdiff(grey[:, 2:], grey[:, :-2]) >= min_step
    lh = max(8, round(min_len_px if min_len_px is not None else 0.1 * w_img))
    lv = max(8, round(min_len_px if min_len_px is not None else 0.1 * h_img))
    # Close small breaks first: where a vertical rule crosses a horizontal one, neither shows
    # a step across the crossing.
    horiz = cv2.morphologyEx(horiz, cv2.MORPH_CLOSE, np.ones((1, 9), np.uint8))
    vert = cv2.morphologyEx(vert, cv2.MORPH_CLOSE, np.ones((9, 1), np.uint8))
    horiz = cv2.morphologyEx(horiz, cv2.MORPH_OPEN, np.ones((1, lh), np.uint8))
    vert = cv2.morphologyEx(vert, cv2.MORPH_OPEN, np.ones((lv, 1), np.uint8))
    return Rules(
        tuple((y + y0, a + x0, b + x0) for y, a, b in _segments(horiz, axis=0)),
        tuple((x + x0, a + y0, b + y0) for x, a, b in _segments(vert, axis=1)),
    )


def _segments(mask: np.ndarray, axis: int) -> list[tuple[float, float, float]]:
    import cv2

    n, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    out = []
    for x, y, w, h, _area in stats[1:n]:
        if axis == 0:
            out.append((y + h / 2, float(x), float(x + w)))
        else:
            out.append((x + w / 2, float(y), float(y + h)))
    return out


__all__ = [
    "CELL_SEPARATOR",
    "HasBox",
    "HasWords",
    "LayoutConfig",
    "LayoutLine",
    "Rules",
    "RulesSource",
    "find_rules",
    "layout",
    "ocr_context_features",
    "reading_order",
    "same_row",
]
