"""Refinement of a key frame the keep policy had to send coarser: the finest coding after it.

On a slow link the deadline policy sends a key frame that does not fit its budget coarser
(smaller, fewer grey levels) so that it arrives in time. Text sent too small reads worse, and
the link is idle again once that message is through. `Refiner` then sends the same frame at its
finest coding (a noisy frame: `refine_noisy_text_px` at `refine_noisy_grey_levels`), in parts
of at most `PART_SHARE` of the deadline budget: part j holds the text patches of the j-th
horizontal band of the frame, and copies every other patch from the cloud's copy of the frame
(the coarse message, then the parts before it). A part is sent only once the message it copies
from is acknowledged (the cloud holds it: a part sent earlier was undecodable whenever its base
was lost), so one part at most is in flight, and it is coded while its base is on its way. Key
frames come first: a new key frame stops the refinement, and the part still waiting (in part)
for the sender's pacer is withdrawn (`abandon`: the cloud skips it at once), so the new picture
waits behind no refinement bytes but the few already through the pacer. A message lost past
its deadline ends the refinement. The cloud needs nothing new: a part is a key-frame message of
the same frame, which its OCR reads again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from streamfuse.transport.config import TransportConfig
from streamfuse.transport.patches import PatchMessage, Reference, decode_patches, encode_patches
from streamfuse.transport.udp import LinkEstimate
from streamfuse.vision.frames import BBox, KeyFrame


class _Sender(Protocol):
    def estimate(self) -> LinkEstimate: ...

    def lost(self, seq: int) -> bool: ...

    def abandon(self, seq: int) -> bool: ...

    async def wait_acked(self, seq: int, timeout_s: float) -> bool: ...


#: `send(key, message, rebuilt_grey) -> sequence`: send one part (the caller books it).
SendPart = Callable[[KeyFrame, PatchMessage, np.ndarray], int]
#: Budget in bytes of one message on the link now (None: no limit known).
Budget = Callable[[LinkEstimate], float | None]
#: `await work(fn, *args)`: run blocking `fn(*args)` off the event loop (the edge books the
#: time as its busy time; default `asyncio.to_thread`).
Work = Callable[..., Awaitable[Any]]

#: A part's bytes vary with where the text lies; parts are sized for this much more than the
#: budget divided evenly.
_PART_MARGIN = 1.25
#: A part takes at most this share of the deadline budget (a part that a new key frame
#: overtakes is withdrawn, but what of it left the pacer is still ahead of that frame).
PART_SHARE = 0.6


def refine_config(config: TransportConfig) -> TransportConfig:
    """`config` as a refinement codes a frame: a noisy one at `refine_noisy_text_px` and
    `refine_noisy_grey_levels` (clean frames as configured)."""
    return config.model_copy(
        update={
            "noisy_text_px": config.refine_noisy_text_px,
            "noisy_grey_levels": config.refine_noisy_grey_levels,
        }
    )


class Refiner:
    """Sends the finest coding of the last key frame sent coarser, band by band (see the
    module docstring). `start` after sending a coarse key frame; `stop` before sending a new
    one; `wait` at the end of the stream."""

    def __init__(
        self,
        sender: _Sender,
        config: TransportConfig,
        budget: Budget,
        send: SendPart,
        *,
        max_parts: int = 10,
        work: Work = asyncio.to_thread,
    ) -> None:
        self.sender = sender
        self.work = work
        self.config = config
        self.budget = budget
        self.send = send
        self.max_parts = max_parts
        self.parts_sent = 0
        self.frames_refined = 0
        #: Parts withdrawn (`stop`) before all of them were sent.
        self.parts_abandoned = 0
        self._task: asyncio.Task[None] | None = None
        self._last_part: int | None = None  # the part in flight, if any

    def start(self, key: KeyFrame, boxes: list[BBox], seq: int, rebuilt: np.ndarray) -> None:
        """Refine `key` (sent coarser as message `seq`, which the cloud rebuilds as
        `rebuilt`, grey) once the cloud has it."""
        self.stop()
        self._task = asyncio.create_task(self._run(key, boxes, seq, Reference(key.index, rebuilt)))

    def stop(self) -> int | None:
        """Send no more parts of the frame being refined, and withdraw the part in flight if
        some of it still waits to be sent; returns that part's sequence (the cloud will not
        hold it), else None."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        seq, self._last_part = self._last_part, None
        if seq is not None and self.sender.abandon(seq):
            self.parts_abandoned += 1
            return seq
        return None

    async def wait(self, timeout_s: float) -> None:
        """Let the refinement under way finish (at most `timeout_s`, then stop it)."""
        task = self._task
        if task is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        if not task.done():
            task.cancel()
        self._task = self._last_part = None  # the parts sent go out whole

    async def _run(self, key: KeyFrame, boxes: list[BBox], seq: int, ref: Reference) -> None:
        config = refine_config(self.config)
        full = await self.work(encode_patches, key, boxes, 1.0, config)
        parts = 0
        base = seq  # the coarse message, then each part
        for j in range(self.max_parts):
            if self.sender.lost(base):
                return  # the cloud does not hold what the next part copies from
            if not parts:
                # The budget of an idle link: the coarse message is still on its way.
                idle = dataclasses.replace(self.sender.estimate(), queued_bytes=0)
                budget = self.budget(idle)
                share = 0.0 if not budget else len(full.payload) / (PART_SHARE * budget)
                parts = max(1, math.ceil(_PART_MARGIN * share))
                if parts > self.max_parts:
                    return  # the link is too slow to refine this frame before the next
            band = (j / parts, (j + 1) / parts)
            message = await self.work(encode_patches, key, boxes, 1.0, config, ref, 1.0, None, band)
            rebuilt = await self.work(
                decode_patches,
                message.payload,
                message.shape,
                stream_id=key.stream_id,
                arrival_wall=0.0,
                references={ref.index: ref.grey},
            )
            grey = rebuilt.image[..., 0]
            # Coded while its base was on its way; sent once the cloud holds that base.
            if not await self.sender.wait_acked(base, config.deadline_s + 1.0):
                return
            base = self._last_part = self.send(key, message, grey)
            self.parts_sent += 1
            ref = Reference(key.index, grey)
            if j + 1 == parts:
                self.frames_refined += 1
                return


__all__ = ["Refiner", "refine_config"]
