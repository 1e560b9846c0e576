"""A text input stream: chat messages or captions pushed in as they arrive.

Each message becomes a `text` event (`TextPayload`) at the media time it arrived (seconds since
the stream's clock started, shared with the session's media so chat and slides line up); a
message marked as a question also goes to the language model as a prompt (`TextFrame`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from streamfuse.events import TextPayload
from streamfuse.frames import EventFrame, Frame, TextFrame, now_wall
from streamfuse.pipeline.source import Source


class TextSource(Source):
    """Messages `put` from anywhere on the event loop; `end()` ends the stream."""

    def __init__(
        self,
        *,
        stream_id: str = "text",
        name: str = "text",
        clock: Callable[[], float] | None = None,
        max_pending: int = 1024,
    ) -> None:
        super().__init__(name, stream_id=stream_id)
        t0 = now_wall()
        #: Media seconds now (default: since this source was made).
        self.clock = clock or (lambda: now_wall() - t0)
        self.max_pending = max_pending
        self._queue: asyncio.Queue[list[Frame] | None] = asyncio.Queue()

    def put(
        self, text: str, *, author: str | None = None, kind: str = "chat", ask: bool = False
    ) -> None:
        """Queue one message (raises `asyncio.QueueFull` past `max_pending` waiting)."""
        if self._queue.qsize() >= self.max_pending:
            raise asyncio.QueueFull(f"{self.max_pending} text messages already waiting")
        now, t = now_wall(), max(0.0, self.clock())
        payload = TextPayload(text=text, author=author, kind=kind)
        frames: list[Frame] = [
            EventFrame(
                stream_id=self.stream_id, t_media=t, t_end=t, arrival_wall=now, payload=payload
            )
        ]
        if ask:
            frames.append(
                TextFrame(stream_id=self.stream_id, t_media=t, t_end=t, arrival_wall=now, text=text)
            )
        self._queue.put_nowait(frames)

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def frames(self) -> AsyncIterator[Frame]:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            for frame in item:
                yield frame


__all__ = ["TextSource"]
