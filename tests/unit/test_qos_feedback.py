"""Load probes: CPU via psutil; GPU via NVML only when `pynvml` imports (faked here)."""

from __future__ import annotations

import sys
import types

import pytest

from streamfuse.qos import Feedback, FeedbackTracker, SystemProbe

pytestmark = pytest.mark.unit


def test_probe_without_nvml_reports_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    probe = SystemProbe()
    assert probe.gpu() is None
    assert 0.0 <= probe.cpu() <= 1.0


def _fake_nvml(fail_query: bool = False) -> types.ModuleType:
    m = types.ModuleType("pynvml")
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: f"gpu{i}"  # type: ignore[attr-defined]

    def util(handle: str) -> types.SimpleNamespace:
        if fail_query:
            raise RuntimeError("GPU is lost")
        return types.SimpleNamespace(gpu=87, memory=40)

    m.nvmlDeviceGetUtilizationRates = util  # type: ignore[attr-defined]
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3, total=4)  # type: ignore[attr-defined]
    return m


def test_probe_reads_gpu_load_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml())
    probe = SystemProbe()
    gpu = probe.gpu()
    assert gpu is not None and gpu.util == pytest.approx(0.87) and gpu.mem_util == 0.75
    fb = FeedbackTracker(probe=probe).snapshot(1.0)
    assert fb.gpu_util == pytest.approx(0.87) and fb.accel_util == pytest.approx(0.87)


def test_a_failing_gpu_query_degrades_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail_query=True))
    probe = SystemProbe()
    assert probe.gpu() is None
    assert probe.gpu() is None  # stops asking


def test_accel_util_prefers_gpu_then_cpu() -> None:
    assert Feedback(t_s=0.0, cpu_util=0.5).accel_util == 0.5
    assert Feedback(t_s=0.0, cpu_util=0.5, gpu_util=0.9).accel_util == 0.9
    assert Feedback(t_s=0.0).accel_util is None
