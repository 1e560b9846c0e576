"""Calibration: the scores (ECE, Brier) against hand-computed values, each fitter recovering a
known miscalibration on synthetic data, the entropy-weighted joint estimate, the shipped
calibrators, and the OCR / ASR stages publishing calibrated `conf` / `p` beside the raw score."""

from __future__ import annotations

import numpy as np
import pytest

from streamfuse.audio import AsrConfig, AsrStage
from streamfuse.events import AsrWord, OcrLine
from streamfuse.text.calibration import (
    CalibrationError,
    Calibrator,
    brier,
    ece,
    fit_best,
    fit_isotonic,
    fit_joint,
    fit_platt,
    fit_temperature,
    logit,
    pooled_logit,
    reliability,
    shipped,
    shipped_joint,
    sigmoid,
)

pytestmark = pytest.mark.unit


def overconfident(n: int, seed: int, temperature: float = 2.5) -> tuple[np.ndarray, np.ndarray]:
    """Raw scores whose true probability is sigmoid(logit(score) / temperature)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(1.5, 2.5, n)
    raw = sigmoid(z)
    y = (rng.random(n) < sigmoid(z / temperature)).astype(float)
    return raw, y


def test_ece_and_brier_match_hand_computation() -> None:
    p = [0.05, 0.15, 0.95, 0.95, 0.95, 0.95]
    y = [0, 1, 1, 1, 1, 0]
    # bins: [0,0.1): conf .05 acc 0; [0.1,0.2): .15 vs 1; [0.9,1]: .95 vs .75
    expected = (1 * 0.05 + 1 * 0.85 + 4 * 0.20) / 6
    assert ece(p, y) == pytest.approx(expected)
    assert brier(p, y) == pytest.approx(np.mean((np.array(p) - np.array(y)) ** 2))
    bins = reliability(p, y)
    assert [b.count for b in bins] == [1, 1, 0, 0, 0, 0, 0, 0, 0, 4]
    assert bins[2].accuracy is None
    assert ece([1.0, 0.0], [1, 0]) == 0.0  # the edges fall in the first and last bins


def test_bad_inputs_name_the_problem() -> None:
    with pytest.raises(CalibrationError, match="2 probabilities but 1 labels"):
        ece([0.1, 0.2], [1])
    with pytest.raises(CalibrationError, match="labels be 0 or 1"):
        brier([0.5], [2])
    with pytest.raises(CalibrationError, match="no samples"):
        fit_platt([], [])
    with pytest.raises(ValueError, match="sorted"):
        Calibrator(method="isotonic", x=[0.5, 0.2], y=[0.1, 0.2])


def test_temperature_fit_recovers_the_temperature() -> None:
    raw, y = overconfident(20_000, 1, temperature=2.5)
    cal = fit_temperature(raw, y)
    assert cal.temperature == pytest.approx(2.5, rel=0.1)


@pytest.mark.parametrize("fitter", [fit_temperature, fit_platt, fit_isotonic])
def test_each_fitter_at_least_halves_held_out_ece(fitter: object) -> None:
    raw, y = overconfident(4000, 2)
    test_raw, test_y = overconfident(4000, 3)
    cal = fitter(raw, y)  # type: ignore[operator]
    before, after = ece(test_raw, test_y), ece(cal.apply(test_raw), test_y)
    assert before > 0.1
    assert after <= before / 2
    assert brier(cal.apply(test_raw), test_y) < brier(test_raw, test_y)


def test_isotonic_is_monotone_and_shrinks_small_blocks() -> None:
    cal = fit_isotonic([0.1, 0.2, 0.9, 0.95], [0, 1, 1, 1])
    assert cal.y == sorted(cal.y)
    assert max(cal.y) < 1.0  # three right answers do not prove certainty
    grid = np.linspace(0, 1, 101)
    assert np.all(np.diff(cal.apply(grid)) >= 0)


def test_fit_best_picks_by_cross_validation_and_round_trips_through_json() -> None:
    raw, y = overconfident(2000, 4)
    cal, cv = fit_best(raw, y, target="x")
    assert set(cv) == {"temperature", "platt", "isotonic"}
    assert cal.method == min(cv, key=lambda m: cv[m])
    again = Calibrator.model_validate_json(cal.model_dump_json())
    assert np.allclose(again.apply(raw), cal.apply(raw))
    assert 0.0 <= cal(0.7) <= 1.0 and cal(0.7) == round(cal(0.7), 3)


def test_pool_of_one_observer_is_its_own_log_odds_and_agreement_adds_evidence() -> None:
    one = pooled_logit([[0.8, np.nan]])
    assert one[0] == pytest.approx(float(logit([0.8])[0]))
    two = pooled_logit([[0.8, 0.8]])
    assert two[0] == pytest.approx(2 * one[0])
    # The surer modality carries more weight than the hedging one.
    mixed = pooled_logit([[0.95, 0.4]])[0]
    plain_mean = (logit([0.95])[0] + logit([0.4])[0]) / 2 * 2
    assert mixed > plain_mean


def test_joint_estimate_beats_each_single_modality() -> None:
    """Two calibrated but noisy views of one binary fact: the fitted pool is calibrated and
    sharper, so its ECE and Brier on new terms are no worse than the better single view's."""

    def views(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        y = (rng.random(n) < 0.7).astype(float)
        cols = []
        for strength in (1.2, 2.0):
            z = strength * (2 * y - 1) + rng.normal(0, 1.5, n)
            cols.append(z)
        # Each view calibrated on its own (isotonic), as the shipped ones are.
        p = np.stack([fit_isotonic(sigmoid(z), y).apply(sigmoid(z)) for z in cols], axis=1)
        return p, y

    p_fit, y_fit = views(4000, 5)
    p_ev, y_ev = views(4000, 6)
    joint = fit_joint(p_fit, y_fit)
    p_joint = joint.apply(p_ev)
    best_single = min(ece(p_ev[:, k], y_ev) for k in range(2))
    assert ece(p_joint, y_ev) <= best_single + 0.01
    assert brier(p_joint, y_ev) < min(brier(p_ev[:, k], y_ev) for k in range(2))


def test_shipped_calibrators_load_and_are_monotone() -> None:
    grid = np.linspace(0, 1, 201)
    for kind in ("ocr", "asr"):
        cal = shipped(kind)  # type: ignore[arg-type]
        assert cal.n_fit > 100 and cal.target
        out = cal.apply(grid)
        assert np.all(np.diff(out) >= -1e-12) and np.all((out >= 0) & (out <= 1))
    joint = shipped_joint()
    assert joint.n_fit > 0 and joint.a > 0


def test_asr_stage_publishes_calibrated_p_and_keeps_the_raw_one() -> None:
    from streamfuse.audio.policy import Word

    on = AsrStage(AsrConfig())
    off = AsrStage(AsrConfig(calibrate=False))
    word = Word(" hello", 0.1, 0.4, 0.62)
    got = on._word(word)
    assert isinstance(got, AsrWord)
    assert got.p_raw == 0.62 and got.p == shipped("asr")(0.62)
    plain = off._word(word)
    assert plain.p == 0.62 and plain.p_raw is None


def test_ocr_line_payload_is_calibrated_when_a_calibrator_is_given() -> None:
    from streamfuse.vision.ocr import OcrLine as EngineLine

    ln = EngineLine("Title", (0.4, 1.6, 10.2, 20.0), 0.9512)
    cal = shipped("ocr")
    got = ln.to_payload(cal)
    assert isinstance(got, OcrLine)
    assert got.conf_raw == 0.951 and got.conf == cal(0.9512)
    assert ln.to_payload().conf == 0.951 and ln.to_payload().conf_raw is None
