"""The adaptive vision policy on scripted observations: it steps down under overload (latency over
budget, backlog, key frames dropped at the OCR input), back up when the load clears, never changes
faster than its dwell time, reads the changed region (clipped to the frame) and the whole frame
on a stream's first key frame; `make_policy` builds the policy each config variant names."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from pydantic import ValidationError

from streamfuse.errors import ConfigError
from streamfuse.pipeline import FramesDropped, OverloadPolicy
from streamfuse.qos.feedback import GpuStats, SystemProbe
from streamfuse.qos.signals import QosSignals, SharedCpuProbe
from streamfuse.qos.smoothing import JumpSuppressionConfig
from streamfuse.vision.adaptive import (
    AdaptiveResolution,
    frame_ladder,
    make_policy,
    select_roi,
)
from streamfuse.vision.config import ArticlePolicy, DynamicPolicy, FixedPolicy, VisionConfig
from streamfuse.vision.frames import BBox, KeyFrame, clamp_box, clip_box
from streamfuse.vision.ocr import OcrStage
from streamfuse.vision.policy import FixedResolution, OcrObservation

pytestmark = pytest.mark.unit

W, H = 1280, 720
IMAGE = np.zeros((H, W, 3), np.uint8)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FixedProbe:
    """A `SystemProbe` reporting a scripted CPU utilization (no psutil, no GPU)."""

    def __init__(self, cpu: float = 0.5) -> None:
        self.util = cpu

    def cpu(self) -> float:
        return self.util

    def gpu(self) -> GpuStats | None:
        return None


def key(
    stream: str = "s",
    *,
    changed: BBox = (0, 0, W, H),
    content: BBox | None = None,
    reason: str = "change",
    index: int = 30,
) -> KeyFrame:
    return KeyFrame(
        stream_id=stream,
        t_media=index / 30.0,
        image=IMAGE,
        index=index,
        changed_bbox=changed,
        content_bbox=content,
        reason=reason,  # type: ignore[arg-type]
    )


def obs(
    stream: str = "s", *, ocr_ms: float, wait_ms: float = 0.0, backlog: int = 0, conf: float = 0.9
) -> OcrObservation:
    return OcrObservation(
        stream_id=stream,
        t_media=0.0,
        ocr_ms=ocr_ms,
        wait_ms=wait_ms,
        resolution=(640, 352),
        roi=(0, 0, W, H),
        n_lines=3,
        mean_conf=conf,
        backlog=backlog,
    )


def make(
    clock: Clock,
    *,
    realtime: bool = True,
    start: int | None = 640,
    probe: SystemProbe | None = None,
    kind: str = "dynamic",
    signals: QosSignals | None = None,
) -> AdaptiveResolution:
    suppression = JumpSuppressionConfig(min_dwell_s=1.0, up_dwell_s=3.0, blend_s=0.0)
    cfg: DynamicPolicy | ArticlePolicy
    if kind == "article":
        cfg = ArticlePolicy(suppression=suppression, latency_alpha=1.0)
    else:
        # latency_alpha=1: scripted latencies take effect at once
        cfg = DynamicPolicy(start_side_px=start, suppression=suppression, latency_alpha=1.0)
    policy = AdaptiveResolution.from_config(
        cfg,
        realtime=realtime,
        signals=signals or QosSignals(probe=probe or FixedProbe()),
        clock=clock,
    )
    return policy


def side(policy: AdaptiveResolution, stream: str = "s") -> int:
    return policy.plan(key(stream)).det_max_side_px


def test_ladder_is_clipped_to_the_frame() -> None:
    assert [r.long_side_px for r in frame_ladder((1280, 720))] == [1280, 1024, 960, 800, 640]
    assert frame_ladder((1920, 1080))[0].long_side_px == 1920
    odd = frame_ladder((1100, 620))
    assert odd[0].long_side_px == 1088 and odd[1].long_side_px == 1024  # native size on top
    assert [r.long_side_px for r in frame_ladder((400, 300))] == [384]


def test_steps_down_on_latency_over_budget_and_back_up_when_it_clears() -> None:
    clock = Clock()
    policy = make(clock, start=None)  # start at the top rung
    assert side(policy) == 1280
    sides = []
    for _ in range(4):
        clock.t += 1.5
        policy.observe(obs(ocr_ms=900, wait_ms=600))  # 1.5 s > 0.9 x budget
        sides.append(side(policy))
    assert sides == [1024, 960, 800, 640]
    ups = []
    for _ in range(12):
        clock.t += 1.5
        policy.observe(obs(ocr_ms=150))  # predicted at the next rung stays < 0.6 x budget
        ups.append(side(policy))
    assert ups[-1] == 1280
    assert ups == sorted(ups)  # only up while the load is clear
    st = policy.stats()["s"]
    assert st.stepped_down and st.stepped_up_after_down()


def test_backlog_alone_is_overload() -> None:
    clock = Clock()
    policy = make(clock, start=None)
    side(policy)
    clock.t += 1.5
    policy.observe(obs(ocr_ms=100, backlog=3))
    assert side(policy) == 1024
    assert "queue" in policy.stats()["s"].history[-1].reason


def test_slow_start_begins_at_the_floor_and_climbs_with_headroom() -> None:
    clock = Clock()
    policy = make(clock)
    assert DynamicPolicy().start_side_px == 640  # the shipped default: start low
    assert side(policy) == 640
    for _ in range(6):
        clock.t += 4.0
        policy.observe(obs(ocr_ms=100))
    assert side(policy) > 640


def test_never_changes_faster_than_the_dwell_time() -> None:
    clock = Clock()
    policy = make(clock, start=None)
    side(policy)
    rng = np.random.default_rng(0)
    for _ in range(400):  # feedback flapping every 50 ms between overload and idle
        clock.t += 0.05
        overloaded = rng.random() < 0.5
        policy.observe(obs(ocr_ms=2000 if overloaded else 50))
    hist = policy.stats()["s"].history
    assert len(hist) > 3  # it did adapt
    for a, b in pairwise(hist[1:]):
        assert b.t_s - a.t_s >= 1.0 - 1e-9
        if b.rung_index < a.rung_index or b.interval_s < a.interval_s:  # a step up
            assert b.t_s - a.t_s >= 3.0 - 1e-9
    for a, b in pairwise(hist):
        assert abs(b.rung_index - a.rung_index) <= 1  # one rung per change


def test_streams_are_independent() -> None:
    clock = Clock()
    policy = make(clock, start=None)
    side(policy, "a")
    side(policy, "b")
    for _ in range(3):
        clock.t += 1.5
        policy.observe(obs("a", ocr_ms=3000))
        policy.observe(obs("b", ocr_ms=100))
    assert side(policy, "a") < 1280 and side(policy, "b") == 1280


def test_key_frames_dropped_at_the_ocr_input_step_the_controller_down() -> None:
    clock = Clock()
    signals = QosSignals(probe=FixedProbe())
    policy = make(clock, start=None, signals=signals)
    stage = OcrStage(engine=object(), policy=policy)  # type: ignore[arg-type]
    signals.watch_drops(stage)
    assert side(policy) == 1280
    clock.t += 1.5
    policy.observe(obs(ocr_ms=100))  # fast read, nothing lost: hold at the top
    assert side(policy) == 1280
    lost = [key(index=i) for i in (31, 32)]
    signals.on_drop(FramesDropped(stage, lost, OverloadPolicy.LATEST_ONLY))
    clock.t += 1.5
    policy.observe(obs(ocr_ms=100))  # as fast, but two key frames were never read
    assert side(policy) == 1024
    assert "2 dropped" in policy.stats()["s"].history[-1].reason
    assert signals.take_drops("s") == 0  # consumed by that observation


def test_interval_only_when_skipping_is_allowed() -> None:
    for realtime in (True, False):
        clock = Clock()
        policy = make(clock, realtime=realtime)
        for _ in range(10):
            clock.t += 1.5
            policy.plan(key())
            policy.observe(obs(ocr_ms=4000))
        interval = policy.plan(key()).min_interval_s
        assert (interval > 0) is realtime


def test_roi_is_the_changed_region_and_the_whole_frame_first() -> None:
    clock = Clock()
    policy = make(clock, start=None)
    first = policy.plan(key(changed=(100, 100, 300, 200), reason="first"))
    assert first.roi is None  # first key frame of the stream: whole frame
    plan = policy.plan(key(changed=(100, 100, 300, 200)))
    assert plan.roi is not None and plan.carry_over
    x0, y0, x1, y1 = plan.roi
    assert x0 < 100 and y0 < 100 and x1 > 300 and y1 > 200  # padded
    assert x1 - x0 < 300 and y1 - y0 < 200  # but only a margin
    edge = policy.plan(key(changed=(1200, 650, W, H))).roi
    assert edge is not None and edge[2] == W and edge[3] == H  # clipped to the frame
    assert policy.plan(key(changed=(0, 0, W, H))).roi is None  # a new slide: whole frame
    area = policy.stats()["s"].roi_ratio
    assert 0.0 < area < 1.0


def test_roi_prefers_the_smaller_of_changed_and_content_region() -> None:
    content = (64, 64, 700, 400)
    roi, carry = select_roi((W, H), (0, 0, W, H), content)
    assert roi == content and not carry  # nothing outside the content can hold text
    roi, carry = select_roi((W, H), (80, 300, 500, 360), content)
    assert roi is not None and carry and roi[1] > 64  # only the new line, keep the rest
    roi, carry = select_roi((W, H), (80, 300, 500, 360), content, first=True)
    assert roi == content and not carry
    assert select_roi((W, H), (0, 0, 0, 0), None) == (None, True)


def test_roi_ratio_below_one_shrinks_the_region() -> None:
    roi, _ = select_roi((W, H), (0, 0, W, H), None, roi_ratio=0.6)
    assert roi is not None
    area = (roi[2] - roi[0]) * (roi[3] - roi[1]) / (W * H)
    assert 0.55 < area <= 0.61


def test_article_rule_fires_on_asr_latency_low_confidence_and_busy_cpu() -> None:
    clock = Clock()
    probe = FixedProbe(cpu=0.95)
    signals = QosSignals(probe=probe, alpha=1.0)
    policy = make(clock, kind="article", signals=signals)
    assert side(policy) == 1280
    clock.t += 2.0
    policy.observe(obs(ocr_ms=200, conf=0.5))  # no ASR latency yet: the rule cannot fire
    assert side(policy) == 1280
    signals.record_asr_latency("s", 0.45)
    for _ in range(4):
        clock.t += 2.0
        policy.observe(obs(ocr_ms=200, conf=0.5))
    plan = policy.plan(key(changed=(0, 0, W, H)))
    assert plan.det_max_side_px == 800  # two thirds of native, nearest rung (853 -> 800)
    assert plan.roi is not None  # ROI ratio 0.6
    probe.util = 0.3  # the machine is no longer busy: back to full size
    for _ in range(6):
        clock.t += 4.0
        policy.observe(obs(ocr_ms=200, conf=0.5))
    assert side(policy) == 1280


def test_stats_jitter_is_total_change_over_frames() -> None:
    clock = Clock()
    policy = make(clock, start=None)
    side(policy)
    for _ in range(2):
        clock.t += 1.5
        policy.observe(obs(ocr_ms=2000))
    st = policy.stats({"s": 301})["s"]
    assert [c.side_px for c in st.history] == [1280, 1024, 960]
    assert st.jitter_px_per_frame == pytest.approx((256 + 64) / 300)
    assert st.frames == 301 and st.reads == 1
    assert st.to_record()["history"][1]["side_px"] == 1024


def test_shared_cpu_probe_is_cached_between_refreshes() -> None:
    clock = Clock()
    probe = SharedCpuProbe(period_s=1.0, clock=clock)
    first = probe.cpu()
    assert probe.cpu() == first  # within the period: no new sample
    clock.t += 1.5
    assert 0.0 <= probe.cpu() <= 1.0


def test_start_and_floor_fit_any_frame_size() -> None:
    clock = Clock()
    for start in (32, 640, 8000, None):
        policy = AdaptiveResolution.from_config(
            DynamicPolicy(start_side_px=start), signals=QosSignals(probe=FixedProbe()), clock=clock
        )
        small = KeyFrame(stream_id="s", t_media=0.0, image=np.zeros((300, 400, 3), np.uint8))
        assert policy.plan(small).det_max_side_px == 384  # the only rung of a 400x300 ladder
        big = key("b")
        assert policy.plan(big).det_max_side_px in (640, 1280)


def test_make_policy_builds_the_policy_each_variant_names() -> None:
    fixed = make_policy(FixedPolicy(det_max_side_px=800, content_crop=False))
    assert isinstance(fixed, FixedResolution)
    assert fixed.plan(key()).det_max_side_px == 800 and fixed.plan(key()).roi is None
    dynamic = make_policy(DynamicPolicy(), realtime=False)
    assert isinstance(dynamic, AdaptiveResolution) and not dynamic.allow_skipping
    assert dynamic.plan(key()).det_max_side_px == 640  # the slow start
    article = make_policy(ArticlePolicy())
    assert isinstance(article, AdaptiveResolution)
    assert article.plan(key()).det_max_side_px == 1280  # the rule starts at native size
    # The default is the dynamic policy, and a stage cannot run it without being handed it.
    assert isinstance(VisionConfig().policy, DynamicPolicy)
    with pytest.raises(ConfigError, match="make_policy"):
        OcrStage(VisionConfig(), engine=object())  # type: ignore[arg-type]
    stage = OcrStage(VisionConfig(policy=FixedPolicy(det_max_side_px=640)), engine=object())  # type: ignore[arg-type]
    assert stage.policy.plan(key()).det_max_side_px == 640


def test_policy_config_has_one_start_and_one_vocabulary() -> None:
    with pytest.raises(ValidationError, match="not both"):
        DynamicPolicy(controller={"start_rung": 2})  # start_side_px defaults to 640
    assert (
        DynamicPolicy(start_side_px=None, controller={"start_rung": 2}).controller.start_rung == 2
    )
    cfg = VisionConfig.model_validate(
        {"policy": {"kind": "dynamic", "controller": {"budget_s": 0.5}}}
    )
    assert isinstance(cfg.policy, DynamicPolicy) and cfg.policy.controller.budget_s == 0.5
    with pytest.raises(ValidationError):
        VisionConfig.model_validate({"policy": {"kind": "fixed", "controller": {}}})
    with pytest.raises(ValidationError):
        VisionConfig.model_validate({"policy": {"kind": "feedback"}})


def test_clip_box_is_the_one_rule_for_crops() -> None:
    assert clamp_box((-5.5, 10.2, 1300.0, 99.1), (W, H)) == (0.0, 10.2, W, 99.1)  # unrounded
    assert clip_box((-5.5, 10.2, 1300.0, 99.1), (W, H)) == (0, 10, W, 100)  # outwards, clamped
    assert clip_box((W + 5, H + 5, W + 9, H + 9), (W, H)) == (W - 1, H - 1, W, H)  # >= 1 px
    # The ROI geometry and the OCR stage crop with it: a region past the edge ends at the edge.
    roi, _ = select_roi((W, H), (1200, 650, W + 50, H + 50), None)
    assert roi == clip_box((1200 - 0.03 * H, 650 - 0.03 * H, W, H), (W, H))
