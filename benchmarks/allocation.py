"""Load-driven thread allocation vs the fixed split, side by side, with 1, 2 and 4 live streams.

For each stream count N, N copies of the bundled lecture clip (48.9 s; `--quick`: the 12 s
test clip) run at wall-clock speed (`realtime`, as a live feed) through `build_pipeline`, once
with `allocation.mode = "fixed"` (every stream's OCR and ASR threads capped at cores // N, set
once: the default) and once with `"load"` (each model call leases threads from a budget of
the cores, OCR reads 1 or `--ocr-max-threads`, a stage's share following its measured busy
time; see `streamfuse.qos.allocation`). Order alternates per repeat (fixed first, then load
first) so a drift in machine load does not favour one side. Model loading is not in the
latencies (stages set up before the sources start). Timings on a shared machine are noise:
run it with `--repeats 3` on a quiet one.

Reported per N and mode: each stream's p95 latency of `ocr` and `asr` events (input arrival to
emission), the pooled p95 over all streams, and the ratio load / fixed of the pooled and of the
worst stream's p95 (< 1: load-driven is faster); for the load runs, how many model calls got
each thread count. Also the CPU model, ISA and the cpufreq governor/clock (or 'not exposed').

    python benchmarks/allocation.py [--quick] [--streams 1 2 4] [--repeats 1] [--control]
        [--ocr-max-threads 2] [--asr-max-threads 1]

The last line is one JSON object: per N, `p95_ms` {fixed, load[, control]} x {ocr, asr}
pooled, `per_stream`, `ratio` (load / fixed), `ratio_control` (control / fixed, with
`--control`), plus `cpu`, `cpufreq`, `clip`, `repeats`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from streamfuse.qos.allocation import cpu_frequency
from streamfuse.stats import percentiles
from streamfuse.testing.machine import cpu_description

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "src" / "streamfuse" / "assets" / "demo" / "lecture.mp4"
SHORT = ROOT / "assets" / "test" / "short.mp4"
KINDS = ("ocr", "asr")


async def run_once(
    clip: Path, streams: int, label: str, ocr_max: int, asr_max: int
) -> dict[str, Any]:
    """One live run of `streams` copies of `clip` under allocation `label` (`control`: the
    fixed split, run again)."""
    mode = "fixed" if label == "control" else label
    from streamfuse.app import StreamfuseConfig, build_pipeline, run_job
    from streamfuse.sinks import CollectSink

    config = StreamfuseConfig.model_validate(
        {
            "realtime": True,
            "allocation": {"mode": mode, "ocr_max_threads": ocr_max, "asr_max_threads": asr_max},
        }
    )
    sink = CollectSink()
    job = await build_pipeline([str(clip)] * streams, config, [sink])
    t0 = time.perf_counter()
    await run_job(job, [sink])
    wall_s = time.perf_counter() - t0
    latency: dict[str, dict[str, list[float]]] = {k: {} for k in KINDS}
    for r in sink.records:
        if r["type"] in KINDS:
            latency[r["type"]].setdefault(str(r["stream_id"]), []).append(float(r["latency_ms"]))
    grants: dict[str, dict[int, int]] = {}
    rebalances = 0
    if job.allocation is not None:
        grants = {s: dict(c) for s, c in job.allocation.budget.granted.items()}
        rebalances = len(job.allocation.history)
    errors = [r.get("message") for r in sink.records if r["type"] == "error"]
    return {
        "mode": label,
        "streams": streams,
        "wall_s": round(wall_s, 1),
        "latency_ms": latency,
        "grants": grants,
        "rebalances": rebalances,
        "errors": errors,
    }


def p95(values: list[float]) -> float | None:
    return round(percentiles(values)["p95"], 1) if values else None


def summarize(runs: list[dict[str, Any]], streams: int, modes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"p95_ms": {}, "per_stream": {}, "worst_stream_p95_ms": {}, "ratio": {}}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode and r["streams"] == streams]
        pooled: dict[str, float | None] = {}
        per: dict[str, dict[str, float | None]] = {}
        worst: dict[str, float | None] = {}
        for kind in KINDS:
            by_stream: dict[str, list[float]] = {}
            for r in mine:
                for sid, vals in r["latency_ms"][kind].items():
                    by_stream.setdefault(sid, []).extend(vals)
            pooled[kind] = p95([v for vals in by_stream.values() for v in vals])
            per[kind] = {sid: p95(vals) for sid, vals in sorted(by_stream.items())}
            finite = [v for v in per[kind].values() if v is not None]
            worst[kind] = max(finite) if finite else None
        out["p95_ms"][mode] = pooled
        out["per_stream"][mode] = per
        out["worst_stream_p95_ms"][mode] = worst
    for other, key in (("load", "ratio"), ("control", "ratio_control")):
        if other not in modes:
            continue
        ratios = out.setdefault(key, {})
        for kind in KINDS:
            for label, table in (
                ("pooled", out["p95_ms"]),
                ("worst_stream", out["worst_stream_p95_ms"]),
            ):
                fixed, mine = table["fixed"][kind], table[other][kind]
                ratios[f"{kind}_{label}"] = (
                    round(mine / fixed, 3) if fixed and mine is not None else None
                )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the 12 s test clip")
    ap.add_argument("--clip", type=Path, default=None)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--control", action="store_true", help="also rerun the fixed split (A/A: the noise)"
    )
    ap.add_argument("--ocr-max-threads", type=int, default=2, help="load mode's OCR sessions")
    ap.add_argument("--asr-max-threads", type=int, default=1, help="load mode's Whisper models")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("RapidOCR", "onnxruntime", "faster_whisper", "streamfuse"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    clip = args.clip or (SHORT if args.quick else DEMO)
    freq = cpu_frequency()
    print(f"cpu: {cpu_description()}", file=sys.stderr)
    print(f"cpufreq: {freq.summary()}", file=sys.stderr)
    print(
        f"clip {clip.name}, realtime, OCR+ASR, streams {args.streams}, repeats {args.repeats}, "
        f"load mode: OCR sessions of 1..{args.ocr_max_threads} threads, Whisper "
        f"1..{args.asr_max_threads}",
        file=sys.stderr,
    )
    modes = ["fixed", "load", *(["control"] if args.control else [])]
    runs: list[dict[str, Any]] = []
    for n in args.streams:
        for r in range(args.repeats):
            # Rotate the order per repeat, so a drift in machine load favours no mode.
            k = r % len(modes)
            for mode in modes[k:] + modes[:k]:
                result = asyncio.run(
                    run_once(clip, n, mode, args.ocr_max_threads, args.asr_max_threads)
                )
                runs.append(result)
                q = {
                    k: p95([v for vs in result["latency_ms"][k].values() for v in vs])
                    for k in KINDS
                }
                print(
                    f"streams {n} repeat {r + 1} {mode:>5}: wall {result['wall_s']} s, "
                    f"ocr p95 {q['ocr']} ms, asr p95 {q['asr']} ms, "
                    f"errors {len(result['errors'])}"
                    + (
                        f", {result['rebalances']} rebalances, threads granted per call "
                        f"{result['grants']}"
                        if result["grants"]
                        else ""
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    summary = {str(n): summarize(runs, n, modes) for n in args.streams}
    control = "control" in modes
    print(
        "\n| streams | kind | fixed p95 ms | load p95 ms | ratio (pooled) | ratio (worst) |"
        + (" control p95 ms | A/A ratio (pooled) |" if control else "")
    )
    print("|---:|---|---:|---:|---:|---:|" + ("---:|---:|" if control else ""))
    for n in args.streams:
        s = summary[str(n)]
        for kind in KINDS:
            print(
                f"| {n} | {kind} | {s['p95_ms']['fixed'][kind]} | {s['p95_ms']['load'][kind]} | "
                f"{s['ratio'][f'{kind}_pooled']} | {s['ratio'][f'{kind}_worst_stream']} |"
                + (
                    f" {s['p95_ms']['control'][kind]} | {s['ratio_control'][f'{kind}_pooled']} |"
                    if control
                    else ""
                )
            )
    out = {
        "benchmark": "allocation",
        "cpu": cpu_description(),
        "cpufreq": freq.summary(),
        "clip": clip.name,
        "repeats": args.repeats,
        "ocr_max_threads": args.ocr_max_threads,
        "asr_max_threads": args.asr_max_threads,
        "streams": summary,
        "errors": sum(len(r["errors"]) for r in runs),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
