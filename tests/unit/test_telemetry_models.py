"""Model versions in telemetry: a stage's `model_info` (name, precision, runtime packages with
their installed versions) lands on its spans and as one `streamfuse.model.info` series per
stage on the Prometheus endpoint; stages without a model add neither. Real SDK, real pipeline,
real endpoint on loopback; the real stages' info is checked by the integration tests."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from importlib.metadata import version

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamfuse import telemetry
from streamfuse.frames import Frame, VideoFrame
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.pipeline import Observer, Pipeline, Stage
from streamfuse.pipeline.tracing import TracingObserver
from streamfuse.sources.synthetic import SyntheticSource
from streamfuse.telemetry import TelemetryConfig, names
from streamfuse.telemetry.metrics import ModelInfo

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("clean_otel")]


class Reader(Stage):
    """Stands in for a model stage: its model is known once set up, as a real one's is."""

    input_types = (VideoFrame,)

    def __init__(self) -> None:
        super().__init__("reader")
        self.loaded = False

    async def setup(self) -> None:
        self.loaded = True

    def model_info(self) -> ModelInfo | None:
        return ModelInfo("toy-det+toy-rec", "int8", ("onnxruntime",)) if self.loaded else None

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        yield frame


class Plain(Stage):
    input_types = (VideoFrame,)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        return
        yield  # pragma: no cover


def test_model_info_names_the_installed_package_versions() -> None:
    info = ModelInfo("whisper tiny.en", "int8", ("onnxruntime", "no-such-package-here"))
    assert info.runtime == f"onnxruntime {version('onnxruntime')}, no-such-package-here ?"
    assert info.span_attributes() == {
        names.ATTR_MODEL_NAME: "whisper tiny.en",
        names.ATTR_MODEL_PRECISION: "int8",
        names.ATTR_MODEL_RUNTIME: info.runtime,
    }
    assert info.metric_attributes("asr:x") == {
        "stage": "asr:x",
        "model": "whisper tiny.en",
        "precision": "int8",
        "runtime": info.runtime,
    }


def test_spans_of_a_model_stage_carry_its_model() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader, plain = Reader(), Plain()
    source = SyntheticSource(0.5, fps=10, audio=False, size=(32, 18))
    pipeline = Pipeline().link(source, reader).link(reader, plain)
    pipeline.observe(TracingObserver(provider.get_tracer("test"), sample_ratio=1.0))
    asyncio.run(pipeline.run())
    provider.shutdown()
    spans = exporter.get_finished_spans()
    readers = [s for s in spans if s.name == "reader"]
    others = [s for s in spans if s.name != "reader"]
    assert len(readers) >= 5 and others
    version_text = f"onnxruntime {version('onnxruntime')}"
    for span in readers:
        assert span.attributes is not None
        assert span.attributes[names.ATTR_MODEL_NAME] == "toy-det+toy-rec"
        assert span.attributes[names.ATTR_MODEL_PRECISION] == "int8"
        assert span.attributes[names.ATTR_MODEL_RUNTIME] == version_text
    assert all(names.ATTR_MODEL_NAME not in (s.attributes or {}) for s in others)


def test_prometheus_endpoint_has_one_model_info_series_per_model_stage() -> None:
    tel = telemetry.setup(TelemetryConfig(prometheus_port=0))
    assert tel is not None and tel.prometheus_address is not None
    host, port = tel.prometheus_address
    reader, plain = Reader(), Plain()
    source = SyntheticSource(0.5, fps=10, audio=False, size=(32, 18))
    pipeline = Pipeline("models").link(source, reader).link(reader, plain)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    class ScrapeAtEnd(Observer):  # the last moment the pipeline runs
        def on_end(self, wall: float) -> None:
            self.text = scrape()

    at_end = ScrapeAtEnd()
    asyncio.run(pipeline.observe(at_end).run())
    text = at_end.text

    def model_lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("streamfuse_model_info{")]

    info = model_lines(text)
    assert len(info) == 1, info
    assert model_lines(scrape()) == []  # a finished pipeline reports no model
    (line,) = info
    assert 'stage="reader"' in line and 'model="toy-det+toy-rec"' in line
    assert 'precision="int8"' in line and f'runtime="onnxruntime {version("onnxruntime")}"' in line
    assert line.endswith(" 1.0")


def test_lm_stage_reports_the_model_it_loaded_and_not_one_it_was_handed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import streamfuse.lm.loader
    from streamfuse.testing.tiny_lm import tiny_model

    config = LMStageConfig.model_validate({"lm": {"model": {"source": "/models/gemma-3-1b"}}})
    monkeypatch.setattr(
        streamfuse.lm.loader, "load_model", lambda cfg: (tiny_model(weights="int8"), object())
    )
    stage = LMStage(config)
    assert stage.model_info() is None  # not set up

    async def set_up_and_down() -> ModelInfo | None:
        await stage.setup()
        try:
            return stage.model_info()
        finally:
            await stage.teardown()

    info = asyncio.run(set_up_and_down())
    assert info == ModelInfo("gemma-3-1b", "int8", ("torch",))
    assert info.runtime == f"torch {version('torch')}"
