"""QosSignals observes a pipeline: ASR commit latency from created `asr` events, per-stream
drop counts at the inputs it watches."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from streamfuse.events import AsrPayload, AsrWord, OcrPayload
from streamfuse.frames import EventFrame, Frame, VideoFrame
from streamfuse.pipeline import FrameEmitted, FramesDropped, OverloadPolicy, Pipeline, Stage
from streamfuse.qos.signals import QosSignals
from streamfuse.sinks import CollectSink
from streamfuse.sources.synthetic import SyntheticSource
from streamfuse.testing import run_virtual

pytestmark = pytest.mark.unit


class _Probe:
    def cpu(self) -> float:
        return 0.5

    def gpu(self) -> None:
        return None


def _asr(stream: str, arrival: float) -> EventFrame:
    word = AsrWord(word="hi", t_start=0.0, t_end=0.3, p=0.9)
    return EventFrame(
        stream_id=stream,
        t_end=0.3,
        arrival_wall=arrival,
        payload=AsrPayload(text="hi", words=[word]),
    )


class _Nothing(Stage):
    input_types = (VideoFrame,)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        return
        yield


def test_asr_latency_per_stream_from_created_events() -> None:
    signals = QosSignals(probe=_Probe(), alpha=0.5)  # type: ignore[arg-type]
    node = _Nothing("asr")
    assert signals.asr_latency_s("a") is None
    signals.on_frame(FrameEmitted(node, _asr("a", arrival=10.0), wall=10.4))
    signals.on_frame(FrameEmitted(node, _asr("a", arrival=20.0), wall=20.2))
    ocr = OcrPayload(
        lines=[], text="", n_lines=0, resolution=(64, 64), scale=1.0, roi=(0, 0, 64, 64),
        ocr_ms=1.0, mean_conf=None, frame_index=0, t_changed=0.0, reason="first",
    )  # fmt: skip
    other = EventFrame(stream_id="a", t_end=0.0, arrival_wall=0.0, payload=ocr)
    signals.on_frame(FrameEmitted(node, other, wall=9000.0))  # not speech: ignored
    assert signals.asr_latency_s("a") == pytest.approx(0.3)
    assert signals.asr_latency_s("b") is None


def test_drops_are_counted_per_stream_only_at_watched_inputs() -> None:
    signals = QosSignals(probe=_Probe())  # type: ignore[arg-type]
    ocr, other = _Nothing("ocr"), _Nothing("other")
    signals.watch_drops(ocr)
    frames = [VideoFrame(stream_id=s, image=None) for s in ("a", "a", "b")]  # type: ignore[arg-type]
    signals.on_drop(FramesDropped(ocr, frames, OverloadPolicy.LATEST_ONLY))
    signals.on_drop(FramesDropped(other, frames, OverloadPolicy.DROP_OLDEST))
    assert signals.take_drops("a") == 2 and signals.take_drops("b") == 1
    assert signals.take_drops("a") == 0  # taken


def test_drops_at_a_latest_only_edge_reach_the_signals_in_a_running_pipeline() -> None:
    class Slow(_Nothing):
        async def process(self, frame: Frame) -> AsyncIterator[Frame]:
            await asyncio.sleep(0.05)
            return
            yield

    src = SyntheticSource(0.5, fps=30.0, audio=False, realtime=True, stream_id="cam")
    slow = Slow("ocr")
    signals = QosSignals(probe=_Probe())  # type: ignore[arg-type]
    signals.watch_drops(slow)
    p = Pipeline().link(src, slow, policy=OverloadPolicy.LATEST_ONLY).link(slow, CollectSink())
    run_virtual(p.observe(signals).run())  # 15 frames in 0.5 s into 20 reads/s: same every run
    assert slow.stats.dropped > 0
    assert signals.take_drops("cam") == slow.stats.dropped
