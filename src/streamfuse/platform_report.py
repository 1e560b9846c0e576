"""The platform report (`streamfuse bench --platform`): what this machine sustains live.

Ramps the number of concurrent live streams of a clip (each paced at wall-clock speed, the
main job's default models and policies) until one step misses the latency budget: the p95 of
the `ocr` and `asr` event latencies (input arrival to emission) must stay within `budget_s`
and the last event must come within `budget_s` of the clip's end (the streams keep up). The
report holds the mean and p95 end-to-end latency with one stream, the most streams within the
budget, power and energy per stream-minute (RAPL/NVML where readable, else modelled from CPU
time and labelled an estimate: `streamfuse.qos.energy`), the CPU, GPU, governor and the
versions of the models and runtimes: the design article's platform table, for this machine.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamfuse.qos.allocation import cpu_frequency
from streamfuse.qos.energy import EnergyMeter
from streamfuse.stats import percentiles
from streamfuse.testing.machine import cpu_description

#: Runtimes whose versions change the figures.
PACKAGES = (
    "streamfuse",
    "onnxruntime",
    "rapidocr",
    "ctranslate2",
    "faster-whisper",
    "av",
    "torch",
)


@dataclass
class Step:
    """One ramp step: `streams` live streams at once."""

    streams: int
    latency_mean_ms: float
    latency_p95_ms: float
    end_lag_s: float  # the last ocr/asr result after the clip's end
    job_end_lag_s: float  # the job's last record (background revisions, final stats)
    cpu_s: float
    joules: float
    watts: float
    events: int
    errors: int
    within_budget: bool


@dataclass
class PlatformReport:
    machine: dict[str, Any]
    budget_s: float
    clip: str
    clip_s: float
    steps: list[Step] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    energy_source: str = "model"
    energy_note: str = ""

    @property
    def max_streams(self) -> int:
        """The most streams of a step within the budget, every step below it too."""
        best = 0
        for step in self.steps:
            if not step.within_budget:
                break
            best = step.streams
        return best

    @property
    def mean_latency_ms(self) -> float | None:
        return self.steps[0].latency_mean_ms if self.steps else None

    def to_json(self) -> dict[str, Any]:
        one = self.steps[0] if self.steps else None
        at_max = next((s for s in self.steps if s.streams == self.max_streams), None)
        return {
            "machine": self.machine,
            "budget_s": self.budget_s,
            "clip": self.clip,
            "clip_s": self.clip_s,
            "mean_latency_ms": self.mean_latency_ms,
            "p95_latency_ms": one.latency_p95_ms if one else None,
            "max_streams": self.max_streams,
            "watts_at_max": round(at_max.watts, 1) if at_max else None,
            "joules_per_stream_minute": (
                round(at_max.joules / at_max.streams / (self.clip_s / 60.0), 1) if at_max else None
            ),
            "energy_source": self.energy_source,
            "energy_note": self.energy_note,
            "models": self.models,
            "steps": [asdict(s) for s in self.steps],
        }


def machine_facts() -> dict[str, Any]:
    """CPU (model, cores, SIMD extensions), memory, GPU, frequency governor, OS, versions."""
    import psutil

    freq = cpu_frequency()
    facts: dict[str, Any] = {
        "cpu": cpu_description(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "gpu": _gpu(),
        # cpufreq where the OS exposes it (containers and many VMs do not: "not exposed").
        "governor": "/".join(sorted(set(freq.governors))) if freq.exposed else "not exposed",
        "cpu_mhz": max(freq.cur_mhz) if freq.cur_mhz else None,
        "cpufreq": freq.summary(),
        "versions": {},
    }
    for package in PACKAGES:
        try:
            facts["versions"][package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return facts


def _gpu() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def end_lags(records: Sequence[dict[str, Any]], clip_s: float) -> tuple[float, float]:
    """Seconds after the clip's end of the last `ocr`/`asr` result (judged: a stream's results
    leave in order, so a backlog shows here) and of the job's last record (reported: it also
    waits for the background reviser's last readings of committed speech, `asr_revision`)."""

    def last(rs: Iterable[dict[str, Any]]) -> float:
        return max((float(r.get("wall_s") or 0.0) for r in rs), default=0.0) - clip_s

    return last(r for r in records if r["type"] in ("ocr", "asr")), last(records)


async def _run_step(
    clip: Path, streams: int, budget_s: float, clip_s: float
) -> tuple[Step, list[str]]:
    from streamfuse.app import StreamfuseConfig, build_pipeline, run_job
    from streamfuse.sinks import CollectSink

    sink = CollectSink()
    config = StreamfuseConfig(realtime=True)
    job = await build_pipeline([str(clip)] * streams, config, [sink])
    with EnergyMeter() as meter:
        await run_job(job, [sink])
    models = sorted(
        {
            f"{info.name} ({info.precision})"
            for stage in job.pipeline.stages
            if (info := stage.model_info()) is not None
        }
    )
    reading = meter.reading
    assert reading is not None
    events = [r for r in sink.records if r["type"] in ("ocr", "asr")]
    latencies = [float(r["latency_ms"]) for r in events]
    end_lag, job_end_lag = end_lags(sink.records, clip_s)
    q = percentiles(latencies) if latencies else {"p95": float("inf")}
    mean = statistics.fmean(latencies) if latencies else float("inf")
    errors = sum(r["type"] == "error" for r in sink.records)
    step = Step(
        streams=streams,
        latency_mean_ms=round(mean, 1),
        latency_p95_ms=round(q["p95"], 1),
        end_lag_s=round(end_lag, 2),
        job_end_lag_s=round(job_end_lag, 2),
        cpu_s=round(reading.cpu_s, 1),
        joules=round(reading.joules, 1),
        watts=round(reading.watts, 1),
        events=len(events),
        errors=errors,
        within_budget=bool(latencies)
        and q["p95"] <= budget_s * 1000.0
        and end_lag <= budget_s
        and errors == 0,
    )
    return step, models


async def platform_report(
    clip: Path,
    *,
    budget_s: float = 2.0,
    max_streams: int = 8,
    clip_s: float = 20.0,
    progress: Callable[[Step], None] | None = None,
) -> PlatformReport:
    """Ramp 1, 2, ... live streams of the first `clip_s` seconds of `clip` until a step
    misses the budget (or `max_streams`)."""
    from streamfuse.testing.media import cut

    meter = EnergyMeter()
    report = PlatformReport(
        machine=machine_facts(),
        budget_s=budget_s,
        clip=clip.name,
        clip_s=clip_s,
        energy_source=meter.source,
        energy_note=(
            f"estimate: CPU-seconds x {meter.watts_per_core:g} W per busy core (no RAPL or NVML)"
            if meter.source == "model"
            else f"measured ({meter.source}; the whole package, other processes count too)"
        ),
    )
    with tempfile.TemporaryDirectory(prefix="sf_platform_") as tmp:
        head = cut(clip, Path(tmp) / f"head{clip.suffix}", clip_s)
        for n in range(1, max_streams + 1):
            step, models = await _run_step(head, n, budget_s, clip_s)
            report.steps.append(step)
            report.models = report.models or models
            if progress is not None:
                progress(step)
            if not step.within_budget:
                break
    return report


__all__ = ["PlatformReport", "Step", "machine_facts", "platform_report"]
