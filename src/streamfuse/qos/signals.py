"""Live signals shared by the per-stream QoS policies of one job.

`QosSignals` is made once per pipeline and observes it (`Pipeline.observe`): from every `asr`
event created it keeps a recent ASR commit latency per stream (creation minus the arrival of the
audio the event depends on), and it counts the frames overload policies drop at the inputs of
the stages it `watch_drops` on, per stream, so vision policies see the audio path and their own
lost key frames without touching either. `probe` is one
`SharedCpuProbe` for all streams: machine CPU utilization from `psutil.cpu_times()` deltas over
at least `cpu_period_s`, cached, never blocking (unlike `psutil.cpu_percent(interval=None)`,
whose module-global "since the last call" window several callers would cut into slivers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from streamfuse.errors import ConfigError
from streamfuse.events import EventType
from streamfuse.frames import EventFrame
from streamfuse.pipeline.observer import FrameEmitted, FramesDropped, Observer
from streamfuse.pipeline.stage import Stage
from streamfuse.qos.feedback import PsutilProbe, SystemProbe


class SharedCpuProbe(PsutilProbe):
    """A `SystemProbe` whose CPU figure is cached and safe to share between many callers.

    `cpu()` returns the machine-wide busy fraction over the window since the previous refresh;
    a refresh happens only once `period_s` has passed, so it is cheap to call per key frame.
    """

    def __init__(
        self,
        period_s: float = 0.5,
        *,
        gpu_index: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if period_s < 0:
            raise ConfigError(f"period_s must be >= 0, got {period_s}")
        super().__init__(gpu_index)
        self.period_s = period_s
        self.clock = clock
        self._last_t = clock()
        self._last_times = self._psutil.cpu_times()
        self._util = 0.0

    @staticmethod
    def _busy_idle(times: Any) -> tuple[float, float]:
        idle = float(times.idle) + float(getattr(times, "iowait", 0.0))
        total = float(sum(times))
        # guest time is already counted in user on Linux
        total -= float(getattr(times, "guest", 0.0)) + float(getattr(times, "guest_nice", 0.0))
        return total - idle, idle

    def cpu(self) -> float:
        now = self.clock()
        if now - self._last_t >= self.period_s:
            times = self._psutil.cpu_times()
            b0, i0 = self._busy_idle(self._last_times)
            b1, i1 = self._busy_idle(times)
            d_busy, d_idle = max(0.0, b1 - b0), max(0.0, i1 - i0)
            if d_busy + d_idle > 0:
                self._util = min(1.0, d_busy / (d_busy + d_idle))
            self._last_t, self._last_times = now, times
        return self._util


class QosSignals(Observer):
    """Cross-stage signals of one job (see the module docstring).

    `alpha` weighs the newest ASR latency in each stream's exponentially weighted mean.
    """

    def __init__(
        self,
        *,
        alpha: float = 0.3,
        probe: SystemProbe | None = None,
        cpu_period_s: float = 0.5,
    ) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ConfigError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self._probe = probe
        self._cpu_period_s = cpu_period_s
        self._asr_latency_s: dict[str, float] = {}
        self._drops: dict[str, int] = {}
        self._drop_stages: set[int] = set()

    @property
    def probe(self) -> SystemProbe:
        """The shared machine-load probe (created on first use: psutil/NVML set-up)."""
        if self._probe is None:
            self._probe = SharedCpuProbe(self._cpu_period_s)
        return self._probe

    def watch_drops(self, stage: Stage) -> None:
        """Count the frames dropped at `stage`'s input (e.g. key frames an OCR stage missed)."""
        self._drop_stages.add(id(stage))

    # -- Observer -----------------------------------------------------------------------------
    def on_frame(self, event: FrameEmitted) -> None:
        frame = event.frame
        if isinstance(frame, EventFrame) and frame.type == EventType.ASR:
            self.record_asr_latency(frame.stream_id, event.wall - frame.arrival_wall)

    def on_drop(self, event: FramesDropped) -> None:
        if id(event.consumer) in self._drop_stages:
            for frame in event.frames:
                self._drops[frame.stream_id] = self._drops.get(frame.stream_id, 0) + 1

    # -- for the policies -----------------------------------------------------------------------
    def take_drops(self, stream_id: str) -> int:
        """Frames of `stream_id` dropped at watched inputs since the previous call."""
        return self._drops.pop(stream_id, 0)

    def record_asr_latency(self, stream_id: str, latency_s: float) -> None:
        prev = self._asr_latency_s.get(stream_id)
        latency_s = max(0.0, float(latency_s))
        self._asr_latency_s[stream_id] = (
            latency_s if prev is None else prev + self.alpha * (latency_s - prev)
        )

    def asr_latency_s(self, stream_id: str) -> float | None:
        """Recent ASR commit latency of `stream_id`, None before its first `asr` event."""
        return self._asr_latency_s.get(stream_id)


__all__ = ["QosSignals", "SharedCpuProbe"]
