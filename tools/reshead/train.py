"""Training, selection, export and quantization of the resolution head.

Used by `scripts/train_reshead.py`. The steps: train `ResHeadNet` with cross-entropy on
(thumbnail, lowest readable rung) pairs; pick the decision threshold `tau` on a validation
split; fold BatchNorm and export to ONNX; quantize to INT8 with onnxruntime's static quantizer
in several formats and keep the fastest one that keeps accuracy.

Decision rule: with class probabilities p_k over rungs (index 0 largest), pick the smallest
rung (highest index) j with P(label >= j) = sum_{k >= j} p_k >= tau. A pick is *correct* when
j <= label (the chosen rung is at least as large as the lowest one that reads the text).
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from streamfuse.models import ort_session_options
from streamfuse.qos.ladder import Ladder
from streamfuse.vision.reshead.preprocess import BLOCK, model_input, standardize
from tools.reshead.model import ResHeadNet, fold_batchnorm

log = logging.getLogger(__name__)


def pick_rungs(probs: np.ndarray, tau: float) -> np.ndarray:
    """Per row, the highest class index j with sum_{k>=j} p_k >= tau (0 if none)."""
    tail = np.cumsum(probs[:, ::-1], axis=1)[:, ::-1]  # tail[:, j] = P(label >= j)
    ok = tail >= tau - 1e-6  # float sums of probabilities that should reach tau exactly
    idx = np.arange(probs.shape[1])
    return np.where(ok, idx, -1).max(axis=1).clip(min=0)


@dataclass(frozen=True, slots=True)
class PickStats:
    """How a set of picks does against the labels."""

    accuracy: float  # picks that read the text (pick <= label)
    exact: float  # picks equal to the label
    cost: float  # mean detector pixels of the picks relative to the top rung
    oracle_cost: float  # the same for the labels themselves
    n: int


def pick_stats(picks: np.ndarray, labels: np.ndarray, ladder: Ladder) -> PickStats:
    px = np.array([r.pixels for r in ladder], dtype=np.float64) / ladder[0].pixels
    return PickStats(
        accuracy=float(np.mean(picks <= labels)),
        exact=float(np.mean(picks == labels)),
        cost=float(np.mean(px[picks])),
        oracle_cost=float(np.mean(px[labels])),
        n=len(labels),
    )


def choose_tau(
    probs: np.ndarray,
    labels: np.ndarray,
    ladder: Ladder,
    target_accuracy: float = 0.95,
    grid: Sequence[float] = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99),
) -> float:
    """The smallest tau (cheapest picks) whose validation accuracy reaches the target; the
    most conservative one in the grid when none does."""
    for tau in sorted(grid):
        if pick_stats(pick_rungs(probs, tau), labels, ladder).accuracy >= target_accuracy:
            return tau
    return max(grid)


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Flips and small shifts: they move text around without changing its size."""
    n = x.shape[0]
    flip_w = torch.rand(n, generator=gen) < 0.5
    x = torch.where(flip_w[:, None, None, None], x.flip(-1), x)
    flip_h = torch.rand(n, generator=gen) < 0.2
    x = torch.where(flip_h[:, None, None, None], x.flip(-2), x)
    neg = torch.rand(n, generator=gen) < 0.2  # light <-> dark slide
    x = torch.where(neg[:, None, None, None], -x, x)
    dy, dx = (int(v) for v in torch.randint(-6, 7, (2,), generator=gen))
    return torch.roll(x, shifts=(dy, dx), dims=(-2, -1))


@dataclass(frozen=True, slots=True)
class TrainResult:
    model: ResHeadNet
    epochs: int
    seconds: float
    final_loss: float


def train(
    thumbs: np.ndarray,
    labels: np.ndarray,
    n_classes: int,
    epochs: int = 60,
    batch_size: int = 32,
    lr: float = 3e-3,
    weight_decay: float = 1e-3,
    seed: int = 0,
    threads: int = 1,
    max_seconds: float | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train a fresh `ResHeadNet` on uint8 thumbnails (N, h, w) and integer labels (N,)."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    x_all = torch.from_numpy(standardize(thumbs))[:, None]
    y_all = torch.from_numpy(labels.astype(np.int64))
    model = ResHeadNet(n_classes)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = max(1, (len(y_all) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=lr, total_steps=epochs * steps_per_epoch, pct_start=0.15
    )
    # Mild class weighting: rare large-rung classes matter (missing them loses text).
    counts = torch.bincount(y_all, minlength=n_classes).float()
    weights = (counts.sum() / counts.clamp(min=1.0)) ** 0.5
    loss_fn = nn.CrossEntropyLoss(weight=weights / weights.mean(), label_smoothing=0.05)
    t0 = time.monotonic()
    loss_val = float("nan")
    epoch = 0
    for epoch in range(1, epochs + 1):
        model.train()
        perm = torch.randperm(len(y_all), generator=gen)
        total = 0.0
        for i in range(0, len(perm), batch_size):
            idx = perm[i : i + batch_size]
            xb = F.pixel_unshuffle(_augment(x_all[idx], gen), BLOCK)
            loss = loss_fn(model(xb), y_all[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(idx)
        loss_val = total / len(y_all)
        if progress is not None:
            progress(epoch, loss_val)
        if max_seconds is not None and time.monotonic() - t0 > max_seconds:
            log.warning("training stopped by the time limit after %d epochs", epoch)
            break
    model.eval()
    return TrainResult(model, epoch, time.monotonic() - t0, loss_val)


def predict_proba(model: nn.Module, thumbs: np.ndarray) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(model_input(thumbs)))
    return torch.softmax(logits, dim=1).numpy()


# ----------------------------------------------------------------------------------------------
# Export and quantization


def export_onnx(model: ResHeadNet, path: Path, input_hw: tuple[int, int]) -> list[str]:
    """Fold BatchNorm, export (batch 1, opset 17), check; returns the graph's op types."""
    import onnx

    folded = fold_batchnorm(model.eval())
    dummy = torch.zeros(1, BLOCK * BLOCK, input_hw[0] // BLOCK, input_hw[1] // BLOCK)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of torch.export; it is kept because
        # its graph for this plain CNN is exactly Conv/Relu/Reduce/Gemm, checked below.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            folded,
            (dummy,),
            str(path),
            input_names=["thumb"],
            output_names=["logits"],
            opset_version=17,
            dynamo=False,
        )
    graph = onnx.load(str(path))
    onnx.checker.check_model(graph)
    ops = sorted({n.op_type for n in graph.graph.node})
    if "BatchNormalization" in ops:
        raise RuntimeError(f"BatchNorm left in the exported graph {path}")
    return ops


def ort_session(path: Path, threads: int = 1) -> Any:
    import onnxruntime as ort

    opts = ort_session_options(intra_op_threads=threads)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def ort_proba(path: Path, thumbs: np.ndarray) -> np.ndarray:
    sess = ort_session(path)
    x = model_input(thumbs)
    logits = np.concatenate([sess.run(None, {"thumb": x[i : i + 1]})[0] for i in range(len(x))])
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def quantize(
    fp32_path: Path,
    out_path: Path,
    calib_thumbs: np.ndarray,
    fmt: str = "QDQ",
    per_channel: bool = False,
) -> None:
    """Static INT8 quantization (uint8 activations, int8 weights) calibrated on thumbnails."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from tools.onnx_quant import calibration_reader

    x = model_input(calib_thumbs)
    prep = out_path.with_suffix(".prep.onnx")
    quant_pre_process(str(fp32_path), str(prep), skip_symbolic_shape=True)
    quantize_static(
        str(prep),
        str(out_path),
        calibration_reader({"thumb": x[i : i + 1]} for i in range(len(x))),
        quant_format=QuantFormat.QDQ if fmt == "QDQ" else QuantFormat.QOperator,
        per_channel=per_channel,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
    )
    prep.unlink(missing_ok=True)


def bench_latency_ms(
    paths: dict[str, Path],
    input_hw: tuple[int, int],
    iters: int = 400,
    rounds: int = 8,
) -> dict[str, float]:
    """Median single-thread latency per model, ms. Models are run in interleaved rounds so that
    load from other processes hits them alike; the ratio is the meaningful figure."""
    sessions = {k: ort_session(p, threads=1) for k, p in paths.items()}
    shape = (1, BLOCK * BLOCK, input_hw[0] // BLOCK, input_hw[1] // BLOCK)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    samples: dict[str, list[float]] = {k: [] for k in paths}
    for s in sessions.values():
        for _ in range(20):
            s.run(None, {"thumb": x})
    per_round = max(1, iters // rounds)
    for _ in range(rounds):
        for k, s in sessions.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                s.run(None, {"thumb": x})
                samples[k].append((time.perf_counter() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}
