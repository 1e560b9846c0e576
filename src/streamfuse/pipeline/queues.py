"""Bounded frame queues with an explicit overload policy.

`BLOCK` makes the producer wait (lossless, back-pressure); `DROP_OLDEST` discards the oldest
queued data frame to admit a new one; `LATEST_ONLY` keeps only the newest data frame;
`SHED_LATE` blocks like `BLOCK` when full, and when the oldest queued data frame arrived more
than `max_age_s` before the one being admitted (the consumer is that far behind a live input),
discards every queued data frame that arrived more than `max_age_s / 2` before it: the consumer
skips a contiguous stretch and goes on from recent input, rather than getting every frame late
or a frame here and there. System frames (end of stream, errors) are never dropped and are
always admitted.
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
    SHED_LATE = "shed-late"


class FrameQueue:
    """An asyncio queue of frames bounded by `maxsize` data frames under `policy`
    (`max_age_s`: the arrival-time bound of `SHED_LATE`)."""

    def __init__(
        self,
        maxsize: int,
        policy: OverloadPolicy = OverloadPolicy.BLOCK,
        *,
        max_age_s: float | None = None,
    ) -> None:
        if maxsize < 1:
            raise ConfigError(f"queue maxsize must be >= 1, got {maxsize}")
        self.policy = OverloadPolicy(policy)
        if (self.policy is OverloadPolicy.SHED_LATE) != (max_age_s is not None):
            raise ConfigError(f"max_age_s goes with the {OverloadPolicy.SHED_LATE} policy only")
        if max_age_s is not None and max_age_s <= 0:
            raise ConfigError(f"queue max_age_s must be > 0, got {max_age_s}")
        self.max_age_s = max_age_s
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

    def _shed_late(self, newest: Frame) -> list[Frame]:
        """`SHED_LATE`: the queued data frames to skip before admitting `newest`."""
        assert self.max_age_s is not None
        oldest = next((f for f in self._items if not isinstance(f, SystemFrame)), None)
        if oldest is None or newest.arrival_wall - oldest.arrival_wall <= self.max_age_s:
            return []
        cut = newest.arrival_wall - self.max_age_s / 2
        late = [f for f in self._items if not isinstance(f, SystemFrame) and f.arrival_wall < cut]
        gone = {id(f) for f in late}
        self._items = deque(f for f in self._items if id(f) not in gone)
        self._data_count -= len(late)
        self.dropped += len(late)
        return late

    async def put(self, frame: Frame) -> list[Frame]:
        """Enqueue `frame`; returns the frames the policy dropped to make room."""
        dropped: list[Frame] = []
        async with self._changed:
            if not isinstance(frame, SystemFrame):
                if self.policy is OverloadPolicy.SHED_LATE:
                    dropped = self._shed_late(frame)
                if self.policy in (OverloadPolicy.BLOCK, OverloadPolicy.SHED_LATE):
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
