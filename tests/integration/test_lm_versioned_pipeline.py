"""Timeline + `lm` stages in a real pipeline (tiny model): a slide read again better revises
its window in the LM's context in place, ahead of the speech that followed it (F19)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from streamfuse.events import AsrPayload, OcrLine, OcrPayload, Payload
from streamfuse.frames import EventFrame, Frame, TextFrame
from streamfuse.fusion import TimelineConfig, TimelineStage
from streamfuse.lm.config import LMConfig
from streamfuse.lm.engine import LMEngine
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.pipeline import Pipeline
from streamfuse.pipeline.source import Source
from streamfuse.sinks import CollectSink
from streamfuse.testing.tiny_lm import CharTokenizer, tiny_model

pytestmark = pytest.mark.integration


class _Source(Source):
    def __init__(self, frames: list[Frame]) -> None:
        super().__init__("list", stream_id="talk")
        self._frames = frames

    async def frames(self) -> AsyncIterator[Frame]:
        for f in self._frames:
            await asyncio.sleep(0)
            yield f


class _Engine(LMEngine):
    """Keeps each session's context as it was when the session was closed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.closed: dict[str, list[int]] = {}

    def close_session(self, session: str) -> None:
        self.closed[session] = self.session_context(session)
        super().close_session(session)


def _ev(t: float, text: str, *, slide: bool) -> EventFrame:
    payload: Payload
    if slide:
        payload = OcrPayload(
            lines=[OcrLine(text=text, box=(0, 0, 10, 10), conf=1.0)], text=text, n_lines=1,
            resolution=(64, 64), scale=1.0, roi=(0, 0, 64, 64), ocr_ms=1.0, mean_conf=1.0,
            frame_index=0, t_changed=t, reason="change",
        )  # fmt: skip
    else:
        payload = AsrPayload(text=text, words=[])
    return EventFrame(stream_id="talk", t_media=t, t_end=t + 1.0, payload=payload)


def test_a_slide_read_again_revises_its_window_in_the_lm_context() -> None:
    lm = LMConfig.model_validate({"pool": {"num_slots": 2, "max_tokens": 256}})
    engine = _Engine(tiny_model(seed=3), lm)
    config = LMStageConfig(lm=lm, max_new_tokens=4, stop_at_newline=False)
    stage = LMStage(config, engine=engine, tokenizer=CharTokenizer())
    timeline = TimelineStage(TimelineConfig(header="", checkpoint_every_s=1000.0))
    frames: list[Frame] = [
        _ev(0.0, "Agenda", slide=True),
        _ev(1.0, "welcome everyone", slide=False),
        TextFrame(stream_id="talk", t_media=2.0, text="topics?"),
        _ev(3.0, "Agenda Intro Results", slide=True),  # the same slide, built up
        TextFrame(stream_id="talk", t_media=4.0, text="topics?"),
    ]
    sink = CollectSink()
    pipe = Pipeline("lm-versioned")
    pipe.link(_Source(frames), timeline)
    pipe.link(timeline, stage)
    pipe.link(stage, sink)
    asyncio.run(asyncio.wait_for(pipe.run(), 60))

    assert [a["prompt"] for a in sink.of_type("lm")] == ["topics?", "topics?"]
    ctx = CharTokenizer().decode(engine.closed["talk"])
    # The revised reading took the first one's place (and timestamp), before the speech;
    # the earlier reading is gone rather than left in the context next to it.
    assert ctx.count("SLIDE:") == 1
    assert ctx.index("[0.0s] SLIDE: Agenda Intro Results") < ctx.index("SPEECH: welcome")
    assert engine.stats.invalidations == 1  # the KV from the slide on was recomputed once
