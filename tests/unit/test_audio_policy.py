"""LocalAgreement-2 on scripted hypotheses: prefix commits, no duplicates after trims, flush."""

from __future__ import annotations

import pytest

from streamfuse.audio.policy import LocalAgreement, Word, join_words

pytestmark = pytest.mark.unit


def hyp(*items: tuple[str, float, float]) -> list[Word]:
    return [Word(w, a, b, 0.9) for w, a, b in items]


def test_commits_longest_common_prefix_of_two_hypotheses() -> None:
    la = LocalAgreement()
    assert la.insert(hyp(("The", 0.0, 0.2), ("cat", 0.2, 0.5))) == []
    committed = la.insert(hyp(("the", 0.0, 0.2), ("cat", 0.2, 0.5), ("sat", 0.5, 0.8)))
    assert [w.word for w in committed] == ["the", "cat"]
    assert [w.word for w in la.pending] == ["sat"]
    # The tail changed: nothing more is committed until two hypotheses agree again.
    assert la.insert(hyp(("the", 0.0, 0.2), ("cat", 0.2, 0.5), ("sang", 0.5, 0.8))) == []
    committed = la.insert(
        hyp(("the", 0.0, 0.2), ("cat", 0.2, 0.5), ("sang,", 0.5, 0.8), ("loud", 0.8, 1.0))
    )
    assert [w.word for w in committed] == ["sang,"]  # punctuation and case do not matter
    assert la.committed_end == pytest.approx(0.8)


def test_no_duplicates_when_committed_words_reappear_with_jitter() -> None:
    la = LocalAgreement()
    la.insert(hyp(("one", 0.0, 0.3), ("two", 0.3, 0.6)))
    la.insert(hyp(("one", 0.0, 0.3), ("two", 0.3, 0.6), ("three", 0.6, 0.9)))
    # After a trim at 0.6 s the model sees "two" again, shifted later by timestamp jitter.
    words = hyp(("two", 0.55, 0.7), ("three", 0.7, 0.95), ("four", 0.95, 1.2))
    assert [w.word for w in la.new_words(words)] == ["three", "four"]
    committed = la.insert(words)
    assert [w.word for w in committed] == ["three"]
    all_committed = ["one", "two", "three"]
    assert la.committed_end == pytest.approx(0.95)
    rest = la.commit_all(hyp(("three", 0.7, 0.95), ("four", 0.95, 1.2), ("five", 1.2, 1.5)))
    assert [w.word for w in rest] == ["four", "five"]
    assert all_committed + [w.word for w in rest] == ["one", "two", "three", "four", "five"]


def test_real_repeats_after_the_commit_are_kept() -> None:
    la = LocalAgreement()
    la.commit_all(hyp(("stop", 0.0, 0.4)))
    # Same word again, well after the committed one ended: a real repetition.
    assert [w.word for w in la.new_words(hyp(("stop", 1.5, 1.9)))] == ["stop"]


def test_words_before_the_commit_point_are_dropped_by_time() -> None:
    la = LocalAgreement()
    la.commit_all(hyp(("alpha", 0.0, 0.5), ("beta", 0.5, 1.0)))
    # A hypothesis over a buffer that still holds committed audio: different words there
    # (the model changed its mind) are not committed again.
    new = la.new_words(hyp(("alfa", 0.0, 0.5), ("better", 0.5, 1.0), ("gamma", 1.0, 1.4)))
    assert [w.word for w in new] == ["gamma"]


def test_commit_all_without_hypothesis_commits_pending_and_clears() -> None:
    la = LocalAgreement()
    la.insert(hyp(("a", 0.0, 0.2), ("b", 0.2, 0.4)))
    assert join_words(la.commit_all()) == "a b"
    assert la.pending == []
    assert la.commit_all() == []


def test_commit_until_commits_only_words_ending_before_the_cut() -> None:
    la = LocalAgreement()
    la.insert(hyp(("a", 0.0, 1.0), ("b", 1.0, 2.0), ("c", 2.0, 3.0)))
    assert [w.word for w in la.commit_until(2.0)] == ["a", "b"]
    assert [w.word for w in la.pending] == ["c"]
    assert la.committed_end == pytest.approx(2.0)


def test_streamed_hypotheses_commit_every_word_exactly_once() -> None:
    script = [(f"w{i}", 0.3 * i, 0.3 * i + 0.25) for i in range(30)]
    la = LocalAgreement()
    committed: list[Word] = []
    buf_t0 = 0.0
    for step in range(1, 40):
        end = 0.25 * step
        # Hypothesis of the buffer [buf_t0, end): words fully inside, with +-40 ms jitter.
        jitter = 0.04 if step % 2 else -0.04
        words = [
            Word(w, max(buf_t0, a + jitter), b + jitter)
            for w, a, b in script
            if a >= buf_t0 - 0.05 and b <= end
        ]
        committed += la.insert(words)
        if step % 10 == 0 and la.committed_end > buf_t0:
            buf_t0 = la.committed_end  # trim the buffer at the last commit
    committed += la.commit_all()
    assert [w.word for w in committed] == [w for w, _, _ in script]


def test_join_words_attaches_whisper_continuations() -> None:
    from streamfuse.audio.policy import join_words

    words = [Word(" real", 0, 1), Word("-time", 1, 2), Word(" it", 2, 3), Word("'s", 3, 4)]
    assert join_words(words) == "real-time it's"
    assert join_words([Word("hello", 0, 1), Word("world", 1, 2)]) == "hello world"


def test_an_unsure_or_too_recent_word_stops_the_agreed_prefix() -> None:
    la = LocalAgreement()
    first = [Word("the", 0.0, 0.2, 0.9), Word("eigen", 0.2, 0.5, 0.3), Word("value", 0.5, 0.8)]
    la.insert(first)
    # "eigen" is agreed on but unsure: it and all after it wait.
    assert [w.word for w in la.insert(first, min_p=0.5)] == ["the"]
    assert [w.word for w in la.pending] == ["eigen", "value"]
    # Confirmed with confidence later, the rest commits; `before` holds back the newest word.
    sure = [Word("eigen", 0.2, 0.5, 0.8), Word("value", 0.5, 0.8, 0.9), Word("is", 0.8, 1.0)]
    assert [w.word for w in la.insert(sure, min_p=0.5, before=0.6)] == ["eigen"]
    assert [w.word for w in la.insert(sure, min_p=0.5)] == ["value", "is"]


@pytest.mark.parametrize("carry", [False, True])
def test_a_hypothesis_that_stops_short_keeps_the_pending_words_with_carry(carry: bool) -> None:
    la = LocalAgreement(carry=carry)
    la.insert(hyp(("the", 0.0, 0.2), ("cat", 0.2, 0.5), ("sat", 0.5, 0.8), ("down", 0.8, 1.1)))
    # A truncated reading (noise: Whisper heard only the first word) says nothing of the rest.
    committed = la.insert(hyp(("the", 0.0, 0.2)))
    assert [w.word for w in committed] == ["the"]
    aged = la.commit_until(1.1)
    if carry:  # the words heard before still age into commits
        assert [w.word for w in aged] == ["cat", "sat", "down"]
    else:  # forgotten until a reading that reaches them comes back
        assert aged == []


def test_carried_words_give_way_to_a_reading_of_their_time() -> None:
    la = LocalAgreement(carry=True)
    la.observe(hyp(("the", 0.0, 0.2), ("cat", 0.2, 0.5), ("sat", 0.5, 0.8)))
    la.observe(hyp(("a", 0.0, 0.2)))
    assert [w.word for w in la.pending] == ["a", "cat", "sat"]
    # A reading that covers their time replaces them: carried words are never mixed into it.
    la.observe(hyp(("a", 0.0, 0.2), ("hat", 0.2, 0.5), ("sank", 0.5, 0.8)))
    assert [w.word for w in la.pending] == ["a", "hat", "sank"]
    la.observe([])
    assert [w.word for w in la.pending] == ["a", "hat", "sank"]
