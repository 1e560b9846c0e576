"""Feedback snapshots the resolution controllers decide from, and where they come from.

`Feedback` is one immutable snapshot per decision: OCR latency against its budget, the OCR input
backlog and drops, machine load (CPU via psutil, GPU via NVML when `pynvml` is importable and a
GPU is present, else None), OCR confidence and ASR latency. A `SystemProbe` samples the load
without blocking (`PsutilProbe` is the default one); `FeedbackTracker` turns per-read OCR
observations into snapshots.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from streamfuse.errors import ConfigError

log = logging.getLogger(__name__)


def _check_unit(name: str, value: float | None) -> None:
    if value is not None and not (0.0 <= value <= 1.0):
        raise ConfigError(f"{name} must be in [0, 1] or None, got {value}")


def _check_nonneg(name: str, value: float | None) -> None:
    if value is not None and not (value >= 0.0 and math.isfinite(value)):
        raise ConfigError(f"{name} must be a finite value >= 0 or None, got {value}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Feedback:
    """One snapshot of what the vision path and the machine look like right now.

    Utilizations are fractions in [0, 1]; None means "not measured" (no GPU, no ASR running, no
    text found), and controllers treat an unmeasured input as not calling for a change.
    """

    #: Snapshot time, monotonic seconds (dwell times are measured on it).
    t_s: float
    #: Recent OCR event latency of this stream (key frame arrival to result), s.
    ocr_latency_s: float | None = None
    #: Key frames waiting at the OCR input.
    queue_depth: int = 0
    #: Frames dropped by an overload policy since the previous snapshot.
    dropped: int = 0
    cpu_util: float | None = None
    gpu_util: float | None = None
    gpu_mem_util: float | None = None
    #: Mean recognizer confidence of the last read, None when no text was read.
    ocr_confidence: float | None = None
    #: Recent ASR commit latency, s; None when no ASR runs.
    asr_latency_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_util", "gpu_util", "gpu_mem_util", "ocr_confidence"):
            _check_unit(name, getattr(self, name))
        for name in ("ocr_latency_s", "asr_latency_s"):
            _check_nonneg(name, getattr(self, name))
        if self.queue_depth < 0 or self.dropped < 0:
            raise ConfigError(
                f"queue_depth and dropped must be >= 0, got {self.queue_depth}, {self.dropped}"
            )

    @property
    def accel_util(self) -> float | None:
        """Utilization of the device doing the vision work: the GPU when measured, else CPU."""
        return self.gpu_util if self.gpu_util is not None else self.cpu_util

    def at(self, t_s: float, **changes: Any) -> Feedback:
        """A copy at time `t_s` with some fields changed (handy for scripted sequences)."""
        return replace(self, t_s=t_s, **changes)


@dataclass(frozen=True, slots=True)
class GpuStats:
    util: float
    mem_util: float


@runtime_checkable
class SystemProbe(Protocol):
    """Machine load, sampled without blocking (called per key frame on the event loop)."""

    def cpu(self) -> float:
        """Machine-wide CPU utilization in [0, 1]."""
        ...

    def gpu(self) -> GpuStats | None:
        """GPU utilization and memory use; None when no GPU is measured."""
        ...


class PsutilProbe:
    """The default `SystemProbe`: CPU via psutil, GPU 0 via NVML when available.

    `pynvml` is optional: when it cannot be imported or no GPU answers, `gpu()` returns None and
    controllers fall back to CPU utilization.
    """

    def __init__(self, gpu_index: int = 0) -> None:
        import psutil

        self._psutil = psutil
        psutil.cpu_percent(interval=None)  # prime: the first call always returns 0.0
        self._nvml: Any | None = None
        self._handle: Any | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
            self._nvml = pynvml
        except Exception as e:  # ImportError, or NVML present without a usable GPU
            log.debug("NVML unavailable (%s): GPU load not measured", e)

    def cpu(self) -> float:
        """Machine-wide CPU utilization since the previous call, in [0, 1]."""
        return float(self._psutil.cpu_percent(interval=None)) / 100.0

    def gpu(self) -> GpuStats | None:
        if self._nvml is None:
            return None
        try:
            rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as e:  # a GPU can vanish (reset, driver error): stop asking
            log.warning("NVML query failed (%s); GPU load no longer measured", e)
            self._nvml = None
            return None
        return GpuStats(util=rates.gpu / 100.0, mem_util=mem.used / max(1, mem.total))


class FeedbackTracker:
    """Accumulates per-read OCR observations into `Feedback` snapshots.

    Latency is an exponentially weighted mean (weight `alpha` on the newest read) of queueing
    plus OCR time, so one slow read does not flip a decision but a sustained change does.
    """

    def __init__(self, alpha: float = 0.5, probe: SystemProbe | None = None) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ConfigError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.probe = probe
        self._latency_s: float | None = None
        self._confidence: float | None = None
        self._queue_depth = 0
        self._dropped = 0
        self._asr_latency_s: float | None = None

    def record_ocr(self, latency_s: float, confidence: float | None, queue_depth: int = 0) -> None:
        prev = self._latency_s
        self._latency_s = latency_s if prev is None else prev + self.alpha * (latency_s - prev)
        if confidence is not None:
            self._confidence = confidence
        self._queue_depth = queue_depth

    def record_drops(self, n: int) -> None:
        self._dropped += n

    def record_asr_latency(self, latency_s: float) -> None:
        self._asr_latency_s = latency_s

    def snapshot(self, t_s: float) -> Feedback:
        """The current snapshot; resets the drop count."""
        gpu = self.probe.gpu() if self.probe is not None else None
        fb = Feedback(
            t_s=t_s,
            ocr_latency_s=self._latency_s,
            queue_depth=self._queue_depth,
            dropped=self._dropped,
            cpu_util=min(1.0, self.probe.cpu()) if self.probe is not None else None,
            gpu_util=gpu.util if gpu else None,
            gpu_mem_util=gpu.mem_util if gpu else None,
            ocr_confidence=self._confidence,
            asr_latency_s=self._asr_latency_s,
        )
        self._dropped = 0
        return fb
