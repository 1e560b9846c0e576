"""Telemetry exported to real OTLP receivers on loopback (`streamfuse.testing.otlp`): the trace
of every `ocr` event of a real run (source -> change -> ocr -> event -> sink, linked, with
durations), the CLI configured by OTEL_* variables alone, logs carrying trace ids, and the gRPC
exporter."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamfuse import telemetry
from streamfuse.app import StreamfuseConfig, build_pipeline, run_job
from streamfuse.assets import DemoFiles
from streamfuse.frames import Frame, VideoFrame
from streamfuse.pipeline import Pipeline, Stage
from streamfuse.pipeline.tracing import TracingObserver
from streamfuse.sinks import CollectSink
from streamfuse.sources.synthetic import SyntheticSource
from streamfuse.telemetry import TelemetryConfig, names
from streamfuse.testing.otlp import OtlpGrpcReceiver, OtlpReceiver, ReceivedSpan, format_trace
from streamfuse.testing.prometheus import free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("clean_otel")]

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "assets" / "test" / "short.mp4"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


def ocr_chains(spans: list[ReceivedSpan]) -> list[list[ReceivedSpan]]:
    """For each `event ocr` span: [source, change, ocr, event, collecting sink] checked to be
    one parent-child chain in one trace, the event linked to the first three."""
    by_id = {s.span_id: s for s in spans}
    chains = []
    for event in (s for s in spans if s.name == "event ocr"):
        ocr = by_id[event.parent_span_id]
        change = by_id[ocr.parent_span_id]
        source = by_id[change.parent_span_id]
        assert source.name == "media:short.mp4"
        assert (change.name, ocr.name) == ("change:short", "ocr:short")
        assert source.parent_span_id == ""
        assert {s.trace_id for s in (source, change, ocr, event)} == {event.trace_id}
        assert [(t, sid) for t, sid, _ in event.links] == [
            (s.trace_id, s.span_id) for s in (source, change, ocr)
        ]
        assert [a[names.ATTR_STAGE] for _, _, a in event.links] == [
            "media:short.mp4",
            "change:short",
            "ocr:short",
        ]
        # Every sink's call on the event is the event's child.
        (sink,) = [
            s for s in spans if s.parent_span_id == event.span_id and s.name == "collect_sink"
        ]
        chains.append([source, change, ocr, event, sink])
    return chains


def test_ocr_event_trace_and_metrics_over_otlp_http(receiver: OtlpReceiver) -> None:
    config = StreamfuseConfig(
        asr=False,
        telemetry=TelemetryConfig(
            otlp=True, otlp_endpoint=receiver.endpoint, sample_ratio=1.0, metric_interval_s=0.5
        ),
    )
    sink = CollectSink()

    async def go() -> None:
        job = await build_pipeline([str(SHORT)], config, [sink])
        assert any(isinstance(o, TracingObserver) for o in job.pipeline.observers)
        await run_job(job, [sink])

    asyncio.run(go())
    telemetry.shutdown()  # flushes
    spans = receiver.spans()
    chains = ocr_chains(spans)
    assert len(chains) == len(sink.of_type("ocr")) == 3
    for source, change, ocr, event, sink_span in chains:
        # Real durations, in order: OCR is the long hop and its span covers its own work.
        assert source.start_ns <= change.start_ns <= ocr.start_ns <= event.start_ns
        assert event.start_ns <= sink_span.start_ns
        assert ocr.duration_ms > 10.0
        assert ocr.duration_ms >= 1000 * ocr.attributes[names.ATTR_BUSY] - 0.01
        assert change.attributes[names.ATTR_FRAME_TYPE] == "VideoFrame"
        assert ocr.attributes[names.ATTR_FRAME_TYPE] == "KeyFrame"
        # The OCR models and their versions, on the OCR spans only.
        assert "_det" in ocr.attributes[names.ATTR_MODEL_NAME]
        assert ocr.attributes[names.ATTR_MODEL_PRECISION] == "fp32"
        assert ocr.attributes[names.ATTR_MODEL_RUNTIME].startswith(
            f"rapidocr {version('rapidocr')}, onnxruntime {version('onnxruntime')}"
        )
        assert names.ATTR_MODEL_NAME not in change.attributes
        latency_s = event.attributes[names.ATTR_EVENT_LATENCY]
        assert latency_s * 1e9 == pytest.approx(event.start_ns - source.start_ns, abs=2e6)
    # At ratio 1 every video frame has a source span (~12 s at 30 fps + end of stream).
    assert sum(s.name == "media:short.mp4" for s in spans) > 300
    resource = spans[0].resource
    assert resource["service.name"] == "streamfuse"
    assert resource["service.version"] and resource["host.name"]
    print("\n" + format_trace(spans, chains[0][0].trace_id))
    assert {
        names.STAGE_LATENCY,
        names.STAGE_FRAMES,
        names.QUEUE_DEPTH,
        names.EVENT_LATENCY,
        names.OCR_RESOLUTION,
        names.OCR_DET_SIDE,
        names.PROCESS_CPU_TIME,
        names.PROCESS_CPU_UTILIZATION,
    } <= receiver.metric_names()


def test_cli_exports_when_an_otlp_endpoint_is_in_the_environment(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    out = tmp_path / "ev.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    env["OTEL_SERVICE_NAME"] = "lecture-ocr"
    proc = subprocess.run(
        [sys.executable, "-m", "streamfuse.cli", "run", str(SHORT), "--no-asr", "--no-live"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    spans = receiver.spans()
    # Default ratio (0.05): few plain frames are traced, but every event has its whole chain.
    n_ocr = sum('"type": "ocr"' in line for line in out.read_text().splitlines())
    assert len(ocr_chains(spans)) == n_ocr == 3
    assert sum(s.name == "media:short.mp4" for s in spans) < 100
    assert spans[0].resource["service.name"] == "lecture-ocr"
    assert names.STAGE_LATENCY in receiver.metric_names()


def test_demo_takes_the_telemetry_options_of_run(
    receiver: OtlpReceiver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`demo --otlp --trace-ratio --prometheus-port` (the test clip stands in for the demo's)."""
    import streamfuse.assets
    from streamfuse.cli import app

    @contextmanager
    def short_demo() -> Iterator[DemoFiles]:
        yield DemoFiles(clip=SHORT, truth=SHORT.with_suffix(".truth.json"))

    installed: list[TelemetryConfig] = []
    real_setup = telemetry.setup

    def spy(config: TelemetryConfig | None = None) -> telemetry.Telemetry | None:
        installed.append(config or TelemetryConfig())
        return real_setup(config)

    monkeypatch.setattr(streamfuse.assets, "demo_files", short_demo)
    monkeypatch.setattr(telemetry, "setup", spy)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    port = free_port()
    result = CliRunner().invoke(
        app,
        ["demo", "--no-realtime", "--no-live", "--out", str(tmp_path / "ev.jsonl")]
        + ["--otlp", "--trace-ratio", "1", "--prometheus-port", str(port)],
    )
    assert result.exit_code == 0, result.output
    (config,) = installed
    assert (config.otlp, config.sample_ratio, config.prometheus_port) == (True, 1.0, port)
    spans = receiver.spans()
    assert len(ocr_chains(spans)) == 3
    # Ratio 1: every video frame is traced, not only those behind an event.
    assert sum(s.name == "media:short.mp4" for s in spans) > 300


class Chatty(Stage):
    """Logs (as stage code would) on the event loop and on its worker thread."""

    input_types = (VideoFrame,)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        logging.getLogger("streamfuse.test.chatty").warning("loop frame %d", frame.t_media)
        await self.run_blocking(
            logging.getLogger("streamfuse.test.chatty").warning, "thread frame %d", frame.t_media
        )
        return
        yield  # pragma: no cover


def run_chatty(config: TelemetryConfig) -> None:
    tel = telemetry.setup(config)
    assert tel is not None and tel.tracer is not None
    logging.getLogger("streamfuse.test.chatty").warning("before the run")
    pipeline = Pipeline().link(SyntheticSource(0.1, fps=30, audio=False, size=(32, 18)), Chatty())
    pipeline.observe(TracingObserver(tel.tracer, sample_ratio=1.0))
    asyncio.run(pipeline.run())
    telemetry.shutdown()


def test_logs_carry_the_trace_of_the_frame_being_processed(receiver: OtlpReceiver) -> None:
    run_chatty(TelemetryConfig(otlp=True, otlp_endpoint=receiver.endpoint))
    logs = receiver.log_records()
    spans = {(s.trace_id, s.span_id): s for s in receiver.spans()}
    outside = [r for r in logs if r.body == "before the run"]
    assert outside and outside[0].trace_id == "" and outside[0].severity == "WARN"
    inside = [r for r in logs if "frame" in str(r.body)]
    assert len(inside) == 6  # 3 frames, on the loop and on the worker thread
    for record in inside:
        span = spans[(record.trace_id, record.span_id)]
        assert span.name == "chatty"
    assert inside[0].resource["service.name"] == "streamfuse"


def test_grpc_exporter_sends_traces_metrics_and_logs() -> None:
    with OtlpGrpcReceiver() as grpc_receiver:
        run_chatty(
            TelemetryConfig(otlp=True, otlp_protocol="grpc", otlp_endpoint=grpc_receiver.endpoint)
        )
        spans = grpc_receiver.spans()
        assert {"synthetic", "chatty"} <= {s.name for s in spans}
        assert names.STAGE_FRAMES in grpc_receiver.metric_names()
        assert any(r.trace_id for r in grpc_receiver.log_records())
