"""OpenTelemetry for streamfuse: `setup` installs the SDK and its exporters (off by default),
metric names and span attributes live in `names`, instruments in `metrics`."""

from streamfuse.telemetry.config import TelemetryConfig
from streamfuse.telemetry.providers import Telemetry, current, setup, shutdown

__all__ = ["Telemetry", "TelemetryConfig", "current", "setup", "shutdown"]
