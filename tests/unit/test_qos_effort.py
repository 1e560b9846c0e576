"""The ASR effort controller's decisions: headroom steps up, load steps down, hysteresis holds."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamfuse.errors import ConfigError
from streamfuse.qos.effort import AsrFeedback, EffortController, EffortControllerConfig

pytestmark = pytest.mark.unit

IDLE = AsrFeedback(busy_share=0.2, commit_latency_s=0.8, cpu_util=0.3)


def _run(controller: EffortController, feedback: list[AsrFeedback], rung: int = 0) -> list[int]:
    out = []
    for fb in feedback:
        rung = controller.decide(fb, rung).rung
        out.append(rung)
    return out


def test_sustained_headroom_steps_up_one_rung_at_a_time() -> None:
    c = EffortController(EffortControllerConfig(rungs=(0, 1, 2), up_after=3))
    assert c.initial().rung == 0
    # Three snapshots of headroom per step; never past the top.
    assert _run(c, [IDLE] * 9) == [0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert c.decide(IDLE, 2).reason == "hold: top"


def test_the_default_rungs_skip_rung_1() -> None:
    c = EffortController(EffortControllerConfig(up_after=1))
    assert _run(c, [IDLE] * 2) == [2, 2]
    assert _run(c, [AsrFeedback(busy_share=0.9)] * 2, rung=2) == [0, 0]
    # A rung that is not one of `rungs` counts as the nearest one below it.
    assert c.decide(AsrFeedback(busy_share=0.9), 1).reason == "hold: bottom"


def test_headroom_is_judged_at_the_next_rungs_cost() -> None:
    config = EffortControllerConfig(rungs=(0, 1, 2), cost=(1.0, 1.2, 2.0), busy_low=0.5, up_after=1)
    c = EffortController(config)
    fb = AsrFeedback(busy_share=0.3)
    assert c.decide(fb, 0).rung == 1  # 0.3 x 1.2 = 0.36 fits
    decision = c.decide(fb, 1)  # 0.3 x 2.0 / 1.2 = 0.5 does not
    assert (decision.rung, decision.reason) == (1, "hold: predicted busy 0.50")


@pytest.mark.parametrize(
    "load",
    [
        AsrFeedback(busy_share=0.9),  # the recognizer's own work
        AsrFeedback(busy_share=0.2, commit_latency_s=2.0),  # commits late
        AsrFeedback(busy_share=0.2, cpu_util=0.95),  # the machine is busy
    ],
)
def test_load_steps_down_at_once(load: AsrFeedback) -> None:
    c = EffortController(EffortControllerConfig(rungs=(0, 1, 2)))
    decision = c.decide(load, 2)
    assert decision.rung == 1 and decision.reason.startswith("down:")
    assert c.decide(load, 1).rung == 0
    assert c.decide(load, 0).reason == "hold: bottom"


def test_between_the_water_marks_it_holds_and_headroom_must_be_consecutive() -> None:
    c = EffortController(EffortControllerConfig(rungs=(0, 1, 2), up_after=2))
    between = AsrFeedback(busy_share=0.6)  # below busy_high 0.7, predicted above busy_low 0.5
    assert _run(c, [between] * 5, rung=1) == [1] * 5
    # One snapshot of headroom, then one between: the count restarts.
    assert _run(c, [IDLE, between, IDLE, IDLE], rung=1) == [1, 1, 1, 2]
    # A latency between the marks blocks a step up too.
    late = AsrFeedback(busy_share=0.1, commit_latency_s=1.3)
    assert _run(c, [late] * 4, rung=0) == [0] * 4


def test_a_busy_machine_never_lets_it_climb_and_down_after_delays_the_step() -> None:
    c = EffortController(EffortControllerConfig(rungs=(0, 1, 2), down_after=2, up_after=1))
    busy = AsrFeedback(busy_share=0.1, cpu_util=0.97)
    assert _run(c, [busy] * 4, rung=2) == [2, 1, 1, 0]
    assert _run(c, [busy] * 3, rung=0) == [0, 0, 0]


def test_unmeasured_feedback_calls_for_no_change() -> None:
    c = EffortController(EffortControllerConfig(rungs=(0, 1, 2), up_after=1))
    assert _run(c, [AsrFeedback()] * 3, rung=1) == [1, 1, 1]


def test_the_highest_of_rungs_caps_the_climb_and_config_is_checked() -> None:
    c = EffortController(EffortControllerConfig(rungs=(0, 1), up_after=1))
    assert _run(c, [IDLE] * 3) == [1, 1, 1]
    with pytest.raises(ValidationError, match="busy_low"):
        EffortControllerConfig(busy_low=0.8, busy_high=0.7)
    with pytest.raises(ValidationError, match="start_rung"):
        EffortControllerConfig(rungs=(0, 2), start_rung=1)
    with pytest.raises(ValidationError, match="rungs"):
        EffortControllerConfig(rungs=(2, 0))
    with pytest.raises(ValidationError, match="cost"):
        EffortControllerConfig(cost=(1.0, 0.9, 2.0))
    with pytest.raises(ConfigError, match="cpu_util"):
        AsrFeedback(cpu_util=1.5)
