"""`run_stage(stage, frames)`: run one stage over given frames with the real runner and return
what it emitted, so a test needs neither a source, a sink, nor the stage's private parts.

By default frames go in lockstep: the next frame is sent only when the stage finished the
previous one (as on a stream the stage keeps up with, so `backlog` is 0). `lockstep=False`
queues them as fast as the input takes them, for stages that coalesce waiting work.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

from streamfuse.frames import Frame
from streamfuse.pipeline.observer import FrameEmitted, FrameProcessed, Observer
from streamfuse.pipeline.queues import OverloadPolicy
from streamfuse.pipeline.runner import Pipeline
from streamfuse.pipeline.source import Source
from streamfuse.pipeline.stage import Stage


class _Feed(Source):
    """The given frames, in order; in lockstep each waits for the stage to finish the last."""

    def __init__(self, frames: list[Frame], stage: Stage, lockstep: bool) -> None:
        super().__init__("run_stage_feed", stream_id=frames[0].stream_id if frames else "main")
        self._frames = frames
        self._stage = stage
        self._lockstep = lockstep
        self.done = asyncio.Event()

    async def frames(self) -> AsyncIterator[Frame]:
        for frame in self._frames:
            self.done.clear()
            yield frame
            # A frame the stage does not consume passes through without a `process` call.
            if self._lockstep and self._stage.accepts(frame):
                await self.done.wait()


class _Recorder(Observer):
    def __init__(self, stage: Stage, feed: _Feed) -> None:
        self.stage = stage
        self.feed = feed
        self.emitted: list[Frame] = []

    def on_frame(self, event: FrameEmitted) -> None:
        if event.producer is self.stage:
            self.emitted.append(event.frame)

    def on_processed(self, event: FrameProcessed) -> None:
        if event.stage is self.stage:
            self.feed.done.set()


async def run_stage(
    stage: Stage,
    frames: Iterable[Frame],
    *,
    lockstep: bool = True,
    policy: OverloadPolicy = OverloadPolicy.BLOCK,
    maxsize: int = 16,
    max_age_s: float | None = None,
) -> list[Frame]:
    """Set up `stage`, feed it `frames` through a `policy` input of `maxsize` (`max_age_s`
    with `SHED_LATE`), flush it at end
    of stream and tear it down (all by `Pipeline.run`); return every frame the stage created,
    in order, including the `ErrorFrame`s the runner made of its failures (not the end of
    stream passing through)."""
    feed = _Feed(list(frames), stage, lockstep)
    recorder = _Recorder(stage, feed)
    pipeline = Pipeline(f"run_stage:{stage.name}").link(
        feed, stage, policy=policy, maxsize=maxsize, max_age_s=max_age_s
    )
    await pipeline.observe(recorder).run()
    return recorder.emitted


__all__ = ["run_stage"]
