"""Character and word error rates, the one implementation every scorer uses.

CER is Levenshtein edits over the reference's length after whitespace collapse (or removal);
WER is word-level Levenshtein edits over the reference's words after English normalization.
Arguments are always (reference, hypothesis); an empty reference scores 0 against an empty
hypothesis, else 1.
"""

from __future__ import annotations

from rapidfuzz.distance import Levenshtein

from streamfuse.text.normalize import collapse_whitespace, normalize_english


def _chars(text: str, ignore_whitespace: bool) -> str:
    return "".join(text.split()) if ignore_whitespace else collapse_whitespace(text)


def char_errors(
    reference: str, hypothesis: str, *, ignore_whitespace: bool = False
) -> tuple[int, int]:
    """(edits, reference characters) after whitespace collapse, or with all whitespace removed:
    the two counts a corpus CER sums over many pairs."""
    ref, hyp = _chars(reference, ignore_whitespace), _chars(hypothesis, ignore_whitespace)
    return Levenshtein.distance(ref, hyp), len(ref)


def cer(reference: str, hypothesis: str, *, ignore_whitespace: bool = False) -> float:
    """Character error rate of `hypothesis` against `reference` (may exceed 1)."""
    edits, n_chars = char_errors(reference, hypothesis, ignore_whitespace=ignore_whitespace)
    if n_chars == 0:
        return 0.0 if edits == 0 else 1.0
    return edits / n_chars


def word_errors(reference: str, hypothesis: str, *, normalize: bool = True) -> tuple[int, int]:
    """(word edits, reference words), both texts English-normalized first unless `normalize`
    is False (already normalized): the two counts a corpus WER sums over many pairs."""
    ref = normalize_english(reference) if normalize else collapse_whitespace(reference)
    hyp = normalize_english(hypothesis) if normalize else collapse_whitespace(hypothesis)
    ref_words, hyp_words = ref.split(), hyp.split()
    return Levenshtein.distance(ref_words, hyp_words), len(ref_words)


def wer(reference: str, hypothesis: str, *, normalize: bool = True) -> float:
    """Word error rate of `hypothesis` against `reference` (substitutions, deletions and
    insertions over reference words), English-normalized first unless `normalize` is False;
    1.0 for an empty hypothesis, and against an empty reference 0 or 1."""
    edits, n_words = word_errors(reference, hypothesis, normalize=normalize)
    if n_words == 0:
        return 0.0 if edits == 0 else 1.0
    return edits / n_words


__all__ = ["cer", "char_errors", "wer", "word_errors"]
