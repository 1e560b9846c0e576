"""Wires sources and stages into a graph of bounded queues and runs it.

Edges are declared with `link(producer, consumer, policy=..., maxsize=...)`; each consumer has
one input queue whose overload policy its links declare. A produced frame goes to every linked
consumer that accepts its type; system frames (errors, end of stream) reach every consumer and
pass through stages that do not consume them, once per consumer even where several paths join
(an error is delivered once; end of stream is counted per producer). End of stream drains the
graph in order: a stage flushes once every one of its producers has ended. A failure on one
frame becomes an `ErrorFrame` and the stage goes on. Observers (`observe`) see every frame
created, dropped and processed; the stages' live statistics are one of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from streamfuse.errors import PipelineError
from streamfuse.frames import EndOfStream, ErrorFrame, Frame, SystemFrame, now_wall
from streamfuse.pipeline.observer import (
    FrameEmitted,
    FrameProcessed,
    FrameProcessing,
    FramesDropped,
    Observer,
)
from streamfuse.pipeline.queues import FrameQueue, OverloadPolicy
from streamfuse.pipeline.source import Source
from streamfuse.pipeline.stage import Stage, StatsObserver
from streamfuse.telemetry.metrics import unwatch_queues, watch_queues

log = logging.getLogger(__name__)

Node = Source | Stage


class _Seen:
    """The system frames a consumer was already given (bounded: they are rare)."""

    def __init__(self, maxlen: int = 4096) -> None:
        self._order: deque[int] = deque()
        self._ids: set[int] = set()
        self._maxlen = maxlen

    def add(self, uid: int) -> bool:
        """Record `uid`; False if it was already there."""
        if uid in self._ids:
            return False
        if len(self._order) >= self._maxlen:
            self._ids.discard(self._order.popleft())
        self._order.append(uid)
        self._ids.add(uid)
        return True


@dataclass
class _Inbox:
    queue: FrameQueue
    producers: list[Node] = field(default_factory=list)
    seen: _Seen = field(default_factory=_Seen)


class Pipeline:
    """A running graph: sources -> stages -> sinks."""

    def __init__(self, name: str = "pipeline") -> None:
        self.name = name
        self._sources: list[Source] = []
        self._stages: list[Stage] = []
        self._inbox: dict[int, _Inbox] = {}
        self._consumers: dict[int, list[Stage]] = {}
        self._stop = asyncio.Event()
        self.started_wall: float | None = None
        self.finished_wall: float | None = None
        #: Latest media time each source has released, by stream id (progress reporting).
        self.media_time: dict[str, float] = {}
        # A tuple, replaced on change: notifying (several times per frame) never copies it.
        self._observers: tuple[Observer, ...] = (StatsObserver(),)

    def observe(self, observer: Observer) -> Pipeline:
        """Attach `observer` (see `streamfuse.pipeline.observer`); before `run`."""
        self._observers = (*self._observers, observer)
        return self

    @property
    def observers(self) -> tuple[Observer, ...]:
        return self._observers

    # -- building -------------------------------------------------------------------------
    def link(
        self,
        producer: Node,
        consumer: Stage,
        *,
        policy: OverloadPolicy = OverloadPolicy.BLOCK,
        maxsize: int = 16,
        max_age_s: float | None = None,
    ) -> Pipeline:
        """Send `producer`'s frames to `consumer` through a bounded queue (`max_age_s`: the
        bound of a `SHED_LATE` policy, seconds of arrival time)."""
        for node in (producer, consumer):
            if isinstance(node, Source):
                if node not in self._sources:
                    self._sources.append(node)
            elif node not in self._stages:
                self._stages.append(node)
        inbox = self._inbox.get(id(consumer))
        if inbox is None:
            inbox = _Inbox(FrameQueue(maxsize, policy, max_age_s=max_age_s))
            self._inbox[id(consumer)] = inbox
            consumer._bind_input(inbox.queue)
        elif inbox.queue.policy is not OverloadPolicy(policy):
            raise PipelineError(
                f"stage {consumer.name!r} already has a {inbox.queue.policy} input; "
                f"cannot also link it as {policy}"
            )
        inbox.producers.append(producer)
        self._consumers.setdefault(id(producer), []).append(consumer)
        return self

    @property
    def stages(self) -> list[Stage]:
        return list(self._stages)

    @property
    def sources(self) -> list[Source]:
        return list(self._sources)

    def queue_of(self, stage: Stage) -> FrameQueue:
        return self._inbox[id(stage)].queue

    def producers_of(self, stage: Stage) -> list[Node]:
        """The nodes linked into `stage`, in link order."""
        inbox = self._inbox.get(id(stage))
        return list(inbox.producers) if inbox is not None else []

    def consumers_of(self, node: Node) -> list[Stage]:
        """The stages `node` is linked to, in link order."""
        return list(self._consumers.get(id(node), []))

    def _validate(self) -> None:
        if not self._sources:
            raise PipelineError("pipeline has no source")
        for stage in self._stages:
            if id(stage) not in self._inbox:
                raise PipelineError(f"stage {stage.name!r} has no input link")
        # Kahn's algorithm: a cycle would never drain at end of stream.
        indeg = {id(s): len(self._inbox[id(s)].producers) for s in self._stages}
        ready: list[Node] = list(self._sources)
        seen = 0
        while ready:
            node = ready.pop()
            for c in self._consumers.get(id(node), []):
                indeg[id(c)] -= 1
                if indeg[id(c)] == 0:
                    ready.append(c)
                    seen += 1
        if seen != len(self._stages):
            raise PipelineError("pipeline graph has a cycle")

    # -- running --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """End the sources now; everything already read drains to the sinks."""
        self._stop.set()

    async def stop_reading(self) -> int:
        """End the sources now and discard the input they queued that no stage has taken
        yet (a stop that does not wait for a read-ahead backlog: unprocessed input is not an
        event yet, and a resumed run reads it again); what stages hold still drains to the
        sinks. Returns the number of frames discarded."""
        self._stop.set()
        discarded = 0
        for stage in self._stages:
            inbox = self._inbox[id(stage)]
            if inbox.producers and all(isinstance(p, Source) for p in inbox.producers):
                discarded += len(await inbox.queue.discard_data())
        return discarded

    async def run(self) -> None:
        """Run until every source ended and every stage drained. Cancel to abort."""
        self._validate()
        watch_queues(self)
        for stage in self._stages:
            await stage.setup()
        self.started_wall = now_wall()
        for stage in self._stages:
            stage.started_wall = self.started_wall
        self._notify("on_start", self.started_wall)
        try:
            async with asyncio.TaskGroup() as tg:
                for stage in self._stages:
                    tg.create_task(self._run_stage(stage), name=f"stage:{stage.name}")
                for source in self._sources:
                    tg.create_task(self._pump(source), name=f"source:{source.name}")
        finally:
            self.finished_wall = now_wall()
            for stage in self._stages:
                # Teardown may still need the stage's worker thread (closing a model on it).
                try:
                    await stage.teardown()
                except Exception:
                    log.exception("teardown of %s failed", stage.name)
                finally:
                    stage._shutdown_executor()
            self._notify("on_end", self.finished_wall)
            unwatch_queues(self)

    def _notify(self, hook: str, event: object) -> None:
        for observer in self._observers:
            try:
                getattr(observer, hook)(event)
            except Exception:
                log.exception("observer %r failed and was detached", observer)
                self._observers = tuple(o for o in self._observers if o is not observer)

    async def _emit(self, producer: Node, frame: Frame, *, created: bool = True) -> None:
        """Send `frame` to `producer`'s consumers; `created`: the producer made it (observers
        are told), rather than passing a system frame through."""
        if created:
            self._notify("on_frame", FrameEmitted(producer, frame, now_wall()))
        system = isinstance(frame, SystemFrame)
        for consumer in self._consumers.get(id(producer), []):
            if not (system or consumer.accepts(frame)):
                continue
            inbox = self._inbox[id(consumer)]
            if (
                isinstance(frame, SystemFrame)
                and not isinstance(frame, EndOfStream)
                and not inbox.seen.add(frame.uid)
            ):
                continue  # already delivered along another path into this consumer
            dropped = await inbox.queue.put(frame)
            if dropped:
                lost = FramesDropped(consumer, tuple(dropped), inbox.queue.policy)
                self._notify("on_drop", lost)
            consumer.stats.queue_depth = inbox.queue.data_depth

    async def _pump(self, source: Source) -> None:
        stream = source.frames()
        try:
            async for frame in _until(stream, self._stop):
                self.media_time[source.stream_id] = frame.t_media
                await self._emit(source, frame)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a source failing part-way: keep what was produced
            log.warning("source %s failed: %s", source.name, exc)
            await self._emit(
                source,
                ErrorFrame(stream_id=source.stream_id, stage=source.name, message=str(exc)),
            )
        finally:
            await _aclose(stream)
            await source.close()
        await self._emit(source, EndOfStream(stream_id=source.stream_id))

    async def _run_stage(self, stage: Stage) -> None:
        inbox = self._inbox[id(stage)]
        ended = 0
        while True:
            frame = await inbox.queue.get()
            stage.stats.queue_depth = inbox.queue.data_depth
            if isinstance(frame, EndOfStream):
                ended += 1
                if ended < len(inbox.producers):
                    continue
                await self._drive(stage, stage.flush(), frame, flushed=True)
                await self._emit(stage, frame, created=False)
                return
            if not stage.accepts(frame):
                await self._emit(stage, frame, created=False)  # a system frame passing through
                continue
            await self._drive(stage, stage.process(frame), frame)

    async def _drive(
        self, stage: Stage, outputs: AsyncIterator[Frame], cause: Frame, *, flushed: bool = False
    ) -> None:
        """Run one `process`/`flush` call, timing the stage's own work (not downstream waits)."""
        self._notify("on_processing", FrameProcessing(stage, cause, now_wall(), flushed))
        busy = 0.0
        failed = False
        t = time.perf_counter()
        try:
            async for out in outputs:
                busy += time.perf_counter() - t
                await self._emit(stage, out)
                t = time.perf_counter()
            busy += time.perf_counter() - t
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            busy += time.perf_counter() - t
            failed = True
            log.warning("stage %s failed on a frame: %s", stage.name, exc)
            log.debug("stage failure detail", exc_info=True)
            await self._emit(
                stage,
                ErrorFrame(
                    stream_id=cause.stream_id,
                    t_media=cause.t_media,
                    arrival_wall=cause.arrival_wall,
                    stage=stage.name,
                    message=f"{type(exc).__name__}: {exc}",
                ),
            )
        finally:
            await _aclose(outputs)
        self._notify("on_processed", FrameProcessed(stage, cause, busy, failed, flushed))

    def snapshot(self) -> dict[str, Any]:
        """Per-stage live figures (frames, errors, drops, queue depth, latency p50/p95)."""
        return {stage.name: stage.stats.snapshot() for stage in self._stages}


async def _until(stream: AsyncIterator[Frame], stop: asyncio.Event) -> AsyncIterator[Frame]:
    async for frame in stream:
        if stop.is_set():
            return
        yield frame


async def _aclose(it: AsyncIterator[Frame]) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        await aclose()
