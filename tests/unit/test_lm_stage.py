"""The `lm` stage cuts a running answer when a newer prompt arrives (tiny model, no pipeline)."""

from __future__ import annotations

import asyncio

import pytest

from streamfuse.frames import TextFrame
from streamfuse.lm.config import LMConfig
from streamfuse.lm.engine import LMEngine
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.testing.tiny_lm import CharTokenizer, tiny_model

pytestmark = pytest.mark.unit


def test_a_newer_prompt_interrupts_the_running_answer() -> None:
    async def scenario() -> list[dict]:
        lm = LMConfig.model_validate({"pool": {"num_slots": 1, "max_tokens": 256}})
        engine = LMEngine(tiny_model(seed=4), lm)
        cfg = LMStageConfig(lm=lm, max_new_tokens=200, stop_at_newline=False)
        stage = LMStage(cfg, engine=engine, tokenizer=CharTokenizer())
        stage._backlog = lambda: 1  # input is waiting: process() returns right away
        await stage.setup()
        out = [f async for f in stage.process(TextFrame(stream_id="s", text="first question"))]
        first = stage._streams["s"].answer
        assert first is not None
        await first.queue.get()  # the engine thread delivered the first tokens
        out += [f async for f in stage.process(TextFrame(stream_id="s", text="second"))]
        stage._backlog = lambda: 0
        out += [f async for f in stage.flush()]
        await stage.teardown()
        # The end of input closed the stream's session: its slot is free again.
        assert engine.pool.num_free == 1 and engine.sessions.get("s") is None
        return [f.to_record() for f in out if f.type == "lm"]

    answers = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [a["prompt"] for a in answers] == ["first question", "second"]
    assert answers[0]["interrupted"] is True and 1 <= answers[0]["n_tokens"] < 200
    assert answers[1]["finish"] == "length" and answers[1]["n_tokens"] == 200


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
