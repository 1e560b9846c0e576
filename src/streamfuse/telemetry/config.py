"""`TelemetryConfig`: what `streamfuse.telemetry.setup` installs and where it exports.

Off by default: nothing is recorded until an exporter is asked for (`otlp`, `prometheus_port`).
A field left None takes the standard OpenTelemetry environment variable named in its
description, then the default there; an explicit value wins over the environment.
`OTEL_SDK_DISABLED=true` turns everything off whatever the config says.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.errors import ConfigError

OtlpProtocol = Literal["http/protobuf", "grpc"]

#: At 30 video frames/s and 50 audio windows/s a stream traces about four source frames a second.
DEFAULT_SAMPLE_RATIO = 0.05

_TRUE = ("true", "1", "yes", "on")
_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
_SIGNAL_ENDPOINTS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
)


class TelemetryConfig(BaseModel):
    """OpenTelemetry traces, metrics and logs of a run, and their exporters."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    otlp: bool = Field(
        False,
        description="Export traces, metrics and logs over OTLP (endpoint and protocol below, "
        "headers, timeout and TLS from the standard OTEL_EXPORTER_OTLP_* variables).",
    )
    otlp_endpoint: str | None = Field(
        None,
        description="Collector base URL: http://host:4318 for http/protobuf (signals go to "
        "/v1/traces, /v1/metrics, /v1/logs), host:4317 or http://host:4317 for grpc. None: "
        "OTEL_EXPORTER_OTLP_ENDPOINT (and the per-signal variables), else the protocol's "
        "localhost default.",
    )
    otlp_protocol: OtlpProtocol | None = Field(
        None,
        description="http/protobuf or grpc. None: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf.",
    )
    prometheus_port: int | None = Field(
        None,
        ge=0,
        le=65_535,
        description="Serve the metrics for Prometheus to scrape at http://HOST:PORT/metrics "
        "(0: any free port, see `Telemetry.prometheus_address`). None: no endpoint.",
    )
    prometheus_host: str = Field(
        "127.0.0.1",
        description="Address the Prometheus endpoint listens on (0.0.0.0 opens it to the "
        "network; there is no authentication).",
    )
    prometheus_registry: bool = Field(
        False,
        description="Keep the metrics in a Prometheus registry for the application to serve "
        "on a route of its own (`streamfuse serve`'s /metrics; `Telemetry.prometheus_registry`).",
    )
    traces: bool = Field(True, description="Record spans (with an OTLP exporter).")
    sample_ratio: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Share of source data frames traced through every stage (head sampling). "
        "None: OTEL_TRACES_SAMPLER_ARG when OTEL_TRACES_SAMPLER is a ratio sampler (1.0 for "
        f"always_on), else {DEFAULT_SAMPLE_RATIO}. Frames that lead to an event are traced "
        "whatever the ratio (`trace_events`).",
    )
    trace_events: bool = Field(
        True,
        description="Trace every emitted event with the chain of frames it came from, whatever "
        "the sample ratio (events are a few per second; their chains are what one debugs).",
    )
    metric_interval_s: float | None = Field(
        None,
        gt=0.0,
        le=3600.0,
        description="Seconds between OTLP metric exports. None: OTEL_METRIC_EXPORT_INTERVAL "
        "(ms), else 10 s. Prometheus reads the live values at each scrape.",
    )
    logs: bool = Field(
        True,
        description="Send the `streamfuse` logger's records through the OpenTelemetry logging "
        "bridge (with an OTLP exporter); a record logged inside a traced stage call carries "
        "its trace and span ids.",
    )
    log_level: str = Field(
        "INFO", description="Lowest level the logging bridge sends (a `logging` level name)."
    )
    service_name: str = Field(
        "streamfuse", description="`service.name` of the resource (OTEL_SERVICE_NAME wins)."
    )

    # -- resolved against the environment ----------------------------------------------------
    def sdk_disabled(self, env: Mapping[str, str] | None = None) -> bool:
        env = os.environ if env is None else env
        return env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE

    def enabled(self, env: Mapping[str, str] | None = None) -> bool:
        """Anything to install: an exporter was asked for and the SDK is not disabled."""
        wanted = self.otlp or self.prometheus_port is not None or self.prometheus_registry
        return wanted and not self.sdk_disabled(env)

    def protocol(self, signal: str, env: Mapping[str, str] | None = None) -> OtlpProtocol:
        """The OTLP protocol for `signal` (traces, metrics, logs)."""
        if self.otlp_protocol is not None:
            return self.otlp_protocol
        env = os.environ if env is None else env
        value = (
            env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip()
        if value not in ("http/protobuf", "grpc"):
            raise ConfigError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL={value!r}: expected http/protobuf or grpc "
                "(http/json is not supported)"
            )
        return value  # type: ignore[return-value]

    def ratio(self, env: Mapping[str, str] | None = None) -> float:
        """The head-sampling ratio of source data frames (0 with OTEL_TRACES_SAMPLER off)."""
        if self.sample_ratio is not None:
            return self.sample_ratio
        env = os.environ if env is None else env
        sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
        if sampler in ("always_on", "parentbased_always_on"):
            return 1.0
        if sampler in ("always_off", "parentbased_always_off"):
            return 0.0
        if sampler in _RATIO_SAMPLERS:
            try:
                return min(1.0, max(0.0, float(env.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))))
            except ValueError:
                raise ConfigError(
                    f"OTEL_TRACES_SAMPLER_ARG={env.get('OTEL_TRACES_SAMPLER_ARG')!r}: "
                    "expected a ratio in [0, 1]"
                ) from None
        return DEFAULT_SAMPLE_RATIO

    def tracing(self, env: Mapping[str, str] | None = None) -> bool:
        """Spans are recorded: OTLP export with traces on, and the sampler not always_off."""
        env = os.environ if env is None else env
        sampler = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
        off = sampler in ("always_off", "parentbased_always_off") or (
            env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none"
        )
        return self.enabled(env) and self.otlp and self.traces and not off

    def interval_s(self, env: Mapping[str, str] | None = None) -> float:
        if self.metric_interval_s is not None:
            return self.metric_interval_s
        env = os.environ if env is None else env
        try:
            return max(0.001, float(env.get("OTEL_METRIC_EXPORT_INTERVAL", "10000")) / 1000.0)
        except ValueError:
            return 10.0

    @staticmethod
    def endpoint_in_env(env: Mapping[str, str] | None = None) -> bool:
        """An OTLP endpoint is set in the environment (the CLI then exports without `--otlp`)."""
        env = os.environ if env is None else env
        return any(env.get(name) for name in _SIGNAL_ENDPOINTS)


__all__ = ["DEFAULT_SAMPLE_RATIO", "OtlpProtocol", "TelemetryConfig"]
