"""The live inputs of `streamfuse serve`: the bounded byte pipe the decoder reads, the text
source, and the parsing of text-stream messages."""

from __future__ import annotations

import asyncio
import threading

import pytest

from streamfuse.errors import SourceError
from streamfuse.events import TextPayload
from streamfuse.frames import EventFrame, TextFrame
from streamfuse.server.api import TextMessage, _parse_text
from streamfuse.sources.pipe import BytePipe, IngestOverflow
from streamfuse.sources.text import TextSource

pytestmark = pytest.mark.unit


def test_pipe_hands_bytes_to_a_blocking_reader_in_order_until_the_end() -> None:
    pipe = BytePipe(max_bytes=1024)
    got: list[bytes] = []

    def reader() -> None:
        while chunk := pipe.read(7):
            got.append(chunk)

    thread = threading.Thread(target=reader)
    thread.start()

    async def writer() -> None:
        for i in range(20):
            await pipe.write_chunk(bytes([i]) * 50)
        pipe.end()

    asyncio.run(writer())
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert b"".join(got) == b"".join(bytes([i]) * 50 for i in range(20))
    assert pipe.received == 1000 and not pipe.seekable()


def test_pipe_refuses_a_writer_too_far_ahead_and_writes_after_the_end() -> None:
    pipe = BytePipe(max_bytes=100)

    async def overflow() -> None:
        await pipe.write_chunk(b"x" * 80)
        await pipe.write_chunk(b"y" * 80, timeout_s=0.1)  # nobody reads

    with pytest.raises(IngestOverflow, match="80 bytes ahead of the decoder .limit 100"):
        asyncio.run(overflow())
    pipe.end()
    with pytest.raises(SourceError, match="already ended"):
        asyncio.run(pipe.write_chunk(b"z"))
    assert pipe.read(1000) == b"x" * 80 and pipe.read(10) == b""


def test_pipe_takes_one_chunk_larger_than_its_bound_when_empty() -> None:
    # Otherwise a single large (but allowed) message could never enter.
    pipe = BytePipe(max_bytes=10)
    asyncio.run(pipe.write_chunk(b"a" * 50))
    assert pipe.read(100) == b"a" * 50


def test_text_source_stamps_messages_with_its_clock_and_questions_go_to_the_lm() -> None:
    async def scenario() -> list[object]:
        source = TextSource(stream_id="cam", clock=lambda: 12.5, max_pending=2)
        source.put("hi all", author="ann")
        source.put("what is on screen?", ask=True)
        with pytest.raises(asyncio.QueueFull, match="2 text messages already waiting"):
            source.put("one too many")
        source.end()
        return [f async for f in source.frames()]

    frames = asyncio.run(scenario())
    assert [type(f) for f in frames] == [EventFrame, EventFrame, TextFrame]
    first = frames[0]
    assert isinstance(first, EventFrame) and first.payload == TextPayload(
        text="hi all", author="ann"
    )
    assert (first.stream_id, first.t_media, first.t_end) == ("cam", 12.5, 12.5)
    assert isinstance(frames[2], TextFrame) and frames[2].text == "what is on screen?"


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("hello there", TextMessage(text="hello there")),
        ('{"text": "hi", "author": "bo", "kind": "caption"}',
         TextMessage(text="hi", author="bo", kind="caption")),
        ('{"text": "why?", "ask": true}', TextMessage(text="why?", ask=True)),
        ("   ", "empty message"),
        ('{"text": "x"', "malformed text message: message: Invalid JSON"),
        ('{"txt": "x"}', "malformed text message: text: Field required; txt: Extra inputs"),
        ('{"text": ""}', "malformed text message: text: String should have at least 1 character"),
        ('{"text": "x", "kind": "DROP TABLE"}',
         "malformed text message: kind: String should match"),
    ],
)  # fmt: skip
def test_text_messages_parse_or_name_their_problem(message: str, expected: object) -> None:
    parsed = _parse_text(message)
    if isinstance(expected, str):
        assert isinstance(parsed, str) and parsed.startswith(expected), parsed
    else:
        assert parsed == expected
