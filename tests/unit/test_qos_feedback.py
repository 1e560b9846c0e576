"""Load probes: CPU via psutil; GPU via NVML only when `pynvml` imports (faked here)."""

from __future__ import annotations

import sys
import types

import pytest

from streamfuse.qos import Feedback, FeedbackTracker, GpuStats, PsutilProbe, SystemProbe
from streamfuse.qos.signals import SharedCpuProbe

pytestmark = pytest.mark.unit


def test_probe_without_nvml_reports_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    probe = PsutilProbe()
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
    probe = PsutilProbe()
    gpu = probe.gpu()
    assert gpu is not None and gpu.util == pytest.approx(0.87) and gpu.mem_util == 0.75
    fb = FeedbackTracker(probe=probe).snapshot(1.0)
    assert fb.gpu_util == pytest.approx(0.87) and fb.accel_util == pytest.approx(0.87)


def test_a_failing_gpu_query_degrades_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail_query=True))
    probe = PsutilProbe()
    assert probe.gpu() is None
    assert probe.gpu() is None  # stops asking


def test_accel_util_prefers_gpu_then_cpu() -> None:
    assert Feedback(t_s=0.0, cpu_util=0.5).accel_util == 0.5
    assert Feedback(t_s=0.0, cpu_util=0.5, gpu_util=0.9).accel_util == 0.9
    assert Feedback(t_s=0.0).accel_util is None


class ScriptedProbe:
    """Any object with `cpu()` and `gpu()` is a probe: no psutil, no inheritance."""

    def cpu(self) -> float:
        return 0.25

    def gpu(self) -> GpuStats | None:
        return GpuStats(util=0.5, mem_util=0.1)


def test_system_probe_is_a_protocol_psutil_is_the_default_implementation() -> None:
    assert isinstance(PsutilProbe(), SystemProbe)
    assert isinstance(SharedCpuProbe(), SystemProbe)
    probe = ScriptedProbe()
    assert isinstance(probe, SystemProbe)
    fb = FeedbackTracker(probe=probe).snapshot(0.0)
    assert (fb.cpu_util, fb.gpu_util, fb.accel_util) == (0.25, 0.5, 0.5)
