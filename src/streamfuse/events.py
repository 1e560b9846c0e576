"""One event schema: the timeline's event types and a typed payload per type.

An event record (one JSON line, one `EventFrame` rendered by a sink) is an envelope - `type`,
`stream_id`, `t_start`, `t_end`, `latency_ms`, `wall_s`, `id` - plus the fields of its payload.
`EventIds` gives each record an `id` derived from where it sits on the timeline (stream, type,
media start, order), so a rerun of the same input and configuration repeats the same ids. Every
producer builds its payload class and every consumer parses records with `parse_record`, so a
field renamed in one place fails in all. User stages add their own event types by subclassing
`Payload` with a new `type` (`docs/events.md`); `event_json_schema()` is the JSON Schema of
every registered type, committed as `docs/events.schema.json`.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.errors import StreamfuseError


class EventType(StrEnum):
    """The built-in event types."""

    OCR = "ocr"
    ASR = "asr"
    ASR_PARTIAL = "asr_partial"
    ASR_REVISION = "asr_revision"
    LM_TOKEN = "lm_token"
    LM = "lm"
    TEXT = "text"
    GAP = "gap"
    ERROR = "error"
    STATS = "stats"
    LINK = "link"


class EventSchemaError(StreamfuseError, ValueError):
    """A record that does not match the schema of its event type."""


_REGISTRY: dict[str, type[Payload]] = {}


class Payload(BaseModel):
    """Base of every event payload. A subclass sets `type` (class variable) and its fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.type:
            return  # an intermediate base class
        other = _REGISTRY.get(cls.type)
        if other is not None and other.__qualname__ != cls.__qualname__:
            raise TypeError(f"event type {cls.type!r} is already defined by {other.__name__}")
        _REGISTRY[cls.type] = cls

    def fields(self) -> dict[str, Any]:
        """The payload's fields as JSON-ready values (what follows the envelope in a record)."""
        return self.model_dump(mode="json")


# -- the built-in payloads ----------------------------------------------------------------------


class OcrLine(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str
    box: tuple[int, int, int, int] = Field(description="x0, y0, x1, y1 in original pixels.")
    conf: float = Field(
        ge=0.0,
        le=1.0,
        description="Probability that the line is read exactly (spaces aside): the recognizer's "
        "score through the shipped calibrator (docs/calibration.md), or the raw score when "
        "calibration is off.",
    )
    conf_raw: float | None = Field(
        None, ge=0.0, le=1.0, description="The recognizer's own score (None: not calibrated)."
    )
    gap_bridged: float | None = Field(
        None,
        ge=0.0,
        description="The widest gap between two boxes the layout joined into this line (a "
        "table row: inside one cell), in line heights (docs/ocr-layout.md); None: not known.",
    )
    inferred_cuts: int | None = Field(
        None,
        ge=0,
        description="For a table row: how many of its table's column boundaries only word "
        "gutters showed, not a box boundary (docs/ocr-layout.md); None: not known.",
    )


class OcrPayload(Payload):
    """A new text state of the screen (emitted once per distinct reading)."""

    type: ClassVar[str] = EventType.OCR

    lines: list[OcrLine] = Field(description="Lines in reading order.")
    text: str = Field(description="The lines joined by line breaks.")
    n_lines: int = Field(ge=0)
    resolution: tuple[int, int] = Field(description="Detector input (width, height), px.")
    scale: float = Field(gt=0.0, description="Detector pixels per original frame pixel.")
    roi: tuple[int, int, int, int] = Field(description="Region read, original pixels.")
    ocr_ms: float = Field(ge=0.0, description="Wall time of the OCR call itself.")
    mean_conf: float | None = Field(
        description="Mean recognizer score (`conf_raw`) of the lines (None: no text)."
    )
    frame_index: int = Field(ge=0, description="Index of the video frame read.")
    t_changed: float = Field(description="Media time the picture started to change.")
    reason: str = Field(description="Why the change detector made it a key frame.")
    read_by: Literal["edge"] | None = Field(
        None,
        description="'edge': the edge of an edge-cloud split read this text itself from the "
        "original frame and sent the lines (its link could not carry the pixels in time; "
        "docs/edge-cloud.md), `ocr_ms` is its read; None: read by this node's OCR stage.",
    )


class AsrWord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    word: str
    t_start: float
    t_end: float
    p: float = Field(
        ge=0.0,
        le=1.0,
        description="Probability that the word is right: the recognizer's word probability "
        "through the shipped calibrator (docs/calibration.md), or the raw one when calibration "
        "is off.",
    )
    p_raw: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="The recognizer's own word probability (None: not calibrated).",
    )

    @property
    def identity(self) -> tuple[str, float, float]:
        """What an `asr_revision` names a committed word by: its text and times."""
        return (self.word, self.t_start, self.t_end)


#: The rules by which the ASR stage commits words (docs/asr.md, "How words are committed").
AsrCommitRule = Literal[
    "agreement", "age", "pause", "pause_tail", "utterance_end", "trim", "stream_end"
]


class AsrPayload(Payload):
    """Committed speech: words no later hypothesis changes; only the utterance-end pass may
    still correct them, in an `asr_revision` event."""

    type: ClassVar[str] = EventType.ASR

    text: str
    words: list[AsrWord]
    rule: AsrCommitRule | None = Field(
        None,
        description="The rule that committed these words: 'agreement' (two fast hypotheses "
        "agree), 'age' (pending too long), 'pause' (the full-window pass at a pause agrees), "
        "'pause_tail' (a fast pass at a pause, with `pause_commit`), "
        "'utterance_end' (the rest of an utterance at its end), 'trim' (a long buffer cut), "
        "'stream_end' (None: a producer that does not say).",
    )


class AsrRevisionPayload(Payload):
    """A correction of committed speech. At an utterance end the recognizer hears the whole
    utterance at once; where it reads committed words differently, this event replaces them:
    the committed words listed in `replaced` (matched by word and times) give way to `words`.
    Either list may be empty (words the first commits missed, or invented). The envelope spans
    both; `speech_words` applies revisions to a record sequence."""

    type: ClassVar[str] = EventType.ASR_REVISION

    text: str = Field(description="The new words as text.")
    words: list[AsrWord] = Field(description="The words that replace `replaced`.")
    replaced: list[AsrWord] = Field(description="The committed words this event supersedes.")
    replaced_text: str = Field(description="The superseded words as text.")
    model: str | None = Field(
        None,
        description="The model that read `words` when it is not the stream's own: the "
        "background reviser's accurate model (`background_revise`); null for the stream's "
        "model.",
    )


class AsrPartialPayload(Payload):
    """The live, uncommitted hypothesis (replaced by the next one)."""

    type: ClassVar[str] = EventType.ASR_PARTIAL

    text: str


class LmTokenPayload(Payload):
    """New text of a streamed answer."""

    type: ClassVar[str] = EventType.LM_TOKEN

    text: str = Field(description="Text added since the previous lm_token of this request.")
    prompt: str
    request: int = Field(ge=0, description="Engine request id (one per answer).")


class LmPayload(Payload):
    """A finished (or interrupted) answer."""

    type: ClassVar[str] = EventType.LM

    text: str
    prompt: str
    request: int = Field(ge=0)
    finish: str | None = Field(description="Why generation ended (stop, length, interrupted...).")
    interrupted: bool
    n_tokens: int = Field(ge=0)
    context_tokens: int = Field(ge=0, description="Tokens of context the answer saw.")
    ttft_ms: float | None = Field(description="Time to the first token.")
    tok_s: float = Field(ge=0.0, description="Decode speed after the first token.")


class TextPayload(Payload):
    """A message from a text input stream (chat, captions), placed on the timeline."""

    type: ClassVar[str] = EventType.TEXT

    text: str
    author: str | None = Field(None, description="Who wrote it (chat), if known.")
    kind: str = Field("chat", description="What the text stream carries: chat, caption, ...")


class GapPayload(Payload):
    """Media time an input did not deliver (a live feed dropped and came back)."""

    type: ClassVar[str] = EventType.GAP

    reason: str = Field(description="Why the media is missing (e.g. the feed stalled).")
    attempts: int = Field(ge=0, description="Reconnection attempts it took.")


class ErrorPayload(Payload):
    """A failure: the stage it happened in and whether it stopped the stream."""

    type: ClassVar[str] = EventType.ERROR

    stage: str
    message: str
    fatal: bool = False


class LinkPayload(Payload):
    """The state of an edge-cloud link as one end sees it (`streamfuse edge` / `streamfuse
    cloud`): every few seconds of media and once more at the end (`final`). The edge measures
    RTT, loss, bandwidth and what it sent; the cloud counts what arrived, late or damaged.
    Fields one end does not measure are null."""

    type: ClassVar[str] = EventType.LINK

    role: Literal["edge", "cloud"] = Field(description="Which end reports.")
    final: bool = Field(False, description="The end of the stream's last report.")
    transport: Literal["udp", "tcp"] | None = Field(
        None, description="The link's transport: udp, or tcp where UDP is blocked."
    )
    deadline_s: float = Field(gt=0.0, description="A message later than this is dropped.")
    rtt_ms: float | None = Field(None, ge=0.0, description="Smoothed RTT (RFC 6298), edge.")
    rto_ms: float | None = Field(None, ge=0.0, description="Retransmission timeout, edge.")
    loss: float | None = Field(
        None, ge=0.0, le=1.0, description="Share of first copies lost lately, edge."
    )
    bandwidth_bps: float | None = Field(
        None, ge=0.0, description="Bottleneck bandwidth from packet-train dispersion, edge."
    )
    queued_bytes: int | None = Field(
        None, ge=0, description="Bytes sent and not yet acknowledged, edge."
    )
    keep_ratio: float | None = Field(
        None, ge=0.0, le=1.0, description="Patch-grid share of the last key frame sent, edge."
    )
    scale: float | None = Field(
        None, gt=0.0, le=1.0, description="Scale the last key frame was sent at, edge."
    )
    messages: int | None = Field(None, ge=0, description="Messages sent, edge.")
    retransmits: int | None = Field(None, ge=0, description="Fragments resent, edge.")
    expired: int | None = Field(
        None,
        ge=0,
        description="Messages given up unacknowledged (no ACK by their deadline plus one RTO, "
        "at most one deadline, for a late one), edge.",
    )
    abandoned: int | None = Field(
        None,
        ge=0,
        description="Messages withdrawn before all of them were sent (a refinement part a new "
        "key frame overtook): withdrawn, edge; skipped on the edge's notice, cloud.",
    )
    ahead: int | None = Field(
        None,
        ge=0,
        description="Messages delivered ahead of an earlier message of another lane still on "
        "its way (speech not held up by a key frame), cloud.",
    )
    datagrams: int = Field(0, ge=0, description="Datagrams sent (edge) or received (cloud).")
    bytes: int = Field(0, ge=0, description="Bytes sent or received, headers included.")
    malformed: int = Field(0, ge=0, description="Datagrams dropped: bad CRC, bad header.")
    duplicates: int | None = Field(None, ge=0, description="Duplicate datagrams, cloud.")
    reordered: int | None = Field(None, ge=0, description="Datagrams out of order, cloud.")
    late_fragments: int | None = Field(
        None, ge=0, description="Fragments of messages already given up, cloud."
    )
    late_dropped: int | None = Field(
        None, ge=0, description="Messages given up at their deadline, cloud."
    )
    delivered: int | None = Field(None, ge=0, description="Messages delivered, cloud.")
    nacks_sent: int | None = Field(None, ge=0, description="NACKs sent, cloud.")
    foreign: int | None = Field(
        None, ge=0, description="Valid datagrams of another stream or far ahead, cloud."
    )
    undecodable: int | None = Field(
        None, ge=0, description="Messages whose content did not decode, cloud."
    )
    video_messages: int | None = Field(None, ge=0, description="Key frames received, cloud.")
    audio_messages: int | None = Field(None, ge=0, description="Speech chunks received, cloud.")


class StageSnapshot(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    frames: int = Field(ge=0)
    errors: int = Field(ge=0)
    dropped: int = Field(ge=0)
    queue_depth: int = Field(ge=0)
    busy_s: float = Field(ge=0.0)
    latency_ms: dict[str, float] = Field(description="p50 / p95 of per-frame work, ms.")


class StatsPayload(Payload):
    """Run statistics; the last record of a run has `final: true` (its `wall_s` is the
    streaming wall time)."""

    type: ClassVar[str] = EventType.STATS

    final: bool
    realtime: bool
    cpu_s: float = Field(ge=0.0, description="Process CPU time (user + system).")
    stages: dict[str, StageSnapshot]
    interrupted: bool = Field(
        False,
        description="The run was stopped (a signal) before its inputs ended: `streamfuse run "
        "--resume` continues it.",
    )


# -- records --------------------------------------------------------------------------------------

#: The envelope fields every record has, in order (`wall_s` and `id` only from sinks).
ENVELOPE = ("type", "stream_id", "t_start", "t_end", "latency_ms", "wall_s", "id")


class EventRecord(BaseModel):
    """One parsed record: the envelope and the typed payload."""

    model_config = ConfigDict(frozen=True)

    type: str
    stream_id: str
    t_start: float
    t_end: float
    latency_ms: float
    wall_s: float | None = None
    id: str | None = None
    payload: Payload

    def to_json_dict(self) -> dict[str, Any]:
        record = self.model_dump(mode="json", exclude={"payload"}, exclude_none=True)
        record.update(self.payload.fields())
        return record


def payload_class(event_type: str) -> type[Payload]:
    """The payload class registered for `event_type` (raises `EventSchemaError`)."""
    cls = _REGISTRY.get(str(event_type))
    if cls is None:
        known = ", ".join(sorted(_REGISTRY))
        raise EventSchemaError(f"unknown event type {event_type!r} (known: {known})")
    return cls


def registered_types() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def parse_record(record: dict[str, Any]) -> EventRecord:
    """Parse one JSON record into envelope + typed payload; names the bad field on failure."""
    kind = record.get("type")
    if not isinstance(kind, str):
        raise EventSchemaError(f"record has no string 'type': {str(record)[:120]}")
    cls = payload_class(kind)
    fields = {k: v for k, v in record.items() if k not in ENVELOPE}
    try:
        payload = cls.model_validate(fields)
        return EventRecord(payload=payload, **{k: record[k] for k in ENVELOPE if k in record})
    except ValueError as e:
        raise EventSchemaError(f"invalid {kind!r} record: {e}") from e


class EventIds:
    """Gives records ids that depend only on their place on the timeline.

    The id hashes the stream, the event type, the media start time (ms) and the record's rank
    among earlier records of the same stream, type and start time (plus the stage for `error`
    records, whose order across stages is not fixed, and the run number for `stats` records,
    which describe a run rather than the media). A rerun that produces the same events repeats
    the same ids; which runs do is documented in `docs/reliability.md`. One instance per
    record sequence (each sink has one); `run` is the number of earlier runs in the same file
    (`--resume`), so each run's `stats` records get new ids.
    """

    def __init__(self, run: int = 0) -> None:
        self.run = run
        self._rank: Counter[tuple[str, str, int, str]] = Counter()

    def assign(self, record: dict[str, Any]) -> str:
        """Set `record["id"]` (kept if already set) and return it."""
        existing = record.get("id")
        if isinstance(existing, str):
            return existing
        kind = str(record["type"])
        detail = ""
        if kind == EventType.ERROR:
            detail = str(record.get("stage", ""))
        elif kind == EventType.STATS:
            detail = f"run{self.run}"
        key = (str(record["stream_id"]), kind, round(float(record["t_start"]) * 1000.0), detail)
        rank = self._rank[key]
        self._rank[key] += 1
        text = "\x1f".join(str(part) for part in (*key, rank))
        record["id"] = hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
        return str(record["id"])


def speech_words(records: Iterable[EventRecord]) -> list[tuple[AsrWord, EventRecord]]:
    """The final transcript of committed speech: each `asr` word with the record that gave it
    its final form, after `asr_revision` records replaced what they correct; in media order
    per stream. A revision whose `replaced` words are not found (a record sequence cut short)
    removes nothing and still adds its words."""
    out: dict[tuple[str, str, float, float], tuple[AsrWord, EventRecord]] = {}
    for record in records:
        p = record.payload
        if isinstance(p, AsrRevisionPayload):
            for w in p.replaced:
                out.pop((record.stream_id, *w.identity), None)
        if isinstance(p, AsrPayload | AsrRevisionPayload):
            for w in p.words:
                out[(record.stream_id, *w.identity)] = (w, record)
    return sorted(out.values(), key=lambda item: (item[1].stream_id, item[0].t_start))


def join_speech(words: Iterable[AsrWord]) -> str:
    """Payload words as text: a word starting with punctuation (Whisper's "-time", ",000",
    "'s") attaches to the one before, as the recognizer's own text joins them."""
    out: list[str] = []
    for w in words:
        text = w.word
        if out and text and not text[0].isalnum() and text[0] not in '"([{':
            out[-1] += text
        elif text:
            out.append(text)
    return " ".join(out)


def stats_record(payload: StatsPayload, *, t_end: float, wall_s: float) -> dict[str, Any]:
    """The `stats` record of a run: stream `*`, media time 0 to `t_end`, `wall_s` of streaming."""
    record = EventRecord(
        type=payload.type,
        stream_id="*",
        t_start=0.0,
        t_end=round(t_end, 3),
        latency_ms=0.0,
        wall_s=round(wall_s, 3),
        payload=payload,
    )
    return record.to_json_dict()


# -- JSON Schema ----------------------------------------------------------------------------------


def event_json_schema(types: Iterable[str] | None = None) -> dict[str, Any]:
    """The JSON Schema of a record of the given event types (`oneOf` by `type`).

    By default the built-in types (`EventType`): the schema committed as
    `docs/events.schema.json` (regenerate with `python -m streamfuse.events`).
    """
    kinds = sorted(str(kind) for kind in (EventType if types is None else types))
    envelope = {
        "stream_id": {"type": "string", "description": "Input stream the event belongs to."},
        "t_start": {"type": "number", "description": "Media seconds where the content starts."},
        "t_end": {"type": "number", "description": "Media seconds where the content ends."},
        "latency_ms": {
            "type": "number",
            "description": "Arrival of the last input it depends on to emission, ms.",
        },
        "wall_s": {
            "type": "number",
            "description": "Emission time since the pipeline started streaming, s.",
        },
        "id": {
            "type": "string",
            "pattern": "^[0-9a-f]{16}$",
            "description": "Stable id: the same for the same event in a rerun of the same "
            "input and configuration (set by every sink).",
        },
    }
    variants: list[dict[str, Any]] = []
    defs: dict[str, Any] = {}
    for kind in kinds:
        cls = payload_class(kind)
        schema = cls.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(schema.pop("$defs", {}))
        props = {"type": {"const": kind}, **envelope, **schema.get("properties", {})}
        required = ["type", "stream_id", "t_start", "t_end", "latency_ms"]
        required += [r for r in schema.get("required", []) if r not in required]
        variants.append(
            {
                "title": f"{kind} event",
                "description": (cls.__doc__ or "").strip(),
                "type": "object",
                "properties": props,
                "required": required,
                "additionalProperties": False,
            }
        )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "streamfuse event record",
        "oneOf": variants,
        "$defs": defs,
    }


if __name__ == "__main__":
    print(json.dumps(event_json_schema(), indent=2))


__all__ = [
    "ENVELOPE",
    "AsrPartialPayload",
    "AsrCommitRule",
    "AsrPayload",
    "AsrRevisionPayload",
    "AsrWord",
    "ErrorPayload",
    "join_speech",
    "EventRecord",
    "EventIds",
    "EventSchemaError",
    "EventType",
    "LinkPayload",
    "LmPayload",
    "LmTokenPayload",
    "OcrLine",
    "OcrPayload",
    "Payload",
    "StageSnapshot",
    "StatsPayload",
    "event_json_schema",
    "parse_record",
    "payload_class",
    "registered_types",
    "speech_words",
]
