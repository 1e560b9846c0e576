"""The OCR stage's resolution policies: `make_policy(VisionConfig.policy)` builds the one a
config variant names (`fixed`, `dynamic`, `article`); `AdaptiveResolution` drives the adaptive
two from live feedback (F15, F16). The ROI geometry of key frames lives here too.

One `AdaptiveResolution` can serve several streams and keeps independent state per `stream_id`
(the app builds one per stream): a `ResolutionScheduler` (controller + jump suppression) over a
ladder clipped to the stream's frame size, and a `FeedbackTracker`. Per key frame `plan` turns
the applied `Decision` into an `OcrPlan`: the detector long side from the rung (ramped through
the suppression window), the OCR interval (only where skipping is allowed, i.e. live input),
and a region of interest: the smaller of the key frame's content region (nothing outside it can
hold text) and its changed region plus a margin (only new or changed text is re-read; the stage
carries the lines outside it over), never the changed region on a stream's first key frame or
for a change covering most of the frame; shrunk to the decision's ROI ratio when that is below
1. After each read `observe` feeds latency (key-frame arrival to result: wait + OCR),
confidence, backlog, machine CPU load and, from `QosSignals`, the stream's ASR latency and the
key frames dropped at its OCR input back into the scheduler. `stats()` reports per stream the
jitter (px per video frame), the ROI ratio read and the rung history.

Optionally a learned `ResolutionHead` names the smallest rung the content needs; the plan then
uses the smaller of what the content needs and what the load allows.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from streamfuse.errors import ConfigError
from streamfuse.qos.controllers import Decision, make_controller
from streamfuse.qos.feedback import FeedbackTracker, SystemProbe
from streamfuse.qos.ladder import ALIGN_PX, DEFAULT_LADDER, Ladder, Rung, align_px
from streamfuse.qos.signals import QosSignals
from streamfuse.qos.smoothing import ResolutionScheduler
from streamfuse.vision.config import ArticlePolicy, DynamicPolicy, FixedPolicy, PolicyConfig
from streamfuse.vision.frames import BBox, KeyFrame, clamp_box, clip_box
from streamfuse.vision.policy import FixedResolution, OcrObservation, OcrPlan, ResolutionPolicy

log = logging.getLogger(__name__)

AdaptivePolicy = DynamicPolicy | ArticlePolicy


# ----------------------------------------------------------------------------------------------
# Geometry


def _pad(frame_wh: tuple[int, int], box: BBox, margin_frac: float) -> tuple[float, ...]:
    pad = margin_frac * min(frame_wh)
    x0, y0, x1, y1 = box
    return clamp_box((x0 - pad, y0 - pad, x1 + pad, y1 + pad), frame_wh)


def _shrink(
    frame_wh: tuple[int, int], box: tuple[float, ...], max_area: float
) -> tuple[float, ...]:
    """`box` shrunk about its centre (aspect kept) to at most `max_area` px^2."""
    x0, y0, x1, y1 = box
    area = (x1 - x0) * (y1 - y0)
    if area <= max_area:
        return box
    k = math.sqrt(max_area / area)
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    hw, hh = (x1 - x0) * k / 2, (y1 - y0) * k / 2
    return clamp_box((cx - hw, cy - hh, cx + hw, cy + hh), frame_wh)


def _to_bbox(frame_wh: tuple[int, int], box: tuple[float, ...]) -> BBox | None:
    box_px = clip_box(box, frame_wh)
    return None if box_px == (0, 0, *frame_wh) else box_px


def choose_roi(
    frame_wh: tuple[int, int], changed: BBox, roi_ratio: float, pad_frac: float = 0.03
) -> BBox | None:
    """Region to read under `roi_ratio` (max fraction of the frame area), None = whole frame.

    The changed region is padded by `pad_frac` of the frame's short side; if it is still larger
    than the allowed area it is shrunk about its centre (keeping its aspect ratio).
    """
    w, h = frame_wh
    if roi_ratio >= 1.0:
        return None
    if changed[2] <= changed[0] or changed[3] <= changed[1]:
        changed = (0, 0, w, h)  # nothing reported: the centre of the allowed area
    box = _shrink(frame_wh, _pad(frame_wh, changed, pad_frac), roi_ratio * w * h)
    return _to_bbox(frame_wh, box)


def select_roi(
    frame_wh: tuple[int, int],
    changed: BBox,
    content: BBox | None,
    *,
    first: bool = False,
    roi_ratio: float = 1.0,
    margin_frac: float = 0.03,
    whole_frame_above: float = 0.8,
) -> tuple[BBox | None, bool]:
    """The region of a key frame worth reading, clipped to the frame, and whether lines of the
    previous reading outside it still stand (`OcrPlan.carry_over`). None = the whole frame.

    Two regions are valid reads and the smaller wins: the content region (everything that is
    not plain background: no text can lie outside it, nothing carried over), and - except on
    a stream's first key frame - the changed region padded by `margin_frac` of the short side
    (what lies outside it did not change, so the previous lines there are carried over),
    unless it covers at least `whole_frame_above` of the frame (a new slide: cropping would
    save little and risk more). With `roi_ratio` < 1 the chosen region is shrunk about its
    centre to that fraction of the frame area (the article's ROI ratio; it can cut text).
    """
    w, h = frame_wh
    full = float(w * h)
    best: tuple[float, ...] | None = None
    carry = True
    if content is not None and content[2] > content[0] and content[3] > content[1]:
        best = tuple(float(v) for v in content)
        carry = False
    if not first and changed[2] > changed[0] and changed[3] > changed[1]:
        box = _pad(frame_wh, changed, margin_frac)
        area = (box[2] - box[0]) * (box[3] - box[1])
        if area < whole_frame_above * full and (
            best is None or area < (best[2] - best[0]) * (best[3] - best[1])
        ):
            best, carry = box, True
    if best is None:
        best, carry = (0.0, 0.0, float(w), float(h)), True
    if roi_ratio < 1.0:
        best = _shrink(frame_wh, best, roi_ratio * full)
    return _to_bbox(frame_wh, best), carry


def frame_ladder(frame_wh: tuple[int, int], base: Ladder = DEFAULT_LADDER) -> Ladder:
    """`base` without the rungs larger than the frame (a detector never upscales), topped by
    the frame's own size (32-px aligned) when that is more than one alignment step above the
    largest rung left."""
    w, h = frame_wh
    long_side = max(w, h)
    rungs = [r for r in base if r.long_side_px <= long_side]
    native = Rung(align_px(w), align_px(h))
    if not rungs or (
        native.long_side_px - rungs[0].long_side_px >= ALIGN_PX and native.pixels > rungs[0].pixels
    ):
        rungs.insert(0, native)
    return Ladder(tuple(rungs))


# ----------------------------------------------------------------------------------------------
# Per-stream state and statistics


@dataclass(frozen=True, slots=True)
class RungChange:
    """One entry of a stream's rung history (the first is the start)."""

    #: Policy clock, seconds since the stream's first key frame.
    t_s: float
    #: Media time of the read whose feedback caused the change (0 for the start).
    t_media: float
    side_px: int
    rung_index: int
    roi_ratio: float
    interval_s: float
    #: The latency the controller saw, s (None at the start).
    ocr_latency_s: float | None
    reason: str

    def to_record(self) -> dict[str, Any]:
        return {
            "t_s": round(self.t_s, 3),
            "t_media": round(self.t_media, 3),
            "side_px": self.side_px,
            "rung_index": self.rung_index,
            "roi_ratio": self.roi_ratio,
            "interval_s": self.interval_s,
            "ocr_latency_s": None if self.ocr_latency_s is None else round(self.ocr_latency_s, 3),
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class AdaptiveStats:
    """What one stream's policy did."""

    stream_id: str
    reads: int
    #: Video frames the jitter is averaged over.
    frames: int
    #: Mean |change of the detector side| per video frame, px.
    jitter_px_per_frame: float
    #: Largest change between two consecutive video frames, px (the blend ramp's step).
    peak_jitter_px: float
    #: Mean fraction of the frame area read per read (1.0 = always the whole frame).
    roi_ratio: float
    #: Detector long side of each plan, in order.
    sides_px: tuple[int, ...]
    history: tuple[RungChange, ...]

    @property
    def stepped_down(self) -> bool:
        return any(b.rung_index > a.rung_index for a, b in pairwise(self.history))

    def stepped_up_after_down(self) -> bool:
        low = None
        for a, b in pairwise(self.history):
            if b.rung_index > a.rung_index:
                low = b.rung_index if low is None else max(low, b.rung_index)
            elif low is not None and b.rung_index < a.rung_index:
                return True
        return False

    def to_record(self) -> dict[str, Any]:
        return {
            "stream_id": self.stream_id,
            "reads": self.reads,
            "frames": self.frames,
            "jitter_px_per_frame": round(self.jitter_px_per_frame, 4),
            "peak_jitter_px": self.peak_jitter_px,
            "roi_ratio": round(self.roi_ratio, 4),
            "sides_px": list(self.sides_px),
            "history": [c.to_record() for c in self.history],
        }


@dataclass
class _Stream:
    scheduler: ResolutionScheduler
    tracker: FeedbackTracker
    frame_wh: tuple[int, int]
    t0: float
    history: list[RungChange] = field(default_factory=list)
    sides_px: list[int] = field(default_factory=list)
    read_area: list[float] = field(default_factory=list)
    last_index: int = 0
    fps: float = 30.0


# ----------------------------------------------------------------------------------------------
# The policy

SchedulerFactory = Callable[[], ResolutionScheduler]
SizedSchedulerFactory = Callable[[tuple[int, int]], ResolutionScheduler]


class AdaptiveResolution(ResolutionPolicy):
    """A `ResolutionPolicy` whose plans follow a `ResolutionScheduler` per stream.

    Build it with `from_config` (what `make_policy` does), or pass `scheduler_factory` (no
    arguments, one ladder for every stream) or `sized_factory` (called with each stream's frame
    size).
    `head` is an optional `streamfuse.vision.reshead.ResolutionHead`; `signals` the job's
    `QosSignals` (ASR latency, shared CPU probe); `asr_latency_s` an alternative callable.
    `allow_skipping=False` (offline input, lossless links) keeps the OCR interval at 0.
    """

    def __init__(
        self,
        scheduler_factory: SchedulerFactory | None = None,
        *,
        sized_factory: SizedSchedulerFactory | None = None,
        head: Any | None = None,
        probe: SystemProbe | None = None,
        signals: QosSignals | None = None,
        asr_latency_s: Callable[[], float | None] | None = None,
        config: AdaptivePolicy | None = None,
        allow_skipping: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (scheduler_factory is None) == (sized_factory is None):
            raise ConfigError("give exactly one of scheduler_factory and sized_factory")
        self._factory = scheduler_factory
        self._sized_factory = sized_factory
        self._streams: dict[str, _Stream] = {}
        #: ROI, latency smoothing (the scheduler comes from the factory, not from here).
        self.config: AdaptivePolicy = config or DynamicPolicy()
        self.head = head
        self.signals = signals
        self.probe = probe if probe is not None else (signals.probe if signals else None)
        self.asr_latency_s = asr_latency_s
        self.allow_skipping = allow_skipping
        self.clock = clock
        self.last_plan: dict[str, OcrPlan] = {}

    @classmethod
    def from_config(
        cls,
        config: AdaptivePolicy | None = None,
        *,
        realtime: bool = True,
        signals: QosSignals | None = None,
        head: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> AdaptiveResolution:
        """The policy for a `dynamic` (default) or `article` config variant; `realtime=False`
        (offline input, lossless links) never lengthens the OCR interval."""
        cfg = config or DynamicPolicy()

        def make(frame_wh: tuple[int, int]) -> ResolutionScheduler:
            ladder = frame_ladder(frame_wh)
            if isinstance(cfg, ArticlePolicy):
                rule = cfg.rule
                if cfg.scale_to_frame:
                    w, h = frame_wh
                    rule = rule.model_copy(
                        update={
                            "high_size_px": (w, h),
                            "low_size_px": (round(w * 2 / 3), round(h * 2 / 3)),
                        }
                    )
                return ResolutionScheduler(make_controller(rule, ladder), cfg.suppression)
            fb = cfg.controller
            # The configured rungs refer to the full ladder; this frame's ladder may be shorter.
            top = min(fb.top_rung, ladder.lowest)
            floor = ladder.lowest if fb.floor_rung is None else fb.floor_rung
            floor = max(top, min(floor, ladder.lowest))
            start = fb.start_rung
            if cfg.start_side_px is not None:
                k = cfg.start_side_px / max(frame_wh)
                start = ladder.nearest(round(frame_wh[0] * k), round(frame_wh[1] * k))
            if start is not None:
                start = min(max(start, top), floor)
            update: dict[str, Any] = {"top_rung": top, "floor_rung": floor, "start_rung": start}
            if not realtime:
                # Offline links are lossless: interval levels would only skip key frames.
                update["max_interval_s"] = fb.base_interval_s
            controller = make_controller(fb.model_copy(update=update), ladder)
            return ResolutionScheduler(controller, cfg.suppression)

        return cls(
            sized_factory=make,
            head=head,
            signals=signals,
            config=cfg,
            allow_skipping=realtime,
            clock=clock,
        )

    # -- per-stream state ---------------------------------------------------------------------
    def _stream(self, stream_id: str, frame_wh: tuple[int, int]) -> _Stream:
        st = self._streams.get(stream_id)
        if st is None:
            if self._sized_factory is not None:
                sched = self._sized_factory(frame_wh)
            else:
                assert self._factory is not None
                sched = self._factory()
            tracker = FeedbackTracker(alpha=self.config.latency_alpha, probe=self.probe)
            st = _Stream(sched, tracker, frame_wh, self.clock())
            d = sched.current
            st.history.append(
                RungChange(
                    0.0,
                    0.0,
                    self._side(d.rung, frame_wh),
                    d.rung_index,
                    d.roi_ratio,
                    d.ocr_interval_s,
                    None,
                    d.reason or "start",
                )
            )
            self._streams[stream_id] = st
        return st

    @staticmethod
    def _side(rung: Rung, frame_wh: tuple[int, int]) -> int:
        return max(ALIGN_PX, min(rung.long_side_px, max(frame_wh)))

    def scheduler(self, stream_id: str) -> ResolutionScheduler:
        """The stream's scheduler (the stream must have been planned for already, unless the
        policy was built with a size-independent `scheduler_factory`)."""
        st = self._streams.get(stream_id)
        if st is None:
            if self._sized_factory is not None:
                raise ConfigError(f"stream {stream_id!r} has not been seen yet")
            st = self._stream(stream_id, (0, 0))
        return st.scheduler

    def decision(self, stream_id: str) -> Decision:
        return self.scheduler(stream_id).current

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(self._streams)

    # -- ResolutionPolicy -----------------------------------------------------------------------
    def plan(self, key: KeyFrame) -> OcrPlan:
        w, h = key.size
        first = key.stream_id not in self._streams
        st = self._stream(key.stream_id, (w, h))
        if st.frame_wh != (w, h):
            log.info("stream %s: frame size changed to %dx%d", key.stream_id, w, h)
            st.frame_wh = (w, h)
            first = True
        now = self.clock()
        d = st.scheduler.current
        side = max(ALIGN_PX, min(st.scheduler.side_px_at(now), max(w, h)))
        if self.head is not None:
            try:
                need = self.head.predict(key.image).rung
                side = max(ALIGN_PX, min(side, need.long_side_px))
            except Exception as e:  # a failing helper model must not stop OCR
                log.warning("resolution head failed on %s: %s", key.stream_id, e)
        carry = True
        if self.config.roi_focus:
            roi, carry = select_roi(
                (w, h),
                key.changed_bbox,
                key.content_bbox,
                first=first or key.reason == "first",
                roi_ratio=d.roi_ratio,
                margin_frac=self.config.roi_margin_frac,
                whole_frame_above=self.config.whole_frame_above,
            )
        else:
            roi = choose_roi((w, h), key.changed_bbox, d.roi_ratio)
        area = 1.0 if roi is None else (roi[2] - roi[0]) * (roi[3] - roi[1]) / float(w * h)
        st.read_area.append(area)
        st.sides_px.append(side)
        st.last_index = max(st.last_index, key.index)
        if key.t_media > 0 and key.index > 0:
            st.fps = key.index / key.t_media
        # The side is the whole frame's: the stage reads a ROI at the same scale.
        plan = OcrPlan(
            det_max_side_px=side,
            roi=roi,
            min_interval_s=d.ocr_interval_s if self.allow_skipping else 0.0,
            carry_over=carry,
        )
        self.last_plan[key.stream_id] = plan
        return plan

    def observe(self, obs: OcrObservation) -> None:
        st = self._streams.get(obs.stream_id)
        if st is None:  # feedback for a stream never planned: nothing to steer
            log.debug("observation for unknown stream %s ignored", obs.stream_id)
            return
        st.tracker.record_ocr((obs.ocr_ms + obs.wait_ms) / 1000.0, obs.mean_conf, obs.backlog)
        asr = None
        if self.signals is not None:
            st.tracker.record_drops(self.signals.take_drops(obs.stream_id))
            asr = self.signals.asr_latency_s(obs.stream_id)
        if asr is None and self.asr_latency_s is not None:
            asr = self.asr_latency_s()
        if asr is not None:
            st.tracker.record_asr_latency(asr)
        now = self.clock()
        snapshot = st.tracker.snapshot(now)
        before = st.scheduler.current
        after = st.scheduler.update(snapshot)
        if not after.same_setting(before):
            st.history.append(
                RungChange(
                    now - st.t0,
                    obs.t_media,
                    self._side(after.rung, st.frame_wh),
                    after.rung_index,
                    after.roi_ratio,
                    after.ocr_interval_s,
                    snapshot.ocr_latency_s,
                    after.reason,
                )
            )
            log.info(
                "%s: OCR %s -> %s, roi %.2f, interval %.2fs (%s)",
                obs.stream_id,
                before.rung,
                after.rung,
                after.roi_ratio,
                after.ocr_interval_s,
                after.reason,
            )

    # -- reporting ------------------------------------------------------------------------------
    def stats(self, frames: Mapping[str, int] | None = None) -> dict[str, AdaptiveStats]:
        """Per-stream statistics. `frames` gives each stream's video frame count (e.g. its
        duration x fps); by default the index of the last key frame seen."""
        out: dict[str, AdaptiveStats] = {}
        for sid, st in self._streams.items():
            blend_s = st.scheduler.suppressor.config.blend_s
            n = (frames or {}).get(sid, st.last_index + 1)
            sides = [c.side_px for c in st.history]
            deltas = [abs(b - a) for a, b in pairwise(sides) if b != a]
            total = float(sum(deltas))
            ramp_frames = max(1.0, blend_s * st.fps)
            peak = 0.0
            for d in deltas:
                step = d if ramp_frames <= 1 else ALIGN_PX * math.ceil(d / ramp_frames / ALIGN_PX)
                peak = max(peak, float(min(d, step)))
            out[sid] = AdaptiveStats(
                stream_id=sid,
                reads=len(st.sides_px),
                frames=n,
                jitter_px_per_frame=total / max(1, n - 1),
                peak_jitter_px=peak,
                roi_ratio=(sum(st.read_area) / len(st.read_area)) if st.read_area else 1.0,
                sides_px=tuple(st.sides_px),
                history=tuple(st.history),
            )
        return out


def make_policy(
    config: PolicyConfig,
    *,
    realtime: bool = True,
    signals: QosSignals | None = None,
    head: Any | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ResolutionPolicy:
    """The `ResolutionPolicy` a `VisionConfig.policy` variant describes: `FixedResolution`
    for `fixed`, `AdaptiveResolution` for `dynamic` and `article` (see `from_config`)."""
    if isinstance(config, FixedPolicy):
        return FixedResolution.from_config(config)
    return AdaptiveResolution.from_config(
        config, realtime=realtime, signals=signals, head=head, clock=clock
    )


__all__ = [
    "AdaptivePolicy",
    "AdaptiveResolution",
    "AdaptiveStats",
    "RungChange",
    "choose_roi",
    "frame_ladder",
    "make_policy",
    "select_roi",
]
