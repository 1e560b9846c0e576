"""Controllers on scripted feedback sequences (no timing): step down under overload, back up
when load clears, never change faster than the dwell time; the article rule at its thresholds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamfuse.errors import ConfigError
from streamfuse.qos import (
    ArticleRule,
    ArticleRuleConfig,
    Feedback,
    FeedbackController,
    FeedbackControllerConfig,
    JumpSuppressionConfig,
    ResolutionScheduler,
    make_controller,
)
from streamfuse.qos.controllers import Decision
from streamfuse.qos.ladder import Ladder

pytestmark = pytest.mark.unit

NO_DWELL = JumpSuppressionConfig(min_dwell_s=0.0, up_dwell_s=0.0, blend_s=0.0)
# The quality guards the defaults switch off: no step up on a busy machine or when confident.
GUARDED = FeedbackControllerConfig(cpu_high=0.92, confidence_target=0.85)


def run(sched: ResolutionScheduler, feedbacks: list[Feedback]) -> list[Decision]:
    return [sched.update(fb) for fb in feedbacks]


def overload(t: float) -> Feedback:
    return Feedback(t_s=t, ocr_latency_s=1.6, queue_depth=3, cpu_util=1.0, ocr_confidence=0.9)


def idle(t: float) -> Feedback:
    return Feedback(t_s=t, ocr_latency_s=0.1, queue_depth=0, cpu_util=0.2, ocr_confidence=0.9)


# ---------------------------------------------------------------- article rule (F15)

BASE = dict(asr_latency_s=0.301, ocr_confidence=0.649, cpu_util=0.851)


@pytest.mark.parametrize(
    ("changes", "fires"),
    [
        ({}, True),
        ({"asr_latency_s": 0.300}, False),  # strictly greater than 300 ms
        ({"ocr_confidence": 0.65}, False),  # strictly less than 0.65
        ({"cpu_util": 0.85}, False),  # strictly greater than 85 %
        ({"asr_latency_s": None}, False),  # unmeasured -> the rule cannot fire
        ({"ocr_confidence": None}, False),
        ({"cpu_util": None}, False),
        ({"cpu_util": 0.1, "gpu_util": 0.86}, True),  # the GPU decides when measured
        ({"cpu_util": 0.99, "gpu_util": 0.85}, False),
    ],
)
def test_article_rule_thresholds_are_exact(changes: dict, fires: bool) -> None:
    rule = ArticleRule()
    fb = Feedback(t_s=0.0, **{**BASE, **changes})
    d = rule.decide(fb, rule.initial())
    assert rule.fires(fb) is fires
    if fires:
        assert (d.rung.width_px, d.rung.height_px, d.roi_ratio) == (1280, 704, 0.6)
    else:
        assert (d.rung.width_px, d.rung.height_px, d.roi_ratio) == (1920, 1088, 1.0)


def test_article_rule_is_configurable() -> None:
    rule = ArticleRule(ArticleRuleConfig(low_size_px=(960, 540), low_roi_ratio=0.5))
    d = rule.decide(Feedback(t_s=0.0, **BASE), rule.initial())
    assert (str(d.rung), d.roi_ratio) == ("960x544", 0.5)
    with pytest.raises(ValidationError):
        ArticleRuleConfig(util_threshold=1.5)


def test_article_rule_target_is_rate_limited_to_one_rung_per_change() -> None:
    sched = ResolutionScheduler(ArticleRule(), NO_DWELL)
    fires = Feedback(t_s=0.0, **BASE)
    rungs = [d.rung_index for d in run(sched, [fires.at(float(t)) for t in range(4)])]
    assert rungs == [1, 2, 2, 2]


# ---------------------------------------------------------------- feedback controller


def test_steps_down_one_rung_per_overloaded_snapshot_to_the_floor_then_roi_then_interval() -> None:
    ctrl = FeedbackController(FeedbackControllerConfig(roi_ratios=(0.6,)))
    sched = ResolutionScheduler(ctrl, NO_DWELL)
    ds = run(sched, [overload(float(t)) for t in range(14)])
    assert [d.rung_index for d in ds[:6]] == [1, 2, 3, 4, 5, 6]
    assert ds[6].rung_index == 6 and ds[6].roi_ratio == 0.6 and ds[6].ocr_interval_s == 0.0
    intervals = [d.ocr_interval_s for d in ds[7:]]
    assert intervals[:5] == [0.25, 0.5, 1.0, 2.0, 4.0]
    assert intervals[-1] == 4.0  # max_interval_s holds
    assert ds[-1].reason.startswith("hold")


def test_steps_back_up_when_load_clears_with_sustained_headroom() -> None:
    cfg = FeedbackControllerConfig(up_after=3)
    sched = ResolutionScheduler(FeedbackController(cfg), NO_DWELL)
    run(sched, [overload(float(t)) for t in range(6)])
    assert sched.current.rung_index == 6
    ds = run(sched, [idle(6.0 + t) for t in range(40)])
    rungs = [d.rung_index for d in ds]
    # Two snapshots of headroom hold; the third steps up; and so on up to the top.
    assert rungs[:3] == [6, 6, 5]
    assert rungs[-1] == 0
    assert all(b <= a for a, b in zip(rungs, rungs[1:], strict=False))  # monotone recovery


def test_does_not_step_up_when_confident_and_machine_busy() -> None:
    sched = ResolutionScheduler(FeedbackController(GUARDED), NO_DWELL)
    run(sched, [overload(float(t)) for t in range(3)])
    start = sched.current.rung_index
    # Latency fine but CPU busy (another process) -> hold.
    busy = Feedback(t_s=0.0, ocr_latency_s=0.1, cpu_util=0.97, ocr_confidence=0.95)
    ds = run(sched, [busy.at(10.0 + t) for t in range(10)])
    assert {d.rung_index for d in ds} == {start}


def test_low_confidence_pulls_resolution_up_when_there_is_headroom() -> None:
    sched = ResolutionScheduler(FeedbackController(GUARDED), NO_DWELL)
    run(sched, [overload(float(t)) for t in range(4)])
    low_conf = Feedback(t_s=0.0, ocr_latency_s=0.1, cpu_util=0.8, ocr_confidence=0.5)
    ds = run(sched, [low_conf.at(10.0 + t) for t in range(6)])
    assert ds[-1].rung_index < 4
    # With high confidence and the machine moderately loaded, it stays (saves work).
    sched2 = ResolutionScheduler(FeedbackController(GUARDED), NO_DWELL)
    run(sched2, [overload(float(t)) for t in range(4)])
    ok = low_conf.at(0.0, ocr_confidence=0.95)
    assert {d.rung_index for d in run(sched2, [ok.at(10.0 + t) for t in range(6)])} == {4}


def test_hysteresis_holds_between_the_water_marks() -> None:
    cfg = FeedbackControllerConfig(budget_s=1.0, high_water=0.9, low_water=0.5, up_after=1)
    sched = ResolutionScheduler(FeedbackController(cfg), NO_DWELL)
    run(sched, [overload(0.0), overload(1.0)])
    assert sched.current.rung_index == 2
    # 0.45 s at 1280x704: predicted at 1600x896 is 0.45 * 1.59 = 0.72 s > 0.5 -> hold.
    mid = Feedback(t_s=0.0, ocr_latency_s=0.45, cpu_util=0.5, ocr_confidence=0.5)
    assert {d.rung_index for d in run(sched, [mid.at(2.0 + t) for t in range(10)])} == {2}


def test_drops_or_queue_backlog_alone_step_down() -> None:
    sched = ResolutionScheduler(FeedbackController(), NO_DWELL)
    d = sched.update(Feedback(t_s=0.0, ocr_latency_s=0.1, dropped=2))
    assert d.rung_index == 1 and "dropped" in d.reason
    d = sched.update(Feedback(t_s=1.0, ocr_latency_s=0.1, queue_depth=5))
    assert d.rung_index == 2 and "queue" in d.reason


def test_never_changes_faster_than_the_dwell_time_on_oscillating_load() -> None:
    supp = JumpSuppressionConfig(min_dwell_s=2.0, up_dwell_s=4.0, blend_s=0.5)
    cfg = FeedbackControllerConfig(up_after=1)
    sched = ResolutionScheduler(FeedbackController(cfg), supp)
    # Load flips every 0.1 s for 60 s: a naive controller would change every snapshot.
    fbs = [overload(t / 10) if (t // 3) % 2 == 0 else idle(t / 10) for t in range(600)]
    changes: list[tuple[float, int, int]] = []
    prev = sched.current
    for fb in fbs:
        d = sched.update(fb)
        if not d.same_setting(prev):
            changes.append((fb.t_s, prev.rung_index, d.rung_index))
        prev = d
    assert changes, "the controller should react at all"
    times = [t for t, _, _ in changes]
    assert all(b - a >= 2.0 - 1e-9 for a, b in zip(times, times[1:], strict=False))
    for (t0, _, _), (t1, a, b) in zip(changes, changes[1:], strict=False):
        if b < a:  # a step up waits the longer up dwell
            assert t1 - t0 >= 4.0 - 1e-9
    assert all(abs(b - a) <= 1 for _, a, b in changes)


def test_invalid_configs_are_rejected() -> None:
    with pytest.raises(ValidationError):
        FeedbackControllerConfig(low_water=0.95, high_water=0.9)
    with pytest.raises(ValidationError):
        FeedbackControllerConfig(roi_ratios=(0.5, 0.7))
    with pytest.raises(ValidationError):
        FeedbackControllerConfig(budget_s=0)
    with pytest.raises(ValidationError):
        JumpSuppressionConfig(min_dwell_s=0.2, blend_s=0.5)


def test_make_controller_builds_the_controller_a_config_describes() -> None:
    ladder = Ladder.from_max(1280)
    ctrl = make_controller(FeedbackControllerConfig(start_rung=2), ladder)
    assert isinstance(ctrl, FeedbackController) and ctrl.ladder is ladder
    assert ctrl.initial().rung_index == 2
    rule = make_controller(ArticleRuleConfig(), ladder)
    assert isinstance(rule, ArticleRule) and rule.ladder is ladder
    with pytest.raises(ConfigError):
        make_controller(JumpSuppressionConfig(), ladder)  # type: ignore[arg-type]


def test_default_controller_climbs_whenever_the_budget_allows() -> None:
    """The shipped defaults use the budget: confident reads on a busy machine still step up
    while the next rung is predicted to fit (the latency already contains the contention)."""
    sched = ResolutionScheduler(FeedbackController(), NO_DWELL)
    run(sched, [overload(float(t)) for t in range(3)])
    busy = Feedback(t_s=0.0, ocr_latency_s=0.1, cpu_util=1.0, ocr_confidence=0.99)
    ds = run(sched, [busy.at(10.0 + t) for t in range(8)])
    assert ds[-1].rung_index == 0
