from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from streamfuse.errors import ConfigError, PipelineError
from streamfuse.events import Payload
from streamfuse.frames import (
    AudioFrame,
    EndOfStream,
    ErrorFrame,
    EventFrame,
    Frame,
    TextFrame,
    VideoFrame,
)
from streamfuse.pipeline import (
    FrameEmitted,
    FrameProcessed,
    FrameQueue,
    FramesDropped,
    Observer,
    OverloadPolicy,
    Pipeline,
    Source,
    Stage,
)
from streamfuse.sinks import CollectSink
from streamfuse.sources.synthetic import SyntheticSource
from streamfuse.testing import run_virtual

pytestmark = pytest.mark.unit


class Tick(Payload):
    type = "tick"
    index: int


class AudioTotal(Payload):
    type = "audio_total"
    n: int


def _text(i: int) -> TextFrame:
    return TextFrame(text=str(i), t_media=float(i))


async def _drain(q: FrameQueue) -> list[Frame]:
    out = []
    while len(q):
        out.append(await q.get())
    return out


def test_drop_oldest_keeps_newest_and_counts() -> None:
    async def go() -> None:
        q = FrameQueue(3, OverloadPolicy.DROP_OLDEST)
        dropped = []
        for i in range(6):
            dropped += await q.put(_text(i))
        assert [f.text for f in dropped] == ["0", "1", "2"]  # type: ignore[attr-defined]
        assert [f.text for f in await _drain(q)] == ["3", "4", "5"]  # type: ignore[attr-defined]
        assert q.dropped == 3

    asyncio.run(go())


def test_latest_only_keeps_one_and_never_drops_system_frames() -> None:
    async def go() -> None:
        q = FrameQueue(8, OverloadPolicy.LATEST_ONLY)
        await q.put(_text(0))
        await q.put(ErrorFrame(stage="x", message="boom"))
        await q.put(_text(1))
        await q.put(EndOfStream())
        await q.put(_text(2))
        items = await _drain(q)
        kinds = [type(f).__name__ for f in items]
        assert kinds == ["ErrorFrame", "EndOfStream", "TextFrame"]
        assert items[-1].text == "2"  # type: ignore[attr-defined]
        assert q.dropped == 2

    asyncio.run(go())


def test_shed_late_skips_a_stretch_once_the_oldest_is_too_old() -> None:
    """Frames arriving once a second into a queue nobody reads: nothing is dropped while the
    oldest is at most 4 s older than the newest; the fifth-second arrival sheds every frame
    more than 2 s older than it, in one contiguous stretch, and system frames stay."""

    def at(i: int) -> TextFrame:
        return TextFrame(text=str(i), t_media=float(i), arrival_wall=100.0 + i)

    async def go() -> None:
        q = FrameQueue(100, OverloadPolicy.SHED_LATE, max_age_s=4.0)
        dropped: list[Frame] = []
        await q.put(at(0))
        await q.put(EndOfStream())
        for i in range(1, 5):
            dropped += await q.put(at(i))
        assert dropped == []
        dropped += await q.put(at(5))
        assert [f.text for f in dropped] == ["0", "1", "2"]  # type: ignore[attr-defined]
        items = await _drain(q)
        assert [type(f).__name__ for f in items] == ["EndOfStream", *["TextFrame"] * 3]
        assert [f.text for f in items[1:]] == ["3", "4", "5"]  # type: ignore[attr-defined]
        assert q.dropped == 3 and q.data_depth == 0

    asyncio.run(go())


def test_shed_late_still_blocks_when_full() -> None:
    async def go() -> None:
        q = FrameQueue(2, OverloadPolicy.SHED_LATE, max_age_s=60.0)
        await q.put(_text(0))
        await q.put(_text(1))
        blocked = asyncio.create_task(q.put(_text(2)))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        await q.get()
        await asyncio.wait_for(blocked, 1.0)

    asyncio.run(go())


def test_max_age_goes_with_shed_late_only() -> None:
    with pytest.raises(ConfigError, match="max_age_s"):
        FrameQueue(4, OverloadPolicy.BLOCK, max_age_s=1.0)
    with pytest.raises(ConfigError, match="max_age_s"):
        FrameQueue(4, OverloadPolicy.SHED_LATE)


def test_block_policy_applies_backpressure() -> None:
    async def go() -> None:
        q = FrameQueue(2, OverloadPolicy.BLOCK)
        await q.put(_text(0))
        await q.put(_text(1))
        blocked = asyncio.create_task(q.put(_text(2)))
        await asyncio.sleep(0.01)
        assert not blocked.done()
        assert (await q.get()).text == "0"  # type: ignore[attr-defined]
        await asyncio.wait_for(blocked, 1.0)
        assert [f.text for f in await _drain(q)] == ["1", "2"]  # type: ignore[attr-defined]
        assert q.dropped == 0

    run_virtual(go())


def test_queue_rejects_bad_size() -> None:
    with pytest.raises(ConfigError):
        FrameQueue(0)


class EveryNth(Stage):
    input_types = (VideoFrame,)

    def __init__(self, n: int, fail_at: int | None = None, delay_s: float = 0.0) -> None:
        super().__init__()
        self.n, self.fail_at, self.delay_s = n, fail_at, delay_s
        self.seen: list[int] = []

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, VideoFrame)
        self.seen.append(frame.index)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if frame.index == self.fail_at:
            raise ValueError(f"cannot read frame {frame.index}")
        if frame.index % self.n == 0:
            yield EventFrame(
                t_media=frame.t_media,
                t_end=frame.t_end,
                arrival_wall=frame.arrival_wall,
                payload=Tick(index=frame.index),
            )


class AudioCounter(Stage):
    input_types = (AudioFrame,)

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        self.count += 1
        return
        yield

    async def flush(self) -> AsyncIterator[Frame]:
        yield EventFrame(t_media=0.0, t_end=0.0, payload=AudioTotal(n=self.count))


def test_routing_errors_and_flush_order() -> None:
    src = SyntheticSource(2.0, fps=30.0)
    video = EveryNth(15, fail_at=20)
    audio = AudioCounter()
    sink = CollectSink()
    p = Pipeline().link(src, video).link(src, audio, maxsize=64).link(video, sink).link(audio, sink)
    asyncio.run(p.run())
    ticks = [r["index"] for r in sink.of_type("tick")]
    assert ticks == [0, 15, 30, 45]  # the failure at frame 20 did not stop the stream
    errors = sink.of_type("error")
    assert len(errors) == 1 and "cannot read frame 20" in errors[0]["message"]
    assert errors[0]["stage"] == "every_nth" and errors[0]["t_start"] == pytest.approx(
        20 / 30, abs=1e-3
    )
    assert video.seen == list(range(60))
    assert sink.of_type("audio_total")[0]["n"] == 100  # 2 s of 20 ms windows, flushed at EOS
    assert p.snapshot()["every_nth"]["errors"] == 1
    for r in sink.records:
        assert {"type", "t_start", "t_end", "latency_ms"} <= r.keys()


def test_latest_only_edge_drops_under_overload_in_realtime() -> None:
    src = SyntheticSource(1.0, fps=30.0, audio=False, realtime=True)
    slow = EveryNth(1, delay_s=0.1)  # 10 fps capacity against 30 fps input
    sink = CollectSink()
    p = Pipeline().link(src, slow, policy=OverloadPolicy.LATEST_ONLY).link(slow, sink)
    run_virtual(p.run())  # virtual time: the same counts on every run, however loaded the CPU
    assert 10 <= len(slow.seen) <= 11  # 1 s at 10 fps
    assert slow.stats.dropped == 30 - len(slow.seen)
    assert slow.seen[-1] == 29  # the newest frame is always processed
    # Latency stays bounded: no event waited behind a backlog (one read + one frame interval).
    assert max(r["latency_ms"] for r in sink.records) <= 100 + 1000 / 30 + 0.1


class Forever(Source):
    async def frames(self) -> AsyncIterator[Frame]:
        i = 0
        while True:
            await asyncio.sleep(0.005)
            yield VideoFrame(image=np.zeros((4, 4, 3), np.uint8), index=i, t_media=i / 30)
            i += 1


def test_stop_drains_and_cancel_leaves_no_task() -> None:
    async def go() -> None:
        before = asyncio.all_tasks()
        stage = EveryNth(1, delay_s=0.01)
        sink = CollectSink()
        p = Pipeline().link(Forever("forever"), stage).link(stage, sink)
        run = asyncio.create_task(p.run())
        await asyncio.sleep(0.2)
        p.request_stop()
        await asyncio.wait_for(run, 2.0)
        # ~20 reads of 10 ms in 0.2 s (virtual time), then the frames already queued (16) and
        # in flight when the stop came: everything read was processed.
        assert len(sink.records) == len(stage.seen) and 36 <= len(stage.seen) <= 38
        assert asyncio.all_tasks() - before == {asyncio.current_task()} - before

        stage2 = EveryNth(1, delay_s=0.05)
        p2 = Pipeline().link(Forever("forever"), stage2).link(stage2, CollectSink())
        run2 = asyncio.create_task(p2.run())
        await asyncio.sleep(0.1)
        run2.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run2
        await asyncio.sleep(0)
        leftover = {t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()}
        assert not leftover

    run_virtual(go())


def test_graph_validation() -> None:
    a, b = EveryNth(1), EveryNth(1)
    with pytest.raises(PipelineError, match="no source"):
        asyncio.run(Pipeline().link(a, b).run())
    src = SyntheticSource(0.1)
    p = Pipeline().link(src, a).link(a, b).link(b, a)
    with pytest.raises(PipelineError, match="cycle"):
        asyncio.run(p.run())
    with pytest.raises(PipelineError, match="already has"):
        Pipeline().link(src, a).link(src, a, policy=OverloadPolicy.LATEST_ONLY)


def test_streams_share_the_cores_between_their_model_threads() -> None:
    import os

    from streamfuse.app import StreamfuseConfig, share_cores

    config = StreamfuseConfig()
    cores = os.cpu_count() or 1
    vision, asr = share_cores(config, 1)
    assert vision.ocr.intra_op_threads == min(config.vision.ocr.intra_op_threads, cores)
    assert asr.cpu_threads == min(config.asr_config.cpu_threads, cores)
    vision, asr = share_cores(config, 4 * cores)
    assert vision.ocr.intra_op_threads == 1 and asr.cpu_threads == 1
    assert config.vision.ocr.intra_op_threads >= 1  # the shared config is not modified


def test_auto_ocr_precision_is_int8_only_when_streams_share_the_machine() -> None:
    from streamfuse.app import StreamfuseConfig, share_cores

    config = StreamfuseConfig()
    assert config.vision.ocr.precision == "auto"
    assert share_cores(config, 1)[0].ocr.precision == "fp32"
    assert share_cores(config, 4)[0].ocr.precision == "int8"
    pinned = StreamfuseConfig(vision={"ocr": {"precision": "int8"}})
    assert share_cores(pinned, 1)[0].ocr.precision == "int8"


def test_ask_wires_one_language_model_stage_over_every_stream(assets) -> None:  # type: ignore[no-untyped-def]
    from streamfuse.app import StreamfuseConfig, build_pipeline
    from streamfuse.fusion import TimelineStage
    from streamfuse.lm.stage import LMStage

    short = str(assets / "test" / "short.mp4")
    config = StreamfuseConfig(lm={"ask": "What is this about?"})
    sink = CollectSink()
    job = asyncio.run(build_pipeline([short, short], config, [sink]))
    lms = [s for s in job.pipeline.stages if isinstance(s, LMStage)]
    timelines = [s for s in job.pipeline.stages if isinstance(s, TimelineStage)]
    assert len(lms) == 1 and len(timelines) == 1
    producers = job.pipeline.producers_of(timelines[0])
    assert sorted(p.name for p in producers) == [
        "asr:0:short",
        "asr:1:short",
        "ocr:0:short",
        "ocr:1:short",
    ]
    assert job.pipeline.producers_of(lms[0]) == timelines
    assert lms[0] in job.pipeline.producers_of(sink)
    assert timelines[0] not in job.pipeline.producers_of(sink)
    no_lm = asyncio.run(build_pipeline([short], StreamfuseConfig(), [CollectSink()]))
    assert not any(isinstance(s, LMStage) for s in no_lm.pipeline.stages)


class Breaks(SyntheticSource):
    """A synthetic input whose decoder fails part-way (as a truncated file does)."""

    def __init__(self, after: int) -> None:
        super().__init__(1.0, fps=30.0)
        self.after = after

    async def frames(self) -> AsyncIterator[Frame]:
        n = 0
        async for frame in super().frames():
            if n == self.after:
                raise OSError("decoder lost sync")
            n += 1
            yield frame


class Relay(Stage):
    """Forwards every video frame as a tick (a middle stage of a diamond)."""

    input_types = (VideoFrame,)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, VideoFrame)
        yield EventFrame(t_media=frame.t_media, t_end=frame.t_end, payload=Tick(index=frame.index))


def test_system_frames_reach_a_join_once() -> None:
    # source -> video path + audio path -> sink, and both paths -> a second join stage: the
    # source's failure travels along both paths but each consumer is given it once; end of
    # stream is still counted per producer (the sink flushes after both paths ended).
    src = Breaks(after=40)
    video, audio, relay = EveryNth(15), AudioCounter(), Relay()
    sink = CollectSink()
    p = (
        Pipeline()
        .link(src, video)
        .link(src, audio, maxsize=64)
        .link(src, relay)
        .link(video, sink)
        .link(audio, sink)
        .link(relay, sink)
    )
    asyncio.run(p.run())
    errors = sink.of_type("error")
    assert len(errors) == 1, errors
    assert "decoder lost sync" in errors[0]["message"] and errors[0]["stage"] == "synthetic"
    assert len(sink.of_type("audio_total")) == 1  # flushed after the error, once
    assert p.producers_of(sink) == [video, audio, relay]
    assert p.consumers_of(src) == [video, audio, relay]


class Recorder(Observer):
    def __init__(self) -> None:
        self.created: list[tuple[str, str]] = []
        self.dropped: list[tuple[str, int, OverloadPolicy]] = []
        self.processed: list[FrameProcessed] = []
        self.started = self.ended = 0

    def on_start(self, wall: float) -> None:
        self.started += 1

    def on_frame(self, event: FrameEmitted) -> None:
        self.created.append((event.producer.name, type(event.frame).__name__))

    def on_drop(self, event: FramesDropped) -> None:
        self.dropped.append((event.consumer.name, len(event.frames), event.policy))

    def on_processed(self, event: FrameProcessed) -> None:
        self.processed.append(event)

    def on_end(self, wall: float) -> None:
        self.ended += 1


def test_observers_see_created_dropped_and_processed_frames() -> None:
    src = SyntheticSource(1.0, fps=30.0, audio=False, realtime=True)
    slow = EveryNth(1, fail_at=3, delay_s=0.05)
    mid = AudioCounter()  # consumes no video: error frames only pass through it
    sink = CollectSink()
    rec = Recorder()
    p = Pipeline().link(src, slow, policy=OverloadPolicy.LATEST_ONLY).link(slow, mid)
    p.link(mid, sink).observe(rec)
    asyncio.run(p.run())
    assert rec.started == rec.ended == 1
    by_source = [c[1] for c in rec.created if c[0] == "synthetic"]
    assert by_source == ["VideoFrame"] * 30 + ["EndOfStream"]  # all the source created
    ticks = [c for c in rec.created if c == ("every_nth", "EventFrame")]
    assert len(ticks) == len(slow.seen) - 1  # one per processed frame but the failing one
    # The runner's error frame is reported once, by the stage that failed, not again when it
    # passes through `mid`.
    assert [c for c in rec.created if c[1] == "ErrorFrame"] == [("every_nth", "ErrorFrame")]
    assert sum(n for _, n, _ in rec.dropped) == slow.stats.dropped == 30 - len(slow.seen)
    assert all(policy is OverloadPolicy.LATEST_ONLY for _, _, policy in rec.dropped)
    failed = [e for e in rec.processed if e.failed]
    assert len(failed) == 1 and failed[0].stage is slow and failed[0].cause.t_media == 3 / 30
    assert [e.stage for e in rec.processed if e.flushed] == [slow, mid, sink]
    assert all(e.busy_s >= 0 for e in rec.processed)


def test_a_failing_observer_is_detached_not_fatal() -> None:
    class Broken(Observer):
        calls = 0

        def on_frame(self, event: FrameEmitted) -> None:
            Broken.calls += 1
            raise RuntimeError("observer bug")

    src = SyntheticSource(0.2, fps=30.0, audio=False)
    stage, sink = EveryNth(1), CollectSink()
    p = Pipeline().link(src, stage).link(stage, sink).observe(Broken())
    asyncio.run(p.run())
    assert Broken.calls == 1 and len(sink.of_type("tick")) == 6


def test_teardown_runs_before_the_worker_thread_is_shut_down() -> None:
    import threading

    class ClosesOnWorker(EveryNth):
        closed_on: str | None = None

        async def teardown(self) -> None:
            # e.g. closing a model handle on the thread that owns it
            self.closed_on = await self.run_blocking(lambda: threading.current_thread().name)

    src = SyntheticSource(0.2, fps=30.0, audio=False)
    stage = ClosesOnWorker(1)

    async def go() -> None:
        await stage.run_blocking(lambda: None)  # the worker exists before the run
        await Pipeline().link(src, stage).link(stage, CollectSink()).run()

    asyncio.run(go())
    prefix = f"sf-{stage.name}"
    assert stage.closed_on is not None and stage.closed_on.startswith(prefix)
    # ...and nothing is left running afterwards (the old order re-created the pool in
    # teardown, after shutting it down, and leaked its thread). Shutdown does not wait for
    # the idle worker to exit: give it a moment.
    for _ in range(200):
        if not [t for t in threading.enumerate() if t.name.startswith(prefix)]:
            break
        threading.Event().wait(0.01)
    assert not [t for t in threading.enumerate() if t.name.startswith(prefix)]
