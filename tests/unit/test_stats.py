"""`percentiles`, the one p50 / p95 computation of stage stats, evaluation and benchmarks."""

from __future__ import annotations

import pytest

from streamfuse.pipeline.stage import StageStats
from streamfuse.stats import percentiles

pytestmark = pytest.mark.unit


def test_percentiles_interpolate_linearly() -> None:
    assert percentiles(range(1, 102)) == {"p50": 51.0, "p95": 96.0}
    assert percentiles([1.0, 2.0], points=(0, 25, 100)) == {"p0": 1.0, "p25": 1.25, "p100": 2.0}
    assert percentiles(iter([7.0])) == {"p50": 7.0, "p95": 7.0}  # any iterable, one pass


def test_percentiles_refuse_an_empty_sample() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentiles([])


def test_stage_stats_report_latency_percentiles_in_ms() -> None:
    stats = StageStats()
    assert stats.latency_quantiles_ms() == {"p50": 0.0, "p95": 0.0}
    stats.recent_latency_s.extend([0.010, 0.020, 0.030])
    q = stats.latency_quantiles_ms()
    assert q["p50"] == pytest.approx(20.0) and q["p95"] == pytest.approx(29.0)
