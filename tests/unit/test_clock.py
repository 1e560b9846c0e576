from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from streamfuse import frames
from streamfuse.clock import DriftEstimator, now_wall, use_wall_clock
from streamfuse.errors import ConfigError
from streamfuse.sources.synthetic import SyntheticSource
from streamfuse.testing import run_virtual

pytestmark = pytest.mark.unit

FRAME_S = 1 / 30


def _simulate(skew_ppm: float, offset_s: float, minutes: float, jitter_s: float, seed: int = 0):
    """An audio device clock running `skew_ppm` fast against the video clock, read every 0.5 s
    with timestamp jitter on the reference readings (network/capture noise)."""
    rng = np.random.default_rng(seed)
    local = np.arange(0.0, minutes * 60.0, 0.5)
    true_ref = offset_s + local * (1.0 + skew_ppm * 1e-6)
    noisy_ref = true_ref + rng.normal(0.0, jitter_s, size=local.shape)
    return local, true_ref, noisy_ref


def test_500ppm_skew_over_10_minutes_stays_within_one_frame() -> None:
    local, true_ref, noisy_ref = _simulate(500.0, 0.12, 10.0, jitter_s=0.004)
    est = DriftEstimator()
    errors, raw_errors = [], []
    for x, r_true, r_noisy in zip(local, true_ref, noisy_ref, strict=True):
        # Map the sample at `x` before this reading is used (causal, as in a live stream).
        if est.fit.n > 10:
            errors.append(abs(est.to_reference(x) - r_true))
            raw_errors.append(abs((x + 0.12) - r_true))  # offset-only alignment, no skew model
        est.update(x, r_noisy)
    # Without skew correction the error grows to 0.3 s (9 frames) at 10 minutes.
    assert max(raw_errors) > 0.25
    assert max(errors) < FRAME_S
    assert est.fit.skew_ppm == pytest.approx(500.0, abs=25.0)
    assert est.fit.offset_s == pytest.approx(0.12, abs=0.005)


def test_negative_skew_and_offset_only_early() -> None:
    local, true_ref, noisy_ref = _simulate(-300.0, -2.0, 3.0, jitter_s=0.002, seed=1)
    est = DriftEstimator(min_span_s=5.0)
    est.update(local[0], noisy_ref[0])
    assert est.fit.skew_ppm == 0.0  # too short a span to estimate a skew
    assert est.to_reference(0.0) == pytest.approx(-2.0, abs=0.01)
    for x, r in zip(local[1:], noisy_ref[1:], strict=True):
        est.update(x, r)
    assert est.fit.skew_ppm == pytest.approx(-300.0, abs=30.0)
    assert abs(est.to_reference(local[-1] + 10) - (-2.0 + (local[-1] + 10) * (1 - 300e-6))) < 0.01


def test_unfitted_estimator_is_identity_and_rejects_bad_config() -> None:
    assert DriftEstimator().to_reference(3.5) == 3.5
    with pytest.raises(ConfigError):
        DriftEstimator(half_life_s=0)


def test_use_wall_clock_swaps_the_one_wall_clock_and_restores_it() -> None:
    assert frames.now_wall is now_wall  # frames re-export the clock's function, no copy
    with use_wall_clock(lambda: 42.0):
        assert now_wall() == 42.0
        error = frames.ErrorFrame(stage="s", message="m", arrival_wall=41.5)
        assert error.to_record()["latency_ms"] == 500.0  # emitted "now", on the swapped clock
    assert abs(now_wall() - time.monotonic()) < 1.0


def test_virtual_time_jumps_over_sleeps_and_concurrent_sleeps_overlap() -> None:
    async def main() -> tuple[float, float]:
        t0 = now_wall()
        await asyncio.sleep(3600.0)
        t1 = now_wall()
        await asyncio.gather(asyncio.sleep(1.0), asyncio.sleep(2.0))
        return t1 - t0, now_wall() - t1

    real0 = time.monotonic()
    hour, both = run_virtual(main())
    assert hour == pytest.approx(3600.0) and both == pytest.approx(2.0)
    assert time.monotonic() - real0 < 5.0  # an hour of sleeping took no real hour


def test_thread_work_takes_no_virtual_time_and_timers_wait_for_it() -> None:
    order: list[str] = []

    async def timer() -> None:
        await asyncio.sleep(0.01)
        order.append("timer")

    async def main() -> float:
        loop = asyncio.get_running_loop()
        t0 = now_wall()
        with ThreadPoolExecutor(1) as pool:
            task = asyncio.create_task(timer())
            await loop.run_in_executor(pool, time.sleep, 0.2)  # 0.2 s of real work
            order.append("thread")
            elapsed = now_wall() - t0
            await task
        return elapsed

    assert run_virtual(main()) == 0.0
    assert order == ["thread", "timer"]


def test_a_realtime_source_is_paced_exactly_on_virtual_time() -> None:
    async def main() -> list[float]:
        source = SyntheticSource(10.0, fps=5.0, audio=False, realtime=True)
        await source.open()
        return [f.arrival_wall async for f in source.frames()]

    arrivals = run_virtual(main(), start_s=500.0)
    assert len(arrivals) == 50
    assert arrivals[0] == 500.0
    assert np.diff(arrivals) == pytest.approx(np.full(49, 0.2))
