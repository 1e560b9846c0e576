"""Harnesses users can use too: broken and single-stream media made from a good file, one stage
run over given frames (`run_stage`), and a virtual clock for timing without waiting."""

from __future__ import annotations

from streamfuse.testing.clock import VirtualTimeLoop, run_virtual
from streamfuse.testing.stage import run_stage

__all__ = ["VirtualTimeLoop", "run_stage", "run_virtual"]
