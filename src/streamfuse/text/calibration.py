"""Confidence calibration: maps a recognizer's raw score to the probability that its output is
right, fits those maps on labelled runs, scores them (ECE, Brier, reliability bins) and fuses two
modalities' calibrated probabilities of one term (entropy-weighted log-odds pooling).

The package ships one fitted `Calibrator` per modality (`assets/calibration/ocr.json`: P(an OCR
line is read exactly), `asr.json`: P(an ASR word is right)) and the joint map (`joint.json`);
`shipped(kind)` loads them. Fitting and plotting live in `benchmarks/calibration.py`
(docs/calibration.md). Numpy only: the run-time path must not need scikit-learn or SciPy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from streamfuse.errors import StreamfuseError

#: Probabilities are kept inside (EPS, 1 - EPS) before taking log-odds.
EPS = 1e-4

Method = Literal["identity", "temperature", "platt", "isotonic"]

F64 = NDArray[np.float64]


class CalibrationError(StreamfuseError, ValueError):
    """Calibration data or a calibrator file that cannot be used."""


def _arr(x: ArrayLike) -> F64:
    return np.asarray(x, dtype=np.float64)


def logit(p: ArrayLike) -> F64:
    q = np.clip(_arr(p), EPS, 1.0 - EPS)
    return np.asarray(np.log(q) - np.log1p(-q), dtype=np.float64)


def sigmoid(z: ArrayLike) -> F64:
    # Clipped: exp overflows past |z| ~ 709, and 1 / (1 + e^40) is 0 in float64 anyway.
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(_arr(z), -40.0, 40.0))), dtype=np.float64)


# -- scores ---------------------------------------------------------------------------------------


def _check(probs: ArrayLike, labels: ArrayLike) -> tuple[F64, F64]:
    p, y = _arr(probs).ravel(), _arr(labels).ravel()
    if p.shape != y.shape:
        raise CalibrationError(f"{p.size} probabilities but {y.size} labels")
    if p.size == 0:
        raise CalibrationError("no samples")
    if np.any((p < 0) | (p > 1)) or not np.all(np.isin(y, (0.0, 1.0))):
        raise CalibrationError("probabilities must lie in [0, 1] and labels be 0 or 1")
    return p, y


class ReliabilityBin(BaseModel):
    """One confidence bin of a reliability diagram."""

    lo: float
    hi: float
    count: int = Field(ge=0)
    mean_conf: float | None = Field(description="Mean predicted probability (None: empty bin).")
    accuracy: float | None = Field(description="Fraction of positives (None: empty bin).")


def reliability(probs: ArrayLike, labels: ArrayLike, n_bins: int = 10) -> list[ReliabilityBin]:
    """Equal-width bins over [0, 1] (the last one closed), as ECE and the diagrams use them."""
    p, y = _check(probs, labels)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    idx = np.clip(np.digitize(p, edges[1:-1], right=False), 0, n_bins - 1)
    out = []
    for b in range(n_bins):
        m = idx == b
        n = int(m.sum())
        out.append(
            ReliabilityBin(
                lo=float(edges[b]),
                hi=float(edges[b + 1]),
                count=n,
                mean_conf=float(p[m].mean()) if n else None,
                accuracy=float(y[m].mean()) if n else None,
            )
        )
    return out


def ece(probs: ArrayLike, labels: ArrayLike, n_bins: int = 10) -> float:
    """Expected calibration error: the count-weighted mean |accuracy - confidence| over
    `n_bins` equal-width bins (the usual 10-bin ECE of Guo et al. 2017, binary form)."""
    bins = reliability(probs, labels, n_bins)
    total = sum(b.count for b in bins)
    return float(
        sum(b.count * abs((b.accuracy or 0.0) - (b.mean_conf or 0.0)) for b in bins) / total
    )


def brier(probs: ArrayLike, labels: ArrayLike) -> float:
    """Mean squared difference between probability and outcome."""
    p, y = _check(probs, labels)
    return float(np.mean((p - y) ** 2))


def nll(probs: ArrayLike, labels: ArrayLike) -> float:
    p, y = _check(probs, labels)
    q = np.clip(p, EPS, 1.0 - EPS)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log1p(-q)))


# -- calibrators ----------------------------------------------------------------------------------


class Calibrator(BaseModel):
    """A fitted monotone map from a raw score in [0, 1] to a probability.

    `temperature`: sigmoid(logit(p) / T); `platt`: sigmoid(a * logit(p) + b); `isotonic`:
    piecewise-linear through the pool-adjacent-violators knots (`x` raw, `y` calibrated);
    `identity`: p itself. `target` says what the probability is of, `n_fit` how many labelled
    samples it was fitted on.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Method
    target: str = Field("", description="What the calibrated probability is the chance of.")
    temperature: float = Field(1.0, gt=0.0)
    a: float = 1.0
    b: float = 0.0
    x: list[float] = Field(default_factory=list, description="Isotonic knots, raw scores.")
    y: list[float] = Field(default_factory=list, description="Isotonic knots, probabilities.")
    n_fit: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _knots(self) -> Calibrator:
        if self.method == "isotonic":
            if not self.x or len(self.x) != len(self.y):
                raise ValueError("isotonic needs as many x as y knots (at least one)")
            if any(b < a for a, b in zip(self.x, self.x[1:], strict=False)):
                raise ValueError("isotonic x knots must be sorted")
            if any(b < a for a, b in zip(self.y, self.y[1:], strict=False)):
                raise ValueError("isotonic y knots must not decrease")
        return self

    def apply(self, probs: ArrayLike) -> F64:
        p = np.clip(_arr(probs), 0.0, 1.0)
        if self.method == "temperature":
            return sigmoid(logit(p) / self.temperature)
        if self.method == "platt":
            return sigmoid(self.a * logit(p) + self.b)
        if self.method == "isotonic":
            return np.asarray(np.interp(p, self.x, self.y), dtype=np.float64)
        return p

    def __call__(self, p: float) -> float:
        """One calibrated probability, rounded to 3 decimals as event fields are."""
        return round(float(self.apply(np.array([p]))[0]), 3)


def fit_temperature(probs: ArrayLike, labels: ArrayLike, *, target: str = "") -> Calibrator:
    """The temperature minimizing the log loss of sigmoid(logit(p) / T) (golden-section search
    over log T in [1/20, 20]: the loss is unimodal in T for these one-parameter maps)."""
    p, y = _check(probs, labels)
    z = logit(p)

    def loss(log_t: float) -> float:
        return nll(sigmoid(z / math.exp(log_t)), y)

    lo, hi = math.log(0.05), math.log(20.0)
    g = (math.sqrt(5) - 1) / 2
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    for _ in range(80):
        if loss(c) < loss(d):
            hi = d
        else:
            lo = c
        c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    return Calibrator(
        method="temperature", temperature=math.exp((lo + hi) / 2), target=target, n_fit=p.size
    )


def fit_platt(
    probs: ArrayLike, labels: ArrayLike, *, target: str = "", l2: float = 1e-3
) -> Calibrator:
    """Platt scaling on the log-odds: logistic regression of the label on logit(p), by Newton's
    method with a small ridge (`l2`) so a separable set still gives finite weights."""
    p, y = _check(probs, labels)
    a, b = _logistic(logit(p), y, l2)
    return Calibrator(method="platt", a=a, b=b, target=target, n_fit=p.size)


def _logistic(z: F64, y: F64, l2: float) -> tuple[float, float]:
    """Slope and intercept of a ridge logistic regression of `y` on `z`: Newton's method with
    a backtracking line search (a full Newton step overshoots when the data are separable)."""
    x = np.stack([z, np.ones_like(z)], axis=1)

    def loss(w: F64) -> float:
        s = x @ w
        # log(1 + e^s) - y s, computed without overflow
        return float(np.mean(np.logaddexp(0.0, s) - y * s) + 0.5 * l2 * float(w @ w))

    w = np.array([1.0, 0.0])
    for _ in range(100):
        q = sigmoid(x @ w)
        grad = x.T @ (q - y) / y.size + l2 * w
        hess = (x.T * (q * (1 - q))) @ x / y.size + l2 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        t, before = 1.0, loss(w)
        while loss(w - t * step) > before - 1e-4 * t * float(grad @ step) and t > 1e-8:
            t /= 2
        w = w - t * step
        if float(np.abs(t * step).max()) < 1e-9:
            break
    return float(w[0]), float(w[1])


def fit_isotonic(
    probs: ArrayLike, labels: ArrayLike, *, target: str = "", prior_weight: float = 1.0
) -> Calibrator:
    """Isotonic regression by pool-adjacent-violators; each block becomes a knot at its mean raw
    score, and `apply` interpolates between knots (a step function overfits small sets). Every
    block is shrunk towards the overall rate by `prior_weight` pseudo-samples, so a block of a
    few all-correct samples does not claim probability 1."""
    p, y = _check(probs, labels)
    order = np.argsort(p, kind="stable")
    xs, ys = p[order], y[order]
    # Blocks: [sum_y, count, sum_x]; merge while the previous mean exceeds the next one.
    blocks: list[list[float]] = []
    for xv, yv in zip(xs, ys, strict=True):
        blocks.append([float(yv), 1.0, float(xv)])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] >= blocks[-1][0] / blocks[-1][1]:
            s, n, sx = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += n
            blocks[-1][2] += sx
    rate = float(ys.mean())
    kx = [b[2] / b[1] for b in blocks]
    ky = [(b[0] + prior_weight * rate) / (b[1] + prior_weight) for b in blocks]
    ky = list(np.maximum.accumulate(np.asarray(ky)))  # shrinkage keeps the order; be exact
    return Calibrator(
        method="isotonic", x=kx, y=[float(v) for v in ky], target=target, n_fit=p.size
    )


FITTERS = {"temperature": fit_temperature, "platt": fit_platt, "isotonic": fit_isotonic}


def fit_best(
    probs: ArrayLike,
    labels: ArrayLike,
    *,
    target: str = "",
    methods: Sequence[str] = ("temperature", "platt", "isotonic"),
    folds: int = 5,
    seed: int = 0,
) -> tuple[Calibrator, dict[str, float]]:
    """Each method scored by `folds`-fold cross-validated ECE on the fitting data; the best
    one refitted on all of it. Returns it and the cross-validated ECE per method."""
    p, y = _check(probs, labels)
    rng = np.random.default_rng(seed)
    fold = rng.permutation(p.size) % folds
    scores: dict[str, float] = {}
    for m in methods:
        pred = np.empty_like(p)
        for k in range(folds):
            test = fold == k
            if not test.any() or test.all():
                pred[test] = p[test]
                continue
            pred[test] = FITTERS[m](p[~test], y[~test]).apply(p[test])
        scores[m] = ece(pred, y)
    best = min(scores, key=lambda m: scores[m])
    return FITTERS[best](p, y, target=target), scores


# -- joint estimate --------------------------------------------------------------------------------


def binary_entropy_bits(p: ArrayLike) -> F64:
    q = np.clip(_arr(p), EPS, 1.0 - EPS)
    return np.asarray(-(q * np.log2(q) + (1 - q) * np.log2(1 - q)), dtype=np.float64)


def pooled_logit(probs: ArrayLike) -> F64:
    """Entropy-weighted log-odds pool of calibrated probabilities, one row per term and one
    column per modality (NaN: that modality did not observe the term). A modality's weight is
    its information, 1 - H(p) bits, so a confident observation counts more than a hedged one;
    the weights are normalized to sum to the number of observers, so two agreeing, equally sure
    modalities add their evidence as independent ones would."""
    p = np.atleast_2d(_arr(probs))
    seen = ~np.isnan(p)
    q = np.where(seen, p, 0.5)
    w = np.where(seen, 1.0 - binary_entropy_bits(q) + 1e-3, 0.0)
    w = w / w.sum(axis=1, keepdims=True) * seen.sum(axis=1, keepdims=True)
    return np.asarray((w * np.where(seen, logit(q), 0.0)).sum(axis=1), dtype=np.float64)


class JointCalibrator(BaseModel):
    """The joint estimate of a term two modalities observe: sigmoid(a * pooled_logit + b), with
    a and b fitted (Platt) on dev terms so the pool's scale is itself calibrated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["entropy_pool"] = "entropy_pool"
    target: str = ""
    a: float = 1.0
    b: float = 0.0
    n_fit: int = Field(0, ge=0)

    def apply(self, probs: ArrayLike) -> F64:
        return sigmoid(self.a * pooled_logit(probs) + self.b)


def fit_joint(
    probs: ArrayLike, labels: ArrayLike, *, target: str = "", l2: float = 1e-2
) -> JointCalibrator:
    """Platt scaling of `pooled_logit` (ridge `l2`: a few dev terms that the pool separates
    perfectly must not send the slope to infinity)."""
    z = pooled_logit(probs)
    _, y = _check(sigmoid(z), labels)
    a, b = _logistic(z, y, l2)
    return JointCalibrator(a=a, b=b, target=target, n_fit=int(z.size))


# -- the shipped calibrators -----------------------------------------------------------------------


def _asset(name: str) -> str:
    path = resources.files("streamfuse.assets").joinpath("calibration", f"{name}.json")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise CalibrationError(f"no shipped calibrator {name!r} ({path})") from e


@cache
def shipped(kind: Literal["ocr", "asr"]) -> Calibrator:
    """The calibrator shipped for OCR lines (`ocr`) or ASR words (`asr`)."""
    return Calibrator.model_validate(json.loads(_asset(kind)))


@cache
def shipped_joint() -> JointCalibrator:
    return JointCalibrator.model_validate(json.loads(_asset("joint")))


__all__ = [
    "CalibrationError",
    "Calibrator",
    "JointCalibrator",
    "ReliabilityBin",
    "binary_entropy_bits",
    "brier",
    "ece",
    "fit_best",
    "fit_isotonic",
    "fit_joint",
    "fit_platt",
    "fit_temperature",
    "logit",
    "nll",
    "pooled_logit",
    "reliability",
    "shipped",
    "shipped_joint",
    "sigmoid",
]
