"""Traces of frames through the graph, kept by an `Observer`: a span per frame per stage, and a
span per emitted event linked to the spans of the frames it came from.

A source frame starts a trace. A stage's call on a frame is a child of the span of the call
that made the frame (a call made the frames it emitted between `on_processing` and
`on_processed`), so one trace reads source -> change -> ocr -> event -> sink with every hop's
duration. Source data frames are head-sampled at `sample_ratio` (system frames always are).
Every call is also recorded without a span (names, times, cause: a few hundred bytes, kept
while its outputs may still be consumed), and when a call emits an event (an `EventFrame`, or
an `ErrorFrame` the runner made of a failure) the chain of calls behind it becomes spans after
the fact, with their real times: every event is traced whatever the ratio. The event's span is
a child of the emitting call's span, an instant at emission, and links to each span of its
chain; the calls that consume the event (sinks, the timeline) are its children. While a traced
call runs its span is the current span, so what the stage logs carries the trace id. The spans
of a stage that runs a model (`Stage.model_info`) name it, its precision and runtime versions.
"""

from __future__ import annotations

import random
import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, Status, StatusCode, Tracer

from streamfuse.clock import now_wall
from streamfuse.errors import ConfigError
from streamfuse.frames import ErrorFrame, EventFrame, Frame, SystemFrame
from streamfuse.pipeline.observer import FrameEmitted, FrameProcessed, FrameProcessing, Observer
from streamfuse.pipeline.source import Source
from streamfuse.telemetry import names

_ROOT = otel_context.Context()  # an empty context: a source frame's span has no parent


class _Call:
    """One source release or one stage call; becomes a span when traced."""

    __slots__ = (
        "busy_s",
        "end",
        "failed",
        "flushed",
        "frame_type",
        "model",
        "name",
        "parent",
        "queue_wait_s",
        "sampled",
        "span",
        "start",
        "stream_id",
        "t_media",
        "token",
    )

    def __init__(
        self, name: str, parent: _Call | None, frame: Frame, start: float, sampled: bool
    ) -> None:
        self.name = name
        self.parent = parent
        self.stream_id = frame.stream_id
        self.frame_type = type(frame).__name__
        self.t_media = frame.t_media
        self.start = start
        self.end: float | None = None
        self.sampled = sampled
        self.span: Span | None = None
        self.token: object | None = None
        self.busy_s: float | None = None
        self.failed = False
        self.flushed = False
        self.queue_wait_s: float | None = None
        #: The span attributes of the model the stage runs (`Stage.model_info`), if any.
        self.model: dict[str, str] | None = None


def _key(frame: Frame) -> tuple[type, float, float]:
    """What tells a frame from a later one at the same address (ids are reused)."""
    return type(frame), frame.arrival_wall, frame.t_media


class TracingObserver(Observer):
    """Spans of frames and events into `tracer` (see the module docstring).

    `max_frames` bounds how many emitted frames are remembered for their consumers (more than
    every queue of the graph holds at once, so a frame's cause is still known when it is read).
    """

    def __init__(
        self,
        tracer: Tracer,
        *,
        sample_ratio: float = 0.05,
        trace_events: bool = True,
        max_frames: int = 16_384,
        seed: int | None = None,
    ) -> None:
        if not 0.0 <= sample_ratio <= 1.0:
            raise ConfigError(f"sample_ratio must be in [0, 1], got {sample_ratio}")
        self.tracer = tracer
        self.sample_ratio = sample_ratio
        self.trace_events = trace_events
        self._max = max_frames
        self._random = random.Random(seed).random
        # Monotonic wall seconds -> epoch nanoseconds, the clock spans are stamped in.
        self._offset_ns = time.time_ns() - int(now_wall() * 1e9)
        self._made: dict[int, tuple[tuple[type, float, float], _Call, float]] = {}
        self._running: dict[int, _Call] = {}
        # Per stage (by id, for the run): its model's span attributes, read once it is set up.
        self._models: dict[int, dict[str, str] | None] = {}

    # -- observer hooks ---------------------------------------------------------------------
    def on_frame(self, event: FrameEmitted) -> None:
        frame, producer = event.frame, event.producer
        call: _Call | None
        if isinstance(producer, Source):
            sampled = isinstance(frame, SystemFrame) or self._random() < self.sample_ratio
            call = _Call(producer.name, None, frame, frame.arrival_wall, sampled)
            call.end = event.wall
            if sampled:
                self._span(call)
        else:
            call = self._running.get(id(producer))
            if call is None:
                return
        if self.trace_events and isinstance(frame, EventFrame | ErrorFrame):
            call = self._event(call, frame, event.wall)
        made = self._made
        made.pop(id(frame), None)  # a reused id goes to the back of the eviction order
        made[id(frame)] = (_key(frame), call, event.wall)
        if len(made) > self._max:
            del made[next(iter(made))]

    def on_processing(self, event: FrameProcessing) -> None:
        made = self._made.get(id(event.cause))
        parent = made[1] if made is not None and made[0] == _key(event.cause) else None
        call = _Call(
            event.stage.name,
            parent,
            event.cause,
            event.wall,
            parent is not None and parent.sampled,
        )
        call.flushed = event.flushed
        stage_id = id(event.stage)
        if stage_id not in self._models:
            info = event.stage.model_info()
            self._models[stage_id] = info.span_attributes() if info is not None else None
        call.model = self._models[stage_id]
        if made is not None and parent is not None:
            call.queue_wait_s = max(0.0, event.wall - made[2])
        self._running[id(event.stage)] = call
        if call.sampled:
            span = self._span(call)
            call.token = otel_context.attach(trace.set_span_in_context(span))

    def on_processed(self, event: FrameProcessed) -> None:
        call = self._running.pop(id(event.stage), None)
        if call is None:
            return
        call.end = now_wall()
        call.busy_s = event.busy_s
        call.failed = event.failed
        if call.token is not None:
            otel_context.detach(call.token)  # type: ignore[arg-type]
            call.token = None
        if call.span is not None:
            self._finish(call)

    def on_end(self, wall: float) -> None:
        self._made.clear()
        self._running.clear()
        self._models.clear()

    # -- spans --------------------------------------------------------------------------------
    def _ns(self, wall: float) -> int:
        return int(wall * 1e9) + self._offset_ns

    def _span(self, call: _Call) -> Span:
        """`call`'s span, made (after its parents') with the call's own start time."""
        if call.span is not None:
            return call.span
        parent = call.parent
        ctx = trace.set_span_in_context(self._span(parent)) if parent is not None else _ROOT
        attributes: dict[str, Any] = {
            names.ATTR_STAGE: call.name,
            names.ATTR_STREAM_ID: call.stream_id,
            names.ATTR_FRAME_TYPE: call.frame_type,
            names.ATTR_T_MEDIA: call.t_media,
        }
        if call.queue_wait_s is not None:
            attributes[names.ATTR_QUEUE_WAIT] = call.queue_wait_s
        if call.flushed:
            attributes[names.ATTR_FLUSHED] = True
        if call.model is not None:
            attributes.update(call.model)
        call.span = self.tracer.start_span(
            call.name, context=ctx, attributes=attributes, start_time=self._ns(call.start)
        )
        if call.end is not None:
            self._finish(call)
        return call.span

    def _finish(self, call: _Call) -> None:
        span = call.span
        assert span is not None and call.end is not None
        if call.busy_s is not None:
            span.set_attribute(names.ATTR_BUSY, call.busy_s)
            span.set_attribute(names.ATTR_FAILED, call.failed)
        if call.failed:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=self._ns(call.end))

    def _event(self, call: _Call, frame: EventFrame | ErrorFrame, wall: float) -> _Call:
        """The span of an emitted event, linked to every span of the chain behind it."""
        parent_span = self._span(call)
        chain: list[_Call] = []
        hop: _Call | None = call
        while hop is not None:
            chain.append(hop)
            hop = hop.parent
        links = [
            Link(hop.span.get_span_context(), {names.ATTR_STAGE: hop.name})
            for hop in reversed(chain)
            if hop.span is not None
        ]
        kind = frame.payload.type
        event_call = _Call(f"event {kind}", call, frame, wall, True)
        event_call.end = wall
        span = self.tracer.start_span(
            event_call.name,
            context=trace.set_span_in_context(parent_span),
            links=links,
            start_time=self._ns(wall),
            attributes={
                names.ATTR_EVENT_TYPE: str(kind),
                names.ATTR_STREAM_ID: frame.stream_id,
                names.ATTR_T_MEDIA: frame.t_media,
                names.ATTR_EVENT_LATENCY: max(0.0, wall - frame.arrival_wall),
            },
        )
        if isinstance(frame, ErrorFrame):
            span.set_status(Status(StatusCode.ERROR, frame.message))
        span.end(end_time=self._ns(wall))
        event_call.span = span
        return event_call


__all__ = ["TracingObserver"]
