"""OpenTelemetry instruments used by the runtime.

`instruments()` returns the instruments of the meter provider `streamfuse.telemetry.setup`
installed, else of the OpenTelemetry API's global provider (a no-op until an application
installs an SDK): call it at each use rather than keeping the result, so a later `setup` is
seen. Gauges read live objects registered with `watch_*` (held weakly) at each collection.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import psutil
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

from streamfuse.telemetry import names


def package_version() -> str:
    try:
        return version("streamfuse")
    except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
        return "0+unknown"


@functools.cache
def _version_of(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


@dataclass(frozen=True)
class ModelInfo:
    """The model a stage runs: what `Stage.model_info` returns, reported as the attributes of
    the stage's spans and as the labels of the `streamfuse.model.info` series."""

    name: str
    precision: str
    #: Distribution names of the packages running the model (their versions are looked up).
    packages: tuple[str, ...] = ()

    @property
    def runtime(self) -> str:
        """`rapidocr 3.10.0, onnxruntime 1.32.0` (a package not installed: `name ?`)."""
        return ", ".join(f"{p} {_version_of(p)}" for p in self.packages)

    def span_attributes(self) -> dict[str, str]:
        return {
            names.ATTR_MODEL_NAME: self.name,
            names.ATTR_MODEL_PRECISION: self.precision,
            names.ATTR_MODEL_RUNTIME: self.runtime,
        }

    def metric_attributes(self, stage: str) -> dict[str, str]:
        return {
            "stage": stage,
            "model": self.name,
            "precision": self.precision,
            "runtime": self.runtime,
        }


class Instruments:
    def __init__(self, provider: MeterProvider | None = None) -> None:
        provider = provider or metrics.get_meter_provider()
        meter = provider.get_meter(names.METER_NAME, package_version())
        self.stage_latency = meter.create_histogram(
            names.STAGE_LATENCY, unit="s", description="Time a stage spent on one frame"
        )
        self.stage_frames = meter.create_counter(
            names.STAGE_FRAMES, unit="{frame}", description="Frames processed by a stage"
        )
        self.stage_errors = meter.create_counter(
            names.STAGE_ERRORS, unit="{error}", description="Frames a stage failed on"
        )
        self.queue_depth = meter.create_observable_gauge(
            names.QUEUE_DEPTH,
            callbacks=[_observe_queues],
            unit="{frame}",
            description="Data frames waiting at a stage input",
        )
        self.queue_dropped = meter.create_counter(
            names.QUEUE_DROPPED, unit="{frame}", description="Frames dropped by overload policy"
        )
        self.event_latency = meter.create_histogram(
            names.EVENT_LATENCY, unit="s", description="Input arrival to event emission"
        )
        self.ocr_resolution = meter.create_histogram(
            names.OCR_RESOLUTION, unit="px", description="OCR detector input height"
        )
        self.ocr_det_side = meter.create_histogram(
            names.OCR_DET_SIDE,
            unit="px",
            description="Detector long side of an OCR read (the resolution ladder rung)",
        )
        self.asr_commit_latency = meter.create_histogram(
            names.ASR_COMMIT_LATENCY, unit="s", description="Arrival of a word's end to its commit"
        )
        self.asr_effort = meter.create_histogram(
            names.ASR_EFFORT,
            unit="{rung}",
            description="Effort rung of a full-window ASR pass (0 cheapest; docs/asr.md)",
        )
        self.asr_revisions = meter.create_counter(
            names.ASR_REVISIONS,
            unit="{revision}",
            description="Committed speech corrected by the full pass at an utterance end",
        )
        self.lm_tokens = meter.create_observable_counter(
            names.LM_TOKENS,
            callbacks=[_observe_lm_tokens],
            unit="{token}",
            description="Tokens through the language model (kind=prefill|decode)",
        )
        self.lm_decode_rate = meter.create_observable_gauge(
            names.LM_DECODE_RATE,
            callbacks=[_observe_lm_rate],
            unit="{token}/s",
            description="Decode tokens per second of forward time since the last collection",
        )
        self.lm_kv_slots = meter.create_observable_gauge(
            names.LM_KV_SLOTS,
            callbacks=[_observe_kv_slots],
            unit="1",
            description="Share of the KV-cache pool's slots in use",
        )
        self.lm_kv_tokens = meter.create_observable_gauge(
            names.LM_KV_TOKENS,
            callbacks=[_observe_kv_tokens],
            unit="1",
            description="Share of the KV-cache pool's token capacity holding tokens",
        )
        self.cpu_time = meter.create_observable_counter(
            names.PROCESS_CPU_TIME,
            callbacks=[_observe_cpu_time],
            unit="s",
            description="CPU time of the process (mode=user|system)",
        )
        self.cpu_utilization = meter.create_observable_gauge(
            names.PROCESS_CPU_UTILIZATION,
            callbacks=[_observe_cpu_utilization],
            unit="1",
            description="CPU time since the last collection over wall time and cores (0..1)",
        )
        self.model_info = meter.create_observable_gauge(
            names.MODEL_INFO,
            callbacks=[_observe_models],
            unit="1",
            description="1 per stage running a model (stage, model, precision, runtime)",
        )
        self.serve_sessions = meter.create_up_down_counter(
            names.SERVE_SESSIONS, unit="{session}", description="Sessions running (serve)"
        )
        self.serve_refused = meter.create_counter(
            names.SERVE_REFUSED, unit="{request}", description="Sessions refused (serve)"
        )


_current: Instruments | None = None


def instruments() -> Instruments:
    """The instruments of the active meter provider (see the module docstring)."""
    global _current
    if _current is None:
        _current = Instruments()
    return _current


def use_meter_provider(provider: MeterProvider | None) -> None:
    """Record into `provider` from now on (None: back to the API's global provider)."""
    global _current
    _current = Instruments(provider) if provider is not None else None


_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_engines: weakref.WeakSet[Any] = weakref.WeakSet()


def watch_queues(pipeline: Any) -> None:
    """Report `pipeline`'s queue depths (and its stages' models) through the observable
    gauges while it runs (`unwatch_queues` when it ends)."""
    _watched.add(pipeline)


def unwatch_queues(pipeline: Any) -> None:
    # A finished pipeline kept alive (a service keeps finished sessions for inspection) must
    # not go on reporting queues and models as if it ran.
    _watched.discard(pipeline)


def watch_lm_engine(engine: Any) -> None:
    """Report `engine`'s token counts, decode rate and KV-pool occupancy while it is alive.

    Duck-typed (`engine.stats`: token counters and forward seconds; `engine.pool`: slots and
    tokens in use), so this package does not import the language-model package.
    """
    _engines.add(engine)


def _observe_queues(options: CallbackOptions) -> Iterable[Observation]:
    for pipeline in list(_watched):
        for stage in pipeline.stages:
            depth = pipeline.queue_of(stage).data_depth
            yield Observation(depth, {"stage": stage.name, "pipeline": pipeline.name})


def _observe_models(options: CallbackOptions) -> Iterable[Observation]:
    for pipeline in list(_watched):
        for stage in pipeline.stages:
            info = stage.model_info()
            if info is not None:
                yield Observation(1, info.metric_attributes(stage.name))


# Every live engine counts into one series each (observations with the same attributes are
# not added up by the SDK: the last engine seen would win).
def _observe_lm_tokens(options: CallbackOptions) -> Iterable[Observation]:
    engines = list(_engines)
    if engines:
        yield Observation(sum(e.stats.prefill_tokens for e in engines), {"kind": "prefill"})
        yield Observation(sum(e.stats.decode_tokens for e in engines), {"kind": "decode"})


class _Deltas:
    """Differences of cumulative readings since the previous collection, per key: what the
    rate gauges report (decode tokens per forward second, CPU seconds per wall second)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # a collection may run on an exporter thread
        self._last: dict[Any, tuple[float, ...]] = {}

    def since_last(self, key: Any, *readings: float) -> tuple[float, ...] | None:
        """`readings` minus the previous ones for `key` (None the first time)."""
        with self._lock:
            before = self._last.get(key)
            self._last[key] = readings
        if before is None:
            return None
        return tuple(now - then for now, then in zip(readings, before, strict=True))


_deltas = _Deltas()


def _observe_lm_rate(options: CallbackOptions) -> Iterable[Observation]:
    tokens = seconds = 0.0
    for engine in list(_engines):
        stats = engine.stats
        d = _deltas.since_last(("lm", id(engine)), stats.decode_tokens, stats.forward_s)
        if d is not None:
            tokens, seconds = tokens + d[0], seconds + d[1]
    if seconds > 0:
        yield Observation(tokens / seconds)


def _observe_kv_slots(options: CallbackOptions) -> Iterable[Observation]:
    pools = [e.pool for e in list(_engines)]
    if pools:
        held = sum(p.num_slots - p.num_free for p in pools)
        yield Observation(held / sum(p.num_slots for p in pools))


def _observe_kv_tokens(options: CallbackOptions) -> Iterable[Observation]:
    pools = [e.pool for e in list(_engines)]
    if pools:
        used = sum(p.used_tokens for p in pools)
        yield Observation(used / sum(p.num_slots * p.max_tokens for p in pools))


_process = psutil.Process()
_deltas.since_last("cpu", time.monotonic(), float(sum(_process.cpu_times()[:2])))  # from import


def _observe_cpu_time(options: CallbackOptions) -> Iterable[Observation]:
    t = _process.cpu_times()
    yield Observation(float(t.user), {"mode": "user"})
    yield Observation(float(t.system), {"mode": "system"})


def _observe_cpu_utilization(options: CallbackOptions) -> Iterable[Observation]:
    t = _process.cpu_times()
    d = _deltas.since_last("cpu", time.monotonic(), float(t.user + t.system))
    if d is not None and d[0] > 0:
        cores = len(_process.cpu_affinity() or []) or psutil.cpu_count() or 1
        yield Observation(max(0.0, d[1] / (d[0] * cores)))
