"""`streamfuse serve` with one live session vs N at once (default 8), side by side in one run.

Each session is fed the clip as a browser feeds it: WebM (VP8 + Opus, 10 frames/s, as the
dashboard asks the camera for) in chunks at the clip's own rate over a WebSocket. Reported per
configuration: errors, OCR and ASR commit latency p95 over all sessions, how long after the
clip's end the last result came (lag), and process CPU seconds. Ends with one JSON line.

    python benchmarks/serve_sessions.py [--sessions 8] [--input clip.mp4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from streamfuse.server import ServeConfig, serve_in_thread
from streamfuse.server.client import ServeClient
from streamfuse.stats import percentiles
from streamfuse.testing.machine import cpu_description
from streamfuse.testing.media import encode_webm

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT / "assets" / "test" / "short.mp4"
TOKEN = "benchmark-token"


async def _one(client: ServeClient, sid: str, data: bytes, duration: float) -> list[dict[str, Any]]:
    results = asyncio.create_task(_collect(client, sid))
    await client.send_media(sid, data, chunk_bytes=16 << 10, over_s=duration)
    return await results


async def _collect(client: ServeClient, sid: str) -> list[dict[str, Any]]:
    return [r async for r in client.events(sid)]


def run(n: int, data: bytes, duration: float) -> dict[str, Any]:
    config = ServeConfig(port=0, token=TOKEN, max_sessions=n, idle_timeout_s=120.0)
    proc = psutil.Process()

    async def scenario(url: str) -> list[list[dict[str, Any]]]:
        async with ServeClient(url, TOKEN) as client:
            ids = [(await client.create_session())["id"] for _ in range(n)]
            return await asyncio.gather(*(_one(client, s, data, duration) for s in ids))

    with serve_in_thread(config) as url:
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.perf_counter()
        sessions = asyncio.run(scenario(url))
        wall, cpu = time.perf_counter() - t0, sum(proc.cpu_times()[:2]) - cpu0
    records = [r for s in sessions for r in s]

    def p95(kind: str) -> float:
        values = [r["latency_ms"] for r in records if r["type"] == kind]
        return round(percentiles(values)["p95"], 1) if values else float("nan")

    lags = [s[-1]["wall_s"] - duration for s in sessions if s and s[-1]["type"] == "stats"]
    return {
        "sessions": n,
        "errors": sum(r["type"] == "error" for r in records),
        "ocr_events": sum(r["type"] == "ocr" for r in records),
        "asr_events": sum(r["type"] == "asr" for r in records),
        "ocr_p95_ms": p95("ocr"),
        "asr_p95_ms": p95("asr"),
        "lag_max_s": round(max(lags), 2) if lags else float("nan"),
        "cpu_s": round(cpu, 1),
        "wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--duration", type=float, default=None, help="clip seconds (probed)")
    args = parser.parse_args()
    import av

    with av.open(str(args.input)) as c:
        duration = args.duration or (c.duration or 0) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        data = encode_webm(args.input, Path(tmp) / "clip.webm", fps=10).read_bytes()
    print(f"cpu: {cpu_description()}")
    print(f"clip {args.input.name} ({duration:.1f} s) as WebM VP8+Opus 10 fps, live pace")
    rows = [run(1, data, duration), run(args.sessions, data, duration)]
    keys = list(rows[0])
    print(" | ".join(f"{k:>10}" for k in keys))
    for row in rows:
        print(" | ".join(f"{row[k]!s:>10}" for k in keys))
    one, many = rows
    summary = {
        "cpu": cpu_description(),
        "sessions": args.sessions,
        "errors": many["errors"],
        "ocr_p95_ratio_n_1": round(many["ocr_p95_ms"] / one["ocr_p95_ms"], 2),
        "asr_p95_ratio_n_1": round(many["asr_p95_ms"] / one["asr_p95_ms"], 2),
        "lag_max_s_n": many["lag_max_s"],
        "lag_max_s_1": one["lag_max_s"],
        "cpu_ratio_n_1": round(many["cpu_s"] / one["cpu_s"], 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
