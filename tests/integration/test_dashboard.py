"""The dashboard in a real browser: Debian's Chromium driven by Playwright, its fake camera and
microphone playing the first seconds of the demo clip into a live session of `streamfuse serve`;
the page's panels must show what the pipeline read and heard, and the chat it was sent."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamfuse.assets import demo_files
from streamfuse.testing.browser import (
    FakeCapture,
    LiveRun,
    chromium_launch_options,
    fake_capture,
    run_live_session,
)

pytestmark = pytest.mark.integration

playwright_api = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "dash-test-token"
CLIP_S = 6.0
CHAT = "is the latency budget per stage?"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> FakeCapture:
    with demo_files() as demo:
        return fake_capture(demo.clip, max_duration_s=CLIP_S)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    from streamfuse.server import ServeConfig, serve_in_thread

    with serve_in_thread(ServeConfig(token=TOKEN, port=0)) as url:
        yield url.rstrip("/")


@pytest.fixture(scope="module")
def browser(fake: FakeCapture) -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(**chromium_launch_options(fake))
        yield b
        b.close()


@pytest.fixture(scope="module")
def live(browser: Any, base_url: str) -> Iterator[tuple[Any, LiveRun]]:
    """One live session through the page: the demo's first seconds, a chat line in the middle."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    run = run_live_session(page, base_url, TOKEN, CLIP_S, chat=[(2.0, "alice", CHAT)])
    assert not errors, errors
    yield page, run
    page.close()


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_page_needs_the_token(browser: Any, base_url: str) -> None:
    page = browser.new_page()
    denied = page.goto(f"{base_url}/")
    assert denied is not None and denied.status == 401
    assert status_of(f"{base_url}/static/dashboard.js") == 401
    allowed = page.goto(f"{base_url}/?token={TOKEN}")
    assert allowed is not None and allowed.status == 200
    # The page's own script and style came through (the cookie set by `/` authorizes them).
    page.wait_for_function("window.streamfuse !== undefined", timeout=10_000)
    assert page.eval_on_selector("#start", "b => getComputedStyle(b).fontWeight") == "600"
    page.close()


def test_live_session_fills_the_panels(live: tuple[Any, LiveRun]) -> None:
    page, run = live
    assert run.chunks_sent >= CLIP_S * 2, run  # 250 ms chunks, whatever the encoder's size
    screen = page.inner_text("#screen")
    assert "Streaming inference" in screen, screen
    transcript = page.inner_text("#committed").lower()
    assert "lecture" in transcript and "streaming" in transcript, transcript
    assert page.inner_text("#partial") == ""  # the end of input committed the last words
    rows = page.eval_on_selector_all(
        "#stages tbody tr", "rs => rs.map(r => r.cells[0].textContent)"
    )
    assert any(name.startswith("ocr") for name in rows), rows
    assert "x" in page.inner_text("#ocr-resolution")
    assert page.inner_text("#status") == "ended"


def test_chat_text_becomes_a_text_event(live: tuple[Any, LiveRun], base_url: str) -> None:
    page, run = live
    chat = page.inner_text("#chat")
    assert "alice" in chat and CHAT in chat, chat
    # The same event is in the session's stream, as the JSONL sink would write it.
    req = urllib.request.Request(
        f"{base_url}/api/sessions/{run.session_id}/events",
        headers={"Authorization": f"Bearer {TOKEN}", "Accept": "text/event-stream"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        records = [
            json.loads(line[len("data:") :])
            for line in resp.read().decode().splitlines()
            if line.startswith("data:")
        ]
    texts = [r for r in records if r["type"] == "text"]
    assert [(r["author"], r["text"], r["kind"]) for r in texts] == [("alice", CHAT, "chat")]
    assert records[-1]["type"] == "stats" and records[-1]["final"]


def test_phone_viewport_has_no_horizontal_overflow(
    live: tuple[Any, LiveRun], tmp_path: Path
) -> None:
    page, _ = live
    page.set_viewport_size({"width": 390, "height": 844})
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths
    columns = page.eval_on_selector(
        "main.grid", "g => getComputedStyle(g).gridTemplateColumns.split(' ').length"
    )
    assert columns == 1
    page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})


@pytest.mark.slow
def test_browser_run_matches_the_file_run(tmp_path: Path) -> None:
    """Acceptance: the full demo through the browser scores like the file run (benchmark)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "browser_e2e.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    print(out.stdout)  # the table, shown by `pytest -rA`
    result = json.loads(out.stdout.strip().splitlines()[-1])
    file, web = result["file"], result["browser"]
    assert web["ocr_cer"] <= file["ocr_cer"] + 0.01, result
    assert web["asr_wer"] <= file["asr_wer"] + 0.01, result
    assert web["ocr_p95_ms"] <= 1.3 * file["ocr_p95_ms"], result
    assert web["asr_commit_p95_ms"] <= 1.3 * file["asr_commit_p95_ms"], result
