"""The kernel build: a build killed mid-way never leaves later processes waiting, and a compiler
without OpenMP still builds the kernels."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamfuse.lm.kernels import build_lock

pytestmark = pytest.mark.unit


def test_a_lock_file_left_by_a_killed_build_is_cleared(tmp_path: Path) -> None:
    # torch's cpp_extension waits for its `lock` file to go away: left by a killed build, it
    # never would.
    (tmp_path / "lock").touch()
    with build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_the_lock_of_a_killed_builder_is_released(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time, pathlib\n"
         "from streamfuse.lm.kernels import build_lock\n"
         f"with build_lock(pathlib.Path({str(tmp_path)!r})):\n"
         "    (pathlib.Path(sys.argv[1]) / 'lock').touch()\n"
         "    print('held', flush=True)\n"
         "    time.sleep(60)\n",
         str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.kill()  # mid-build, torch's lock file still there
        holder.wait(timeout=10)
        t0 = time.monotonic()
        with build_lock(tmp_path):
            assert not (tmp_path / "lock").exists()
        assert time.monotonic() - t0 < 5
    finally:
        holder.kill()


def test_a_compiler_without_openmp_still_builds_the_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.utils.cpp_extension as ext

    from streamfuse.lm import kernels

    calls: list[list[str]] = []

    def fake_load(**kw):  # type: ignore[no-untyped-def]
        calls.append(kw["extra_cflags"])
        if "-fopenmp" in kw["extra_cflags"]:
            raise RuntimeError("fatal error: omp.h: No such file or directory")
        return "module"

    monkeypatch.setattr(ext, "load", fake_load)
    monkeypatch.setattr(kernels, "build_dir", lambda: tmp_path)
    assert kernels._build() == "module"
    assert calls == [["-O3", "-march=native", "-fopenmp"], ["-O3", "-march=native"]]
    calls.clear()
    assert kernels._build() == "module"  # a later process goes straight to the plain build
    assert calls == [["-O3", "-march=native"]]
