"""`ModelSet`: one engine per distinct setting, whoever asks; thread counts as the set says;
each shared engine serves one call at a time (its per-call state lives on the shared object)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from streamfuse.audio.config import AsrConfig
from streamfuse.audio.transcriber import WhisperTranscriber
from streamfuse.modelset import ModelSet
from streamfuse.vision.config import OcrConfig
from streamfuse.vision.ocr import OcrReading, RapidOcrEngine

pytestmark = pytest.mark.unit


def test_one_engine_per_setting() -> None:
    models = ModelSet()
    ocr = models.ocr_engine(OcrConfig())
    assert models.ocr_engine(OcrConfig()) is ocr
    assert models.ocr_engine(OcrConfig(min_conf=0.9)) is not ocr
    asr = models.transcriber(AsrConfig())
    assert models.transcriber(AsrConfig()) is asr
    assert isinstance(ocr, RapidOcrEngine) and isinstance(asr, WhisperTranscriber)
    assert models.loads == {}  # nothing loads before its first use


def test_threads_are_the_sets_not_the_stages_share() -> None:
    models = ModelSet(ocr_threads=2, asr_threads=2)
    # Two streams' stages ask with a per-stream share of one thread: one engine, two threads.
    ocr = models.ocr_engine(OcrConfig(intra_op_threads=1))
    assert models.ocr_engine(OcrConfig(intra_op_threads=2)) is ocr
    assert ocr.config.intra_op_threads == 2
    assert models.transcriber(AsrConfig(cpu_threads=1)).config.cpu_threads == 2
    assert ModelSet().ocr_engine(OcrConfig(intra_op_threads=1)).config.intra_op_threads == 1


def _concurrency(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    """Patch `cls.name` (the unshared engine's call) to record how many callers are inside."""
    inside, peak = [0], [0]
    lock = threading.Lock()

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        return OcrReading((), (1, 1), 0.0) if cls is RapidOcrEngine else []

    monkeypatch.setattr(cls, name, call)
    return peak


def test_a_shared_engine_serves_one_call_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    models = ModelSet()
    ocr_peak = _concurrency(monkeypatch, RapidOcrEngine, "read")
    asr_peak = _concurrency(monkeypatch, WhisperTranscriber, "transcribe")
    ocr = models.ocr_engine(OcrConfig())
    asr = models.transcriber(AsrConfig())
    image, audio = np.zeros((8, 8, 3), np.uint8), np.zeros(1600, np.float32)
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(ocr.read, image, 32) for _ in range(4)]
        futures += [pool.submit(asr.transcribe, audio) for _ in range(4)]
        for f in futures:
            f.result()
    assert ocr_peak == [1] and asr_peak == [1]
    # The unshared engines do run side by side (the check above can fail).
    plain = RapidOcrEngine(OcrConfig())
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: plain.read(image, 32), range(4)))
    assert ocr_peak[0] > 1
