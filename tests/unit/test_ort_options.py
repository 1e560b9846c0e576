"""`ort_session_options`: the one place onnxruntime sessions get threads and settings."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from streamfuse.models import ort_session_options

pytestmark = pytest.mark.unit


def test_defaults_pin_one_thread_each_and_keep_the_arena() -> None:
    opts = ort_session_options()
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (1, 1)
    assert opts.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert opts.enable_cpu_mem_arena and opts.log_severity_level == 4
    with pytest.raises(RuntimeError):  # unset: onnxruntime's default (spinning) applies
        opts.get_session_config_entry("session.intra_op.allow_spinning")


def test_options_carry_threads_spinning_and_arena() -> None:
    opts = ort_session_options(
        intra_op_threads=3, inter_op_threads=2, allow_spinning=False, cpu_mem_arena=False
    )
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (3, 2)
    assert not opts.enable_cpu_mem_arena
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert opts.get_session_config_entry("session.inter_op.allow_spinning") == "0"
