"""`streamfuse.testing.run_stage`: one stage over given frames, through the real runner."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import numpy as np
import pytest

from streamfuse.frames import AudioFrame, ErrorFrame, Frame, TextFrame
from streamfuse.pipeline import OverloadPolicy, Stage
from streamfuse.testing import run_stage

pytestmark = pytest.mark.unit


class Upper(Stage):
    """Upper-cases text on a worker thread, fails on "boom", flushes a count, sees its backlog."""

    input_types = (TextFrame,)

    def __init__(self) -> None:
        super().__init__()
        self.backlogs: list[int] = []
        self.threads: set[str] = set()
        self.torn_down = False

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, TextFrame)
        self.backlogs.append(self.backlog)
        if frame.text == "boom":
            raise ValueError("cannot shout boom")
        text = await self.run_blocking(self._upper, frame.text)
        yield TextFrame(text=text, t_media=frame.t_media, stream_id=frame.stream_id)

    def _upper(self, text: str) -> str:
        self.threads.add(threading.current_thread().name)
        return text.upper()

    async def flush(self) -> AsyncIterator[Frame]:
        yield TextFrame(text=f"{len(self.backlogs)} read", t_media=99.0)

    async def teardown(self) -> None:
        self.torn_down = True


def _texts(*words: str) -> list[TextFrame]:
    return [TextFrame(text=w, t_media=float(i), stream_id="s") for i, w in enumerate(words)]


def test_outputs_errors_and_flush_come_back_in_order() -> None:
    stage = Upper()
    out = asyncio.run(run_stage(stage, _texts("a", "boom", "b")))
    assert [type(f).__name__ for f in out] == ["TextFrame", "ErrorFrame", "TextFrame", "TextFrame"]
    assert [getattr(f, "text", None) for f in out] == ["A", None, "B", "3 read"]
    error = out[1]
    assert isinstance(error, ErrorFrame)
    assert "cannot shout boom" in error.message and error.stream_id == "s"
    assert error.t_media == 1.0
    assert (
        stage.torn_down and stage.threads and all(t.startswith("sf-upper") for t in stage.threads)
    )


def test_frames_the_stage_does_not_consume_are_not_returned() -> None:
    audio = AudioFrame(samples=np.zeros(4, np.float32), t_media=0.5)
    out = asyncio.run(run_stage(Upper(), [audio, *_texts("x")]))
    assert [getattr(f, "text", None) for f in out] == ["X", "1 read"]


def test_lockstep_feeds_one_frame_at_a_time_and_queued_feeding_shows_a_backlog() -> None:
    stage = Upper()
    asyncio.run(run_stage(stage, _texts(*"abcdef")))
    assert stage.backlogs == [0] * 6
    queued = Upper()
    out = asyncio.run(run_stage(queued, _texts(*"abcdef"), lockstep=False, maxsize=8))
    assert max(queued.backlogs) > 0 and len(out) == 7


def test_an_overload_policy_applies_at_the_input() -> None:
    class Slow(Upper):
        async def process(self, frame: Frame) -> AsyncIterator[Frame]:
            await asyncio.sleep(0.01)
            async for f in super().process(frame):
                yield f

    stage = Slow()
    out = asyncio.run(
        run_stage(stage, _texts(*"abcdefgh"), lockstep=False, policy=OverloadPolicy.LATEST_ONLY)
    )
    assert stage.stats.dropped > 0
    assert [getattr(f, "text", None) for f in out][-2] == "H"  # the newest is always read
