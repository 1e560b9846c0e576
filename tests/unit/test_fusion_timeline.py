"""The timeline stage: OCR and speech events become context lines and checkpoints."""

from __future__ import annotations

import asyncio

import pytest

from streamfuse.events import (
    AsrPartialPayload,
    AsrPayload,
    LmPayload,
    OcrLine,
    OcrPayload,
    TextPayload,
)
from streamfuse.frames import ContextFrame, EventFrame, Frame, TextFrame
from streamfuse.fusion import TimelineConfig, TimelineStage
from streamfuse.testing import run_stage

pytestmark = pytest.mark.unit


def slide(t: float, text: str, stream: str = "talk") -> EventFrame:
    payload = OcrPayload(
        lines=[OcrLine(text=text, box=(0, 0, 10, 10), conf=1.0)], text=text, n_lines=1,
        resolution=(64, 64), scale=1.0, roi=(0, 0, 64, 64), ocr_ms=1.0, mean_conf=1.0,
        frame_index=0, t_changed=t, reason="change",
    )  # fmt: skip
    return EventFrame(stream_id=stream, t_media=t, t_end=t + 0.5, payload=payload)


def speech(t: float, text: str, stream: str = "talk") -> EventFrame:
    return EventFrame(
        stream_id=stream, t_media=t, t_end=t + 1.0, payload=AsrPayload(text=text, words=[])
    )


def feed(stage: TimelineStage, frames: list[Frame]) -> list[Frame]:
    return asyncio.run(run_stage(stage, frames))


def test_events_become_timeline_lines_led_by_a_header() -> None:
    stage = TimelineStage(TimelineConfig(header="NOTES\n", checkpoint_every_s=1000.0))
    frames: list[Frame] = [slide(0.0, "Quarterly   results"), speech(1.0, "revenue grew")]
    out = feed(stage, frames)
    assert all(isinstance(f, ContextFrame) for f in out)
    texts = [f.text for f in out if isinstance(f, ContextFrame)]
    # The header opens the first line's frame, so the opening is fed (and prefilled) at once.
    assert texts == ["NOTES\n[0.0s] SLIDE: Quarterly results\n", "[1.0s] SPEECH: revenue grew\n"]
    line = out[1]
    assert isinstance(line, ContextFrame) and (line.t_media, line.t_end) == (1.0, 2.0)
    assert line.arrival_wall == frames[1].arrival_wall  # latency is measured from the event


def test_chat_and_captions_join_the_timeline_labelled_by_kind_and_author() -> None:
    stage = TimelineStage(TimelineConfig(header="", checkpoint_every_s=1000.0))
    chat = EventFrame(
        stream_id="talk", t_media=3.0, t_end=3.0,
        payload=TextPayload(text="what  about Q3?", author="alice"),
    )  # fmt: skip
    caption = EventFrame(
        stream_id="talk", t_media=4.0, t_end=4.0, payload=TextPayload(text="hi", kind="caption")
    )
    out = feed(stage, [speech(1.0, "revenue grew"), chat, caption])
    texts = [f.text for f in out if isinstance(f, ContextFrame)]
    assert texts == [
        "[1.0s] SPEECH: revenue grew\n",
        "[3.0s] CHAT alice: what about Q3?\n",
        "[4.0s] CAPTION: hi\n",
    ]


def test_only_slides_and_committed_speech_are_context() -> None:
    stage = TimelineStage()
    partial = EventFrame(t_media=1.0, t_end=2.0, payload=AsrPartialPayload(text="maybe"))
    answer = EventFrame(
        t_media=0.0, t_end=1.0,
        payload=LmPayload(text="x", prompt="q", request=1, finish="stop", interrupted=False,
                          n_tokens=1, context_tokens=1, ttft_ms=1.0, tok_s=1.0),
    )  # fmt: skip
    assert feed(stage, [partial, answer, speech(2.0, "   ")]) == []
    prompt = TextFrame(stream_id="talk", text="who?")
    assert feed(stage, [prompt]) == [prompt]  # prompts pass through, in order


def test_checkpoints_on_new_slides_and_every_interval_of_media() -> None:
    stage = TimelineStage(TimelineConfig(checkpoint_every_s=10.0))
    frames: list[Frame] = [
        speech(0.0, "hello"),  # first content: a checkpoint
        speech(4.0, "more"),  # 4 s later: not yet
        slide(5.0, "Title"),  # a new slide: a checkpoint
        slide(7.0, "Title"),  # the same slide read again: nothing
        speech(12.0, "still"),  # 7 s after the last checkpoint: not yet
        slide(16.0, "Title"),  # nothing new in it, but 11 s passed with speech added: due
        speech(17.0, "a"),
        slide(20.0, "Other", stream="b"),  # streams are independent
    ]
    out = [f for f in feed(stage, frames) if isinstance(f, ContextFrame)]

    def head(f: ContextFrame) -> str:  # "[5.0s] SLIDE" of the frame's (last) line
        return f.text.splitlines()[-1].split(": ")[0] if f.text else ""

    lines = [(f.stream_id, f.t_media, head(f), f.checkpoint) for f in out]
    assert lines == [
        ("talk", 0.0, "[0.0s] SPEECH", True),
        ("talk", 4.0, "[4.0s] SPEECH", False),
        ("talk", 5.0, "[5.0s] SLIDE", True),
        ("talk", 12.0, "[12.0s] SPEECH", False),
        ("talk", 16.0, "", True),
        ("talk", 17.0, "[17.0s] SPEECH", False),
        ("b", 20.0, "[20.0s] SLIDE", True),
    ]


def test_a_speech_revision_revises_the_window_holding_the_replaced_words() -> None:
    from streamfuse.events import AsrRevisionPayload, AsrWord

    def word(w: str, a: float) -> AsrWord:
        return AsrWord(word=w, t_start=a, t_end=a + 0.3, p=0.9)

    said = [word("the", 1.0), word("line", 1.3), word("system", 1.6)]
    first = EventFrame(stream_id="talk", t_media=1.0, t_end=1.9,
                       payload=AsrPayload(text="the line system", words=said))  # fmt: skip
    later = speech(5.0, "each part keeps up")
    fix = EventFrame(
        stream_id="talk", t_media=1.3, t_end=1.6,
        payload=AsrRevisionPayload(text="live", words=[word("live", 1.3)], replaced=[said[1]],
                                   replaced_text="line"),
    )  # fmt: skip
    stage = TimelineStage(TimelineConfig(header="", checkpoint_every_s=1000.0))
    out = [f for f in feed(stage, [first, later, fix]) if isinstance(f, ContextFrame)]
    assert [f.window for f in out] == ["speech:1", "speech:2", "speech:1"]
    assert out[2].text == "[1.0s] SPEECH: the live system\n"
    assert (out[0].version, out[2].version) == (0, 1)
    # A revision of words no remembered window holds (or before any speech) changes nothing.
    stage = TimelineStage(TimelineConfig(header="", checkpoint_every_s=1000.0))
    assert not [f for f in feed(stage, [fix]) if isinstance(f, ContextFrame)]
