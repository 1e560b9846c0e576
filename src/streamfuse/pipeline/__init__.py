"""The pipeline runtime: sources and stages, bounded queues with overload policies, the runner,
and observers of what the runner does."""

from streamfuse.pipeline.observer import (
    FrameEmitted,
    FrameProcessed,
    FrameProcessing,
    FramesDropped,
    Observer,
)
from streamfuse.pipeline.queues import FrameQueue, OverloadPolicy
from streamfuse.pipeline.runner import Pipeline
from streamfuse.pipeline.source import Pacer, Source
from streamfuse.pipeline.stage import Stage, StageStats, StatsObserver

__all__ = [
    "FrameEmitted",
    "FrameProcessed",
    "FrameProcessing",
    "FrameQueue",
    "FramesDropped",
    "Observer",
    "OverloadPolicy",
    "Pacer",
    "Pipeline",
    "Source",
    "Stage",
    "StageStats",
    "StatsObserver",
]
