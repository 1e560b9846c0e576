"""`streamfuse.telemetry.setup`: off installs nothing, on is idempotent and shuts down cleanly,
the OTEL_* variables are honoured, and the Prometheus endpoint serves the pipeline's metrics
over HTTP on loopback while a real (synthetic) pipeline runs."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import urllib.request
from collections.abc import AsyncIterator

import pytest

from streamfuse import telemetry
from streamfuse.errors import ConfigError
from streamfuse.frames import Frame, VideoFrame
from streamfuse.pipeline import Pipeline, Stage
from streamfuse.sources.synthetic import SyntheticSource
from streamfuse.telemetry import TelemetryConfig
from streamfuse.telemetry.config import DEFAULT_SAMPLE_RATIO
from streamfuse.telemetry.metrics import instruments

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("clean_otel")]


def scrape(address: tuple[str, int]) -> str:
    host, port = address
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def refused(address: tuple[str, int]) -> bool:
    try:
        socket.create_connection(address, timeout=1).close()
    except OSError:
        return True
    return False


def test_off_by_default_installs_nothing() -> None:
    handlers = list(logging.getLogger("streamfuse").handlers)
    api = instruments()
    assert not TelemetryConfig().enabled()
    assert telemetry.setup() is None
    assert telemetry.setup(TelemetryConfig(sample_ratio=1.0)) is None
    assert telemetry.current() is None
    assert instruments() is api  # still the API's (no-op) instruments
    assert logging.getLogger("streamfuse").handlers == handlers


def test_sdk_disabled_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert telemetry.setup(TelemetryConfig(prometheus_port=0, otlp=True)) is None
    assert telemetry.current() is None


def test_setup_is_idempotent_and_shutdown_closes_everything() -> None:
    config = TelemetryConfig(prometheus_port=0)
    first = telemetry.setup(config)
    assert first is not None and first.prometheus_address is not None
    assert first.prometheus_address[0] == "127.0.0.1"  # loopback unless told otherwise
    assert telemetry.setup(TelemetryConfig(prometheus_port=0)) is first  # equal config
    assert telemetry.current() is first
    recording = instruments()
    assert recording is instruments()
    # Another config replaces the installation: the old endpoint is closed.
    second = telemetry.setup(TelemetryConfig(prometheus_port=0, service_name="other"))
    assert second is not None and second is not first
    assert refused(first.prometheus_address)
    assert 'service_name="other"' in scrape(second.prometheus_address)  # type: ignore[arg-type]
    telemetry.shutdown()
    assert telemetry.current() is None
    assert refused(second.prometheus_address)  # type: ignore[arg-type]
    assert instruments() is not recording
    telemetry.shutdown()  # twice is fine


def test_environment_variables_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    config = TelemetryConfig(otlp=True)
    assert config.ratio() == DEFAULT_SAMPLE_RATIO
    assert config.protocol("traces") == "http/protobuf"
    assert config.tracing()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    assert config.ratio() == 0.25
    assert TelemetryConfig(otlp=True, sample_ratio=0.5).ratio() == 0.5  # explicit wins
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    assert not config.tracing()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert config.protocol("metrics") == "grpc"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL", "http/protobuf")
    assert config.protocol("logs") == "http/protobuf"  # the per-signal variable wins
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match="http/json"):
        config.protocol("traces")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "2500")
    assert config.interval_s() == 2.5
    assert not TelemetryConfig.endpoint_in_env()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")
    assert TelemetryConfig.endpoint_in_env()


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        TelemetryConfig(sample_ratio=2.0)
    with pytest.raises(ValueError):
        TelemetryConfig(prometheus_port=70_000)
    with pytest.raises(ValueError):
        TelemetryConfig(otlp_protocol="http/json")  # type: ignore[arg-type]


class Slow(Stage):
    """Holds each frame a moment so the queue in front of it fills."""

    input_types = (VideoFrame,)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        await asyncio.sleep(0.02)  # 30 frames: the run lasts well past the mid-run scrape
        return
        yield  # pragma: no cover


def test_prometheus_endpoint_serves_the_pipeline_metrics() -> None:
    tel = telemetry.setup(TelemetryConfig(prometheus_port=0))
    assert tel is not None and tel.prometheus_address is not None
    address = tel.prometheus_address
    pipeline = Pipeline("promtest").link(
        SyntheticSource(1.0, fps=30, audio=False, size=(64, 36)), Slow("slow"), maxsize=4
    )
    scraped: list[str] = []

    async def go() -> None:
        task = asyncio.create_task(pipeline.run())
        await asyncio.sleep(0.2)  # mid-run: the queue is watched
        scraped.append(await asyncio.to_thread(scrape, address))
        await task

    asyncio.run(go())
    scraped.append(scrape(address))
    mid, end = scraped
    depth = [line for line in mid.splitlines() if line.startswith("streamfuse_queue_depth{")]
    assert depth and 'pipeline="promtest"' in depth[0] and 'stage="slow"' in depth[0]
    assert 'pipeline="promtest"' not in end  # a finished pipeline reports no queue
    for name in (
        "streamfuse_stage_latency_seconds_bucket",
        "streamfuse_stage_latency_seconds_count",
        "streamfuse_stage_frames_total",
        "streamfuse_process_cpu_time_seconds_total",
        "streamfuse_process_cpu_utilization",
        "target_info",
    ):
        assert name in end, name
    frames = [
        line
        for line in end.splitlines()
        if line.startswith("streamfuse_stage_frames_total{") and 'stage="slow"' in line
    ]
    assert frames and float(frames[0].rsplit(" ", 1)[1]) == 31.0  # 30 frames + the flush
    assert 'service_name="streamfuse"' in end and "service_version=" in end
    assert "host_name=" in end


def metric_value(text: str, name: str, label: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {label} not in the scrape")


def test_lm_engine_metrics_tokens_rate_and_kv_occupancy() -> None:
    from streamfuse.lm.config import LMConfig
    from streamfuse.lm.engine import LMEngine
    from streamfuse.telemetry.metrics import watch_lm_engine
    from streamfuse.testing.tiny_lm import tiny_model

    gc.collect()  # engines of earlier tests, no longer referenced, stop reporting
    tel = telemetry.setup(TelemetryConfig(prometheus_port=0))
    assert tel is not None and tel.prometheus_address is not None
    config = LMConfig.model_validate({"pool": {"num_slots": 4, "max_tokens": 64}})
    engine = LMEngine(tiny_model(weights="int8", seed=1), config)
    watch_lm_engine(engine)
    prompt = tuple(range(2, 22))
    engine.feed("s", prompt).wait()  # a session keeps its slot and its 20 tokens
    first = scrape(tel.prometheus_address)
    engine.generate(list(prompt), 12, speculative=False, stop_ids=())
    second = scrape(tel.prometheus_address)
    assert metric_value(first, "streamfuse_lm_tokens_total", 'kind="prefill"') >= 20
    assert metric_value(second, "streamfuse_lm_tokens_total", 'kind="decode"') >= 12
    assert metric_value(second, "streamfuse_lm_kv_slots") == 0.25  # 1 of 4 slots held
    assert metric_value(second, "streamfuse_lm_kv_tokens") == pytest.approx(20 / (4 * 64))
    assert (
        metric_value(second, "streamfuse_lm_decode_rate_per_second") > 0
    )  # tokens/s between scrapes
