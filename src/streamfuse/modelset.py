"""One loaded model set shared by many pipelines: loaded once, not once per stream or run.

`ModelSet.ocr_engine(config)` and `ModelSet.transcriber(config)` return one engine per distinct
setting, however many stages ask; each loads on first use and serves its callers one call at a
time (a lock: the engines set per-call state on the shared model). It is a `StageModels`
(`streamfuse.model_pool`), so `build_pipeline(..., models=)` hands them to its stages; unlike
a `ModelPool`, whose models serve one stream slot each, one engine serves every stream at once.
The VAD stays per stream (it carries recurrent state).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from streamfuse.audio.config import AsrConfig
from streamfuse.audio.policy import Word
from streamfuse.audio.transcriber import WhisperTranscriber
from streamfuse.model_pool import StageModels
from streamfuse.vision.config import OcrConfig
from streamfuse.vision.ocr import OcrReading, RapidOcrEngine


class _SharedOcrEngine(RapidOcrEngine):
    """A `RapidOcrEngine` several stages call from their own threads, one read at a time
    (`read` sets the detector side on the shared rapidocr object before each call)."""

    def __init__(self, config: OcrConfig, loaded: Counter[str]) -> None:
        super().__init__(config)
        # Reentrant: the base class's calls load first, under the caller's hold.
        self._lock = threading.RLock()
        self._loaded = loaded

    def load(self) -> None:
        with self._lock:
            if self._engine is None:
                super().load()
                self._loaded["ocr"] += 1

    def read(self, image: np.ndarray, det_max_side_px: int) -> OcrReading:
        with self._lock:
            return super().read(image, det_max_side_px)


class _SharedWhisper(WhisperTranscriber):
    """A `WhisperTranscriber` several stages call from their own threads, one call at a time
    (`transcribe` sets the encoder window on the shared model before each call)."""

    def __init__(self, config: AsrConfig, loaded: Counter[str]) -> None:
        super().__init__(config)
        # Reentrant: the base class's calls load first, under the caller's hold.
        self._lock = threading.RLock()
        self._loaded = loaded

    def load(self) -> None:
        with self._lock:
            if self._model is None:
                super().load()
                self._loaded["asr"] += 1

    def transcribe(
        self,
        audio: np.ndarray,
        prompt: str = "",
        *,
        fast: bool = False,
        hotwords: Sequence[str] = (),
    ) -> list[Word]:
        with self._lock:
            return super().transcribe(audio, prompt, fast=fast, hotwords=hotwords)


class ModelSet(StageModels):
    """The OCR engines and speech recognizers of every pipeline built with this set.

    `ocr_threads` / `asr_threads` replace the thread counts the stages' configs ask for: a
    shared engine serves its streams one call at a time, so it gets what one stream would, not
    a per-stream share of the cores (None: as the first config asks). `loads` counts the
    models actually loaded ("ocr", "asr").
    """

    def __init__(self, *, ocr_threads: int | None = None, asr_threads: int | None = None) -> None:
        super().__init__()  # no thread budget, no pool: the language model is per job
        self.ocr_threads = ocr_threads
        self.asr_threads = asr_threads
        self.loads: Counter[str] = Counter()
        self._ocr: dict[str, _SharedOcrEngine] = {}
        self._asr: dict[str, _SharedWhisper] = {}
        self._lock = threading.Lock()

    def ocr_engine(
        self, config: OcrConfig, *, stage: str = "ocr", streams: int = 1, slot: int = 0
    ) -> RapidOcrEngine:
        """The engine for `config` (its thread counts set as this set says), whichever stage,
        stream count or slot asks (`config.precision` is resolved for the streams already)."""
        if self.ocr_threads is not None:
            config = config.model_copy(update={"intra_op_threads": self.ocr_threads})
        return self._get(self._ocr, config, _SharedOcrEngine)

    def transcriber(
        self, config: AsrConfig, *, stage: str = "asr", slot: int = 0
    ) -> WhisperTranscriber:
        """The speech recognizer for `config` (its threads set as this set says), whichever
        stage or slot asks."""
        if self.asr_threads is not None:
            config = config.model_copy(update={"cpu_threads": self.asr_threads})
        return self._get(self._asr, config, _SharedWhisper)

    def _get(self, engines: dict[str, Any], config: Any, make: Any) -> Any:
        key = config.model_dump_json()
        with self._lock:
            engine = engines.get(key)
            if engine is None:
                engine = engines[key] = make(config, self.loads)
            return engine


__all__ = ["ModelSet"]
