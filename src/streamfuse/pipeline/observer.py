"""Pipeline observers: a typed hook on everything the runner does with frames.

An `Observer` attached with `Pipeline.observe` is told, on the event loop and in order, of every
frame a node creates (`on_frame`: a source's frames, a stage's outputs, an error the runner made
of a failure; a system frame merely passing through a stage is not reported again), every frame
an overload policy dropped (`on_drop`), and every `process`/`flush` call a stage starts
(`on_processing`) and finishes (`on_processed`, with the time the stage itself worked). Both
calls of a pair, and the `on_frame` of every output in between, run in that stage's task, so a
context variable set in `on_processing` is seen by the stage's code until `on_processed`. QoS
signals, the run statistics, the terminal view and tracing subscribe here instead of parsing
sink output. Callbacks must be cheap and must not block; an observer that raises is logged and
detached, never the pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from streamfuse.frames import Frame
from streamfuse.pipeline.queues import OverloadPolicy

if TYPE_CHECKING:
    from streamfuse.pipeline.source import Source
    from streamfuse.pipeline.stage import Stage


@dataclass(frozen=True, slots=True)
class FrameEmitted:
    """`producer` (a source or stage) created `frame`; `wall` is when (monotonic s)."""

    producer: Source | Stage
    frame: Frame
    wall: float


@dataclass(frozen=True, slots=True)
class FramesDropped:
    """`policy` at `consumer`'s input dropped `frames` to make room."""

    consumer: Stage
    frames: Sequence[Frame]
    policy: OverloadPolicy


@dataclass(frozen=True, slots=True)
class FrameProcessing:
    """`stage` starts a `process` (or, with `flushed`, its `flush`) call on `cause` at `wall`
    (monotonic s)."""

    stage: Stage
    cause: Frame
    wall: float
    flushed: bool = False


@dataclass(frozen=True, slots=True)
class FrameProcessed:
    """`stage` finished one `process` (or, with `flushed`, its `flush`) call on `cause`.

    `busy_s` is the stage's own work, not time spent waiting for downstream queues; `failed`
    says the call raised (the runner turned it into an `ErrorFrame`).
    """

    stage: Stage
    cause: Frame
    busy_s: float
    failed: bool = False
    flushed: bool = False


class Observer:
    """Subclass and override the callbacks you need (all default to nothing)."""

    def on_start(self, wall: float) -> None:
        """The pipeline started streaming (after every stage's `setup`)."""

    def on_frame(self, event: FrameEmitted) -> None:
        """A node created a frame."""

    def on_drop(self, event: FramesDropped) -> None:
        """An overload policy dropped frames."""

    def on_processing(self, event: FrameProcessing) -> None:
        """A stage starts one call."""

    def on_processed(self, event: FrameProcessed) -> None:
        """A stage finished one call."""

    def on_end(self, wall: float) -> None:
        """Every source ended and every stage drained (or the run was aborted)."""


__all__ = ["FrameEmitted", "FrameProcessed", "FrameProcessing", "FramesDropped", "Observer"]
