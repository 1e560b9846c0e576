"""The pipeline runtime: stage base class, bounded queues with overload policies, the runner."""

from streamfuse.pipeline.queues import FrameQueue, OverloadPolicy
from streamfuse.pipeline.runner import Pipeline
from streamfuse.pipeline.stage import Stage, StageStats

__all__ = ["FrameQueue", "OverloadPolicy", "Pipeline", "Stage", "StageStats"]
