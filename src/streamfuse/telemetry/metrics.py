"""OpenTelemetry instruments used by the runtime.

Uses only the OpenTelemetry *API*: with no SDK configured every call is a cheap no-op; an
application (or `streamfuse.telemetry.setup`, later) installs a MeterProvider to export.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from functools import cache
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from streamfuse.telemetry import names


class Instruments:
    def __init__(self) -> None:
        meter = metrics.get_meter(names.METER_NAME)
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
        self.asr_commit_latency = meter.create_histogram(
            names.ASR_COMMIT_LATENCY, unit="s", description="Arrival of a word's end to its commit"
        )


@cache
def instruments() -> Instruments:
    return Instruments()


_watched: weakref.WeakSet[Any] = weakref.WeakSet()


def watch_queues(pipeline: Any) -> None:
    """Report `pipeline`'s queue depths through the observable gauge while it is alive."""
    instruments()
    _watched.add(pipeline)


def _observe_queues(options: CallbackOptions) -> Iterable[Observation]:
    for pipeline in list(_watched):
        for stage in pipeline.stages:
            depth = pipeline.queue_of(stage).data_depth
            yield Observation(depth, {"stage": stage.name, "pipeline": pipeline.name})
