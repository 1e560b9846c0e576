"""The ASR effort ladder: which recognizer each full-window pass uses, chosen per pass.

Fast updates inside speech always run the stream's model as configured. The full-window passes
(at pauses and utterance ends: they commit an utterance's rest and revise) run at the current
rung: 0 as configured (tiny.en, greedy), 1 with beam search (`effort_beam`), 2 with the accurate
model (`effort_model`, Whisper base) at that beam. `AsrConfig.effort` forces a rung or, `"auto"`,
lets `qos.effort.EffortController` choose it from the recognizer's busy share per second of
audio, the stream's commit latency (live only) and machine CPU load, once per `period_s` of
media time. `EffortTranscriber` wraps the stage's transcriber; the stage tells it how far the
audio has got (`advance`) and how late its commits are (`record_latency`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np

from streamfuse.audio.config import AsrConfig
from streamfuse.audio.policy import Word
from streamfuse.audio.reviser import accurate_config, shift_words
from streamfuse.audio.transcriber import Transcriber, WhisperTranscriber
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ
from streamfuse.qos.busy import BusyWindow
from streamfuse.qos.effort import AsrFeedback, EffortController
from streamfuse.qos.feedback import SystemProbe
from streamfuse.telemetry.metrics import instruments

log = logging.getLogger(__name__)

RUNG_NAMES = ("as configured", "full passes at effort_beam", "full passes on effort_model")
_LATENCY_ALPHA = 0.3  # weight of the newest commit latency in its running mean


def effort_transcribers(base: WhisperTranscriber) -> list[Transcriber]:
    """The full-window transcriber of each rung around the stream's own Whisper model: itself,
    itself at beam `effort_beam` (the loaded model shared), and `effort_model` at that beam."""
    accurate = accurate_config(base.config)
    beam = accurate.full_beam_size
    return [base, base.variant(full_beam_size=beam), WhisperTranscriber(accurate)]


class EffortTranscriber(Transcriber):
    """Routes each pass to its rung's transcriber (`full[rung]`; fast passes to `fast`) and, with
    `config.effort == "auto"`, moves the rung with the controller's decisions."""

    def __init__(
        self,
        fast: Transcriber,
        full: Sequence[Transcriber],
        config: AsrConfig,
        *,
        probe: SystemProbe | None = None,
        stage: str = "asr",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if len(full) != len(RUNG_NAMES):
            raise ValueError(f"need {len(RUNG_NAMES)} full-pass transcribers, got {len(full)}")
        self.fast = fast
        self.full = list(full)
        self.config = config
        self.auto = config.effort == "auto"
        self.controller = EffortController(config.effort_control)
        self.rung = self.controller.initial().rung if self.auto else int(config.effort)
        self.probe = probe
        self.stage = stage
        self._clock = clock
        self._busy_s = 0.0  # recognizer seconds since the last `advance`
        self._work = BusyWindow(config.effort_control.window_s)  # recognizer s, media time
        self._first_t: float | None = None
        self._next_decision: float | None = None
        self._latency_s: float | None = None
        #: Rung changes: (media time, rung, reason); the first entry is the start.
        self.history: list[tuple[float, int, str]] = [(0.0, self.rung, "start")]
        #: Full-window passes run at each rung.
        self.passes = [0] * len(RUNG_NAMES)

    # -- Transcriber ----------------------------------------------------------------------------
    def load(self) -> None:
        self.fast.load()
        rungs = self.config.effort_control.rungs if self.auto else (self.rung,)
        for rung in rungs:
            # The accurate model is loaded up front: loading it mid-stream would stall commits.
            self.full[rung].load()

    def token_count(self, word: str) -> int:
        return self.fast.token_count(word)

    def transcribe(
        self,
        audio: np.ndarray,
        prompt: str = "",
        *,
        fast: bool = False,
        hotwords: Sequence[str] = (),
    ) -> list[Word]:
        target = self.fast if fast else self.full[self.rung]
        if not fast:
            self.passes[self.rung] += 1
            instruments().asr_effort.record(self.rung, {"stage": self.stage})
        started = self._clock()
        try:
            words = target.transcribe(audio, prompt, fast=fast, hotwords=hotwords)
        finally:
            self._busy_s += self._clock() - started
        if fast or self.rung < 2:
            return words
        # The accurate model's word times, on the clock of the stream's own model.
        end = len(audio) / AUDIO_SAMPLE_RATE_HZ
        return shift_words(words, self.config.effort_model_shift_s, end)

    # -- feedback -------------------------------------------------------------------------------
    def record_latency(self, latency_s: float) -> None:
        """A commit's latency (live streams only: offline it measures the decoder's speed)."""
        prev = self._latency_s
        latency_s = max(0.0, latency_s)
        self._latency_s = latency_s if prev is None else prev + _LATENCY_ALPHA * (latency_s - prev)

    def busy_share(self, t_media: float) -> float | None:
        """Recognizer seconds per second of audio over the controller's window ending at
        media time `t_media` (None before a decision period of audio)."""
        if self._first_t is None:
            return None
        span = min(self._work.window_s, t_media - self._first_t)
        if span < self.config.effort_control.period_s:
            return None
        return self._work.busy_s(t_media) / span

    def advance(self, t_media: float) -> None:
        """The audio has reached media time `t_media` (after an inference): account the work
        since the last call and, every `period_s` with `auto`, decide the rung."""
        if self._first_t is None:
            self._first_t = t_media
            self._next_decision = t_media + self.config.effort_control.period_s
        self._work.add(t_media, self._busy_s)
        self._busy_s = 0.0
        if not self.auto or self._next_decision is None or t_media < self._next_decision:
            return
        self._next_decision = t_media + self.config.effort_control.period_s
        feedback = AsrFeedback(
            busy_share=self.busy_share(t_media),
            commit_latency_s=self._latency_s,
            cpu_util=self.probe.cpu() if self.probe is not None else None,
        )
        decision = self.controller.decide(feedback, self.rung)
        log.debug("%s: effort at %.1f s: %s -> %s", self.stage, t_media, feedback, decision)
        if decision.rung != self.rung:
            log.info(
                "%s: effort rung %d -> %d (%s) at %.1f s: %s",
                self.stage,
                self.rung,
                decision.rung,
                RUNG_NAMES[decision.rung],
                t_media,
                decision.reason,
            )
            self.rung = decision.rung
            self.history.append((t_media, decision.rung, decision.reason))
            # The window measured the old rung's work: judge the new one on its own.
            self._work.clear()
            self._first_t = t_media


__all__ = ["RUNG_NAMES", "EffortTranscriber", "effort_transcribers"]
