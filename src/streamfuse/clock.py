"""The media clock: one timeline for every modality, and drift correction between clocks.

Each capture device counts time with its own oscillator: an audio card's sample clock, a camera's
frame clock. Over minutes they drift apart (tens to hundreds of ppm). `DriftEstimator` fits the
mapping ``reference = offset + (1 + skew) * local`` online from timestamp pairs (the software
analogue of RTP/RTCP sender reports or IEEE 1588 PTP sync messages), with exponential forgetting
so it follows slow changes, and `to_reference` maps any local time onto the reference clock.

`now_wall` is the one wall clock (monotonic seconds) that arrival times, pacing and latencies
read; `use_wall_clock` swaps it, so tests can run on virtual time (`streamfuse.testing.clock`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from streamfuse.errors import ConfigError

WallClock = Callable[[], float]

_wall_clock: WallClock = time.monotonic


def now_wall() -> float:
    """Monotonic seconds: `time.monotonic()` unless `use_wall_clock` installed another clock."""
    return _wall_clock()


@contextmanager
def use_wall_clock(clock: WallClock) -> Iterator[None]:
    """Make `now_wall` read `clock` inside the `with` block (process-wide; for tests)."""
    global _wall_clock
    previous, _wall_clock = _wall_clock, clock
    try:
        yield
    finally:
        _wall_clock = previous


@dataclass(frozen=True, slots=True)
class ClockFit:
    offset_s: float
    skew_ppm: float
    n: int


class DriftEstimator:
    """Online weighted least squares of reference time against local time.

    `half_life_s` sets how fast old pairs are forgotten (in local seconds); `min_span_s` is how
    much local time the pairs must span before a skew is estimated (before that only the offset
    is corrected, which is exact for short streams).
    """

    def __init__(self, half_life_s: float = 600.0, min_span_s: float = 5.0) -> None:
        if half_life_s <= 0 or min_span_s < 0:
            raise ConfigError(
                f"half_life_s must be > 0 and min_span_s >= 0, got {half_life_s}, {min_span_s}"
            )
        self.half_life_s = half_life_s
        self.min_span_s = min_span_s
        self._origin: tuple[float, float] | None = None
        self._last_local = 0.0
        self._first_local = 0.0
        self._n = 0
        # Decayed sums over centred coordinates x = local - origin_local, y = ref - origin_ref.
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0

    def update(self, local_s: float, reference_s: float) -> None:
        """Add one simultaneous reading of both clocks."""
        if self._origin is None:
            self._origin = (local_s, reference_s)
            self._first_local = self._last_local = local_s
        x = local_s - self._origin[0]
        y = reference_s - self._origin[1]
        dt = max(0.0, local_s - self._last_local)
        if dt > 0:
            decay = math.exp(-math.log(2.0) * dt / self.half_life_s)
            self._sw *= decay
            self._sx *= decay
            self._sy *= decay
            self._sxx *= decay
            self._sxy *= decay
        self._last_local = max(self._last_local, local_s)
        self._sw += 1.0
        self._sx += x
        self._sy += y
        self._sxx += x * x
        self._sxy += x * y
        self._n += 1

    def _fit(self) -> tuple[float, float]:
        """(intercept, slope) in centred coordinates."""
        if self._n == 0 or self._sw == 0:
            return 0.0, 1.0
        mx, my = self._sx / self._sw, self._sy / self._sw
        var = self._sxx / self._sw - mx * mx
        span = self._last_local - self._first_local
        if span < self.min_span_s or var <= 1e-12:
            return my - mx, 1.0
        slope = (self._sxy / self._sw - mx * my) / var
        return my - slope * mx, slope

    @property
    def fit(self) -> ClockFit:
        a, b = self._fit()
        ox, oy = self._origin or (0.0, 0.0)
        # reference = oy + a + b * (local - ox) = (oy + a - b * ox) + b * local
        return ClockFit(offset_s=oy + a - b * ox, skew_ppm=(b - 1.0) * 1e6, n=self._n)

    def to_reference(self, local_s: float) -> float:
        """Map a local-clock time onto the reference clock."""
        if self._origin is None:
            return local_s
        a, b = self._fit()
        return self._origin[1] + a + b * (local_s - self._origin[0])
