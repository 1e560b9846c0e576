"""The telemetry docs stay true: the example Collector config wires each signal to an exporter
that takes it (traces never into the Prometheus exporter), docs/telemetry.md names every
metric streamfuse records, and the Prometheus scrape configs of the docs pass `promtool`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from streamfuse.telemetry import names

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PROMTOOL = shutil.which("promtool") or (
    "/usr/bin/promtool" if Path("/usr/bin/promtool").is_file() else None
)

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


def scrape_configs(markdown: str) -> list[str]:
    """The YAML blocks of `markdown` that are Prometheus configs (they have scrape_configs)."""
    blocks = re.findall(r"```yaml\n(.*?)```", markdown, re.S)
    return [b for b in blocks if "scrape_configs:" in b]


def readme_telemetry_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Telemetry")
    return readme[start : readme.index("\n## ", start + 1)]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package `prometheus`) is missing")
@pytest.mark.parametrize("where", ["README.md", "docs/telemetry.md"])
def test_prometheus_scrape_configs_in_the_docs_are_valid(where: str, tmp_path: Path) -> None:
    """Each scrape config passes `promtool check config` and scrapes the port the doc's own
    commands give `--prometheus-port`."""
    assert PROMTOOL is not None
    text = readme_telemetry_section() if where == "README.md" else (ROOT / where).read_text()
    configs = scrape_configs(text)
    assert configs, f"no Prometheus scrape config in {where}"
    ports = set(re.findall(r"--prometheus-port (\d+)", text))
    assert ports
    for i, block in enumerate(configs):
        path = tmp_path / f"prometheus-{i}.yml"
        path.write_text(block)
        check = subprocess.run(
            [PROMTOOL, "check", "config", str(path)], capture_output=True, text=True, timeout=60
        )
        assert check.returncode == 0, check.stdout + check.stderr
        targets = {
            t
            for job in yaml.safe_load(block)["scrape_configs"]
            for static in job.get("static_configs", [])
            for t in static["targets"]
        }
        assert {f"127.0.0.1:{p}" for p in ports} <= targets
