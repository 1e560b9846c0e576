"""Learned OCR resolution head (F14): a <100K-parameter depthwise-separable CNN that predicts,
from a grey thumbnail, the smallest resolution-ladder rung at which OCR still reads a frame.

Runtime: `ResolutionHead` (onnxruntime, INT8 model shipped here; no torch needed). Training,
labelling and export are not part of the package: they live in `tools/reshead/` (torch,
rapidocr) and run through `scripts/train_reshead.py`.
"""

from __future__ import annotations

from streamfuse.vision.reshead.runtime import HeadPrediction, ResolutionHead

__all__ = ["HeadPrediction", "ResolutionHead"]
