"""Silero VAD in streaming use: silence vs speech, same result as one pass; gate hysteresis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamfuse.audio.vad import CHUNK, GateEvent, SileroVad, SpeechGate, VadChunk
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ

pytestmark = pytest.mark.unit

SHORT = Path(__file__).resolve().parents[2] / "assets" / "test" / "short.mp4"


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    from faster_whisper import decode_audio

    return np.asarray(
        decode_audio(str(SHORT), sampling_rate=AUDIO_SAMPLE_RATE_HZ), dtype=np.float32
    )


def _stream(vad: SileroVad, audio: np.ndarray, window: int = 320) -> list[VadChunk]:
    out: list[VadChunk] = []
    for i in range(0, len(audio), window):
        out += vad.push(audio[i : i + window])
    return out


def test_silence_and_noise_are_not_speech() -> None:
    rng = np.random.default_rng(0)
    audio = np.concatenate(
        [np.zeros(AUDIO_SAMPLE_RATE_HZ), 0.003 * rng.standard_normal(AUDIO_SAMPLE_RATE_HZ)]
    )
    chunks = _stream(SileroVad(), audio.astype(np.float32))
    assert len(chunks) == len(audio) // CHUNK
    assert max(c.prob for c in chunks) < 0.2


def test_speech_is_detected_inside_the_truth_intervals(speech: np.ndarray) -> None:
    chunks = _stream(SileroVad(), speech)
    probs = np.array([c.prob for c in chunks])
    times = np.array([c.t_start for c in chunks])
    assert probs[(times > 1.0) & (times < 3.0)].mean() > 0.6  # "This is a short test ..."
    assert probs[times < 0.3].max() < 0.5  # leading silence
    # 20 ms windows give the same probabilities as faster-whisper's whole-array pass.
    from faster_whisper.vad import get_vad_model

    n = len(speech) // CHUNK * CHUNK
    batch = get_vad_model()(speech[:n].copy()).reshape(-1)
    np.testing.assert_allclose(probs[: len(batch)], batch, atol=1e-2)


def test_gate_hysteresis_needs_min_silence_to_end() -> None:
    gate = SpeechGate(start_threshold=0.5, end_threshold=0.35, min_silence_s=0.3)
    probs = [0.1, 0.6, 0.9, 0.4, 0.2, 0.2, 0.8, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    events = []
    for i, p in enumerate(probs):
        change = gate.update(VadChunk(i * 0.1, (i + 1) * 0.1, p))
        if change:
            events.append((change.event, round(change.t, 2)))
    # 0.4 keeps speech going (above the end threshold); a 0.2 s dip does not end it;
    # three 0.1 s chunks of silence from 0.7 s do.
    assert events == [(GateEvent.SPEECH_START, 0.1), (GateEvent.SPEECH_END, 0.7)]
    assert not gate.in_speech
