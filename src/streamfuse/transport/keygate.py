"""Which of the change detector's key frames the edge sends: only those whose text changed.

`ContentGate.changed(image)` compares a candidate key frame with the last one sent after
undoing what a camera adds and a local run's detector cannot tell from new content: the
camera's global shift (phase correlation), lighting (each picture binarized against its own
local mean: ink vs paper, whatever the gain), and sensor noise (compared at half size, with a
1-pixel tolerance). It answers with the share of blocks whose ink differs; `accept(image)`
makes a frame the new reference once it is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

#: Binarization: a pixel is ink when this much darker than the mean of its 15 x 15
#: neighbourhood (at the comparison size). Sensor noise there is ~2 grey levels, text ~100+.
_INK_BLOCK_PX = 15
_INK_C = 12
#: Side of a comparison block, pixels at the comparison size, and the differing ink pixels
#: that make a block changed (a 1-pixel misregistration of a stroke differs in fewer).
_BLOCK_PX = 8
_BLOCK_MIN_PX = 4
#: Pixels ignored at each border (a shift moves the picture's edge there).
_BORDER_PX = 4
_DILATE = np.ones((3, 3), dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class GateDecision:
    changed: bool
    #: Share of comparison blocks whose ink differs from the last key frame sent (1.0: first).
    changed_frac: float
    #: The camera's shift from the last key frame sent to this one, pixels of the frame.
    shift_px: tuple[float, float] = (0.0, 0.0)


def _ink(grey: np.ndarray) -> np.ndarray:
    return cv2.adaptiveThreshold(
        grey, 1, cv2.ADAPTIVE_THRESH_MEAN_C, cv2.THRESH_BINARY_INV, _INK_BLOCK_PX, _INK_C
    ).astype(bool)


class ContentGate:
    """Per stream: the last key frame sent (grey, `width_px` wide) and the comparison."""

    def __init__(self, width_px: int = 640, min_changed_frac: float = 0.004) -> None:
        self.width_px = width_px
        self.min_changed_frac = min_changed_frac
        self._ref: np.ndarray | None = None
        self._scale = 1.0

    def small(self, image: np.ndarray) -> np.ndarray:
        """The grey comparison copy of an RGB or grey uint8 frame (area-averaged: noise
        averages out too)."""
        grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY) if image.ndim == 3 else image
        h, w = grey.shape
        tw = min(self.width_px, w)
        self._scale = w / tw
        return cv2.resize(grey, (tw, max(1, round(h * tw / w))), interpolation=cv2.INTER_AREA)

    def reset(self) -> None:
        """Forget the reference: the next frame counts as changed (the cloud lost it)."""
        self._ref = None

    def changed(self, image: np.ndarray) -> GateDecision:
        """Whether `image` (a full frame) holds other text than the last key frame sent."""
        new = self.small(image)
        ref = self._ref
        if ref is None or ref.shape != new.shape:
            return GateDecision(True, 1.0)
        h, w = new.shape
        window = cv2.createHanningWindow((w, h), cv2.CV_32F)
        (dx, dy), _response = cv2.phaseCorrelate(
            ref.astype(np.float32), new.astype(np.float32), window
        )
        # A shift this large is a new picture (or a pan): compare unshifted, it will differ.
        if abs(dx) > w / 8 or abs(dy) > h / 8:
            dx = dy = 0.0
        moved = cv2.warpAffine(
            ref,
            np.array([[1, 0, dx], [0, 1, dy]], dtype=np.float32),
            (w, h),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REPLICATE,
        )
        a, b = _ink(new), _ink(moved)
        # Ink in one without ink within a pixel in the other: strokes cut a little differently
        # (noise, sub-pixel shift) stay equal; a new word or line does not.
        near_a = cv2.dilate(a.astype(np.uint8), _DILATE).astype(bool)
        near_b = cv2.dilate(b.astype(np.uint8), _DILATE).astype(bool)
        diff = (a & ~near_b) | (b & ~near_a)
        e = _BORDER_PX
        diff = diff[e : h - e, e : w - e]
        rows, cols = diff.shape[0] // _BLOCK_PX, diff.shape[1] // _BLOCK_PX
        if rows == 0 or cols == 0:
            return GateDecision(bool(diff.any()), float(diff.mean()) if diff.size else 0.0)
        blocks = (
            diff[: rows * _BLOCK_PX, : cols * _BLOCK_PX]
            .reshape(rows, _BLOCK_PX, cols, _BLOCK_PX)
            .sum(axis=(1, 3))
        )
        frac = float(np.count_nonzero(blocks >= _BLOCK_MIN_PX)) / blocks.size
        shift = (float(dx) * self._scale, float(dy) * self._scale)
        return GateDecision(frac >= self.min_changed_frac, frac, shift)

    def accept(self, image: np.ndarray) -> None:
        """`image` was sent: later frames are compared with it."""
        self._ref = self.small(image)


__all__ = ["ContentGate", "GateDecision"]
