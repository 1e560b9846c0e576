"""A real Prometheus server (Debian's `prometheus`, started here by `streamfuse.testing.prometheus`)
scrapes streamfuse's endpoint on loopback: a live `streamfuse run --prometheus-port` of the test
clip, an overloaded in-process pipeline for the drop counter, and a token-protected endpoint
(as `serve`'s /metrics is). The metrics are read back through Prometheus's HTTP API with their
labels (the models each stage runs among them): names, units and labels as a real Prometheus
stores them, not as the exporter's text looks."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path

import pytest

from streamfuse import telemetry
from streamfuse.frames import Frame, VideoFrame
from streamfuse.pipeline import OverloadPolicy, Pipeline, Stage
from streamfuse.sources.synthetic import SyntheticSource
from streamfuse.telemetry import TelemetryConfig
from streamfuse.testing.media import remux
from streamfuse.testing.prometheus import PrometheusServer, find_prometheus, free_port

PROMETHEUS = find_prometheus()

pytestmark = [
    pytest.mark.integration,
    pytest.mark.usefixtures("clean_otel"),
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="the prometheus binary is missing (Debian package `prometheus`, which .ci/run "
        "installs)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "assets" / "test" / "short.mp4"

#: Prometheus name of each metric the live run must deliver -> labels every series has.
EXPECTED = {
    "streamfuse_stage_latency_seconds_bucket": {"stage", "le"},
    "streamfuse_stage_latency_seconds_count": {"stage"},
    "streamfuse_stage_frames_total": {"stage"},
    "streamfuse_queue_depth": {"stage", "pipeline"},
    "streamfuse_event_latency_seconds_count": {"type", "sink"},
    "streamfuse_ocr_resolution_px_count": {"stage"},
    "streamfuse_ocr_det_side_px_bucket": {"stage", "le"},
    "streamfuse_asr_commit_latency_seconds_count": {"stage"},
    "streamfuse_process_cpu_time_seconds_total": {"mode"},
    "streamfuse_process_cpu_utilization": set(),
    "streamfuse_model_info": {"stage", "model", "precision", "runtime"},
    "target_info": {"service_name", "service_version", "host_name"},
}


def missing(prom: PrometheusServer) -> set[str]:
    """Expected metric names not stored yet (over all stored time)."""
    stored = {s["__name__"] for s in prom.series('{__name__=~"streamfuse_.+|target_info"}')}
    return set(EXPECTED) - stored


def test_prometheus_scrapes_a_live_run(tmp_path: Path) -> None:
    clip = remux(SHORT, tmp_path / "lecture.mp4")  # a copy with a stream id of its own
    port = free_port()
    out = tmp_path / "ev.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    run = subprocess.Popen(
        [sys.executable, "-m", "streamfuse.cli", "run", str(clip), "--realtime", "--no-live"]
        + ["--prometheus-port", str(port), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    prom = PrometheusServer([f"127.0.0.1:{port}"], tmp_path / "prometheus", scrape_interval_s=1.0)
    try:
        prom.start()
        # The endpoint opens once the pipeline is built (imports first); the clip plays 12 s.
        targets = prom.wait_until_up(timeout_s=90)
        assert targets[0]["labels"]["job"] == "streamfuse"
        prom.wait_for(lambda p: not missing(p) or run.poll() is not None, timeout_s=120)
        _, stderr = run.communicate(timeout=180)
        assert run.returncode == 0, stderr.decode()[-2000:]
        assert not missing(prom), f"not stored: {missing(prom)}\n{prom.log_tail()}"

        for name, labels in EXPECTED.items():
            series = prom.series(name)
            assert series, name
            for s in series:
                assert labels <= set(s), (name, s)
                assert s["job"] == "streamfuse" and s["instance"] == f"127.0.0.1:{port}"
        stages = {s["stage"] for s in prom.series("streamfuse_stage_frames_total")}
        assert {"change:lecture", "ocr:lecture", "asr:lecture", "collect_sink"} <= stages
        info = prom.series("target_info")[0]
        assert info["service_name"] == "streamfuse"
        models = {s["stage"]: s for s in prom.series("streamfuse_model_info")}
        assert set(models) == {"ocr:lecture", "asr:lecture"}
        ocr, asr = models["ocr:lecture"], models["asr:lecture"]
        # One stream: OCR's `auto` precision is FP32 (rapidocr's own det + rec models).
        assert "_det" in ocr["model"] and "_rec" in ocr["model"] and ocr["precision"] == "fp32"
        assert ocr["runtime"].startswith(f"rapidocr {version('rapidocr')}, onnxruntime ")
        # tiny.en commits; base re-reads in the background (`background_revise`).
        assert (asr["model"], asr["precision"]) == ("whisper tiny.en+base", "int8")
        assert asr["runtime"].startswith(f"faster-whisper {version('faster-whisper')}, ")

        # Values: what Prometheus holds agrees with the run's own record of itself.
        records = [json.loads(line) for line in out.read_text().splitlines()]
        n_ocr = sum(r["type"] == "ocr" for r in records)
        stats = next(r for r in records if r["type"] == "stats" and r.get("final"))
        ocr_frames = stats["stages"]["ocr:lecture"]["frames"]
        window = "[10m]"  # the run has ended: read the last sample before its series went stale
        (reads,) = prom.query(
            f'max_over_time(streamfuse_ocr_resolution_px_count{{stage="ocr:lecture"}}{window})'
        )
        assert n_ocr <= reads["value"] <= ocr_frames
        (frames,) = prom.query(
            f'max_over_time(streamfuse_stage_frames_total{{stage="ocr:lecture"}}{window})'
        )
        assert 1 <= frames["value"] <= ocr_frames
        # Mean OCR input height: the clip's frames are read at their full height or less.
        (mean,) = prom.query(
            f'max_over_time(streamfuse_ocr_resolution_px_sum{{stage="ocr:lecture"}}{window})'
            f' / max_over_time(streamfuse_ocr_resolution_px_count{{stage="ocr:lecture"}}{window})'
        )
        assert 100 <= mean["value"] <= 1080
        (commits,) = prom.query(
            f'max_over_time(streamfuse_asr_commit_latency_seconds_count{{stage="asr:lecture"}}{window})'
        )
        assert commits["value"] >= 1
        cpu = prom.query(f"max_over_time(streamfuse_process_cpu_time_seconds_total{window})")
        assert {c["metric"]["mode"] for c in cpu} == {"user", "system"}
        assert sum(c["value"] for c in cpu) > 0.5  # models loaded and ran
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=30)
        prom.close()


class Slow(Stage):
    """Takes 20 ms a frame: a 100 fps source overruns its 2-frame queue."""

    input_types = (VideoFrame,)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        await asyncio.sleep(0.02)
        return
        yield  # pragma: no cover


def test_prometheus_stores_drops_with_the_policy(tmp_path: Path) -> None:
    tel = telemetry.setup(TelemetryConfig(prometheus_port=0))
    assert tel is not None and tel.prometheus_address is not None
    host, port = tel.prometheus_address
    with PrometheusServer([f"{host}:{port}"], tmp_path, scrape_interval_s=0.5) as prom:
        prom.wait_until_up(timeout_s=60)
        pipeline = Pipeline("droptest").link(
            SyntheticSource(1.0, fps=100, audio=False, size=(32, 18), realtime=True),
            Slow("slow"),
            maxsize=2,
            policy=OverloadPolicy.DROP_OLDEST,
        )
        asyncio.run(pipeline.run())
        dropped = pipeline.stages[-1].stats.dropped
        assert dropped > 10
        query = 'streamfuse_queue_dropped_total{stage="slow"}'
        stored = prom.wait_for(
            lambda p: [r for r in p.query(query) if r["value"] == dropped], timeout_s=30
        )
        assert stored, prom.query(query)
        assert stored[0]["metric"]["policy"] == "drop-oldest"


def test_prometheus_sends_the_bearer_token_to_the_metrics_path(tmp_path: Path) -> None:
    """What `serve`'s /metrics needs: a path of its own and a token on every scrape."""
    seen: list[tuple[str, str | None]] = []

    class Protected(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != "Bearer s3cret":
                self.send_response(401)
                self.end_headers()
                return
            body = b"# TYPE guarded_total counter\nguarded_total 7\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Protected)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    target = f"127.0.0.1:{server.server_address[1]}"
    try:
        with PrometheusServer(
            [target], tmp_path, metrics_path="/app/metrics", bearer_token="s3cret"
        ) as prom:
            prom.wait_until_up(timeout_s=60)
            (value,) = prom.wait_for(lambda p: p.query("guarded_total"), timeout_s=30)
            assert value["value"] == 7.0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    assert seen and all(s == ("/app/metrics", "Bearer s3cret") for s in seen)
