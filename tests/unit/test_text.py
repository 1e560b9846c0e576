"""The shared text helpers: whitespace collapse, English normalization, CER and WER."""

from __future__ import annotations

import pytest

from streamfuse.text import cer, char_errors, collapse_whitespace, normalize_english, wer

pytestmark = pytest.mark.unit


def test_collapse_whitespace_joins_every_kind_of_run() -> None:
    assert collapse_whitespace("  a \n\tb\u00a0 c  ") == "a b c"
    assert collapse_whitespace(" \n ") == ""


def test_normalize_english_folds_case_punctuation_and_numbers() -> None:
    assert normalize_english("Hello,   World!") == "hello world"
    assert normalize_english("three") == normalize_english("3")
    assert normalize_english("real-time") == normalize_english("real time")


def test_char_errors_counts_edits_and_reference_chars_after_collapse() -> None:
    assert char_errors("a  b\nc", "a b c") == (0, 5)
    assert char_errors("abc", "abd") == (1, 3)
    # Whitespace removed entirely: a split or merged word costs nothing.
    assert char_errors("hello world", "helloworld", ignore_whitespace=True) == (0, 10)
    assert char_errors("hello world", "helloworld") == (1, 11)


def test_cer_is_edits_over_reference_length() -> None:
    assert cer("Hello world", "Hel1o  world") == pytest.approx(1 / 11)
    assert cer("Hello world", "Hel1o world", ignore_whitespace=True) == pytest.approx(0.1)
    assert cer("ab", "abcdef") == 2.0  # insertions can push it past 1
    assert cer("", "") == 0.0 and cer(" ", "x") == 1.0 and cer("abc", "") == 1.0


def test_wer_normalizes_both_sides_unless_told_not_to() -> None:
    assert wer("It is 3 o'clock.", "it is three o'clock") == 0.0
    assert wer("the cat sat", "the cat sat down") == pytest.approx(1 / 3)
    assert wer("The cat", "the cat", normalize=False) == pytest.approx(1 / 2)
    assert wer("", "") == 0.0 and wer("", "words") == 1.0 and wer("some words", "") == 1.0
