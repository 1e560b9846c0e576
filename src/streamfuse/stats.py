"""Summary statistics of latency samples: `percentiles` gives the p50 / p95 (or any points)
that stage stats, evaluation and benchmarks report, computed one way (numpy's linear
interpolation) everywhere."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def percentiles(values: Iterable[float], points: Sequence[float] = (50, 95)) -> dict[str, float]:
    """{"p50": ..., "p95": ...} of `values` (keys "p<point>"). Raises ValueError on no values:
    callers decide what an empty sample means (0, None, absent)."""
    arr = np.fromiter((float(v) for v in values), dtype=float)
    if arr.size == 0:
        raise ValueError("percentiles of an empty sample")
    got = np.percentile(arr, list(points))
    return {f"p{p:g}": float(v) for p, v in zip(points, got, strict=True)}


__all__ = ["percentiles"]
