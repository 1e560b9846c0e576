"""Answer time-to-first-token in the live LM stage over a long generated lecture (issue 11).

A generated lecture (slides built up in two readings, speech at ~150 words/min, facts a 270M
base model can be asked about) goes through the real timeline stage and the real `LMStage` +
`LMEngine` of each configuration, on a simulated media clock as fast as the CPU allows: idle
media time is skipped, but a question (several per media minute, at seeded random seconds)
arrives at its true offset into whatever work the preceding lines caused, so it waits for a
recompute exactly as it would live. Configurations, interleaved minute by minute in one run so
load drift hits them alike:

- `shipped`: the live default (versioned windows, 2,048-token slot; when they outgrow it the
  oldest windows are cut out and the later ones' KV moved into the gap);
- `recompute`: as shipped before (`truncation.removed_windows: recompute`): everything after a
  dropped window recomputed;
- `nodrop`: versioned windows in a slot as large as the model's context (32,768), so nothing
  is ever dropped and the context grows with the lecture;
- `append`: the appended path (`semantic_windows`), 2,048-token slot, StreamingLLM sink +
  window truncation by the scheduler when it fills (KV moved, nothing recomputed).

A configuration named with `+rev` (e.g. `shipped+rev`) gets the same lecture with the speech
recognizer's corrections added: at a share (`--revise-share`) of sentence ends an
`asr_revision` rewrites one short function word of a sentence that ended within the last
`--revise-lookback` seconds (the ASR stage's lookback revisions, `revise_lookback_s`), so the LM
stage recomputes from that speech window on. Side by side with the same configuration without
it, that is what the revisions cost the LM (prefill tokens per timeline token, TTFT).

Per configuration: TTFT (wall, and process CPU time) p50/p95 per bucket of media minutes, p95
of the last 5 minutes over the first minute's, the context in the slot, how long each line
holds its session, prefill tokens per timeline token, and QA accuracy (the known answer in the
first line of the answer) by the age of the fact asked about, so that speed bought by
forgetting shows. Timings are wall-clock on a possibly shared machine: read ratios within one
run. Why a new script rather than a mode of token_dropping.py: that one times single prefills
offline; this one drives the live stages on a clock, with its own questions and summary. The
last line is one JSON object.

    python benchmarks/lm_live.py [--quick] [--minutes 30] [--configs shipped,recompute,...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.lm_live")

# -- the generated lecture ---------------------------------------------------------------------
TOPICS = [
    "Video decoding", "Audio capture", "Change detection", "Text recognition",
    "Speech recognition", "Timeline fusion", "Prefill cost", "Cache slots", "Speculative drafts",
    "Token dropping", "Bandwidth probing", "Edge and cloud", "Energy budgets", "Fair scheduling",
    "Backpressure", "Tracing", "Confidence calibration", "Subtitle output", "Live dashboards",
    "Cluster placement", "Frame pacing", "Noise robustness", "Slide layout", "Answer streaming",
    "Model loading", "Quantized weights", "Packet loss", "Resolution control", "Load shedding",
    "Failure recovery", "Clock drift", "Key frames", "Priority queues", "Memory budgets",
]  # fmt: skip
# A fact is "The <Name> module <verb> the <things> <when>." (the QA rule takes the first
# lower-case "-s" word as the verb): names and things are used once each, so that a question
# shares distinctive words with exactly one sentence.
NAMES = """Apollo Borealis Cedar Dorado Ember Falcon Granite Harbor Iris Juniper Kestrel Lotus
Meridian Nimbus Orion Pioneer Quartz Raven Sierra Tundra Umber Vega Willow Xenon Yarrow Zephyr
Amber Basalt Cobalt Delta Echo Fjord Gemini Helix Indigo Jasper Kodiak Lumen Magnolia Nova Onyx
Pacific Quasar Redwood Saffron Topaz Ultra Vesper Walnut Yukon Zenith Aurora Beacon Cypress Dune
Everest Fresco Glacier Hazel Ivory Jade Krypton Lagoon Maple Nebula Oasis Prairie Quill Ridge
Sequoia Talon Unity Velvet Wren Yonder Zinnia Atlas Birch Cinder Dawn Elm Flint Grove Heron Inlet
Jetty Kelp Larch Mesa Nectar Opal Pebble Quince Rowan Slate Thistle Upland Vale Wharf Alder
Bramble Coral Drift Eden Frost Gale Hollow""".split()  # noqa: SIM905
THINGS = """checksums thumbnails heartbeats timestamps bitrates glyphs histograms waveforms
spectrograms captions bookmarks cursors snapshots fingerprints footnotes headlines icons invoices
journals kernels ledgers manifests notebooks outlines palettes quotas receipts sketches tickets
vouchers widgets anchors banners budgets calendars diagrams envelopes filters gauges handles
indexes labels magnets needles orbits pebbles quilts ribbons saddles tablets umbrellas valves
wagons acorns barrels candles dolphins engines feathers glaciers harbors islands jackets kettles
lanterns meadows nests oysters pillows quarries rivers statues tunnels violins windmills yachts
zebras apples biscuits carrots dumplings eggs figs grapes honeycombs lemons mangoes noodles olives
peppers radishes salads tomatoes walnuts almonds bagels cookies donuts muffins pretzels comets
planets rockets satellites telescopes asteroids nebulas meteors craters volcanoes""".split()  # noqa: SIM905
VERBS = [
    "buffers", "drops", "merges", "tracks", "sends", "checks", "sorts", "caches", "splits",
    "counts", "rotates", "compresses", "predicts", "measures", "batches", "flushes", "retries",
    "labels",
]  # fmt: skip
WHEN = [
    "every forty milliseconds", "before the next slide appears", "once per second",
    "when the queue fills up", "after each sentence", "at the end of every minute",
    "while the speaker pauses", "for every stream", "in small groups", "on a second thread",
]  # fmt: skip
ADJECTIVES = [
    "audio", "video", "frame", "slide", "speech", "token", "cache", "network", "energy",
    "timeline", "cluster", "model", "packet", "window", "subtitle", "camera", "answer", "prefill",
]  # fmt: skip
MEASURES = [
    ("mean delay", "ms"), ("peak memory", "MB"), ("queue depth", ""), ("error rate", "%"),
    ("frame budget", "ms"), ("hit rate", "%"), ("warm up time", "s"), ("batch size", ""),
]  # fmt: skip
FILLERS = [
    "So let us look at how this works in practice.",
    "Now think about what happens when the stream gets busy.",
    "We will come back to this point in a few minutes.",
    "This is where most of the latency comes from.",
    "Here the numbers on the slide matter more than the words.",
    "If you remember one thing from this part, remember the order of the steps.",
    "Otherwise the whole pipeline would wait for the slowest stage.",
    "In practice we measure it on the machine that runs the stream.",
    "When the load goes up, everything here has to degrade gracefully.",
    "That is the trade off we keep making in this course.",
]
STREAM = "lecture"
WORDS_PER_S = 2.5  # about 150 words per minute
PAUSE_S = 0.6


def lecture(minutes: float, seed: int = 0) -> dict[str, Any]:
    """A lecture's truth in the generated clips' format (`duration_s`, `ocr` slides with their
    `lines`, `asr` sentences with times): a slide every 60-100 s, shown first with its title
    and one line and ~12 s later complete (a build-up the timeline reads as a revision), and
    speech throughout, one fact sentence ("The Cedar module buffers the glyphs ...") in three.
    Every fact, slide key and title is unique, so each question has one answer."""
    rng = random.Random(seed)
    names, things = NAMES[:], THINGS[:]
    keys = [(f"{a} {m}", u) for a, (m, u) in product(ADJECTIVES, MEASURES)]
    for pool in (names, things, keys):
        rng.shuffle(pool)
    duration = 60.0 * minutes
    ocr: list[dict[str, Any]] = []
    asr: list[dict[str, Any]] = []
    t, part = 0.0, 0
    while t < duration:
        part += 1
        end = min(duration, t + rng.uniform(60.0, 100.0))
        title = f"Part {part}: {TOPICS[(part - 1) % len(TOPICS)]}"
        values = []
        for _ in range(3):
            key, unit = keys.pop()
            value = rng.randrange(2, 98) if unit == "%" else rng.randrange(8, 500)
            values.append(f"{key} {value}{unit if unit in ('', '%') else ' ' + unit}")
        t_full = min(end - 1.0, t + 12.0)
        ocr.append({"t_start": round(t, 2), "t_end": round(t_full, 2), "lines": [title, values[0]]})
        ocr.append({"t_start": round(t_full, 2), "t_end": round(end, 2), "lines": [title, *values]})
        ts = t + 1.0
        n = rng.randrange(3)
        while ts < end - 2.0:
            n += 1
            if n % 3 == 0 and names and things:  # one sentence in three states a fact
                verb, when = rng.choice(VERBS), rng.choice(WHEN)
                text = f"The {names.pop()} module {verb} the {things.pop()} {when}."
            else:
                text = rng.choice(FILLERS)
            dur = len(text.split()) / WORDS_PER_S
            if ts + dur > end:
                break
            asr.append({"t_start": round(ts, 2), "t_end": round(ts + dur, 2), "text": text})
            ts += dur + PAUSE_S
        t = end
    return {"duration_s": duration, "ocr": ocr, "asr": asr}


#: What a revision turns a short function word into (a recognizer's typical correction; the
#: facts' names, verbs and things are never touched, so every question keeps its answer).
SWAPS = {"the": "a", "a": "the", "to": "too", "of": "off", "in": "on", "on": "in", "is": "as",
         "it": "at", "at": "it", "we": "he", "for": "four", "and": "an", "an": "and"}  # fmt: skip


def sentence_words(a: dict[str, Any]) -> list[Any]:
    """A truth sentence as committed words, spread evenly over its time."""
    from streamfuse.events import AsrWord

    t0, t1, words = float(a["t_start"]), float(a["t_end"]), a["text"].split()
    step = (t1 - t0) / len(words)
    return [AsrWord(word=w, t_start=round(t0 + i * step, 3), t_end=round(t0 + (i + 1) * step, 3),
                    p=0.9) for i, w in enumerate(words)]  # fmt: skip


def revisions(
    truth: dict[str, Any], stream: str, share: float, lookback_s: float, seed: int = 2
) -> list[tuple[float, Any]]:
    """(media time, EventFrame) of `asr_revision`s: at `share` of the sentence ends, one short
    function word of a sentence that ended within `lookback_s` (the one just ended included) is
    rewritten, the newest form of each word tracked so a later revision names what was
    committed by then."""
    from streamfuse.events import AsrRevisionPayload
    from streamfuse.frames import EventFrame

    rng = random.Random(seed)
    said = [sentence_words(a) for a in truth["asr"]]
    out: list[tuple[float, Any]] = []
    for i, a in enumerate(truth["asr"]):
        t_now = float(a["t_end"])
        if rng.random() >= share:
            continue
        recent = [j for j in range(i + 1) if float(truth["asr"][j]["t_end"]) >= t_now - lookback_s]
        spots = [(j, k) for j in recent for k, w in enumerate(said[j])
                 if w.word.lower().strip(".,") in SWAPS]  # fmt: skip
        if not spots:
            continue
        j, k = rng.choice(spots)
        old = said[j][k]
        bare = old.word.rstrip(".,")
        swap = SWAPS[bare.lower()]
        new_word = (swap.capitalize() if bare[0].isupper() else swap) + old.word[len(bare) :]
        new = old.model_copy(update={"word": new_word})
        said[j][k] = new
        payload = AsrRevisionPayload(text=new.word, words=[new], replaced=[old],
                                     replaced_text=old.word)  # fmt: skip
        frame = EventFrame(stream_id=stream, t_media=old.t_start, t_end=t_now, payload=payload)
        out.append((t_now, frame))
    return out


def timeline_events(
    truth: dict[str, Any], stream: str, *, revised: Sequence[tuple[float, Any]] = ()
) -> list[tuple[float, Any]]:
    """(media time, EventFrame) of the lecture's OCR readings and committed speech, and the
    `revised` corrections (each after the sentence end it comes at)."""
    from streamfuse.events import AsrPayload, OcrLine, OcrPayload
    from streamfuse.frames import EventFrame

    out: list[tuple[float, Any]] = []
    for s in truth["ocr"]:
        t = float(s["t_start"])
        lines = [OcrLine(text=x, box=(0, 40 * i, 600, 40 * i + 30), conf=1.0)
                 for i, x in enumerate(s["lines"])]  # fmt: skip
        payload = OcrPayload(
            lines=lines, text="\n".join(s["lines"]), n_lines=len(lines), resolution=(960, 540),
            scale=0.75, roi=(0, 0, 1280, 720), ocr_ms=1.0, mean_conf=1.0, frame_index=int(t * 30),
            t_changed=t, reason="change",
        )  # fmt: skip
        out.append((t, EventFrame(stream_id=stream, t_media=t, t_end=t + 0.5, payload=payload)))
    for a in truth["asr"]:
        t0, t1 = float(a["t_start"]), float(a["t_end"])
        ev = EventFrame(stream_id=stream, t_media=t0, t_end=t1,
                        payload=AsrPayload(text=a["text"], words=sentence_words(a)))  # fmt: skip
        out.append((t1, ev))  # committed speech arrives when the sentence ends
    out.extend(revised)
    out.sort(key=lambda e: e[0])  # stable: a revision stays after the commit at its time
    return out


@dataclass(frozen=True)
class Question:
    t: float  # media time it is asked
    question: str
    answer: str
    fact_t: float  # media time its fact appeared
    repeat: bool = False  # asked before (first minute only): timed, not scored again


def question_schedule(
    truth: dict[str, Any], minutes: int, per_minute: int, seed: int = 1
) -> list[Question]:
    """`per_minute` questions in every media minute at random seconds, about facts already on
    the timeline (spoken facts, slide titles): half about the last two minutes, half about any
    earlier moment (so forgetting shows)."""
    from streamfuse.lm.evalset import QAPair, qa_pairs

    rng = random.Random(seed)
    pairs: dict[str, QAPair] = {}
    for p in qa_pairs(truth, "lecture"):  # a slide's two readings: the earlier one counts
        # Not slide values: the timeline runs a slide's lines together on one line and the base
        # model paraphrases instead of copying the number (docs/token-dropping.md), so they say
        # nothing about what the context holds.
        if p.kind != "slide_value":
            pairs.setdefault(p.question, p)
    asked: set[str] = set()
    out: list[Question] = []
    for m in range(minutes):
        # The first minute is the acceptance baseline: twice the questions (repeats allowed,
        # not scored twice), from 20 s on, when the first facts are complete.
        n, lo = (2 * per_minute, 20.0) if m == 0 else (per_minute, 3.0)
        times = sorted(rng.uniform(60.0 * m + lo, 60.0 * m + 60.0) for _ in range(n))
        for i, tq in enumerate(times):
            # After the complete slide or the end of the sentence; each question once.
            seen = [p for p in pairs.values() if p.t_s + 14.0 < tq]
            known = [p for p in seen if p.question not in asked] or (seen if m == 0 else [])
            recent = [p for p in known if p.t_s > tq - 120.0]
            choice = recent if (i % 2 == 0 and recent) else known
            if not choice:
                continue
            p = rng.choice(choice)
            repeat = p.question in asked
            asked.add(p.question)
            out.append(Question(tq, p.question, p.answer, p.t_s, repeat))
    return out


# -- driving a stage on a simulated clock ------------------------------------------------------
@dataclass
class Record:
    minute: int
    ttft_ms: float
    ttft_cpu_ms: float  # process CPU time to the first token (both torch threads)
    context_tokens: int  # in the session's slot when the question arrived
    arrived_busy: bool  # the engine was still prefilling context then
    correct: bool | None  # None: a repeated question (not scored twice)
    age_s: float
    answer: str
    question: str


@dataclass
class Run:
    """One configuration's stage, its engine and what it measured."""

    name: str
    stage: Any
    timeline: Any
    stream: str
    #: (media time, EventFrame) this configuration is fed (`+rev`: with the revisions).
    events: list[tuple[float, Any]] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    max_context: int = 0
    # Virtual media time (v0) that corresponds to wall time w0 while the engine works.
    v0: float = 0.0
    w0: float = 0.0
    busy_s: float = 0.0


async def _wait_idle(engine: Any, deadline: float | None = None) -> bool:
    """Until the engine has nothing to do (True) or the wall clock reaches `deadline`."""
    while engine.busy:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.001)
    return True


async def advance(run: Run, t_event: float) -> None:
    """Bring `run` to media time `t_event`: if its engine is busy, wait until it is idle or
    until the wall time that corresponds to `t_event` (then the event arrives mid-work, as
    live); idle media time is skipped."""
    engine = run.stage.engine
    if engine.busy:
        t_busy = time.monotonic()
        await _wait_idle(engine, run.w0 + (t_event - run.v0))
        run.busy_s += time.monotonic() - t_busy
    now = time.monotonic()
    v_now = run.v0 + (now - run.w0)
    if not engine.busy and t_event > v_now:
        run.v0, run.w0 = t_event, now  # skip the idle stretch


async def push(run: Run, frame: Any) -> list[Any]:
    out: list[Any] = []
    async for f in run.timeline.process(frame):
        out.extend([o async for o in run.stage.process(f)])
    return out


async def ask(run: Run, q: Question, minute: int) -> None:
    from streamfuse.events import EventType
    from streamfuse.frames import EventFrame, TextFrame
    from streamfuse.lm.evalset import answer_correct

    engine = run.stage.engine
    context = len(engine.session_context(run.stream))  # what the question will attend to
    busy = engine.busy  # it arrives while lines (or a recompute) are being prefilled
    frame = TextFrame(stream_id=run.stream, t_media=q.t, text=q.question)
    out = await push(run, frame)  # returns once the answer is complete
    ev = next(f for f in out if isinstance(f, EventFrame) and f.type == EventType.LM)
    rec = ev.to_record()
    text = str(rec["text"])
    cpu_ms = 1000.0 * getattr(engine.last_handle, "ttft_cpu_s", float("nan"))
    correct = None if q.repeat else answer_correct(text, q.answer)
    ttft = float(rec["ttft_ms"] or 0.0)
    run.records.append(
        Record(minute, ttft, cpu_ms, context, busy, correct, q.t - q.fact_t, text, q.question)
    )


def timed_engine(model: Any, config: Any) -> Any:
    """The real engine, plus the process CPU seconds from each submission to its first token
    (`handle.ttft_cpu_s`; `last_handle`): work done for the question, much less sensitive than
    wall time to other processes sharing the cores (torch's spinning threads still count)."""
    from streamfuse.lm.engine import LMEngine, RequestHandle

    class TimedEngine(LMEngine):
        last_handle: RequestHandle | None = None
        #: Wall seconds each context feed held its session (submission to finish): what a
        #: question arriving right behind that line would wait (a recompute shows here).
        feed_s: list[float] = []

        def submit(self, request: Any) -> RequestHandle:
            cpu0 = time.process_time()
            idle = not self.busy
            handle = super().submit(request)

            def first(h: Any, new: list[int]) -> None:
                if new and not hasattr(h, "ttft_cpu_s"):
                    h.ttft_cpu_s = time.process_time() - cpu0
                if not new and h.done and idle and request.max_new_tokens == 0:
                    assert h.finished_wall is not None
                    self.feed_s.append(h.finished_wall - h.submitted_wall)

            handle.on_tokens(first)
            self.last_handle = handle
            return handle

    engine = TimedEngine(model, config)
    engine.feed_s = []
    return engine


def make_runs(
    names: Sequence[str],
    model: Any,
    tok: Any,
    events: list[tuple[float, Any]],
    revised: list[tuple[float, Any]],
) -> list[Run]:
    from streamfuse.fusion import TimelineStage
    from streamfuse.lm.config import LMConfig
    from streamfuse.lm.stage import LMStage, LMStageConfig

    threads = model_threads()
    runs = []
    for label in names:
        name, _, extra = label.partition("+")
        if extra not in ("", "rev"):
            raise SystemExit(f"unknown configuration {label!r} (a name, or a name + '+rev')")
        base = {"model": {"threads": threads}}
        if name == "shipped":  # the stage's defaults: 4 slots x 2,048 tokens
            lm = LMConfig.model_validate({**base, "pool": {"num_slots": 4}})
            cfg = LMStageConfig(lm=lm)
        elif name == "recompute":  # as shipped before: what follows a dropped window recomputed
            trunc = {"removed_windows": "recompute"}
            lm = LMConfig.model_validate({**base, "pool": {"num_slots": 4}, "truncation": trunc})
            cfg = LMStageConfig(lm=lm)
        elif name == "nodrop":
            ctx = model.config.max_position_embeddings
            lm = LMConfig.model_validate({**base, "pool": {"num_slots": 1, "max_tokens": ctx}})
            cfg = LMStageConfig(lm=lm)
        elif name == "append":
            lm = LMConfig.model_validate({**base, "pool": {"num_slots": 4}})
            cfg = LMStageConfig(lm=lm, semantic_windows=True)
        else:
            raise SystemExit(f"unknown configuration {name!r}")
        stage = LMStage(cfg, engine=timed_engine(model, cfg.lm), tokenizer=tok, name=f"lm-{label}")
        fed = revised if extra else events
        runs.append(Run(label, stage, TimelineStage(), stream=STREAM, events=fed))
    return runs


_THREADS = 2


def model_threads() -> int:
    return _THREADS


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation (statistics.quantiles needs 2+ values)."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def qa(recs: Sequence[Record]) -> float | None:
    """Share answered correctly (repeated questions not scored); None when none was scored."""
    scored = [r.correct for r in recs if r.correct is not None]
    return round(statistics.mean(scored), 3) if scored else None


def summarize(run: Run, minutes: int, bucket: int, fed_tokens: int) -> dict[str, Any]:
    """Per-bucket TTFT percentiles and the acceptance ratio; `fed_tokens`: the timeline's
    tokens plus the questions' (what a prefill of everything exactly once would cost)."""
    recs = run.records
    first = [r.ttft_ms for r in recs if r.minute == 0]
    last = [r.ttft_ms for r in recs if r.minute >= minutes - 5]
    first_cpu = [r.ttft_cpu_ms for r in recs if r.minute == 0]
    last_cpu = [r.ttft_cpu_ms for r in recs if r.minute >= minutes - 5]
    buckets = []
    for b0 in range(0, minutes, bucket):
        rs = [r for r in recs if b0 <= r.minute < b0 + bucket]
        if not rs:
            continue
        buckets.append({
            "minutes": f"{b0}-{min(minutes, b0 + bucket)}",
            "n": len(rs),
            "ttft_p50_ms": round(pct([r.ttft_ms for r in rs], 0.5), 1),
            "ttft_p95_ms": round(pct([r.ttft_ms for r in rs], 0.95), 1),
            "cpu_p50_ms": round(pct([r.ttft_cpu_ms for r in rs], 0.5), 1),
            "cpu_p95_ms": round(pct([r.ttft_cpu_ms for r in rs], 0.95), 1),
            "context_tokens": round(statistics.mean(r.context_tokens for r in rs)),
            "qa": qa(rs),
        })  # fmt: skip

    def acc(lo: float, hi: float) -> dict[str, Any]:
        rs = [r for r in recs if lo <= r.age_s < hi]
        return {"n": sum(r.correct is not None for r in rs), "acc": qa(rs)}

    engine = run.stage.engine
    p95_first = pct(first, 0.95)
    # How the question's own work grows with the context it attends to (CPU time, least squares).
    slope = intercept = float("nan")
    pts = [(r.context_tokens / 1000, r.ttft_cpu_ms) for r in recs if not r.arrived_busy]
    if len({x for x, _ in pts}) > 1:
        slope, intercept = statistics.linear_regression(*zip(*pts, strict=True))
    return {
        "config": run.name,
        "questions": len(recs),
        "ttft_p95_first_ms": round(p95_first, 1),
        "ttft_p95_last5_ms": round(pct(last, 0.95), 1),
        "p95_ratio_last5_first": round(pct(last, 0.95) / p95_first, 2) if first else None,
        "p50_ratio_last5_first": round(pct(last, 0.5) / pct(first, 0.5), 2) if first else None,
        "cpu_p95_ratio_last5_first": (
            round(pct(last_cpu, 0.95) / pct(first_cpu, 0.95), 2) if first_cpu else None
        ),
        "ttft_max_ms": round(max(r.ttft_ms for r in recs), 1) if recs else None,
        "context_tokens_last": recs[-1].context_tokens if recs else 0,
        "context_tokens_max": max((r.context_tokens for r in recs), default=0),
        "qa": qa(recs),
        "qa_by_age": {"<2min": acc(0, 120), "2-10min": acc(120, 600), ">10min": acc(600, 1e9)},
        "arrived_busy": sum(r.arrived_busy for r in recs),
        "cpu_ms_at_0_context": round(intercept, 1),
        "cpu_ms_per_1k_context": round(slope, 1),
        "feed_wait_p99_ms": round(1000 * pct(engine.feed_s, 0.99), 1),
        "feed_wait_max_ms": round(1000 * max(engine.feed_s, default=0.0), 1),
        "prefill_tokens": engine.stats.prefill_tokens,
        "prefill_per_context_token": round(engine.stats.prefill_tokens / max(1, fed_tokens), 2),
        "moved_tokens": engine.stats.moved_tokens,
        "truncations": engine.stats.truncations,
        "engine_busy_s": round(run.busy_s, 1),
        "buckets": buckets,
    }


async def drive(
    runs: list[Run],
    questions: list[Question],
    minutes: int,
    progress: Callable[[int], None],
) -> None:
    for run in runs:
        await run.stage.setup()
    timelines = {}
    for run in runs:
        timeline: list[tuple[float, int, Any]] = [(t, 0, e) for t, e in run.events]
        timeline += [(q.t, 1, q) for q in questions]
        timeline.sort(key=lambda x: (x[0], x[1]))  # stable: events keep their order
        timelines[run.name] = timeline
    try:
        for m in range(minutes):
            for run in runs:  # interleaved by media minute: load drift hits them alike
                todo = [x for x in timelines[run.name] if 60.0 * m <= x[0] < 60.0 * (m + 1)]
                # Resume the run's clock where its last minute's work ended (if that ran past
                # the minute, the next events queue behind it, as live).
                run.v0, run.w0 = max(60.0 * m, run.v0), time.monotonic()
                for t, kind, item in todo:
                    await advance(run, t)
                    if kind == 0:
                        await push(run, item)
                    else:
                        await ask(run, item, m)
                t_busy = time.monotonic()
                await _wait_idle(run.stage.engine)
                run.busy_s += time.monotonic() - t_busy
                run.v0 += time.monotonic() - run.w0  # the media time its work reached
            progress(m)
    finally:
        for run in runs:
            await run.stage.teardown()


def timeline_tokens(events: list[tuple[float, Any]], tok: Any) -> int:
    """Tokens of the timeline's lines as the timeline stage writes them (final versions)."""
    from streamfuse.fusion import TimelineStage

    async def lines() -> dict[str, str]:
        stage, out = TimelineStage(), {}
        for _, ev in events:
            async for f in stage.process(ev):
                if f.text:
                    out[f.window] = f.text
        return out

    return sum(len(tok.encode(t)) for t in asyncio.run(lines()).values())


def warm_up(model: Any, tok: Any) -> None:
    """One prompt through a throwaway engine: first-call allocations stay out of minute 0."""
    from streamfuse.lm.config import LMConfig
    from streamfuse.lm.engine import LMEngine

    engine = LMEngine(model, LMConfig.model_validate({"pool": {"num_slots": 1}}))
    ids = tok.encode("Live notes.\n" + " ".join(FILLERS) * 3 + "\nQuestion: What?\nAnswer:")
    engine.generate(ids, 8)


def main() -> None:
    global _THREADS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="10 media minutes, 3 questions each (past the first trims of the slot)",
    )
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--per-minute", type=int, default=4, help="questions per media minute")
    ap.add_argument("--bucket", type=int, default=5, help="media minutes per reported bucket")
    ap.add_argument("--configs", default="shipped,recompute,nodrop,append")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--revise-share",
        type=float,
        default=0.5,
        help="`+rev` configurations: share of sentence ends that revise a recent sentence",
    )
    ap.add_argument(
        "--revise-lookback", type=float, default=20.0, help="how far back a revision reaches, s"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    minutes = 10 if args.quick else args.minutes
    per_minute = 3 if args.quick else args.per_minute
    bucket = 2 if args.quick else args.bucket
    _THREADS = args.threads

    import torch

    from streamfuse.lm.config import ModelConfig
    from streamfuse.lm.loader import load_model
    from streamfuse.testing.machine import cpu_description

    t_start = time.perf_counter()
    log.info("CPU: %s; torch %s, %d threads", cpu_description(), torch.__version__, args.threads)
    model, tok = load_model(ModelConfig(weights="int8", threads=args.threads))
    assert tok is not None
    log.info("kernel path: %s", "fused C++ int8 kernels" if model.fused else "eager torch ops")
    truth = lecture(minutes, seed=args.seed)
    events = timeline_events(truth, STREAM)
    revised = revisions(truth, STREAM, args.revise_share, args.revise_lookback, seed=args.seed + 2)
    revised_events = timeline_events(truth, STREAM, revised=revised)
    questions = question_schedule(truth, minutes, per_minute, seed=args.seed + 1)
    log.info("lecture: %d media minutes, %d slide readings, %d sentences, %d questions; "
             "%d revisions for `+rev` configurations", minutes, len(truth["ocr"]),
             len(truth["asr"]), len(questions), len(revised))  # fmt: skip
    torch.set_num_threads(args.threads)
    warm_up(model, tok)
    runs = make_runs(args.configs.split(","), model, tok, events, revised_events)

    def progress(m: int) -> None:
        parts = []
        for run in runs:
            rs = [r for r in run.records if r.minute == m]
            ttft = ",".join(f"{r.ttft_ms:.0f}" for r in rs)
            ctx = rs[-1].context_tokens if rs else 0
            parts.append(f"{run.name}: ttft [{ttft}] ms ctx {ctx}")
        log.info("[%6.1f s] minute %d  %s", time.perf_counter() - t_start, m, "; ".join(parts))

    asyncio.run(drive(runs, questions, minutes, progress))
    asked = sum(len(tok.encode(f"\nQuestion: {q.question}\nAnswer:")) for q in questions)
    results = [
        summarize(run, minutes, bucket, timeline_tokens(run.events, tok) + asked) for run in runs
    ]
    nan = float("nan")
    log.info("\n%-9s %7s %4s %8s %8s %8s %8s %8s %6s", "config", "minutes", "n", "p50 ms",
             "p95 ms", "cpu p50", "cpu p95", "context", "QA")  # fmt: skip
    for res in results:
        for b in res["buckets"]:
            log.info("%-9s %7s %4d %8.0f %8.0f %8.0f %8.0f %8d %6.2f", res["config"], b["minutes"],
                     b["n"], b["ttft_p50_ms"], b["ttft_p95_ms"], b["cpu_p50_ms"], b["cpu_p95_ms"],
                     b["context_tokens"], b["qa"] if b["qa"] is not None else nan)  # fmt: skip
    for res in results:
        log.info("%s: p95 last 5 min / first minute = %s (p50 %s), max %s ms, QA %s by age %s, "
                 "prefill %.2f tokens per timeline token, %d questions arrived mid-prefill, "
                 "a line holds its session p99 %s ms, max %s ms; question CPU ms = %s + %s per "
                 "1k context tokens",
                 res["config"], res["p95_ratio_last5_first"], res["p50_ratio_last5_first"],
                 res["ttft_max_ms"], res["qa"], res["qa_by_age"],
                 res["prefill_per_context_token"], res["arrived_busy"], res["feed_wait_p99_ms"],
                 res["feed_wait_max_ms"], res["cpu_ms_at_0_context"],
                 res["cpu_ms_per_1k_context"])  # fmt: skip
    by = {r["config"]: r for r in results}
    summary: dict[str, Any] = {
        f"ttft_p95_ratio_{name}": by[name]["p95_ratio_last5_first"] for name in by
    }
    summary.update({f"ttft_cpu_p95_ratio_{k}": by[k]["cpu_p95_ratio_last5_first"] for k in by})
    summary.update({f"qa_{name}": by[name]["qa"] for name in by})
    summary.update({f"feed_wait_max_ms_{name}": by[name]["feed_wait_max_ms"] for name in by})
    summary.update({f"context_tokens_{name}": by[name]["context_tokens_last"] for name in by})
    summary.update({f"prefill_per_token_{k}": by[k]["prefill_per_context_token"] for k in by})
    summary.update({
        "media_minutes": minutes,
        "questions_per_minute": per_minute,
        "kernel_path": "fused" if model.fused else "eager",
        "cpu": cpu_description(),
        "threads": args.threads,
        "revisions": len(revised) if any("+" in r.name for r in runs) else 0,
        "quick": args.quick,
        "wall_s": round(time.perf_counter() - t_start, 1),
    })  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps({"summary": summary, "results": results,
                                        "records": {r.name: [vars(x) for x in r.records]
                                                    for r in runs}}, indent=1))  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
