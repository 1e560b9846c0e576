"""The OCR and Whisper models the main job's stages run: kept across jobs, leased by threads.

`StageModels` makes each stream's OCR engine and speech transcriber for `build_pipeline`. With a
`CoreBudget` (load-driven allocation, `streamfuse.qos.allocation`) each model holds one session
per thread count the budget offers and every call runs on the one its lease grants (sessions fix
their threads when made). With a `ModelPool` loaded models outlive the job, so a sweep that runs
many jobs (`streamfuse pareto`) loads each distinct model once per stream slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from streamfuse.audio.config import AsrConfig
from streamfuse.audio.policy import Word
from streamfuse.audio.transcriber import WhisperTranscriber, _make_whisper
from streamfuse.errors import ModelError
from streamfuse.lm.engine import LMEngine
from streamfuse.lm.stage import LMStage, LMStageConfig
from streamfuse.qos.allocation import CoreBudget
from streamfuse.telemetry.metrics import ModelInfo
from streamfuse.vision.config import OcrConfig
from streamfuse.vision.ocr import OcrEngine, OcrReading, RapidOcrEngine


class ModelPool:
    """Loaded models by key (what makes two of them differ, and the stream slot using it: a
    model instance serves one stage at a time). Thread-safe."""

    def __init__(self) -> None:
        self._models: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        #: Models made (a sweep reports how many loads the pool saved).
        self.loads = 0

    def get(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        with self._lock:
            model = self._models.get(key)
        if model is None:
            # Made outside the lock (loading takes seconds); a racing twin is dropped.
            made = make()
            with self._lock:
                model = self._models.setdefault(key, made)
                self.loads += model is made
        return model

    def __len__(self) -> int:
        return len(self._models)


class LeasedOcrEngine(OcrEngine):
    """rapidocr at several intra-op thread counts; each read runs on the session its lease
    from `budget` grants (one count and no budget: a plain engine, maybe pooled)."""

    def __init__(
        self,
        config: OcrConfig,
        *,
        threads: Sequence[int],
        streams: int = 1,
        stage: str = "ocr",
        budget: CoreBudget | None = None,
        pool: ModelPool | None = None,
        slot: int = 0,
    ) -> None:
        self.config = config
        self.stage = stage
        self.budget = budget
        self._threads = tuple(sorted(set(threads)))
        self._streams = streams
        self._pool = pool
        self._slot = slot
        self._engines: dict[int, RapidOcrEngine] = {}

    def _make(self, n: int) -> RapidOcrEngine:
        engine = RapidOcrEngine(
            self.config.model_copy(update={"intra_op_threads": n}), streams=self._streams
        )
        engine.load()
        return engine

    def load(self) -> None:
        if self._engines:
            return
        for n in self._threads:
            if self._pool is None:
                self._engines[n] = self._make(n)
                continue
            key = (
                "ocr",
                self._slot,
                n,
                self.config.resolve_precision(self._streams),
                self.config.model_dump_json(exclude={"intra_op_threads", "precision"}),
            )
            self._engines[n] = self._pool.get(key, partial(self._make, n))

    def model_info(self) -> ModelInfo | None:
        return next(iter(self._engines.values())).model_info() if self._engines else None

    def read(self, image: np.ndarray, det_max_side_px: int) -> OcrReading:
        self.load()
        if self.budget is None:
            return self._engines[self._threads[-1]].read(image, det_max_side_px)
        with self.budget.lease(self.stage) as n:
            return self._engines[n].read(image, det_max_side_px)


class LeasedWhisper(WhisperTranscriber):
    """faster-whisper at several CPU thread counts (fixed when a model loads); each call runs
    on the model its lease from `budget` grants (one count and no budget: a plain model,
    maybe pooled)."""

    def __init__(
        self,
        config: AsrConfig,
        *,
        threads: Sequence[int],
        stage: str = "asr",
        budget: CoreBudget | None = None,
        pool: ModelPool | None = None,
        slot: int = 0,
    ) -> None:
        super().__init__(config)
        self.stage = stage
        self.budget = budget
        self._threads = tuple(sorted(set(threads)))
        self._pool = pool
        self._slot = slot
        self._models: dict[int, Any] = {}

    def _make(self, n: int) -> Any:
        try:
            return _make_whisper(self.path, self.config.model_copy(update={"cpu_threads": n}))
        except Exception as e:  # CTranslate2 raises RuntimeError/ValueError with a bare message
            raise ModelError(f"cannot load Whisper model from {self.path}: {e}") from e

    def load(self) -> None:
        if self._models:
            return
        for n in self._threads:
            if self._pool is None:
                self._models[n] = self._make(n)
                continue
            key = ("asr", self._slot, n, str(self.path), self.config.compute_type)
            self._models[n] = self._pool.get(key, partial(self._make, n))
        self._model = self._models[self._threads[-1]]
        self._english_only = not bool(self._model.model.is_multilingual)

    def transcribe(
        self,
        audio: np.ndarray,
        prompt: str = "",
        *,
        fast: bool = False,
        hotwords: Sequence[str] = (),
    ) -> list[Word]:
        self.load()
        if self.budget is None:
            return super().transcribe(audio, prompt, fast=fast, hotwords=hotwords)
        with self.budget.lease(self.stage) as n:
            # One stage calls its transcriber from one thread at a time: swapping is safe.
            self._model = self._models[n]
            return super().transcribe(audio, prompt, fast=fast, hotwords=hotwords)


class StageModels:
    """Makes the models of one job's stages: leased from `budget` (when given, with sessions
    of `budget.thread_choices(...)` threads up to `ocr_max_threads` / `asr_max_threads`), kept
    in `pool` (when given)."""

    def __init__(
        self,
        *,
        budget: CoreBudget | None = None,
        ocr_max_threads: int = 2,
        asr_max_threads: int = 1,
        ocr_min_threads: int = 1,
        asr_min_threads: int = 1,
        pool: ModelPool | None = None,
    ) -> None:
        self.budget = budget
        self.ocr_max_threads = ocr_max_threads
        self.asr_max_threads = asr_max_threads
        #: The fewest threads a leased call gets (the fixed split's: `CoreBudget.register`).
        self.ocr_min_threads = ocr_min_threads
        self.asr_min_threads = asr_min_threads
        self.pool = pool

    def _choices(self, stage: str, fixed: int, most: int, least: int) -> tuple[int, ...]:
        """The session sizes `stage`'s model keeps: `fixed` without a budget; with one, the
        budget's sizes up to `most`, registered with it (each call at least `least`)."""
        if self.budget is None:
            return (fixed,)
        choices = self.budget.thread_choices(most)
        self.budget.register(stage, choices, floor=least)
        return choices

    def ocr_engine(self, config: OcrConfig, *, stage: str, streams: int, slot: int) -> OcrEngine:
        choices = self._choices(
            stage, config.intra_op_threads, self.ocr_max_threads, self.ocr_min_threads
        )
        return LeasedOcrEngine(
            config,
            threads=choices,
            streams=streams,
            stage=stage,
            budget=self.budget,
            pool=self.pool,
            slot=slot,
        )

    def transcriber(self, config: AsrConfig, *, stage: str, slot: int) -> WhisperTranscriber:
        choices = self._choices(
            stage, config.cpu_threads, self.asr_max_threads, self.asr_min_threads
        )
        return LeasedWhisper(
            config, threads=choices, stage=stage, budget=self.budget, pool=self.pool, slot=slot
        )

    def lm_stage(self, config: LMStageConfig) -> LMStage:
        """The language-model stage; with a pool its weights and tokenizer are loaded once
        (here, blocking: a sweep builds jobs between runs) and each job gets a fresh engine
        (its own KV cache) over them."""
        if self.pool is None:
            return LMStage(config)
        from streamfuse.lm.loader import load_model

        spec = config.lm.model
        model, tokenizer = self.pool.get(("lm", spec.model_dump_json()), partial(load_model, spec))
        if tokenizer is None:
            raise ModelError(f"model {spec.source!r} has no tokenizer.json")
        return LMStage(config, engine=LMEngine(model, config.lm), tokenizer=tokenizer)


__all__ = ["LeasedOcrEngine", "LeasedWhisper", "ModelPool", "StageModels"]
