"""Live signals shared by the per-stream QoS policies of one job.

`QosSignals` is made once per pipeline. A sink listener (`on_record`) feeds it every emitted
event, from which it keeps a recent ASR commit latency per stream (the `asr` events'
`latency_ms`), so vision policies can see the audio path without touching it. `probe` is one
`SharedCpuProbe` for all streams: machine CPU utilization from `psutil.cpu_times()` deltas over
at least `cpu_period_s`, cached, never blocking (unlike `psutil.cpu_percent(interval=None)`,
whose module-global "since the last call" window several callers would cut into slivers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from streamfuse.errors import ConfigError
from streamfuse.qos.feedback import SystemProbe


class SharedCpuProbe(SystemProbe):
    """`SystemProbe` whose CPU figure is cached and safe to share between many callers.

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


class QosSignals:
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

    @property
    def probe(self) -> SystemProbe:
        """The shared machine-load probe (created on first use: psutil/NVML set-up)."""
        if self._probe is None:
            self._probe = SharedCpuProbe(self._cpu_period_s)
        return self._probe

    def on_record(self, record: dict[str, Any]) -> None:
        """Sink listener: takes what the policies need from an emitted event record."""
        if record.get("type") == "asr" and "latency_ms" in record:
            self.record_asr_latency(str(record.get("stream_id", "")), record["latency_ms"] / 1e3)

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
