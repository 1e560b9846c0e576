"""Prompt-lookup drafting and greedy acceptance."""

from __future__ import annotations

import pytest

from streamfuse.lm.speculative import NgramDrafter, accept_greedy

pytestmark = pytest.mark.unit


def test_drafts_what_followed_the_latest_earlier_occurrence() -> None:
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3], max_ngram=3)
    assert d.draft(3) == [7, 8, 1]  # the most recent earlier "1 2 3" was followed by 7 8 1
    assert d.draft(0) == []


def test_falls_back_to_shorter_ngrams_and_never_matches_itself() -> None:
    d = NgramDrafter([5, 6, 7], max_ngram=3)
    assert d.draft(4) == []  # "7" occurs only at the end
    d.extend([8, 7])
    assert d.draft(4) == [8, 7]  # 1-gram "7" -> what followed the first 7


def test_history_is_bounded_and_indices_stay_right() -> None:
    d = NgramDrafter(window=16, max_ngram=2)
    d.extend(range(100))
    d.extend([97, 98])
    assert d.draft(2) == [99, 97]
    assert len(d._hist) <= 32


def test_accept_greedy_keeps_the_agreeing_prefix_plus_the_model_token() -> None:
    assert accept_greedy([4, 5, 6], [4, 5, 9, 1]) == [4, 5, 9]
    assert accept_greedy([4, 5, 6], [4, 5, 6, 7]) == [4, 5, 6, 7]
    assert accept_greedy([4, 5, 6], [3, 5, 6, 7]) == [3]
    assert accept_greedy([], [3]) == [3]
    with pytest.raises(ValueError):
        accept_greedy([1], [1])


def test_rejects_bad_ngram_bounds() -> None:
    with pytest.raises(ValueError):
        NgramDrafter(max_ngram=1, min_ngram=2)


def test_draft_length_adapts_to_acceptance() -> None:
    d = NgramDrafter([1, 2, 3, 1, 2, 3], max_draft=8, pause_steps=2)
    assert d.allowance() == 8
    d.observe(8, 8)
    assert d.allowance() == 8  # all accepted: stays at the maximum
    d.observe(8, 2)
    assert d.allowance() == 3  # just past the accepted run
    d.observe(3, 0)
    assert d.allowance() == 1
    d.observe(1, 0)  # none accepted at one token: pause, then try one again
    assert [d.allowance() for _ in range(3)] == [0, 0, 1]
    d.observe(1, 1)
    d.observe(2, 2)
    assert d.allowance() == 4  # quoting again: back up by doubling
    d.observe(0, 0)  # nothing proposed: no change
    assert d.allowance() == 4
