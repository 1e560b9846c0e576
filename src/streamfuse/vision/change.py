"""Cheap change detection: which video frames are worth reading.

Each frame is shrunk to a small grey thumbnail (~0.3-1 ms at 720p). A frame becomes a
`KeyFrame` when (a) it is the first of its stream, or (b) enough thumbnail cells differ from the
last key frame (`min_changed_frac`; small local motion such as a mouse pointer stays below it)
AND the picture has held still for `settle_s` (so transitions are not read half-drawn), or (c) a
change has been pending for `max_wait_s` without ever settling. State is kept per `stream_id`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import cv2
import numpy as np

from streamfuse.frames import Frame, VideoFrame
from streamfuse.pipeline.stage import Stage
from streamfuse.vision.config import ChangeDetectorConfig, VisionConfig
from streamfuse.vision.frames import BBox, KeyFrame, KeyReason

log = logging.getLogger(__name__)


def thumbnail(image: np.ndarray, width_px: int) -> np.ndarray:
    """A grey int16 thumbnail `width_px` wide (aspect kept) of an RGB or grey uint8 image.

    Subsamples with a stride first (to about twice the thumbnail size) so the area average
    touches ~1/16 of the pixels: the cost stays near-constant from 480p to 4K.
    """
    h, w = image.shape[:2]
    tw = max(1, min(width_px, w))
    th = max(1, round(h * tw / w))
    stride = max(1, int(min(w / tw, h / th) // 2))
    view = image[::stride, ::stride] if stride > 1 else image
    small = cv2.resize(view, (tw, th), interpolation=cv2.INTER_AREA)
    if small.ndim == 3:
        small = cv2.cvtColor(small, cv2.COLOR_RGB2GRAY)
    return small.astype(np.int16)


@dataclass
class _Track:
    """Per-stream detector state."""

    shape: tuple[int, ...]
    ref: np.ndarray  # thumbnail of the last key frame
    anchor: np.ndarray  # first thumbnail of the current still run
    anchor_t: float
    pending_t: float | None = None  # media time a change vs `ref` was first seen
    last: VideoFrame | None = None
    last_thumb: np.ndarray | None = None
    last_bbox: BBox = (0, 0, 0, 0)
    last_frac: float = 0.0
    keys: int = 0


@dataclass(frozen=True, slots=True)
class ChangeDecision:
    """The detector's verdict on one frame (also useful for diagnostics and tests)."""

    key: bool
    reason: KeyReason | None
    changed_frac: float  # vs the last key frame
    still: bool
    bbox: BBox
    t_changed: float
    content_bbox: BBox | None = None


class ChangeTracker:
    """The detection logic without the pipeline: feed frames in order, get decisions."""

    def __init__(self, config: ChangeDetectorConfig | None = None) -> None:
        self.config = config or ChangeDetectorConfig()
        self._tracks: dict[str, _Track] = {}

    def reset(self, stream_id: str | None = None) -> None:
        if stream_id is None:
            self._tracks.clear()
        else:
            self._tracks.pop(stream_id, None)

    def update(self, frame: VideoFrame) -> ChangeDecision:
        cfg = self.config
        thumb = thumbnail(frame.image, cfg.thumb_width_px)
        track = self._tracks.get(frame.stream_id)
        w, h = frame.size
        if track is None or track.shape != frame.image.shape:
            if track is not None:
                log.info("stream %s: picture size changed, restarting detection", frame.stream_id)
            track = _Track(shape=frame.image.shape, ref=thumb, anchor=thumb, anchor_t=frame.t_media)
            self._tracks[frame.stream_id] = track
            track.last = frame
            track.keys += 1
            content = _content_bbox(thumb, w, h, cfg.content_delta)
            return ChangeDecision(True, "first", 1.0, True, (0, 0, w, h), frame.t_media, content)

        # Still: few cells moved since the start of the current still run.
        moved = np.count_nonzero(np.abs(thumb - track.anchor) > cfg.still_delta) / thumb.size
        if moved > cfg.still_frac:
            track.anchor, track.anchor_t = thumb, frame.t_media
        half_frame_s = 0.5 / frame.fps if frame.fps > 0 else 0.0
        still_s = frame.t_media - track.anchor_t
        settled = still_s >= cfg.settle_s - half_frame_s

        diff = thumb - track.ref
        if cfg.compensate_brightness:
            shift = int(np.median(diff))
            if shift:
                diff = diff - shift
        mask = np.abs(diff) > cfg.change_delta
        frac = float(np.count_nonzero(mask)) / mask.size
        track.last, track.last_thumb = frame, thumb

        if frac < cfg.min_changed_frac or frac == 0.0:
            track.pending_t = None  # back to (or never left) what was last read
            return ChangeDecision(False, None, frac, settled, (0, 0, 0, 0), frame.t_media)

        if track.pending_t is None:
            track.pending_t = frame.t_media
        bbox = _bbox(mask, w, h)
        track.last_bbox, track.last_frac = bbox, frac
        reason: KeyReason | None = None
        if settled:
            reason = "change"
        elif frame.t_media - track.pending_t >= cfg.max_wait_s:
            reason = "timeout"
        content = _content_bbox(thumb, w, h, cfg.content_delta) if reason is not None else None
        decision = ChangeDecision(
            reason is not None, reason, frac, settled, bbox, track.pending_t, content
        )
        if reason is not None:
            track.ref = thumb
            track.pending_t = None
            track.keys += 1
        return decision

    def pending(self) -> list[tuple[VideoFrame, ChangeDecision]]:
        """Streams whose picture changed but has not been emitted yet (end of stream)."""
        out = []
        for track in self._tracks.values():
            if track.pending_t is not None and track.last is not None:
                content = None
                if track.last_thumb is not None:
                    w, h = track.last.size
                    content = _content_bbox(track.last_thumb, w, h, self.config.content_delta)
                decision = ChangeDecision(
                    True, "end", track.last_frac, False, track.last_bbox, track.pending_t, content
                )
                out.append((track.last, decision))
                if track.last_thumb is not None:
                    track.ref = track.last_thumb
                track.pending_t = None
        return out


def _content_bbox(thumb: np.ndarray, w: int, h: int, delta: int) -> BBox | None:
    """Where the picture is not plain background (the median grey level); None when blank."""
    background = int(np.median(thumb))
    box = _bbox(np.abs(thumb - background) > delta, w, h, pad_cells=2)
    return None if box[2] <= box[0] or box[3] <= box[1] else box


def _bbox(mask: np.ndarray, w: int, h: int, pad_cells: int = 1) -> BBox:
    """Bounding box of the set cells of `mask` in original pixels, padded by `pad_cells`."""
    th, tw = mask.shape
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    if rows.size == 0:
        return (0, 0, 0, 0)
    sx, sy = w / tw, h / th
    x0 = max(0, int((cols[0] - pad_cells) * sx))
    y0 = max(0, int((rows[0] - pad_cells) * sy))
    x1 = min(w, int(np.ceil((cols[-1] + 1 + pad_cells) * sx)))
    y1 = min(h, int(np.ceil((rows[-1] + 1 + pad_cells) * sy)))
    return (x0, y0, x1, y1)


def key_frame(frame: VideoFrame, d: ChangeDecision) -> KeyFrame:
    """The key frame the change detector emits for `frame` and its decision to emit it."""
    assert d.reason is not None
    return KeyFrame(
        stream_id=frame.stream_id,
        t_media=frame.t_media,
        arrival_wall=frame.arrival_wall,
        image=frame.image,
        index=frame.index,
        changed_bbox=d.bbox,
        changed_frac=d.changed_frac,
        content_bbox=d.content_bbox,
        t_changed=d.t_changed,
        reason=d.reason,
    )


class ChangeDetector(Stage):
    """VideoFrame (30 fps) -> KeyFrame (once per settled change, plus the first frame)."""

    input_types = (VideoFrame,)

    def __init__(
        self,
        config: ChangeDetectorConfig | VisionConfig | None = None,
        *,
        name: str | None = None,
    ) -> None:
        super().__init__(name)
        if isinstance(config, VisionConfig):
            config = config.change
        self.tracker = ChangeTracker(config)

    @property
    def config(self) -> ChangeDetectorConfig:
        return self.tracker.config

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, VideoFrame)
        # ~1 ms of numpy/OpenCV on a tiny array: cheaper inline than a thread hop.
        decision = self.tracker.update(frame)
        if decision.key:
            log.debug(
                "key frame %s t=%.3f (%s, %.1f%% changed)",
                frame.index,
                frame.t_media,
                decision.reason,
                100 * decision.changed_frac,
            )
            yield key_frame(frame, decision)

    async def flush(self) -> AsyncIterator[Frame]:
        for frame, decision in self.tracker.pending():
            yield key_frame(frame, decision)


__all__ = ["ChangeDecision", "ChangeDetector", "ChangeTracker", "thumbnail"]
