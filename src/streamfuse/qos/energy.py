"""Energy of a piece of work: measured where the machine exposes counters, else modelled.

`EnergyMeter` reads Intel/AMD RAPL package counters (`/sys/class/powercap`) and NVIDIA's NVML
(with `pynvml` installed) around the work; where neither is readable it models the energy from
the process's CPU time at `watts_per_core` per busy core, and says so (`source: "model"`, an
estimate). The reading always carries the CPU seconds it saw, so modelled and measured figures
can be compared on a machine that has both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

#: Modelled power of one fully busy core (a server or desktop core at load: 3-6 W).
DEFAULT_WATTS_PER_CORE = 5.0

_RAPL = Path("/sys/class/powercap")


@dataclass(frozen=True)
class EnergyReading:
    joules: float
    seconds: float
    cpu_s: float
    #: "rapl", "nvml", "rapl+nvml" (measured) or "model" (CPU seconds x watts per core).
    source: str
    note: str

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else 0.0

    @property
    def measured(self) -> bool:
        return self.source != "model"


def _rapl_domains(root: Path = _RAPL) -> list[Path]:
    """The package-level RAPL zones whose counter this process may read."""
    zones = []
    for zone in sorted(root.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:
            continue  # a sub-zone (core, uncore, dram) is inside its package's count
        try:
            int((zone / "energy_uj").read_text())
        except (OSError, ValueError):
            continue
        zones.append(zone)
    return zones


def _rapl_uj(zones: list[Path]) -> list[int]:
    return [int((z / "energy_uj").read_text()) for z in zones]


def _nvml() -> Any:
    """pynvml initialised with at least one GPU, or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() > 0:
            return pynvml
    except Exception:  # not installed, no driver, no GPU: nothing to measure
        return None
    return None


def _nvml_mj(nvml: Any) -> int:
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    return sum(int(nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in handles)


def _cpu_s() -> float:
    proc = psutil.Process()
    t = proc.cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


class EnergyMeter:
    """`with EnergyMeter() as meter: ...` then `meter.reading` (or `start()` / `stop()`)."""

    def __init__(
        self, watts_per_core: float = DEFAULT_WATTS_PER_CORE, *, rapl_root: Path = _RAPL
    ) -> None:
        self.watts_per_core = watts_per_core
        self._zones = _rapl_domains(rapl_root)
        self._nvml = _nvml()
        self.reading: EnergyReading | None = None

    @property
    def source(self) -> str:
        parts = (["rapl"] if self._zones else []) + (["nvml"] if self._nvml else [])
        return "+".join(parts) or "model"

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._cpu0 = _cpu_s()
        self._rapl0 = _rapl_uj(self._zones) if self._zones else []
        self._gpu0 = _nvml_mj(self._nvml) if self._nvml else 0

    def stop(self) -> EnergyReading:
        seconds = time.monotonic() - self._t0
        cpu_s = _cpu_s() - self._cpu0
        joules = 0.0
        if self._zones:
            for zone, before, after in zip(
                self._zones, self._rapl0, _rapl_uj(self._zones), strict=True
            ):
                delta = after - before
                if delta < 0:  # the counter wrapped
                    delta += int((zone / "max_energy_range_uj").read_text())
                joules += delta / 1e6
        if self._nvml:
            joules += (_nvml_mj(self._nvml) - self._gpu0) / 1e3
        if self.source == "model":
            joules = cpu_s * self.watts_per_core
            note = f"estimate: {cpu_s:.1f} CPU-s x {self.watts_per_core:g} W per busy core"
        else:
            note = f"measured ({self.source}, whole package: other processes count too)"
        self.reading = EnergyReading(joules, seconds, cpu_s, self.source, note)
        return self.reading

    def __enter__(self) -> EnergyMeter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["DEFAULT_WATTS_PER_CORE", "EnergyMeter", "EnergyReading"]
