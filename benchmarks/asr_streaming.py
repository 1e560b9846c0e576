"""Streaming ASR systems side by side on the same audio, with offline decoding as the reference.

Systems (all the same Whisper model, each a real `Stage` fed 20 ms windows):
- ``ours``: `AsrStage` as configured (default: unprimed); ``ours-primed``: the same primed with
  the slides' text (each slide's lines reach it `--ocr-delay-s` after the slide appears, as the
  OCR stage's events would; `prime_max_terms` 20 unless set); ``ours-primed-other``: primed
  the same way with the slides of the next synthetic clip of the split (another lecture's
  slides over every synthetic clip's speech: how much priming costs where slides do not match);
  ``ours-reviser``: ``ours`` with ``background_revise`` forced on (Whisper base re-reads each
  utterance after its commits, on a low-priority thread, and revises; on by default, so
  ``--set background_revise=false`` makes ``ours`` tiny.en alone beside it); any of these with
  ``+TAG`` and ``--variant SYSTEM+TAG:FIELD=VALUE`` (repeatable): that system with other
  `AsrConfig` fields, beside the plain one in the same run (e.g. ``--systems ours,ours+tail0
  --variant ours+tail0:tail_window_min_s=0``);
- ``la2``: whisper_streaming-style LocalAgreement-2: the growing buffer re-transcribed every
  1 s (full window, no VAD), the longest common prefix of two hypotheses committed, the buffer
  trimmed at a committed sentence end past 15 s;
- ``vad``: VAD-segmented: Silero VAD utterances, each transcribed once when it ends (cut at 15 s).
Offline: faster-whisper over each whole file at beam 5 (``wer_offline_beam5``, the accuracy the
streaming systems are held to) and at the configured beam (``wer_offline``); ``causal-beam5``
(``wer_causal_beam5``): each truth sentence decoded at its end at beam 5 from the audio before
it only, the bound for a causal recognizer (offline decoding also hears the words after). With
the background reviser on (the default), ours' final words are partly the reviser's model's
(`effort_model`, Whisper base): ``offline-reviser-beam5`` (``wer_offline_reviser_beam5``) is that
model over the whole file at beam 5, the offline reference for the pair.

Word latency: per committed word, from its end (the recognizer's own word time) to its commit.
``--realtime`` (default) paces the file at wall-clock speed through a pipeline: the commit's wall
time minus the arrival of the audio window holding the word end. ``--no-realtime`` runs each
system frame by frame on a simulated clock (a window arrives at its media time, the stage starts
it when free and takes the CPU time it used, as on an idle core). Every window is processed
without coalescing, so the transcripts do not depend on the machine's load (deterministic) and
a stage slower than real time falls behind (pessimistic latency): for choosing settings.
Timing on a shared CPU is noisy: compare systems only within one run.

Inputs: ``--input`` (default: the bundled lecture) and/or ``--speech-set DIR`` (the clips of
``DIR/set.json`` in ``--split``). Prints one row per clip and system, an aggregate per group
(bundled, dev, heldout; and the synthetic clips of a split by their slides, ``dev:match`` /
``dev:offslide``, the priming figures, with how often the speech says its own slides' terms
and how many of those the transcript lacks: what priming could fix at most) and system, and as
its last line one JSON object: the old
keys for the first input group (``wer_streaming``, ``wer_offline``, ``commit_latency_p50_s``,
``commit_latency_p95_s``, ``rtf``) and ``groups`` -> group -> system -> ``wer``,
``word_latency_p50_s``, ``word_latency_p95_s``, ``final_latency_p50_s``, ``final_latency_p95_s``,
``words``. ``wer`` is the final transcript: ours corrects committed words at utterance ends
(``asr_revision`` events; ``revisions`` their count, ``--set revise=false`` turns them off), and
``wer_first`` scores the words as first committed. ``word_latency_*`` is word end -> commit (the
first commit of each word, what a live consumer waits for); ``final_latency_*`` runs to each final
word's last form (a corrected word counts to its revision).

    python benchmarks/asr_streaming.py [--model tiny.en|base|PATH] [--input CLIP]
        [--shift-ms 0,7,14,21,28,45] [--speech-set assets/eval/speech --split dev|heldout|all]
        [--systems ours,ours-primed,la2,vad] [--realtime/--no-realtime]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUT = ROOT / "src" / "streamfuse" / "assets" / "demo" / "lecture.mp4"  # package data
SYSTEMS = ("ours", "ours-primed", "la2", "vad")  # and "ours-primed-other", "ours-reviser"

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))

from streamfuse.audio import AsrConfig, AsrStage, Transcriber, WhisperTranscriber, Word  # noqa: E402
from streamfuse.audio.policy import LocalAgreement, join_words  # noqa: E402
from streamfuse.audio.priming import ScreenTerms, count_terms  # noqa: E402
from streamfuse.audio.vad import GateEvent, SileroVad, SpeechGate  # noqa: E402
from streamfuse.events import (  # noqa: E402
    AsrPayload,
    AsrRevisionPayload,
    EventRecord,
    join_speech,
    speech_words,
)
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ, AudioFrame, EventFrame, Frame, now_wall  # noqa: E402
from streamfuse.pipeline import FrameEmitted, Observer, Pipeline, Stage  # noqa: E402
from streamfuse.sinks import CollectSink  # noqa: E402
from streamfuse.sources.media import MediaSource  # noqa: E402
from streamfuse.stats import percentiles  # noqa: E402
from streamfuse.testing.machine import cpu_description  # noqa: E402
from streamfuse.text import normalize_english, wer  # noqa: E402


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class Clip:
    name: str
    group: str
    audio: Path
    truth: dict[str, Any]
    #: Set clips: "match" (synthetic voice, slides carry the spoken terms), "offslide" (slides
    #: of another lecture) or "human" (a human reader); "" for other inputs.
    slides: str = ""

    @property
    def ref(self) -> str:
        return " ".join(u["text"] for u in self.truth["asr"])

    @property
    def n_ref_words(self) -> int:
        return len(normalize_english(self.ref).split())

    def slide_terms(self, token_count: Callable[[str], int]) -> list[str]:
        """Every rare word on the clip's own slides (what priming could pass)."""
        slides = ScreenTerms()
        for shown in self.truth.get("ocr", []):
            slides.add(shown["lines"], 0.0)
        return slides.terms(0.0, token_count, limit=1000)


def term_misses(clip: Clip, text: str, token_count: Callable[[str], int]) -> dict[str, int]:
    """How often the speech says its own slides' terms, and how many of those the transcript
    lacks: what priming could fix at most (a misheard term is one error or more)."""
    terms = clip.slide_terms(token_count)
    said = count_terms(normalize_english(clip.ref).split(), terms)
    got = count_terms(normalize_english(text).split(), terms)
    return {"terms_said": sum(said.values()), "terms_missed": sum((said - got).values())}


@dataclass
class Result:
    text: str = ""  # the final transcript (revisions applied)
    latencies_s: list[float] = field(default_factory=list)  # per final word, to its final form
    text_first: str = ""  # the words as first committed
    latencies_first_s: list[float] = field(default_factory=list)  # per word, to its first commit
    rules_first: list[str] = field(default_factory=list)  # per word, the rule that committed it
    words_first: list[dict[str, Any]] = field(default_factory=list)  # per word, for --word-log
    event_latencies_s: list[float] = field(default_factory=list)  # per commit event
    revisions: int = 0
    inference_s: float = 0.0
    audio_s: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def take(
        self, speech: list[tuple[EventFrame, float]], arrival: Callable[[float], float]
    ) -> None:
        """Texts and word latencies from the `asr` / `asr_revision` frames with their emission
        times; `arrival(t)` is when the audio holding media time `t` arrived."""
        records = [
            EventRecord(type=f.type, stream_id=f.stream_id, t_start=f.t_media, t_end=f.t_end,
                        latency_ms=0.0, wall_s=now, payload=f.payload)
            for f, now in speech
        ]  # fmt: skip
        first = [
            (r, w) for r in records if isinstance(r.payload, AsrPayload) for w in r.payload.words
        ]
        final = [(r, w) for w, r in speech_words(records)]
        self.text_first = join_speech(w for _, w in first)
        self.text = join_speech(w for _, w in final)
        self.latencies_first_s = [(r.wall_s or 0.0) - arrival(w.t_end) for r, w in first]
        self.rules_first = [
            (r.payload.rule or "") if isinstance(r.payload, AsrPayload) else "" for r, _ in first
        ]
        final_ids = {id(w) for _, w in final}
        self.words_first = [
            {"word": w.word, "t_start": w.t_start, "t_end": w.t_end, "p_raw": w.p_raw,
             "commit_s": round(r.wall_s or 0.0, 3), "latency_s": round(lat, 3), "rule": rule,
             "revised": id(w) not in final_ids}
            for (r, w), lat, rule in zip(first, self.latencies_first_s, self.rules_first,
                                         strict=True)
        ]  # fmt: skip
        self.latencies_s = [(r.wall_s or 0.0) - arrival(w.t_end) for r, w in final]
        self.event_latencies_s = [
            (r.wall_s or 0.0) - arrival(r.t_end)
            for r in records
            if isinstance(r.payload, AsrPayload)
        ]
        self.revisions = sum(isinstance(r.payload, AsrRevisionPayload) for r in records)


# -- baselines ------------------------------------------------------------------------------
class _BufferStage(Stage):
    """Shared plumbing of the baselines: an audio buffer, commit events, a prompt."""

    input_types = (AudioFrame,)

    def __init__(self, transcriber: Transcriber, name: str) -> None:
        super().__init__(name, threads=1)
        self.transcriber = transcriber
        self.buf = np.zeros(0, np.float32)
        self.buf_t0: float | None = None
        self.history: list[Word] = []
        self.stream_id = "main"
        self.inference_s = 0.0
        self.audio_s = 0.0

    @property
    def buf_end(self) -> float:
        return (self.buf_t0 or 0.0) + len(self.buf) / AUDIO_SAMPLE_RATE_HZ

    def append(self, frame: AudioFrame) -> np.ndarray:
        samples = np.asarray(frame.samples, np.float32).reshape(-1)
        if self.buf_t0 is None:
            self.buf_t0, self.stream_id = frame.t_media, frame.stream_id
        self.buf = np.concatenate([self.buf, samples])
        self.audio_s += len(samples) / AUDIO_SAMPLE_RATE_HZ
        return samples

    def cut(self, t: float) -> None:
        assert self.buf_t0 is not None
        k = min(len(self.buf), max(0, round((t - self.buf_t0) * AUDIO_SAMPLE_RATE_HZ)))
        self.buf = self.buf[k:]
        self.buf_t0 += k / AUDIO_SAMPLE_RATE_HZ

    async def transcribe(self, audio: np.ndarray, t0: float) -> list[Word]:
        before = [w for w in self.history if w.t_end <= t0 + 1e-3]
        prompt = join_words(before)[-200:]
        started = time.perf_counter()
        words = await self.run_blocking(self.transcriber.transcribe, audio, prompt)
        self.inference_s += time.perf_counter() - started
        return [w.shifted(t0) for w in words]

    def event(self, words: list[Word]) -> EventFrame:
        self.history.extend(words)
        return EventFrame(
            stream_id=self.stream_id,
            t_media=words[0].t_start,
            t_end=words[-1].t_end,
            arrival_wall=now_wall(),
            payload=AsrPayload(text=join_words(words), words=[w.to_payload() for w in words]),
        )


class LocalAgreementStage(_BufferStage):
    """whisper_streaming's OnlineASRProcessor: LocalAgreement-2 over the growing buffer."""

    def __init__(self, transcriber: Transcriber, *, min_chunk_s: float = 1.0) -> None:
        super().__init__(transcriber, "la2")
        self.min_chunk_s = min_chunk_s
        self.policy = LocalAgreement()
        self.last_update = 0.0

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, AudioFrame)
        self.append(frame)
        if self.buf_end - self.last_update < self.min_chunk_s or self.backlog > 0:
            return
        assert self.buf_t0 is not None
        self.last_update = self.buf_end
        words = await self.transcribe(self.buf, self.buf_t0)
        committed = self.policy.insert(words)
        if committed:
            yield self.event(committed)
        if self.buf_end - self.buf_t0 > 15.0:
            ends = [w.t_end for w in self.history if w.ends_sentence and w.t_end > self.buf_t0]
            if ends:
                self.cut(ends[-1])
            elif self.buf_end - self.buf_t0 > 25.0:
                self.cut(self.policy.committed_end)

    async def flush(self) -> AsyncIterator[Frame]:
        committed = self.policy.commit_all()
        if committed:
            yield self.event(committed)


class VadSegmentedStage(_BufferStage):
    """Silero VAD utterances, each transcribed once at its end (a forced cut at `max_s`)."""

    def __init__(self, transcriber: Transcriber, config: AsrConfig, *, max_s: float = 15.0):
        super().__init__(transcriber, "vad")
        self.config = config
        self.max_s = max_s
        self.vad: SileroVad | None = None
        self.gate = SpeechGate(
            config.vad_start_threshold, config.vad_end_threshold, config.min_silence_s
        )
        self.start: float | None = None

    async def setup(self) -> None:
        self.vad = await self.run_blocking(SileroVad)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, AudioFrame) and self.vad is not None
        first = self.buf_t0 is None
        samples = self.append(frame)
        if first:
            self.vad.reset(frame.t_media)
        for chunk in await self.run_blocking(self.vad.push, samples):
            change = self.gate.update(chunk)
            if change is None:
                continue
            if change.event is GateEvent.SPEECH_START:
                self.start = max(self.buf_t0 or 0.0, change.t - self.config.speech_pad_s)
                self.cut(self.start)
            elif self.start is not None:
                async for out in self._utterance(change.t + self.config.speech_pad_s):
                    yield out
        if self.start is None:
            self.cut(self.buf_end - 1.0)  # keep a little audio before the next speech start
        elif self.buf_end - self.start > self.max_s:
            async for out in self._utterance(self.buf_end):
                yield out
            self.start = self.buf_end

    async def _utterance(self, end: float) -> AsyncIterator[Frame]:
        assert self.buf_t0 is not None
        n = round((min(end, self.buf_end) - self.buf_t0) * AUDIO_SAMPLE_RATE_HZ)
        words = await self.transcribe(self.buf[:n], self.buf_t0)
        if words:
            yield self.event(words)
        self.cut(min(end, self.buf_end))
        self.start = None

    async def flush(self) -> AsyncIterator[Frame]:
        if self.start is not None:
            async for out in self._utterance(self.buf_end):
                yield out


# -- running a system -----------------------------------------------------------------------
def make_stage(system: str, clip: Clip, config: AsrConfig, transcriber: Transcriber,
               ocr_delay_s: float, other: Clip | None = None,
               live: bool = True) -> Stage:  # fmt: skip
    if system == "la2":
        return LocalAgreementStage(transcriber)
    if system == "vad":
        return VadSegmentedStage(transcriber, config)
    terms = None
    if system in ("ours-primed", "ours-primed-other"):
        terms = ScreenTerms(window_s=config.prime_window_s)
        shown = clip if system == "ours-primed" else other
        assert shown is not None, "ours-primed-other needs another clip"
        slides = shown.truth.get("ocr", [])
        for slide in slides:
            terms.add(slide["lines"], slide["t_start"] + ocr_delay_s)
        if config.prime_max_terms == 0:
            config = config.model_copy(update={"prime_max_terms": 20})
    if system == "ours-reviser":
        config = config.model_copy(update={"background_revise": True})
    # Simulated clock: not live (no queue to coalesce; `effort="auto"` counts CPU time).
    return AsrStage(config, transcriber=transcriber, screen_terms=terms, live=live, name=system)


def _fields(items: list[str]) -> dict[str, Any]:
    """`FIELD=VALUE` items as AsrConfig overrides (a value that is not JSON stays a string)."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _is_speech(frame: Frame) -> bool:
    return isinstance(frame, EventFrame) and isinstance(
        frame.payload, AsrPayload | AsrRevisionPayload
    )


async def run_realtime(stage: Stage, clip: Clip) -> Result:
    source = MediaSource(clip.audio, realtime=True, video=False)
    sink = CollectSink()
    arrivals_t: list[float] = []
    arrivals_wall: list[float] = []
    speech: list[tuple[EventFrame, float]] = []

    class Times(Observer):
        def on_frame(self, event: FrameEmitted) -> None:
            frame = event.frame
            if event.producer is source and isinstance(frame, AudioFrame):
                arrivals_t.append(frame.t_end)
                arrivals_wall.append(event.wall)
            if event.producer is stage and _is_speech(frame):
                assert isinstance(frame, EventFrame)
                speech.append((frame, event.wall))

    def arrival(t: float) -> float:
        return arrivals_wall[min(bisect.bisect_left(arrivals_t, t - 1e-6), len(arrivals_t) - 1)]

    pipeline = Pipeline("asr-bench").link(source, stage, maxsize=3000).link(stage, sink)
    pipeline.observe(Times())
    await source.open()
    await stage.setup()  # load before timing; the runner's own setup call is then a no-op
    cpu0, t0 = _cpu_s(), time.perf_counter()
    await pipeline.run()
    result = Result(wall_s=time.perf_counter() - t0, cpu_s=_cpu_s() - cpu0)
    result.take(speech, arrival)
    return result


async def run_simulated(stage: Stage, clip: Clip) -> Result:
    source = MediaSource(clip.audio, realtime=False, video=False)
    await source.open()
    frames = [f async for f in source.frames() if isinstance(f, AudioFrame)]
    await stage.setup()
    speech: list[tuple[EventFrame, float]] = []
    clock = 0.0  # simulated wall time = media time when idle

    async def run(outs: AsyncIterator[Frame], base: float) -> float:
        """Drain one call of the stage, each output stamped when it is yielded (not when the
        call ends: a commit made before a later inference in the same call waits for nothing)."""
        started = time.process_time()
        async for out in outs:
            if isinstance(out, EventFrame) and _is_speech(out):
                speech.append((out, base + time.process_time() - started))
        return base + time.process_time() - started

    cpu0, t0 = _cpu_s(), time.perf_counter()
    for frame in frames:
        clock = await run(stage.process(frame), max(clock, frame.t_end))
    await run(stage.flush(), max(clock, frames[-1].t_end if frames else 0.0))
    result = Result(wall_s=time.perf_counter() - t0, cpu_s=_cpu_s() - cpu0)
    result.take(speech, lambda t: t)  # a window arrives at its media time
    return result


def offline(model: Any, clip: Clip, beam_size: int) -> str:
    from faster_whisper import decode_audio

    audio = decode_audio(str(clip.audio), sampling_rate=AUDIO_SAMPLE_RATE_HZ)
    segments, _ = model.transcribe(audio, language="en", beam_size=beam_size)
    return " ".join(s.text.strip() for s in segments)


def causal(model: Any, clip: Clip, beam_size: int, *, past_s: float = 25.0) -> str:
    """What a causal recognizer with perfect utterance ends gets: each truth utterance decoded
    once at its end, whole, with the audio before it up to `past_s` in all (no future audio),
    its words taken by their times. Offline decoding also hears what comes after a word, which
    no streaming system can before the commit: the gap between the two is the price of
    causality (a reference, not a strict bound: a stream also carries its committed text as
    a prompt)."""
    from faster_whisper import decode_audio

    audio = decode_audio(str(clip.audio), sampling_rate=AUDIO_SAMPLE_RATE_HZ)
    out: list[str] = []
    prev_end = 0.0
    for utterance in clip.truth["asr"]:
        end = utterance["t_end"] + 0.2
        start = max(0.0, min(utterance["t_start"] - 0.2, end - past_s))
        x = audio[round(start * AUDIO_SAMPLE_RATE_HZ) : round(end * AUDIO_SAMPLE_RATE_HZ)]
        segments, _ = model.transcribe(
            x, language="en", beam_size=beam_size, word_timestamps=True,
            condition_on_previous_text=False,
        )  # fmt: skip
        words = [w for s in segments for w in (s.words or []) if w.start + start >= prev_end - 0.1]
        out.append("".join(w.word for w in words).strip())
        prev_end = utterance["t_end"]
    return " ".join(out)


def _shifted(path: Path, ms: int) -> Path:
    """`path`'s sound as 16 kHz mono WAV with `ms` of silence in front (a temporary file)."""
    import tempfile
    import wave

    from faster_whisper import decode_audio

    audio = decode_audio(str(path), sampling_rate=AUDIO_SAMPLE_RATE_HZ)
    pcm = np.concatenate([np.zeros(AUDIO_SAMPLE_RATE_HZ * ms // 1000), audio])
    out = Path(tempfile.mkdtemp(prefix="sf_shift_")) / f"{path.stem}-{ms}ms.wav"
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(AUDIO_SAMPLE_RATE_HZ)
        w.writeframes((np.clip(pcm, -1.0, 1.0) * 32767).astype("<i2").tobytes())
    return out


def load_clips(args: argparse.Namespace) -> list[Clip]:
    clips = []
    for path in args.input or ([] if args.speech_set or args.shift_ms else [DEFAULT_INPUT]):
        truth_path = path.with_name(path.stem + ".truth.json")
        group = "bundled" if path.resolve() == DEFAULT_INPUT else "input"
        clips.append(Clip(path.stem, group, path, json.loads(truth_path.read_text())))
    for ms in (int(x) for x in args.shift_ms.split(",") if x.strip()):
        truth = json.loads(DEFAULT_INPUT.with_name(DEFAULT_INPUT.stem + ".truth.json").read_text())
        clips.append(Clip(f"bundled+{ms}ms", "shifted", _shifted(DEFAULT_INPUT, ms), truth))
    if args.speech_set:
        manifest = json.loads((args.speech_set / "set.json").read_text())
        for item in manifest["clips"]:
            if args.split != "all" and item["split"] != args.split:
                continue
            if args.clips and item["name"] not in args.clips.split(","):
                continue
            truth = json.loads((args.speech_set / f"{item['name']}.truth.json").read_text())
            slides = (
                "offslide" if not item["slides_match_speech"]
                else "match" if item["source"] == "espeak-ng" else "human"
            )  # fmt: skip
            clips.append(Clip(item["name"], item["split"], args.speech_set / f"{item['name']}.ogg",
                              truth, slides))  # fmt: skip
    return clips


def _other_slides(clip: Clip, clips: list[Clip]) -> Clip | None:
    """The next synthetic clip of the same split after `clip` (cyclic): whose slides
    ``ours-primed-other`` shows over `clip`'s speech (slides of another lecture)."""
    pool = [c for c in clips if c.group == clip.group and c.slides in ("match", "offslide")]
    if clip not in pool or len(pool) < 2:
        return None
    return pool[(pool.index(clip) + 1) % len(pool)]


def _by_rule(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Words first committed by each commit rule: how many, and their word latency p50 / p95
    (which rule a latency tail is owed to)."""
    lat: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for rule, x in zip(r.get("rules_first", []), r["latencies_first"], strict=False):
            if rule:  # the baselines name no rule
                lat[rule].append(x)
    out = {}
    for rule, xs in sorted(lat.items()):
        q = percentiles(xs)
        out[rule] = {"words": len(xs), "p50_s": round(q["p50"], 3), "p95_s": round(q["p95"], 3)}
    return out


def _agg(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """WER pooled over the group's words; word latencies pooled. `wer` is the final transcript,
    `wer_first` the words as first committed; `word_latency_*` runs from each word's end to its
    first commit, `final_latency_*` to the event that gave a final word its form (an
    `asr_revision` for a corrected word)."""
    words = sum(r["ref_words"] for r in rows)
    out: dict[str, Any] = {}
    for suffix, latency in (("", "final_latency"), ("_first", "word_latency")):
        lat = [x for r in rows for x in r["latencies" + suffix]]
        q = percentiles(lat) if lat else {"p50": float("nan"), "p95": float("nan")}
        wer_ = sum(r["wer" + suffix] * r["ref_words"] for r in rows) / max(1, words)
        out["wer" + suffix] = round(wer_, 4)
        out[latency + "_p50_s"] = round(q["p50"], 3)
        out[latency + "_p95_s"] = round(q["p95"], 3)
    passes = [r["effort_passes"] for r in rows if "effort_passes" in r]
    if passes:  # full-window passes per effort rung, summed over the group's clips
        out["effort_passes"] = [sum(p[i] for p in passes) for i in range(len(passes[0]))]
    if any("terms_said" in r for r in rows):  # the clips' own slide terms, said / missed
        for k in ("terms_said", "terms_missed"):
            out[k] = sum(r.get(k, 0) for r in rows)
        out["errors"] = round(sum(r["wer"] * r["ref_words"] for r in rows))
    out["words"] = sum(len(r["latencies"]) for r in rows)
    out["revisions"] = sum(r["revisions"] for r in rows)
    rules = _by_rule(rows)
    if rules:
        out["rules"] = rules
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", default="tiny.en", help="tiny.en, base or a CTranslate2 folder")
    parser.add_argument("--input", type=Path, action="append", default=[])
    parser.add_argument("--speech-set", type=Path, default=None, help="e.g. assets/eval/speech")
    parser.add_argument("--split", choices=("dev", "heldout", "all"), default="all")
    parser.add_argument("--clips", default="", help="only these set clips (comma-separated)")
    parser.add_argument(
        "--shift-ms",
        default="",
        help="comma-separated milliseconds: also run the bundled clip's sound with this much "
        "silence in front (group `shifted`; how much the alignment of the audio moves the WER)",
    )
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument(
        "--realtime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pace the input at wall-clock speed (default) so latencies are meaningful",
    )
    parser.add_argument("--ocr-delay-s", type=float, default=1.0)
    parser.add_argument("--beam-size", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="Whisper cpu_threads")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other AsrConfig field (JSON value), repeatable",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SYSTEM+TAG:FIELD=VALUE",
        help="a system run with other AsrConfig fields (JSON values) beside the plain one: "
        "name SYSTEM+TAG in --systems; repeatable, one field each (not `model`: the systems "
        "share one loaded model)",
    )
    parser.add_argument("--no-offline", action="store_true", help="skip the offline references")
    parser.add_argument("--show-text", action="store_true", help="print whole transcripts")
    parser.add_argument(
        "--word-log",
        type=Path,
        default=None,
        help="write every first-committed word of `ours*` as one JSON line (clip, system, word, "
        "times, commit time, latency, commit rule, revised later or not)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    overrides: dict[str, Any] = {"model": args.model}
    if args.beam_size is not None:
        overrides["beam_size"] = args.beam_size
    if args.threads is not None:
        overrides["cpu_threads"] = args.threads
    overrides.update(_fields(args.set))
    config = AsrConfig(**overrides)
    systems = [s for s in args.systems.split(",") if s]
    changes: dict[str, dict[str, Any]] = defaultdict(dict)
    for item in args.variant:
        name, _, field_ = item.partition(":")
        if "+" not in name or name not in systems:
            parser.error(f"--variant {item!r}: name a SYSTEM+TAG given in --systems")
        changes[name].update(_fields([field_]))
    clips = load_clips(args)
    transcriber = WhisperTranscriber(config)
    transcriber.load()
    # A variant's stage and transcriber (decoding settings; the loaded model shared) both see
    # its fields.
    variants = {
        name: (AsrConfig(**{**config.model_dump(), **fields}), transcriber.variant(**fields))
        for name, fields in changes.items()
    }
    runner: Callable[[Stage, Clip], Any] = run_realtime if args.realtime else run_simulated
    reviser_model: Any = None
    if not args.no_offline and config.revises_in_background:
        reviser = WhisperTranscriber(config.model_copy(update={"model": config.effort_model}))
        reviser.load()
        reviser_model = reviser._model
    print(f"cpu: {cpu_description()}")
    print(
        f"model: {config.model}  beam: {config.beam_size}  threads: {config.cpu_threads}  "
        f"realtime: {args.realtime}  clips: {len(clips)}  systems: {', '.join(systems)}"
    )
    rows: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    audio_total: dict[str, float] = defaultdict(float)
    first_group = clips[0].group if clips else ""
    first: dict[str, Any] = {}
    word_log = args.word_log.open("w") if args.word_log else None
    for clip in clips:
        audio_total[clip.group] += clip.truth["duration_s"]
        refs = {}
        if not args.no_offline:
            model = transcriber._model
            model.frames = None
            refs["offline-beam5"] = offline(model, clip, 5)
            refs["offline"] = offline(model, clip, config.beam_size)
            refs["causal-beam5"] = causal(model, clip, 5)
            if reviser_model is not None:
                refs["offline-reviser-beam5"] = offline(reviser_model, clip, 5)
        for name, text in refs.items():
            score = wer(clip.ref, text)
            rows[(clip.group, name)].append(
                {"wer": score, "wer_first": score, "ref_words": clip.n_ref_words,
                 "latencies": [], "latencies_first": [], "revisions": 0}
            )  # fmt: skip
            print(f"{clip.name:32s} {name:13s} WER {score:6.1%}")
            if args.show_text:
                print(f"    {text}")
        for system in systems:
            kind = system.partition("+")[0]
            if kind == "ours-primed-other" and _other_slides(clip, clips) is None:
                continue  # not a synthetic clip, or no other clip's slides to show
            system_config, system_transcriber = variants.get(system, (config, transcriber))
            stage = make_stage(kind, clip, system_config, system_transcriber,
                               args.ocr_delay_s, _other_slides(clip, clips),
                               live=args.realtime)  # fmt: skip
            res: Result = asyncio.run(runner(stage, clip))
            score = wer(clip.ref, res.text)
            row = {"wer": score, "wer_first": wer(clip.ref, res.text_first),
                   "ref_words": clip.n_ref_words, "latencies": res.latencies_s,
                   "latencies_first": res.latencies_first_s,
                   "rules_first": res.rules_first,
                   "revisions": res.revisions}  # fmt: skip
            if word_log is not None:
                for w in res.words_first:
                    word_log.write(json.dumps({"clip": clip.name, "group": clip.group,
                                               "system": system, **w}) + "\n")  # fmt: skip
                word_log.flush()
            rows[(clip.group, system)].append(row)
            if clip.slides in ("match", "offslide"):  # the priming figures: per kind of slides
                row.update(term_misses(clip, res.text, transcriber.token_count))
                rows[(f"{clip.group}:{clip.slides}", system)].append(row)
            effort = getattr(stage, "effort", None)
            if effort is not None:  # full-window passes per effort rung (`effort`, docs/asr.md)
                row["effort_passes"] = list(effort.passes)
            # Background readings run, and replaced unread: the reviser's and the lookback's.
            background = {key: bg for key in ("reader", "lookback_reader")
                          if (bg := getattr(stage, key, None)) is not None}  # fmt: skip
            for key, bg in background.items():
                row[f"{key}_passes"], row[f"{key}_replaced"] = bg.passes, bg.replaced
            q = percentiles(res.latencies_first_s or [0.0])
            qf = percentiles(res.latencies_s or [0.0])
            print(
                f"{clip.name:32s} {system:13s} WER {score:6.1%} (first "
                f"{rows[(clip.group, system)][-1]['wer_first']:6.1%}, {res.revisions} revisions)"
                f"  word latency p50 {q['p50']:.2f} s p95 {q['p95']:.2f} s (final p95 "
                f"{qf['p95']:.2f} s)  inference "
                f"{getattr(stage, 'inference_s', 0.0):.1f} s"
                + (f"  effort passes {effort.passes}" if effort is not None else "")
                + (f"  primed decodes {n}" if (n := getattr(stage, "primed_decodes", 0)) else "")
                + "".join(
                    f"  {'reviser' if key == 'reader' else 'lookback'} passes {bg.passes} "
                    f"({bg.busy_s:.1f} s, {bg.replaced} replaced unread)"
                    for key, bg in background.items()
                )
                + f"  | {res.text[:110]}"
            )
            if args.show_text:
                print(f"    {res.text}")
            rules = _by_rule([row])
            if rules:
                print("    commits by rule: " + ", ".join(
                    f"{k} {v['words']} ({v['p50_s']:.2f} / {v['p95_s']:.2f} s)"
                    for k, v in rules.items()))  # fmt: skip
            if clip.group == first_group and system == systems[0]:
                ev = percentiles(res.event_latencies_s or [0.0])
                first.setdefault("commit_latency_p50_s", []).extend(res.event_latencies_s)
                first["inference_s"] = first.get("inference_s", 0.0) + getattr(
                    stage, "inference_s", 0.0
                )
                del ev
    if word_log is not None:
        word_log.close()
    groups: dict[str, dict[str, Any]] = defaultdict(dict)
    print("\naggregate (WER over all words of the group; word latency pooled over words)")
    for (group, system), group_rows in rows.items():
        groups[group][system] = _agg(group_rows)
        a = groups[group][system]
        print(
            f"{group:8s} {system:13s} WER {a['wer']:6.1%} (first {a['wer_first']:6.1%})  "
            f"word latency p50 {a['word_latency_p50_s']:.2f} s  p95 "
            f"{a['word_latency_p95_s']:.2f} s (final {a['final_latency_p50_s']:.2f} / "
            f"{a['final_latency_p95_s']:.2f} s)  ({a['words']} words, "
            f"{a['revisions']} revisions)"
        )
        if a.get("terms_said"):
            print(f"         slide terms said {a['terms_said']}, the transcript lacks "
                  f"{a['terms_missed']} of them ({a['errors']} word errors)")  # fmt: skip
        if "rules" in a:
            print("         by rule: " + ", ".join(
                f"{k} {v['words']} ({v['p50_s']:.2f} / {v['p95_s']:.2f} s)"
                for k, v in a["rules"].items()))  # fmt: skip
    out: dict[str, Any] = {}
    if first_group and systems:
        g = groups[first_group]
        ev = percentiles(first.get("commit_latency_p50_s") or [0.0])
        out = {
            "wer_streaming": g[systems[0]]["wer"],
            "wer_offline": g.get("offline", {}).get("wer"),
            "commit_latency_p50_s": round(ev["p50"], 3),
            "commit_latency_p95_s": round(ev["p95"], 3),
            "rtf": round(first.get("inference_s", 0.0) / max(1e-9, audio_total[first_group]), 4),
        }
    references = {
        "wer_offline_beam5": "offline-beam5",
        "wer_causal_beam5": "causal-beam5",
        "wer_offline_reviser_beam5": "offline-reviser-beam5",
    }
    out["groups"] = {
        group: {
            **sys_rows,
            **{key: sys_rows[name]["wer"] for key, name in references.items() if name in sys_rows},
        }
        for group, sys_rows in groups.items()
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
