"""Train, export and quantize the learned OCR resolution head (F14).

    python scripts/train_reshead.py            # full: ~600 labelled frames, minutes of training
    python scripts/train_reshead.py --quick    # smaller subset, few epochs (pipeline check)

Steps: render slide-like frames (Pillow, system fonts) -> label each with the lowest ladder rung
at which rapidocr reads its text (CER <= 2%; cached under build/reshead/, resumable, run at nice
10) -> train the depthwise-separable CNN (torch) -> choose the decision threshold on a
validation split -> fold BatchNorm, export ONNX -> static INT8 quantization (QDQ and QOperator,
per-tensor and per-channel) -> latency FP32 vs INT8 (onnxruntime, 1 thread, median) and
held-out accuracy -> write the models and a JSON report (build/reshead/report.json). Without
--out the models go to src/streamfuse/vision/reshead/ (the ones the package ships); --quick
writes to build/reshead/quick/ instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from streamfuse.qos.ladder import DEFAULT_LADDER
from streamfuse.vision.reshead.preprocess import BLOCK, DEFAULT_INPUT_HW

ROOT = Path(__file__).resolve().parents[1]
# The training code lives in the checkout's `tools/` package, not in the installed runtime.
sys.path.insert(0, str(ROOT))

from tools.reshead.dataset import cached_thumbnails, label_frames  # noqa: E402
from tools.reshead.model import count_macs, count_params  # noqa: E402
from tools.reshead.train import (  # noqa: E402
    bench_latency_ms,
    choose_tau,
    export_onnx,
    ort_proba,
    pick_rungs,
    pick_stats,
    predict_proba,
    quantize,
    train,
)

BUILD = ROOT / "build" / "reshead"
PACKAGE_DIR = ROOT / "src" / "streamfuse" / "vision" / "reshead"
log = logging.getLogger("train_reshead")

# (name, seed, smallest-text range in px on a 1920x1080 slide, frames full, frames --quick).
# "natural" follows typical slides; "small" oversamples the small text where rungs differ.
DATASETS = (
    ("natural", 1234, (12, 72), 500, 120),
    ("small", 1235, (10, 28), 200, 60),
)


def split_of(index: int) -> str:
    r = index % 10
    return "test" if r < 2 else "val" if r == 2 else "train"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small subset, few epochs")
    ap.add_argument("--epochs", type=int, default=None, help="default 80 (quick: 15)")
    ap.add_argument("--max-train-s", type=float, default=420.0, help="training time cap, s")
    ap.add_argument("--workers", type=int, default=2, help="labelling processes (1 thread each)")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="model folder (default: the package; with --quick: build/reshead/quick)",
    )
    ap.add_argument("--target-accuracy", type=float, default=0.95, help="validation target")
    ap.add_argument("--bench-iters", type=int, default=600)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("RapidOCR").setLevel(logging.ERROR)
    # --quick never overwrites the shipped models unless --out says so.
    out_dir: Path = args.out or (BUILD / "quick" if args.quick else PACKAGE_DIR)
    ladder = DEFAULT_LADDER
    input_hw = DEFAULT_INPUT_HW
    epochs = args.epochs or (15 if args.quick else 80)
    t_start = time.monotonic()

    # 1. Labels (cached) and thumbnails.
    thumbs, labels, readable, sets, splits = [], [], [], [], []
    label_cpu_s = 0.0
    for name, seed, text_px, n_full, n_quick in DATASETS:
        n = n_quick if args.quick else n_full
        path = BUILD / f"labels-det-s{seed}-t{text_px[0]}-{text_px[1]}.jsonl"
        lab = label_frames(path, range(n), seed, workers=args.workers, text_px=text_px)
        idx = list(range(n))
        th = cached_thumbnails(
            BUILD / f"thumbs-s{seed}-t{text_px[0]}-{text_px[1]}-{input_hw[0]}x{input_hw[1]}.npz",
            idx,
            seed,
            input_hw,
            text_px,
        )
        thumbs.append(th)
        labels += [lab[i].label for i in idx]
        readable += [lab[i].readable for i in idx]
        sets += [name] * n
        splits += [split_of(i) for i in idx]
        label_cpu_s += sum(lab[i].ocr_cpu_s for i in idx)
    x = np.concatenate(thumbs)
    y = np.asarray(labels)
    ok = np.asarray(readable)
    set_arr, split_arr = np.asarray(sets), np.asarray(splits)
    tr, va, te = (split_arr == s for s in ("train", "val", "test"))
    log.info(
        "dataset: %d frames (%d unreadable at any rung), label counts %s, OCR labelling %.0f CPU-s",
        len(y),
        int((~ok).sum()),
        np.bincount(y, minlength=len(ladder)).tolist(),
        label_cpu_s,
    )

    # 2. Train.
    res = train(
        x[tr],
        y[tr],
        len(ladder),
        epochs=epochs,
        max_seconds=args.max_train_s,
        progress=lambda e, loss: log.info("epoch %d loss %.4f", e, loss) if e % 10 == 0 else None,
    )
    model = res.model
    params = count_params(model)
    macs = count_macs(model, (BLOCK * BLOCK, input_hw[0] // BLOCK, input_hw[1] // BLOCK))

    # 3. Threshold on validation; held-out figures on test (readable frames only: for frames
    #    no rung reads there is no right answer).
    tau = choose_tau(predict_proba(model, x[va]), y[va], ladder, args.target_accuracy)

    p_test_torch = predict_proba(model, x[te])

    # 4. Export FP32 (BN folded) and INT8 variants; compare speed and accuracy.
    BUILD.mkdir(parents=True, exist_ok=True)
    fp32 = BUILD / "resolution_head.fp32.onnx"
    ops = export_onnx(model, fp32, input_hw)
    calib = x[tr][:: max(1, int(tr.sum()) // 128)]
    variants = {"fp32": fp32}
    for fmt in ("QDQ", "QOperator"):
        for per_channel in (False, True):
            key = f"int8-{fmt}-{'pc' if per_channel else 'pt'}"
            path = BUILD / f"resolution_head.{key}.onnx"
            quantize(fp32, path, calib, fmt, per_channel)
            variants[key] = path
    lat = bench_latency_ms(variants, input_hw, iters=args.bench_iters)
    probs = {k: ort_proba(p, x[te]) for k, p in variants.items()}
    nat = set_arr[te] == "natural"
    readable_te = ok[te]
    acc = {}
    for k, pr in probs.items():
        picks = pick_rungs(pr, tau)
        acc[k] = {
            "all": asdict(pick_stats(picks[readable_te], y[te][readable_te], ladder)),
            "natural": asdict(
                pick_stats(picks[readable_te & nat], y[te][readable_te & nat], ladder)
            ),
            "argmax_agrees_with_fp32": float(np.mean(pr.argmax(1) == probs["fp32"].argmax(1))),
        }
    torch_vs_ort = float(np.abs(p_test_torch - probs["fp32"]).max())
    # Fastest INT8 variant whose held-out accuracy is within 1 point of FP32.
    fp32_acc = acc["fp32"]["all"]["accuracy"]
    candidates = [
        k for k in variants if k != "fp32" and acc[k]["all"]["accuracy"] >= fp32_acc - 0.01
    ]
    best = min(candidates or [k for k in variants if k != "fp32"], key=lambda k: lat[k])

    # 5. Ship: fp32 + chosen int8 + metadata.
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fp32, out_dir / "resolution_head.fp32.onnx")
    shutil.copyfile(variants[best], out_dir / "resolution_head.int8.onnx")
    baselines = {
        "always_top": asdict(
            pick_stats(np.zeros_like(y[te][readable_te]), y[te][readable_te], ladder)
        ),
        "always_lowest": asdict(
            pick_stats(np.full_like(y[te][readable_te], ladder.lowest), y[te][readable_te], ladder)
        ),
    }
    meta = {
        "input_hw": list(input_hw),
        "ladder": [[r.width_px, r.height_px] for r in ladder],
        "tau": tau,
        "int8_format": best,
        "label_mode": "det",
        "max_cer": 0.02,
    }
    # Headline figures travel with the model (benchmarks/resolution.py reads them).
    meta["metrics"] = {
        "params": params,
        "macs": macs,
        "flops": 2 * macs,
        "fp32_ms": round(lat["fp32"], 4),
        "int8_ms": round(lat[best], 4),
        "int8_speedup": round(lat["fp32"] / lat[best], 3),
        "accuracy": acc[best]["all"]["accuracy"],
        "accuracy_natural": acc[best]["natural"]["accuracy"],
        "exact": acc[best]["all"]["exact"],
        "pixel_cost": acc[best]["all"]["cost"],
        "n_test": acc[best]["all"]["n"],
        "quick": args.quick,
        "command": "python scripts/train_reshead.py" + (" --quick" if args.quick else ""),
    }
    (out_dir / "resolution_head.json").write_text(json.dumps(meta, indent=2) + "\n")
    report = {
        **{k: v for k, v in meta.items() if k != "metrics"},
        "quick": args.quick,
        "frames": len(y),
        "split_sizes": {"train": int(tr.sum()), "val": int(va.sum()), "test": int(te.sum())},
        "label_counts": np.bincount(y, minlength=len(ladder)).tolist(),
        "unreadable": int((~ok).sum()),
        "label_ocr_cpu_s": round(label_cpu_s, 1),
        "params": params,
        "macs": macs,
        "flops": 2 * macs,
        "onnx_ops": ops,
        "train_epochs": res.epochs,
        "train_s": round(res.seconds, 1),
        "latency_ms_median_1thread": {k: round(v, 4) for k, v in lat.items()},
        "int8_speedup": {k: round(lat["fp32"] / v, 3) for k, v in lat.items() if k != "fp32"},
        "accuracy": acc,
        "baselines": baselines,
        "torch_vs_onnx_max_abs_prob_diff": torch_vs_ort,
        "model_bytes": {k: p.stat().st_size for k, p in variants.items()},
        "total_s": round(time.monotonic() - t_start, 1),
    }
    (BUILD / ("report-quick.json" if args.quick else "report.json")).write_text(
        json.dumps(report, indent=2) + "\n"
    )
    summary = {
        "head_params": params,
        "head_flops": 2 * macs,
        "head_int8_format": best,
        "head_fp32_ms": round(lat["fp32"], 4),
        "head_int8_ms": round(lat[best], 4),
        "head_int8_speedup": round(lat["fp32"] / lat[best], 3),
        "head_accuracy": acc[best]["all"]["accuracy"],
        "head_accuracy_natural": acc[best]["natural"]["accuracy"],
        "head_cost": acc[best]["all"]["cost"],
        "tau": tau,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
