from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from streamfuse.errors import ConfigError, PipelineError
from streamfuse.frames import (
    AudioFrame,
    EndOfStream,
    ErrorFrame,
    EventFrame,
    Frame,
    TextFrame,
    VideoFrame,
)
from streamfuse.pipeline import FrameQueue, OverloadPolicy, Pipeline, Stage
from streamfuse.sinks import CollectSink
from streamfuse.sources.base import Source
from streamfuse.sources.synthetic import SyntheticSource

pytestmark = pytest.mark.unit


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

    asyncio.run(go())


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
                type="tick",
                t_media=frame.t_media,
                t_end=frame.t_end,
                arrival_wall=frame.arrival_wall,
                data={"index": frame.index},
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
        yield EventFrame(type="audio_total", t_media=0.0, t_end=0.0, data={"n": self.count})


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
    asyncio.run(p.run())
    assert 6 <= len(slow.seen) <= 16
    assert slow.stats.dropped == 30 - len(slow.seen)
    assert slow.seen[-1] == 29  # the newest frame is always processed
    # Latency stays bounded: no event waited behind a backlog.
    assert max(r["latency_ms"] for r in sink.records) < 400


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
        assert len(sink.records) == len(stage.seen) > 5  # everything read was processed
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

    asyncio.run(go())


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
    from streamfuse.lm.stage import LMStage

    short = str(assets / "test" / "short.mp4")
    config = StreamfuseConfig(lm={"ask": "What is this about?"})
    sink = CollectSink()
    job = asyncio.run(build_pipeline([short, short], config, [sink]))
    lms = [s for s in job.pipeline.stages if isinstance(s, LMStage)]
    assert len(lms) == 1
    producers = job.pipeline._inbox[id(lms[0])].producers
    assert sorted(p.name for p in producers) == [
        "asr:0:short",
        "asr:1:short",
        "ocr:0:short",
        "ocr:1:short",
    ]
    assert lms[0] in job.pipeline._inbox[id(sink)].producers
    no_lm = asyncio.run(build_pipeline([short], StreamfuseConfig(), [CollectSink()]))
    assert not any(isinstance(s, LMStage) for s in no_lm.pipeline.stages)
