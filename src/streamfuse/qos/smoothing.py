"""Resolution-jump suppression (F16) and the metrics that show it works.

`JumpSuppressor` turns a controller's target into the applied decision: at most
`max_rung_step` rungs per change, no change sooner than `min_dwell_s` after the previous one
(`up_dwell_s` before a step up, which is the costly direction), and a `blend_s` transition
window during which the detector input side ramps from the old rung to the new one in 32-px
steps instead of jumping. `ResolutionScheduler` closes the loop: feedback -> controller ->
suppressor -> applied decision. Metrics: `JitterMeter` (mean |change of the OCR input side| in
px per video frame) and `text_consistency` (mean normalized edit similarity of consecutive
readings of the same slide).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rapidfuzz.distance import Levenshtein

from streamfuse.qos.controllers import Decision, ResolutionController, make_decision
from streamfuse.qos.feedback import Feedback
from streamfuse.qos.ladder import ALIGN_PX, Ladder, align_px
from streamfuse.text import collapse_whitespace


class JumpSuppressionConfig(BaseModel):
    """Dwell, rate limit and transition window between rungs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_dwell_s: float = Field(
        1.0,
        ge=0.0,
        le=600.0,
        description="No two changes of the applied decision closer than this, s.",
    )
    up_dwell_s: float = Field(
        3.0,
        ge=0.0,
        le=600.0,
        description="A step *up* (more work) also waits this long after the previous change, "
        "so a brief lull does not undo a step down.",
    )
    max_rung_step: int = Field(1, ge=1, le=31, description="Most rungs one change may move.")
    blend_s: float = Field(
        0.5,
        ge=0.0,
        le=60.0,
        description="Transition window after a change: the detector input side ramps linearly "
        "(in 32-px steps) from the old rung to the new one over this time.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> JumpSuppressionConfig:
        if self.blend_s > self.min_dwell_s:
            raise ValueError(
                f"blend_s ({self.blend_s}) must not exceed min_dwell_s ({self.min_dwell_s}): a "
                "new change would start before the previous transition ends"
            )
        return self


@dataclass(frozen=True, slots=True)
class Transition:
    """The latest change of the applied rung: from `from_side_px` at `t_s` to `to_side_px`."""

    t_s: float
    from_side_px: int
    to_side_px: int


class JumpSuppressor:
    """Rate-limits a controller's targets into applied decisions (see module docstring)."""

    def __init__(self, config: JumpSuppressionConfig | None = None) -> None:
        self.config = config or JumpSuppressionConfig()
        self.last_change_s: float | None = None
        self.transition: Transition | None = None

    def reset(self) -> None:
        self.last_change_s = None
        self.transition = None

    def apply(self, target: Decision, current: Decision, t_s: float) -> Decision:
        """Applied decision at `t_s` for a (rate-limited) `target`: `current` while dwelling."""
        if target.same_setting(current):
            return target
        c = self.config
        going_up = target.rung_index < current.rung_index or (
            target.rung_index == current.rung_index
            and (
                target.roi_ratio > current.roi_ratio
                or target.ocr_interval_s < current.ocr_interval_s
            )
        )
        if self.last_change_s is not None:
            since = t_s - self.last_change_s
            if since < c.min_dwell_s or (going_up and since < c.up_dwell_s):
                return replace(current, reason=f"dwell ({target.reason})")
        self.last_change_s = t_s
        if target.rung_index != current.rung_index:
            self.transition = Transition(t_s, current.rung.long_side_px, target.rung.long_side_px)
        return target

    def side_px_at(self, applied: Decision, t_s: float) -> int:
        """Detector input long side at `t_s`, ramping through the transition window."""
        tr = self.transition
        blend = self.config.blend_s
        if tr is None or blend <= 0 or t_s >= tr.t_s + blend:
            return applied.rung.long_side_px
        w = min(1.0, max(0.0, (t_s - tr.t_s) / blend))
        side = tr.from_side_px + w * (tr.to_side_px - tr.from_side_px)
        return align_px(side, ALIGN_PX)

    def transition_weight(self, t_s: float) -> float:
        """1.0 outside a transition, else the fraction of the window elapsed. A consumer can
        weight results read at the new setting by it (e.g. keep the previous reading of a line
        unless the new one is at least as confident)."""
        tr = self.transition
        blend = self.config.blend_s
        if tr is None or blend <= 0:
            return 1.0
        return min(1.0, max(0.0, (t_s - tr.t_s) / blend))


class ResolutionScheduler:
    """Feedback -> controller target -> jump suppression -> applied decision, per stream."""

    def __init__(
        self,
        controller: ResolutionController,
        suppression: JumpSuppressionConfig | None = None,
    ) -> None:
        self.controller = controller
        self.suppressor = JumpSuppressor(suppression)
        self.current: Decision = controller.initial()
        self.target: Decision = self.current

    @property
    def ladder(self) -> Ladder:
        return self.controller.ladder

    def reset(self) -> None:
        self.controller.reset()
        self.suppressor.reset()
        self.current = self.target = self.controller.initial()

    def update(self, feedback: Feedback) -> Decision:
        """Feed one snapshot; returns the decision applied from now on."""
        target = self.controller.decide(feedback, self.current)
        self.target = target
        limit = self.suppressor.config.max_rung_step
        delta = target.rung_index - self.current.rung_index
        if abs(delta) > limit:
            step = self.current.rung_index + int(math.copysign(limit, delta))
            target = make_decision(
                self.controller.ladder,
                step,
                target.ocr_interval_s,
                target.roi_ratio,
                target.reason + f" (rate-limited to {limit} rung)",
            )
        self.current = self.suppressor.apply(target, self.current, feedback.t_s)
        return self.current

    def side_px_at(self, t_s: float) -> int:
        """Detector input long side to use at `t_s` (ramped during a transition)."""
        return self.suppressor.side_px_at(self.current, t_s)


class JitterMeter:
    """Mean and peak |change of the OCR input resolution| in px per video frame."""

    def __init__(self) -> None:
        self._prev: float | None = None
        self._sum = 0.0
        self._max = 0.0
        self._steps = 0

    def update(self, side_px: float) -> None:
        if self._prev is not None:
            d = abs(side_px - self._prev)
            self._sum += d
            self._max = max(self._max, d)
            self._steps += 1
        self._prev = side_px

    def extend(self, sides_px: Iterable[float]) -> None:
        for s in sides_px:
            self.update(s)

    @property
    def frames(self) -> int:
        return self._steps + (1 if self._prev is not None else 0)

    @property
    def mean_px_per_frame(self) -> float:
        return self._sum / self._steps if self._steps else 0.0

    @property
    def max_px_per_frame(self) -> float:
        return self._max


def jitter_px_per_frame(sides_px: Sequence[float]) -> float:
    """Mean |resolution change| in px per frame over a per-frame sequence of input sides."""
    m = JitterMeter()
    m.extend(sides_px)
    return m.mean_px_per_frame


def text_similarity(a: str, b: str) -> float:
    """Normalized edit similarity in [0, 1] (1 = identical), whitespace-insensitive."""
    a2, b2 = collapse_whitespace(a), collapse_whitespace(b)
    if not a2 and not b2:
        return 1.0
    return float(Levenshtein.normalized_similarity(a2, b2))


def text_consistency(readings: Iterable[tuple[object, str]]) -> float | None:
    """Mean similarity of consecutive readings that share a slide key, None if no pair.

    `readings` is (slide key, text) in time order; a change of key starts a new slide, and
    differences across slides are content changes, not instability.
    """
    total, n = 0.0, 0
    prev_key: object = object()
    prev_text = ""
    for key, text in readings:
        if key == prev_key:
            total += text_similarity(prev_text, text)
            n += 1
        prev_key, prev_text = key, text
    return total / n if n else None
