"""The timeline QA set: rules that make questions from truth, answer scoring, committed file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamfuse.lm.evalset import (
    DEFAULT_SET,
    SECOND_CLIPS,
    SECOND_SET,
    answer_correct,
    build_set,
    load_set,
    qa_pairs,
    timeline_text,
)

pytestmark = pytest.mark.unit

TRUTH = {
    "duration_s": 10.0,
    "ocr": [
        {
            "t_start": 0.0,
            "t_end": 5.0,
            "lines": ["Measuring", "mean delay 180 ms", "Lecture 3: Streams"],
        },
        {"t_start": 5.0, "t_end": 10.0, "lines": ["Summary"]},
    ],
    "asr": [
        {
            "t_start": 1.0,
            "t_end": 3.0,
            "text": "The speech model takes the largest part of the time.",
        },
        {"t_start": 6.0, "t_end": 8.0, "text": "When the system is busy, it does less."},
        {"t_start": 8.0, "t_end": 9.0, "text": "Taints and tolerations keep some pods away."},
    ],
}


def test_rules_make_extraction_questions_whose_answers_are_in_the_context() -> None:
    pairs = qa_pairs(TRUTH, "c")
    got = {(p.kind, p.question, p.answer) for p in pairs}
    assert got == {
        ("slide_value", "What is the mean delay?", "180 ms"),
        ("slide_label", "What is Lecture 3 about?", "Streams"),
        ("speech_subject", "What takes the largest part of the time?", "The speech model"),
    }
    context = "".join(timeline_text([TRUTH]))
    assert context.startswith("Live notes.")
    assert "[1.0s] SPEECH: The speech model takes" in context
    for p in pairs:
        assert p.answer in context


def test_answer_scoring_reads_the_first_line_and_ignores_case_and_articles() -> None:
    assert answer_correct(" the Speech model, of course\nmore", "The speech model")
    assert answer_correct(" 180 ms.", "180 ms")
    assert not answer_correct(" 1800 ms", "180 ms")  # whole words, not a substring
    assert not answer_correct("It is\nThe speech model", "The speech model")  # first line only


def test_committed_set_loads_and_every_answer_is_in_its_context() -> None:
    lines, pairs = load_set(DEFAULT_SET)
    context = "".join(lines)
    assert len(pairs) >= 15
    assert {p.kind for p in pairs} == {"slide_value", "slide_label", "speech_subject"}
    for p in pairs:
        assert p.answer in context, p


def test_second_split_uses_other_clips_and_regenerates_identically() -> None:
    """The held-out split shares no clip with the default one and is what the rules make."""
    a = json.loads(DEFAULT_SET.read_text())
    b = json.loads(SECOND_SET.read_text())
    assert not set(a["clips"]) & set(b["clips"])
    root = DEFAULT_SET.parents[3]
    clips = [(Path(c).name.removesuffix(".truth.json"), root / c) for c in SECOND_CLIPS]
    assert build_set(clips) == b
    _, pairs = load_set(SECOND_SET)
    assert len(pairs) >= 8
