"""Fused CPU kernels for the int8 decode path (`kernels.cpp`), compiled once on first use.

The build (torch's C++ extension tooling: a C++ compiler and ninja) lands in the model cache
(`$STREAMFUSE_CACHE/torch_ext/<hash of source, torch version, CPU flags>`), so later processes
load it in well under a second. Where it cannot be built (no compiler), `load_kernels()` logs
one warning and returns None, and the model runs the same math in eager PyTorch ops.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
from pathlib import Path
from typing import Any

import torch

from streamfuse.models import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("kernels.cpp")
ENV_DISABLE = "STREAMFUSE_NO_FUSED_KERNELS"

_lock = threading.Lock()
_loaded: dict[str, Any] = {}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def build_dir() -> Path:
    """Where this source, for this torch and this CPU, is compiled to."""
    key = hashlib.sha256(
        SOURCE.read_bytes() + torch.__version__.encode() + _cpu_flags().encode()
    ).hexdigest()[:16]
    path = cache_dir() / "torch_ext" / f"streamfuse_lm_{key}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_kernels() -> Any | None:
    """The compiled kernel module, or None when disabled (`STREAMFUSE_NO_FUSED_KERNELS=1`) or
    when it cannot be built here (one warning; callers fall back to eager ops)."""
    if os.environ.get(ENV_DISABLE, "") not in ("", "0"):
        return None
    with _lock:
        if "module" in _loaded:
            return _loaded["module"]
        module = None
        try:
            from torch.utils.cpp_extension import load

            path = build_dir()
            module = load(
                name=f"streamfuse_lm_kernels_{path.name[-16:]}",
                sources=[str(SOURCE)],
                build_directory=str(path),
                extra_cflags=["-O3", "-march=native"],
                verbose=False,
            )
        except Exception as e:  # no compiler, no ninja, a build error: eager ops do the work
            log.warning("fused LM kernels unavailable, using eager ops (%s)", str(e)[:300])
        _loaded["module"] = module
        return module
