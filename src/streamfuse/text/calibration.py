"""Confidence calibration: maps what a recognizer knows about its output to the probability that
the output is right, fits those maps on labelled runs, scores them (ECE, Brier, AUROC,
reliability bins) and fuses two modalities' probabilities of one term (entropy-weighted pooling).

Two kinds of map: `Calibrator` (temperature / Platt / isotonic on the raw score alone) and
`FeatureCalibrator` (a ridge logistic regression on named features the stages have when they
emit: `ocr_line_features`, `asr_word_features`). The package ships one per modality
(`assets/calibration/ocr.json`: P(an OCR line is read exactly), `asr.json`: P(an ASR word is
right)) and the joint map (`joint.json`); `shipped(kind)` loads them. Fitting data and plots live
in `benchmarks/calibration.py` (docs/calibration.md). Numpy only: the run-time path must not need
scikit-learn or SciPy.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Mapping, Sequence
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


# -- features -------------------------------------------------------------------------------------
#
# What a stage knows about one output when it emits it, as numbers a `FeatureCalibrator` weighs.
# The functions take only what the emitted record holds (raw scores rounded as events round them,
# boxes in whole pixels) plus, for ASR, the raw p of the words the stream committed just before
# and the tokenizer's count: the benchmark recomputes the same features from recorded runs.

#: Feature names, in the order `FeatureCalibrator.features` lists them when fitted by the benchmark.
OCR_FEATURES = (
    "logit_conf",
    "logit_mean_conf",
    "log_height_px",
    "log_chars",
    "alpha",
    "digits",
    "symbols",
    "cells",
    "width_per_char",
    "log_lines",
    "known_words",
)
#: Layout features `ocr_line_features` also gives (docs/ocr-layout.md): not in `OCR_FEATURES`,
#: so no fit uses them until a refit chooses to, by docs/calibration.md's pre-registered rule.
OCR_LAYOUT_FEATURES = ("gap_bridged", "inferred_cuts")
#: Features of a line among the other lines of its reading
#: (`vision.layout.ocr_context_features`): what a
#: layout error looks like from outside the line - a table row read cell by cell leaves lines
#: side by side on one row, two text columns joined into table rows make a short "table".
OCR_CONTEXT_FEATURES = ("row_peers", "cell_rows", "cells_vs_neighbours")
ASR_FEATURES = (
    "logit_p",
    "recent_mean_p",
    "recent_low",
    "tokens",
    "chars",
    "fragment",
    "digit",
    "known",
)
#: Committed words whose raw p make up an ASR word's `recent_*` features (this event's included).
ASR_RECENT_WORDS = 16

_EDGE_PUNCT = re.compile(r"^\W+|\W+$")
_KEY = re.compile(r"[^\w']+")
_LETTERS = re.compile(r"[^\W\d_]+")


@cache
def common_words() -> frozenset[str]:
    """Common English words (lower case, 4+ letters; `assets/calibration/words.txt.gz`: the
    whole words of Whisper's BPE vocabulary), for the "is it a known word" features."""
    path = resources.files("streamfuse.assets").joinpath("calibration", "words.txt.gz")
    try:
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
    except FileNotFoundError as e:
        raise CalibrationError(f"no shipped word list ({path})") from e
    return frozenset(ln for ln in text.splitlines() if ln and not ln.startswith("#"))


def known_share(text: str) -> float:
    """The share of `text`'s words of 4+ letters that are common English words (1: none that
    long). A misread word is rarely a real one ("clavter", "Hemitian")."""
    words = [w.lower() for w in _LETTERS.findall(text) if len(w) >= 4]
    if not words:
        return 1.0
    known = common_words()
    return sum(w in known for w in words) / len(words)


def _logit1(p: float, lo: float = 1e-3) -> float:
    q = min(max(p, lo), 1.0 - lo)
    return math.log(q / (1.0 - q))


def ocr_line_features(
    text: str,
    box: Sequence[float],
    conf_raw: float,
    *,
    scale: float,
    mean_conf: float | None,
    n_lines: int,
    gap_bridged: float | None = None,
    inferred_cuts: int | None = None,
    context: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Features of one OCR line: the recognizer's score and the reading's mean score, the text
    height the detector saw (box height x `scale`), the length and make-up of the text (letters,
    digits, other symbols, table cells), how wide it is per character relative to its height
    (high: boxes far apart joined into one line), how many lines the reading has and the share
    of its words that are common English words; and from the layout (0 when not known) the
    widest gap it bridged joining boxes, in line heights (`gap_bridged`, capped at 6), and the
    table's column boundaries only word gutters showed (`inferred_cuts`, capped at 3); and the
    line's `context` among the reading's other lines (`vision.layout.ocr_context_features`;
    0 when not given). A calibrator reads only the features it was fitted on."""
    chars = [c for c in text if not c.isspace()]
    n = max(len(chars), 1)
    height = max(float(box[3]) - float(box[1]), 1.0)
    width = max(float(box[2]) - float(box[0]), 1.0)
    return {
        "logit_conf": _logit1(conf_raw, 5e-4),
        "logit_mean_conf": _logit1(conf_raw if mean_conf is None else mean_conf, 5e-4),
        "log_height_px": math.log(max(height * scale, 1.0)),
        "log_chars": math.log1p(len(chars)),
        "alpha": sum(c.isalpha() for c in chars) / n,
        "digits": sum(c.isdigit() for c in chars) / n,
        "symbols": sum(not c.isalnum() and c != "|" for c in chars) / n,
        "cells": float(min(text.count("|"), 6)),
        "width_per_char": min(width / (n * height), 3.0),
        "log_lines": math.log1p(n_lines),
        "known_words": known_share(text),
        "gap_bridged": min(float(gap_bridged or 0.0), 6.0),
        "inferred_cuts": float(min(inferred_cuts or 0, 3)),
        **{f: float((context or {}).get(f, 0.0)) for f in OCR_CONTEXT_FEATURES},
    }


def asr_core(word: str) -> str:
    """The word without leading/trailing punctuation (what the tokenizer is asked about)."""
    return _EDGE_PUNCT.sub("", word.strip())


def asr_word_features(
    word: str, p_raw: float, recent_p: Sequence[float], tokens: int
) -> dict[str, float]:
    """Features of one committed ASR word: Whisper's probability; the mean raw p of the stream's
    last `ASR_RECENT_WORDS` committed words and the share of them below 0.5 (a voice, accent or
    noise the recognizer finds hard lowers them all); how many tokens the model spends on the
    word (`tokens`, 1: a word it knows well), its length in characters, whether it continues the
    previous word ("-runs", "'s"), whether it holds a digit and whether it is a common English
    word (`known_share`)."""
    recent = list(recent_p)[-ASR_RECENT_WORDS:] or [p_raw]
    core = asr_core(word)
    stripped = word.strip()
    return {
        "logit_p": _logit1(p_raw),
        "recent_mean_p": float(np.mean(recent)),
        "recent_low": float(np.mean([q < 0.5 for q in recent])),
        "tokens": float(min(max(tokens, 1), 5)),
        "chars": float(min(len(_KEY.sub("", core)), 15)),
        "fragment": float(bool(stripped) and not stripped[0].isalnum()),
        "digit": float(any(c.isdigit() for c in core)),
        "known": known_share(core),
    }


# -- feature calibrators ---------------------------------------------------------------------------


def auroc(probs: ArrayLike, labels: ArrayLike) -> float | None:
    """Area under the ROC curve (how well the probabilities rank right above wrong; 0.5:
    not at all), ties counted half; None when the labels are all one class."""
    p, y = _check(probs, labels)
    pos, neg = int(y.sum()), int((1 - y).sum())
    if pos == 0 or neg == 0:
        return None
    order = np.argsort(p, kind="stable")
    ranks = np.empty(p.size)
    sp = p[order]
    # Average ranks over ties.
    i = 0
    while i < sp.size:
        j = i
        while j + 1 < sp.size and sp[j + 1] == sp[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))


#: The derived feature a stacked `FeatureCalibrator` reads: logit of its `base` map applied to
#: the raw score (recovered from the `logit_conf` / `logit_p` feature).
BASE_FEATURE = "logit_base"


class FeatureCalibrator(BaseModel):
    """P(right) = sigmoid(coef . (x - mean) / scale + intercept) over named features: a ridge
    logistic regression (`fit_logistic`). `__call__` takes one output's feature mapping.
    Stacked (`fit_stacked`): with a `base` raw-score map, the feature `logit_base` is the logit
    of that map applied to the raw score (read back from the feature `base_of`), so the
    regression corrects the map where the other features say it is wrong."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["logistic"] = "logistic"
    target: str = Field("", description="What the calibrated probability is the chance of.")
    features: list[str] = Field(min_length=1)
    mean: list[float]
    scale: list[float]
    coef: list[float]
    intercept: float = 0.0
    l2: float = Field(0.0, ge=0.0, description="The ridge penalty it was fitted with.")
    n_fit: int = Field(0, ge=0)
    base: Calibrator | None = Field(None, description="Raw-score map behind `logit_base`.")
    base_of: str = Field("logit_conf", description="The feature holding the raw score's logit.")

    @model_validator(mode="after")
    def _shapes(self) -> FeatureCalibrator:
        k = len(self.features)
        if not (len(self.mean) == len(self.scale) == len(self.coef) == k):
            raise ValueError(
                f"{k} features but {len(self.mean)}/{len(self.scale)}/"
                f"{len(self.coef)} means/scales/coefficients"
            )
        if any(v <= 0 for v in self.scale):
            raise ValueError("feature scales must be positive")
        if (BASE_FEATURE in self.features) != (self.base is not None):
            raise ValueError(f"a {BASE_FEATURE!r} feature needs a base map and vice versa")
        return self

    def matrix(self, rows: Sequence[Mapping[str, float]]) -> F64:
        """Feature rows as an (n, k) array in this calibrator's feature order."""
        names = sorted({f for f in self.features if f != BASE_FEATURE} | self._needs_base())
        try:
            x = np.array([[r[f] for f in names] for r in rows], dtype=np.float64)
        except KeyError as e:
            raise CalibrationError(f"feature {e.args[0]!r} missing; need {self.features}") from e
        return self.matrix_from(x.reshape(len(rows), len(names)), names)

    def _needs_base(self) -> set[str]:
        return {self.base_of} if self.base is not None else set()

    def matrix_from(self, x: ArrayLike, names: Sequence[str]) -> F64:
        """This calibrator's (n, k) input from a matrix whose columns are the features `names`
        (computing `logit_base` when stacked)."""
        xa = np.atleast_2d(_arr(x))
        cols = []
        for f in self.features:
            src = self.base_of if f == BASE_FEATURE else f
            if src not in names:
                raise CalibrationError(f"feature {src!r} missing; need {self.features}")
            col = xa[:, list(names).index(src)]
            if f == BASE_FEATURE and self.base is not None:
                col = base_logit(self.base, col)
            cols.append(col)
        return np.stack(cols, axis=1) if cols else np.empty((xa.shape[0], 0))

    def apply(self, x: ArrayLike) -> F64:
        """Probabilities of the rows of `x` ((n, k), columns in `features` order)."""
        z = (np.atleast_2d(_arr(x)) - _arr(self.mean)) / _arr(self.scale)
        return sigmoid(z @ _arr(self.coef) + self.intercept)

    def __call__(self, features: Mapping[str, float]) -> float:
        """One calibrated probability, rounded to 3 decimals as event fields are."""
        return round(float(self.apply(self.matrix([features]))[0]), 3)


def base_logit(base: Calibrator, logit_raw: ArrayLike) -> F64:
    """logit(base(raw)) from the raw score's logit feature (clipped as `logit` clips)."""
    return logit(base.apply(sigmoid(_arr(logit_raw))))


def fit_stacked(
    x: ArrayLike,
    labels: ArrayLike,
    features: Sequence[str],
    extra: Sequence[str],
    *,
    base_of: str = "logit_conf",
    l2: float = 1e-2,
    target: str = "",
) -> FeatureCalibrator:
    """An isotonic map of the raw score (read from the feature `base_of` of `x`, whose
    columns are `features`), then a ridge logistic regression on its logit and the `extra`
    features: the raw-score map where the extra features are typical, corrected where they
    are not."""
    xa = np.atleast_2d(_arr(x))
    names = list(features)
    raw = sigmoid(xa[:, names.index(base_of)])
    base = fit_isotonic(raw, labels, target=target)
    z = np.column_stack(
        [base_logit(base, xa[:, names.index(base_of)])] + [xa[:, names.index(f)] for f in extra]
    )
    model = fit_logistic(z, labels, ["base", *extra], l2=l2, target=target)
    fields = model.model_dump() | {"features": [BASE_FEATURE, *extra], "base_of": base_of}
    return FeatureCalibrator.model_validate(fields | {"base": base})


def fit_logistic(
    x: ArrayLike, labels: ArrayLike, features: Sequence[str], *, l2: float = 1e-2, target: str = ""
) -> FeatureCalibrator:
    """Ridge logistic regression of the labels on standardized features (Newton's method; the
    intercept is not penalized)."""
    xa = np.atleast_2d(_arr(x))
    y = _arr(labels).ravel()
    if xa.shape != (y.size, len(features)):
        raise CalibrationError(f"{xa.shape} feature matrix for {y.size} labels x {len(features)}")
    _check(np.full(y.size, 0.5), y)
    mean = xa.mean(axis=0)
    scale = xa.std(axis=0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    w, b = _ridge_logistic((xa - mean) / scale, y, l2)
    return FeatureCalibrator(
        target=target,
        features=list(features),
        mean=[float(v) for v in mean],
        scale=[float(v) for v in scale],
        coef=[float(v) for v in w],
        intercept=b,
        l2=l2,
        n_fit=int(y.size),
    )


def _ridge_logistic(z: F64, y: F64, l2: float) -> tuple[F64, float]:
    """Weights and intercept of a ridge logistic regression (Newton with backtracking)."""
    n, k = z.shape
    x = np.concatenate([z, np.ones((n, 1))], axis=1)
    pen = np.full(k + 1, l2)
    pen[-1] = 0.0

    def loss(w: F64) -> float:
        s = x @ w
        return float(np.mean(np.logaddexp(0.0, s) - y * s) + 0.5 * float(pen @ (w * w)))

    w = np.zeros(k + 1)
    for _ in range(100):
        q = sigmoid(x @ w)
        grad = x.T @ (q - y) / n + pen * w
        hess = (x.T * (q * (1 - q))) @ x / n + np.diag(pen + 1e-9)
        step = np.linalg.solve(hess, grad)
        t, before = 1.0, loss(w)
        while loss(w - t * step) > before - 1e-4 * t * float(grad @ step) and t > 1e-8:
            t /= 2
        w = w - t * step
        if float(np.abs(t * step).max()) < 1e-9:
            break
    return w[:-1], float(w[-1])


AnyCalibrator = Calibrator | FeatureCalibrator


def calibrate_ocr_line(
    cal: AnyCalibrator,
    text: str,
    box: Sequence[float],
    conf_raw: float,
    *,
    scale: float,
    mean_conf: float | None,
    n_lines: int,
    gap_bridged: float | None = None,
    inferred_cuts: int | None = None,
    context: Mapping[str, float] | None = None,
) -> float:
    """One OCR line's calibrated `conf` (3 decimals), whichever kind `cal` is."""
    if isinstance(cal, FeatureCalibrator):
        feats = ocr_line_features(
            text,
            box,
            conf_raw,
            scale=scale,
            mean_conf=mean_conf,
            n_lines=n_lines,
            gap_bridged=gap_bridged,
            inferred_cuts=inferred_cuts,
            context=context,
        )
        return cal(feats)
    return cal(conf_raw)


def calibrate_asr_word(
    cal: AnyCalibrator, word: str, p_raw: float, recent_p: Sequence[float], tokens: int
) -> float:
    """One ASR word's calibrated `p` (3 decimals), whichever kind `cal` is."""
    if isinstance(cal, FeatureCalibrator):
        return cal(asr_word_features(word, p_raw, recent_p, tokens))
    return cal(p_raw)


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


#: What a logistic `JointCalibrator` may read per shared term: the two calibrated
#: probabilities' logits, their entropy-weighted pool, and the speech stream's reliability (the
#: ASR word's `recent_mean_p`: mean raw p of the stream's last committed words).
JOINT_FEATURES = ("logit_speech", "logit_screen", "pool", "recent_mean_p")


class JointCalibrator(BaseModel):
    """The joint estimate of a term two modalities observe. `entropy_pool`: sigmoid(a *
    pooled_logit + b), a and b fitted (Platt) on dev terms so the pool's scale is itself
    calibrated. `logistic`: a ridge logistic regression (`model`) on `JOINT_FEATURES` of
    terms both modalities observed (`fit_joint_logistic`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["entropy_pool", "logistic"] = "entropy_pool"
    target: str = ""
    a: float = 1.0
    b: float = 0.0
    n_fit: int = Field(0, ge=0)
    model: FeatureCalibrator | None = None

    @model_validator(mode="after")
    def _model(self) -> JointCalibrator:
        if (self.method == "logistic") != (self.model is not None):
            raise ValueError("a logistic joint calibrator needs its model (and only it has one)")
        if self.model is not None and not set(self.model.features) <= set(JOINT_FEATURES):
            raise ValueError(f"joint features must be among {JOINT_FEATURES}")
        return self

    def apply(self, probs: ArrayLike, extra: Mapping[str, ArrayLike] | None = None) -> F64:
        """Joint probabilities of rows (speech, screen) of calibrated probabilities; `extra`
        holds per-row reliability features (`recent_mean_p`) a logistic model reads."""
        if self.model is None:
            return sigmoid(self.a * pooled_logit(probs) + self.b)
        return self.model.apply(joint_matrix(probs, extra, self.model.features))


def joint_matrix(
    probs: ArrayLike, extra: Mapping[str, ArrayLike] | None, features: Sequence[str]
) -> F64:
    """The (n, k) `features` of shared terms: rows (speech, screen) both observed."""
    p = np.atleast_2d(_arr(probs))
    if np.isnan(p).any():
        raise CalibrationError("a logistic joint estimate needs both modalities observed")
    cols: dict[str, F64] = {
        "logit_speech": logit(p[:, 0]),
        "logit_screen": logit(p[:, 1]),
        "pool": pooled_logit(p),
    }
    for k, v in (extra or {}).items():
        cols[k] = _arr(v).reshape(-1)
    try:
        return np.stack([cols[f] for f in features], axis=1)
    except KeyError as e:
        raise CalibrationError(f"joint feature {e.args[0]!r} not given") from e


def fit_joint(
    probs: ArrayLike, labels: ArrayLike, *, target: str = "", l2: float = 1e-2
) -> JointCalibrator:
    """Platt scaling of `pooled_logit` (ridge `l2`: a few dev terms that the pool separates
    perfectly must not send the slope to infinity)."""
    z = pooled_logit(probs)
    _, y = _check(sigmoid(z), labels)
    a, b = _logistic(z, y, l2)
    return JointCalibrator(a=a, b=b, target=target, n_fit=int(z.size))


def fit_joint_logistic(
    probs: ArrayLike,
    labels: ArrayLike,
    features: Sequence[str],
    extra: Mapping[str, ArrayLike] | None = None,
    *,
    l2: float = 1e-2,
    target: str = "",
) -> JointCalibrator:
    """A ridge logistic regression of the labels on the terms' `features` (`JOINT_FEATURES`)."""
    if not set(features) <= set(JOINT_FEATURES):
        raise CalibrationError(f"joint features {list(features)}: not among {JOINT_FEATURES}")
    x = joint_matrix(probs, extra, features)
    model = fit_logistic(x, labels, features, l2=l2, target=target)
    return JointCalibrator(method="logistic", model=model, target=target, n_fit=model.n_fit)


# -- the shipped calibrators -----------------------------------------------------------------------


def _asset(name: str) -> str:
    path = resources.files("streamfuse.assets").joinpath("calibration", f"{name}.json")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise CalibrationError(f"no shipped calibrator {name!r} ({path})") from e


@cache
def shipped(kind: Literal["ocr", "asr"]) -> AnyCalibrator:
    """The calibrator shipped for OCR lines (`ocr`) or ASR words (`asr`): a `FeatureCalibrator`
    (features from `ocr_line_features` / `asr_word_features`) or a raw-score `Calibrator`."""
    data = json.loads(_asset(kind))
    if data.get("method") == "logistic":
        return FeatureCalibrator.model_validate(data)
    return Calibrator.model_validate(data)


@cache
def shipped_joint() -> JointCalibrator:
    return JointCalibrator.model_validate(json.loads(_asset("joint")))


__all__ = [
    "ASR_FEATURES",
    "ASR_RECENT_WORDS",
    "BASE_FEATURE",
    "JOINT_FEATURES",
    "OCR_CONTEXT_FEATURES",
    "OCR_FEATURES",
    "OCR_LAYOUT_FEATURES",
    "AnyCalibrator",
    "CalibrationError",
    "Calibrator",
    "FeatureCalibrator",
    "JointCalibrator",
    "ReliabilityBin",
    "asr_core",
    "asr_word_features",
    "base_logit",
    "auroc",
    "binary_entropy_bits",
    "calibrate_asr_word",
    "calibrate_ocr_line",
    "common_words",
    "brier",
    "ece",
    "fit_best",
    "fit_isotonic",
    "fit_joint",
    "fit_joint_logistic",
    "fit_logistic",
    "fit_stacked",
    "fit_platt",
    "fit_temperature",
    "joint_matrix",
    "known_share",
    "logit",
    "nll",
    "ocr_line_features",
    "pooled_logit",
    "reliability",
    "shipped",
    "shipped_joint",
    "sigmoid",
]
