"""`streamfuse run --vision-policy dynamic` on the short clip: the real pipeline with the adaptive
policy still reads every slide once, at rungs of the frame's ladder, and the job exposes one
policy per stream with its statistics."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamfuse.app import StreamfuseConfig, build_pipeline
from streamfuse.sinks import CollectSink
from streamfuse.text import cer
from streamfuse.vision.adaptive import AdaptiveResolution

pytestmark = pytest.mark.integration


def test_dynamic_policy_reads_every_slide(assets: Path, tmp_path: Path) -> None:
    clip, truth_path = assets / "test" / "short.mp4", assets / "test" / "short.truth.json"
    truth = json.loads(truth_path.read_text())
    out = tmp_path / "ev.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "streamfuse.cli", "run", str(clip), "--no-asr", "--no-live"]
        + ["--vision-policy", "dynamic", "--ocr-budget-s", "1.0", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert not [e for e in events if e["type"] == "error"]
    ocr = [e for e in events if e["type"] == "ocr"]
    assert len(ocr) == len(truth["ocr"])
    for slide in truth["ocr"]:
        inside = [e for e in ocr if slide["t_start"] <= e["t_start"] < slide["t_end"]]
        assert len(inside) == 1, slide
        ref = " ".join(slide["lines"])
        hyp = " ".join(ln["text"] for ln in inside[0]["lines"])
        assert cer(ref, hyp) <= 0.05, (ref, hyp)
    # The detector ran at most at the frame's own size (the ladder is clipped to it).
    assert all(max(e["resolution"]) <= 1280 for e in ocr)


def test_job_builds_one_adaptive_policy_per_stream(assets: Path) -> None:
    clip = assets / "test" / "short.mp4"
    config = StreamfuseConfig(
        asr=False, vision={"policy": {"kind": "dynamic", "controller": {"budget_s": 0.5}}}
    )
    sink = CollectSink()
    job = asyncio.run(build_pipeline([str(clip), str(clip)], config, [sink]))
    try:
        assert set(job.policies) == set(job.ocr_stages) == {"0:short", "1:short"}
        policies = list(job.policies.values())
        assert all(isinstance(p, AdaptiveResolution) for p in policies)
        assert policies[0] is not policies[1]
        assert job.signals is not None and job.signals in job.pipeline.observers
        stage = job.ocr_stages["0:short"]
        assert stage.policy is policies[0]
    finally:
        for source in job.sources:
            asyncio.run(source.close())
    fixed = asyncio.run(
        build_pipeline(
            [str(clip)], StreamfuseConfig(asr=False, vision={"policy": {"kind": "fixed"}}), [sink]
        )
    )
    assert fixed.signals is None
    assert not isinstance(fixed.policies["short"], AdaptiveResolution)
    asyncio.run(fixed.sources[0].close())
