"""Reliability suites: corrupted media, a realtime soak, and an overload run.

- corrupted media: mutated files (`streamfuse.testing.mutate`) each run as `streamfuse run FILE`
  does, in a worker subprocess watched from here: a file whose run makes no progress for
  `--hang-s` (30 s) is a hang (the worker is killed and restarted), a worker that dies or an
  exception outside the error tree is a crash, a `StreamfuseError` naming the input is a clear
  error, an `error` event from the source after some events is a partial result;
- soak: the clips looped, `streamfuse run --realtime` for `--soak-s`, resident memory sampled
  (every 10 s, reported per minute), then SIGTERM: lost events (produced but not written),
  latency p95 of the first vs the last window;
- overload: 4x the live streams this machine holds (from the soak's CPU per media second)
  in one realtime run: drops per edge, latency p95 of what was admitted, crashes.

    python benchmarks/reliability.py [--quick] [--files N] [--soak-s S]

`--quick` (100 files, a 3-minute soak, a 40 s overload) takes under 10 minutes. Ends with one
JSON line. The worker mode (`--worker`) is internal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from streamfuse.stats import percentiles
from streamfuse.testing.machine import cpu_description
from streamfuse.testing.mutate import Mutation, base_clips, iter_suite, looped

ROOT = Path(__file__).resolve().parents[1]
CLIPS = [ROOT / "assets" / "test" / "short.mp4", ROOT / "src/streamfuse/assets/demo/lecture.mp4"]
DEMO = CLIPS[1]


# -- the worker (one process, many files, models reloaded per run as `streamfuse run`) -------


def _worker() -> None:
    """Read file paths from stdin; for each print `start`, `beat` lines (progress) and `done`."""
    from streamfuse import cli
    from streamfuse.app import StreamfuseConfig
    from streamfuse.errors import StreamfuseError

    cli._setup_logging(False)
    config = StreamfuseConfig()
    out_lock = threading.Lock()
    # The protocol keeps stdout; whatever a run prints (the stage table) goes to stderr.
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def say(**fields: Any) -> None:
        with out_lock:
            proto.write(json.dumps(fields) + "\n")
            proto.flush()

    state: dict[str, Any] = {"stop": None, "out": None}

    def beat() -> None:
        while True:
            time.sleep(2.0)
            stop, out = state["stop"], state["out"]
            progress = 0
            with contextlib.suppress(Exception):  # read while the run mutates its stages
                if stop is not None and stop.job is not None:
                    progress = sum(s.stats.frames for s in list(stop.job.pipeline.stages))
                if out is not None and out.exists():
                    progress += out.stat().st_size
            say(event="beat", progress=progress)

    threading.Thread(target=beat, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        for line in sys.stdin:
            path = line.strip()
            if not path:
                continue
            out = Path(tmp) / "ev.jsonl"
            out.unlink(missing_ok=True)
            stop = cli._Stop()
            state.update(stop=stop, out=out)
            say(event="start", path=path)
            try:
                records, _ = asyncio.run(cli._run([path], config, out, False, stop=stop))
            except StreamfuseError as e:
                clear = Path(path).name in str(e) and "\n" not in str(e).strip()
                say(
                    event="done", outcome="clear_error" if clear else "unclear_error", detail=str(e)
                )
                continue
            except Exception as e:
                say(event="done", outcome="crash", detail=traceback.format_exc()[-1500:])
                del e
                continue
            finally:
                state.update(stop=None, out=None)
            errors = [r for r in records if r["type"] == "error" and r["stage"] != "input"]
            unexpected = [r["message"] for r in errors if not r["stage"].startswith("media:")]
            produced = sum(r["type"] in ("ocr", "asr") for r in records)
            outcome = "partial" if errors else "results"
            if errors and not produced:
                # Broke before any result: a clear error if the source's message names it.
                named = all(Path(path).name in r["message"] for r in errors)
                outcome = "clear_error" if named else "unclear_error"
            say(
                event="done",
                outcome=outcome,
                detail="; ".join(r["message"] for r in errors)[:300],
                events=produced,
                stage_exceptions=unexpected[:3],
            )


# -- corrupted media ----------------------------------------------------------------------


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            del self.stderr[:-200]

    def send(self, path: Path) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def run_corpus(mutations: list[Mutation], *, hang_s: float, limit_s: float) -> list[dict[str, Any]]:
    """Each file through the worker; its outcome with the time it took."""
    results: list[dict[str, Any]] = []
    worker: _Worker | None = None
    for m in mutations:
        if worker is None or worker.proc.poll() is not None:
            worker = _Worker()
        worker.send(m.path)
        started = last_change = time.monotonic()
        progress = -1
        result: dict[str, Any] | None = None
        while result is None:
            try:
                line = worker.lines.get(timeout=1.0)
            except queue.Empty:
                line = ""
            now = time.monotonic()
            if line is None:  # the worker died with this file
                code = worker.proc.wait()
                tail = "".join(worker.stderr[-20:])[-1500:]
                result = {"outcome": "crash", "detail": f"worker exit {code}: {tail}"}
                worker = None
                break
            if line and line.startswith("{"):
                msg = json.loads(line)
                if msg["event"] == "beat" and msg["progress"] != progress:
                    progress, last_change = msg["progress"], now
                elif msg["event"] == "start":
                    last_change = now
                elif msg["event"] == "done":
                    result = msg
                    break
            if now - last_change > hang_s or now - started > limit_s:
                worker.kill()
                worker = None
                why = "no progress" if now - last_change > hang_s else "over the time limit"
                result = {"outcome": "hang", "detail": f"{why} after {now - started:.0f} s"}
        assert result is not None
        result.update(
            kind=m.kind, name=m.name, file=m.path.name, s=round(time.monotonic() - started, 1)
        )
        results.append(result)
        print(
            f"  {m.path.name:<10} {m.name:<32} {result['outcome']:<13} {result['s']:>5.1f} s  "
            f"{str(result.get('detail', ''))[:90]}",
            flush=True,
        )
    if worker is not None:
        assert worker.proc.stdin is not None
        worker.proc.stdin.close()
        try:
            worker.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    return results


# -- soak -----------------------------------------------------------------------------------


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "streamfuse.cli", *args]


def _records(path: Path) -> list[dict[str, Any]]:
    from streamfuse.sinks.jsonl import read_jsonl

    return read_jsonl(path).records if path.exists() else []


def _p95(values: list[float]) -> float | None:
    return round(percentiles(values)["p95"], 1) if values else None


def _lost(records: list[dict[str, Any]]) -> int:
    """Events that reached no line: drops on the edges into the sinks, and events the JSONL
    sink processed minus the records it wrote (the build notes are written beside the graph)."""
    stats = [r for r in records if r["type"] == "stats" and r["final"]]
    if not stats:
        return -1
    sink = stats[-1]["stages"].get("jsonl_sink", {})
    written = sum(r["type"] != "stats" for r in records)
    notes = sum(r["type"] == "error" and r.get("stage") == "input" for r in records)
    return int(sink.get("dropped", 0)) + max(0, int(sink.get("frames", 0)) + notes - written)


def soak(work: Path, soak_s: float, window_s: float) -> dict[str, Any]:
    loops = math.ceil((soak_s + 60) / 49.0)
    clip = looped(DEMO, work / "soak.mp4", loops)
    out = work / "soak.jsonl"
    proc = subprocess.Popen(
        _cli("run", str(clip), "--realtime", "--no-live", "--out", str(out)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    ps = psutil.Process(proc.pid)
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < soak_s and proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            samples.append((time.monotonic() - t0, ps.memory_info().rss / 2**20))
        time.sleep(10.0)
    cpu_s = sum(ps.cpu_times()[:2]) if proc.poll() is None else None
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    records = _records(out)
    per_min: dict[int, list[float]] = {}
    for t, rss in samples:
        per_min.setdefault(int(t // 60), []).append(rss)
    minutes = [round(sorted(v)[len(v) // 2], 1) for _, v in sorted(per_min.items())]
    # Warm-up: the first minute (models load, queues and caches fill).
    after = minutes[1:] if len(minutes) > 1 else minutes
    drift = round(100.0 * (after[-1] - after[0]) / after[0], 2) if after else None
    events = [r for r in records if r["type"] in ("ocr", "asr") and "wall_s" in r]
    end = max((r["wall_s"] for r in events), default=0.0)
    first = [r["latency_ms"] for r in events if window_s <= r["wall_s"] < 2 * window_s]
    last = [r["latency_ms"] for r in events if r["wall_s"] >= end - window_s]
    p_first, p_last = _p95(first), _p95(last)
    media_s = max((r["t_end"] for r in events), default=0.0)
    return {
        "soak_s": round(soak_s),
        "exit": proc.returncode,
        "traceback": "Traceback" in stderr,
        "rss_mb_per_minute": minutes,
        "rss_drift_pct": drift,
        "lost_events": _lost(records),
        "events": len(events),
        "slides_read": sum(r["type"] == "ocr" for r in events),
        "latency_p95_first_ms": p_first,
        "latency_p95_last_ms": p_last,
        "latency_p95_ratio": round(p_last / p_first, 2) if p_first and p_last else None,
        "cpu_s_per_media_s": round(cpu_s / media_s, 3) if cpu_s and media_s else None,
    }


def overload(work: Path, n: int, seconds: float) -> dict[str, Any]:
    clip = work / "overload.mp4"
    from streamfuse.testing.media import cut

    cut(DEMO, clip, seconds)
    out = work / "overload.jsonl"
    t0 = time.monotonic()
    proc = subprocess.run(
        _cli("run", *[str(clip)] * n, "--realtime", "--no-live", "--out", str(out)),
        capture_output=True,
        text=True,
        timeout=seconds * 4 + 300,
    )
    records = _records(out)
    stats = [r for r in records if r["type"] == "stats"]
    stages = stats[-1]["stages"] if stats else {}
    drops = {name: s["dropped"] for name, s in stages.items() if s["dropped"]}
    lat = {
        kind: _p95([r["latency_ms"] for r in records if r["type"] == kind])
        for kind in ("ocr", "asr")
    }
    return {
        "streams": n,
        "exit": proc.returncode,
        "traceback": "Traceback" in proc.stderr,
        "wall_s": round(time.monotonic() - t0, 1),
        "drops_per_edge": drops,
        "latency_p95_ms": lat,
        "errors": sum(r["type"] == "error" and r.get("stage") != "input" for r in records),
        "streams_with_results": len(
            {r["stream_id"] for r in records if r["type"] in ("ocr", "asr")}
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 files, 3-minute soak")
    parser.add_argument("--files", type=int, help="mutated files (default 1000, quick 100)")
    parser.add_argument("--soak-s", type=float, help="soak seconds (default 3600, quick 180)")
    parser.add_argument("--hang-s", type=float, default=30.0, help="no progress this long: hang")
    parser.add_argument("--no-overload", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker()
        return
    n_files = args.files or (100 if args.quick else 1000)
    soak_s = args.soak_s or (180.0 if args.quick else 3600.0)
    window_s = 60.0 if soak_s < 1200 else 600.0
    print(f"machine: {cpu_description()}")
    print("note: figures on a shared, noisy machine vary run to run", flush=True)
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sf-reliability-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        clips = base_clips(CLIPS, work / "base", seconds=4.0)
        print(f"corrupted media: {n_files} files from {len(clips)} clips of 4 s", flush=True)
        mutations = []
        for m in iter_suite(clips, work / "mutated", n_files):
            mutations.append(m)
        made_s = time.monotonic() - t0
        results = run_corpus(mutations, hang_s=args.hang_s, limit_s=max(120.0, 4 * args.hang_s))
        outcomes = Counter(r["outcome"] for r in results)
        stage_exc = [e for r in results for e in r.get("stage_exceptions", [])]
        by_kind: dict[str, Counter[str]] = {}
        for r in results:
            by_kind.setdefault(r["kind"], Counter())[r["outcome"]] += 1
        print(f"  outcomes: {dict(outcomes)} (files made in {made_s:.0f} s)")
        for kind, c in sorted(by_kind.items()):
            print(f"    {kind:<9} {dict(c)}")
        summary.update(
            mutated_files=len(results),
            crashes=outcomes["crash"],
            hangs=outcomes["hang"],
            clear_errors=outcomes["clear_error"],
            unclear_errors=outcomes["unclear_error"],
            partial_results=outcomes["partial"],
            full_results=outcomes["results"],
            stage_exceptions=len(stage_exc),
            corpus_s=round(sum(r["s"] for r in results)),
        )
        print(f"soak: {soak_s:.0f} s realtime, looped demo clip", flush=True)
        s = soak(work, soak_s, window_s)
        print(f"  {json.dumps(s)}", flush=True)
        summary.update(
            rss_drift_pct=s["rss_drift_pct"],
            lost_events=s["lost_events"],
            soak_latency_p95_ratio=s["latency_p95_ratio"],
            soak_rss_mb_per_minute=s["rss_mb_per_minute"],
            soak_exit=s["exit"],
        )
        if not args.no_overload:
            per_stream = s["cpu_s_per_media_s"] or 1.0
            held = max(1, int((os.cpu_count() or 1) * 0.8 / per_stream))
            n = 4 * held
            print(f"overload: {n} live streams (this machine holds ~{held})", flush=True)
            o = overload(work, n, 20.0 if args.quick else 120.0)
            print(f"  {json.dumps(o)}", flush=True)
            summary.update(
                overload_streams=n,
                overload_held=held,
                overload_exit=o["exit"],
                overload_drops_per_edge=o["drops_per_edge"],
                overload_latency_p95_ms=o["latency_p95_ms"],
                overload_streams_with_results=o["streams_with_results"],
            )
        summary["total_s"] = round(time.monotonic() - t0)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
