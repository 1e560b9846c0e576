"""Shared test set-up: a private model cache (never ~/.cache), quiet third-party loggers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

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
