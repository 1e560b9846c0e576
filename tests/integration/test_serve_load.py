"""`streamfuse serve` under its session limit: eight live sessions at once on two cores (each
fed the test clip in real time, as a browser would), their OCR reads through one shared pool,
a ninth refused; and a real Prometheus server scraping the service's token-protected /metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from streamfuse.server import ServeConfig, serve_in_thread
from streamfuse.server.client import ServeClient
from streamfuse.testing.media import encode_webm
from streamfuse.testing.prometheus import PrometheusServer, find_prometheus

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "assets" / "test" / "short.mp4"
TRUTH = json.loads(SHORT.with_suffix(".truth.json").read_text())
TOKEN = "load-test-token"
SESSIONS = 8


def test_eight_live_sessions_at_once_without_errors_and_a_ninth_refused(
    tmp_path: Path,
) -> None:
    # A dashboard asks the camera for 10 frames/s: plenty for slides, a third of the decoding.
    data = encode_webm(SHORT, tmp_path / "short.webm", fps=10).read_bytes()
    duration = TRUTH["duration_s"]
    config = ServeConfig(port=0, token=TOKEN, max_sessions=SESSIONS, idle_timeout_s=60.0)

    async def feed(client: ServeClient, sid: str) -> list[dict[str, Any]]:
        results = asyncio.create_task(_collect(client, sid))
        await client.send_media(sid, data, chunk_bytes=16 << 10, over_s=duration)
        return await results

    async def scenario(url: str) -> tuple[list[list[dict[str, Any]]], int, str]:
        async with ServeClient(url, TOKEN) as client:
            ids = [(await client.create_session())["id"] for _ in range(SESSIONS)]
            refused = await client.http.post("/api/sessions", json={})
            results = await asyncio.gather(*(feed(client, sid) for sid in ids))
            return results, refused.status_code, refused.text

    with serve_in_thread(config) as url:
        results, status, detail = asyncio.run(asyncio.wait_for(scenario(url), 300))
    assert status == 429 and f"session limit reached ({SESSIONS} running)" in detail
    for records in results:
        errors = [r for r in records if r["type"] == "error"]
        assert not errors, errors
        assert len([r for r in records if r["type"] == "ocr"]) >= len(TRUTH["ocr"])
        assert [r for r in records if r["type"] == "asr"]
        final = records[-1]
        assert final["type"] == "stats" and final["final"] is True
        # How far behind real time they ran is measured by benchmarks/serve_sessions.py.


async def _collect(client: ServeClient, session_id: str) -> list[dict[str, Any]]:
    return [r async for r in client.events(session_id)]


@pytest.mark.skipif(find_prometheus() is None, reason="needs the `prometheus` binary")
def test_prometheus_scrapes_the_service_metrics_with_its_token(tmp_path: Path) -> None:
    config = ServeConfig(port=0, token=TOKEN)
    with serve_in_thread(config) as url:
        target = urlparse(url).netloc
        with PrometheusServer([target], tmp_path, bearer_token=TOKEN) as prom:
            prom.wait_until_up(timeout_s=60)

            async def run_session() -> str:
                async with ServeClient(url, TOKEN) as client:
                    s = await client.create_session(input=str(SHORT), realtime=False)
                    _ = [r async for r in client.events(s["id"])]
                    return str(s["id"])

            asyncio.run(asyncio.wait_for(run_session(), 120))
            series = prom.wait_for(
                lambda p: p.query('streamfuse_stage_latency_seconds_count{stage=~"ocr:.*"}'),
                timeout_s=30,
            )
            assert series and series[0]["value"] > 0
            up = prom.query("up")
            assert up and up[0]["value"] == 1.0
            # The service's own series: one URL session ran, then none.
            assert prom.wait_for(
                lambda p: p.query(
                    'max_over_time(streamfuse_serve_sessions{live="false"}[1m]) == 1'
                ),
                timeout_s=30,
            )
            assert prom.wait_for(
                lambda p: p.query('streamfuse_serve_sessions{live="false"} == 0'), timeout_s=30
            )
