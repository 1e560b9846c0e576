"""`streamfuse pareto` end to end on the short clip (two configurations, real models), the
chosen point written as a config file, and `streamfuse run --config` running with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "assets" / "test" / "short.mp4"


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamfuse.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_sweep_picks_a_point_and_run_accepts_its_config(tmp_path: Path) -> None:
    out = tmp_path / "pareto"
    proc = cli(
        "pareto",
        str(SHORT),
        "--truth",
        str(SHORT.with_suffix(".truth.json")),
        "--configs",
        "2",
        "--clip-s",
        "5",
        "--no-realtime",
        "--slo",
        "wer<=1.0",
        "--out",
        str(out),
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["configs"] == 2
    assert summary["frontier"] and summary["chosen"]["name"] in summary["frontier"]
    assert summary["chosen"]["wer"] <= 1.0
    points = json.loads((out / "points.json").read_text())
    assert all(p["cer"] is not None and p["energy_j"] > 0 for p in points)
    assert (out / "pareto.png").stat().st_size > 0
    assert "**(chosen)**" in (out / "table.md").read_text()
    chosen = json.loads((out / "chosen.json").read_text())
    chosen["realtime"] = False  # the point is a live one; replay it fast here
    config = tmp_path / "chosen.json"
    config.write_text(json.dumps(chosen))
    events = tmp_path / "ev.jsonl"
    run = cli("run", str(SHORT), "--config", str(config), "--out", str(events), "--no-live")
    assert run.returncode == 0, run.stderr
    kinds = {json.loads(line)["type"] for line in events.read_text().splitlines()}
    assert {"ocr", "asr"} <= kinds


def test_bad_config_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"vision": {"policy": {"kind": "nope"}}}')
    proc = cli("run", str(SHORT), "--config", str(bad), "--no-live")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: invalid option")
    bad.write_text("[1, 2]")
    proc = cli("run", str(SHORT), "--config", str(bad), "--no-live")
    assert proc.returncode == 2 and "expected a JSON object" in proc.stderr
