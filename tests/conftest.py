"""Shared test set-up: a private model cache (never ~/.cache), quiet third-party loggers, and
the rule that every test module carries a suite marker (`marker_policy`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The hook is defined in its own module so a pytester test can load exactly it.
from marker_policy import pytest_make_collect_report  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"

# Session-wide cache inside the repo's ignored build folder, so expensive derived model files
# (joined Whisper parts, converted LM weights) are made once per checkout, not per test.
os.environ.setdefault("STREAMFUSE_CACHE", str(ROOT / "build" / "test-cache"))
os.environ.setdefault("HF_HOME", str(ROOT / "build" / "test-cache" / "hf"))
os.environ.setdefault("TORCH_HOME", str(ROOT / "build" / "test-cache" / "torch"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
logging.getLogger("RapidOCR").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def assets() -> Path:
    return ASSETS


@pytest.fixture
def clean_otel() -> Iterator[None]:
    """No `OTEL_*` variable from the environment, and telemetry shut down afterwards."""
    from streamfuse import telemetry

    saved = {k: os.environ.pop(k) for k in [k for k in os.environ if k.startswith("OTEL_")]}
    try:
        yield
    finally:
        telemetry.shutdown()
        os.environ.update(saved)
