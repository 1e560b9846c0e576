"""Streaming voice activity detection: Silero VAD (the ONNX model inside faster-whisper).

`SileroVad.push(samples)` takes 16 kHz audio of any length and returns one speech probability
per complete 512-sample chunk (32 ms), carrying the LSTM state and the 64-sample context between
calls, so streaming gives the same probabilities as faster-whisper's whole-file pass.
`SpeechGate` turns probabilities into utterances with hysteresis: speech starts when a chunk
reaches `start_threshold`, and ends after `min_silence_s` of chunks below `end_threshold`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamfuse.errors import ModelError
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ
from streamfuse.models import ort_session_options

CHUNK = 512
_CONTEXT = 64


def silero_model_path() -> Path:
    """The Silero VAD ONNX file that ships with faster-whisper."""
    from faster_whisper.utils import get_assets_path

    path = Path(get_assets_path()) / "silero_vad_v6.onnx"
    if not path.is_file():
        raise ModelError(f"Silero VAD model not found at {path} (faster-whisper 1.2.x expected)")
    return path


@dataclass(frozen=True, slots=True)
class VadChunk:
    """Speech probability of the chunk covering [t_start, t_end) in media seconds."""

    t_start: float
    t_end: float
    prob: float


class SileroVad:
    """Stateful streaming Silero VAD over 512-sample chunks at 16 kHz."""

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime

        # One chunk is ~0.1 ms of work: more threads only add contention with the ASR model.
        opts = ort_session_options(intra_op_threads=1, inter_op_threads=1)
        model = path or silero_model_path()
        try:
            self._session: Any = onnxruntime.InferenceSession(
                str(model), providers=["CPUExecutionProvider"], sess_options=opts
            )
        except Exception as e:  # onnxruntime raises its own untyped errors
            raise ModelError(f"cannot load Silero VAD from {model}: {e}") from e
        self.reset()

    def reset(self, t_media: float = 0.0) -> None:
        """Forget state; the next sample pushed is at media time `t_media`."""
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(_CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._t_next = t_media  # media time of the first pending sample

    def push(self, samples: np.ndarray) -> list[VadChunk]:
        """Add audio; return the probabilities of the chunks it completed."""
        pending = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        n = len(pending) // CHUNK
        out: list[VadChunk] = []
        for i in range(n):
            chunk = pending[i * CHUNK : (i + 1) * CHUNK]
            x = np.concatenate([self._context, chunk])[None, :]
            prob, self._h, self._c = self._session.run(
                None, {"input": x, "h": self._h, "c": self._c}
            )
            self._context = chunk[-_CONTEXT:]
            t0 = self._t_next
            self._t_next = t0 + CHUNK / AUDIO_SAMPLE_RATE_HZ
            out.append(VadChunk(t0, self._t_next, float(np.asarray(prob).reshape(-1)[0])))
        self._pending = pending[n * CHUNK :]
        return out


class GateEvent(enum.Enum):
    SPEECH_START = "speech_start"
    SPEECH_END = "speech_end"


@dataclass(frozen=True, slots=True)
class GateChange:
    """An utterance boundary: speech started at, or ended at, media time `t`."""

    event: GateEvent
    t: float


class SpeechGate:
    """Hysteresis over chunk probabilities: utterance start and end events."""

    def __init__(
        self, start_threshold: float = 0.5, end_threshold: float = 0.35, min_silence_s: float = 0.4
    ) -> None:
        self.start_threshold = start_threshold
        self.end_threshold = end_threshold
        self.min_silence_s = min_silence_s
        self.in_speech = False
        #: Media time where the current run of low-probability chunks began (in speech only).
        self.silence_since: float | None = None
        #: Media time of the end of the last chunk seen.
        self.t_now = 0.0

    def update(self, chunk: VadChunk) -> GateChange | None:
        self.t_now = chunk.t_end
        if not self.in_speech:
            if chunk.prob >= self.start_threshold:
                self.in_speech = True
                self.silence_since = None
                return GateChange(GateEvent.SPEECH_START, chunk.t_start)
            return None
        if chunk.prob >= self.end_threshold:
            self.silence_since = None
            return None
        if self.silence_since is None:
            self.silence_since = chunk.t_start
        if chunk.t_end - self.silence_since >= self.min_silence_s - 1e-9:
            end = self.silence_since
            self.in_speech = False
            self.silence_since = None
            return GateChange(GateEvent.SPEECH_END, end)
        return None

    @property
    def silence_s(self) -> float:
        """Length of the current in-speech pause (0 when not pausing)."""
        if not self.in_speech or self.silence_since is None:
            return 0.0
        return self.t_now - self.silence_since


__all__ = ["CHUNK", "GateChange", "GateEvent", "SileroVad", "SpeechGate", "VadChunk"]
