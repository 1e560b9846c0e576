"""Bounded frame queues with an explicit overload policy.

`BLOCK` makes the producer wait (lossless, back-pressure); `DROP_OLDEST` discards the oldest
queued data frame to admit a new one; `LATEST_ONLY` keeps only the newest data frame. System
frames (end of stream, errors) are never dropped and are always admitted.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque

from streamfuse.errors import ConfigError
from streamfuse.frames import Frame, SystemFrame


class OverloadPolicy(enum.StrEnum):
    BLOCK = "block"
    DROP_OLDEST = "drop-oldest"
    LATEST_ONLY = "latest-only"


class FrameQueue:
    """An asyncio queue of frames bounded by `maxsize` data frames under `policy`."""

    def __init__(self, maxsize: int, policy: OverloadPolicy = OverloadPolicy.BLOCK) -> None:
        if maxsize < 1:
            raise ConfigError(f"queue maxsize must be >= 1, got {maxsize}")
        self.policy = OverloadPolicy(policy)
        self.maxsize = 1 if self.policy is OverloadPolicy.LATEST_ONLY else maxsize
        self._items: deque[Frame] = deque()
        self._data_count = 0
        self._changed = asyncio.Condition()
        self.dropped = 0
        self.high_water = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def data_depth(self) -> int:
        """Number of queued data (non-system) frames."""
        return self._data_count

    def _drop_oldest_data(self) -> Frame | None:
        for i, item in enumerate(self._items):
            if not isinstance(item, SystemFrame):
                del self._items[i]
                self._data_count -= 1
                self.dropped += 1
                return item
        return None

    async def put(self, frame: Frame) -> list[Frame]:
        """Enqueue `frame`; returns the frames the policy dropped to make room."""
        dropped: list[Frame] = []
        async with self._changed:
            if not isinstance(frame, SystemFrame):
                if self.policy is OverloadPolicy.BLOCK:
                    await self._changed.wait_for(lambda: self._data_count < self.maxsize)
                else:
                    while self._data_count >= self.maxsize:
                        old = self._drop_oldest_data()
                        if old is None:
                            break
                        dropped.append(old)
                self._data_count += 1
            self._items.append(frame)
            self.high_water = max(self.high_water, self._data_count)
            self._changed.notify_all()
        return dropped

    async def discard_data(self) -> list[Frame]:
        """Remove every queued data frame (system frames stay) and wake blocked producers."""
        async with self._changed:
            gone = [f for f in self._items if not isinstance(f, SystemFrame)]
            self._items = deque(f for f in self._items if isinstance(f, SystemFrame))
            self._data_count = 0
            self._changed.notify_all()
        return gone

    async def get(self) -> Frame:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            frame = self._items.popleft()
            if not isinstance(frame, SystemFrame):
                self._data_count -= 1
            self._changed.notify_all()
            return frame
