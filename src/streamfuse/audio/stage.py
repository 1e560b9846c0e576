"""Streaming ASR stage: 20 ms audio windows in; `asr_partial` and committed `asr` events out.

Silero VAD gates the work: silence is never transcribed. During speech the buffer (from the
last trim point) is re-transcribed every `update_interval_s` of new audio (a short encoder
window) and words are committed by LocalAgreement-2, or once `max_word_delay_s` old; when the VAD
sees `min_silence_s` of silence, a full-window hypothesis is committed whole and the buffer
restarts. That pass hears the whole utterance, and reaches back over the utterances before it
(audio kept past the buffer; from the last such pass's start while it fits `revise_window_s`,
else from an utterance end within `revise_lookback_s`): where it reads words committed earlier
differently, now with what followed them, `asr_revision` events replace each differing stretch
whole (`revise`). With `background_revise` the accurate model (Whisper base) reads each such
pass's audio again on a low-priority thread after the commits and revises in the same way
(`audio.reviser`). Long
speech is trimmed at committed sentence ends. With a `ScreenTerms`, rare words read on screen in
the last minute are passed to the model as hotwords (slide priming); with `prime_guard` a primed
pass is decoded unprimed too and keeps the primed words only where they put a slide term in place
of words spelled like it (`priming.guard_primed`).

Latency contract: a committed `asr` event's `arrival_wall` is the arrival time of the audio
window holding the end of its last word, so `latency_ms` = commit time - when that audio arrived.
`t_start`/`t_end` are the first/last word times; `words` carry `word`, `t_start`, `t_end`, `p`.
"""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import replace
from difflib import SequenceMatcher
from pathlib import Path

import numpy as np

from streamfuse.audio.config import AsrConfig
from streamfuse.audio.effort import EffortTranscriber, effort_transcribers
from streamfuse.audio.policy import LocalAgreement, Word, join_words
from streamfuse.audio.priming import (
    PrimingMode,
    ScreenTerms,
    count_terms,
    drop_recited,
    drop_unspoken_terms,
    read_pass,
    relevant,
)
from streamfuse.audio.reviser import BackgroundReader, Readings, Reread
from streamfuse.audio.transcriber import Transcriber, WhisperTranscriber
from streamfuse.audio.vad import GateEvent, SileroVad, SpeechGate, VadChunk
from streamfuse.errors import ModelError, StageError
from streamfuse.events import (
    AsrCommitRule,
    AsrPartialPayload,
    AsrPayload,
    AsrRevisionPayload,
    AsrWord,
)
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ, AudioFrame, EventFrame, Frame, now_wall
from streamfuse.pipeline.stage import Stage
from streamfuse.telemetry.metrics import ModelInfo, instruments
from streamfuse.text.calibration import ASR_RECENT_WORDS, asr_core, calibrate_asr_word, shipped

log = logging.getLogger(__name__)

_ASR_PACKAGES = ("faster-whisper", "ctranslate2")

_MAX_GAP_FILL_S = 5.0
_TAIL_S = 1.5
# Words two readings share keep the differences around them apart only where the readings place
# them within this much of each other in time, on average (else a chance match of words).
_ANCHOR_MAX_SHIFT_S = 0.5


class AsrStage(Stage):
    """VAD + streaming Whisper with a LocalAgreement-2 commit policy."""

    input_types = (AudioFrame,)

    def __init__(
        self,
        config: AsrConfig | None = None,
        *,
        transcriber: Transcriber | None = None,
        vad: SileroVad | None = None,
        screen_terms: ScreenTerms | None = None,
        reader: BackgroundReader | None = None,
        live: bool = True,
        name: str | None = None,
    ) -> None:
        super().__init__(name or "asr", threads=1)
        self.config = config or AsrConfig()
        self._calibrator = shipped("asr") if self.config.calibrate else None
        #: Live (paced) input: interim updates skipped while more than `coalesce_after_s` of
        #: audio waits (behind). Offline (as fast as the input decodes) every update runs on
        #: its media-time schedule: the words a live run that keeps up commits, the same on
        #: every rerun however busy the machine is.
        self.live = live
        #: Text read on screen (fed by an observer of `ocr` events): primes recognition.
        self.screen_terms = screen_terms
        self._transcriber = transcriber
        self._vad = vad
        #: The background reviser (`AsrConfig.revises_in_background`; made at setup unless given).
        self.reader = reader
        #: The stream's own model reading the lookback passes off the commit path
        #: (`lookback_async`, live only; made at setup).
        self.lookback_reader: BackgroundReader | None = None
        # The readings in flight of the reviser and of the lookback reader (made at setup).
        self._rereads: Readings | None = None
        self._lookbacks: Readings | None = None
        # ids of the words in `_history` the background reader put there: the stream's own
        # model does not revise them again; and of those it read the same (`_confirmed`): the
        # stream's model revises them only where it reads them more confidently.
        self._accurate: set[int] = set()
        self._confirmed: set[int] = set()
        cfg = self.config
        self._gate = SpeechGate(cfg.vad_start_threshold, cfg.vad_end_threshold, cfg.min_silence_s)
        self._policy = LocalAgreement(carry=cfg.age_carry)
        self._stream_id = "main"
        # Audio buffer: samples from media time `_buf_t0`.
        self._chunks: list[np.ndarray] = []
        self._n = 0
        self._buf_t0: float | None = None
        # Audio cut from the front of the buffer, kept `revise_lookback_s` for the utterance-end
        # pass (contiguous: it ends where the buffer starts).
        self._past: list[np.ndarray] = []
        self._past_n = 0
        self._stream_t0 = 0.0  # media time of the first window: no word is cut there
        # Arrival wall time of each received window, keyed by the window's end (media time).
        self._arr_t: list[float] = []
        self._arr_wall: list[float] = []
        self._vad_probs: deque[VadChunk] = deque(maxlen=1500)  # ~48 s of 32 ms chunks
        self._speech_start: float | None = None  # speech seen since the last utterance end
        self._last_update_end = float("-inf")  # buffer end at the last inference
        self._hyp_end = float("-inf")  # buffer end the pending hypothesis was computed on
        self._hyp_full = False  # ... and whether it came from a full-window pass
        # Cut points (silences) in the audio kept: the buffer and the lookback store.
        self._utterance_ends: list[float] = []
        # Committed words in their latest form (prompt, trims, revisions).
        self._history: deque[Word] = deque(maxlen=400)
        self._utterance_from = float("-inf")  # where the words committed before it end
        self._pass_start: float | None = None  # where the last lookback pass's audio started
        self._full_hyp: list[Word] = []  # the last full-window hypothesis, whole...
        self._full_start = 0.0  # ... and the media time its audio started at
        self._last_partial = ""
        #: Work counters (benchmarks, stats): inferences run, seconds spent, audio received,
        #: primed decodes the stream's model runs (slide priming; a guarded pass may skip its
        #: primed decode; the lookback reader's passes count, the reviser's do not).
        self.inferences = 0
        self.primed_decodes = 0
        self.inference_s = 0.0
        self.audio_s = 0.0

    # -- lifecycle ------------------------------------------------------------------------
    async def setup(self) -> None:
        cfg = self.config
        if self._transcriber is None:
            self._transcriber = WhisperTranscriber(self.config)
        if self._vad is None:
            self._vad = await self.run_blocking(SileroVad)
        if self.config.effort != 0 and isinstance(self._transcriber, WhisperTranscriber):
            self._transcriber = await self.run_blocking(self._effort_ladder, self._transcriber)
        await self.run_blocking(self._transcriber.load)
        if not self.config.revises_in_background:
            self.reader = None  # off, or the accurate model already reads in the commit path
        elif self.reader is None and isinstance(self._transcriber, WhisperTranscriber):
            self.reader = BackgroundReader(self.config)
        if self.reader is not None:
            try:
                await self.reader.load()
            except ModelError as e:
                # Optional: the stream's own model still commits and revises everything.
                log.warning("%s: no background reviser: %s", self.name, e)
                self.reader = None
            else:
                self.reader.attach()
                self._rereads = Readings(self.reader)
        lookback = cfg.revise and cfg.revise_lookback_s > 0 and cfg.commit_before_lookback
        if lookback and cfg.lookback_async and cfg.effort == 0 and self.live:
            # Its own copy of the model (one call at a time per model); a stand-in is shared.
            own = isinstance(self._transcriber, WhisperTranscriber)
            stand_in = None if own else self._transcriber
            self.lookback_reader = BackgroundReader(cfg, stand_in, accurate=False)
            await self.lookback_reader.load()
            self.lookback_reader.attach()
            self._lookbacks = Readings(self.lookback_reader)

    async def teardown(self) -> None:
        for reader in (self.reader, self.lookback_reader):
            if reader is not None:
                reader.release()

    def _effort_ladder(self, whisper: WhisperTranscriber) -> EffortTranscriber:
        """The effort ladder around the stream's Whisper model (`effort`, docs/asr.md). Live, its
        busy share is wall time and machine CPU load counts; offline (not paced: the run keeps a
        core busy by design) only the process CPU time the recognizer takes counts."""
        probe = None
        if self.config.effort == "auto" and self.live:
            from streamfuse.qos.signals import SharedCpuProbe

            probe = SharedCpuProbe()
        clock = time.perf_counter if self.live else time.process_time
        full = effort_transcribers(whisper)
        return EffortTranscriber(
            whisper, full, self.config, probe=probe, stage=self.name, clock=clock
        )

    @property
    def effort(self) -> EffortTranscriber | None:
        """The effort ladder in use (None: effort 0 or a stand-in transcriber)."""
        t = self._transcriber
        return t if isinstance(t, EffortTranscriber) else None

    def model_info(self) -> ModelInfo | None:
        if not isinstance(self._transcriber, WhisperTranscriber | EffortTranscriber):
            return None  # not set up yet, or a stand-in transcriber
        name = Path(self.config.model).name  # `tiny.en`, or a model folder's name
        cfg = self.config
        if cfg.effort == "auto" or cfg.effort == 2 or cfg.revises_in_background:
            # the accurate model runs too
            name += "+" + Path(cfg.effort_model).name
        return ModelInfo(f"whisper {name}", cfg.compute_type, _ASR_PACKAGES)

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        assert isinstance(frame, AudioFrame)
        if frame.sample_rate != AUDIO_SAMPLE_RATE_HZ:
            raise StageError(
                f"audio at {frame.sample_rate} Hz: "
                f"the ASR stage expects {AUDIO_SAMPLE_RATE_HZ} Hz mono"
            )
        assert self._vad is not None, "setup() not run"
        if self._buf_t0 is not None and frame.stream_id != self._stream_id:
            # One recognizer state per stream: mixing a second stream's audio into this buffer
            # would splice two speakers into one transcript.
            raise StageError(
                f"audio of stream {frame.stream_id!r} reached the ASR stage of stream "
                f"{self._stream_id!r}; link one AsrStage per stream"
            )
        for revision in self._readings_done():
            yield revision
        samples = self._append(frame)
        chunks = await self.run_blocking(self._vad.push, samples)
        for chunk in chunks:
            self._vad_probs.append(chunk)
            change = self._gate.update(chunk)
            if change is None:
                continue
            if change.event is GateEvent.SPEECH_START:
                if self._speech_start is None:
                    self._speech_start = change.t
                    self._last_update_end = change.t
            else:
                async for out in self._finalize(change.t):
                    yield out
        if self._speech_start is None:
            self._keep_context()  # silence: no inference
            return
        cfg = self.config
        if cfg.age_each_window and cfg.max_word_delay_s > 0:
            # A word's age bound is kept to the window, not to the next update's end.
            until = min(self._buf_end - cfg.max_word_delay_s, self._hyp_end - cfg.agree_min_age_s)
            aged = self._policy.commit_until(until, min_p=cfg.agree_min_p)
            if aged:
                yield self._asr_event(aged, "age")
        window_s = len(frame.samples) / AUDIO_SAMPLE_RATE_HZ
        if self.live and self.backlog * window_s > cfg.coalesce_after_s:
            return  # behind: coalesce the queued audio into the next inference
        # While a pause is starting, wait for the pause update instead: a regular update
        # running then would delay the one the utterance-end commit reuses.
        due = (
            self._buf_end - self._last_update_end >= cfg.update_interval_s
            and self._gate.silence_since is None
        )
        pause = (
            self._gate.silence_s >= cfg.pause_update_s
            and self._gate.silence_since is not None
            and self._last_update_end < self._gate.silence_since + cfg.pause_update_s
        )
        if pause and cfg.pause_commit != "off" and cfg.fast_updates:
            async for out in self._pause_commit():
                yield out
        if due or pause:
            # The pause update is the one an utterance-end commit reuses: full window.
            async for out in self._update(fast=cfg.fast_updates and not pause, closing=pause):
                yield out

    async def flush(self) -> AsyncIterator[Frame]:
        """End of stream: commit everything left in the buffer."""
        if self._buf_t0 is None:
            return
        if self._speech_start is not None and self._n > 0:
            end, lookback = self._buf_end, self._lookback_start(self._buf_end)
            async for out in self._read_and_close(end, lookback, "stream_end"):
                yield out
            start = self._buf_t0 if lookback is None else lookback
            async for out in self._reread(start, end):
                yield out
        else:
            committed = self._policy.commit_all()
            if committed:
                yield self._asr_event(committed, "stream_end")
        partial = self._partial_event([])
        if partial is not None:
            yield partial
        self._speech_start = None
        for readings in self._readings:  # the last readings revise what they read
            while readings.running is not None:
                async for out in self._await_reading(readings):
                    yield out

    # -- the policy -----------------------------------------------------------------------
    async def _update(self, *, fast: bool = False, closing: bool = False) -> AsyncIterator[Frame]:
        """Re-transcribe the buffer and commit what the policy allows. `closing`: the pass at
        a pause, which the utterance end reuses (so it reads the lookback too, unless
        `commit_before_lookback`)."""
        end = self._buf_end
        # The pause's pass reaches back over the revision window, unless the utterance end
        # commits first and runs the lookback pass after (`commit_before_lookback`).
        lookback = closing and not self.config.commit_before_lookback
        start = self._lookback_start(end) if lookback else None
        words = await self._transcribe(end, fast=fast, start=start)
        self._last_update_end = self._hyp_end = end
        self._hyp_full = not fast
        if not fast:
            self._full_hyp = words
            self._full_start = start if start is not None else (self._buf_t0 or 0.0)
        assert self._buf_t0 is not None
        waiting_since = max(self._policy.committed_end, self._speech_start or self._buf_t0)
        cfg = self.config
        if fast and end - waiting_since < cfg.max_pending_s:
            self._policy.observe(words)  # a partial only: a full-window pass commits
        else:
            agreed = self._policy.insert(
                words,
                min_p=cfg.agree_min_p if fast else 0.0,
                before=end - cfg.agree_min_age_s if fast else float("inf"),
            )
            if agreed:
                yield self._asr_event(agreed, "pause" if closing else "agreement")
        if cfg.max_word_delay_s > 0:
            aged = self._policy.commit_until(end - cfg.max_word_delay_s, min_p=cfg.agree_min_p)
            if aged:
                yield self._asr_event(aged, "age")
        partial = self._partial_event(self._policy.pending)
        if partial is not None:
            yield partial
        async for out in self._maybe_trim():
            yield out

    async def _pause_commit(self) -> AsyncIterator[Frame]:
        """A pause began: a fast pass over the buffer commits what it hears before the pause
        (all of its words, or those the hypothesis before it agrees on: `pause_commit`), ahead
        of the slower full pass."""
        words = await self._transcribe(self._buf_end, fast=True)
        if self.config.pause_commit == "agreed":
            committed = self._policy.insert(words, min_p=self.config.agree_min_p)
        else:
            self._policy.observe(words)
            committed = self._policy.commit_until(self._buf_end)
        if committed:
            yield self._asr_event(committed, "pause_tail")

    async def _finalize(self, speech_end: float) -> AsyncIterator[Frame]:
        """An utterance ended (VAD silence): commit its whole hypothesis, restart the buffer."""
        cfg = self.config
        cut = min(self._buf_end, speech_end + cfg.speech_pad_s)
        lookback = self._lookback_start(cut)
        start = self._buf_t0 if lookback is None else lookback
        assert start is not None
        # The last full-window hypothesis already saw the speech end and a pause after it.
        heard_end = self._hyp_full and self._hyp_end >= speech_end + cfg.pause_update_s - 0.05
        if heard_end and self._full_start <= start:
            # ... over all the audio this pass needs: commit it as is, no more inference.
            start = self._full_start
            for out in self._close_utterance(self._full_hyp, start, rule="utterance_end"):
                yield out
        else:  # (over the buffer only, `commit_before_lookback`: its words go out first)
            heard = self._full_hyp if heard_end else None
            async for out in self._read_and_close(cut, lookback, "utterance_end", heard=heard):
                yield out
        async for out in self._reread(start, cut):
            yield out
        partial = self._partial_event([])
        if partial is not None:
            yield partial
        self._utterance_ends.append(cut)
        self._keep_context()
        if self.config.context_s == 0:
            self._policy.reset_context()
        self._speech_start = None
        self._hyp_end = float("-inf")
        self._hyp_full = False
        self._full_hyp = []
        self._utterance_from = self._policy.committed_end

    async def _read_and_close(
        self,
        until: float,
        lookback: float | None,
        rule: AsrCommitRule,
        *,
        heard: list[Word] | None = None,
    ) -> AsyncIterator[EventFrame]:
        """Read the buffer up to media time `until` and close the utterance with what it
        hears. With a `lookback` start the pass reaches back to it, unless the buffer's words
        go out first and the lookback pass follows (`commit_before_lookback`; `heard`: the
        buffer's full-window words already read, used instead of reading it again)."""
        assert self._buf_t0 is not None
        if lookback is not None and self.config.commit_before_lookback:
            words = heard if heard is not None else await self._transcribe(until)
            for out in self._close_utterance(words, self._buf_t0, rule=rule):
                yield out
            hypothesis = await self._read_back(lookback, until)
        else:
            hypothesis = await self._transcribe(until, start=lookback)
        if hypothesis is not None:
            start = self._buf_t0 if lookback is None else lookback
            for out in self._close_utterance(hypothesis, start, rule=rule):
                yield out

    async def _read_back(self, start: float, until: float) -> list[Word] | None:
        """The lookback pass after the commit (`commit_before_lookback`) over the audio from
        media time `start` to `until`: its words, or None where it is read off the commit path
        (`lookback_async`) and revises when it lands."""
        if self._lookbacks is None:
            return await self._transcribe(until, start=start)
        self._submit(self._lookbacks, start, until)
        return None

    def _close_utterance(
        self, hypothesis: list[Word], start: float, *, rule: AsrCommitRule
    ) -> list[EventFrame]:
        """The utterance ended: its full-window `hypothesis` (of the audio from media time
        `start`) corrects what was committed of it, and with a lookback of the utterances
        before (`asr_revision` events, when `revise` is on and they differ); it commits the
        rest."""
        new = self._policy.new_words(hypothesis)
        heard = hypothesis[: len(hypothesis) - len(new)]  # what it says of committed time
        events: list[EventFrame] = []
        if self.config.revise:
            events += self._revisions(heard, start)
        committed = self._policy.commit_all(hypothesis)
        if committed:
            events.append(self._asr_event(committed, rule))
        return events

    def _revision_scope(self, start: float) -> float:
        """Committed words from this media time on are what a full pass over audio from
        `start` may revise: the current utterance's, and with `revise_lookback_s` those of the
        earlier utterances in the pass's audio (heard again with what followed them). Without a
        lookback, earlier utterances the pass heard only as context are not revised: the same
        time rule as the policy's for what is new."""
        since = self._utterance_from
        if self.config.revise_lookback_s > 0:
            since = min(start, since)
        return since

    def _revisions(
        self,
        heard: list[Word],
        start: float,
        *,
        since: float | None = None,
        until: float = math.inf,
        model: str | None = None,
        keep_terms: Sequence[str] = (),
        judged_terms: Sequence[str] = (),
    ) -> list[EventFrame]:
        """Compare the committed words the full pass could hear with what it `heard` over the
        same time (its audio from media time `start`); a revision event per stretch where they
        differ. The scope: committed words from `since` (`_revision_scope`) to `until`.
        `model`: the background reader's reading (its words are not revised by the stream's
        own model later); None: the stream's model's, which leaves the reader's words alone.
        A stretch whose committed words hold one of `keep_terms` stays as committed; one that
        puts one of `judged_terms` in place of the accurate model's own words (its unprimed
        reading, landed first) was judged against them by the guard: no confidence check."""
        cfg = self.config
        tol = self._policy.time_tolerance_s
        since = self._revision_scope(start) if since is None else since
        if self._accurate or self._confirmed:  # only words still in the history count
            ids = {id(w) for w in self._history}
            self._accurate &= ids
            self._confirmed &= ids
        scope = [w for w in self._history if since - tol < w.t_start < until]
        mine = [w for w in scope if w.t_start >= start - 0.05]
        # Committed words in scope whose audio the pass did not get (the buffer was trimmed
        # inside the utterance): the pass heard a cut word where its audio starts, without its
        # context; correct only after the first word both readings agree on.
        cut = len(mine) < len(scope)
        if not mine:
            return []
        heard = [w for w in heard if w.t_start > since - tol]
        if len(heard) < cfg.revise_min_share * len(mine):
            return []  # the full pass lost most of it (a no-speech drop): keep the commits
        ops = SequenceMatcher(None, [w.key for w in mine], [w.key for w in heard], autojunk=False)
        opcodes = ops.get_opcodes()
        if cut:
            first_equal = next((op for op in opcodes if op[0] == "equal"), None)
            if first_equal is None:
                return []
            opcodes = [op for op in opcodes if op[1] >= first_equal[2]]
        stretches = []
        for i1, i2, j1, j2 in _differing_stretches(opcodes, mine, heard):
            replaced, words = mine[i1:i2], heard[j1:j2]
            if cfg.revise_lookback_s > 0 and len(words) < cfg.revise_min_share * len(replaced) - 1:
                continue  # a stretch the long pass dropped (no-speech): keep the commits
            confidence = cfg.revise_confidence if model is None else cfg.background_confidence
            # A slide term the model's own check put there was judged on its sound already
            # (its p is read with the terms in the prompt: not comparable with the others').
            checked = any(w.checked for w in words) or bool(
                judged_terms
                and replaced
                and all(id(w) in self._accurate for w in replaced)
                and count_terms([w.word for w in words], judged_terms)
            )
            if model is None:
                # What the accurate model read the stream's model does not undo; what it read
                # the same, only with a surer reading.
                confidence |= any(id(w) in self._confirmed for w in replaced)
                if any(id(w) in self._accurate for w in replaced):
                    continue
            if confidence and not checked and not _more_confident(words, replaced):
                continue
            if keep_terms and count_terms([w.word for w in replaced], keep_terms):
                continue
            stretches.append((replaced, words))
        if model is not None:
            self._confirmed.update(id(mine[i]) for i in _shared(opcodes, mine, heard))
        # A new word centred inside a committed word that stays is that word's sound read a
        # second time (a word cut where the pass's audio starts, or readings aligned apart
        # beside a stretch kept as a drop): not added, or the transcript would say it twice.
        gone = {id(w) for replaced, _ in stretches for w in replaced}
        kept = [w for w in self._history if w.t_end > since - tol and id(w) not in gone]
        events = []
        for replaced, words in stretches:
            words = [w for w in words if not _inside_any(w, kept)]
            if replaced or words:
                events.append(self._revision_event(replaced, words, model))
                if model is not None:
                    self._accurate.update(map(id, words))
        return events

    def _revision_event(
        self, replaced: list[Word], words: list[Word], model: str | None = None
    ) -> EventFrame:
        """`replaced` committed words are read as `words`: update the history, build the event."""
        gone = set(map(id, replaced))
        self._history = deque(_replaced(self._history, gone, words), maxlen=self._history.maxlen)
        span = [*replaced, *words]
        arrival = self._arrival_of(max(w.t_end for w in span))
        instruments().asr_revisions.add(1, {"stage": self.name})
        return EventFrame(
            stream_id=self._stream_id,
            t_media=min(w.t_start for w in span),
            t_end=max(w.t_end for w in span),
            arrival_wall=arrival,
            payload=AsrRevisionPayload(
                text=join_words(words),
                words=[self._word(w) for w in words],
                replaced=[self._word(w) for w in replaced],
                replaced_text=join_words(replaced),
                model=model,
            ),
        )

    # -- the background reviser -------------------------------------------------------------
    async def _reread(self, start: float, until: float) -> AsyncIterator[EventFrame]:
        """An utterance-end pass read the audio from media time `start` to `until` and its
        words are committed: hand that audio to the background reader. One reading at a time;
        live, a newer one replaces a waiting one. Offline (not paced) each reading is awaited
        before the next starts, so the revisions are the same on every run."""
        readings = self._rereads
        if readings is None:
            return
        while readings.running is not None and not self.live:
            async for out in self._await_reading(readings):
                yield out
        self._submit(readings, start, until)

    def _submit(self, readings: Readings, start: float, until: float) -> None:
        """Hand the audio from media time `start` to `until` to the reader of `readings`,
        primed and checked as a pass of its kind would be here; a reading decoded unprimed and
        primed as two steps, the unprimed one landing first (`reread_unprimed_first`)."""
        span = self._span(until, start)
        if span is None:
            return
        audio, t0 = span
        lookback = t0 < (self._buf_t0 or 0.0)
        accurate = readings.reader.accurate
        terms = self._pass_terms(t0, until, fast=False, reviser=accurate)
        mode = self._priming_mode(terms, until, fast=False, lookback=lookback)
        # Only the most accurate reading of an utterance is checked (as `_decode` does).
        check = self.config.checks_terms and (accurate or self.reader is None)
        since = self._revision_scope(start)
        job = Reread(audio.copy(), t0, self._prompt(t0), since, until, mode, terms, check)
        if self.config.reread_unprimed_first and mode in ("guarded", "merged") and terms:
            job = replace(job, mode="plain", terms=[], check=False, then=replace(job, follows=True))
        readings.submit(job)

    @property
    def _readings(self) -> tuple[Readings, ...]:
        return tuple(r for r in (self._rereads, self._lookbacks) if r is not None)

    def _readings_done(self) -> list[EventFrame]:
        """The revisions of readings that have finished (none while they run); starts the
        next. Offline none: there each reading lands at the next utterance end (`_reread`),
        never at whichever frame it happened to finish by, so a file run does not depend on how
        fast the accurate model read (its revisions change the prompt of every later pass)."""
        if not self.live:
            return []
        return [out for r in self._readings if r.done for out in self._take_reading(r)]

    async def _await_reading(self, readings: Readings) -> AsyncIterator[EventFrame]:
        await readings.wait()
        for out in self._take_reading(readings):
            yield out

    def _take_reading(self, readings: Readings) -> list[EventFrame]:
        job, result = readings.take()
        if result is None:
            return []
        raw, terms = result
        span_s = len(job.audio) / AUDIO_SAMPLE_RATE_HZ
        words = self._cleaned(raw, job.t0, span_s, terms)
        reader = readings.reader
        if job.mode != "plain" and not reader.accurate:
            self.primed_decodes += 1  # the stream's own model's pass, read off the commit path
        model = reader.model if reader.accurate else None  # None: the stream's own model
        # An unprimed reading a primed one follows leaves the slide terms to that one, whose
        # guard judged its terms against that unprimed reading.
        keep = job.then.terms if job.then is not None else ()
        judged = job.terms if job.follows else ()
        return self._revisions(
            words, job.t0, since=job.since, until=job.until, model=model, keep_terms=keep,
            judged_terms=judged,
        )  # fmt: skip

    async def _maybe_trim(self) -> AsyncIterator[Frame]:
        """Keep the buffer short: cut at a committed sentence end, or force a cut at the limit."""
        assert self._buf_t0 is not None
        cfg = self.config
        length = self._buf_end - self._buf_t0
        if length < cfg.trim_after_s:
            return
        ends = [w.t_end for w in self._history if w.ends_sentence and w.t_end > self._buf_t0]
        if ends:
            self._cut(ends[-1])
            return
        if length < cfg.max_buffer_s:
            return
        committed = self._policy.commit_until(self._buf_end - 2.0)
        if committed:
            yield self._asr_event(committed, "trim")
        t = self._policy.committed_end
        if t <= self._buf_t0:
            t = self._buf_end - cfg.trim_after_s / 2
        self._cut(min(t, self._buf_end - 1.0))

    async def _transcribe(
        self, until: float, *, fast: bool = False, start: float | None = None
    ) -> list[Word]:
        """Recognise the buffer up to media time `until` (from `start` when given: reaching back
        into the audio kept before the buffer); words in media time, guarded."""
        assert self._transcriber is not None and self._buf_t0 is not None
        span = self._span(until, start)
        if span is None:
            return []
        audio, t0 = span
        n = len(audio)
        prompt = self._prompt(t0)
        terms = self._pass_terms(t0, until, fast=fast)
        started = time.perf_counter()
        raw, terms = await self._decode(
            audio, prompt, terms, until, fast=fast, lookback=t0 < self._buf_t0
        )
        self.inference_s += time.perf_counter() - started
        self.inferences += 1
        if self.effort is not None:
            self.effort.advance(until)
        log.debug(
            "transcribed %.2f-%.2f s in %.2f s: %s",
            t0,
            t0 + n / AUDIO_SAMPLE_RATE_HZ,
            time.perf_counter() - started,
            join_words(raw),
        )
        return self._cleaned(raw, t0, n / AUDIO_SAMPLE_RATE_HZ, terms)

    def _span(self, until: float, start: float | None) -> tuple[np.ndarray, float] | None:
        """The audio kept up to media time `until`, from the buffer's start or from `start`
        (reaching back into the lookback store), and the media time it starts at; None when
        under 0.1 s."""
        assert self._buf_t0 is not None
        n = min(self._n, max(0, round((until - self._buf_t0) * AUDIO_SAMPLE_RATE_HZ)))
        if n < AUDIO_SAMPLE_RATE_HZ // 10:
            return None
        audio = self._audio()[:n]
        t0 = self._buf_t0
        if start is not None and start < t0 and self._past_n:
            k = min(self._past_n, round((t0 - start) * AUDIO_SAMPLE_RATE_HZ))
            audio = np.concatenate([self._past_audio()[-k:], audio])
            t0 -= k / AUDIO_SAMPLE_RATE_HZ
        return audio, t0

    def _cleaned(self, raw: list[Word], t0: float, span_s: float, terms: list[str]) -> list[Word]:
        """A pass's `raw` words (times from its audio's start, media time `t0`, `span_s` long)
        in media time, without the tail hallucination, a repetition loop, recited or unspoken
        terms and low-probability words in silence."""
        end = t0 + span_s
        raw = _drop_trailing_hallucination(raw, span_s, self.config.trailing_word_min_p)
        raw = _cut_repetition_loop(raw, self.config.loop_ngram)
        raw = drop_recited(raw, terms)
        words = []
        for w in raw:
            w = replace(w, t_start=w.t_start + t0, t_end=min(w.t_end + t0, end))
            if w.p < self.config.silence_word_max_p and self._in_silence(w):
                log.debug("dropped %r (p=%.2f) in silence at %.2f s", w.word, w.p, w.t_start)
                continue
            words.append(w)
        if terms:
            min_speech = self.config.prime_min_speech
            words = drop_unspoken_terms(words, terms, self._speech_prob, min_speech)
        return words

    async def _decode(
        self,
        audio: np.ndarray,
        prompt: str,
        terms: list[str],
        until: float,
        *,
        fast: bool,
        lookback: bool,
    ) -> tuple[list[Word], list[str]]:
        """One pass's words, and the terms it was primed with ([]: read unprimed), read as
        `_priming_mode` says."""
        assert self._transcriber is not None
        mode = self._priming_mode(terms, until, fast=fast, lookback=lookback)
        if mode != "plain":
            self.primed_decodes += 1
        # Without a reviser the full-window passes are the most accurate reading: checked.
        check = self.config.checks_terms and self.reader is None and not fast
        return await self.run_blocking(
            read_pass, self._transcriber, audio, prompt, mode, terms,
            check=check, min_p=self.config.prime_score_min_p, fast=fast,
        )  # fmt: skip

    def _priming_mode(
        self, terms: Sequence[str], until: float, *, fast: bool, lookback: bool
    ) -> PrimingMode:
        """How a pass ending at media time `until` reads with the slide `terms`. Guarded
        (`prime_guard`), it is read unprimed and primed, and the guard keeps the unprimed
        reading except where the primed one hears a term in place of words spelled like it; a
        pass the guard does not cover is read unprimed. Once the words heard (committed or
        pending) in the last `prime_window_s` hold `prime_trust_terms` distinct terms still on
        screen, the slides carry the speech: a pass the guard covers is read as `prime_trusted`
        says ('merged': guarded, a short stretch heard as a term taken however it is spelled),
        every other pass primed only. With the guard off every pass is read primed only; with
        'score' none is (terms get in only by the check, `AsrConfig.checks_terms`)."""
        if not terms:
            return "plain"
        if self.config.prime_guard == "score":
            return "plain"
        if self.config.prime_guard == "off":
            return "primed"
        guarded = self._guarded(fast=fast, lookback=lookback)
        if self._trusted(terms, until):
            return "merged" if guarded and self.config.prime_trusted == "merged" else "primed"
        return "guarded" if guarded else "plain"

    def _trusted(self, terms: Sequence[str], t: float) -> bool:
        """Whether the words heard lately say `prime_trust_terms` distinct terms of `terms`."""
        need = self.config.prime_trust_terms
        heard = self._heard_since(t - self.config.prime_window_s)
        return need > 0 and len(count_terms((w.word for w in heard), terms)) >= need

    def _heard_since(self, since: float) -> list[Word]:
        """The words committed or pending that end at or after media time `since`."""
        return [w for w in (*self._history, *self._policy.pending) if w.t_end >= since]

    # -- events ---------------------------------------------------------------------------
    def _asr_event(self, words: Sequence[Word], rule: AsrCommitRule) -> EventFrame:
        """Commit `words` by `rule` (named in the event: which rule a word's latency is owed to)."""
        self._history.extend(words)
        arrival = self._arrival_of(words[-1].t_end)
        latency_s = max(0.0, now_wall() - arrival)
        instruments().asr_commit_latency.record(latency_s, {"stage": self.name})
        if self.live and self.effort is not None:
            self.effort.record_latency(latency_s)
        return EventFrame(
            stream_id=self._stream_id,
            t_media=words[0].t_start,
            t_end=words[-1].t_end,
            arrival_wall=arrival,
            payload=AsrPayload(
                text=join_words(words), words=[self._word(w) for w in words], rule=rule
            ),
        )

    def _word(self, word: Word) -> AsrWord:
        """The word's payload; calibrated, `p` is P(right) and `p_raw` Whisper's probability
        (the stage's own thresholds above always use the raw one)."""
        out = word.to_payload()
        if self._calibrator is None:
            return out
        # What the calibrator knows besides p: the raw p of the stream's latest committed words
        # (this event's are in the history already) and the tokenizer's count for the word.
        recent = [round(w.p, 3) for w in list(self._history)[-ASR_RECENT_WORDS:]]
        core = asr_core(out.word)
        tokens = self._transcriber.token_count(core) if self._transcriber and core else 2
        p = calibrate_asr_word(self._calibrator, out.word, out.p, recent, tokens)
        return AsrWord(**{**out.model_dump(), "p": p, "p_raw": out.p})

    def _partial_event(self, words: Sequence[Word]) -> EventFrame | None:
        text = join_words(words)
        if not self.config.emit_partials or text == self._last_partial:
            return None
        self._last_partial = text
        t = words[0].t_start if words else self._buf_end
        return EventFrame(
            stream_id=self._stream_id,
            t_media=t,
            t_end=words[-1].t_end if words else t,
            arrival_wall=self._arrival_of(self._buf_end),
            payload=AsrPartialPayload(text=text),
        )

    @property
    def last_arrival_wall(self) -> float:
        """Arrival wall time of the newest audio window received (nan before any)."""
        return self._arr_wall[-1] if self._arr_wall else float("nan")

    # -- buffers --------------------------------------------------------------------------
    @property
    def _buf_end(self) -> float:
        return (self._buf_t0 or 0.0) + self._n / AUDIO_SAMPLE_RATE_HZ

    def _append(self, frame: AudioFrame) -> np.ndarray:
        """Add a window to the buffer (filling a gap with silence); return what VAD must see."""
        samples = np.asarray(frame.samples, dtype=np.float32).reshape(-1)
        if self._buf_t0 is None:
            self._buf_t0 = frame.t_media
            self._stream_t0 = self._pass_start = frame.t_media
            self._stream_id = frame.stream_id
            assert self._vad is not None
            self._vad.reset(frame.t_media)
        else:
            gap = frame.t_media - self._buf_end
            if gap > 0.01:
                fill = np.zeros(round(min(gap, _MAX_GAP_FILL_S) * AUDIO_SAMPLE_RATE_HZ), np.float32)
                samples = np.concatenate([fill, samples])
        self._chunks.append(samples)
        self._n += len(samples)
        self.audio_s += len(samples) / AUDIO_SAMPLE_RATE_HZ
        self._arr_t.append(self._buf_end)
        self._arr_wall.append(frame.arrival_wall)
        if len(self._arr_t) > 6000:  # 2 min of windows: drop the older half
            del self._arr_t[:3000], self._arr_wall[:3000]
        return samples

    def _audio(self) -> np.ndarray:
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros(0, np.float32)

    def _cut(self, t: float) -> None:
        """Drop buffered audio before media time `t`."""
        assert self._buf_t0 is not None
        k = min(self._n, max(0, round((t - self._buf_t0) * AUDIO_SAMPLE_RATE_HZ)))
        if k == 0:
            return
        audio = self._audio()
        self._chunks = [audio[k:]] if len(audio) > k else []
        self._n = len(audio) - k
        self._buf_t0 += k / AUDIO_SAMPLE_RATE_HZ
        cfg = self.config
        reach_s = max(cfg.revise_lookback_s, cfg.revise_window_s)
        keep = round(reach_s * AUDIO_SAMPLE_RATE_HZ) if cfg.revise and cfg.revise_lookback_s else 0
        if keep:
            # The cut audio goes to the lookback store, trimmed to how far a pass reaches back.
            self._past.append(audio[:k])
            self._past_n += k
            if self._past_n > keep + AUDIO_SAMPLE_RATE_HZ:
                past = self._past_audio()[-keep:]
                self._past, self._past_n = [past], len(past)
        past_t0 = self._past_t0()
        self._utterance_ends = [t for t in self._utterance_ends if t >= past_t0 - 1e-6]

    def _past_t0(self) -> float:
        """Media time where the audio kept (lookback store, then buffer) starts."""
        assert self._buf_t0 is not None
        return self._buf_t0 - self._past_n / AUDIO_SAMPLE_RATE_HZ

    def _past_audio(self) -> np.ndarray:
        if len(self._past) > 1:
            self._past = [np.concatenate(self._past)]
        return self._past[0] if self._past else np.zeros(0, np.float32)

    def _lookback_start(self, until: float) -> float | None:
        """Where the full pass ending at media time `until` starts its audio: the earliest
        utterance end within `revise_lookback_s` kept before the buffer (never inside a word),
        else the buffer's start (None); or, within `revise_window_s`, where the last lookback
        pass started."""
        cfg = self.config
        if not (cfg.revise and cfg.revise_lookback_s > 0) or self._buf_t0 is None:
            return None
        kept_from = self._past_t0() - 1e-6
        last = self._pass_start
        if (
            last is not None
            and kept_from <= last < self._buf_t0
            and until - last <= cfg.revise_window_s
        ):
            return last
        lo = max(until - cfg.revise_lookback_s, kept_from)
        starts = (self._stream_t0, *self._utterance_ends)
        start = min((t for t in starts if lo <= t < self._buf_t0), default=None)
        if start is not None:
            self._pass_start = start
        return start

    def _keep_context(self) -> None:
        """Between utterances: keep the newest whole utterances within `context_s` (Whisper
        recognises better with the sentences before), cut at an utterance end, else keep only
        the padding before the next speech."""
        assert self._buf_t0 is not None
        limit = self._buf_end - self.config.context_s
        ends = [t for t in self._utterance_ends if t >= max(limit, self._buf_t0)]
        if ends and self.config.context_s > 0:
            self._cut(ends[0])
            return
        pad = self.config.speech_pad_s + 0.1
        if self._n > 2 * pad * AUDIO_SAMPLE_RATE_HZ:
            self._cut(self._buf_end - pad)

    def _arrival_of(self, t: float) -> float:
        """Arrival wall time of the window that holds media time `t`."""
        if not self._arr_t:
            return now_wall()
        i = bisect.bisect_left(self._arr_t, t - 1e-6)
        return self._arr_wall[min(i, len(self._arr_wall) - 1)]

    def _speech_prob(self, w: Word) -> float:
        """Mean VAD speech probability over the word's span (1 when none was computed)."""
        probs = [c.prob for c in self._vad_probs if c.t_end > w.t_start and c.t_start < w.t_end]
        return sum(probs) / len(probs) if probs else 1.0

    def _in_silence(self, w: Word) -> bool:
        probs = [c.prob for c in self._vad_probs if c.t_end > w.t_start and c.t_start < w.t_end]
        return bool(probs) and max(probs) < self.config.vad_end_threshold

    def _terms(self, t: float) -> list[str]:
        """Rare words read on screen lately (newest first, capped), for priming."""
        cfg = self.config
        screen = self.screen_terms
        if screen is None or cfg.prime_max_terms == 0 or self._transcriber is None:
            return []
        heard = self._heard_since(t - cfg.prime_window_s)
        if not relevant(heard, screen.lines(t), cfg.prime_min_overlap):
            return []
        return screen.terms(t, self._transcriber.token_count, cfg.prime_max_terms)

    def _pass_terms(
        self, t0: float, until: float, *, fast: bool, reviser: bool = False
    ) -> list[str]:
        """The slide terms a pass over the audio from media time `t0` to `until` is primed
        with: none for fast passes unless `prime_fast`, none for a lookback pass (re-reading
        utterances before the buffer) unless `prime_lookback`, none for the stream's own passes
        (not the `reviser`'s readings) when `prime_stream` is off and a reviser runs."""
        cfg = self.config
        lookback = t0 < (self._buf_t0 or 0.0)
        if (lookback and not cfg.prime_lookback) or (fast and not cfg.prime_fast):
            return []
        if not (reviser or cfg.prime_stream or self.reader is None):
            return []
        return self._terms(until)

    def _guarded(self, *, fast: bool, lookback: bool) -> bool:
        """Whether a primed pass is checked against an unprimed one (`prime_guard`)."""
        guard = self.config.prime_guard
        return (
            guard == "all" or (guard == "full" and not fast) or (guard == "lookback" and lookback)
        )

    def _prompt(self, t0: float) -> str:
        """Committed text that precedes media time `t0`, where the audio transcribed starts
        (text inside that audio would be skipped)."""
        limit = self.config.prompt_chars
        if limit == 0:
            return ""
        before = [w for w in self._history if w.t_end <= t0 + 1e-3]
        text = join_words(before)
        if len(text) > limit:
            text = text[-limit:].split(" ", 1)[-1]  # start at a word boundary
        return text


def _differing_stretches(
    opcodes: Sequence[tuple[str, int, int, int, int]], old: Sequence[Word], new: Sequence[Word]
) -> list[tuple[int, int, int, int]]:
    """The stretches where two readings of the same audio differ, as `(i1, i2, j1, j2)` slices
    of `old` and `new`: `SequenceMatcher` opcodes, with neighbouring differences joined across
    words the readings share only by chance (placed more than `_ANCHOR_MAX_SHIFT_S` apart in
    time, on average: not the same sound). Each stretch is then kept or replaced whole: judged
    piecewise, a deletion kept beside an insertion applied interleaves both readings."""
    out: list[list[int]] = []
    anchored = True  # the words shared since the last difference are the same sound
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal":
            anchored = _anchored(old[i1:i2], new[j1:j2])
        elif out and not anchored:
            out[-1][1], out[-1][3] = i2, j2  # one stretch, through the chance match
        else:
            out.append([i1, i2, j1, j2])
            anchored = False
    return [(a, b, c, d) for a, b, c, d in out]


def _anchored(old: Sequence[Word], new: Sequence[Word]) -> bool:
    """Are words two readings share (`old`, `new`: the same words) the same sound: placed within
    `_ANCHOR_MAX_SHIFT_S` of each other in time, on average?"""
    shift = sum(abs(a.t_start - b.t_start) for a, b in zip(old, new, strict=True))
    return shift / len(old) <= _ANCHOR_MAX_SHIFT_S


def _shared(
    opcodes: Sequence[tuple[str, int, int, int, int]], old: Sequence[Word], new: Sequence[Word]
) -> list[int]:
    """Indices into `old` of the words both readings hold as the same sound (`_anchored`)."""
    return [
        i
        for tag, i1, i2, j1, j2 in opcodes
        if tag == "equal" and _anchored(old[i1:i2], new[j1:j2])
        for i in range(i1, i2)
    ]


def _inside_any(word: Word, others: list[Word]) -> bool:
    """Is the middle of `word` inside the time of one of `others`?"""
    mid = (word.t_start + word.t_end) / 2
    return any(w.t_start < mid < w.t_end for w in others)


def _more_confident(new: Sequence[Word], old: Sequence[Word]) -> bool:
    """Is the reading `new` of a stretch more confident than `old` (mean log word probability,
    each as its own pass gave it)? Words added where none were committed need p >= 0.5 on
    average, and committed words are deleted only where their mean p is below 0.5."""
    if not old:
        return sum(w.p for w in new) / len(new) >= 0.5
    if not new:
        return sum(w.p for w in old) / len(old) < 0.5
    return _mean_log_p(new) > _mean_log_p(old)


def _mean_log_p(words: Sequence[Word]) -> float:
    return sum(math.log(max(w.p, 1e-4)) for w in words) / len(words)


def _replaced(words: Iterable[Word], gone: set[int], new: Sequence[Word]) -> list[Word]:
    """`words` without those whose id is in `gone`, plus `new`, in media order."""
    return sorted([*(w for w in words if id(w) not in gone), *new], key=lambda w: w.t_start)


def _drop_trailing_hallucination(words: list[Word], audio_s: float, min_p: float) -> list[Word]:
    """Cut Whisper's classic tail hallucination ("... behind. Save.", "Thank you very much.").

    Only near the end of the buffer: a word that follows a sentence end with a probability
    below `min_p`, and everything after it, when all of it lies in the last 1.5 s. Real words
    cut this way come back in the next hypothesis, once they are no longer at the tail.
    """
    for i in range(1, len(words)):
        if (
            words[i - 1].ends_sentence
            and words[i].p < min_p
            and words[i].t_start >= audio_s - _TAIL_S
        ):
            return words[:i]
    return words


#: A repetition loop: one `loop_ngram` words long phrase read this often within this many words.
_LOOP_REPEATS, _LOOP_SPAN = 3, 32


def _cut_repetition_loop(words: list[Word], n: int) -> list[Word]:
    """Cut Whisper's decoder loop ("I'm going to be on the beach, and I'm going to be on the
    beach, and I'm going to be on the ..."), which noise (babble) sets off: from the first
    place where a phrase of `n` words (by key) starts that recurs `_LOOP_REPEATS` times within
    `_LOOP_SPAN` words (overlapping: "sure sure sure sure sure sure" is one with n=4). Speech
    says a four-word phrase twice ("it was the age of wisdom, it was the age of
    foolishness"), seldom three times in half a minute. 0 disables."""
    if n <= 0:
        return words
    keys = [w.key for w in words]
    phrases = [tuple(keys[i : i + n]) for i in range(len(keys) - n + 1)]
    for i, phrase in enumerate(phrases):
        if phrases[i : i + _LOOP_SPAN - n + 1].count(phrase) >= _LOOP_REPEATS:
            log.debug("cut a repetition loop of %r at %.2f s", " ".join(phrase), words[i].t_start)
            return words[:i]
    return words


__all__ = ["AsrConfig", "AsrStage"]
