"""Inputs that produce frames: media files, URLs and devices (PyAV), synthetic generators.

`SourceConfig` holds how inputs are opened and kept alive (FFmpeg options, reconnection)."""

from streamfuse.pipeline.source import Pacer, Source
from streamfuse.sources.config import SourceConfig

__all__ = ["Pacer", "Source", "SourceConfig"]
