"""What telemetry costs: the same clip, live-paced, with telemetry off and on, side by side in one
run (interleaved repeats, alternating which goes first).

on = what a user gets from `streamfuse run --otlp --prometheus-port P`: traces at the default
head-sampling ratio with every event's chain, metrics exported over OTLP/HTTP every 10 s, logs
through the bridge, to a real OTLP receiver in this process (`streamfuse.testing.otlp`), and the
Prometheus endpoint scraped every 5 s. off = no telemetry (the default). Each run is a fresh
`streamfuse run --realtime` process, so model loading and import costs fall outside the
comparison: CPU seconds are the run's own `stats` record (pipeline start to end), latencies the
`latency_ms` of its `ocr` and `asr` events (input arrival to emission), pooled over repeats.
The OCR policy is `fixed` here unless told otherwise: the adaptive policies pick the resolution
from the latency they measure, so their work moves between runs by more than telemetry costs
(with `dynamic`, runs of one variant differed by up to 7% in CPU seconds).

Prints the CPU model and ISA, per-variant CPU seconds and ocr/asr latency p50/p95, the span tree
of one exported `ocr` event, and ends with one JSON line: cpu_ratio_on_off (streaming CPU
seconds on / off), p95_ratio_on_off (the worse of the ocr and asr latency p95 ratios), and the
figures behind them.

    python benchmarks/telemetry.py [--input CLIP.mp4] [--repeats 4] [--trace-ratio R]
                                   [--vision-policy fixed|dynamic|article]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from streamfuse.testing.live import free_port
from streamfuse.testing.machine import cpu_description

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT / "src" / "streamfuse" / "assets" / "demo" / "lecture.mp4"  # package data
SCRAPE_EVERY_S = 5.0


def percentile(values: list[float], q: float) -> float:
    from streamfuse.stats import percentiles

    return percentiles(values, (q,))[f"p{q:g}"] if values else float("nan")


def scrape_until(proc: subprocess.Popen[str], port: int, counts: list[int]) -> None:
    """Scrape the run's Prometheus endpoint every SCRAPE_EVERY_S until the run ends."""
    while proc.poll() is None:
        time.sleep(SCRAPE_EVERY_S)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                counts[0] += 1
                counts[1] += len(r.read())
        except OSError:
            pass  # not listening yet, or already closed


def run_once(
    variant: str, clip: Path, ratio: float | None, policy: str, workdir: Path
) -> dict[str, Any]:
    from streamfuse.testing.otlp import OtlpReceiver

    out = workdir / f"{variant}-{time.monotonic_ns()}.jsonl"
    args = [sys.executable, "-m", "streamfuse.cli", "run", str(clip), "--realtime", "--no-live"]
    args += ["--out", str(out), "--vision-policy", policy]
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    receiver = OtlpReceiver().start() if variant == "on" else None
    port = free_port()
    if receiver is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        args += ["--otlp", "--prometheus-port", str(port)]
        if ratio is not None:
            args += ["--trace-ratio", str(ratio)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        args, env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    scrapes = [0, 0]
    scraper = None
    if receiver is not None:
        scraper = threading.Thread(target=scrape_until, args=(proc, port, scrapes), daemon=True)
        scraper.start()
    _, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if scraper is not None:
        scraper.join()
    if proc.returncode != 0:
        raise SystemExit(f"{variant} run failed ({proc.returncode}):\n{stderr}")
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    final = [r for r in records if r["type"] == "stats" and r.get("final")][-1]
    result: dict[str, Any] = {
        "variant": variant,
        "cpu_s": float(final["cpu_s"]),
        "process_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "stream_wall_s": float(final["wall_s"]),
        "process_wall_s": wall,
        "latency_ms": {
            kind: [float(r["latency_ms"]) for r in records if r["type"] == kind]
            for kind in ("ocr", "asr")
        },
        # Where the work went: a model stage's busy time moves with what it was asked to do.
        "busy_s": {name.split(":")[0]: st["busy_s"] for name, st in final["stages"].items()},
        "calls": {name.split(":")[0]: st["frames"] for name, st in final["stages"].items()},
    }
    if receiver is not None:
        receiver.close()
        spans = receiver.spans()
        result.update(
            spans=len(spans),
            event_spans=sum(s.name.startswith("event ") for s in spans),
            otlp_requests=receiver.requests,
            otlp_bytes=receiver.received_bytes,
            metric_names=len(receiver.metric_names()),
            logs=len(receiver.log_records()),
            scrapes=scrapes[0],
            scrape_bytes=scrapes[1],
        )
        result["_spans"] = spans
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--trace-ratio", type=float, default=None, help="default: the CLI's (0.05)")
    ap.add_argument(
        "--vision-policy",
        default="fixed",
        choices=("fixed", "dynamic", "article"),
        help="fixed (default here): the same OCR work in every run, so CPU differences are "
        "telemetry's; the adaptive policies change resolution with measured latency.",
    )
    args = ap.parse_args()

    from streamfuse.testing.otlp import format_trace

    print(f"cpu: {cpu_description()}")
    print(
        f"python {platform.python_version()}, clip {args.input.name}, realtime, ASR+OCR, "
        f"vision policy {args.vision_policy}"
    )
    print(
        f"on: OTLP/HTTP traces (ratio {args.trace_ratio or 'default 0.05'}, every event's "
        f"chain) + metrics (10 s) + logs, Prometheus scraped every {SCRAPE_EVERY_S:g} s"
    )
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sf-telemetry-bench-") as tmp:
        for r in range(args.repeats):
            for variant in ("off", "on") if r % 2 == 0 else ("on", "off"):
                result = run_once(
                    variant, args.input, args.trace_ratio, args.vision_policy, Path(tmp)
                )
                runs.append(result)
                extra = (
                    f"  spans {result['spans']} ({result['event_spans']} events), "
                    f"{result['otlp_requests']} OTLP requests, {result['scrapes']} scrapes"
                    if variant == "on"
                    else ""
                )
                busy = " ".join(f"{k} {v:.1f}" for k, v in result["busy_s"].items() if v >= 0.5)
                print(
                    f"repeat {r + 1} {variant:>3}: cpu {result['cpu_s']:6.2f} s "
                    f"(process {result['process_cpu_s']:6.2f} s), "
                    f"ocr n={len(result['latency_ms']['ocr'])} "
                    f"asr n={len(result['latency_ms']['asr'])}, busy s: {busy}{extra}",
                    flush=True,
                )

    summary: dict[str, dict[str, Any]] = {}
    for variant in ("off", "on"):
        mine = [r for r in runs if r["variant"] == variant]
        ocr = [x for r in mine for x in r["latency_ms"]["ocr"]]
        asr = [x for r in mine for x in r["latency_ms"]["asr"]]
        summary[variant] = {
            "cpu_s": sum(r["cpu_s"] for r in mine) / len(mine),
            "process_cpu_s": sum(r["process_cpu_s"] for r in mine) / len(mine),
            "ocr_p50_ms": percentile(ocr, 50),
            "ocr_p95_ms": percentile(ocr, 95),
            "asr_p50_ms": percentile(asr, 50),
            "asr_p95_ms": percentile(asr, 95),
            "n_ocr": len(ocr),
            "n_asr": len(asr),
        }
    head = ("", "cpu s", "proc cpu s", "ocr p50 / p95 ms", "asr p50 / p95 ms")
    print("\n{:>4} {:>8} {:>10} {:>18} {:>18}".format(*head))
    for variant, s in summary.items():
        ocr = f"{s['ocr_p50_ms']:.0f} / {s['ocr_p95_ms']:.0f}"
        asr = f"{s['asr_p50_ms']:.0f} / {s['asr_p95_ms']:.0f}"
        print(f"{variant:>4} {s['cpu_s']:8.2f} {s['process_cpu_s']:10.2f} {ocr:>18} {asr:>18}")
    on_runs = [r for r in runs if r["variant"] == "on"]
    spans = on_runs[-1]["_spans"]
    events = [s for s in spans if s.name == "event ocr"]
    if events:
        slowest = max(events, key=lambda s: s.attributes.get("streamfuse.event.latency_s", 0))
        print("\nslowest ocr event of the last `on` run, as exported:")
        print(format_trace(spans, slowest.trace_id))

    off, on = summary["off"], summary["on"]
    ocr_ratio = on["ocr_p95_ms"] / off["ocr_p95_ms"]
    asr_ratio = on["asr_p95_ms"] / off["asr_p95_ms"]
    line = {
        "cpu_ratio_on_off": round(on["cpu_s"] / off["cpu_s"], 4),
        "p95_ratio_on_off": round(max(ocr_ratio, asr_ratio), 4),
        "ocr_p95_ratio_on_off": round(ocr_ratio, 4),
        "asr_p95_ratio_on_off": round(asr_ratio, 4),
        "process_cpu_ratio_on_off": round(on["process_cpu_s"] / off["process_cpu_s"], 4),
        "cpu_s": {k: round(v["cpu_s"], 3) for k, v in summary.items()},
        "ocr_p95_ms": {k: round(v["ocr_p95_ms"], 1) for k, v in summary.items()},
        "asr_p95_ms": {k: round(v["asr_p95_ms"], 1) for k, v in summary.items()},
        "spans_per_run": round(sum(r["spans"] for r in on_runs) / len(on_runs), 1),
        "repeats": args.repeats,
        "clip": args.input.name,
        "vision_policy": args.vision_policy,
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
