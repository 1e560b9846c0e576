"""Quality of service: resolution ladder, feedback controllers and jump suppression.

The vision path asks a `ResolutionScheduler` (controller + `JumpSuppressor`) which rung, ROI
ratio and OCR interval to use, and feeds it `Feedback` snapshots.
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
from streamfuse.qos.feedback import Feedback, FeedbackTracker, SystemProbe
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
    "JitterMeter",
    "JumpSuppressionConfig",
    "JumpSuppressor",
    "Ladder",
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
