"""The LM's int8 products: the compiled kernel (AVX-512 VNNI or AVX2) vs torch._int_mm.

Every int8 product of the Gemma runtime is (rows, K) int8 x (N, K) int8 -> (rows, N) int32,
exact. torch._int_mm runs oneDNN's GEMM (on AMX machines too; on AVX2-only ones ATen's own
int8 kernel); `kernels.int8_gemv` streams the row-major weight once per call, meeting every
activation row while a block of weight rows is in L1, over torch's threads. Both are checked
equal bit for bit on every shape before timing.
Shapes: Gemma 3 270M's q|k|v, o, gate|up and down projections and its 262,144-row output head,
at 1 to 32 rows (1 = one stream decoding; 8 = the batched engine; more = prompt chunks).
Prints the CPU, one line per shape and row count with both times, the weight-read rate and the
ratio, and ends with one JSON line (`decode_step_int8_ms`: the products of one token through
all 18 layers and the head, ours and torch's).

    python benchmarks/int8_gemv.py [--threads 2] [--rows 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable

import torch

from streamfuse.lm.kernels import cpu_features, load_kernels
from streamfuse.testing.machine import cpu_description

# (name, K, N, count per token) for Gemma 3 270M: 18 layers of four products, then the head.
SHAPES = [
    ("qkv", 640, 1536, 18),
    ("o", 1024, 640, 18),
    ("gate_up", 640, 4096, 18),
    ("down", 2048, 640, 18),
    ("head", 640, 262144, 1),
]


def best_ms(fn: Callable[[], object], calls: int, rounds: int = 5) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,2,4,8,16,32", help="activation rows per call")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    kern = load_kernels()
    print(f"cpu: {cpu_description()}; torch threads {args.threads}")
    print(f"features: {', '.join(f for f, on in cpu_features().items() if on)}")
    if kern is None or not kern.has_int8_gemv():
        print("no compiled int8 product on this machine: the runtime uses torch._int_mm")
        print(json.dumps({"gemv": False, "cpu": cpu_description()}))
        return
    isa = kern.int8_gemv_isa()
    print(f"compiled product: {isa}")
    # Weights as quantize_rows makes them ([-127, 127]: the AVX2 form's exact range).
    rows = [int(r) for r in args.rows.split(",")]
    step: dict[int, dict[str, float]] = {}
    for m in rows:
        for name, k, n, per_token in SHAPES:
            w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
            comp = w.sum(dim=1, dtype=torch.int32).mul_(128)
            x = torch.randint(-127, 128, (m, k), dtype=torch.int8)
            if not torch.equal(kern.int8_gemv(x, w, comp), torch._int_mm(x, w.t())):
                raise SystemExit(f"int8_gemv differs from torch._int_mm at {name} rows={m}")
            calls = 5 if n > 100_000 else 200
            wt = w.t()
            base = best_ms(functools.partial(torch._int_mm, x, wt), calls)
            ours = best_ms(functools.partial(kern.int8_gemv, x, w, comp), calls)
            acc = step.setdefault(m, {"int_mm": 0.0, "gemv": 0.0})
            acc["int_mm"] += base * per_token
            acc["gemv"] += ours * per_token
            gbs = n * k / 1e6
            print(
                f"rows {m:>2} {name:<8} K {k:>5} N {n:>6}: torch._int_mm {base:8.3f} ms "
                f"({gbs / base:5.1f} GB/s)  int8_gemv {ours:8.3f} ms ({gbs / ours:5.1f} GB/s)  "
                f"x{base / ours:.2f}",
                flush=True,
            )
    for m, acc in step.items():
        print(
            f"one decode step's products at {m} rows: torch._int_mm {acc['int_mm']:.2f} ms, "
            f"int8_gemv {acc['gemv']:.2f} ms (x{acc['int_mm'] / acc['gemv']:.2f})"
        )
    print(
        json.dumps(
            {
                "gemv": True,
                "isa": isa,
                "decode_step_int8_ms": {
                    str(m): {key: round(v, 3) for key, v in acc.items()} for m, acc in step.items()
                },
                "cpu": cpu_description(),
                "threads": args.threads,
            }
        )
    )


if __name__ == "__main__":
    main()
