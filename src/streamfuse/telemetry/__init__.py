"""OpenTelemetry instrumentation: metric names live in `names`, instruments in `metrics`."""
