"""Scale-out: stream branches placed on the nodes of a Ray cluster (`run_on_ray`)."""

from streamfuse.scale.ray import (
    Ledger,
    RayConfig,
    RayReport,
    RayStreams,
    StreamRun,
    event_key,
    merged_summary,
    run_on_ray,
)

__all__ = [
    "Ledger",
    "RayConfig",
    "RayReport",
    "RayStreams",
    "StreamRun",
    "event_key",
    "merged_summary",
    "run_on_ray",
]
