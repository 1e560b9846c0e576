"""`streamfuse eval DIR`: every item of a set run and scored, per-item rows and pooled figures
per split, in the same scores as a run scored on its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamfuse.cli import app

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "assets" / "test" / "short.mp4"


def test_a_set_is_run_and_scored_per_item_and_pooled(tmp_path: Path) -> None:
    for split, name in (("dev", "one"), ("heldout", "two")):
        (tmp_path / split).mkdir()
        shutil.copy(SHORT, tmp_path / split / f"{name}.mp4")
        shutil.copy(SHORT.with_suffix(".truth.json"), tmp_path / split / f"{name}.truth.json")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "bad.mp4").write_bytes(b"not a video")
    shutil.copy(SHORT.with_suffix(".truth.json"), tmp_path / "broken" / "bad.truth.json")
    events = tmp_path / "events"
    result = CliRunner().invoke(
        app, ["eval", str(tmp_path), "--no-realtime", "--json", "--events-dir", str(events)]
    )
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout.strip().splitlines()[-1])
    rows = {r["name"]: r for r in got["items"]}
    assert set(rows) == {"one", "two", "bad"}
    assert rows["bad"]["errors"] and "bad.mp4" in rows["bad"]["errors"][0]
    assert rows["bad"]["asr_wer"] == 1.0 and rows["bad"]["ocr_cer"] == 1.0
    # An offline run is deterministic: both copies score the same, and low.
    assert rows["one"]["asr_wer"] == rows["two"]["asr_wer"] <= 0.1
    assert rows["one"]["ocr_cer"] == rows["two"]["ocr_cer"] <= 0.05
    splits = got["splits"]
    assert set(splits) == {"dev", "heldout", "broken", "all"}
    assert splits["all"]["items"] == 3
    words = rows["one"]["asr_words"]
    assert splits["all"]["asr_words"] == 3 * words
    assert splits["all"]["asr_wer"] == pytest.approx(
        (rows["one"]["asr_edits"] * 2 + words) / (3 * words)
    )
    # Each item's events were kept, and scoring one on its own gives its row's figures.
    single = CliRunner().invoke(
        app,
        [
            "eval",
            str(events / "one.events.jsonl"),
            "--truth",
            str(SHORT.with_suffix(".truth.json")),
            "--json",
        ],
    )
    assert single.exit_code == 0, single.output
    alone = json.loads(single.stdout.strip().splitlines()[-1])
    assert alone["asr_wer"] == rows["one"]["asr_wer"] and alone["ocr_cer"] == rows["one"]["ocr_cer"]
