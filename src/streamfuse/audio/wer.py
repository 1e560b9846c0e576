"""Word error rate with Whisper's English normalizer (case, punctuation, numbers, spellings).

`normalize_text` is applied to both sides before `jiwer` counts edits, so "3" and "three",
"real-time" and "real time" score as equal. Used by the ASR benchmark and `streamfuse eval`.
"""

from __future__ import annotations

from functools import cache

import jiwer
from whisper_normalizer.english import EnglishTextNormalizer


@cache
def _normalizer() -> EnglishTextNormalizer:
    return EnglishTextNormalizer()


def normalize_text(text: str) -> str:
    """Whisper English normalization, whitespace collapsed."""
    return " ".join(_normalizer()(text).split())


def wer(ref: str, hyp: str) -> float:
    """Word error rate of `hyp` against `ref` after normalization (1.0 when hyp is empty)."""
    r, h = normalize_text(ref), normalize_text(hyp)
    if not r:
        return 0.0 if not h else 1.0
    if not h:
        return 1.0
    return float(jiwer.wer(r, h))


__all__ = ["normalize_text", "wer"]
