"""The accurate model as a background reviser: utterances re-read after they were committed.

The stream's own model (tiny.en) commits every word; at each utterance end the audio its full
pass read (the utterance and its lookback) is handed to `BackgroundReader`, which reads it again
with `effort_model` (Whisper base) at `effort_beam` on one thread of the lowest CPU priority. The
stage compares that reading with what was committed and emits `asr_revision` events where they
differ. So base's accuracy arrives when a core is free for it, and first commits never wait for
it (the effort ladder's rung 2 runs base inline, in the commit path: docs/asr.md).

The same reader, with the stream's own model at normal priority (`accurate=False`), takes the
stream's lookback passes off the commit path when `lookback_async` is on; `Readings` holds one
stage's readings in flight for either.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from streamfuse.audio.config import AsrConfig
from streamfuse.audio.policy import Word
from streamfuse.audio.priming import PrimingMode, read_pass
from streamfuse.audio.transcriber import Transcriber, WhisperTranscriber
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ

log = logging.getLogger(__name__)

#: nice value of the reviser's thread (and of the model threads it starts): the lowest priority.
LOWEST_PRIORITY = 19


def _lower_priority() -> None:
    """Thread initializer: this thread, and every thread it starts (nice is inherited), runs
    only when nothing else wants the CPU. Linux sets nice per thread; elsewhere a no-op."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
    except (AttributeError, OSError) as e:  # pragma: no cover - not Linux
        log.debug("cannot lower the reviser thread's priority: %s", e)


def accurate_config(config: AsrConfig) -> AsrConfig:
    """The stream's ASR settings with `effort_model` at `effort_beam` for its full passes."""
    beam = max(config.full_beam_size, config.effort_beam)
    return config.model_copy(update={"model": config.effort_model, "full_beam_size": beam})


def shift_words(words: Sequence[Word], shift_s: float, end_s: float) -> list[Word]:
    """`words` moved by `shift_s` (the accurate model's times onto the stream model's clock),
    kept inside 0..`end_s`."""
    if shift_s == 0.0:
        return list(words)

    def moved(t: float) -> float:
        return min(max(0.0, t + shift_s), end_s)

    return [replace(w, t_start=moved(w.t_start), t_end=moved(w.t_end)) for w in words]


@dataclass(frozen=True, slots=True)
class Reread:
    """One utterance end's audio, to be read again: `audio` from media time `t0`; committed words
    from `since` to `until` are what the reading may revise. With slide `terms` it is read as
    `mode` says (`priming.read_primed`), as the stream's own pass over that audio would be."""

    audio: np.ndarray
    t0: float
    prompt: str
    since: float
    until: float
    mode: PrimingMode = "plain"
    terms: list[str] = field(default_factory=list)
    #: Whether the reading is checked for slide terms by scoring (`priming.read_pass`).
    check: bool = False
    #: The primed reading of the same audio, read once this unprimed one has landed
    #: (`AsrConfig.reread_unprimed_first`); it reuses this reading's decode.
    then: Reread | None = None
    #: Whether this primed reading follows the unprimed one of the same audio (`then`).
    follows: bool = False
    #: Where the unprimed step leaves its raw words for the primed step that follows it (on
    #: that step: whatever other jobs run between the two, it reuses this decode).
    unprimed: list[list[Word]] = field(default_factory=list, compare=False, repr=False)


class BackgroundReader:
    """`effort_model` on one low-priority worker thread. `read` returns a future of the words
    in the audio's own time (shifted onto the stream model's clock) and the terms they were
    primed with (`priming.read_primed`). One reader may serve the
    ASR stages of several streams (one model loaded; their readings queue in turn): each stage
    `attach`es it at setup and `release`s it at teardown; the last release closes it.
    `transcriber`: a stand-in for the accurate model (tests).

    `accurate=False`: the stream's own model (`model`) instead, at normal priority, unshifted:
    the lookback passes read off the commit path (`AsrConfig.lookback_async`)."""

    def __init__(
        self, config: AsrConfig, transcriber: Transcriber | None = None, *, accurate: bool = True
    ) -> None:
        self.config = config
        self._transcriber = transcriber
        self.accurate = accurate
        #: The model's name, as revision events give it.
        self.model = Path(config.effort_model if accurate else config.model).name
        self._shift_s = config.effort_model_shift_s if accurate else 0.0
        self._pool = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="sf-asr-reviser" if accurate else "sf-asr-lookback",
            initializer=_lower_priority if accurate else None,
        )
        #: Passes run and their wall seconds, and jobs replaced while waiting, never read
        #: (benchmarks, stats).
        self.passes = 0
        self.busy_s = 0.0
        self.replaced = 0
        self._users = 0

    def attach(self) -> None:
        self._users += 1

    def release(self) -> None:
        self._users -= 1
        if self._users <= 0:
            self.close()

    @property
    def transcriber(self) -> Transcriber:
        if self._transcriber is None:
            raise RuntimeError("BackgroundReader.load() not run")
        return self._transcriber

    async def load(self) -> None:
        """Load the model on the reviser's thread, so the model's own threads start there and
        inherit its priority (raises `ModelError` when the model is not there)."""
        if self._transcriber is None:
            cfg = accurate_config(self.config) if self.accurate else self.config
            self._transcriber = WhisperTranscriber(cfg)
        await asyncio.get_running_loop().run_in_executor(self._pool, self._transcriber.load)

    def read(self, job: Reread) -> asyncio.Future[tuple[list[Word], list[str]]]:
        return asyncio.get_running_loop().run_in_executor(self._pool, self._read, job)

    def _read(self, job: Reread) -> tuple[list[Word], list[str]]:
        started = time.perf_counter()
        try:
            words, terms = read_pass(
                self.transcriber, job.audio, job.prompt, job.mode, job.terms,
                check=job.check, min_p=self.config.prime_score_min_p,
                unprimed=job.unprimed[0] if job.follows and job.unprimed else None,
            )  # fmt: skip
            if job.then is not None:
                job.then.unprimed[:] = [words]
        finally:
            self.passes += 1
            self.busy_s += time.perf_counter() - started
        end_s = len(job.audio) / AUDIO_SAMPLE_RATE_HZ
        return shift_words(words, self._shift_s, end_s), terms

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Readings:
    """One stage's readings by one reader: at most one running and one waiting (a newer job
    replaces the waiting one: its audio overlaps the older one's and reaches further)."""

    def __init__(self, reader: BackgroundReader) -> None:
        self.reader = reader
        self.running: tuple[Reread, asyncio.Future[tuple[list[Word], list[str]]]] | None = None
        self._waiting: Reread | None = None

    def submit(self, job: Reread) -> None:
        if self.running is None:
            self.running = (job, self.reader.read(job))
        else:
            self.reader.replaced += self._waiting is not None
            self._waiting = job

    @property
    def done(self) -> bool:
        """Whether the running reading has finished."""
        return self.running is not None and self.running[1].done()

    async def wait(self) -> None:
        if self.running is not None:
            await asyncio.wait([self.running[1]])

    def take(self) -> tuple[Reread, tuple[list[Word], list[str]] | None]:
        """The finished reading's job and result (None: it failed, logged); starts the next:
        the primed reading that follows it (`Reread.then`; a newer job waits on), else the
        waiting one."""
        assert self.running is not None
        job, future = self.running
        self.running = None
        try:
            result = future.result()
        except Exception:
            log.exception("background reading of %.2f s by %s failed", job.t0, self.reader.model)
            result = None
        if job.then is not None and result is not None:
            self.running = (job.then, self.reader.read(job.then))
        elif self._waiting is not None:
            self.submit(self._waiting)
            self._waiting = None
        return job, result


__all__ = ["BackgroundReader", "Readings", "Reread", "accurate_config", "shift_words"]
