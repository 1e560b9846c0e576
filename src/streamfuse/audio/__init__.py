"""Audio path: Silero VAD, streaming Whisper ASR with a LocalAgreement commit policy.

`AsrStage` consumes 20 ms `AudioFrame`s and emits `asr_partial` and committed `asr` events,
primed by the terms a `ScreenTerms` observer collects from the stream's `ocr` events;
`resolve_whisper_model` maps ``tiny.en`` / ``base`` / a path to a local CTranslate2 folder.
"""

from __future__ import annotations

from streamfuse.audio.config import AsrConfig
from streamfuse.audio.models import resolve_whisper_model
from streamfuse.audio.policy import LocalAgreement, Word
from streamfuse.audio.priming import ScreenTerms
from streamfuse.audio.reviser import BackgroundReader
from streamfuse.audio.stage import AsrStage
from streamfuse.audio.transcriber import Transcriber, WhisperTranscriber

__all__ = [
    "AsrConfig",
    "AsrStage",
    "BackgroundReader",
    "LocalAgreement",
    "ScreenTerms",
    "Transcriber",
    "WhisperTranscriber",
    "Word",
    "resolve_whisper_model",
]
