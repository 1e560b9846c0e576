"""Energy readings: RAPL counters where readable (wrap-around included), else the CPU-time
model, labelled an estimate."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from streamfuse.qos.energy import EnergyMeter

pytestmark = pytest.mark.unit


def _zone(root: Path, name: str, uj: int, max_uj: int = 1_000_000_000) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "energy_uj").write_text(str(uj))
    (zone / "max_energy_range_uj").write_text(str(max_uj))
    return zone


def _burn() -> None:
    data = b"x" * 1_000_000
    for _ in range(30):
        data = hashlib.sha256(data).digest() * 31250


def test_rapl_packages_are_summed_and_a_wrapped_counter_counted(tmp_path: Path) -> None:
    a = _zone(tmp_path, "intel-rapl:0", 999_000_000)
    b = _zone(tmp_path, "intel-rapl:1", 5_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 7)  # a sub-zone: inside package 0's count already
    meter = EnergyMeter(rapl_root=tmp_path)
    assert meter.source in ("rapl", "rapl+nvml")
    meter.start()
    (a / "energy_uj").write_text("2000000")  # wrapped: +3 J
    (b / "energy_uj").write_text("9000000")  # +4 J
    reading = meter.stop()
    if meter.source == "rapl":
        assert reading.joules == pytest.approx(7.0)
    assert reading.measured and "measured" in reading.note


def test_without_counters_energy_is_cpu_time_times_watts_and_says_so(tmp_path: Path) -> None:
    meter = EnergyMeter(watts_per_core=4.0, rapl_root=tmp_path / "none")
    if meter.source != "model":
        pytest.skip("a GPU with NVML is present: nothing is modelled")
    with meter:
        _burn()
    reading = meter.reading
    assert reading is not None and not reading.measured
    assert reading.cpu_s > 0 and reading.joules == pytest.approx(4.0 * reading.cpu_s)
    assert reading.note.startswith("estimate") and reading.watts > 0
