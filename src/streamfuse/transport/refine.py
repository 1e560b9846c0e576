"""Refinement of a key frame the keep policy had to send coarser: the finest coding after it.

On a slow link the deadline policy sends a key frame that does not fit its budget coarser
(smaller, fewer grey levels) so that it arrives in time. Text sent too small reads worse, and
the link is idle again once that message is through. `Refiner` then sends the same frame at its
finest coding (a noisy frame: `refine_noisy_text_px` at `refine_noisy_grey_levels`), in parts
of at most `PART_SHARE` of the deadline budget: part j holds the text patches of the j-th
horizontal band of the frame, and copies every other patch from the cloud's copy of the frame
(the coarse message, then the parts before it; delivery in sequence order makes the cloud hold
it when the part arrives). A part is sent when it fits the deadline budget left behind what is
queued (else once the message before it is acknowledged), and at most two are in flight (part
j waits for the acknowledgement of part j - 2), so the link stays busy without a queue that a
new key frame would wait behind. A new key frame stops the refinement (the new picture goes
first, behind at most the parts in flight); a message lost past its deadline ends it. The cloud
needs nothing new: a part is a key-frame message of the same frame, which its OCR reads again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from streamfuse.transport.config import TransportConfig
from streamfuse.transport.patches import PatchMessage, Reference, decode_patches, encode_patches
from streamfuse.transport.udp import LinkEstimate
from streamfuse.vision.frames import BBox, KeyFrame


class _Sender(Protocol):
    def estimate(self) -> LinkEstimate: ...

    def lost(self, seq: int) -> bool: ...

    async def wait_acked(self, seq: int, timeout_s: float) -> bool: ...


#: `send(key, message, rebuilt_grey) -> sequence`: send one part (the caller books it).
SendPart = Callable[[KeyFrame, PatchMessage, np.ndarray], int]
#: Budget in bytes of one message on the link now (None: no limit known).
Budget = Callable[[LinkEstimate], float | None]

#: A part's bytes vary with where the text lies; parts are sized for this much more than the
#: budget divided evenly.
_PART_MARGIN = 1.25
#: A part takes at most this share of the deadline budget (two are in flight: a key frame
#: sent meanwhile finds at most ~1.2 budgets queued ahead, ~0.6 on average).
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
    ) -> None:
        self.sender = sender
        self.config = config
        self.budget = budget
        self.send = send
        self.max_parts = max_parts
        self.parts_sent = 0
        self.frames_refined = 0
        self._task: asyncio.Task[None] | None = None

    def start(self, key: KeyFrame, boxes: list[BBox], seq: int, rebuilt: np.ndarray) -> None:
        """Refine `key` (sent coarser as message `seq`, which the cloud rebuilds as
        `rebuilt`, grey) once the cloud has it."""
        self.stop()
        self._task = asyncio.create_task(self._run(key, boxes, seq, Reference(key.index, rebuilt)))

    def stop(self) -> None:
        """Send no more parts of the frame being refined."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None

    async def wait(self, timeout_s: float) -> None:
        """Let the refinement under way finish (at most `timeout_s`, then stop it)."""
        task = self._task
        if task is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), timeout_s)
        self.stop()

    async def _run(self, key: KeyFrame, boxes: list[BBox], seq: int, ref: Reference) -> None:
        config = refine_config(self.config)
        full = await asyncio.to_thread(encode_patches, key, boxes, 1.0, config)
        parts = 0
        sent = [seq]  # the coarse message, then each part
        for j in range(self.max_parts):
            # Two in flight at most; a message lost ends it (the next part could not be
            # rebuilt: the cloud would not hold what it copies from).
            if any(self.sender.lost(q) for q in sent[-2:]):
                return
            if len(sent) >= 2 and not await self.sender.wait_acked(
                sent[-2], config.deadline_s + 1.0
            ):
                return
            if not parts:
                # The budget of an idle link: the coarse message is still on its way.
                idle = dataclasses.replace(self.sender.estimate(), queued_bytes=0)
                budget = self.budget(idle)
                share = 0.0 if not budget else len(full.payload) / (PART_SHARE * budget)
                parts = max(1, math.ceil(_PART_MARGIN * share))
                if parts > self.max_parts:
                    return  # the link is too slow to refine this frame before the next
            band = (j / parts, (j + 1) / parts)
            message = await asyncio.to_thread(
                encode_patches, key, boxes, 1.0, config, ref, 1.0, None, band
            )
            rebuilt = await asyncio.to_thread(
                decode_patches,
                message.payload,
                message.shape,
                stream_id=key.stream_id,
                arrival_wall=0.0,
                references={ref.index: ref.grey},
            )
            grey = rebuilt.image[..., 0]
            # Each part within its own deadline: while it does not fit the budget left behind
            # what is queued (the coarse message, the part before), wait for that to land.
            budget = self.budget(self.sender.estimate())
            late = budget is not None and len(message.payload) > budget
            if late and not await self.sender.wait_acked(sent[-1], config.deadline_s + 1.0):
                return
            sent.append(self.send(key, message, grey))
            self.parts_sent += 1
            ref = Reference(key.index, grey)
            if j + 1 == parts:
                self.frames_refined += 1
                return


__all__ = ["Refiner", "refine_config"]
