"""`streamfuse bench --platform`: the ramp stops at the first step over the budget, and the
report names the machine, the models and how its energy figure was obtained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamfuse.cli import app

pytestmark = pytest.mark.integration

SHORT = Path(__file__).resolve().parents[2] / "assets" / "test" / "short.mp4"


def _bench(*args: str) -> dict:
    result = CliRunner().invoke(
        app, ["bench", "--platform", "--clip", str(SHORT), "--clip-s", "4", "--json", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_ramp_stops_at_the_first_step_over_the_budget() -> None:
    # A budget no live run can meet: the first step is over it, so nothing is within.
    tight = _bench("--budget-s", "0.001", "--max-streams", "3")
    assert [s["streams"] for s in tight["steps"]] == [1]
    assert tight["max_streams"] == 0 and tight["watts_at_max"] is None
    # A generous one: every step up to the cap is within it.
    loose = _bench("--budget-s", "60", "--max-streams", "2")
    assert [s["streams"] for s in loose["steps"]] == [1, 2]
    assert loose["max_streams"] == 2
    first = loose["steps"][0]
    assert first["events"] > 0 and first["errors"] == 0
    assert 0 < loose["mean_latency_ms"] == first["latency_mean_ms"] < 60_000
    assert loose["joules_per_stream_minute"] > 0
    assert loose["energy_source"] in ("model", "rapl", "nvml", "rapl+nvml")
    assert loose["energy_note"].startswith(
        "estimate" if loose["energy_source"] == "model" else "measured"
    )
    assert any("whisper" in m for m in loose["models"])
    assert loose["machine"]["cores"] and "cores visible" in loose["machine"]["cpu"]
    assert "onnxruntime" in loose["machine"]["versions"]


def test_nothing_to_measure_is_a_clear_error() -> None:
    result = CliRunner().invoke(app, ["bench"])
    assert result.exit_code == 2 and "--platform" in result.output
