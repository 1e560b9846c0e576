"""Inputs that produce frames: media files and URLs (PyAV), synthetic generators."""

from streamfuse.sources.base import Pacer, Source

__all__ = ["Pacer", "Source"]
