"""Jump suppression transition ramp, jitter and text-consistency metrics."""

from __future__ import annotations

import pytest

from streamfuse.errors import ConfigError
from streamfuse.qos import (
    Feedback,
    FeedbackController,
    FeedbackTracker,
    JitterMeter,
    JumpSuppressionConfig,
    ResolutionScheduler,
    jitter_px_per_frame,
    text_consistency,
    text_similarity,
)

pytestmark = pytest.mark.unit


def test_transition_ramps_in_32px_steps_over_the_blend_window() -> None:
    supp = JumpSuppressionConfig(min_dwell_s=1.0, up_dwell_s=1.0, blend_s=0.5)
    sched = ResolutionScheduler(FeedbackController(), supp)
    assert sched.side_px_at(0.0) == 1920
    sched.update(Feedback(t_s=10.0, ocr_latency_s=2.0))  # overload -> 1600x896
    sides = [sched.side_px_at(10.0 + k / 30) for k in range(20)]
    assert sides[0] == 1920 and sides[-1] == 1600
    assert all(s % 32 == 0 for s in sides)
    assert all(b <= a for a, b in zip(sides, sides[1:], strict=False))
    assert max(a - b for a, b in zip(sides, sides[1:], strict=False)) <= 32
    assert sched.suppressor.transition_weight(10.25) == pytest.approx(0.5)


def test_jitter_is_mean_abs_change_per_frame() -> None:
    assert jitter_px_per_frame([1920] * 10) == 0.0
    assert jitter_px_per_frame([1920, 1600, 1920, 1600]) == pytest.approx(320.0)
    m = JitterMeter()
    m.extend([1920] * 299 + [1600])
    assert m.mean_px_per_frame == pytest.approx(320 / 299)
    assert m.max_px_per_frame == 320
    assert m.frames == 300


def test_blending_lowers_peak_jump_not_total_change() -> None:
    def trace(blend_s: float) -> list[int]:
        supp = JumpSuppressionConfig(min_dwell_s=1.0, up_dwell_s=1.0, blend_s=blend_s)
        s = ResolutionScheduler(FeedbackController(), supp)
        out = []
        for k in range(90):
            t = k / 30
            if k == 30:
                s.update(Feedback(t_s=t, ocr_latency_s=2.0))
            out.append(s.side_px_at(t))
        return out

    hard, soft = JitterMeter(), JitterMeter()
    hard.extend(trace(0.0))
    soft.extend(trace(0.5))
    assert hard.max_px_per_frame == 320 and soft.max_px_per_frame <= 32
    assert hard.mean_px_per_frame == pytest.approx(soft.mean_px_per_frame)


def test_text_consistency_compares_only_readings_of_the_same_slide() -> None:
    readings = [
        ("s1", "Quarterly results"),
        ("s1", "Quarterly resu1ts"),
        ("s2", "Completely different"),
        ("s2", "Completely different"),
    ]
    c = text_consistency(readings)
    assert c is not None and c == pytest.approx((1 - 1 / 17 + 1.0) / 2)
    assert text_consistency([("a", "x")]) is None
    assert text_similarity("a  b", "a b") == 1.0


def test_feedback_validation_and_tracker() -> None:
    with pytest.raises(ConfigError):
        Feedback(t_s=0.0, cpu_util=1.5)
    with pytest.raises(ConfigError):
        Feedback(t_s=0.0, ocr_latency_s=-1.0)
    tr = FeedbackTracker(alpha=0.5)
    tr.record_ocr(1.0, 0.8, queue_depth=2)
    tr.record_ocr(0.0, None)
    tr.record_drops(3)
    fb = tr.snapshot(5.0)
    assert fb.ocr_latency_s == pytest.approx(0.5)
    assert fb.ocr_confidence == 0.8 and fb.dropped == 3 and fb.queue_depth == 0
    assert fb.cpu_util is None and fb.gpu_util is None
    assert tr.snapshot(6.0).dropped == 0
