"""A direct estimate of the smallest text on a picture, for the OCR rung floor.

`smallest_text_height_px(image)` finds text-line-like blobs of vertical strokes (glyph stems
give steep left-right steps; rules, stripes and smooth photos give none), joined along the line,
and returns the height of the smallest line, in image pixels (None: no text-like blob).
`floor_side_px` turns it into the smallest detector long side at which that line keeps
`min_text_px` pixels, so small text is never read below legibility (docs/ocr-layout.md).
"""

from __future__ import annotations

import math

import numpy as np

from streamfuse.qos.ladder import ALIGN_PX


def smallest_text_height_px(
    image: np.ndarray,
    *,
    min_step: int = 32,
    min_height_px: int = 5,
    min_aspect: float = 3.0,
    min_blobs: int = 1,
) -> float | None:
    """Height of the smallest text line in an RGB (or grey) image, px; None if none is found.

    A pixel is a stroke edge when the grey level steps by `min_step` or more across it (left
    to right); edges closer than about a letter gap are joined along the row, then each blob
    at least `min_height_px` high and `min_aspect` times wider than high counts as a line.
    """
    import cv2

    grey = image if image.ndim == 2 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    if grey.shape[0] < 8 or grey.shape[1] < 8:
        return None
    edges = np.zeros(grey.shape, np.uint8)
    edges[:, 1:-1] = cv2.absdiff(grey[:, 2:], grey[:, :-2]) >= min_step
    # Join the stems of a word and the words of a line (gaps up to ~6 px), then fill the
    # small vertical holes between strokes' edges.
    joined = cv2.morphologyEx(edges, cv2.MORPH_CLOSE, np.ones((3, 7), np.uint8))
    n, _, stats, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
    heights = [
        float(h)
        for _x, _y, w, h, area in stats[1:n]
        if h >= min_height_px and w >= min_aspect * h and area >= 0.4 * w * h
    ]
    if len(heights) < min_blobs:
        return None
    return min(heights)


def floor_side_px(
    text_height_px: float | None, long_side_px: int, *, min_text_px: float
) -> int | None:
    """The smallest detector long side (32-px aligned, at most `long_side_px`) that gives a
    `text_height_px` line at least `min_text_px` pixels; None when there is no text."""
    if text_height_px is None or text_height_px <= 0:
        return None
    side = long_side_px * min_text_px / text_height_px
    return min(long_side_px, ALIGN_PX * math.ceil(side / ALIGN_PX))


__all__ = ["floor_side_px", "smallest_text_height_px"]
