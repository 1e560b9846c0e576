"""Fused CPU kernels for the int8 decode path (`kernels.cpp`), compiled once on first use.

The build (torch's C++ extension tooling: a C++ compiler and ninja) lands in the model cache
(`$STREAMFUSE_CACHE/torch_ext/<hash of source, torch version, CPU flags>`), so later processes
load it in well under a second. Where it cannot be built (no compiler), `load_kernels()` logs
one warning and returns None, and the model runs the same math in eager PyTorch ops.

Processes building at once take turns on an OS file lock (`build.flock`), which the OS lets go
when its holder dies. torch's own lock is a plain file that a build killed mid-way leaves
behind, after which every later process would wait on it forever; under the OS lock nobody
else is building, so such a file is stale and is removed (with a warning).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold the OS lock of build directory `path`, clearing torch's stale lock file under it."""
    with (path / "build.flock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released by the OS if this process is killed
        try:
            stale = path / "lock"
            if stale.exists():
                log.warning("removing %s, left by a kernel build that did not finish", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
            module = _build()
        except Exception as e:  # no compiler, no ninja, a build error: eager ops do the work
            log.warning("fused LM kernels unavailable, using eager ops (%s)", str(e)[:300])
        _loaded["module"] = module
        return module


def _build() -> Any:
    from torch.utils.cpp_extension import load

    path = build_dir()
    with build_lock(path):
        # OpenMP: at::parallel_for in `int8_gemv` spreads rows over torch's threads (the
        # process already holds torch's libgomp, which the module binds to: no second
        # runtime). A compiler without OpenMP builds the same kernels on one thread, and the
        # marker spares later processes the failing attempt.
        no_omp = path / "no-openmp"
        for omp in ([] if no_omp.exists() else ["-fopenmp"], []):
            try:
                return load(
                    name=f"streamfuse_lm_kernels_{path.name[-16:]}",
                    sources=[str(SOURCE)],
                    build_directory=str(path),
                    extra_cflags=["-O3", "-march=native", *omp],
                    extra_ldflags=omp,
                    verbose=False,
                )
            except Exception as e:
                if not omp:
                    raise
                log.warning("building the LM kernels with OpenMP failed, without it: %s", e)
                no_omp.touch()
    raise AssertionError("unreachable")


#: The CPU flags that decide which int8 / float paths are fast here (see `cpu_features`).
CPU_FEATURES = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)


def cpu_features(cpuinfo: str | None = None) -> dict[str, bool]:
    """Which of `CPU_FEATURES` this CPU reports (from /proc/cpuinfo, or the text given)."""
    text = _cpu_flags() if cpuinfo is None else cpuinfo
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            flags = set(value.split())
            break
    return {f: f in flags for f in CPU_FEATURES}


_ONEDNN_PROBE = """
import torch
a = torch.randint(-127, 127, (64, 640), dtype=torch.int8)
w = torch.randint(-127, 127, (1024, 640), dtype=torch.int8)
torch._int_mm(a, w.t())  # the runtime's layout: a transposed view of the row-major weight
"""


def int8_gemm_path(timeout_s: float = 60.0) -> dict[str, str]:
    """What `torch._int_mm` (every int8 product of the runtime) dispatches to on this machine:
    oneDNN's verbose log of one product in a fresh process (the log is read once, at oneDNN's
    first use, so it cannot be switched on in this one). Keys: `isa` (the instruction set
    oneDNN chose) and `impl` (the primitive that ran); `impl` alone where oneDNN ran nothing
    (without AVX-512 VNNI or AMX, PyTorch computes `_int_mm` in ATen's own int8 kernel); or
    `error`."""
    import subprocess
    import sys

    env = dict(os.environ, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _ONEDNN_PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return {"error": str(e)[:200]}
    if not torch.backends.mkldnn.is_available():
        return {"impl": "ATen int8 kernel (PyTorch built without oneDNN)"}
    return parse_onednn_log(proc.stdout) or {
        "impl": "ATen int8 kernel (oneDNN ran no primitive: no int8 path for this CPU)"
    }


def parse_onednn_log(text: str) -> dict[str, str]:
    """`isa` and the first executed primitive's `impl` from a oneDNN verbose log."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) > 4 and parts[2:4] == ["info", "cpu"] and parts[4].startswith("isa:"):
            out["isa"] = parts[4].removeprefix("isa:")
        elif len(parts) > 5 and parts[2:4] == ["primitive", "exec"] and "impl" not in out:
            out["impl"] = parts[5]  # e.g. gemm_api (jit gemm) or brg_matmul:avx512_core_amx
    return out


#: How `kernel_path` names the compiled int8 product's instruction sets.
GEMV_ISA_NAMES = {"avx512_vnni": "AVX-512 VNNI", "avx2": "AVX2"}
#: A row limit that sends every call to the compiled int8 product.
EVERY_CALL = 1 << 40


def kernel_path(fused: bool, gemv_rows: int = 0, gemv_isa: str = "") -> dict[str, Any]:
    """Which code ran the model's layers: the compiled kernels (`-march=native`) or eager ops,
    the ISA ATen's own kernels (attention, norms) dispatch to, and the int8 products' paths:
    the compiled product (`gemv_isa`: AVX-512 VNNI or AVX2) for calls of up to `gemv_rows`
    rows (0: not in use), `torch._int_mm` for the rest."""
    isa = GEMV_ISA_NAMES.get(gemv_isa, gemv_isa)
    return {
        "layers": "fused C++ (-march=native)" if fused else "eager torch ops",
        "aten_isa": torch.backends.cpu.get_cpu_capability(),
        "onednn": bool(torch.backends.mkldnn.is_available()),
        "int8_gemv": (
            "not used"
            if not gemv_rows
            else f"compiled {isa}, every call"
            if gemv_rows >= EVERY_CALL
            else f"compiled {isa}, calls of <= {gemv_rows} rows"
        ),
        "int8_gemm": int8_gemm_path(),
    }
