"""Reliability suites: corrupted media, a realtime soak, and an overload run.

- corrupted media: mutated files (`streamfuse.testing.mutate`) each run as `streamfuse run FILE`
  does, in worker subprocesses (one per core, each running its files one at a time with one
  model set loaded once) watched from here: a file whose run makes no progress for `--hang-s`
  (30 s) is a hang (the worker is killed and restarted), a worker that dies or an exception
  outside the error tree is a crash, a `StreamfuseError` naming the input is a clear error, an
  `error` event from the source after some events is a partial result;
- soak: the clips looped, `streamfuse run --realtime` for `--soak-s`, resident memory sampled
  (every 10 s, reported per minute), then SIGTERM: lost events (produced but not written),
  latency p95 of the first vs the last window;
- overload: 4x the live streams this machine holds (from the soak's CPU per media second, or
  `--overload-streams`) in one realtime run with the default speech shedding and, side by
  side, one with it off (`audio_shed_after_s` 0, the baseline; not in `--quick`): drops per
  edge, latency p95 of what was admitted, crashes.

    python benchmarks/reliability.py [--quick] [--files N] [--soak-s S] [--no-soak]
        [--no-overload] [--overload-streams N] [--overload-s S]

`--quick` (100 files, a 3-minute soak, a 10 s overload) takes under 10 minutes on 2 cores.
Ends with one JSON line. The worker mode (`--worker`) is internal.
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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil

from streamfuse.stats import percentiles
from streamfuse.testing.machine import cpu_description
from streamfuse.testing.mutate import Mutation, base_clips, iter_suite, looped

ROOT = Path(__file__).resolve().parents[1]
CLIPS = [ROOT / "assets" / "test" / "short.mp4", ROOT / "src/streamfuse/assets/demo/lecture.mp4"]
DEMO = CLIPS[1]


# -- the worker (one process, many files, one model set loaded once) -------------------------


def _worker(threads: int) -> None:
    """Read file paths from stdin; for each print `start`, `beat` lines (progress) and `done`.

    Each file runs as `streamfuse run FILE` does (`cli._run`), except that the OCR and speech
    models are loaded once for all of the worker's files (`ModelSet`, `threads` each): the
    suite damages the input, not the models, and loading them per file cost more than a
    4 s file's run.
    """
    from streamfuse import cli
    from streamfuse.app import StreamfuseConfig
    from streamfuse.errors import StreamfuseError
    from streamfuse.modelset import ModelSet

    cli._setup_logging(False)
    config = StreamfuseConfig()
    models = ModelSet(
        ocr_threads=min(config.vision.ocr.intra_op_threads, threads),
        asr_threads=min(config.asr_config.cpu_threads, threads),
    )
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
                records, _ = asyncio.run(
                    cli._run([path], config, out, False, stop=stop, models=models)
                )
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
                models_loaded=dict(models.loads),
            )


# -- corrupted media ----------------------------------------------------------------------


class _Worker:
    def __init__(self, threads: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--threads", str(threads)],
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

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()


class _Watch:
    """One worker subprocess and the files it runs, one at a time, under a watchdog: no
    progress for `hang_s` (or `limit_s` in all) is a hang, and the worker is killed and
    replaced (with its models: the next file pays one load)."""

    def __init__(self, threads: int, hang_s: float, limit_s: float) -> None:
        self.threads, self.hang_s, self.limit_s = threads, hang_s, limit_s
        self.worker: _Worker | None = None
        self.restarts = 0

    def run(self, path: Path) -> dict[str, Any]:
        if self.worker is None or self.worker.proc.poll() is not None:
            self.restarts += self.worker is not None
            self.worker = _Worker(self.threads)
        worker = self.worker
        worker.send(path)
        started = last_change = time.monotonic()
        progress = -1
        while True:
            try:
                line = worker.lines.get(timeout=1.0)
            except queue.Empty:
                line = ""
            now = time.monotonic()
            if line is None:  # the worker died with this file
                code = worker.proc.wait()
                tail = "".join(worker.stderr[-20:])[-1500:]
                self.worker = None
                return {"outcome": "crash", "detail": f"worker exit {code}: {tail}"}
            if line and line.startswith("{"):
                msg = json.loads(line)
                if msg["event"] == "beat" and msg["progress"] != progress:
                    progress, last_change = msg["progress"], now
                elif msg["event"] == "start":
                    last_change = now
                elif msg["event"] == "done":
                    return dict(msg)
            if now - last_change > self.hang_s or now - started > self.limit_s:
                worker.kill()
                self.worker = None
                why = "no progress" if now - last_change > self.hang_s else "over the time limit"
                return {"outcome": "hang", "detail": f"{why} after {now - started:.0f} s"}

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def run_corpus(
    mutations: Iterable[Mutation], *, hang_s: float, limit_s: float, workers: int
) -> tuple[list[dict[str, Any]], int]:
    """Each file through one of `workers` watched worker processes (files taken as they are
    made); each outcome with the time it took, in file order, and the worker restarts."""
    cores = os.cpu_count() or 1
    threads = max(1, cores // workers)
    todo: queue.Queue[tuple[int, Mutation] | None] = queue.Queue(maxsize=2 * workers)
    results: dict[int, dict[str, Any]] = {}
    print_lock = threading.Lock()
    watches = [_Watch(threads, hang_s, limit_s) for _ in range(workers)]

    def serve(watch: _Watch) -> None:
        try:
            while (item := todo.get()) is not None:
                i, m = item
                started = time.monotonic()
                result = watch.run(m.path)
                result.update(
                    kind=m.kind,
                    name=m.name,
                    file=m.path.name,
                    s=round(time.monotonic() - started, 1),
                )
                results[i] = result
                detail = str(result.get("detail", "")).strip()
                if result["outcome"] == "crash":  # the exception, not the traceback's start
                    detail = detail.splitlines()[-1] if detail else ""
                with print_lock:
                    print(
                        f"  {m.path.name:<10} {m.name:<32} {result['outcome']:<13} "
                        f"{result['s']:>5.1f} s  {detail[:90]}",
                        flush=True,
                    )
        finally:
            watch.close()

    threads_ = [threading.Thread(target=serve, args=(w,), daemon=True) for w in watches]
    for t in threads_:
        t.start()
    for item in enumerate(mutations):  # made here while the workers run the files before
        todo.put(item)
    for _ in threads_:
        todo.put(None)
    for t in threads_:
        t.join()
    return [results[i] for i in sorted(results)], sum(w.restarts for w in watches)


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
    # A stage's `frames` counts its end-of-stream flush call too (one, with no record).
    processed = int(sink.get("frames", 0)) - 1
    return int(sink.get("dropped", 0)) + max(0, processed + notes - written)


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
    # Warm-up: the first window, as for latency below. Memory climbs for several loops of the
    # clip while allocator pools and caches reach the largest inputs they will see (the hour's
    # run: 696 MB in minute 1, 798 in minute 2, then 862-876 MB from minute 11 to 60).
    warm = max(1, round(window_s / 60))
    after = minutes[warm:] if len(minutes) > warm else minutes[-1:]
    drift = round(100.0 * (after[-1] - after[0]) / after[0], 2) if after else None
    # The largest departure of any later minute from the first after warm-up (a hump that
    # comes back down would not show in `drift`).
    swing = max((abs(m - after[0]) for m in after), default=0.0)
    events = [r for r in records if r["type"] in ("ocr", "asr") and "wall_s" in r]
    end = max((r["wall_s"] for r in events), default=0.0)
    first = [r["latency_ms"] for r in events if window_s <= r["wall_s"] < 2 * window_s]
    last = [r["latency_ms"] for r in events if r["wall_s"] >= end - window_s]
    p_first, p_last = _p95(first), _p95(last)
    # Per minute too, to tell a trend (something slowing down) from a loaded stretch.
    by_min: dict[int, list[float]] = {}
    for r in events:
        by_min.setdefault(int(r["wall_s"] // 60), []).append(r["latency_ms"])
    media_s = max((r["t_end"] for r in events), default=0.0)
    return {
        "soak_s": round(soak_s),
        "exit": proc.returncode,
        "traceback": "Traceback" in stderr,
        "rss_mb_per_minute": minutes,
        "rss_drift_pct": drift,
        "rss_max_swing_pct": round(100.0 * swing / after[0], 2) if after else None,
        "rss_warmup_minutes": warm,
        "lost_events": _lost(records),
        "events": len(events),
        "slides_read": sum(r["type"] == "ocr" for r in events),
        "latency_p95_first_ms": p_first,
        "latency_p95_last_ms": p_last,
        "latency_p95_ratio": round(p_last / p_first, 2) if p_first and p_last else None,
        "latency_p95_ms_per_minute": [_p95(v) for _, v in sorted(by_min.items())],
        "cpu_s_per_media_s": round(cpu_s / media_s, 3) if cpu_s and media_s else None,
    }


def overload(work: Path, n: int, seconds: float, *, shed: bool = True) -> dict[str, Any]:
    """`n` live streams of a `seconds` cut of the demo clip in one realtime run; `shed`
    False turns speech shedding off (`audio_shed_after_s` 0)."""
    clip = work / "overload.mp4"
    from streamfuse.testing.media import cut

    if not clip.exists():
        cut(DEMO, clip, seconds)
    out = work / f"overload-{'shed' if shed else 'noshed'}.jsonl"
    extra: list[str] = []
    if not shed:
        config = work / "noshed.json"
        config.write_text(json.dumps({"audio_shed_after_s": 0}))
        extra = ["--config", str(config)]
    t0 = time.monotonic()
    proc = subprocess.run(
        _cli("run", *[str(clip)] * n, "--realtime", "--no-live", "--out", str(out), *extra),
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


def _timed(items: Iterable[Mutation], spent: list[float]) -> Iterator[Mutation]:
    """`items`, adding the time spent making each to `spent[0]`."""
    it = iter(items)
    while True:
        t = time.monotonic()
        m = next(it, None)
        spent[0] += time.monotonic() - t
        if m is None:
            return
        yield m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 files, 3-minute soak")
    parser.add_argument("--files", type=int, help="mutated files (default 1000, quick 100)")
    parser.add_argument("--soak-s", type=float, help="soak seconds (default 3600, quick 180)")
    parser.add_argument("--hang-s", type=float, default=30.0, help="no progress this long: hang")
    parser.add_argument(
        "--workers", type=int, help="worker processes running files side by side (default: cores)"
    )
    parser.add_argument(
        "--clip-s", type=float, default=4.0, help="seconds of each clip the files are made from"
    )
    parser.add_argument("--no-soak", action="store_true", help="no soak (and so no overload)")
    parser.add_argument("--no-overload", action="store_true")
    parser.add_argument(
        "--overload-streams",
        type=int,
        help="live streams in the overload run (default 4x what the soak says this machine "
        "holds; given, the overload runs without a soak)",
    )
    parser.add_argument(
        "--overload-s", type=float, help="seconds of the clip cut (default 120, quick 10)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.threads)
        return
    n_files = args.files if args.files is not None else (100 if args.quick else 1000)
    soak_s = args.soak_s or (180.0 if args.quick else 3600.0)
    window_s = 60.0 if soak_s < 1200 else 600.0
    workers = max(1, args.workers or os.cpu_count() or 1)
    print(f"machine: {cpu_description()}")
    print("note: figures on a shared, noisy machine vary run to run", flush=True)
    summary: dict[str, Any] = {"mutated_files": 0, "rss_drift_pct": None, "lost_events": None}
    with tempfile.TemporaryDirectory(prefix="sf-reliability-") as tmp:
        work = Path(tmp)
        t0 = time.monotonic()
        if n_files:  # 0: the soak (and overload) alone
            clips = base_clips(CLIPS, work / "base", seconds=args.clip_s)
            print(
                f"corrupted media: {n_files} files from {len(clips)} clips of {args.clip_s:g} s, "
                f"{workers} workers",
                flush=True,
            )
            made_s = [0.0]
            mutations = _timed(iter_suite(clips, work / "mutated", n_files), made_s)
            results, restarts = run_corpus(
                mutations, hang_s=args.hang_s, limit_s=max(120.0, 4 * args.hang_s), workers=workers
            )
            corpus_wall_s = time.monotonic() - t0
            outcomes = Counter(r["outcome"] for r in results)
            stage_exc = [e for r in results for e in r.get("stage_exceptions", [])]
            by_kind: dict[str, Counter[str]] = {}
            for r in results:
                by_kind.setdefault(r["kind"], Counter())[r["outcome"]] += 1
            print(
                f"  outcomes: {dict(outcomes)} in {corpus_wall_s:.0f} s "
                f"(files made in {made_s[0]:.0f} s of it; {restarts} worker restarts)"
            )
            for kind, c in sorted(by_kind.items()):
                print(f"    {kind:<9} {dict(c)}")
            loads = [r["models_loaded"] for r in results if "models_loaded" in r]
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
                corpus_wall_s=round(corpus_wall_s),
                corpus_workers=workers,
                corpus_worker_restarts=restarts,
                # Per worker process, over its life: one OCR and one ASR load serve all its files.
                corpus_max_model_loads=max((max(x.values(), default=0) for x in loads), default=0),
            )
        if not args.no_soak:
            print(f"soak: {soak_s:.0f} s realtime, looped demo clip", flush=True)
            t = time.monotonic()
            s = soak(work, soak_s, window_s)
            print(f"  {json.dumps(s)}", flush=True)
            summary.update(
                rss_drift_pct=s["rss_drift_pct"],
                soak_rss_max_swing_pct=s["rss_max_swing_pct"],
                soak_rss_warmup_minutes=s["rss_warmup_minutes"],
                lost_events=s["lost_events"],
                soak_latency_p95_ratio=s["latency_p95_ratio"],
                soak_rss_mb_per_minute=s["rss_mb_per_minute"],
                soak_exit=s["exit"],
                soak_wall_s=round(time.monotonic() - t),
            )
        if not args.no_overload and (args.overload_streams or not args.no_soak):
            if args.overload_streams:
                n, held = args.overload_streams, None
            else:
                per_stream = s["cpu_s_per_media_s"] or 1.0
                held = max(1, int((os.cpu_count() or 1) * 0.8 / per_stream))
                n = 4 * held
            print(f"overload: {n} live streams (this machine holds ~{held})", flush=True)
            # Quick: a 10 s cut. Its cost is the streams' model loads plus the speech backlog
            # worked through after the input ends; 20 s took 4 of the 10 minutes when loaded.
            seconds = args.overload_s or (10.0 if args.quick else 120.0)
            o = overload(work, n, seconds)
            print(f"  speech shed when 10 s behind (default): {json.dumps(o)}", flush=True)
            if args.quick:  # a smoke check within 10 minutes: the baseline runs in full mode
                b: dict[str, Any] = {"exit": None, "latency_p95_ms": {}, "wall_s": None}
            else:
                b = overload(work, n, seconds, shed=False)
                print(f"  no shedding (baseline): {json.dumps(b)}", flush=True)
            p95, base = o["latency_p95_ms"], b["latency_p95_ms"]
            summary.update(
                overload_streams=n,
                overload_held=held,
                overload_exit=o["exit"],
                overload_drops_per_edge=o["drops_per_edge"],
                overload_latency_p95_ms=p95,
                overload_streams_with_results=o["streams_with_results"],
                overload_wall_s=o["wall_s"],
                overload_noshed_exit=b["exit"],
                overload_noshed_latency_p95_ms=base,
                overload_noshed_wall_s=b["wall_s"],
                overload_asr_p95_ratio_shed_noshed=(
                    round(p95["asr"] / base["asr"], 3)
                    if p95.get("asr") and base.get("asr")
                    else None
                ),
            )
        summary["total_s"] = round(time.monotonic() - t0)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
