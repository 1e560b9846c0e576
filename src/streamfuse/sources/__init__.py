"""Inputs that produce frames: media files and URLs (PyAV), synthetic generators."""

from streamfuse.pipeline.source import Pacer, Source

__all__ = ["Pacer", "Source"]
