"""AdaptiveResolution: the scheduler behind the OCR stage's ResolutionPolicy interface."""

from __future__ import annotations

import numpy as np
import pytest

from streamfuse.qos import FeedbackController, JumpSuppressionConfig, ResolutionScheduler
from streamfuse.qos.controllers import FeedbackControllerConfig
from streamfuse.vision.adaptive import AdaptiveResolution, choose_roi
from streamfuse.vision.frames import KeyFrame
from streamfuse.vision.policy import OcrObservation

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def obs(stream: str, ocr_ms: float, conf: float = 0.9, backlog: int = 0) -> OcrObservation:
    return OcrObservation(
        stream_id=stream,
        t_media=0.0,
        ocr_ms=ocr_ms,
        wait_ms=0.0,
        resolution=(960, 544),
        roi=(0, 0, 1920, 1080),
        n_lines=3,
        mean_conf=conf,
        backlog=backlog,
    )


def key(stream: str, changed: tuple[int, int, int, int] = (0, 0, 1920, 1080)) -> KeyFrame:
    return KeyFrame(
        stream_id=stream, image=np.zeros((1080, 1920, 3), np.uint8), changed_bbox=changed
    )


def make_policy(clock: Clock) -> AdaptiveResolution:
    supp = JumpSuppressionConfig(min_dwell_s=1.0, up_dwell_s=2.0, blend_s=0.0)
    cfg = FeedbackControllerConfig(budget_s=1.0, up_after=2)
    return AdaptiveResolution(
        lambda: ResolutionScheduler(FeedbackController(cfg), supp), clock=clock
    )


def test_slow_reads_lower_the_detector_side_and_fast_reads_restore_it() -> None:
    clock = Clock()
    policy = make_policy(clock)
    assert policy.plan(key("a")).det_max_side_px == 1920
    sides = []
    for _ in range(8):
        clock.t += 1.0
        policy.observe(obs("a", ocr_ms=1500))
        sides.append(policy.plan(key("a")).det_max_side_px)
    assert sides[:3] == [1600, 1280, 1024]
    assert policy.plan(key("b")).det_max_side_px == 1920  # streams are independent
    for _ in range(40):
        clock.t += 1.0
        policy.observe(obs("a", ocr_ms=50, conf=0.5))
    assert policy.plan(key("a")).det_max_side_px == 1920


def test_roi_ratio_turns_the_changed_region_into_a_bounded_roi() -> None:
    assert choose_roi((1920, 1080), (100, 100, 500, 300), 1.0) is None
    roi = choose_roi((1920, 1080), (100, 100, 500, 300), 0.6)
    assert roi is not None and roi[0] < 100 and roi[2] > 500  # padded
    x0, y0, x1, y1 = choose_roi((1920, 1080), (0, 0, 1920, 1080), 0.6) or (0, 0, 0, 0)
    area = (x1 - x0) * (y1 - y0) / (1920 * 1080)
    assert 0.55 < area <= 0.61
    assert abs((x0 + x1) / 2 - 960) <= 1 and abs((y0 + y1) / 2 - 540) <= 1


def test_head_can_only_lower_the_side_the_load_allows() -> None:
    from streamfuse.qos.ladder import DEFAULT_LADDER

    class FakeHead:
        def __init__(self, idx: int) -> None:
            self.idx = idx

        def predict(self, image: np.ndarray) -> object:
            class P:
                rung = DEFAULT_LADDER[self.idx]

            return P()

    clock = Clock()
    policy = make_policy(clock)
    policy.head = FakeHead(6)
    assert policy.plan(key("a")).det_max_side_px == 640  # content needs little
    policy.head = FakeHead(0)
    for _ in range(3):
        clock.t += 1.0
        policy.observe(obs("a", ocr_ms=1500))
    assert policy.plan(key("a")).det_max_side_px == 1024  # load wins over content
