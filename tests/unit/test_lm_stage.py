"""The `lm` stage cuts a running answer when a newer prompt arrives (tiny model, real runner)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from streamfuse.events import EventType
from streamfuse.frames import EventFrame, Frame, TextFrame
from streamfuse.lm.config import LMConfig
from streamfuse.lm.engine import LMEngine
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.pipeline import FrameEmitted, Observer, Pipeline, Source
from streamfuse.sinks import CollectSink
from streamfuse.testing.tiny_lm import CharTokenizer, tiny_model

pytestmark = pytest.mark.unit


class _Prompts(Source):
    """A first question, then a second one as soon as the first answer is streaming."""

    def __init__(self, streaming: asyncio.Event) -> None:
        super().__init__("prompts", stream_id="s")
        self.streaming = streaming

    async def frames(self) -> AsyncIterator[Frame]:
        yield TextFrame(stream_id="s", text="first question")
        await self.streaming.wait()
        yield TextFrame(stream_id="s", text="second")


class _FirstToken(Observer):
    def __init__(self) -> None:
        self.seen = asyncio.Event()

    def on_frame(self, event: FrameEmitted) -> None:
        if isinstance(event.frame, EventFrame) and event.frame.type == EventType.LM_TOKEN:
            self.seen.set()


def test_a_newer_prompt_interrupts_the_running_answer() -> None:
    lm = LMConfig.model_validate({"pool": {"num_slots": 1, "max_tokens": 256}})
    engine = LMEngine(tiny_model(seed=4), lm)
    cfg = LMStageConfig(lm=lm, max_new_tokens=200, stop_at_newline=False)
    stage = LMStage(cfg, engine=engine, tokenizer=CharTokenizer())
    sink = CollectSink()

    async def scenario() -> None:
        first_token = _FirstToken()
        source = _Prompts(first_token.seen)
        pipeline = Pipeline("lm-interrupt").link(source, stage).link(stage, sink)
        await pipeline.observe(first_token).run()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    answers = sink.of_type(EventType.LM)
    assert [a["prompt"] for a in answers] == ["first question", "second"]
    assert answers[0]["interrupted"] is True and 1 <= answers[0]["n_tokens"] < 200
    assert answers[1]["finish"] == "length" and answers[1]["n_tokens"] == 200
    # The end of input closed the stream's session: its slot is free again.
    assert engine.pool.num_free == 1 and engine.sessions.get("s") is None


def test_the_app_caps_the_lm_threads_at_a_stream_share_of_the_cores() -> None:
    import os

    from streamfuse.app import StreamfuseConfig, lm_config

    cores = os.cpu_count() or 1
    config = StreamfuseConfig(lm={"lm": {"model": {"threads": 256}}, "ask": "q?"})
    assert lm_config(config, 1).lm.model.threads == cores
    assert lm_config(config, 4 * cores).lm.model.threads == 1
    small = lm_config(config.model_copy(update={"lm": LMStageConfig()}), 1)
    assert small.lm.model.threads == min(2, cores)  # below the share: kept as configured
    assert lm_config(config, 1).ask == "q?"  # the rest of the settings are untouched
