"""The model boundary of streaming ASR: audio buffer in, timed words out.

`Transcriber.transcribe(audio, prompt)` returns `Word`s with times relative to the start of
`audio`, already cleaned of segments Whisper itself marks as no-speech. `WhisperTranscriber` runs
faster-whisper (CTranslate2, int8 on CPU) greedily with word timestamps; with `fast=True` it
encodes only the buffered audio instead of a zero-padded 30 s window; `hotwords` (terms read on
screen) go before the prompt, as Whisper's "previous text". Blocking: call it from the stage's
worker thread.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamfuse.audio.config import AsrConfig
from streamfuse.audio.models import resolve_whisper_model
from streamfuse.audio.policy import Word
from streamfuse.errors import ModelError
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ

log = logging.getLogger(__name__)

_FRAMES_PER_S = 100  # Whisper log-mel frames per second
_FULL_FRAMES = 3000
_MAX_TOKENS_PER_S = 8
_PROMPT_TOKENS = 448  # Whisper's text context; a prompt gets half of it, as in faster-whisper


class Transcriber(ABC):
    """Turns a mono 16 kHz buffer into timed words (times relative to the buffer start)."""

    def load(self) -> None:
        """Load the model (blocking; called once from the stage's worker thread)."""

    @abstractmethod
    def transcribe(
        self,
        audio: np.ndarray,
        prompt: str = "",
        *,
        fast: bool = False,
        hotwords: Sequence[str] = (),
    ) -> list[Word]:
        """Recognise `audio`; `prompt` is earlier committed text, for context. `fast` asks for
        a cheaper, less accurate pass (a short encoder window) when the model supports it.
        `hotwords`: terms likely to be spoken (read on screen), to bias recognition to them."""

    def token_count(self, word: str) -> int:
        """How many tokens the model spends on `word` (1: a word it knows well). The default
        knows no tokenizer and counts every word as rare."""
        return 2

    def score(
        self,
        audio: np.ndarray,
        prompt: str,
        texts: Sequence[Sequence[str]],
        *,
        hotwords: Sequence[str] = (),
    ) -> list[list[tuple[float, int]]] | None:
        """How likely the model finds each of `texts` (a text: its words) as the transcript of
        `audio`, read after `prompt` (and `hotwords`, as `transcribe` puts them): per text,
        each word's log probability (its tokens' summed) and its number of tokens,
        teacher-forced over the same encoding. None: this model cannot score a given text."""
        return None


class _TailWindow(Exception):
    """faster-whisper was about to read a short tail after a window as another window."""


def _content_frames(features: np.ndarray) -> int:
    """Mel frames of a window before the zero columns faster-whisper pads it with to 30 s."""
    filled = np.flatnonzero(np.any(features != 0.0, axis=0))
    return int(filled[-1]) + 1 if len(filled) else 0


def _make_whisper(path: Path, config: AsrConfig) -> Any:
    from faster_whisper import WhisperModel

    class _Whisper(WhisperModel):
        """WhisperModel whose encoder sees only `frames` mel frames when that is set."""

        frames: int | None = None
        _encoded: tuple[np.ndarray, Any] | None = None  # the last features and their encoding
        #: While set (by `WhisperTranscriber.transcribe`), a window after the first whose audio
        #: is shorter than this many frames is not read: `_TailWindow` is raised instead.
        tail_min_frames: int | None = None
        windows = 0  # windows encoded since `tail_min_frames` was set

        def encode(self, features: np.ndarray) -> Any:
            if self.tail_min_frames is not None:
                if self.windows and _content_frames(features) < self.tail_min_frames:
                    raise _TailWindow
                self.windows += 1
            if self.frames is not None and features.shape[-1] > self.frames:
                features = np.ascontiguousarray(features[..., : self.frames])
            # The same audio decoded twice (primed and unprimed, `prime_guard`) is encoded once:
            # the encoder is most of a call's cost. Compared, not hashed: `array_equal` of
            # another shape (most calls) costs nothing, of the same shape ~0.05 ms.
            last = self._encoded
            if last is not None and np.array_equal(last[0], features):
                return last[1]
            out = super().encode(features)
            self._encoded = (features, out)
            return out

    return _Whisper(
        str(path), device="cpu", compute_type=config.compute_type, cpu_threads=config.cpu_threads
    )


class WhisperTranscriber(Transcriber):
    def __init__(self, config: AsrConfig) -> None:
        self.config = config
        self.path = resolve_whisper_model(config.model)
        self._model: Any = None
        self.calls = 0
        self.audio_s = 0.0
        self._token_counts: dict[str, int] = {}

    def load(self) -> None:
        if self._model is not None:
            return
        try:
            self._model = _make_whisper(self.path, self.config)
        except Exception as e:  # CTranslate2 raises RuntimeError/ValueError with a bare message
            raise ModelError(f"cannot load Whisper model from {self.path}: {e}") from e
        self._english_only = not bool(self._model.model.is_multilingual)

    def variant(self, **updates: object) -> WhisperTranscriber:
        """This transcriber with some decoding settings changed (e.g. `full_beam_size`),
        sharing its loaded model: for settings that do not change the model itself."""
        self.load()
        other = WhisperTranscriber(self.config.model_copy(update=updates))
        other._model, other._english_only = self._model, self._english_only
        other._token_counts = self._token_counts
        return other

    def context_frames(self, n_samples: int, fast: bool = True) -> int | None:
        """Mel frames the encoder sees for a buffer of `n_samples` (None: the full 30 s)."""
        if not fast:
            return None
        seconds = n_samples / AUDIO_SAMPLE_RATE_HZ + self.config.context_pad_s
        frames = int(math.ceil(seconds)) * _FRAMES_PER_S  # whole seconds: few distinct shapes
        return frames if frames < _FULL_FRAMES else None

    def token_count(self, word: str) -> int:
        n = self._token_counts.get(word)
        if n is None:
            self.load()
            ids = self._model.hf_tokenizer.encode(" " + word, add_special_tokens=False).ids
            n = self._token_counts[word] = len(ids)
        return n

    def transcribe(
        self,
        audio: np.ndarray,
        prompt: str = "",
        *,
        fast: bool = False,
        hotwords: Sequence[str] = (),
    ) -> list[Word]:
        self.load()
        model = self._model
        model.frames = self.context_frames(len(audio), fast)
        cfg = self.config
        tail_frames = round(cfg.tail_window_min_s * _FRAMES_PER_S)
        model.tail_min_frames, model.windows = (tail_frames or None), 0
        try:
            segments = self._segments(audio, prompt, fast, hotwords)
        except IndexError:
            if not hotwords:
                raise
            # faster-whisper's word alignment can fail on a hypothesis the hotwords steered
            # into an empty segment; the unprimed pass is the fallback.
            log.debug("word alignment failed with hotwords %s; retrying without", hotwords)
            model.windows = 0
            segments = self._segments(audio, prompt, fast, ())
        finally:
            model.tail_min_frames = None
        words: list[Word] = []
        for seg in segments:
            if seg.no_speech_prob > cfg.no_speech_threshold and seg.avg_logprob < (
                cfg.logprob_threshold
            ):
                log.debug("dropped no-speech segment %r", seg.text)
                continue
            if seg.compression_ratio > cfg.compression_ratio_threshold:
                log.debug("dropped repetitive segment %r", seg.text)
                continue
            for w in seg.words or []:
                if Word(w.word, 0.0, 0.0).key:  # not punctuation alone
                    words.append(Word(w.word, float(w.start), float(w.end), float(w.probability)))
        self.calls += 1
        self.audio_s += len(audio) / AUDIO_SAMPLE_RATE_HZ
        return words

    def score(
        self,
        audio: np.ndarray,
        prompt: str,
        texts: Sequence[Sequence[str]],
        *,
        hotwords: Sequence[str] = (),
    ) -> list[list[tuple[float, int]]] | None:
        from faster_whisper.audio import pad_or_trim

        self.load()
        model = self._model
        # The encoder sees only the audio (whole seconds), as a fast pass reads it.
        model.frames = self.context_frames(len(audio), fast=True)
        features = model.feature_extractor(np.ascontiguousarray(audio, dtype=np.float32))
        frames = min(features.shape[-1] - 1, _FULL_FRAMES)
        encoded = model.encode(pad_or_trim(features[:, :frames]))
        tokenizer = self._tokenizer()
        # The context as faster-whisper builds it for a decode (hotwords, then the previous
        # text, then the task). CTranslate2's forced alignment reads garbage probabilities
        # after a bare one-token start, so the previous-text marker always opens it.
        start = [tokenizer.sot_prev]
        if hotwords:
            start += tokenizer.encode(" " + ", ".join(hotwords))[: _PROMPT_TOKENS // 2]
        if prompt:
            start += tokenizer.encode(" " + prompt.strip())[-(_PROMPT_TOKENS // 2) :]
        start += [*tokenizer.sot_sequence, tokenizer.no_timestamps]
        out: list[list[tuple[float, int]]] = []
        for words in texts:
            # Word by word, each with its leading space: the same tokens as the whole text
            # (the tokenizer splits at spaces first), and each token's word is known.
            pieces = [tokenizer.encode(" " + w.strip()) for w in words]
            tokens = [t for piece in pieces for t in piece]
            if not tokens:
                out.append([])
                continue
            probs = model.model.align(encoded, start, [tokens], frames)[0].text_token_probs
            logs = iter(math.log(max(p, 1e-12)) for p in probs)
            out.append([(sum(next(logs) for _ in piece), len(piece)) for piece in pieces])
        return out

    def _tokenizer(self) -> Any:
        from faster_whisper.tokenizer import Tokenizer

        multilingual = not self._english_only
        language = self.config.language if multilingual else None
        return Tokenizer(self._model.hf_tokenizer, multilingual, "transcribe", language)

    def _segments(
        self, audio: np.ndarray, prompt: str, fast: bool, hotwords: Sequence[str]
    ) -> list[Any]:
        cfg = self.config
        language = "en" if self._english_only else cfg.language
        segments, _ = self._model.transcribe(
            np.ascontiguousarray(audio, dtype=np.float32),
            language=language,
            beam_size=cfg.beam_size if fast else max(cfg.beam_size, cfg.full_beam_size),
            best_of=1,
            temperature=0.0,
            condition_on_previous_text=False,
            initial_prompt=prompt or None,
            hotwords=", ".join(hotwords) or None,
            word_timestamps=True,
            without_timestamps=False,
            vad_filter=False,
            # Fallback thresholds only matter with temperature fallback, which streaming skips.
            compression_ratio_threshold=None,
            log_prob_threshold=None,
            no_speech_threshold=None,
            # Speech rarely exceeds ~5 tokens/s: the bound stops a degenerate repetition loop
            # early instead of decoding hundreds of tokens of it.
            max_new_tokens=int(_MAX_TOKENS_PER_S * len(audio) / AUDIO_SAMPLE_RATE_HZ) + 16,
        )
        # Decoding runs lazily, while iterating. A window ending in a closed segment makes
        # faster-whisper read on from its last word as a new window (a whole encoder run): a
        # tail shorter than `tail_window_min_s` stops it, keeping the windows read before.
        read: list[Any] = []
        try:
            read.extend(segments)
        except _TailWindow:
            log.debug("skipped a tail window after %d segments", len(read))
        return read


__all__ = ["Transcriber", "WhisperTranscriber"]
