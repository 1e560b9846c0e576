"""The driver's ledger of a stream on a Ray cluster: a replay after a restart delivers only
what lies past the last committed media time, however the replay segments the speech."""

from __future__ import annotations

from typing import Any

import pytest

from streamfuse.scale import Ledger, event_key

pytestmark = pytest.mark.unit


def _asr(*words: tuple[str, float, float]) -> dict[str, Any]:
    return {
        "type": "asr",
        "stream_id": "s",
        "t_start": words[0][1],
        "t_end": words[-1][2],
        "latency_ms": 10.0,
        "text": " ".join(w for w, _, _ in words),
        "words": [{"word": w, "t_start": a, "t_end": b, "p": 0.9} for w, a, b in words],
    }


def _ocr(t: float, text: str) -> dict[str, Any]:
    return {"type": "ocr", "stream_id": "s", "t_start": t, "t_end": t + 0.5, "text": text}


def test_a_replay_cut_differently_adds_only_the_new_words() -> None:
    ledger = Ledger()
    first = [_ocr(0.0, "Title"), _asr(("This", 0.0, 0.3), ("short", 0.3, 0.7))]
    assert [ledger.admit(r) for r in first] == first
    assert ledger.committed_s == 0.7
    # The replay commits "This short test" as one event with slightly shifted word edges.
    replay = [
        _ocr(0.0, "Title"),
        _asr(("This", 0.0, 0.32), ("short", 0.32, 0.74), ("test", 0.74, 1.1)),
        _asr(("covers", 1.1, 1.5)),
        _ocr(2.0, "Next slide"),
    ]
    out = [ledger.admit(r) for r in replay]
    assert out[0] is None
    assert out[1] is not None
    assert out[1]["text"] == "test" and out[1]["t_start"] == 0.74
    assert [w["word"] for w in out[1]["words"]] == ["test"]
    assert out[2] == replay[2] and out[3] == replay[3]
    assert (ledger.delivered, ledger.skipped) == (5, 1)


def test_partials_behind_the_committed_speech_and_repeated_errors_are_dropped() -> None:
    ledger = Ledger()
    ledger.admit(_asr(("one", 0.0, 0.5), ("two", 0.5, 1.0)))
    stale = {"type": "asr_partial", "stream_id": "s", "t_start": 0.0, "t_end": 0.9, "text": "one"}
    fresh = {**stale, "t_start": 1.0, "t_end": 1.4, "text": "three"}
    assert ledger.admit(stale) is None
    assert ledger.admit(fresh) == fresh
    error = {
        "type": "error",
        "stream_id": "s",
        "t_start": 3.0,
        "t_end": 3.0,
        "message": "x",
        "latency_ms": 1.0,
        "wall_s": 2.0,
    }
    assert ledger.admit(error) == error
    assert ledger.admit({**error, "latency_ms": 5.0, "wall_s": 9.0}) is None


def test_a_replayed_partial_or_a_trimmed_event_never_repeats_an_id() -> None:
    ledger = Ledger()
    partial = {
        "id": "p1",
        "type": "asr_partial",
        "stream_id": "s",
        "t_start": 0.5,
        "t_end": 0.9,
        "text": "two",
    }
    first = {**_asr(("one", 0.0, 0.5)), "id": "a1"}
    assert ledger.admit(partial) == partial and ledger.admit(first) == first
    # The replay (after a restart) repeats the partial and cuts the speech differently: its
    # event starts where the delivered one did, so it carries the same id.
    assert ledger.admit(dict(partial)) is None
    longer = {**_asr(("one", 0.0, 0.5), ("two", 0.5, 1.0)), "id": "a1"}
    out = ledger.admit(longer)
    assert out is not None and out["text"] == "two" and out["id"] == "a1+500"


def test_an_event_id_is_its_key() -> None:
    assert event_key({"id": "abc", "type": "ocr", "wall_s": 1}) == "abc"
    assert event_key({"type": "ocr", "wall_s": 1}) == event_key({"type": "ocr", "wall_s": 2})


def _revision(replaced: list[tuple[str, float, float]], words: list[tuple[str, float, float]]):
    return {
        "type": "asr_revision", "stream_id": "s", "t_start": 0.0, "t_end": 1.0,
        "latency_ms": 10.0, "text": " ".join(w for w, _, _ in words),
        "replaced_text": " ".join(w for w, _, _ in replaced),
        "words": [{"word": w, "t_start": a, "t_end": b, "p": 0.9} for w, a, b in words],
        "replaced": [{"word": w, "t_start": a, "t_end": b, "p": 0.9} for w, a, b in replaced],
    }  # fmt: skip


def test_a_revision_is_delivered_only_when_it_corrects_delivered_words() -> None:
    ledger = Ledger()
    ledger.admit(_asr(("This", 0.0, 0.3), ("shirt", 0.3, 0.7)))
    own = _revision([("shirt", 0.3, 0.7)], [("short", 0.3, 0.7)])
    assert ledger.admit(own) == own
    # A replay recognised the same time as "sport" and corrected that: not what was delivered.
    foreign = _revision([("sport", 0.31, 0.72)], [("short", 0.31, 0.72)])
    assert ledger.admit(foreign) is None
    # The delivered revision's words can be corrected again.
    again = _revision([("short", 0.3, 0.7)], [("short test", 0.3, 0.9)])
    assert ledger.admit(again) == again
