"""`AdaptiveResolution`: the OCR stage's `ResolutionPolicy` driven by a `ResolutionScheduler`.

Per key frame it turns the applied `Decision` into an `OcrPlan`: detector long side from the
rung (ramped through the jump-suppression window, fitted to the frame), the OCR interval, and a
region of interest when the ROI ratio is below 1 (the changed region reported by the change
detector, padded, and shrunk about its centre to the allowed area). Optionally a learned
`ResolutionHead` names the smallest rung the content needs, and the plan uses the smaller of
what the content needs and what the load allows. After each read, `observe` feeds latency,
confidence and backlog back into the scheduler.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from streamfuse.qos.controllers import Decision
from streamfuse.qos.feedback import FeedbackTracker, SystemProbe
from streamfuse.qos.smoothing import ResolutionScheduler
from streamfuse.vision.frames import BBox, KeyFrame
from streamfuse.vision.policy import OcrObservation, OcrPlan, ResolutionPolicy

log = logging.getLogger(__name__)


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
    x0, y0, x1, y1 = (float(v) for v in changed)
    if x1 <= x0 or y1 <= y0:  # nothing changed reported: centre region of the allowed area
        x0, y0, x1, y1 = 0.0, 0.0, float(w), float(h)
    pad = pad_frac * min(w, h)
    x0, y0 = max(0.0, x0 - pad), max(0.0, y0 - pad)
    x1, y1 = min(float(w), x1 + pad), min(float(h), y1 + pad)
    area = (x1 - x0) * (y1 - y0)
    allowed = roi_ratio * w * h
    if area > allowed:
        k = math.sqrt(allowed / area)
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        hw, hh = (x1 - x0) * k / 2, (y1 - y0) * k / 2
        x0, x1 = max(0.0, cx - hw), min(float(w), cx + hw)
        y0, y1 = max(0.0, cy - hh), min(float(h), cy + hh)
    box = (int(x0), int(y0), math.ceil(x1), math.ceil(y1))
    if box == (0, 0, w, h):
        return None
    return box


class AdaptiveResolution(ResolutionPolicy):
    """A `ResolutionPolicy` whose plans follow a `ResolutionScheduler` (per stream).

    `head` is optional (a `streamfuse.vision.reshead.ResolutionHead`); `asr_latency_s` is an
    optional callable returning the current ASR latency for the article rule.
    """

    def __init__(
        self,
        scheduler_factory: Callable[[], ResolutionScheduler],
        *,
        head: Any | None = None,
        probe: SystemProbe | None = None,
        asr_latency_s: Callable[[], float | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = scheduler_factory
        self._schedulers: dict[str, ResolutionScheduler] = {}
        self._trackers: dict[str, FeedbackTracker] = {}
        self.head = head
        self.probe = probe
        self.asr_latency_s = asr_latency_s
        self.clock = clock
        self.last_plan: dict[str, OcrPlan] = {}

    def scheduler(self, stream_id: str) -> ResolutionScheduler:
        if stream_id not in self._schedulers:
            self._schedulers[stream_id] = self._factory()
            self._trackers[stream_id] = FeedbackTracker(probe=self.probe)
        return self._schedulers[stream_id]

    def decision(self, stream_id: str) -> Decision:
        return self.scheduler(stream_id).current

    def plan(self, key: KeyFrame) -> OcrPlan:
        sched = self.scheduler(key.stream_id)
        now = self.clock()
        d = sched.current
        w, h = key.size
        side = sched.side_px_at(now)
        if self.head is not None:
            try:
                need = self.head.predict(key.image).rung
                side = min(side, need.long_side_px)
            except Exception as e:  # a failing helper model must not stop OCR
                log.warning("resolution head failed on %s: %s", key.stream_id, e)
        # Fit the frame inside a box of `side` on the long side (never upscaling).
        det_side = max(32, min(side, max(w, h)))
        plan = OcrPlan(
            det_max_side_px=det_side,
            roi=choose_roi((w, h), key.changed_bbox, d.roi_ratio),
            min_interval_s=d.ocr_interval_s,
        )
        self.last_plan[key.stream_id] = plan
        return plan

    def observe(self, obs: OcrObservation) -> None:
        sched = self.scheduler(obs.stream_id)
        tracker = self._trackers[obs.stream_id]
        tracker.record_ocr((obs.ocr_ms + obs.wait_ms) / 1000.0, obs.mean_conf, obs.backlog)
        if self.asr_latency_s is not None:
            asr = self.asr_latency_s()
            if asr is not None:
                tracker.record_asr_latency(asr)
        before = sched.current
        after = sched.update(tracker.snapshot(self.clock()))
        if not after.same_setting(before):
            log.info(
                "%s: OCR %s -> %s, roi %.2f, interval %.2fs (%s)",
                obs.stream_id,
                before.rung,
                after.rung,
                after.roi_ratio,
                after.ocr_interval_s,
                after.reason,
            )
