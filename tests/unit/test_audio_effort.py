"""The ASR effort ladder: passes routed to their rung's transcriber, the rung moved by measured
busy share per second of audio (fake transcribers and a fake clock: the model boundary)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from streamfuse.audio import AsrConfig, Transcriber, Word
from streamfuse.audio.effort import EffortTranscriber
from streamfuse.qos.effort import EffortControllerConfig

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Costly(Transcriber):
    """Takes `cost_s` of the fake clock per call and says which transcriber it is."""

    def __init__(self, name: str, clock: Clock, cost_s: float) -> None:
        self.name, self.clock, self.cost_s = name, clock, cost_s
        self.calls = 0

    def transcribe(
        self,
        audio: np.ndarray,
        prompt: str = "",
        *,
        fast: bool = False,
        hotwords: Sequence[str] = (),
    ) -> list[Word]:
        self.calls += 1
        self.clock.t += self.cost_s
        return [Word(" " + self.name, 0.0, 0.1, 0.9)]


def _ladder(effort: object, cost_s: float, **control: object) -> tuple[EffortTranscriber, Clock]:
    clock = Clock()
    config = AsrConfig(effort=effort, effort_control=EffortControllerConfig(up_after=1, **control))
    fast = Costly("fast", clock, cost_s)
    full = [Costly(f"full{i}", clock, cost_s) for i in range(3)]
    return EffortTranscriber(fast, full, config, clock=clock), clock


def _speak(
    ladder: EffortTranscriber, seconds: float, step_s: float = 0.5, start_s: float = 0.0
) -> list[str]:
    """Passes every `step_s` of media time for `seconds` from `start_s`, a full pass every
    fourth."""
    heard = []
    audio = np.zeros(1600, np.float32)
    for i in range(round(seconds / step_s)):
        words = ladder.transcribe(audio, fast=i % 4 != 3)
        ladder.advance(start_s + (i + 1) * step_s)
        heard.append(words[0].word.strip())
    return heard


def test_a_forced_rung_routes_full_passes_and_never_moves() -> None:
    ladder, _ = _ladder(2, cost_s=0.01)
    heard = _speak(ladder, 20.0)
    assert set(heard) == {"fast", "full2"}
    assert ladder.rung == 2 and ladder.passes == [0, 0, 10]
    assert len(ladder.history) == 1


def test_auto_climbs_with_headroom_and_steps_down_under_load() -> None:
    ladder, _ = _ladder("auto", cost_s=0.05, rungs=(0, 1, 2))  # busy 0.1: room for every rung
    _speak(ladder, 12.0)
    assert ladder.rung == 2
    assert [rung for _, rung, _ in ladder.history] == [0, 1, 2]
    # The recognizer slows down (a busy machine): 0.5 s per 0.5 s of audio.
    for t in (ladder.fast, *ladder.full):
        assert isinstance(t, Costly)
        t.cost_s = 0.5
    _speak(ladder, 12.0, start_s=12.0)
    assert ladder.rung == 0
    assert all(reason.startswith("down: busy") for _, _, reason in ladder.history[3:])


def test_busy_share_is_recognizer_seconds_per_media_second() -> None:
    ladder, _ = _ladder("auto", cost_s=0.25, window_s=4.0, rungs=(0,))
    assert ladder.busy_share(0.0) is None
    _speak(ladder, 8.0)
    assert ladder.busy_share(8.0) == pytest.approx(0.5)


def test_commit_latency_over_budget_keeps_it_at_the_bottom() -> None:
    ladder, _ = _ladder("auto", cost_s=0.01)
    ladder.record_latency(3.0)
    _speak(ladder, 12.0)
    assert ladder.rung == 0


def test_the_accurate_models_words_move_onto_the_stream_models_clock() -> None:
    """Rung 2's words are shifted by `effort_model_shift_s` (clamped to the audio), so the
    commit policy matches them by time against words the stream's model committed."""
    ladder, _ = _ladder(2, cost_s=0.0)
    audio = np.zeros(1600, np.float32)  # 0.1 s: the shifted end is clamped to it
    (word,) = ladder.transcribe(audio)
    assert (word.t_start, word.t_end) == pytest.approx((0.1, 0.1))
    (fast,) = ladder.transcribe(audio, fast=True)
    assert (fast.t_start, fast.t_end) == (0.0, 0.1)  # the stream's own model: unchanged
    ladder, _ = _ladder(1, cost_s=0.0)
    (word,) = ladder.transcribe(audio)
    assert (word.t_start, word.t_end) == (0.0, 0.1)
