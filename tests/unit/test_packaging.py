"""What `pip install .` ships: every data file of the package, and runtime code only (the
training and research code in `tools/` is never imported by `streamfuse`)."""

from __future__ import annotations

import ast
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

import streamfuse

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(streamfuse.__file__).resolve().parent


def test_package_data_globs_ship_every_data_file() -> None:
    """Every non-Python file in the package (demo clip, models, kernels) matches a package-data
    pattern of pyproject.toml, so `pip install .` copies it into the wheel."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["streamfuse"]
    data = [
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix not in {".py", ".pyc"} and "__pycache__" not in p.parts
    ]
    assert "assets/demo/lecture.mp4" in data
    unshipped = [f for f in data if not any(fnmatch(f, pat) for pat in patterns)]
    assert unshipped == []


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_runtime_never_imports_tools() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            m for m in _imported_modules(path) if m == "tools" or m.startswith("tools.")
        )
        for path in PACKAGE.rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert not (PACKAGE / "vision" / "st_adapter.py").exists()
    assert not [
        p
        for p in (PACKAGE / "vision" / "reshead").glob("*.py")
        if p.stem in {"train", "model", "synth", "labels", "dataset"}
    ]
