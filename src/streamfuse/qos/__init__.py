"""Quality of service: resolution ladder, feedback controllers and jump suppression.

Domain-free control parts: a `ResolutionScheduler` (controller + `JumpSuppressor`) says which
rung, ROI ratio and interval to use and is fed `Feedback` snapshots. The vision policy that
drives it lives in `streamfuse.vision.adaptive`; nothing here imports a model package.
"""

from __future__ import annotations

from streamfuse.qos.controllers import (
    ArticleRule,
    ArticleRuleConfig,
    Decision,
    FeedbackController,
    FeedbackControllerConfig,
    ResolutionController,
    make_controller,
)
from streamfuse.qos.feedback import Feedback, FeedbackTracker, GpuStats, PsutilProbe, SystemProbe
from streamfuse.qos.ladder import DEFAULT_LADDER, Ladder, Rung, align_px
from streamfuse.qos.smoothing import (
    JitterMeter,
    JumpSuppressionConfig,
    JumpSuppressor,
    ResolutionScheduler,
    jitter_px_per_frame,
    text_consistency,
    text_similarity,
)

__all__ = [
    "DEFAULT_LADDER",
    "ArticleRule",
    "ArticleRuleConfig",
    "Decision",
    "Feedback",
    "FeedbackController",
    "FeedbackControllerConfig",
    "FeedbackTracker",
    "GpuStats",
    "JitterMeter",
    "JumpSuppressionConfig",
    "JumpSuppressor",
    "Ladder",
    "PsutilProbe",
    "ResolutionController",
    "ResolutionScheduler",
    "Rung",
    "SystemProbe",
    "align_px",
    "jitter_px_per_frame",
    "make_controller",
    "text_consistency",
    "text_similarity",
]
