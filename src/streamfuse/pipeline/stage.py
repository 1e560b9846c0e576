"""The stage base class: a subclass writes only its own work.

A `Stage` implements `process(frame)` as an async generator yielding output frames, and may
override `setup`, `flush` (end of stream: emit what is buffered) and `teardown`. The base class
(with the runner) owns the input queue, metrics, error handling and the worker thread that model
calls run on (`await self.run_blocking(fn, ...)`), so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from streamfuse.frames import Frame
from streamfuse.pipeline.observer import FrameProcessed, FramesDropped, Observer
from streamfuse.pipeline.queues import FrameQueue, OverloadPolicy
from streamfuse.stats import percentiles
from streamfuse.telemetry.metrics import ModelInfo, instruments

T = TypeVar("T")


@dataclass
class StageStats:
    """Live counters of one stage, read by the terminal view and `stats` events."""

    frames: int = 0
    errors: int = 0
    dropped: int = 0
    queue_depth: int = 0
    busy_s: float = 0.0
    recent_latency_s: deque[float] = field(default_factory=lambda: deque(maxlen=256))

    def latency_quantiles_ms(self) -> dict[str, float]:
        if not self.recent_latency_s:
            return {"p50": 0.0, "p95": 0.0}
        return percentiles(1000.0 * s for s in self.recent_latency_s)

    def snapshot(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "errors": self.errors,
            "dropped": self.dropped,
            "queue_depth": self.queue_depth,
            "busy_s": round(self.busy_s, 3),
            "latency_ms": {k: round(v, 1) for k, v in self.latency_quantiles_ms().items()},
        }


class StatsObserver(Observer):
    """Keeps every stage's `StageStats` and the stage metrics (the runner attaches it first)."""

    def on_processed(self, event: FrameProcessed) -> None:
        stats = event.stage.stats
        attrs = {"stage": event.stage.name}
        ins = instruments()
        stats.frames += 1
        stats.busy_s += event.busy_s
        stats.recent_latency_s.append(event.busy_s)
        if event.failed:
            stats.errors += 1
            ins.stage_errors.add(1, attrs)
        ins.stage_latency.record(event.busy_s, attrs)
        ins.stage_frames.add(1, attrs)

    def on_drop(self, event: FramesDropped) -> None:
        event.consumer.stats.dropped += len(event.frames)
        instruments().queue_dropped.add(
            len(event.frames), {"stage": event.consumer.name, "policy": str(event.policy)}
        )


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Stage(ABC):
    """One step of the pipeline. Subclasses set `input_types` and implement `process`."""

    #: Frame classes this stage consumes (isinstance match). Other system frames pass through.
    input_types: ClassVar[tuple[type[Frame], ...]] = (Frame,)

    def __init__(self, name: str | None = None, *, threads: int = 1) -> None:
        self.name = name or _snake(type(self).__name__)
        self.stats = StageStats()
        self._threads = threads
        self._executor: ThreadPoolExecutor | None = None
        self._owns_executor = True
        self._backlog: Callable[[], int] = lambda: 0
        self._input_policy = OverloadPolicy.BLOCK
        #: Wall time (monotonic) the pipeline started streaming, set by the runner.
        self.started_wall: float | None = None

    # -- for subclasses ---------------------------------------------------------------------
    async def setup(self) -> None:
        """Load models and open resources (runs before the first frame)."""

    @abstractmethod
    def process(self, frame: Frame) -> AsyncIterator[Frame]:
        """Handle one input frame; yield zero or more output frames."""

    async def flush(self) -> AsyncIterator[Frame]:
        """End of stream: yield whatever is still buffered. Default: nothing."""
        return
        yield  # pragma: no cover - makes this an async generator

    async def teardown(self) -> None:
        """Release resources (runs after the stage finished or was cancelled)."""

    def model_info(self) -> ModelInfo | None:
        """The model this stage runs, once set up (telemetry reports it). Default: none."""
        return None

    async def run_blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call (a model, a decoder) on this stage's worker thread."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self._threads, thread_name_prefix=f"sf-{self.name}"
            )
        loop = asyncio.get_running_loop()
        # The caller's context goes with the call (as `asyncio.to_thread` does), so what the
        # model code logs carries the trace of the frame being processed.
        context = contextvars.copy_context()
        return await loop.run_in_executor(self._executor, lambda: context.run(fn, *args, **kwargs))

    def share_executor(self, executor: ThreadPoolExecutor) -> None:
        """Run this stage's blocking calls on `executor`, owned (and shut down) by the caller.

        Several streams' model stages sharing one pool with a worker per core take their
        calls first come, first served, instead of time-slicing the cores among all of them:
        when four streams need a read at the same instant on two cores, two finish after one
        read's time and two after two, rather than all four after nearly two.
        """
        self._executor = executor
        self._owns_executor = False

    @property
    def backlog(self) -> int:
        """Data frames waiting at this stage's input right now (lets a stage coalesce work)."""
        return self._backlog()

    @property
    def input_policy(self) -> OverloadPolicy:
        """The overload policy of this stage's input queue. A stage may skip superseded work
        only when the policy is not BLOCK: a BLOCK link promises that nothing is lost."""
        return self._input_policy

    # -- for the runner ---------------------------------------------------------------------
    def accepts(self, frame: Frame) -> bool:
        return isinstance(frame, self.input_types)

    def _bind_input(self, queue: FrameQueue) -> None:
        self._backlog = lambda: queue.data_depth
        self._input_policy = queue.policy

    def _shutdown_executor(self) -> None:
        if self._executor is not None and self._owns_executor:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
