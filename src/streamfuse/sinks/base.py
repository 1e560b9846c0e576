"""Event sinks: the emission point of the timeline.

An `EventSink` consumes `EventFrame`s, `ErrorFrame`s and `GapFrame`s and renders each as a
record whose `latency_ms` is measured at this moment (input arrival to emission) and `wall_s` is the
emission time in seconds since the pipeline started streaming. Subclasses implement
`write(record)`; the base collects per-type latencies for reporting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from streamfuse.events import EventRecord, parse_record
from streamfuse.frames import ErrorFrame, EventFrame, Frame, GapFrame, now_wall
from streamfuse.pipeline.stage import Stage
from streamfuse.telemetry.metrics import instruments


class EventSink(Stage):
    input_types = (EventFrame, ErrorFrame, GapFrame)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        self.write(self.render(frame))
        return
        yield  # pragma: no cover

    def render(self, frame: Frame) -> dict[str, Any]:
        """The record of `frame`, its latency measured now (and recorded as a metric)."""
        assert isinstance(frame, EventFrame | ErrorFrame | GapFrame)
        now = now_wall()
        record = frame.to_record(now)
        if self.started_wall is not None:
            record["wall_s"] = round(now - self.started_wall, 3)
        # Per sink: with several sinks attached one event is one sample in each sink's series.
        attrs = {"type": record["type"], "sink": self.name}
        instruments().event_latency.record(record["latency_ms"] / 1000.0, attrs)
        return record

    def write(self, record: dict[str, Any]) -> None:
        """Render one record (also called with records made outside the graph: build
        warnings, the final `stats` record). Default: nothing."""


class CollectSink(EventSink):
    """Keeps every record in memory (tests, library use)."""

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.records: list[dict[str, Any]] = []

    def write(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["type"] == type_]

    def parsed(self, type_: str | None = None) -> list[EventRecord]:
        """The records (of `type_`, or all) parsed into typed events."""
        return [parse_record(r) for r in self.records if type_ is None or r["type"] == type_]
