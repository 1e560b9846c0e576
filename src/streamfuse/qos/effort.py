"""The speech-recognition effort controller: from measured headroom to a rung of effort.

Rungs are numbered from 0 (the cheapest recognition) up; each costs `cost[rung]` times rung 0's
recognizer work. `EffortController.decide(feedback, current)` returns the rung to use next from
one `AsrFeedback` snapshot: the ASR stage's busy share (recognizer seconds per second of audio),
its recent commit latency against a budget, and machine CPU load (the signals the OCR controller
steers by). Overload steps down at once, sustained headroom steps up one rung; between the
water marks it holds. Pure: numbers in, a rung out (the audio path applies it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from streamfuse.errors import ConfigError


class EffortControllerConfig(BaseModel):
    """Water marks and hysteresis of the ASR effort controller (`effort="auto"`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rungs: tuple[Annotated[int, Field(ge=0, le=2)], ...] = Field(
        (0, 2),
        min_length=1,
        description="The rungs the controller moves over, cheapest first (it steps to the "
        "next or previous of these). Rung 1 (beam 5 on tiny.en's full passes) is left out by "
        "default: it cost more and was less accurate than rung 0 on both splits (docs/asr.md).",
    )
    start_rung: int = Field(0, ge=0, le=2, description="Rung a stream starts at (in `rungs`).")
    cost: tuple[float, float, float] = Field(
        (1.0, 1.05, 1.8),
        description="Recognizer work of rungs 0, 1, 2 relative to rung 0 (measured on the "
        "speech set and the bundled clip, docs/asr.md): the busy share predicted at the next "
        "rung is the busy share now times the ratio of the two.",
    )
    busy_high: float = Field(
        0.7,
        gt=0.0,
        le=4.0,
        description="Overload: the recognizer busy share (seconds of recognition per second of "
        "audio, over `window_s`) above this steps down. Above 1 the stage falls behind.",
    )
    busy_low: float = Field(
        0.5,
        gt=0.0,
        le=4.0,
        description="Headroom: a step up only when the busy share predicted at the next rung "
        "stays below this.",
    )
    latency_budget_s: float = Field(
        1.5, gt=0.0, le=60.0, description="Commit latency budget (word end arrival to commit), s."
    )
    high_water: float = Field(
        1.0, gt=0.0, le=4.0, description="Overload: commit latency above high_water x budget."
    )
    low_water: float = Field(
        0.8, gt=0.0, le=4.0, description="Headroom needs commit latency below low_water x budget."
    )
    cpu_high: float = Field(
        0.9,
        ge=0.0,
        le=1.0,
        description="Machine CPU utilization above which the controller steps down (after "
        "`down_after` snapshots) and never up: other work needs the cores. 1.0: ignore it.",
    )
    period_s: float = Field(
        2.0, gt=0.0, le=60.0, description="Media seconds between two decisions."
    )
    window_s: float = Field(
        10.0, gt=0.0, le=120.0, description="Media seconds the busy share is measured over."
    )
    down_after: int = Field(
        1, ge=1, le=100, description="Consecutive overloaded snapshots before stepping down."
    )
    up_after: int = Field(
        3, ge=1, le=100, description="Consecutive snapshots with headroom before stepping up."
    )

    @model_validator(mode="after")
    def _consistent(self) -> EffortControllerConfig:
        if self.busy_low >= self.busy_high:
            raise ValueError(
                f"busy_low ({self.busy_low}) must be below busy_high ({self.busy_high}) "
                "for hysteresis"
            )
        if self.low_water >= self.high_water:
            raise ValueError(
                f"low_water ({self.low_water}) must be below high_water ({self.high_water})"
            )
        if list(self.rungs) != sorted(set(self.rungs)):
            raise ValueError(f"rungs must increase, got {self.rungs}")
        if self.start_rung not in self.rungs:
            raise ValueError(f"start_rung {self.start_rung} is not one of rungs {self.rungs}")
        if any(b < a for a, b in zip(self.cost, self.cost[1:], strict=False)):
            raise ValueError(f"cost must not decrease with the rung, got {self.cost}")
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class AsrFeedback:
    """One snapshot of the speech path's load. None: not measured (no call for a change)."""

    #: Recognizer seconds per second of audio over the recent window.
    busy_share: float | None = None
    #: Recent commit latency (word end arrival to commit), s; None offline or before a commit.
    commit_latency_s: float | None = None
    #: Machine-wide CPU utilization in [0, 1].
    cpu_util: float | None = None

    def __post_init__(self) -> None:
        for name in ("busy_share", "commit_latency_s"):
            value = getattr(self, name)
            if value is not None and not value >= 0.0:
                raise ConfigError(f"{name} must be >= 0 or None, got {value}")
        if self.cpu_util is not None and not 0.0 <= self.cpu_util <= 1.0:
            raise ConfigError(f"cpu_util must be in [0, 1] or None, got {self.cpu_util}")


@dataclass(frozen=True, slots=True)
class EffortDecision:
    rung: int
    reason: str


class EffortController:
    """Steps down one rung per `down_after` overloaded snapshots (busy share, commit latency or
    machine CPU above their high marks), up one rung after `up_after` snapshots in a row whose
    predicted busy share at the next rung, commit latency and CPU load are all below their low
    marks; holds otherwise."""

    def __init__(self, config: EffortControllerConfig | None = None) -> None:
        self.config = config or EffortControllerConfig()
        self._over = 0
        self._room = 0

    def initial(self) -> EffortDecision:
        return EffortDecision(self.config.start_rung, "start")

    def reset(self) -> None:
        self._over = 0
        self._room = 0

    def decide(self, fb: AsrFeedback, current: int) -> EffortDecision:
        c = self.config
        rungs = c.rungs
        # The applied rung's place among `rungs` (the nearest below it when it is not one).
        level = max((i for i, r in enumerate(rungs) if r <= current), default=0)
        current = rungs[level]
        reasons = []
        if fb.busy_share is not None and fb.busy_share > c.busy_high:
            reasons.append(f"busy {fb.busy_share:.2f} > {c.busy_high:g}")
        lat = fb.commit_latency_s
        if lat is not None and lat > c.high_water * c.latency_budget_s:
            reasons.append(f"latency {lat:.2f}s > {c.high_water:g}x budget")
        if fb.cpu_util is not None and fb.cpu_util > c.cpu_high:
            reasons.append(f"cpu {fb.cpu_util:.2f} > {c.cpu_high:g}")
        if reasons:
            self._room = 0
            self._over += 1
            if self._over >= c.down_after and level > 0:
                self._over = 0
                return EffortDecision(rungs[level - 1], "down: " + ", ".join(reasons))
            return EffortDecision(current, "hold: overloaded" if level else "hold: bottom")
        self._over = 0
        if level == len(rungs) - 1:
            self._room = 0
            return EffortDecision(current, "hold: top")
        if fb.busy_share is None:
            self._room = 0
            return EffortDecision(current, "hold: not measured")
        up = rungs[level + 1]
        predicted = fb.busy_share * c.cost[up] / c.cost[current]
        fits = predicted < c.busy_low and (lat is None or lat < c.low_water * c.latency_budget_s)
        if not fits:
            self._room = 0
            return EffortDecision(current, f"hold: predicted busy {predicted:.2f}")
        self._room += 1
        if self._room < c.up_after:
            return EffortDecision(current, "hold: waiting for sustained headroom")
        self._room = 0
        return EffortDecision(up, f"up: predicted busy {predicted:.2f}")


__all__ = ["AsrFeedback", "EffortController", "EffortControllerConfig", "EffortDecision"]
