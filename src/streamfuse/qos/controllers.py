"""Resolution controllers: from a `Feedback` snapshot to an OCR `Decision`.

A `Decision` is a ladder rung (OCR input size), the minimum interval between OCR reads and the
ROI ratio (the largest fraction of the frame area to read; 1.0 = whole frame). A controller's
`decide(feedback, current)` returns the *target* decision given the one currently applied;
jump suppression (`streamfuse.qos.smoothing`) turns targets into applied decisions, so a
controller always steps from what is really running. Two controllers ship:

- `ArticleRule` - the article's F15 rule: ASR latency > 300 ms and OCR confidence < 0.65 and
  accelerator utilization > 85% -> 1280x720 with ROI ratio 0.6, else 1920x1080.
- `FeedbackController` (default) - a latency-budget loop with hysteresis over one degradation
  scale: rungs first, then the ROI, then the OCR interval.

`make_controller(config, ladder)` builds the controller a config describes.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from streamfuse.errors import ConfigError
from streamfuse.qos.feedback import Feedback
from streamfuse.qos.ladder import DEFAULT_LADDER, Ladder, Rung


@dataclass(frozen=True, slots=True)
class Decision:
    """What the OCR stage should do for the next reads."""

    rung_index: int
    rung: Rung
    ocr_interval_s: float = 0.0
    roi_ratio: float = 1.0
    reason: str = ""

    def __post_init__(self) -> None:
        if not 0.0 < self.roi_ratio <= 1.0:
            raise ConfigError(f"roi_ratio must be in (0, 1], got {self.roi_ratio}")
        if self.ocr_interval_s < 0:
            raise ConfigError(f"ocr_interval_s must be >= 0, got {self.ocr_interval_s}")

    def same_setting(self, other: Decision) -> bool:
        """True when both decisions do the same work (reasons aside)."""
        return (
            self.rung_index == other.rung_index
            and math.isclose(self.ocr_interval_s, other.ocr_interval_s)
            and math.isclose(self.roi_ratio, other.roi_ratio)
        )


def make_decision(
    ladder: Ladder, index: int, interval_s: float = 0.0, roi: float = 1.0, reason: str = ""
) -> Decision:
    index = ladder.clamp(index)
    return Decision(index, ladder[index], interval_s, roi, reason)


class ResolutionController(ABC):
    """Chooses a target `Decision` from feedback and the decision now applied."""

    def __init__(self, ladder: Ladder = DEFAULT_LADDER) -> None:
        self.ladder = ladder

    @abstractmethod
    def initial(self) -> Decision:
        """The decision to start a stream with."""

    @abstractmethod
    def decide(self, feedback: Feedback, current: Decision) -> Decision:
        """The target decision for `feedback`, given that `current` is applied."""

    def reset(self) -> None:  # noqa: B027 - stateless controllers need nothing
        """Forget internal state (hysteresis counters) for a new stream."""


# ----------------------------------------------------------------------------------------------
# The article's rule (F15)


class ArticleRuleConfig(BaseModel):
    """The article's fixed rule. Every comparison is strict, as the article states it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    asr_latency_threshold_s: float = Field(
        0.300, gt=0.0, le=10.0, description="Degrade only when ASR latency is above this (s)."
    )
    ocr_confidence_threshold: float = Field(
        0.65, ge=0.0, le=1.0, description="...and OCR confidence is below this..."
    )
    util_threshold: float = Field(
        0.85,
        ge=0.0,
        le=1.0,
        description="...and accelerator utilization is above this (GPU when NVML measures "
        "one, else CPU: on a CPU-only machine the CPU is the accelerator).",
    )
    high_size_px: tuple[int, int] = Field(
        (1920, 1080), description="Size when the rule does not fire (nearest ladder rung)."
    )
    low_size_px: tuple[int, int] = Field(
        (1280, 720), description="Size when the rule fires (nearest ladder rung)."
    )
    low_roi_ratio: float = Field(
        0.6, gt=0.0, le=1.0, description="ROI ratio when the rule fires (1.0 otherwise)."
    )
    ocr_interval_s: float = Field(
        0.0, ge=0.0, le=60.0, description="OCR interval; the rule does not change it."
    )


class ArticleRule(ResolutionController):
    """ASR latency > 0.3 s and OCR confidence < 0.65 and util > 0.85 -> 1280x720, ROI 0.6.

    An unmeasured input (None) makes its condition false, so the rule never fires on missing
    data (e.g. a video-only stream has no ASR latency).
    """

    def __init__(
        self, config: ArticleRuleConfig | None = None, ladder: Ladder = DEFAULT_LADDER
    ) -> None:
        super().__init__(ladder)
        self.config = config or ArticleRuleConfig()
        self.high_index = ladder.nearest(*self.config.high_size_px)
        self.low_index = ladder.nearest(*self.config.low_size_px)

    def fires(self, fb: Feedback) -> bool:
        c = self.config
        util = fb.accel_util
        return (
            fb.asr_latency_s is not None
            and fb.asr_latency_s > c.asr_latency_threshold_s
            and fb.ocr_confidence is not None
            and fb.ocr_confidence < c.ocr_confidence_threshold
            and util is not None
            and util > c.util_threshold
        )

    def initial(self) -> Decision:
        return make_decision(self.ladder, self.high_index, self.config.ocr_interval_s, 1.0, "start")

    def decide(self, feedback: Feedback, current: Decision) -> Decision:
        c = self.config
        if self.fires(feedback):
            return make_decision(
                self.ladder, self.low_index, c.ocr_interval_s, c.low_roi_ratio, "article: degrade"
            )
        return make_decision(self.ladder, self.high_index, c.ocr_interval_s, 1.0, "article: full")


# ----------------------------------------------------------------------------------------------
# The default: a feedback loop on the latency budget


class FeedbackControllerConfig(BaseModel):
    """Latency-budget controller with hysteresis.

    Degradation runs over one scale of levels: first the ladder rungs from `top_rung` down to
    `floor_rung`, then the ROI ratios in `roi_ratios`, then OCR intervals growing by
    `interval_factor` up to `max_interval_s`. Overload moves one level down that scale,
    headroom one level up.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    budget_s: float = Field(
        1.0, gt=0.0, le=60.0, description="OCR event latency budget (arrival to result), s."
    )
    high_water: float = Field(
        0.9,
        gt=0.0,
        le=2.0,
        description="Overload when latency exceeds high_water x budget.",
    )
    low_water: float = Field(
        0.6,
        gt=0.0,
        le=2.0,
        description="Headroom when the latency *predicted at the next larger setting* "
        "(latency x pixel ratio of the two rungs, an upper bound since recognition cost does "
        "not grow with the detector input) stays below low_water x budget.",
    )
    max_queue_depth: int = Field(
        1, ge=0, le=1000, description="Overload when more key frames than this wait for OCR."
    )
    cpu_high: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Accelerator (GPU, else CPU) utilization above which the controller never "
        "steps up. 1.0 (default): never; the latency measured already contains contention, "
        "and a machine-wide figure near 100% (other programs, the job's own bursts) must not "
        "pin a stream low whose reads fit the budget.",
    )
    cpu_idle: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="Utilization below which load counts as cleared: step up even if OCR "
        "confidence is fine (nothing to save), when `quality_when_idle`.",
    )
    confidence_target: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Step up (given headroom) while OCR confidence is below this: low "
        "confidence suggests text too small for the current rung. 1.0 (default): use the "
        "budget, climb whenever the next setting is predicted to fit (slides read at 0.95+ "
        "even while small text is being lost).",
    )
    quality_when_idle: bool = Field(
        True, description="Return to full resolution when the machine is idle."
    )
    down_after: int = Field(
        1, ge=1, le=100, description="Consecutive overloaded snapshots before stepping down."
    )
    up_after: int = Field(
        2, ge=1, le=100, description="Consecutive snapshots with headroom before stepping up."
    )
    top_rung: int = Field(0, ge=0, le=31, description="Largest rung used (ladder index).")
    floor_rung: int | None = Field(
        None, ge=0, le=31, description="Smallest rung used (ladder index); None: the lowest."
    )
    start_rung: int | None = Field(
        None, ge=0, le=31, description="Rung to start at; None: `top_rung`."
    )
    roi_ratios: tuple[Annotated[float, Field(gt=0.0, lt=1.0)], ...] = Field(
        (),
        description="ROI ratios tried, in order, once at the floor rung (largest first). "
        "Empty (default): the region read comes from the picture (changed / content region), "
        "the controller never cuts into it.",
    )
    base_interval_s: float = Field(
        0.0, ge=0.0, le=60.0, description="OCR interval when not overloaded, s."
    )
    interval_factor: float = Field(
        2.0, gt=1.0, le=10.0, description="Interval growth per level past the ROI levels."
    )
    min_interval_step_s: float = Field(
        0.25,
        gt=0.0,
        le=10.0,
        description="First non-zero interval when `base_interval_s` is 0, s.",
    )
    max_interval_s: float = Field(4.0, ge=0.0, le=120.0, description="Largest OCR interval, s.")

    @model_validator(mode="after")
    def _consistent(self) -> FeedbackControllerConfig:
        if self.low_water >= self.high_water:
            raise ValueError(
                f"low_water ({self.low_water}) must be below high_water ({self.high_water}) "
                "for hysteresis"
            )
        if self.floor_rung is not None and self.floor_rung < self.top_rung:
            raise ValueError(f"floor_rung {self.floor_rung} is above top_rung {self.top_rung}")
        if list(self.roi_ratios) != sorted(self.roi_ratios, reverse=True):
            raise ValueError(f"roi_ratios must be decreasing, got {self.roi_ratios}")
        if self.max_interval_s < self.base_interval_s:
            raise ValueError("max_interval_s must be >= base_interval_s")
        return self


@dataclass(frozen=True, slots=True)
class _Level:
    rung: int
    roi: float
    interval_s: float


class FeedbackController(ResolutionController):
    """Steps down one level when latency exceeds the budget's high-water mark, the OCR input
    backs up or frames are dropped; steps up one level after `up_after` snapshots of headroom
    when confidence is low or the machine is idle. Between the two water marks it holds."""

    def __init__(
        self, config: FeedbackControllerConfig | None = None, ladder: Ladder = DEFAULT_LADDER
    ) -> None:
        super().__init__(ladder)
        self.config = c = config or FeedbackControllerConfig()
        floor = ladder.lowest if c.floor_rung is None else c.floor_rung
        if c.top_rung > ladder.lowest or floor > ladder.lowest:
            raise ConfigError(
                f"top_rung {c.top_rung} / floor_rung {floor} outside the ladder "
                f"(0..{ladder.lowest})"
            )
        levels = [_Level(i, 1.0, c.base_interval_s) for i in range(c.top_rung, floor + 1)]
        levels += [_Level(floor, r, c.base_interval_s) for r in c.roi_ratios]
        last_roi = c.roi_ratios[-1] if c.roi_ratios else 1.0
        interval = c.base_interval_s
        while True:
            interval = interval * c.interval_factor if interval > 0 else c.min_interval_step_s
            if interval > c.max_interval_s + 1e-9:
                break
            levels.append(_Level(floor, last_roi, interval))
        self.levels: tuple[_Level, ...] = tuple(levels)
        start = c.top_rung if c.start_rung is None else c.start_rung
        if not c.top_rung <= start <= floor:
            raise ConfigError(f"start_rung {start} outside [{c.top_rung}, {floor}]")
        self._start_level = start - c.top_rung
        self._over = 0
        self._room = 0

    def reset(self) -> None:
        self._over = 0
        self._room = 0

    def _decision(self, level: int, reason: str) -> Decision:
        lv = self.levels[level]
        return make_decision(self.ladder, lv.rung, lv.interval_s, lv.roi, reason)

    def level_of(self, d: Decision) -> int:
        """The level closest to an applied decision (exact for the controller's own ones)."""

        def dist(lv: _Level) -> tuple[int, float, float]:
            return (
                abs(lv.rung - d.rung_index),
                abs(lv.roi - d.roi_ratio),
                abs(lv.interval_s - d.ocr_interval_s),
            )

        return min(range(len(self.levels)), key=lambda i: dist(self.levels[i]))

    def initial(self) -> Decision:
        return self._decision(self._start_level, "start")

    def _cost_ratio_up(self, level: int) -> float:
        """Work at `level - 1` relative to `level` (pixels, ROI area, reads per second)."""
        a, b = self.levels[level], self.levels[level - 1]
        px = self.ladder[b.rung].pixels / self.ladder[a.rung].pixels
        roi = b.roi / a.roi
        # A longer interval does not make a single read faster; it only lowers the backlog.
        return px * roi

    def decide(self, feedback: Feedback, current: Decision) -> Decision:
        c = self.config
        level = self.level_of(current)
        lat = feedback.ocr_latency_s
        util = feedback.accel_util
        reasons = []
        if lat is not None and lat > c.high_water * c.budget_s:
            reasons.append(f"latency {lat:.3f}s > {c.high_water:g}x budget")
        if feedback.queue_depth > c.max_queue_depth:
            reasons.append(f"queue {feedback.queue_depth} > {c.max_queue_depth}")
        if feedback.dropped > 0:
            reasons.append(f"{feedback.dropped} dropped")
        if reasons:
            self._room = 0
            self._over += 1
            if self._over >= c.down_after and level < len(self.levels) - 1:
                self._over = 0
                return self._decision(level + 1, "down: " + ", ".join(reasons))
            return self._decision(level, "hold: overloaded at floor" if level else "hold")
        self._over = 0

        if level == 0:
            self._room = 0
            return self._decision(level, "hold: top")
        predicted = None if lat is None else lat * self._cost_ratio_up(level)
        busy = util is not None and util > c.cpu_high
        headroom = (predicted is None or predicted < c.low_water * c.budget_s) and not busy
        wants_more = (
            feedback.ocr_confidence is None
            or feedback.ocr_confidence < c.confidence_target
            or (c.quality_when_idle and util is not None and util < c.cpu_idle)
            or self.levels[level].interval_s > c.base_interval_s
            or self.levels[level].roi < 1.0
        )
        if headroom and wants_more:
            self._room += 1
            if self._room >= c.up_after:
                self._room = 0
                why = "up: headroom" + (f", predicted {predicted:.3f}s" if predicted else "")
                return self._decision(level - 1, why)
            return self._decision(level, "hold: waiting for sustained headroom")
        self._room = 0
        return self._decision(level, "hold: between water marks" if not busy else "hold: busy")


def make_controller(
    config: ArticleRuleConfig | FeedbackControllerConfig, ladder: Ladder = DEFAULT_LADDER
) -> ResolutionController:
    """The controller a config describes: `ArticleRule` or `FeedbackController`."""
    if isinstance(config, FeedbackControllerConfig):
        return FeedbackController(config, ladder)
    if isinstance(config, ArticleRuleConfig):
        return ArticleRule(config, ladder)
    raise ConfigError(f"unknown controller config {type(config).__name__}")
