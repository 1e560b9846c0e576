"""Text normalization: `collapse_whitespace` (every run of whitespace -> one space, ends
stripped) and `normalize_english` (Whisper's English normalizer: case, punctuation, numbers,
spellings; whitespace collapsed), the forms texts are compared and scored in."""

from __future__ import annotations

from functools import cache
from typing import Any


def collapse_whitespace(text: str) -> str:
    """Runs of whitespace (spaces, tabs, newlines) as one space, no leading/trailing space."""
    return " ".join(text.split())


@cache
def _english_normalizer() -> Any:
    # Imported on first use: whisper_normalizer loads its spelling tables at import.
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def normalize_english(text: str) -> str:
    """Whisper English normalization, whitespace collapsed: "3" and "three", "real-time" and
    "real time" come out equal."""
    return collapse_whitespace(_english_normalizer()(text))


__all__ = ["collapse_whitespace", "normalize_english"]
