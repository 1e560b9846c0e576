"""The command line end to end: real models on the short clip, and every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from streamfuse.testing.media import faststart, remux, truncate

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "assets" / "test" / "short.mp4"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamfuse.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_run_short_clip_produces_timeline(tmp_path: Path) -> None:
    out = tmp_path / "ev.jsonl"
    proc = cli("run", str(SHORT), "--out", str(out), "--no-live")
    assert proc.returncode == 0, proc.stderr
    evs = events(out)
    truth = json.loads(SHORT.with_suffix(".truth.json").read_text())
    ocr = [e for e in evs if e["type"] == "ocr"]
    assert len(ocr) == len(truth["ocr"])  # one event per distinct slide
    for slide, ev in zip(truth["ocr"], ocr, strict=True):
        got = " ".join(ln["text"] for ln in ev["lines"]).lower()
        assert slide["t_start"] <= ev["t_start"] < slide["t_end"]
        words = [w for line in slide["lines"] for w in line.lower().split() if len(w) > 3]
        assert sum(w in got for w in words) >= 0.8 * len(words)
    spoken = " ".join(e["text"] for e in evs if e["type"] == "asr").lower()
    truth_words = {w.strip(".,!?") for u in truth["asr"] for w in u["text"].lower().split()}
    long_words = [w for w in truth_words if len(w) > 5]
    assert sum(w in spoken for w in long_words) >= 0.7 * len(long_words)
    schema = json.loads((ROOT / "docs" / "events.schema.json").read_text())
    for e in evs:  # every record is of the documented schema
        jsonschema.validate(e, schema)
    assert evs[-1]["type"] == "stats" and evs[-1]["final"]
    # and the scorer reads it
    score = cli("eval", str(out), "--truth", str(SHORT.with_suffix(".truth.json")), "--json")
    assert score.returncode == 0, score.stderr
    result = json.loads(score.stdout.strip().splitlines()[-1])
    assert result["ocr_cer"] < 0.05 and result["asr_wer"] < 0.25
    assert {"ocr", "asr"} <= result["latency_ms"].keys() and result["rtf"] > 0


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (lambda d: d / "missing.mp4", "input not found"),
        (
            lambda d: (d / "notes.mp4").write_text("hello\n" * 99) and d / "notes.mp4",
            "not a readable",
        ),
        # Index at the end (as a recorder writes it) and the end cut off: nothing can be read.
        (lambda d: truncate(remux(SHORT, d / "plain.mp4"), d / "cut.mp4", 0.5), "cut.mp4"),
        (lambda d: "http://127.0.0.1:9/live.mp4", "cannot reach"),
    ],
    ids=["missing", "not-media", "truncated", "unreachable-url"],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, make, expect: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "ev.jsonl"
    proc = cli("run", str(make(tmp_path)), "--out", str(out), "--no-live", timeout=60)
    assert proc.returncode == 2
    assert expect in one_line_error(proc)


@pytest.mark.parametrize(
    "flags",
    [["--no-asr"], [], ["--ask", "what is on the slide?"]],
    ids=["ocr-only", "ocr+asr", "ocr+asr+lm"],
)
def test_input_breaking_midway_keeps_partial_results(tmp_path: Path, flags: list[str]) -> None:
    cut = truncate(faststart(SHORT, tmp_path / "fs.mp4"), tmp_path / "fs_cut.mp4", 0.6)
    out = tmp_path / "ev.jsonl"
    # The first LM run in a fresh cache converts the GGUF and compiles the LM kernels (once;
    # 2-3 minutes on a loaded 2-core machine): more time than the other runs need.
    lm = "--ask" in flags
    proc = cli("run", str(cut), "--out", str(out), "--no-live", *flags, timeout=600 if lm else 300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "partial results kept" in proc.stderr
    evs = events(out)
    assert any(e["type"] == "ocr" for e in evs)  # the first slide was read before the break
    # One failure, one error event: it fans out to every branch (OCR, ASR, LM) and the
    # branches join again at the sink, which must see it once.
    errors = [e for e in evs if e["type"] == "error"]
    assert len(errors) == 1, errors
    assert "fs_cut.mp4" in errors[0]["message"]


def test_audio_only_and_video_only_run_what_they_can(tmp_path: Path) -> None:
    a_out, v_out = tmp_path / "a.jsonl", tmp_path / "v.jsonl"
    a = cli(
        "run", str(remux(SHORT, tmp_path / "a.mp4", video=False)), "-o", str(a_out), "--no-live"
    )
    assert a.returncode == 0, a.stderr
    assert "no usable video stream" in a.stderr and "Traceback" not in a.stderr
    evs = events(a_out)
    assert any(e["type"] == "asr" for e in evs) and not any(e["type"] == "ocr" for e in evs)
    assert any(e["type"] == "error" and "no usable video" in e["message"] for e in evs)
    v = cli(
        "run", str(remux(SHORT, tmp_path / "v.mp4", audio=False)), "-o", str(v_out), "--no-live"
    )
    assert v.returncode == 0, v.stderr
    evs = events(v_out)
    assert any(e["type"] == "ocr" for e in evs) and not any(e["type"] == "asr" for e in evs)
    assert any(e["type"] == "error" and "no audio" in e["message"] for e in evs)


def test_serve_prints_its_address_and_token_and_stops_on_interrupt() -> None:
    import signal
    import urllib.error
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "streamfuse.cli", "serve", "--port", "0", "--token", "cli-token-1"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        dashboard = proc.stderr.readline().strip()
        assert first.startswith("streamfuse serve on http://127.0.0.1:"), first
        base = first.split(" on ", 1)[1].strip()
        assert dashboard == f"dashboard: {base}/?token=cli-token-1"
        with urllib.request.urlopen(f"{base}/health", timeout=10) as r:
            assert json.loads(r.read())["status"] == "ok"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/api/sessions", timeout=10)
        assert refused.value.code == 401
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) in (0, 130)  # 130: uvicorn re-raises the interrupt
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
