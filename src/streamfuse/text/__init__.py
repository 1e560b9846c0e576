"""Text helpers shared by every modality: whitespace and English normalization, and the
character / word error rates that OCR, ASR, evaluation, benchmarks and training score with."""

from __future__ import annotations

from streamfuse.text.error_rates import cer, char_errors, wer, word_errors
from streamfuse.text.normalize import collapse_whitespace, normalize_english

__all__ = ["cer", "char_errors", "collapse_whitespace", "normalize_english", "wer", "word_errors"]
