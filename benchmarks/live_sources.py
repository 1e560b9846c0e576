"""The demo clip live through every source type on loopback, against the file run.

Each source runs the whole pipeline (`--realtime`, default models) on the bundled lecture clip
served by a real server on 127.0.0.1: HTTP with and without Range, the badly interleaved
layout (streams stored one after the other) over HTTP without Range, HLS, fragmented MP4,
MPEG-TS over UDP, RTSP (a sender process pushing to a listening reader) and RTSP pulled from
a real server (Debian's rtsp-server-perl relay the sender publishes to: `rtsp-server` joins
before the first packet, `rtsp-server-join` mid-stream); as a reference, the
clip remuxed to MPEG-TS and read from disk (`file-ts`). Prints OCR CER,
ASR WER and `asr` latency p50/p95 per source with the acceptance checks (CER and WER within
1 point of the file run, `asr` p95 within 1.3x of it); the last line is one JSON object.
About a minute per source; timings move with the load on the machine.

    python benchmarks/live_sources.py [--sources file,http-norange,udp,...] [--clip CLIP.mp4]
        [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from streamfuse.app import StreamfuseConfig, build_pipeline, run_job
from streamfuse.evaluation import evaluate, load_truth
from streamfuse.sinks import CollectSink
from streamfuse.sources import SourceConfig
from streamfuse.testing.live import HttpServer, Pusher, RtspServer, free_port
from streamfuse.testing.media import apart, fragmented, hls, remux, spread_s

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CLIP = ROOT / "src" / "streamfuse" / "assets" / "demo" / "lecture.mp4"
SOURCES = (
    "file",
    "file-ts",
    "http-range",
    "http-norange",
    "http-norange-apart",
    "hls",
    "fmp4",
    "udp",
    "rtsp",
    "rtsp-server",
    "rtsp-server-join",
)

Setup = Callable[[Path], Any]


@contextmanager
def _served(root: Path, name: str, *, ranges: bool) -> Iterator[tuple[str, dict[str, Any]]]:
    with HttpServer(root, ranges=ranges) as server:
        yield server.url(name), {}


@contextmanager
def _source(kind: str, root: Path, clip: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(input URL or path, SourceConfig fields) with its server running."""
    if kind == "file":
        yield str(root / "clip.mp4"), {}
    elif kind == "file-ts":
        # The clip as MPEG-TS on disk: the container the UDP, RTSP and HLS paths carry. It has
        # no edit list, so the AAC encoder's priming samples stay in (speech 21 ms later than
        # in the MP4): this row separates what the container changes from what the network does.
        yield str(root / "clip.ts"), {}
    elif kind == "http-range":
        with _served(root, "clip.mp4", ranges=True) as got:
            yield got
    elif kind == "http-norange":
        with _served(root, "clip.mp4", ranges=False) as got:
            yield got
    elif kind == "http-norange-apart":
        with _served(root, "apart.mp4", ranges=False) as got:
            yield got
    elif kind == "hls":
        with _served(root, "hls/index.m3u8", ranges=True) as got:
            yield got
    elif kind == "fmp4":
        with _served(root, "frag.mp4", ranges=False) as got:
            yield got
    elif kind == "udp":
        port = free_port(socket.SOCK_DGRAM)
        url = f"udp://127.0.0.1:{port}"
        # UDP has no end of stream: the run ends 3 s after the last packet, as a stall.
        with Pusher(clip, f"{url}?pkt_size=1316", format="mpegts", delay_s=2.0):
            yield url, {"stall_timeout_s": 3.0, "reconnect_attempts": 0}
    elif kind == "rtsp":
        port = free_port()
        url = f"rtsp://127.0.0.1:{port}/live"
        with Pusher(clip, url, format="rtsp", options={"rtsp_transport": "tcp"}, delay_s=2.0):
            yield url, {"input_options": {"rtsp_flags": "listen", "rtsp_transport": "tcp"}}
    elif kind in ("rtsp-server", "rtsp-server-join"):
        # Pulled from a real RTSP server (Debian's rtsp-server-perl relay) the clip is pushed
        # to: the stream stalls when the sender is done, which ends the run. In `rtsp-server`
        # the reader joins after the sender has announced the stream and before its first
        # packet, so it reads the whole clip, as the other rows do; in `rtsp-server-join` it
        # joins a relay already forwarding (a camera that was on before the reader), so it
        # starts mid-stream, wherever its join falls.
        with RtspServer() as server:
            push = {"rtsp_transport": "udp"}
            hold = kind == "rtsp-server"
            with Pusher(
                clip, server.publish_url(), format="rtsp", options=push, delay_s=2.0, hold=hold
            ) as pusher:
                server.wait_published()
                if hold:
                    server.release_on_join(pusher)
                options = {"buffer_size": "8388608"}
                yield server.url(), {"input_options": options, "reconnect_attempts": 0}
    else:
        raise SystemExit(f"unknown source {kind!r}; choose from {', '.join(SOURCES)}")


async def _run(location: str, source: dict[str, Any]) -> list[dict[str, Any]]:
    config = StreamfuseConfig(realtime=True, source=SourceConfig(**source))
    sink = CollectSink()
    job = await build_pipeline([location], config, [sink])
    await run_job(job, [sink])
    return [*sink.records, job.summary()]


def measure(kind: str, root: Path, clip: Path, truth: Path) -> dict[str, Any]:
    with _source(kind, root, clip) as (location, source):
        records = asyncio.run(_run(location, source))
    result = evaluate(load_truth(truth), records)
    asr = result.get("latency_ms", {}).get("asr", {})
    return {
        "source": kind,
        "ocr_cer": result.get("ocr_cer"),
        "asr_wer": result.get("asr_wer"),  # the final transcript (revisions applied)
        "asr_wer_first": result.get("asr_wer_first"),  # the words as first committed
        "asr_p50_ms": asr.get("p50"),
        "asr_p95_ms": asr.get("p95"),
        "gaps": sum(r["type"] == "gap" for r in records),
        "errors": [r["message"] for r in records if r["type"] == "error"],
    }


def _mean_row(kind: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from a source's runs: the mean of each figure (None where a run had none),
    the WER of every run, every gap and error."""

    def mean(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return sum(values) / len(values) if len(values) == len(runs) else None

    row: dict[str, Any] = {"source": kind, "runs": len(runs)}
    for key in ("ocr_cer", "asr_wer", "asr_wer_first", "asr_p50_ms", "asr_p95_ms"):
        row[key] = mean(key)
    row["asr_wer_runs"] = [r["asr_wer"] for r in runs]
    row["gaps"] = sum(r["gaps"] for r in runs)
    row["errors"] = [e for r in runs for e in r["errors"]]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", default=",".join(SOURCES))
    parser.add_argument("--clip", type=Path, default=DEFAULT_CLIP)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per source, interleaved (file, a, b, file, a, b, ...); each row is the "
        "mean of its runs (with the range of WER) and the checks compare means",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    kinds = list(dict.fromkeys(k.strip() for k in args.sources.split(",") if k.strip()))
    if "file" in kinds:
        kinds.remove("file")
    kinds.insert(0, "file")  # the baseline every other source is compared with
    truth = args.clip.with_suffix(".truth.json")
    with tempfile.TemporaryDirectory(prefix="sf_live_") as tmp:
        root = Path(tmp)
        clip = root / "clip.mp4"
        clip.write_bytes(args.clip.read_bytes())
        apart(clip, root / "apart.mp4")
        fragmented(clip, root / "frag.mp4")
        remux(clip, root / "clip.ts")
        hls(clip, root / "hls", segment_s=4.0)
        print(
            f"clip {args.clip.name}: streams {spread_s(clip):.2f} s apart in the file; "
            f"apart.mp4 {spread_s(root / 'apart.mp4'):.1f} s",
            file=sys.stderr,
        )
        runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
        for _ in range(max(1, args.repeats)):
            for kind in kinds:
                runs[kind].append(measure(kind, root, clip, truth))
                print(json.dumps(runs[kind][-1]), file=sys.stderr)
        rows = [_mean_row(kind, runs[kind]) for kind in kinds]
    base = rows[0]
    print(
        f"{'source':20} {'OCR CER':>8} {'ASR WER':>8} {'asr p50':>8} {'asr p95':>8}  ok"
        "  (means of the runs; WER of each run)"
    )
    for row in rows:
        row["ok"] = (
            row["ocr_cer"] is not None
            and row["asr_wer"] is not None
            and abs(row["ocr_cer"] - base["ocr_cer"]) <= 0.01
            and abs(row["asr_wer"] - base["asr_wer"]) <= 0.01
            and row["asr_p95_ms"] is not None
            and row["asr_p95_ms"] <= 1.3 * base["asr_p95_ms"]
        )
        cer, wer = 100 * (row["ocr_cer"] or 0), 100 * (row["asr_wer"] or 0)
        p50, p95 = row["asr_p50_ms"] or 0, row["asr_p95_ms"] or 0
        ok = "yes" if row["ok"] else "NO"
        each = " ".join(f"{100 * w:.1f}" if w is not None else "-" for w in row["asr_wer_runs"])
        first = 100 * (row["asr_wer_first"] or 0)
        print(
            f"{row['source']:20} {cer:7.1f}% {wer:7.1f}% {p50:8.0f} {p95:8.0f}  {ok}  ({each}; "
            f"first commits {first:.1f}%)"
        )
    print(json.dumps({"sources": rows, "all_ok": all(r["ok"] for r in rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
