"""The main job with load-driven allocation (real models, the short clip): every model call is
leased from the core budget and given back, the monitor rebalances while running, and the
events are those of the fixed split; a model pool carries loaded models from job to job."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streamfuse.app import Job, StreamfuseConfig, build_pipeline, run_job
from streamfuse.model_pool import ModelPool, StageModels
from streamfuse.sinks import CollectSink

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHORT = Path(__file__).resolve().parents[2] / "assets" / "test" / "short.mp4"


def _run(mode: str, streams: int = 1, models: StageModels | None = None) -> tuple[Job, CollectSink]:
    config = StreamfuseConfig.model_validate(
        # Offline (as fast as decoded): every stage is busy, so the load is measurable.
        {"realtime": False, "allocation": {"mode": mode, "cores": 2, "interval_s": 0.2}}
    )
    sink = CollectSink()

    async def go() -> Job:
        job = await build_pipeline([str(SHORT)] * streams, config, [sink], models=models)
        await run_job(job, [sink])
        return job

    return asyncio.run(go()), sink


def _text(sink: CollectSink, kind: str) -> list[str]:
    return [str(r["text"]) for r in sink.records if r["type"] == kind]


def test_load_mode_leases_every_model_call_and_rebalances() -> None:
    job, sink = _run("load", streams=2)
    assert not [r for r in sink.records if r["type"] == "error"]
    monitor = job.allocation
    assert monitor is not None
    budget = monitor.budget
    assert set(budget.stages) == {"ocr:0:short", "asr:0:short", "ocr:1:short", "asr:1:short"}
    assert budget.in_use() == 0  # every lease given back
    for stage, counts in budget.granted.items():
        assert counts and set(counts) <= {1, 2}, (stage, counts)
    assert len(monitor.history) >= 2
    last = monitor.history[-1][1]
    assert all(1 <= n <= 2 for n in last.threads.values())
    assert {r["stream_id"] for r in sink.records if r["type"] == "ocr"} == {"0:short", "1:short"}
    assert _text(sink, "asr")


def test_fixed_mode_has_no_budget_and_a_pool_loads_each_model_once() -> None:
    pool = ModelPool()
    first, a = _run("fixed", models=StageModels(pool=pool))
    assert first.allocation is None
    loads = pool.loads
    assert loads == 2  # the OCR engine and the Whisper model of the one stream
    _, b = _run("fixed", models=StageModels(pool=pool))
    assert pool.loads == loads  # the second job reused them
    assert _text(a, "ocr") == _text(b, "ocr")
    assert _text(a, "asr") == _text(b, "asr")
