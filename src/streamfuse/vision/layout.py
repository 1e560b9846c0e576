"""Reading order of recognized text lines: top to bottom, columns left before right.

Boxes are clustered into rows by vertical overlap. A set of rows with a vertical gutter (an
empty strip at least `column_gap` median text heights wide, with text on at least two rows on
each side) is split into columns, read left then right, recursively. Otherwise the rows are cut
into bands, top to bottom: each band is the longest run of rows that shares a gutter (a column
block under a full-width title, above a full-width footer) or a single row, read left to right.
A row split in two by the detector stays one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class HasBox(Protocol):
    @property
    def box(self) -> tuple[float, float, float, float]: ...


T = TypeVar("T", bound=HasBox)

_MAX_ROWS_FOR_BANDS = 120


def reading_order(
    items: Sequence[T], *, row_overlap: float = 0.5, column_gap: float = 2.0
) -> list[T]:
    """`items` sorted in reading order by their `box` (x0, y0, x1, y1)."""
    if len(items) <= 1:
        return list(items)
    heights = sorted(max(1.0, it.box[3] - it.box[1]) for it in items)
    text_h = heights[len(heights) // 2]
    return _order(list(items), row_overlap, column_gap * text_h)


def _order(items: list[T], row_overlap: float, min_gutter: float) -> list[T]:
    if len(items) <= 1:
        return items
    rows = _rows(items, row_overlap)
    if len(rows) == 1:
        return sorted(items, key=lambda it: it.box[0])
    cols = _split_columns(items, rows, min_gutter)
    if cols is not None:
        return [it for col in cols for it in _order(col, row_overlap, min_gutter)]
    if len(rows) > _MAX_ROWS_FOR_BANDS:  # pathological input: plain row order
        return [it for row in rows for it in sorted(row, key=lambda it: it.box[0])]
    # No gutter runs through everything (e.g. a title spans the columns): cut the rows into
    # bands, each the longest run of rows that shares a gutter, or a single row.
    out: list[T] = []
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
            out.extend(sorted(rows[i], key=lambda it: it.box[0]))
        else:
            out.extend(_order(_flat(rows[i : j + 1]), row_overlap, min_gutter))
        i = j + 1
    return out


def _flat(rows: list[list[T]]) -> list[T]:
    return [it for row in rows for it in row]


def _rows(items: list[T], row_overlap: float) -> list[list[T]]:
    """Cluster boxes into text rows by vertical overlap, top to bottom."""
    rows: list[list[T]] = []
    spans: list[tuple[float, float]] = []
    for it in sorted(items, key=lambda it: (it.box[1] + it.box[3]) / 2):
        y0, y1 = it.box[1], it.box[3]
        if rows:
            r0, r1 = spans[-1]
            overlap = min(y1, r1) - max(y0, r0)
            if overlap >= row_overlap * min(y1 - y0, r1 - r0):
                rows[-1].append(it)
                spans[-1] = (min(r0, y0), max(r1, y1))
                continue
        rows.append([it])
        spans.append((y0, y1))
    return rows


def _split_columns(items: list[T], rows: list[list[T]], min_gutter: float) -> list[list[T]] | None:
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
    return [left, right]


__all__ = ["HasBox", "reading_order"]
