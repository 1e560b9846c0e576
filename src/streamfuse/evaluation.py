"""Scores a run (events JSON Lines) against ground truth.

- OCR CER: for each truth slide, the last `ocr` event whose `t_start` lies inside the slide's
  interval; its lines and the truth lines are each joined with single spaces (whitespace
  collapsed) and compared by character edit distance. A slide with no event counts as fully
  missed. The figure is total edits / total truth characters. Line order counts, and a table
  row is one truth line with its cells in column order joined by " | "
  (`streamfuse.vision.layout.CELL_SEPARATOR`, which the OCR stage writes): a missing
  separator costs 2 characters, a table read column by column costs the moved text
  (docs/ocr-layout.md). Each slide's record carries its `edits` and `chars`.
- ASR WER: the final transcript (committed `asr` words, with the corrections of
  `asr_revision` events applied) against all truth text, both normalized by Whisper's English
  normalizer (case, punctuation, spelled and written numbers), word edit distance / truth words.
  `asr_wer_first` scores the words as first committed (no revision applied).
- Latency: p50 / p95 of `latency_ms` per event type; for realtime runs also the delay from a
  slide appearing on screen to its first `ocr` event, the commit delay of every ASR word (its
  end to its first commit: `asr_word_latency_ms`; to the event that gave it its final form:
  `asr_word_final_latency_ms`) and how long after the end of the stream the last event came
  (`end_lag_s`).
- RTF: processing wall time / media duration (from the run's final `stats` event).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from streamfuse.errors import EvalError
from streamfuse.events import (
    AsrPayload,
    EventRecord,
    EventSchemaError,
    EventType,
    OcrPayload,
    Payload,
    StatsPayload,
    join_speech,
    parse_record,
    registered_types,
    speech_words,
)
from streamfuse.stats import percentiles
from streamfuse.text import char_errors, collapse_whitespace, normalize_english, word_errors

P = TypeVar("P", bound=Payload)


class TruthSlide(BaseModel):
    t_start: float = Field(ge=0)
    t_end: float = Field(ge=0)
    lines: list[str]


class TruthUtterance(BaseModel):
    t_start: float = Field(ge=0)
    t_end: float = Field(ge=0)
    text: str


class Truth(BaseModel):
    duration_s: float = Field(gt=0)
    ocr: list[TruthSlide] = Field(default_factory=list)
    asr: list[TruthUtterance] = Field(default_factory=list)

    @model_validator(mode="after")
    def _intervals(self) -> Truth:
        items: list[TruthSlide | TruthUtterance] = [*self.ocr, *self.asr]
        for item in items:
            if item.t_end < item.t_start:
                raise ValueError(f"interval ends before it starts: {item.t_start}..{item.t_end}")
        return self


def load_truth(path: str | Path) -> Truth:
    p = Path(path)
    try:
        return Truth.model_validate_json(p.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise EvalError(f"truth file not found: {p}") from e
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise EvalError(f"truth file {p} is malformed at {where or 'top'}: {first['msg']}") from e


def load_events(path: str | Path) -> list[EventRecord]:
    """Read events JSON Lines into typed records (`streamfuse.events`).

    A torn last line (a crashed run) is tolerated; any other line that is not JSON, or a record
    of a built-in type that does not fit its schema, is an error naming the line. Records of
    types this process does not know (a user's own stages) are skipped.
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as e:
        raise EvalError(f"events file not found: {p}") from e
    events = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):
                break
            raise EvalError(f"{p}:{i}: not a JSON object: {e.msg}") from e
        if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
            raise EvalError(f"{p}:{i}: expected an event object with a 'type'")
        if ev["type"] not in registered_types():
            continue
        try:
            events.append(parse_record(ev))
        except EventSchemaError as e:
            raise EvalError(f"{p}:{i}: {e}") from e
    return events


def as_records(events: Iterable[EventRecord | dict[str, Any]]) -> list[EventRecord]:
    """Typed records from records or plain dicts (a `CollectSink`'s), unknown types skipped."""
    return [
        e if isinstance(e, EventRecord) else parse_record(e)
        for e in events
        if isinstance(e, EventRecord) or e.get("type") in registered_types()
    ]


def _of(events: list[EventRecord], payload: type[P]) -> list[tuple[EventRecord, P]]:
    return [(e, e.payload) for e in events if isinstance(e.payload, payload)]


def ocr_cer(truth: Truth, events: Iterable[EventRecord | dict[str, Any]]) -> dict[str, Any]:
    ocr = sorted(_of(as_records(events), OcrPayload), key=lambda e: e[0].t_start)
    edits = 0
    chars = 0
    per_slide = []
    for slide in truth.ocr:
        inside = [p for e, p in ocr if slide.t_start <= e.t_start < slide.t_end]
        read = inside[-1].lines if inside else []
        hyp = collapse_whitespace(" ".join(ln.text for ln in read))
        n_edits, n_chars = char_errors(" ".join(slide.lines), hyp)
        edits += n_edits
        chars += n_chars
        per_slide.append(
            {
                "t_start": slide.t_start,
                "cer": n_edits / max(1, n_chars),
                "hyp": hyp,
                "edits": n_edits,
                "chars": n_chars,
            }
        )
    return {"ocr_cer": edits / chars if chars else None, "ocr_slides": per_slide}


def asr_wer(truth: Truth, events: Iterable[EventRecord | dict[str, Any]]) -> dict[str, Any]:
    """WER of the final transcript (revisions applied) and of the words as first committed."""
    ref = normalize_english(" ".join(u.text for u in truth.asr))
    if not ref:
        return {"asr_wer": None}
    records = as_records(events)
    hyp = normalize_english(join_speech(w for w, _ in speech_words(records)))
    edits, words = word_errors(ref, hyp, normalize=False)
    first = normalize_english(join_speech(w for _, p in _of(records, AsrPayload) for w in p.words))
    first_edits, _ = word_errors(ref, first, normalize=False)
    revisions = sum(1 for e in records if e.type == EventType.ASR_REVISION)
    return {
        "asr_wer": edits / words,
        "asr_hyp": hyp,
        "asr_edits": edits,
        "asr_words": words,
        "asr_wer_first": first_edits / words,
        "asr_revisions": revisions,
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    """p50 / p95 rounded to 0.1 ms, and the sample size (never called with no values)."""
    q = {k: round(v, 1) for k, v in percentiles(values).items()}
    return {**q, "n": len(values)}


def latency(events: Iterable[EventRecord | dict[str, Any]]) -> dict[str, dict[str, float]]:
    by_type: dict[str, list[float]] = defaultdict(list)
    for e in as_records(events):
        if e.type != EventType.STATS:
            by_type[e.type].append(e.latency_ms)
    return {t: _quantiles(v) for t, v in sorted(by_type.items())}


def evaluate(truth: Truth, events: Iterable[EventRecord | dict[str, Any]]) -> dict[str, Any]:
    records = as_records(events)
    finals = [(e.wall_s, p) for e, p in _of(records, StatsPayload) if p.final and e.wall_s]
    result: dict[str, Any] = {}
    result.update(ocr_cer(truth, records))
    result.update(asr_wer(truth, records))
    result["latency_ms"] = latency(records)
    result["rtf"] = None
    if not finals:
        return result
    wall_s, stats = finals[-1]
    assert wall_s is not None
    result["rtf"] = round(wall_s / truth.duration_s, 3)
    result["cpu_s"] = stats.cpu_s
    result["realtime"] = stats.realtime
    timed = [e for e in records if e.wall_s is not None and e.type != EventType.STATS]
    if not stats.realtime or not timed:
        return result
    result["end_lag_s"] = round(max(e.wall_s or 0.0 for e in timed) - truth.duration_s, 3)
    ocr = _of(timed, OcrPayload)
    delays = []
    for slide in truth.ocr:
        first = [e for e, _ in ocr if slide.t_start <= e.t_start < slide.t_end]
        if first and first[0].wall_s is not None:
            delays.append((first[0].wall_s - slide.t_start) * 1000.0)
    if delays:
        result["ocr_change_latency_ms"] = _quantiles(delays)
    words = word_commit_delays_ms(timed)
    if words:
        result["asr_word_latency_ms"] = _quantiles(words)
        result["asr_word_final_latency_ms"] = _quantiles(word_commit_delays_ms(timed, final=True))
    return result


def word_commit_delays_ms(
    events: Iterable[EventRecord | dict[str, Any]], *, final: bool = False
) -> list[float]:
    """Per committed word of a realtime run, from its end on the media clock (= the wall clock
    there) to its first commit: the figure streaming-ASR papers report (an event may hold
    several). `final`: per word of the final transcript, to the event that gave it its final
    form (a word an `asr_revision` replaced or added counts from the revision)."""
    records = as_records(events)
    if final:
        pairs = [(e, w) for w, e in speech_words(records)]
    else:
        pairs = [(e, w) for e, p in _of(records, AsrPayload) for w in p.words]
    return [((e.wall_s or 0.0) - w.t_end) * 1000.0 for e, w in pairs if e.wall_s is not None]
