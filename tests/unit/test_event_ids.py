"""Stable event ids: a record's id depends only on its place on the timeline, so the same
events in a rerun get the same ids, and no two records of one sequence share one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from streamfuse.events import AsrPayload, EventIds, parse_record
from streamfuse.frames import ErrorFrame, EventFrame
from streamfuse.sinks import CollectSink

pytestmark = pytest.mark.unit

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "events.schema.json").read_text()
)


def _rec(kind: str, t: float, stream: str = "s", **extra: Any) -> dict[str, Any]:
    return {"type": kind, "stream_id": stream, "t_start": t, "t_end": t, "latency_ms": 1.0, **extra}


def _timeline() -> list[dict[str, Any]]:
    return [
        _rec("ocr", 0.0),
        _rec("asr_partial", 0.5),
        _rec("asr_partial", 0.5),  # same stream, type and time: told apart by rank
        _rec("asr", 0.5),
        _rec("asr", 0.5, stream="other"),
        _rec("error", 2.0, stage="ocr:s"),
        _rec("stats", 0.0, stream="*"),
    ]


def test_same_timeline_same_ids_and_all_distinct() -> None:
    ids, rerun = EventIds(), EventIds()
    first = [ids.assign(r) for r in _timeline()]
    again = [rerun.assign(r) for r in _timeline()]
    assert first == again
    assert len(set(first)) == len(first)


def test_id_ignores_wall_clock_fields_and_content() -> None:
    a = EventIds().assign(_rec("asr", 1.25, latency_ms=10.0, wall_s=1.0, text="hello"))
    b = EventIds().assign(_rec("asr", 1.25, latency_ms=999.0, wall_s=7.0, text="hullo"))
    assert a == b
    assert a != EventIds().assign(_rec("asr", 1.26))


def test_errors_of_two_stages_keep_their_ids_whatever_the_order() -> None:
    x, y = _rec("error", 3.0, stage="ocr:s"), _rec("error", 3.0, stage="asr:s")
    ids = EventIds()
    forward = (ids.assign(dict(x)), ids.assign(dict(y)))
    ids = EventIds()
    backward = (ids.assign(dict(y)), ids.assign(dict(x)))
    assert forward == backward[::-1]


def test_each_run_in_a_file_has_its_own_stats_ids_and_a_set_id_is_kept() -> None:
    assert EventIds(run=0).assign(_rec("stats", 0.0)) != EventIds(run=1).assign(_rec("stats", 0.0))
    assert EventIds().assign(_rec("ocr", 1.0, id="0123456789abcdef")) == "0123456789abcdef"


def test_sinks_set_ids_on_graph_and_outside_records_and_they_parse() -> None:
    sink = CollectSink()
    frame = EventFrame(
        stream_id="s", t_media=1.0, t_end=1.5, payload=AsrPayload(text="hi", words=[])
    )

    async def feed() -> None:
        async for _ in sink.process(frame):
            pass
        async for _ in sink.process(ErrorFrame(stream_id="s", stage="input", message="x")):
            pass

    asyncio.run(feed())
    sink.emit(_rec("stats", 0.0, stream="*", final=True, realtime=False, cpu_s=0.0, stages={}))
    ids = [r["id"] for r in sink.records]
    assert len(set(ids)) == 3
    for record in sink.records:
        jsonschema.validate(record, SCHEMA)
        assert parse_record(record).id == record["id"]
