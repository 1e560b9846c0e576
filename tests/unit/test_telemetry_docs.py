"""The telemetry docs stay true: the example Collector config wires each signal to an exporter
that takes it (traces never into the Prometheus exporter), and docs/telemetry.md names every
metric streamfuse records."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamfuse.telemetry import names

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"

# Collector exporter types (the part before "/") and the signals each takes.
EXPORTER_SIGNALS = {
    "otlp_grpc": {"traces", "metrics", "logs"},
    "otlp": {"traces", "metrics", "logs"},  # the gRPC exporter's name before v0.144
    "otlp_http": {"traces", "metrics", "logs"},
    "otlphttp": {"traces", "metrics", "logs"},
    "debug": {"traces", "metrics", "logs"},
    "prometheus": {"metrics"},
    "prometheusremotewrite": {"metrics"},
}


def test_collector_config_sends_each_signal_where_it_can_go() -> None:
    config = yaml.safe_load((DOCS / "otel-collector.yaml").read_text())
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics", "logs"}
    for signal, pipeline in pipelines.items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in config[kind], f"{signal}: {component} is not defined"
        for exporter in pipeline["exporters"]:
            takes = EXPORTER_SIGNALS[exporter.split("/")[0]]
            assert signal in takes, f"{exporter} does not take {signal}"
    # Traces reach a tracing backend over OTLP, metrics a Prometheus exporter.
    assert [e.split("/")[0] for e in pipelines["traces"]["exporters"]] == ["otlp_grpc"]
    assert pipelines["metrics"]["exporters"] == ["prometheus"]
    # The receiver listens where streamfuse's exporters send by default, on loopback.
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["http"]["endpoint"] == "127.0.0.1:4318"
    assert protocols["grpc"]["endpoint"] == "127.0.0.1:4317"


def test_every_metric_and_span_attribute_is_documented() -> None:
    text = (DOCS / "telemetry.md").read_text()
    metrics = [
        value
        for key, value in vars(names).items()
        if key.isupper() and isinstance(value, str) and value.startswith("streamfuse.")
    ]
    assert len(metrics) > 10
    missing = [m for m in metrics if f"`{m}`" not in text]
    assert not missing, f"docs/telemetry.md does not describe {missing}"
