"""The vision path: change detection selects key frames, OCR reads them.

`ChangeDetector` (VideoFrame -> KeyFrame, ~1 ms per frame) feeds `OcrStage` (KeyFrame -> one
`ocr` event per distinct on-screen text state; link it with `OverloadPolicy.LATEST_ONLY`). The OCR
stage asks a `ResolutionPolicy` per frame for the detector resolution, region of interest and
interval, and reports what each read cost, so adaptive controllers plug in: `VisionConfig.policy`
names one (`fixed | dynamic | article`) and `streamfuse.vision.adaptive.make_policy` builds it.
"""

from __future__ import annotations

from streamfuse.vision.change import ChangeDecision, ChangeDetector, ChangeTracker, thumbnail
from streamfuse.vision.config import (
    ArticlePolicy,
    ChangeDetectorConfig,
    DynamicPolicy,
    FixedPolicy,
    OcrConfig,
    PolicyConfig,
    PolicyKind,
    VisionConfig,
)
from streamfuse.vision.frames import BBox, KeyFrame
from streamfuse.vision.layout import CELL_SEPARATOR, LayoutConfig, layout, reading_order
from streamfuse.vision.ocr import (
    OcrEngine,
    OcrLine,
    OcrReading,
    OcrStage,
    RapidOcrEngine,
    normalize_text,
    same_text_state,
)
from streamfuse.vision.policy import FixedResolution, OcrObservation, OcrPlan, ResolutionPolicy

__all__ = [
    "CELL_SEPARATOR",
    "ArticlePolicy",
    "BBox",
    "ChangeDecision",
    "ChangeDetector",
    "ChangeDetectorConfig",
    "ChangeTracker",
    "DynamicPolicy",
    "FixedPolicy",
    "FixedResolution",
    "KeyFrame",
    "OcrConfig",
    "OcrEngine",
    "OcrLine",
    "OcrObservation",
    "OcrPlan",
    "OcrReading",
    "OcrStage",
    "PolicyConfig",
    "PolicyKind",
    "RapidOcrEngine",
    "ResolutionPolicy",
    "VisionConfig",
    "normalize_text",
    "reading_order",
    "layout",
    "LayoutConfig",
    "same_text_state",
    "thumbnail",
]
