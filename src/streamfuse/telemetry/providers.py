"""`setup`: install the OpenTelemetry SDK behind streamfuse's metrics, traces and logs.

One installation per process: `setup(config)` builds a tracer, meter and logger provider with
one `Resource` (service name and version, host), their exporters (OTLP over HTTP or gRPC, a
Prometheus scrape endpoint) and the logging bridge on the `streamfuse` logger. Calling it again
with an equal config returns the same `Telemetry`; with another config it replaces the first.
A config with no exporter, or `OTEL_SDK_DISABLED=true`, installs nothing and returns None.
`shutdown()` flushes every exporter and stops the endpoint (it also runs at interpreter exit).

The providers are streamfuse's own, not the API's global ones (which an application may have
set, and which can be set only once per process): `metrics.instruments()` records into them,
and the app hands `Telemetry.tracer` to the pipeline's tracing observer.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from streamfuse.telemetry import names
from streamfuse.telemetry.config import TelemetryConfig
from streamfuse.telemetry.metrics import package_version, use_meter_provider

if TYPE_CHECKING:
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

log = logging.getLogger(__name__)

#: Histogram buckets of the latency metrics (s): 1 ms .. 30 s.
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
#: Histogram buckets of the OCR resolution metrics (px).
PIXEL_BUCKETS = (160, 240, 320, 480, 640, 720, 960, 1080, 1280, 1440, 1920, 2160, 3840)

_LOGGER = "streamfuse"


@dataclass
class Telemetry:
    """What `setup` installed. `tracer` is None when traces are off."""

    config: TelemetryConfig
    resource: Resource
    meter_provider: MeterProvider
    tracer_provider: TracerProvider | None = None
    logger_provider: LoggerProvider | None = None
    #: Head-sampling ratio of source data frames (config, else OTEL_TRACES_SAMPLER_ARG).
    sample_ratio: float = 0.0
    #: (host, port) the Prometheus endpoint listens on.
    prometheus_address: tuple[str, int] | None = None
    #: The registry the Prometheus reader fills (`prometheus_client.generate_latest` renders it).
    prometheus_registry: Any = None
    _handler: logging.Handler | None = None
    _server: Any = None
    _server_thread: threading.Thread | None = None
    _closed: bool = field(default=False, repr=False)

    @property
    def tracer(self) -> Tracer | None:
        if self.tracer_provider is None:
            return None
        return self.tracer_provider.get_tracer(names.TRACER_NAME, package_version())

    def force_flush(self, timeout_s: float = 10.0) -> None:
        """Export everything recorded so far (spans, metrics, logs) now."""
        ms = int(timeout_s * 1000)
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(ms)
        self.meter_provider.force_flush(ms)
        if self.logger_provider is not None:
            self.logger_provider.force_flush(ms)

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        use_meter_provider(None)
        if self._handler is not None:
            logging.getLogger(_LOGGER).removeHandler(self._handler)
        # Each provider's shutdown flushes its processors and exporters first.
        for provider in (self.tracer_provider, self.meter_provider, self.logger_provider):
            if provider is None:
                continue
            try:
                provider.shutdown()
            except Exception:
                log.warning("telemetry shutdown of %s failed", type(provider).__name__)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._server_thread is not None:
            self._server_thread.join(timeout=5)


_lock = threading.Lock()
_current: Telemetry | None = None
_atexit_registered = False


def current() -> Telemetry | None:
    """The active installation, if any."""
    return _current


def setup(config: TelemetryConfig | None = None) -> Telemetry | None:
    """Install the SDK for `config` (see the module docstring); None when it asks for nothing."""
    global _current, _atexit_registered
    config = config or TelemetryConfig()
    if not config.enabled():
        return None
    with _lock:
        if _current is not None:
            if _current.config == config:
                return _current
            _current._close()
            _current = None
        telemetry = _install(config)
        _current = telemetry
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    log.info(
        "telemetry on: otlp=%s (%s) prometheus=%s traces=%s ratio=%.3f",
        config.otlp,
        config.protocol("traces") if config.otlp else "-",
        telemetry.prometheus_address,
        telemetry.tracer_provider is not None,
        telemetry.sample_ratio,
    )
    return telemetry


def shutdown() -> None:
    """Flush and remove the active installation (nothing when none is active)."""
    global _current
    with _lock:
        telemetry, _current = _current, None
    if telemetry is not None:
        telemetry._close()


def _resource(config: TelemetryConfig) -> Resource:
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, str] = {
        "service.version": package_version(),
        "host.name": socket.gethostname(),
    }
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = config.service_name
    # `create` merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME with these.
    return Resource.create(attributes)


def _install(config: TelemetryConfig) -> Telemetry:
    from opentelemetry.sdk.metrics import Histogram, MeterProvider
    from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    resource = _resource(config)
    readers: list[MetricReader] = []
    if config.otlp:
        readers.append(
            PeriodicExportingMetricReader(
                _exporter("metrics", config),
                export_interval_millis=config.interval_s() * 1000.0,
            )
        )
    prometheus: tuple[Any, Any, Any, Any] | None = None
    if config.prometheus_port is not None or config.prometheus_registry:
        prometheus = _prometheus(config)
        readers.append(prometheus[0])
    views = [
        View(
            instrument_type=Histogram,
            instrument_unit=unit,
            aggregation=ExplicitBucketHistogramAggregation(boundaries=buckets),
        )
        for unit, buckets in (("s", SECONDS_BUCKETS), ("px", PIXEL_BUCKETS))
    ]
    meter_provider = MeterProvider(metric_readers=readers, resource=resource, views=views)
    telemetry = Telemetry(config=config, resource=resource, meter_provider=meter_provider)
    if prometheus is not None:
        _, telemetry.prometheus_registry, telemetry._server, telemetry._server_thread = prometheus
        if telemetry._server is not None:
            host, port = telemetry._server.server_address[:2]
            telemetry.prometheus_address = (str(host), int(port))
    if config.tracing():
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        # The tracing observer samples frames itself (a frame's chain is kept whole when it
        # leads to an event), so the SDK records every span it is given.
        tracer_provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        tracer_provider.add_span_processor(BatchSpanProcessor(_exporter("traces", config)))
        telemetry.tracer_provider = tracer_provider
        telemetry.sample_ratio = config.ratio()
    if config.otlp and config.logs:
        from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
        from opentelemetry.sdk._logs.export import BatchLogRecordProcessor

        logger_provider = LoggerProvider(resource=resource)
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(_exporter("logs", config)))
        with warnings.catch_warnings():
            # The SDK's handler is deprecated in favour of a separate instrumentation package;
            # it is the same bridge, and one dependency fewer.
            warnings.simplefilter("ignore", DeprecationWarning)
            handler = LoggingHandler(
                level=logging.getLevelName(config.log_level.upper()),
                logger_provider=logger_provider,
            )
        logging.getLogger(_LOGGER).addHandler(handler)
        telemetry.logger_provider = logger_provider
        telemetry._handler = handler
    use_meter_provider(meter_provider)
    return telemetry


def _prometheus(config: TelemetryConfig) -> tuple[Any, Any, Any, Any]:
    """A reader on a registry of its own, served over HTTP when `prometheus_port` is set:
    (reader, registry, server, thread)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    port = config.prometheus_port
    if port is None:
        return reader, registry, None, None
    server, thread = start_http_server(port, addr=config.prometheus_host, registry=registry)
    return reader, registry, server, thread


_HTTP = {
    "traces": ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    "metrics": ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
    "logs": ("opentelemetry.exporter.otlp.proto.http._log_exporter", "OTLPLogExporter"),
}
_GRPC = {
    "traces": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "OTLPSpanExporter"),
    "metrics": ("opentelemetry.exporter.otlp.proto.grpc.metric_exporter", "OTLPMetricExporter"),
    "logs": ("opentelemetry.exporter.otlp.proto.grpc._log_exporter", "OTLPLogExporter"),
}


def _exporter(signal: str, config: TelemetryConfig) -> Any:
    """The OTLP exporter of `signal`; with no configured endpoint it reads the OTEL_* variables."""
    import importlib

    grpc = config.protocol(signal) == "grpc"
    module, name = (_GRPC if grpc else _HTTP)[signal]
    cls = getattr(importlib.import_module(module), name)
    if config.otlp_endpoint is None:
        return cls()
    base = config.otlp_endpoint.rstrip("/")
    return cls(endpoint=base if grpc else f"{base}/v1/{signal}")


__all__ = ["PIXEL_BUCKETS", "SECONDS_BUCKETS", "Telemetry", "current", "setup", "shutdown"]
