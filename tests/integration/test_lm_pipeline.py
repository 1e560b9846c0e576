"""Timeline + `lm` stages in a real pipeline: OCR/ASR events in, streamed answers out
(tiny model)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from streamfuse.events import AsrPartialPayload, AsrPayload, OcrLine, OcrPayload, Payload
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


class ListSource(Source):
    def __init__(self, frames: list[Frame], stream_id: str = "talk") -> None:
        super().__init__("list", stream_id=stream_id)
        self._frames = frames

    async def frames(self) -> AsyncIterator[Frame]:
        for f in self._frames:
            await asyncio.sleep(0)
            yield f


class RecordingEngine(LMEngine):
    """Keeps each session's context as it was when the session was closed."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.closed: dict[str, list[int]] = {}

    def close_session(self, session: str) -> None:
        self.closed[session] = self.session_context(session)
        super().close_session(session)


def _stage(max_new_tokens: int = 12, **cfg: object) -> tuple[LMStage, RecordingEngine]:
    lm = LMConfig.model_validate({"pool": {"num_slots": 2, "max_tokens": 256}})
    engine = RecordingEngine(tiny_model(seed=3), lm)
    config = LMStageConfig(lm=lm, max_new_tokens=max_new_tokens, stop_at_newline=False, **cfg)
    return LMStage(config, engine=engine, tokenizer=CharTokenizer()), engine


def _ev(kind: str, t: float, text: str) -> EventFrame:
    payload: Payload
    if kind == "ocr":
        payload = OcrPayload(
            lines=[OcrLine(text=text, box=(0, 0, 10, 10), conf=1.0)], text=text, n_lines=1,
            resolution=(64, 64), scale=1.0, roi=(0, 0, 64, 64), ocr_ms=1.0, mean_conf=1.0,
            frame_index=0, t_changed=t, reason="change",
        )  # fmt: skip
    elif kind == "asr":
        payload = AsrPayload(text=text, words=[])
    else:
        payload = AsrPartialPayload(text=text)
    return EventFrame(stream_id="talk", t_media=t, t_end=t + 1.0, payload=payload)


def test_context_events_and_prompts_become_streamed_answers() -> None:
    stage, engine = _stage(ask="what is on the slide?")
    timeline = TimelineStage(TimelineConfig(checkpoint_every_s=1000.0))
    frames: list[Frame] = [
        _ev("ocr", 0.0, "Quarterly results"),
        _ev("asr", 1.0, "revenue grew by twelve percent"),
        _ev("asr_partial", 1.5, "ignored partial"),
        TextFrame(stream_id="talk", t_media=2.0, text="who presented?"),
        _ev("asr", 3.0, "costs stayed flat"),
    ]
    sink = CollectSink()
    pipe = Pipeline("lm-test")
    pipe.link(ListSource(frames), timeline)
    pipe.link(timeline, stage)
    pipe.link(stage, sink)
    asyncio.run(asyncio.wait_for(pipe.run(), 60))

    answers = sink.of_type("lm")
    prompts = [a["prompt"] for a in answers]
    # The slide triggers the configured ask, the text frame is a prompt, the end asks again.
    assert prompts[0] == "what is on the slide?"
    assert "who presented?" in prompts
    assert prompts[-1] == "what is on the slide?"
    for a in answers:
        tokens = [t for t in sink.of_type("lm_token") if t["request"] == a["request"]]
        assert "".join(t["text"] for t in tokens).strip() == a["text"]
        # An answer a newer checkpoint interrupts may end before its first token (a loaded
        # machine); any other answer has text.
        assert a["n_tokens"] >= 1 or a["interrupted"]
        assert a["finish"] in ("length", "stop", "interrupted")
        assert a["t_start"] == 0.0
    # The context holds the timeline (partials excluded); questions were rolled back out.
    # The end of input closed the session and freed its slot.
    ctx = CharTokenizer().decode(engine.closed["talk"])
    assert engine.session_context("talk") == [] and engine.pool.num_free == 2
    assert "SLIDE: Quarterly results" in ctx and "costs stayed flat" in ctx
    assert "ignored partial" not in ctx and "Question" not in ctx
    assert not engine.running_in_background  # teardown stopped the engine thread


class FailingSource(ListSource):
    """Emits its frames, then fails (as a truncated file does)."""

    async def frames(self) -> AsyncIterator[Frame]:
        async for f in super().frames():
            yield f
        raise OSError("decoder lost sync")


def test_an_input_error_reaches_the_sink_once_with_the_language_model_on() -> None:
    # The app's shape: the branch output goes to the sinks and, through the timeline and the
    # LM, to the sinks again; the source's error travels both paths but is reported once.
    stage, _engine = _stage(ask="what is on the slide?")
    timeline = TimelineStage()
    sink = CollectSink()
    src = FailingSource([_ev("ocr", 0.0, "Agenda"), _ev("asr", 1.0, "welcome everyone")])
    pipe = Pipeline("lm-join")
    pipe.link(src, timeline)
    pipe.link(src, sink)
    pipe.link(timeline, stage)
    pipe.link(stage, sink)
    asyncio.run(asyncio.wait_for(pipe.run(), 60))
    errors = sink.of_type("error")
    assert len(errors) == 1 and "decoder lost sync" in errors[0]["message"]
    assert sink.of_type("lm")  # the answers still came


def test_a_slide_read_again_revises_its_window_in_the_lm_context() -> None:
    """A slide read again better revises its window in the LM's context in place, ahead of the
    speech that followed it (F19)."""
    stage, engine = _stage(max_new_tokens=4)
    timeline = TimelineStage(TimelineConfig(header="", checkpoint_every_s=1000.0))
    frames: list[Frame] = [
        _ev("ocr", 0.0, "Agenda"),
        _ev("asr", 1.0, "welcome everyone"),
        TextFrame(stream_id="talk", t_media=2.0, text="topics?"),
        _ev("ocr", 3.0, "Agenda Intro Results"),  # the same slide, built up
        TextFrame(stream_id="talk", t_media=4.0, text="topics?"),
    ]
    sink = CollectSink()
    pipe = Pipeline("lm-versioned")
    pipe.link(ListSource(frames), timeline)
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
