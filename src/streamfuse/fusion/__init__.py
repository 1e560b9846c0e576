"""Fusion: where several modalities' events meet. `TimelineStage` turns OCR and speech events
into one per-stream text timeline (`ContextFrame`s) for the language model."""

from __future__ import annotations

from streamfuse.fusion.timeline import TimelineConfig, TimelineStage

__all__ = ["TimelineConfig", "TimelineStage"]
