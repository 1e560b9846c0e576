"""Frames of the vision path.

`KeyFrame` is a video picture the change detector selected for reading: it keeps the media time
and `arrival_wall` of the video frame it is (latency is measured from it), the changed region
since the previous key frame, and why it was selected. It is not a `VideoFrame`, so stages
routed by type never confuse the 30 fps stream with the few pictures worth reading.
`clamp_box` / `clip_box` are the one rule for keeping a region inside a frame (unrounded / as a
crop of whole pixels).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from streamfuse.frames import Frame

BBox = tuple[int, int, int, int]
"""(x0, y0, x1, y1) in original frame pixels, x1/y1 exclusive."""

KeyReason = Literal["first", "change", "timeout", "end"]

ReadLine = tuple[str, tuple[float, float, float, float], float]
"""A line another node already read: (text, (x0, y0, x1, y1) in frame pixels, recognizer
score in [0, 1])."""


def clamp_box(box: Sequence[float], frame_wh: tuple[int, int]) -> tuple[float, float, float, float]:
    """`box` (x0, y0, x1, y1) with every coordinate clamped into a `frame_wh` frame, unrounded."""
    w, h = frame_wh
    x0, y0, x1, y1 = (float(v) for v in box)
    return (
        min(max(0.0, x0), float(w)),
        min(max(0.0, y0), float(h)),
        min(max(0.0, x1), float(w)),
        min(max(0.0, y1), float(h)),
    )


def clip_box(box: Sequence[float], frame_wh: tuple[int, int]) -> BBox:
    """`box` (x0, y0, x1, y1) as whole pixels inside a `frame_wh` frame: rounded outwards,
    clamped to the frame, at least one pixel each way (what a crop of the image can be)."""
    w, h = frame_wh
    x0, y0 = math.floor(box[0]), math.floor(box[1])
    x1, y1 = math.ceil(box[2]), math.ceil(box[3])
    x0, y0 = max(0, min(x0, w - 1)), max(0, min(y0, h - 1))
    x1, y1 = max(x0 + 1, min(x1, w)), max(y0 + 1, min(y1, h))
    return (x0, y0, x1, y1)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class KeyFrame(Frame):
    """A settled picture to read. `image` is RGB uint8 (height, width, 3), not copied."""

    image: np.ndarray
    index: int = 0
    #: Region that differs from the previous key frame (the whole frame for the first one).
    changed_bbox: BBox = (0, 0, 0, 0)
    #: Fraction of thumbnail cells that differ from the previous key frame, in [0, 1].
    changed_frac: float = 1.0
    #: Region holding anything but the dominant background colour (None: unknown or blank).
    #: Text cannot lie outside it, so reading only this region loses nothing.
    content_bbox: BBox | None = None
    #: Media time of the first frame that showed the change (before settling).
    t_changed: float = 0.0
    reason: KeyReason = "change"
    #: Lines the edge already read from the original picture (the split moved past the
    #: recognizer, `streamfuse.transport.textlines`): `image` is then a blank page of the
    #: frame's size and OCR emits these lines instead of reading. None: read `image`.
    read_lines: tuple[ReadLine, ...] | None = None
    #: With `read_lines`: the reader's wall time (ms) and its detector's long side (px).
    read_ms: float = 0.0
    read_det_side_px: int = 0

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return int(self.image.shape[1]), int(self.image.shape[0])

    @property
    def t_end(self) -> float:
        return self.t_media


__all__ = ["BBox", "KeyFrame", "KeyReason", "ReadLine", "clamp_box", "clip_box"]
