"""The vision path: change detection selects key frames, OCR reads them.

`ChangeDetector` (VideoFrame -> KeyFrame, ~1 ms per frame) feeds `OcrStage` (KeyFrame -> one
`ocr` event per distinct on-screen text state; link it with `OverloadPolicy.LATEST_ONLY`). The OCR
stage asks a `ResolutionPolicy` per frame for the detector resolution, region of interest and
interval, and reports what each read cost, so adaptive controllers plug in.
"""

from __future__ import annotations

from streamfuse.vision.change import ChangeDecision, ChangeDetector, ChangeTracker, thumbnail
from streamfuse.vision.config import ChangeDetectorConfig, OcrConfig, VisionConfig
from streamfuse.vision.frames import BBox, KeyFrame
from streamfuse.vision.layout import reading_order
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
    "BBox",
    "ChangeDecision",
    "ChangeDetector",
    "ChangeDetectorConfig",
    "ChangeTracker",
    "FixedResolution",
    "KeyFrame",
    "OcrConfig",
    "OcrEngine",
    "OcrLine",
    "OcrObservation",
    "OcrPlan",
    "OcrReading",
    "OcrStage",
    "RapidOcrEngine",
    "ResolutionPolicy",
    "VisionConfig",
    "normalize_text",
    "reading_order",
    "same_text_state",
    "thumbnail",
]
