from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamfuse.errors import EvalError
from streamfuse.evaluation import evaluate, load_events, load_truth
from streamfuse.events import (
    AsrPayload,
    AsrRevisionPayload,
    AsrWord,
    EventRecord,
    OcrLine,
    OcrPayload,
    Payload,
    StatsPayload,
    join_speech,
    speech_words,
)

pytestmark = pytest.mark.unit

TRUTH = {
    "duration_s": 20.0,
    "ocr": [
        {"t_start": 0.0, "t_end": 10.0, "lines": ["Lecture 3", "Streaming inference"]},
        {"t_start": 10.0, "t_end": 20.0, "lines": ["Latency budget 300 ms"]},
    ],
    "asr": [
        {"t_start": 1.0, "t_end": 4.0, "text": "Welcome to lecture three."},
        {"t_start": 11.0, "t_end": 14.0, "text": "The budget is 300 milliseconds!"},
    ],
}


def _record(payload: Payload, t: float, t_end: float, latency: float, wall: float) -> dict:
    return EventRecord(
        type=payload.type, stream_id="talk", t_start=t, t_end=t_end, latency_ms=latency,
        wall_s=wall, payload=payload,
    ).to_json_dict()  # fmt: skip


def _ocr(t: float, lines: list[str], latency: float, wall: float) -> dict:
    payload = OcrPayload(
        lines=[OcrLine(text=x, box=(0, 0, 1, 1), conf=0.9) for x in lines],
        text="\n".join(lines), n_lines=len(lines), resolution=(640, 352), scale=0.5,
        roi=(0, 0, 1280, 704), ocr_ms=50.0, mean_conf=0.9, frame_index=0, t_changed=t,
        reason="change",
    )  # fmt: skip
    return _record(payload, t, t, latency, wall)


def _asr(t: float, text: str, latency: float) -> dict:
    words = text.split()
    payload = AsrPayload(
        text=text,
        words=[
            AsrWord(word=w, t_start=t + i / len(words), t_end=t + (i + 1) / len(words), p=1)
            for i, w in enumerate(words)
        ],
    )
    return _record(payload, t, t + 1, latency, t + 2)


def _write(tmp_path: Path, events: list[dict], truth: dict = TRUTH) -> tuple[Path, Path]:
    t = tmp_path / "truth.json"
    t.write_text(json.dumps(truth))
    e = tmp_path / "events.jsonl"
    e.write_text("".join(json.dumps(x) + "\n" for x in events))
    return t, e


def test_scores_cer_wer_latency_and_rtf(tmp_path: Path) -> None:
    events = [
        _ocr(0.2, ["Lecture 3", "Streaming inferense"], 400, 0.6),  # 1 char wrong of 29
        _ocr(10.1, ["Latency budget"], 300, 10.5),  # superseded by the next event
        _ocr(10.4, ["Latency budget 300 ms"], 500, 10.9),
        _asr(1.0, "welcome to lecture 3", 900),
        _asr(11.0, "the budget is three hundred milliseconds", 1500),
        _record(StatsPayload(final=True, realtime=True, cpu_s=9.0, stages={}), 0, 20, 0, 21.0),
        {"type": "brightness_of_a_user_stage", "t_start": 3.0, "mean": 0.4},  # skipped
    ]
    truth, ev = _write(tmp_path, events)
    r = evaluate(load_truth(truth), load_events(ev))
    assert r["ocr_cer"] == pytest.approx(1 / (29 + 21), abs=1e-9)
    assert r["asr_wer"] == pytest.approx(0.0)  # numbers and punctuation normalized
    assert r["latency_ms"]["ocr"]["p50"] == 400
    assert r["latency_ms"]["asr"]["n"] == 2
    assert r["rtf"] == pytest.approx(21.0 / 20.0)
    assert r["end_lag_s"] == pytest.approx(13.0 - 20.0)
    # From slide appearance (media time = wall time in a realtime run) to the first ocr event.
    assert r["ocr_change_latency_ms"]["n"] == 2
    assert r["ocr_change_latency_ms"]["p50"] == pytest.approx(550.0)
    # 4 + 6 words, committed 1 s after each event's last word: every word waited 1-2 s.
    assert r["asr_word_latency_ms"]["n"] == 10
    assert 1000.0 < r["asr_word_latency_ms"]["p50"] < 2000.0


def test_missed_slide_counts_fully_and_wrong_words_count(tmp_path: Path) -> None:
    events = [_ocr(0.2, ["Lecture 3", "Streaming inference"], 1, 1), _asr(1, "welcome to", 1)]
    truth, ev = _write(tmp_path, events)
    r = evaluate(load_truth(truth), load_events(ev))
    assert r["ocr_cer"] == pytest.approx(21 / 50)
    assert r["asr_wer"] > 0.7
    assert r["rtf"] is None


def test_torn_last_line_is_tolerated_but_garbage_is_not(tmp_path: Path) -> None:
    _, ev = _write(tmp_path, [_asr(1, "hello", 1)])
    ev.write_text(ev.read_text() + '{"type": "ocr", "t_sta')
    assert len(load_events(ev)) == 1
    ev.write_text('not json\n{"type": "asr"}\n')
    with pytest.raises(EvalError, match="events.jsonl:1"):
        load_events(ev)


def test_a_record_off_its_schema_is_named_with_its_line(tmp_path: Path) -> None:
    bad = dict(_asr(1, "hello", 1), words="hello")
    _, ev = _write(tmp_path, [_asr(0, "hi", 1), bad])
    with pytest.raises(EvalError, match=r"(?s)events.jsonl:2: invalid 'asr' record.*words"):
        load_events(ev)


def test_malformed_truth_is_named(tmp_path: Path) -> None:
    bad = dict(TRUTH, ocr=[{"t_start": 0.0, "lines": []}])
    truth, _ = _write(tmp_path, [], bad)
    with pytest.raises(EvalError, match=r"malformed at ocr\.0\.t_end"):
        load_truth(truth)
    with pytest.raises(EvalError, match="not found"):
        load_truth(tmp_path / "missing.json")


def test_revisions_are_applied_and_scored_with_first_commits_and_final_latency(
    tmp_path: Path,
) -> None:
    """The WER is the final transcript's (an `asr_revision` replaced a misheard word);
    `asr_wer_first` the words as first committed; a corrected word's final latency runs to
    the revision."""
    first = _asr(11.0, "the budget is three hundred seconds", 1500)
    wrong = AsrWord(**first["words"][-1])
    fixed = AsrWord(word="milliseconds", t_start=wrong.t_start, t_end=wrong.t_end, p=0.9)
    revision = _record(
        AsrRevisionPayload(text="milliseconds", words=[fixed], replaced=[wrong],
                           replaced_text="seconds"),
        wrong.t_start, wrong.t_end, 2000, 16.0,
    )  # fmt: skip
    final = _record(StatsPayload(final=True, realtime=True, cpu_s=9.0, stages={}), 0, 20, 0, 21.0)
    events = [_asr(1.0, "welcome to lecture 3", 900), first, revision, final]
    truth, ev = _write(tmp_path, events)
    r = evaluate(load_truth(truth), load_events(ev))
    assert r["asr_wer"] == pytest.approx(0.0)
    assert r["asr_wer_first"] == pytest.approx(1 / 9)  # "300 seconds": one word wrong of 9
    assert r["asr_revisions"] == 1
    assert r["asr_word_latency_ms"]["n"] == r["asr_word_final_latency_ms"]["n"] == 10
    # The corrected word waited from its end (12 s) to the revision (16 s).
    assert r["asr_word_final_latency_ms"]["p95"] > r["asr_word_latency_ms"]["p95"]


def test_speech_words_applies_revisions_in_order_and_keeps_unmatched_additions() -> None:
    def rec(payload: Payload) -> EventRecord:
        return EventRecord(type=payload.type, stream_id="s", t_start=0, t_end=1, latency_ms=0,
                           payload=payload)  # fmt: skip

    a = AsrWord(word="real", t_start=0.0, t_end=0.3, p=1)
    b = AsrWord(word="-time", t_start=0.3, t_end=0.5, p=1)
    c = AsrWord(word="pipe", t_start=0.5, t_end=0.9, p=1)
    d = AsrWord(word="pipelines", t_start=0.5, t_end=1.0, p=1)
    ghost = AsrWord(word="never", t_start=5.0, t_end=5.2, p=1)
    extra = AsrWord(word="today", t_start=1.1, t_end=1.4, p=1)
    records = [
        rec(AsrPayload(text="real-time pipe", words=[a, b, c])),
        rec(AsrRevisionPayload(text="pipelines", words=[d], replaced=[c], replaced_text="pipe")),
        rec(AsrRevisionPayload(text="today", words=[extra], replaced=[ghost], replaced_text="")),
    ]
    words = speech_words(records)
    assert [w.word for w, _ in words] == ["real", "-time", "pipelines", "today"]
    assert join_speech(w for w, _ in words) == "real-time pipelines today"
    assert words[2][1] is records[1]
