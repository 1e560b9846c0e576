"""Pareto sweep logic: the grid and its balanced sample, non-dominated sorting against a brute
force check, SLO parsing and the operating point it picks, and the config file a chosen point
becomes."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from streamfuse.app import StreamfuseConfig
from streamfuse.errors import ConfigError
from streamfuse.qos.pareto import (
    Point,
    SweepSpace,
    choose,
    dominates,
    frontier,
    pareto_ranks,
    parse_slo,
    table,
    write_config,
)

pytestmark = pytest.mark.unit


def point(name: str, lat: float, cer: float, wer: float, energy: float, **extra: float) -> Point:
    metrics = {"latency_p95_s": lat, "cer": cer, "wer": wer, "energy_j": energy, **extra}
    return Point(name, {"realtime": True}, 1, metrics)  # type: ignore[arg-type]


def test_grid_has_every_combination_and_each_job_config_validates() -> None:
    space = SweepSpace()
    grid = space.grid()
    assert len(grid) == 5 * 2 * 2 * 2 * 2 * 2 * 2
    assert len({c.name for c in grid}) == len(grid)
    for c in grid[:: max(1, len(grid) // 40)]:
        config = StreamfuseConfig.model_validate(c.job_config())
        assert config.asr_config.beam_size == c.beam
        assert (config.lm is not None) == c.lm


def test_sample_is_balanced_deterministic_and_distinct() -> None:
    space = SweepSpace()
    a, b = space.sample(60, seed=3), space.sample(60, seed=3)
    assert a == b and len(set(a)) == 60
    for knob in ("ocr_precision", "asr_model", "lm", "streams", "beam"):
        counts = {v: sum(1 for c in a if getattr(c, knob) == v) for v in getattr(space, knob)}
        assert max(counts.values()) - min(counts.values()) <= 2, (knob, counts)
    assert len(space.sample(10_000)) == len(space.grid())


def test_ranks_match_a_brute_force_dominance_check() -> None:
    rng = random.Random(7)
    points = [
        point(f"p{i}", rng.random(), rng.random(), rng.random(), rng.random()) for i in range(40)
    ]
    points.append(point("copy", *[points[0].value(m) for m in ("latency_p95_s", "cer", "wer")], 0))
    ranks = pareto_ranks(points)
    for i, p in enumerate(points):
        dominated = any(dominates(q, p) for q in points if q is not p)
        assert (ranks[i] == 0) == (not dominated)
    # Each point of rank r > 0 is dominated by some point of rank r - 1.
    for i, j in itertools.product(range(len(points)), repeat=2):
        if ranks[j] == ranks[i] and i != j:
            assert not dominates(points[i], points[j])
    for j, r in enumerate(ranks):
        if r > 0:
            assert any(ranks[i] == r - 1 and dominates(points[i], points[j]) for i in range(41))


def test_missing_metric_never_wins() -> None:
    good = point("good", 1.0, 0.1, 0.1, 10.0)
    broken = Point("broken", {}, 1, {"latency_p95_s": 0.5, "cer": None, "wer": 0.1})
    assert frontier([good, broken]) == [good, broken]  # neither dominates: broken is faster
    assert not dominates(broken, good)


def test_slo_parsing_names_bad_clauses() -> None:
    slo = parse_slo("ocr_p95<=1.0, wer<0.10")
    assert [str(c) for c in slo] == ["ocr_p95<=1", "wer<0.1"]
    with pytest.raises(ConfigError, match="unknown"):
        parse_slo("speed<=2")
    with pytest.raises(ConfigError, match="expected METRIC"):
        parse_slo("wer=0.1")
    with pytest.raises(ConfigError, match="empty"):
        parse_slo(" , ")


def test_choose_takes_the_cheapest_frontier_point_meeting_the_slo() -> None:
    fast = point("fast", 0.4, 0.05, 0.30, 5.0, ocr_p95=0.4)
    accurate = point("accurate", 1.5, 0.01, 0.05, 20.0, ocr_p95=1.5)
    balanced = point("balanced", 0.9, 0.02, 0.08, 12.0, ocr_p95=0.9)
    waste = point("waste", 0.95, 0.03, 0.09, 30.0, ocr_p95=0.95)  # dominated by balanced
    pts = [fast, accurate, balanced, waste]
    assert choose(pts, parse_slo("ocr_p95<=1.0,wer<=0.10")) is balanced
    assert choose(pts, parse_slo("wer<=0.5")) is fast
    assert choose(pts, parse_slo("wer<=0.01")) is None
    assert "**(chosen)**" in table(pts, balanced)


def test_chosen_config_file_is_a_valid_job_config(tmp_path: Path) -> None:
    c = SweepSpace().grid()[5]
    p = Point(c.name, c.job_config(), c.streams, {})
    path = tmp_path / "chosen.json"
    write_config(p, path)
    config = StreamfuseConfig.model_validate(json.loads(path.read_text()))
    assert config.realtime
