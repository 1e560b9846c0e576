"""TracingObserver on a real pipeline (synthetic source, toy stages, a collecting sink) into the
real SDK with an in-memory exporter: causality, sampling, events always traced, links, times,
failures, and the span being current while the stage works on a traced frame."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from streamfuse.errors import ConfigError
from streamfuse.events import Payload
from streamfuse.frames import EventFrame, Frame, VideoFrame
from streamfuse.pipeline import Pipeline, Stage
from streamfuse.pipeline.tracing import TracingObserver
from streamfuse.sinks import CollectSink
from streamfuse.sources.synthetic import SyntheticSource
from streamfuse.telemetry import names

pytestmark = pytest.mark.unit


class TracedTick(Payload):
    type = "traced_tick"
    index: int


class EveryNth(Stage):
    """Passes on every `n`th video frame (a stand-in for change detection)."""

    input_types = (VideoFrame,)

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        super().__init__("every")
        self.n = n
        self.fail_at = fail_at

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, VideoFrame)
        if frame.index == self.fail_at:
            raise ValueError("bad frame")
        if frame.index % self.n == 0:
            yield frame


class Announce(Stage):
    """One event per frame, worked out on the stage's thread (a stand-in for OCR)."""

    input_types = (VideoFrame,)

    def __init__(self) -> None:
        super().__init__("announce")
        #: (span id current in `process`, span id current in the worker thread) per frame.
        self.seen: list[tuple[int, int]] = []

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, VideoFrame)
        here = trace.get_current_span().get_span_context().span_id

        def work() -> int:
            assert threading.current_thread() is not threading.main_thread()
            return trace.get_current_span().get_span_context().span_id

        there = await self.run_blocking(work)
        self.seen.append((here, there))
        yield EventFrame(
            stream_id=frame.stream_id,
            t_media=frame.t_media,
            t_end=frame.t_end,
            arrival_wall=frame.arrival_wall,
            payload=TracedTick(index=frame.index),
        )


def run(
    ratio: float, *, events: bool = True, fail_at: int | None = None, n: int = 5
) -> tuple[list[ReadableSpan], Announce, CollectSink]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    source = SyntheticSource(2.0, fps=10, audio=False, size=(64, 36))
    every, announce, sink = EveryNth(n, fail_at), Announce(), CollectSink()
    pipeline = Pipeline().link(source, every).link(every, announce).link(announce, sink)
    pipeline.link(every, sink)  # errors of `every` reach the sink directly too
    observer = TracingObserver(
        provider.get_tracer("test"), sample_ratio=ratio, trace_events=events, seed=1
    )
    pipeline.observe(observer)
    asyncio.run(pipeline.run())
    provider.shutdown()
    return list(exporter.get_finished_spans()), announce, sink


def by_id(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def parent_of(span: ReadableSpan, index: dict[int, ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None, span.name
    return index[span.parent.span_id]


def video_sources(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    return [
        s
        for s in spans
        if s.name == "synthetic" and s.attributes[names.ATTR_FRAME_TYPE] == "VideoFrame"
    ]


def test_every_event_gets_its_whole_chain_even_unsampled() -> None:
    spans, _, sink = run(ratio=0.0)
    index = by_id(spans)
    events = [s for s in spans if s.name == "event traced_tick"]
    assert len(events) == len(sink.of_type("traced_tick")) == 4  # frames 0, 5, 10, 15
    # Nothing else of the video was traced: one source span per event.
    assert len(video_sources(spans)) == 4
    for event in events:
        announce = parent_of(event, index)
        every = parent_of(announce, index)
        source = parent_of(every, index)
        assert (announce.name, every.name, source.name) == ("announce", "every", "synthetic")
        assert source.parent is None
        assert {s.context.trace_id for s in (event, announce, every, source)} == {
            source.context.trace_id
        }
        # The event links to each span of the chain it came from, in order.
        assert [link.context.span_id for link in event.links] == [
            source.context.span_id,
            every.context.span_id,
            announce.context.span_id,
        ]
        assert [link.attributes[names.ATTR_STAGE] for link in event.links] == [
            "synthetic",
            "every",
            "announce",
        ]
        # Real times: each hop starts after the one that made its frame, and lasts.
        assert source.start_time <= every.start_time <= announce.start_time <= event.start_time
        assert event.end_time <= announce.end_time
        assert announce.end_time > announce.start_time
        assert announce.attributes[names.ATTR_BUSY] > 0
        assert announce.attributes[names.ATTR_QUEUE_WAIT] >= 0
        assert event.attributes[names.ATTR_EVENT_LATENCY] > 0
        assert event.attributes[names.ATTR_STREAM_ID] == "main"
        # The sink's call on the event is the event's child.
        (sink_span,) = [
            s
            for s in spans
            if s.name == "collect_sink" and s.parent and s.parent.span_id == event.context.span_id
        ]
        assert sink_span.start_time >= event.start_time


def test_ratio_one_traces_every_frame_and_ratio_zero_without_events_none() -> None:
    spans, _, _ = run(ratio=1.0)
    assert len(video_sources(spans)) == 20
    assert len([s for s in spans if s.name == "every" and s.parent is not None]) >= 20
    spans, _, _ = run(ratio=0.0, events=False)
    assert not video_sources(spans)
    assert not [s for s in spans if s.name.startswith("event")]


def test_head_sampling_keeps_about_the_ratio() -> None:
    spans, _, _ = run(ratio=0.5, events=False, n=1000)
    assert 4 <= len(video_sources(spans)) <= 16  # 20 frames at 0.5 (seeded)


def test_traced_call_is_the_current_span_in_the_stage_and_its_thread() -> None:
    spans, announce, _ = run(ratio=1.0)
    ids = {s.context.span_id for s in spans if s.name == "announce"}
    assert announce.seen and all(here == there and here in ids for here, there in announce.seen)
    # Untraced calls see no span (ratio 0: a call is traced only once its event is emitted).
    _, announce, _ = run(ratio=0.0)
    assert all(here == 0 for here, _ in announce.seen)


def test_failure_is_an_error_span_and_an_error_event() -> None:
    spans, _, sink = run(ratio=0.0, fail_at=3)
    assert len(sink.of_type("error")) == 1
    (error,) = [s for s in spans if s.name == "event error"]
    assert error.status.status_code is StatusCode.ERROR
    failed = by_id(spans)[error.parent.span_id]  # type: ignore[union-attr]
    assert failed.name == "every" and failed.attributes[names.ATTR_FAILED] is True
    assert failed.status.status_code is StatusCode.ERROR


def test_ratio_out_of_range_is_refused() -> None:
    with pytest.raises(ConfigError, match="sample_ratio"):
        TracingObserver(trace.NoOpTracer(), sample_ratio=1.5)
