"""Event sinks: the emission point of the timeline.

An `EventSink` consumes `EventFrame`s, `ErrorFrame`s and `GapFrame`s and renders each as a
record whose `latency_ms` is measured at this moment (input arrival to emission) and `wall_s` is the
emission time in seconds since the pipeline started streaming, and gives it its stable `id`
(`EventIds`). Subclasses implement `write(record)`; records made outside the graph go in through
`emit(record)`, which sets the id too; the base collects per-type latencies for reporting.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from streamfuse.events import EventIds, EventRecord, parse_record
from streamfuse.frames import ErrorFrame, EventFrame, Frame, GapFrame, now_wall
from streamfuse.pipeline.stage import Stage
from streamfuse.telemetry.metrics import instruments


class EventSink(Stage):
    input_types = (EventFrame, ErrorFrame, GapFrame)

    _ids: EventIds | None = None

    @property
    def ids(self) -> EventIds:
        """This sink's id sequence (every sink of a job sees the same records, so the same ids)."""
        if self._ids is None:
            self._ids = EventIds()
        return self._ids

    @ids.setter
    def ids(self, ids: EventIds) -> None:
        self._ids = ids

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        self.emit(self.render(frame))
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

    def emit(self, record: dict[str, Any]) -> None:
        """Give `record` its id and render it (for records made outside the graph too: build
        warnings, the final `stats` record)."""
        self.ids.assign(record)
        self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        """Render one record. Default: nothing."""


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
