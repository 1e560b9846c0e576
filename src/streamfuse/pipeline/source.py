"""The source interface: something that yields frames in media-time order (sources plug into
the runtime; implementations live in `streamfuse.sources`).

A source raises `SourceError` (with a message naming the input) when it cannot start; a failure
part-way through becomes an `ErrorFrame` followed by the end of its frames, so what was already
produced is kept.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from streamfuse.frames import Frame, now_wall


class Source(ABC):
    def __init__(self, name: str, *, stream_id: str = "main") -> None:
        self.name = name
        self.stream_id = stream_id
        #: Media duration in seconds when known (files), else None.
        self.duration_s: float | None = None

    async def open(self) -> None:
        """Validate and open the input; raise `SourceError` with a clear message if it can't."""

    @abstractmethod
    def frames(self) -> AsyncIterator[Frame]:
        """Yield frames in media-time order."""

    async def close(self) -> None:
        """Release the input."""


class Pacer:
    """Releases media time at wall-clock speed (``--realtime``) or as fast as possible."""

    def __init__(self, realtime: bool, speed: float = 1.0) -> None:
        self.realtime = realtime
        self.speed = speed
        self._t0_wall: float | None = None
        self._t0_media = 0.0

    async def wait_until(self, t_media: float) -> float:
        """Sleep until `t_media` is due; return the wall time the frame is released at."""
        now = now_wall()
        if not self.realtime:
            return now
        if self._t0_wall is None:
            self._t0_wall, self._t0_media = now, t_media
            return now
        due = self._t0_wall + (t_media - self._t0_media) / self.speed
        if due > now:
            await asyncio.sleep(due - now)
            return due
        return now
