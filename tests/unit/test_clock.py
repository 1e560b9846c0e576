from __future__ import annotations

import numpy as np
import pytest

from streamfuse.clock import DriftEstimator
from streamfuse.errors import ConfigError

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
