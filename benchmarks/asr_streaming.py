"""Streaming vs offline ASR on the same audio, side by side in one run.

(a) offline: faster-whisper transcribes the whole file's 16 kHz audio with the same model;
(b) streaming: `AsrStage` in a real pipeline (MediaSource, video off, real-time pacing by default).
Prints both WERs against the truth file, commit latency p50/p95, real-time factor and CPU use.
The last output line is one JSON object: wer_streaming, wer_offline, commit_latency_p50_s,
commit_latency_p95_s, rtf (ASR compute seconds per second of audio, streaming).

    python benchmarks/asr_streaming.py [--model tiny.en|base|PATH] [--input CLIP.mp4]
                                       [--realtime/--no-realtime]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT / "src" / "streamfuse" / "assets" / "demo" / "lecture.mp4"  # package data


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def _truth_text(path: Path) -> str:
    truth = json.loads(path.read_text())
    return " ".join(u["text"] for u in truth["asr"])


def offline(audio: np.ndarray, config: Any) -> dict[str, Any]:
    from faster_whisper import WhisperModel

    from streamfuse.audio.models import resolve_whisper_model

    model = WhisperModel(
        str(resolve_whisper_model(config.model)),
        device="cpu",
        compute_type=config.compute_type,
        cpu_threads=config.cpu_threads,
    )
    cpu0, t0 = _cpu_s(), time.perf_counter()
    segments, _ = model.transcribe(audio, language=config.language, beam_size=config.beam_size)
    text = " ".join(s.text.strip() for s in segments)
    return {"text": text, "wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - cpu0}


async def streaming(path: Path, config: Any, realtime: bool) -> dict[str, Any]:
    from streamfuse.audio import AsrStage
    from streamfuse.events import EventType
    from streamfuse.frames import EventFrame
    from streamfuse.pipeline import FrameEmitted, Observer, Pipeline
    from streamfuse.sinks import CollectSink
    from streamfuse.sources.media import MediaSource
    from streamfuse.stats import percentiles

    source = MediaSource(path, realtime=realtime, video=False)
    stage = AsrStage(config)
    sink = CollectSink()
    emitted: list[float] = []

    class EventTimes(Observer):
        def on_frame(self, event: FrameEmitted) -> None:
            if event.producer is stage and isinstance(event.frame, EventFrame):
                emitted.append(event.wall)

    # 60 s of windows: the stage coalesces queued audio while an inference runs.
    pipeline = Pipeline("asr-bench").link(source, stage, maxsize=3000).link(stage, sink)
    pipeline.observe(EventTimes())
    await source.open()
    await stage.setup()  # load before timing; the runner's own setup call is then a no-op
    cpu0, t0 = _cpu_s(), time.perf_counter()
    await pipeline.run()
    wall = time.perf_counter() - t0
    asr = sink.of_type(EventType.ASR)
    errors = sink.of_type(EventType.ERROR)
    latencies = [r["latency_ms"] / 1000.0 for r in asr] or [0.0]
    q = percentiles(latencies)
    return {
        "text": " ".join(r["text"] for r in asr),
        "events": len(asr),
        "partials": len(sink.of_type(EventType.ASR_PARTIAL)),
        "errors": [e["message"] for e in errors],
        "latency_p50_s": q["p50"],
        "latency_p95_s": q["p95"],
        "latency_max_s": max(latencies),
        "wall_s": wall,
        "cpu_s": _cpu_s() - cpu0,
        "audio_s": stage.audio_s,
        "inference_s": stage.inference_s,
        "inferences": stage.inferences,
        "stage_busy_s": stage.stats.busy_s,
        "last_event_after_end_s": (max(emitted) - stage.last_arrival_wall) if emitted else None,
        "records": sink.records,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="tiny.en", help="tiny.en, base or a CTranslate2 folder")
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument("--truth", type=Path, default=None, help="default: INPUT.truth.json")
    parser.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pace the input at wall-clock speed (default) so latencies are meaningful",
    )
    parser.add_argument("--beam-size", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="Whisper cpu_threads")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other AsrConfig field (JSON value), repeatable",
    )
    parser.add_argument("--events-out", type=Path, default=None, help="write streaming events")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from faster_whisper import decode_audio

    from streamfuse.audio import AsrConfig
    from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ
    from streamfuse.text import wer

    overrides: dict[str, Any] = {"model": args.model}
    if args.beam_size is not None:
        overrides["beam_size"] = args.beam_size
    if args.threads is not None:
        overrides["cpu_threads"] = args.threads
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except ValueError:
            overrides[key] = value
    config = AsrConfig(**overrides)
    truth_path = args.truth or args.input.with_name(args.input.stem + ".truth.json")
    ref = _truth_text(truth_path)
    audio = decode_audio(str(args.input), sampling_rate=AUDIO_SAMPLE_RATE_HZ)
    duration = len(audio) / AUDIO_SAMPLE_RATE_HZ

    off = offline(audio, config)
    st = asyncio.run(streaming(args.input, config, args.realtime))
    if args.events_out:
        with args.events_out.open("w") as f:
            for r in st["records"]:
                f.write(json.dumps(r) + "\n")

    wer_off, wer_st = wer(ref, off["text"]), wer(ref, st["text"])
    rtf = st["inference_s"] / max(duration, 1e-9)
    print(
        f"input: {args.input} ({duration:.1f} s)  model: {config.model}  "
        f"beam: {config.beam_size}  threads: {config.cpu_threads}  realtime: {args.realtime}"
    )
    print(
        f"offline   WER {wer_off:6.2%}  wall {off['wall_s']:.2f} s  "
        f"rtf {off['wall_s'] / duration:.3f}  cpu {off['cpu_s'] / duration:.3f} cpu-s/s"
    )
    print(f"  {off['text']}")
    print(
        f"streaming WER {wer_st:6.2%}  commits {st['events']}  partials {st['partials']}  "
        f"inferences {st['inferences']} ({st['inference_s']:.2f} s)"
    )
    print(f"  {st['text']}")
    print(
        f"commit latency p50 {st['latency_p50_s']:.3f} s  p95 {st['latency_p95_s']:.3f} s  "
        f"max {st['latency_max_s']:.3f} s  last event {st['last_event_after_end_s']:.2f} s "
        "after the last audio arrived"
    )
    print(
        f"streaming rtf (inference s / audio s) {rtf:.3f}  "
        f"cpu {st['cpu_s'] / duration:.3f} cpu-s per audio-s  wall {st['wall_s']:.1f} s"
    )
    if st["errors"]:
        print(f"errors: {st['errors']}")
    print(
        json.dumps(
            {
                "wer_streaming": round(wer_st, 4),
                "wer_offline": round(wer_off, 4),
                "commit_latency_p50_s": round(st["latency_p50_s"], 3),
                "commit_latency_p95_s": round(st["latency_p95_s"], 3),
                "rtf": round(rtf, 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
