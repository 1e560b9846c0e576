"""The event schema: typed payloads round-trip through records, bad records name the problem,
and the committed JSON Schema is the one the code generates and accepts every built-in type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

import jsonschema
import pytest

from streamfuse.events import (
    AsrPartialPayload,
    AsrPayload,
    AsrRevisionPayload,
    AsrWord,
    ErrorPayload,
    EventRecord,
    EventSchemaError,
    EventType,
    GapPayload,
    LinkPayload,
    LmPayload,
    LmTokenPayload,
    OcrLine,
    OcrPayload,
    Payload,
    StageSnapshot,
    StatsPayload,
    TextPayload,
    event_json_schema,
    parse_record,
)

pytestmark = pytest.mark.unit

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "events.schema.json"

EXAMPLES: list[Payload] = [
    LinkPayload(
        role="edge",
        transport="udp",
        deadline_s=1.5,
        rtt_ms=82.5,
        rto_ms=130.0,
        loss=0.04,
        bandwidth_bps=198_000,
        queued_bytes=2400,
        keep_ratio=0.12,
        scale=0.65,
        messages=40,
        retransmits=3,
        expired=0,
        datagrams=61,
        bytes=48_000,
    ),
    LinkPayload(role="cloud", final=True, deadline_s=1.5, late_dropped=1, delivered=39),
    OcrPayload(
        lines=[OcrLine(text="Quarterly results", box=(10, 20, 200, 48), conf=0.97)],
        text="Quarterly results",
        n_lines=1,
        resolution=(960, 544),
        scale=0.5,
        roi=(0, 0, 1920, 1080),
        ocr_ms=84.0,
        mean_conf=0.97,
        frame_index=12,
        t_changed=0.4,
        reason="change",
    ),  # fmt: skip
    AsrPayload(text="hello there", words=[AsrWord(word="hello", t_start=0.1, t_end=0.4, p=0.9)]),
    AsrRevisionPayload(
        text="live",
        words=[AsrWord(word="live", t_start=11.95, t_end=12.17, p=0.78, p_raw=0.8)],
        replaced=[AsrWord(word="line", t_start=11.95, t_end=12.15, p=0.61)],
        replaced_text="line",
    ),
    AsrPartialPayload(text="hello th"),
    LmTokenPayload(text=" yes", prompt="is it?", request=3),
    LmPayload(
        text="yes",
        prompt="is it?",
        request=3,
        finish="stop",
        interrupted=False,
        n_tokens=2,
        context_tokens=40,
        ttft_ms=31.0,
        tok_s=25.0,
    ),  # fmt: skip
    TextPayload(text="what is on the slide?", author="alice"),
    GapPayload(reason="feed stalled", attempts=2),
    ErrorPayload(stage="ocr:talk", message="boom"),
    StatsPayload(
        final=True,
        realtime=False,
        cpu_s=5.5,
        stages={
            "ocr": StageSnapshot(
                frames=9,
                errors=0,
                dropped=1,
                queue_depth=0,
                busy_s=1.2,
                latency_ms={"p50": 80.0, "p95": 120.0},
            )
        },
    ),  # fmt: skip
]


def _record(payload: Payload) -> dict[str, object]:
    envelope = EventRecord(
        type=payload.type, stream_id="talk", t_start=1.0, t_end=2.0, latency_ms=5.0,
        wall_s=2.5, payload=payload,
    )  # fmt: skip
    return envelope.to_json_dict()


def test_every_builtin_type_has_an_example() -> None:
    assert {p.type for p in EXAMPLES} == set(EventType)


@pytest.mark.parametrize("payload", EXAMPLES, ids=lambda p: p.type)
def test_records_round_trip_and_match_the_committed_schema(payload: Payload) -> None:
    record = _record(payload)
    # What a sink writes is plain JSON, and parsing it gives back the same typed payload.
    parsed = parse_record(json.loads(json.dumps(record)))
    assert parsed.payload == payload and parsed.stream_id == "talk"
    jsonschema.validate(record, json.loads(SCHEMA_FILE.read_text()))


def test_committed_schema_is_the_generated_one() -> None:
    committed = json.loads(SCHEMA_FILE.read_text())
    assert committed == event_json_schema(), (
        "docs/events.schema.json is stale: python -m streamfuse.events > docs/events.schema.json"
    )


def test_schema_rejects_what_the_parser_rejects() -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    record = _record(AsrPartialPayload(text="hi"))
    bad = dict(record, text=7)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    with pytest.raises(EventSchemaError, match="'asr_partial'"):
        parse_record(bad)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(dict(record, surprise=1), schema)


def test_bad_records_name_the_problem() -> None:
    with pytest.raises(EventSchemaError, match="unknown event type 'nope'.*known: asr"):
        parse_record({"type": "nope", "stream_id": "s", "t_start": 0, "t_end": 0})
    with pytest.raises(EventSchemaError, match="no string 'type'"):
        parse_record({"stream_id": "s"})
    record = _record(ErrorPayload(stage="x", message="y"))
    del record["message"]
    with pytest.raises(EventSchemaError, match="message"):
        parse_record(record)


def test_user_payload_types_register_once() -> None:
    class Brightness(Payload):
        type: ClassVar[str] = "test_brightness"
        mean: float

    record = _record(Brightness(mean=0.5))
    assert parse_record(record).payload == Brightness(mean=0.5)
    assert "test_brightness" not in json.dumps(event_json_schema())  # built-ins only
    assert "test_brightness" in json.dumps(event_json_schema(["test_brightness"]))
    with pytest.raises(TypeError, match="already defined"):

        class Clash(Payload):
            type: ClassVar[str] = EventType.OCR
