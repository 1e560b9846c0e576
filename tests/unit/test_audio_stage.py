"""AsrStage with real Silero VAD and a scripted transcriber (the model boundary is faked).

The fake "recognises" the truth words of the short test clip that lie inside the buffer it is
given (locating the buffer in the clip by its samples), with timestamp jitter and a garbled
last word when the buffer cuts a word, so the stage's policy, trims and latency bookkeeping run
on real audio timing without a model.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from streamfuse.audio import (
    AsrConfig,
    AsrStage,
    BackgroundReader,
    ScreenTerms,
    Transcriber,
    Word,
)
from streamfuse.audio.reviser import Reread
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ, AudioFrame, ErrorFrame, EventFrame
from streamfuse.pipeline import OverloadPolicy
from streamfuse.testing import run_stage

pytestmark = pytest.mark.unit

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "test"
SR = AUDIO_SAMPLE_RATE_HZ


def _truth_words() -> list[tuple[str, float, float]]:
    truth = json.loads((ASSETS / "short.truth.json").read_text())
    out = []
    for u in truth["asr"]:
        words = u["text"].split()
        step = (u["t_end"] - u["t_start"]) / len(words)
        out += [
            (w, u["t_start"] + i * step, u["t_start"] + (i + 1) * step) for i, w in enumerate(words)
        ]
    return out


class ScriptedTranscriber(Transcriber):
    def __init__(self, audio: np.ndarray, script: list[tuple[str, float, float]]) -> None:
        self.audio = audio
        self.script = script
        self.calls = 0
        self.prompts: list[str] = []
        self.hotwords: list[list[str]] = []
        self.fast: list[bool] = []

    def _offset(self, buf: np.ndarray) -> float:
        k = min(64, len(buf))
        for i in np.flatnonzero(self.audio == buf[0]):
            if np.array_equal(self.audio[i : i + k], buf[:k]):
                return float(i) / SR
        raise AssertionError("buffer not found in the clip")

    def transcribe(
        self,
        audio: np.ndarray,
        prompt: str = "",
        *,
        fast: bool = False,
        hotwords: Sequence[str] = (),
    ) -> list[Word]:
        self.calls += 1
        self.prompts.append(prompt)
        self.hotwords.append(list(hotwords))
        self.fast.append(fast)
        t0 = self._offset(audio)
        t1 = t0 + len(audio) / SR
        # Successive passes over a growing buffer time words slightly differently; keyed on the
        # buffer (not the call count) so passes on two threads (`lookback_async`) stay the same.
        jitter = 0.03 if (len(audio) // 320) % 2 else -0.03
        out = []
        for w, a, b in self.script:
            if b <= t1 and a >= t0 - 0.05:
                out.append(Word(" " + w, max(0.0, a - t0 + jitter), b - t0 + jitter, 0.9))
            elif a < t1 < b and a >= t0:
                out.append(Word(" " + w[: max(1, len(w) // 2)] + "-", a - t0, t1 - t0, 0.3))
        return out


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    from faster_whisper import decode_audio

    return np.asarray(decode_audio(str(ASSETS / "short.mp4"), sampling_rate=SR), np.float32)


async def _run(stage: AsrStage, clip: np.ndarray) -> tuple[list[EventFrame], dict[int, float]]:
    frames = [
        AudioFrame(t_media=i / SR, samples=clip[i : i + 320], arrival_wall=1000.0 + i / SR, index=i)
        for i in range(0, len(clip) - 320 + 1, 320)
    ]
    arrivals = {f.index // 320: f.arrival_wall for f in frames}
    out = await run_stage(stage, frames)
    events = [f for f in out if isinstance(f, EventFrame)]
    assert events == out, [f for f in out if f not in events]
    return events, arrivals


@pytest.mark.parametrize("max_buffer", [15.0, 3.0])
def test_every_word_committed_once_in_order(clip: np.ndarray, max_buffer: float) -> None:
    script = _truth_words()
    fake = ScriptedTranscriber(clip, script)
    config = AsrConfig(
        update_interval_s=0.5, max_buffer_s=max_buffer, trim_after_s=min(8.0, max_buffer)
    )
    stage = AsrStage(config, transcriber=fake)
    events, _ = asyncio.run(_run(stage, clip))
    asr = [e for e in events if e.type == "asr"]
    words = [w["word"] for e in asr for w in e.payload.fields()["words"]]
    assert words == [w for w, _, _ in script]
    assert not any(w.endswith("-") for w in words)  # cut words are never committed
    starts = [w["t_start"] for e in asr for w in e.payload.fields()["words"]]
    assert starts == sorted(starts)
    # Silence is skipped: far fewer model calls than 0.5 s updates over the whole clip.
    assert fake.calls < len(clip) / SR / 0.5
    assert any(e.type == "asr_partial" and e.payload.fields()["text"] for e in events)
    # Later utterances are prompted with the committed text before the buffer.
    assert any("short test" in p for p in fake.prompts)
    # Every commit names its rule; hypotheses that agree commit inside speech, not only at ends.
    rules = {e.payload.fields()["rule"] for e in asr}
    assert None not in rules
    assert "agreement" in rules


def test_event_times_and_arrival_follow_the_last_word(clip: np.ndarray) -> None:
    stage = AsrStage(AsrConfig(), transcriber=ScriptedTranscriber(clip, _truth_words()))
    events, _ = asyncio.run(_run(stage, clip))
    for e in (e for e in events if e.type == "asr"):
        words = e.payload.fields()["words"]
        assert e.t_media == pytest.approx(words[0]["t_start"], abs=1e-3)
        assert e.t_end == pytest.approx(words[-1]["t_end"], abs=1e-3)
        # Arrival = the 20 ms window holding the last word's end (synthetic wall = 1000 + t).
        window_end = e.arrival_wall - 1000.0 + 0.02
        assert window_end - 0.02 - 1e-6 <= words[-1]["t_end"] <= window_end + 1e-3
        assert e.payload.fields()["text"] == " ".join(w["word"] for w in words)


def test_silence_only_never_calls_the_model() -> None:
    silence = np.zeros(5 * SR, np.float32)
    fake = ScriptedTranscriber(silence, [])
    events, _ = asyncio.run(_run(AsrStage(AsrConfig(), transcriber=fake), silence))
    assert fake.calls == 0
    assert events == []


def test_config_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="vad_end_threshold"):
        AsrConfig(vad_start_threshold=0.3, vad_end_threshold=0.5)
    with pytest.raises(ValueError, match="max_buffer_s"):
        AsrConfig(max_buffer_s=40)


def test_a_second_stream_is_refused_not_mixed_in(clip: np.ndarray) -> None:
    script = _truth_words()
    stage = AsrStage(AsrConfig(), transcriber=ScriptedTranscriber(clip, script))
    frames = [
        AudioFrame(t_media=i / SR, samples=clip[i : i + 320], arrival_wall=1000.0 + i / SR, index=i)
        for i in range(0, len(clip) - 320 + 1, 320)
    ]
    noise = np.random.default_rng(0).normal(0, 0.3, 320).astype(np.float32)
    intruder = AudioFrame(
        stream_id="other", t_media=2.0, samples=noise, arrival_wall=1002.0, index=6400
    )
    out = asyncio.run(run_stage(stage, [*frames[:100], intruder, *frames[100:]]))
    errors = [f for f in out if isinstance(f, ErrorFrame)]
    assert len(errors) == 1
    assert "'other'" in errors[0].message and "one AsrStage per stream" in errors[0].message
    # The first stream's transcript goes on, untouched by the other stream's audio.
    words = [
        w["word"] for f in out if isinstance(f, EventFrame) and f.type == "asr"
        for w in f.payload.fields()["words"]
    ]  # fmt: skip
    assert words == [w for w, _, _ in script]


def test_terms_read_on_screen_reach_the_model_as_hotwords(clip: np.ndarray) -> None:
    terms = ScreenTerms(window_s=60.0)
    terms.add(["Kubernetes control plane"], 0.0)
    terms.add(["Cholesky decomposition"], 2.0)  # shown later: only for later buffers
    fake = ScriptedTranscriber(clip, _truth_words())
    # Unguarded: every pass is primed (the guard's unprimed second decodes are tested below).
    always = AsrConfig(prime_max_terms=20, prime_min_overlap=0, prime_guard="off")
    stage = AsrStage(always, transcriber=fake, screen_terms=terms)
    asyncio.run(_run(stage, clip))
    assert fake.hotwords and all(h for h in fake.hotwords)
    assert {"Kubernetes", "control", "plane"} <= set(fake.hotwords[0])
    # Newest slide first once it is on screen; the same stage unprimed passes none.
    assert fake.hotwords[-1][:2] == ["Cholesky", "decomposition"]
    plain = ScriptedTranscriber(clip, _truth_words())
    asyncio.run(_run(AsrStage(always, transcriber=plain), clip))
    assert plain.hotwords and not any(plain.hotwords)
    off = ScriptedTranscriber(clip, _truth_words())
    asyncio.run(
        _run(AsrStage(AsrConfig(prime_max_terms=0), transcriber=off, screen_terms=terms), clip)
    )
    assert not any(off.hotwords)


class FlippingTranscriber(ScriptedTranscriber):
    """Every other hypothesis spells every word differently: two never agree."""

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        words = super().transcribe(audio, prompt, **kwargs)  # type: ignore[arg-type]
        if self.calls % 2:
            return [Word(w.word.upper(), w.t_start, w.t_end, w.p) for w in words]
        return [Word(w.word + "h", w.t_start, w.t_end, w.p) for w in words]


def test_words_that_never_agree_are_committed_after_max_word_delay(clip: np.ndarray) -> None:
    script = _truth_words()
    base = {"fast_updates": True, "max_pending_s": 0.0, "update_interval_s": 0.5}
    waiting = AsrStage(
        AsrConfig(**base, max_word_delay_s=0.0), transcriber=FlippingTranscriber(clip, script)
    )
    events, _ = asyncio.run(_run(waiting, clip))
    at_pauses = [e for e in events if e.type == "asr"]
    bounded = AsrStage(
        AsrConfig(**base, max_word_delay_s=1.0), transcriber=FlippingTranscriber(clip, script)
    )
    events, _ = asyncio.run(_run(bounded, clip))
    early = [e for e in events if e.type == "asr"]
    # Without the bound only utterance ends commit; with it, words go out inside utterances too.
    assert len(early) > len(at_pauses)
    assert {e.payload.fields()["rule"] for e in at_pauses} <= {"utterance_end", "stream_end"}
    assert "age" in {e.payload.fields()["rule"] for e in early}
    words = [w["word"].lower().rstrip("h") for e in early for w in e.payload.fields()["words"]]
    assert words == [w.lower().rstrip("h") for w, _, _ in script]


def test_with_an_overlap_gate_off_topic_slides_prime_nothing(clip: np.ndarray) -> None:
    off_topic = ScreenTerms()
    off_topic.add(["Kubernetes control plane", "Cholesky decomposition"], 0.0)
    fake = ScriptedTranscriber(clip, _truth_words())
    gated = AsrConfig(prime_max_terms=20, prime_min_overlap=2, prime_guard="off")
    asyncio.run(_run(AsrStage(gated, transcriber=fake, screen_terms=off_topic), clip))
    assert fake.hotwords and not any(fake.hotwords)
    # Slides sharing words with the speech ("slides", "spoken", "engine") prime once heard.
    on_topic = ScreenTerms()
    on_topic.add(["Slides and spoken words", "The engine reads Kubernetes"], 0.0)
    fake = ScriptedTranscriber(clip, _truth_words())
    asyncio.run(_run(AsrStage(gated, transcriber=fake, screen_terms=on_topic), clip))
    assert not fake.hotwords[0]  # nothing heard yet
    assert "Kubernetes" in fake.hotwords[-1]


class DeafTranscriber(Transcriber):
    """A model that hears nothing (the test is about the audio the stage is given)."""

    def __init__(self) -> None:
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
        return []


def test_the_stage_goes_on_through_stretches_a_shedding_input_skipped(clip: np.ndarray) -> None:
    """Live audio stamped 20 ms apart in arrival, all queued at once (a consumer far behind):
    the `SHED_LATE` input skips stretches of it, the stage fills the holes with silence and
    ends cleanly, and frames taken + frames dropped account for every frame; a blocking input
    takes all of them."""
    frames = [
        AudioFrame(t_media=i / SR, samples=clip[i : i + 320], arrival_wall=1000.0 + i / SR)
        for i in range(0, len(clip) - 320 + 1, 320)
    ]
    shed = AsrStage(AsrConfig(update_interval_s=0.5), transcriber=DeafTranscriber())
    out = asyncio.run(
        run_stage(
            shed,
            frames,
            lockstep=False,
            policy=OverloadPolicy.SHED_LATE,
            max_age_s=2.0,
            maxsize=len(frames),
        )
    )
    assert not [f for f in out if isinstance(f, ErrorFrame)]
    assert shed.stats.dropped > 0
    taken = shed.stats.frames - 1  # the end-of-stream flush is a call too
    assert taken + shed.stats.dropped == len(frames)
    assert (
        taken * 320 / SR < len(clip) / SR - 2.0
    )  # stretches were skipped, not a window here and there
    whole = AsrStage(AsrConfig(update_interval_s=0.5), transcriber=DeafTranscriber())
    asyncio.run(run_stage(whole, frames, lockstep=False, maxsize=len(frames)))
    assert whole.stats.dropped == 0 and whole.stats.frames - 1 == len(frames)


class MishearingTranscriber(ScriptedTranscriber):
    """Fast (short-window) passes mishear `word` as `heard`; full-window passes get it right."""

    def __init__(self, audio: np.ndarray, script: list[tuple[str, float, float]], word: str,
                 heard: str, *, deaf_full: bool = False) -> None:  # fmt: skip
        super().__init__(audio, script)
        self.word, self.heard, self.deaf_full = word, heard, deaf_full

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        words = super().transcribe(audio, prompt, **kwargs)  # type: ignore[arg-type]
        if not kwargs.get("fast"):
            return [] if self.deaf_full else words
        return [
            Word(" " + self.heard, w.t_start, w.t_end, 0.9) if w.word.strip() == self.word else w
            for w in words
        ]


def _first_commits(events: list[EventFrame]) -> list[str]:
    """The words of the `asr` events, as first committed (before any revision)."""
    return [w["word"] for e in events if e.type == "asr" for w in e.payload.fields()["words"]]


def _speech(events: list[EventFrame]) -> list[str]:
    from streamfuse.events import EventRecord, speech_words

    records = [
        EventRecord(type=e.type, stream_id=e.stream_id, t_start=e.t_media, t_end=e.t_end,
                    latency_ms=0.0, payload=e.payload)
        for e in events
    ]  # fmt: skip
    return [w.word for w, _ in speech_words(records)]


# Fast updates commit inside utterances (agreement of two short-window passes); the full pass
# at each utterance end then sees the whole utterance.
_FAST = {"fast_updates": True, "max_pending_s": 0.0, "update_interval_s": 0.5}


def test_the_utterance_end_pass_revises_a_misheard_committed_word(clip: np.ndarray) -> None:
    script = _truth_words()
    fake = MishearingTranscriber(clip, script, "engine", "engines")
    events, _ = asyncio.run(_run(AsrStage(AsrConfig(**_FAST), transcriber=fake), clip))
    first = _first_commits(events)
    assert "engines" in first  # committed before the utterance ended
    revisions = [e for e in events if e.type == "asr_revision"]
    assert len(revisions) == 1
    fields = revisions[0].payload.fields()
    assert [w["word"] for w in fields["replaced"]] == ["engines"]
    assert [w["word"] for w in fields["words"]] == ["engine"]
    # It comes before the utterance's last commit and after the misheard word's own.
    i = events.index(revisions[0])
    assert any(e.type == "asr" and "engines" in e.payload.fields()["text"] for e in events[:i])
    assert _speech(events) == [w for w, _, _ in script]
    assert revisions[0].arrival_wall <= max(e.arrival_wall for e in events)

    off = MishearingTranscriber(clip, script, "engine", "engines")
    config = AsrConfig(**_FAST, revise=False)
    events, _ = asyncio.run(_run(AsrStage(config, transcriber=off), clip))
    assert not [e for e in events if e.type == "asr_revision"]
    assert "engines" in _speech(events)


def test_no_revision_when_the_full_pass_lost_the_speech(clip: np.ndarray) -> None:
    """A full pass that hears nothing (Whisper dropping a segment as no-speech) must not
    delete the words the fast passes agreed on."""
    script = _truth_words()
    fake = MishearingTranscriber(clip, script, "engine", "engines", deaf_full=True)
    events, _ = asyncio.run(_run(AsrStage(AsrConfig(**_FAST), transcriber=fake), clip))
    assert not [e for e in events if e.type == "asr_revision"]
    assert "engines" in _speech(events) and len(_speech(events)) > 10


def test_agreeing_passes_make_no_revision(clip: np.ndarray) -> None:
    fake = ScriptedTranscriber(clip, _truth_words())
    events, _ = asyncio.run(_run(AsrStage(AsrConfig(**_FAST), transcriber=fake), clip))
    assert not [e for e in events if e.type == "asr_revision"]
    assert _speech(events) == [w for w, _, _ in _truth_words()]


class ContextMishearingTranscriber(ScriptedTranscriber):
    """Mishears `word` as `heard` in a pass where `misheard(word, audio_s)` holds (the word's
    times relative to the pass's audio, `audio_s` long): a word Whisper gets right only with
    enough audio around it. Records each pass's span of media time."""

    def __init__(self, audio: np.ndarray, script: list[tuple[str, float, float]], word: str,
                 heard: str, misheard: Callable[[Word, float], bool]) -> None:  # fmt: skip
        super().__init__(audio, script)
        self.word, self.heard, self.misheard = word, heard, misheard
        self.spans: list[tuple[float, float]] = []

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        words = super().transcribe(audio, prompt, **kwargs)  # type: ignore[arg-type]
        t0 = self._offset(audio)
        audio_s = len(audio) / SR
        self.spans.append((t0, t0 + audio_s))
        return [
            Word(" " + self.heard, w.t_start, w.t_end, 0.9)
            if w.word.strip() == self.word and self.misheard(w, audio_s)
            else w
            for w in words
        ]


@pytest.mark.parametrize("context_s", [8.0, 0.0])
def test_a_lookback_revises_an_earlier_utterance_heard_with_what_followed(
    clip: np.ndarray, context_s: float
) -> None:
    """Whisper reads some words right only with the words after them. The first utterance's
    "spoken" is misheard by every pass of that utterance (its audio ends too soon after it);
    the next utterance's end pass, reaching back `revise_lookback_s`, hears it with what
    followed and revises it. Without the lookback it stays wrong. With `context_s` 0 the
    buffer restarts at each utterance end: the audio comes from the lookback store."""
    script = _truth_words()

    def run(lookback: float) -> tuple[list[EventFrame], ContextMishearingTranscriber]:
        # Misheard unless the audio goes on 3 s past the word's end.
        fake = ContextMishearingTranscriber(
            clip, script, "words.", "birds.", lambda w, audio_s: w.t_end + 3.0 > audio_s
        )
        config = AsrConfig(**_FAST, context_s=context_s, revise_lookback_s=lookback)
        return asyncio.run(_run(AsrStage(config, transcriber=fake), clip))[0], fake

    events, _ = run(0.0)
    assert "birds." in _speech(events)
    events, fake = run(20.0)
    assert _speech(events) == [w for w, _, _ in script]
    revisions = [e.payload.fields() for e in events if e.type == "asr_revision"]
    assert [(r["replaced_text"], r["text"]) for r in revisions] == [("birds.", "words.")]
    # The pass that revised it began at the stream's start (a clean point, no word cut) and
    # every pass stays within one Whisper window.
    assert any(t0 <= 0.5 and t1 > 7.0 for t0, t1 in fake.spans)
    assert all(t1 - t0 <= 28.0 + 1.0 for t0, t1 in fake.spans)


def test_a_revise_window_keeps_the_lookback_start_while_the_speech_after_it_grows(
    clip: np.ndarray,
) -> None:
    """With a 5 s lookback every utterance-end pass starts at the utterance end nearest 5 s
    back, so the last utterance's "every" is only ever heard with 2-3 s of audio before it,
    and misheard. With `revise_window_s` 12 the passes keep the stream's start as the clip
    grows (one 12 s window, as an offline decoder's): the last one hears "every" with all
    that came before and revises it."""
    script = _truth_words()

    def run(window_s: float) -> tuple[list[str], ContextMishearingTranscriber]:
        # Misheard unless the audio starts 4 s before the word.
        fake = ContextMishearingTranscriber(
            clip, script, "every", "ivory", lambda w, _: w.t_start < 4.0
        )
        config = AsrConfig(**_FAST, context_s=0.0, revise_lookback_s=5.0, revise_window_s=window_s)
        events, _ = asyncio.run(_run(AsrStage(config, transcriber=fake), clip))
        return _speech(events), fake

    words, fake = run(0.0)
    assert "ivory" in words
    assert not any(t0 <= 0.5 and t1 > 11.0 for t0, t1 in fake.spans)
    words, fake = run(12.0)
    assert words == [w for w, _, _ in script]
    assert any(t0 <= 0.5 and t1 > 11.0 for t0, t1 in fake.spans)
    assert all(t1 - t0 <= 12.0 + 1.0 for t0, t1 in fake.spans)


async def _events_and_passes(
    stage: AsrStage, clip: np.ndarray, fake: ContextMishearingTranscriber
) -> list[tuple[EventFrame, int]]:
    """Drive the stage window by window: each event with the number of passes run by then."""
    await stage.setup()
    out = []
    for i in range(0, len(clip) - 320 + 1, 320):
        frame = AudioFrame(t_media=i / SR, samples=clip[i : i + 320], arrival_wall=1000.0)
        out += [(o, len(fake.spans)) async for o in stage.process(frame)]
    out += [(o, len(fake.spans)) async for o in stage.flush()]
    await stage.teardown()
    return [(o, n) for o, n in out if isinstance(o, EventFrame)]


@pytest.mark.parametrize("ending", ["pause", "stream end"])
@pytest.mark.parametrize("mode", ["one pass", "commit first", "async"])
def test_an_utterance_end_commits_from_the_buffer_before_the_lookback_pass(
    clip: np.ndarray, mode: str, ending: str
) -> None:
    """The pass over the revision window costs ever more as it grows (up to 28 s of audio),
    so with `commit_before_lookback` the last words of an utterance are committed from the
    pause's pass over the buffer alone, and the lookback pass runs after them (`async`: on
    its own thread, off the commit path): it still revises the earlier utterance's "birds."
    (heard right only with what followed). With one pass, the utterance's last words wait
    for the pass that reaches back to the stream's start. The same where the stream ends
    inside speech (`stream end`: the clip cut in its last sentence)."""
    script = _truth_words()
    if ending == "stream end":
        clip = clip[: int(11.0 * SR)]
    fake = ContextMishearingTranscriber(
        clip, script, "words.", "birds.", lambda w, audio_s: w.t_end + 3.0 > audio_s
    )
    config = AsrConfig(
        **_FAST, context_s=0.0, revise_lookback_s=20.0,
        commit_before_lookback=mode != "one pass", lookback_async=mode == "async",
    )  # fmt: skip
    stage = AsrStage(config, transcriber=fake)
    events = asyncio.run(_events_and_passes(stage, clip, fake))
    if ending == "pause":
        assert _speech([e for e, _ in events]) == [w for w, _, _ in script]
    revisions = [e.payload.fields() for e, _ in events if e.type == "asr_revision"]
    assert [(r["replaced_text"], r["text"]) for r in revisions] == [("birds.", "words.")]
    assert revisions[0]["model"] is None  # the stream's own model revised it
    assert (stage.lookback_reader is not None) is (mode == "async")
    if stage.lookback_reader is not None:
        assert stage.lookback_reader.passes > 0
    # Every pass stays within one Whisper window; some reach back to the stream's start.
    assert all(t1 - t0 <= 28.0 + 1.0 for t0, t1 in fake.spans)
    assert any(t0 <= 0.5 and t1 > 7.0 for t0, t1 in fake.spans)
    if mode == "async":
        return  # its passes run on another thread: their order against the events is free
    # Past the first utterance: did the pass an utterance end committed from reach back to
    # the stream's start?
    rules = ("pause", "utterance_end") if ending == "pause" else ("stream_end",)
    ends = [
        n for e, n in events
        if e.type == "asr" and e.payload.fields()["rule"] in rules and e.t_media > 5.0
    ]  # fmt: skip
    assert ends
    reached_back = [fake.spans[n - 1][0] <= 0.5 for n in ends]
    assert all(reached_back) if mode == "one pass" else not any(reached_back)


def test_a_word_cut_where_the_pass_starts_is_not_added_twice() -> None:
    """Seen on a human-read clip: the lookback pass began at an utterance end inside the
    committed "We" (Whisper had stretched it back over the pause) and read it whole; with that
    word outside the compared span, the reading was an insertion and the transcript said
    "We We". A new word centred inside a committed word that stays is the same sound."""
    stage = AsrStage(AsrConfig(revise_lookback_s=20.0, calibrate=False))
    stage._stream_id = "s"
    committed = [(" us.", 23.9, 24.3), (" We", 24.58, 25.34), (" were", 25.34, 25.5),
                 (" all", 25.5, 25.58), (" going", 25.58, 25.8)]  # fmt: skip
    stage._history.extend(Word(w, a, b, 0.9) for w, a, b in committed)
    stage._utterance_from = 25.9
    heard = [Word(" We", 24.74, 25.3, 0.9), Word(" were", 25.3, 25.56, 0.9),
             Word(" all", 25.56, 25.58, 0.9), Word(" going", 25.58, 25.8, 0.9)]  # fmt: skip
    assert stage._revisions(heard, 24.74) == []
    # A word the commits missed is still added: nothing committed stands where it was heard.
    heard.insert(2, Word(" of", 25.5, 25.52, 0.9))
    stage._history[3] = Word(" all", 25.53, 25.58, 0.9)
    events = stage._revisions(heard, 24.74)
    assert [(e.payload.replaced_text, e.payload.text) for e in events] == [("", "of")]
    assert [w.word for w in stage._history] == [" us.", " We", " were", " of", " all", " going"]


@pytest.mark.parametrize(
    ("heard_text", "anchor"),
    [
        ("my priors rival might.", "one word"),  # "my" matches the committed "my" by chance
        ("in my priors rival might.", "two words, 1 s apart"),
    ],
)
def test_a_revision_replaces_a_differing_stretch_whole(heard_text: str, anchor: str) -> None:
    """Seen on the speech set: the full pass read a stretch quite differently ("... rival my
    might" for "that prize arrived my way") and the alignment matched a word of both readings
    by chance, leaving a 3-word deletion (kept: it looks like a stretch the pass dropped as
    no-speech) beside an insertion (applied): the transcript interleaved both readings. Words
    the readings share only by chance (the readings place them a second apart in time) do not
    split a stretch: it is replaced whole, or kept whole."""
    stage = AsrStage(AsrConfig(revise_lookback_s=20.0, calibrate=False))
    stage._stream_id = "s"
    committed = ["that", "prize", "arrived", "in", "my", "way."]
    if anchor == "one word":
        committed.remove("in")
    step = 2.0 / len(committed)
    stage._history.extend(
        Word(" " + w, 10.0 + i * step, 10.0 + (i + 1) * step, 0.9) for i, w in enumerate(committed)
    )
    stage._utterance_from = 9.0
    words = heard_text.split()
    step = 2.0 / len(words)
    heard = [
        Word(" " + w, 10.0 + i * step, 10.0 + (i + 1) * step, 0.9) for i, w in enumerate(words)
    ]
    events = stage._revisions(heard, 9.5)
    assert [w.word.strip() for w in stage._history] == words
    assert len(events) == 1
    assert events[0].payload.replaced_text == " ".join(committed)
    # Two stretches read differently, with words both readings share at the same time between
    # them, stay two revisions.
    stage = AsrStage(AsrConfig(revise_lookback_s=20.0, calibrate=False))
    stage._stream_id = "s"
    committed = ["the", "cat", "sat", "on", "the", "mat."]
    stage._history.extend(
        Word(" " + w, 10.0 + i * 0.3, 10.3 + i * 0.3, 0.9) for i, w in enumerate(committed)
    )
    stage._utterance_from = 9.0
    heard = [
        Word(" " + w, 10.0 + i * 0.3, 10.3 + i * 0.3, 0.9)
        for i, w in enumerate(["the", "hat", "sat", "on", "the", "map."])
    ]
    events = stage._revisions(heard, 9.5)
    assert [(e.payload.replaced_text, e.payload.text) for e in events] == [
        ("cat", "hat"),
        ("mat.", "map."),
    ]


def test_words_the_accurate_model_read_the_same_are_revised_only_by_a_surer_reading() -> None:
    """Seen live on the speech set: base re-read an utterance and read "accept some proposal"
    as committed; the stream's own model (tiny.en), re-reading the same audio later over a
    longer lookback, turned those words into "except we'll put both", and nothing read them
    again. Words the accurate model read the same are revised by the stream's model only where
    it reads them more confidently (on another clip its longer reading rightly turned a
    confirmed "and shake" into "handshake"); words it was never given stay open to any reading
    the stream's model makes, as without a reviser."""

    def stage_with(committed: list[str]) -> AsrStage:
        stage = AsrStage(AsrConfig(revise_lookback_s=20.0, calibrate=False))
        stage._stream_id = "s"
        stage._history.extend(
            Word(" " + w, 10.0 + i * 0.3, 10.3 + i * 0.3, 0.9) for i, w in enumerate(committed)
        )
        stage._utterance_from = 9.0
        return stage

    def reading(words: list[str], p: float = 0.9) -> list[Word]:
        return [Word(" " + w, 10.0 + i * 0.3, 10.3 + i * 0.3, p) for i, w in enumerate(words)]

    committed = ["Metropolis", "casings", "accept", "some", "proposal"]
    rereading = ["Metropolis", "casings", "except", "we'll", "put"]
    stage = stage_with(committed)
    assert stage._revisions(reading(committed), 9.5, model="base") == []  # read the same
    assert stage._revisions(reading(rereading), 9.5) == []  # the stream's model: no change
    assert [w.word.strip() for w in stage._history] == committed
    surer = stage._revisions(reading(rereading, p=0.99), 9.5)
    assert [(e.payload.replaced_text, e.payload.text) for e in surer] == [
        ("accept some proposal", "except we'll put")
    ]
    # Without the accurate model's reading, the stream's own rereading revises those words.
    stage = stage_with(committed)
    events = stage._revisions(reading(rereading), 9.5)
    assert [(e.payload.replaced_text, e.payload.text) for e in events] == [
        ("accept some proposal", "except we'll put")
    ]
    # Where the accurate model read otherwise and was less sure, its reading left the words
    # open: the stream's model may still revise them.
    stage = stage_with(committed)
    unsure = reading(["Metropolis", "casings", "accept", "a", "proposal"], p=0.5)
    assert stage._revisions(unsure, 9.5, model="base") == []
    events = stage._revisions(reading(["Metropolis", "casings", "accept", "the", "proposal"]), 9.5)
    assert [(e.payload.replaced_text, e.payload.text) for e in events] == [("some", "the")]


def _said_as(w: Word, parts: Sequence[str], p: float) -> list[Word]:
    """The words `parts` heard over `w`'s span, in equal shares."""
    step = (w.t_end - w.t_start) / len(parts)
    return [
        Word(f" {x}", w.t_start + k * step, w.t_start + (k + 1) * step, p)
        for k, x in enumerate(parts)
    ]


class UnprimedMishearingTranscriber(ScriptedTranscriber):
    """Unprimed it hears "engine" as the words `heard` (primed, hotwords given: "engine")."""

    def __init__(self, audio: np.ndarray, script: list[tuple[str, float, float]],
                 heard: Sequence[str] = ("and", "gin"), p: float = 0.6) -> None:  # fmt: skip
        super().__init__(audio, script)
        self.heard = heard
        self.p = p

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        words = super().transcribe(audio, prompt, **kwargs)  # type: ignore[arg-type]
        if kwargs.get("hotwords"):
            return words
        return [
            x
            for w in words
            for x in (_said_as(w, self.heard, self.p) if w.word.strip() == "engine" else [w])
        ]


class SlideBiasedTranscriber(UnprimedMishearingTranscriber):
    """Unprimed it mishears "engine" as "and gin"; primed it hears "engine" but also imitates
    its prompt: it says the slide terms "Kubelet logs" after "spoken", where nobody said them
    (a run too short for the recital guard)."""

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        words = super().transcribe(audio, prompt, **kwargs)
        if not kwargs.get("hotwords"):
            return words
        recited = ("spoken,", "Kubelet,", "logs")
        return [
            x
            for w in words
            for x in (_said_as(w, recited, 0.9) if w.word.strip() == "spoken" else [w])
        ]


@pytest.mark.parametrize("guard", ["all", "full"])
def test_the_prime_guard_keeps_a_heard_term_and_drops_an_imitated_one(
    clip: np.ndarray, guard: str
) -> None:
    """Primed, the model gets the slide term "engine" right but inserts slide terms after
    "spoken"; unprimed it mishears "engine". Checked against the unprimed reading
    (`prime_guard`), the final transcript keeps the primed "engine" (a term in place of words
    spelled like it) and not the inserted run."""
    script = _truth_words()
    slides = ScreenTerms()
    slides.add(["The engine reads Kubelet logs"], 0.0)

    def run(prime_guard: str) -> list[str]:
        config = AsrConfig(**_FAST, prime_max_terms=20, prime_guard=prime_guard)
        fake = SlideBiasedTranscriber(clip, script)
        stage = AsrStage(config, transcriber=fake, screen_terms=slides)
        return _speech(asyncio.run(_run(stage, clip))[0])

    unguarded = run("off")
    assert "engine" in unguarded and "Kubelet," in unguarded
    assert run(guard) == [w for w, _, _ in script]


@pytest.mark.parametrize(
    ("config", "heard"),
    [
        ({}, "engine"),  # trusted, merged: the stretch heard as a term is taken
        ({"prime_trusted": "primed"}, "engine"),  # trusted, primed only
        ({"prime_trust_terms": 0}, "in"),  # never trusted: the guard wants a spelling alike
    ],
)
def test_trusted_slides_let_a_term_in_where_the_unprimed_reading_spells_nothing_like_it(
    clip: np.ndarray, config: dict[str, object], heard: str
) -> None:
    """The first sentence says "test" and "covers" from the slide: the slides are trusted by
    the second, where the unprimed reading hears "in the van" for the slide's "engine"."""
    slides = ScreenTerms()
    slides.add(["A test covers slides", "The engine"], 0.0)
    # Fast passes unprimed: the term can get in only by the full-window passes' reading.
    fields = {"prime_max_terms": 20, "prime_guard": "full", "prime_fast": False}
    cfg = AsrConfig.model_validate({**_FAST, **fields, **config})
    fake = UnprimedMishearingTranscriber(clip, _truth_words(), heard=("in", "the", "van"))
    words = _speech(
        asyncio.run(_run(AsrStage(cfg, transcriber=fake, screen_terms=slides), clip))[0]
    )
    assert words[words.index("The", 5) + 1] == heard


class TermDeafTranscriber(UnprimedMishearingTranscriber):
    """Hears "engine" as the words `heard`, primed or not."""

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        return super().transcribe(audio, prompt, **{**kwargs, "hotwords": ()})


@pytest.mark.parametrize("stream_hears", ["the term", "other words"])
def test_a_primed_background_reading_can_land_its_unprimed_words_first(
    clip: np.ndarray, stream_hears: str
) -> None:
    """With `reread_unprimed_first` a background reading that decodes unprimed and primed
    lands twice: its unprimed words first, then the merged reading, which reuses that unprimed
    decode: as many decodes as one merged reading, the same transcript. Base hears "engine" as
    "in the van" unprimed, surer (p 0.99) than anything else. Where the stream committed
    "engine", the unprimed landing leaves that stretch to the primed reading; where it
    committed "and gin", the unprimed landing puts "in the van" in, and the guard's "engine"
    replaces those words of base's own without a confidence check (judged against them)."""
    slides = ScreenTerms()
    slides.add(["A test covers slides", "The engine"], 0.0)

    def run(first: bool) -> tuple[list[EventFrame], UnprimedMishearingTranscriber, int]:
        fields = {"prime_max_terms": 20, "prime_guard": "full", "prime_fast": False,
                  "effort_model_shift_s": 0.0, "reread_unprimed_first": first}  # fmt: skip
        cfg = AsrConfig.model_validate({**_FAST, **fields})
        accurate = UnprimedMishearingTranscriber(
            clip, _truth_words(), heard=("in", "the", "van"), p=0.99
        )
        reader = BackgroundReader(cfg, transcriber=accurate)
        if stream_hears == "the term":
            stream = UnprimedMishearingTranscriber(clip, _truth_words(), heard=("in", "the", "van"))
        else:
            stream = TermDeafTranscriber(clip, _truth_words(), heard=("and", "gin"))
        stage = AsrStage(cfg, transcriber=stream, reader=reader, screen_terms=slides)
        events, _ = asyncio.run(_run(stage, clip))
        return events, accurate, reader.passes

    merged, merged_model, merged_passes = run(first=False)
    events, accurate, passes = run(first=True)
    words = _speech(events)
    assert words == _speech(merged)
    assert words[words.index("The", 5) + 1] == "engine"
    primed = sum(1 for h in merged_model.hotwords if h)
    assert primed > 0
    assert passes == merged_passes + primed  # each primed reading lands twice...
    assert accurate.hotwords == merged_model.hotwords  # ... from the same decodes
    base = [e.payload for e in events if e.type == "asr_revision" and e.payload.model]
    if stream_hears == "the term":
        assert not any("engine" in r.replaced_text for r in base)
    else:
        assert any(r.text == "in the van" for r in base)  # the unprimed landing...
        assert any(r.replaced_text == "in the van" and r.text == "engine" for r in base)


def test_a_primed_step_reuses_its_unprimed_decode_when_another_streams_reading_ran_between(
    clip: np.ndarray,
) -> None:
    """One reader serves several streams: a job of another stream may run between the
    unprimed step of a reading and its primed step; the primed step still reuses its own
    unprimed decode (one unprimed and one primed decode for it, one for the other job)."""
    accurate = UnprimedMishearingTranscriber(clip, _truth_words())
    reader = BackgroundReader(AsrConfig(), transcriber=accurate)
    audio, other = clip[: 4 * SR].copy(), clip[SR : 3 * SR].copy()
    primed = Reread(audio, 0.0, "", 0.0, 4.0, "merged", ["engine"], follows=True)
    first = Reread(audio, 0.0, "", 0.0, 4.0, then=primed)

    async def run() -> None:
        await reader.read(first)
        await reader.read(Reread(other, 1.0, "", 1.0, 3.0))  # another stream's reading
        await reader.read(primed)

    asyncio.run(run())
    reader.close()
    assert [bool(h) for h in accurate.hotwords] == [False, False, True]


def test_priming_is_trusted_once_the_speech_says_terms_on_screen(clip: np.ndarray) -> None:
    """Guarded ('all'), each pass is read unprimed and primed. Slides whose terms the speech
    says ("test", "covers", "slides" in the first sentence) are trusted after
    `prime_trust_terms` of them were heard: later passes are read primed only
    (`prime_trusted='primed'`), or still twice and merged (the default; `guard_primed` takes
    more from the primed reading). Slides about something else never are."""

    def run(lines: list[str], **config: object) -> ScriptedTranscriber:
        slides = ScreenTerms()
        slides.add(lines, 0.0)
        fake = ScriptedTranscriber(clip, _truth_words())
        stage = AsrStage(
            AsrConfig(**_FAST, prime_max_terms=20, **config), transcriber=fake, screen_terms=slides
        )
        asyncio.run(_run(stage, clip))
        assert stage.primed_decodes == sum(1 for h in fake.hotwords if h)
        return fake

    def hotwords(lines: list[str], **config: object) -> list[list[str]]:
        return run(lines, prime_guard="all", **config).hotwords

    said = hotwords(["A test covers slides", "Kubelet taints"], prime_trusted="primed")
    assert not said[0], "the first pass is read unprimed: nothing was heard yet"
    last_unprimed = max(i for i, h in enumerate(said) if not h)
    # Trusted once "test" and "covers" were heard: every later pass is read primed only...
    assert len(said) - 1 - last_unprimed > last_unprimed
    # ... or, merged, still unprimed and primed (twice the decodes).
    merged = hotwords(["A test covers slides", "Kubelet taints"])
    assert [bool(h) for h in merged] == [False, True] * (len(merged) // 2)
    assert len(merged) > len(said)
    # Never trusted (other slides, or trust off): each pass is read unprimed, then primed (the
    # guard's two readings of the same audio).
    for calls in (hotwords(["Kubelet taints", "etcd tolerations"]),
                  hotwords(["A test covers slides"], prime_trust_terms=0)):  # fmt: skip
        assert [bool(h) for h in calls] == [False, True] * (len(calls) // 2)
    # Guarding the full-window passes only, the fast ones are read once, unprimed, until trusted.
    other = run(["Kubelet taints", "etcd tolerations"], prime_guard="full")
    assert any(other.fast) and not any(
        h for h, fast in zip(other.hotwords, other.fast, strict=True) if fast
    )
    assert any(h for h, fast in zip(other.hotwords, other.fast, strict=True) if not fast)
    said_full = run(["A test covers slides", "Kubelet taints"], prime_guard="full").hotwords
    assert not said_full[0] and said_full[-1]


async def _commits_at(stage: AsrStage, clip: np.ndarray) -> list[tuple[EventFrame, float]]:
    """Drive the stage window by window: each output with the media time of the newest audio
    the stage had when it was emitted."""
    await stage.setup()
    out = []
    for i in range(0, len(clip) - 320 + 1, 320):
        frame = AudioFrame(t_media=i / SR, samples=clip[i : i + 320], arrival_wall=1000.0 + i / SR)
        out += [(o, frame.t_end) async for o in stage.process(frame)]
    out += [(o, len(clip) / SR) async for o in stage.flush()]
    return [(o, t) for o, t in out if isinstance(o, EventFrame)]


def test_age_each_window_commits_a_word_when_it_is_due_not_at_the_next_update(
    clip: np.ndarray,
) -> None:
    waits = {}
    for each_window in (False, True):
        config = AsrConfig(**_FAST, max_word_delay_s=1.0, age_each_window=each_window)
        stage = AsrStage(config, transcriber=FlippingTranscriber(clip, _truth_words()))
        events = asyncio.run(_commits_at(stage, clip))
        asr = [(e, t) for e, t in events if e.type == "asr"]
        aged = [(e, t) for e, t in asr if e.payload.fields()["rule"] == "age"]
        assert aged
        waits[each_window] = [t - w["t_end"] for e, t in aged for w in e.payload.fields()["words"]]
        # Either way no word is committed by age before it is due.
        assert min(waits[each_window]) >= 1.0 - 1e-6
    # Aged at each window, a word goes out within a window or so of its due time; aged at
    # updates only, it waits for the next update (0.5 s of audio apart) to come.
    assert max(waits[True]) <= 1.1
    assert max(waits[False]) > 1.2


@pytest.mark.parametrize("mode", ["all", "agreed"])
def test_pause_commit_commits_the_words_before_a_pause_ahead_of_the_full_pass(
    clip: np.ndarray, mode: str
) -> None:
    # No agreement inside speech and no age bound: only pauses and utterance ends commit.
    base = {"fast_updates": True, "max_pending_s": 25.0, "max_word_delay_s": 0.0}
    first_commit: dict[bool, dict[str, float]] = {}
    for pause_commit in (False, True):
        fake = ScriptedTranscriber(clip, _truth_words())
        config = AsrConfig(**base, pause_commit=mode if pause_commit else "off")
        events = asyncio.run(_commits_at(AsrStage(config, transcriber=fake), clip))
        asr = [(e, t) for e, t in events if e.type == "asr"]
        rules = {e.payload.fields()["rule"] for e, _ in asr}
        assert ("pause_tail" in rules) is pause_commit
        words = [(w["word"], t) for e, t in asr for w in e.payload.fields()["words"]]
        # Every word once, in order; the full pass after it agrees, so nothing is revised.
        assert [w for w, _ in words] == [w for w, _, _ in _truth_words()]
        assert not [e for e, _ in events if e.type == "asr_revision"]
        first_commit[pause_commit] = {f"{i}:{w}": t for i, (w, t) in enumerate(words)}
    # No word is committed later with it, and the words of each pause go out earlier.
    early = {k: first_commit[False][k] - t for k, t in first_commit[True].items()}
    assert min(early.values()) >= -1e-6
    assert max(early.values()) > 0.0


class AlwaysMishearingTranscriber(ScriptedTranscriber):
    """Every pass, fast or full, however long its audio, reads `word` as `heard` (with
    probability `p`; the script's words have 0.9): a word the stream's own model never gets
    right."""

    def __init__(self, audio: np.ndarray, script: list[tuple[str, float, float]], word: str,
                 heard: str, p: float) -> None:  # fmt: skip
        super().__init__(audio, script)
        self.word, self.heard, self.p = word, heard, p

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        words = super().transcribe(audio, prompt, **kwargs)  # type: ignore[arg-type]
        return [
            Word(" " + self.heard, w.t_start, w.t_end, self.p) if w.word.strip() == self.word
            else w
            for w in words
        ]  # fmt: skip


def test_the_background_reader_revises_what_the_stream_model_never_gets_right(
    clip: np.ndarray,
) -> None:
    """The stream's model reads "engine" as "engines" in every pass; the background reader
    (the accurate model, here a script of the truth) reads the utterance again after its
    commits and revises it. The next utterance-end pass of the stream's model, reaching back
    over that utterance (lookback), reads "engines" again: it must not undo the reader's word.
    The stream's model is unsure of it (p 0.4; the reader 0.9): `background_confidence` lets
    the surer reading win."""
    script = _truth_words()
    config = AsrConfig(**_FAST, effort_model_shift_s=0.0)  # the scripts share one clock

    def run(reader: BackgroundReader | None) -> list[EventFrame]:
        stream_model = AlwaysMishearingTranscriber(clip, script, "engine", "engines", 0.4)
        stage = AsrStage(config, transcriber=stream_model, reader=reader)
        return asyncio.run(_run(stage, clip))[0]

    events = run(None)
    assert "engines" in _speech(events)

    accurate = ScriptedTranscriber(clip, script)
    events = run(BackgroundReader(config, transcriber=accurate))
    assert _speech(events) == [w for w, _, _ in script]
    revisions = [e.payload.fields() for e in events if e.type == "asr_revision"]
    assert [(r["replaced_text"], r["text"], r["model"]) for r in revisions] == [
        ("engines", "engine", "base")
    ]
    # It read each utterance end's audio: the whole clip's speech, every utterance once or more.
    assert accurate.calls >= 3
    first = _first_commits(events)
    assert "engines" in first  # the first commits are the stream model's, not waiting for it


def test_the_background_reader_runs_at_the_lowest_priority() -> None:
    """The reader's thread (and the model threads it starts, which inherit it) only takes CPU
    that nothing else wants."""
    import os
    import threading

    if not hasattr(os, "getpriority"):
        pytest.skip("per-thread priority is a Linux feature")

    class Probe(Transcriber):
        nice: int | None = None

        def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
            Probe.nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
            return []

    async def read() -> None:
        reader = BackgroundReader(AsrConfig(), transcriber=Probe())
        await reader.load()
        await reader.read(Reread(np.zeros(SR, np.float32), 0.0, "", 0.0, 1.0))
        reader.close()

    asyncio.run(read())
    assert Probe.nice == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) != 19  # not the caller's


def test_an_effort_rung_reads_with_the_accurate_model_itself_not_in_the_background() -> None:
    assert AsrConfig(background_revise=True).revises_in_background
    assert not AsrConfig(background_revise=True, effort=2).revises_in_background
    assert not AsrConfig(background_revise=False).revises_in_background
    assert not AsrConfig(model="base").revises_in_background  # it is the accurate model


def test_a_shared_background_reader_closes_with_its_last_stage(clip: np.ndarray) -> None:
    """Two streams' stages share one reader (one accurate model): the first to finish leaves
    it open for the other; the last closes it."""
    script = _truth_words()
    accurate = ScriptedTranscriber(clip, script)
    reader = BackgroundReader(AsrConfig(), transcriber=accurate)

    async def both() -> tuple[AsrStage, AsrStage]:
        a, b = (
            AsrStage(AsrConfig(**_FAST), transcriber=ScriptedTranscriber(clip, script),
                     reader=reader, name=name)
            for name in ("asr:a", "asr:b")
        )  # fmt: skip
        await a.setup()
        await b.setup()
        await a.teardown()
        await reader.read(Reread(clip[: SR // 2].copy(), 0.0, "", 0.0, 0.5))  # still open
        await b.teardown()
        return a, b

    async def after() -> None:
        await reader.read(Reread(clip[: SR // 2].copy(), 0.0, "", 0.0, 0.5))

    asyncio.run(both())
    assert accurate.calls == 1
    with pytest.raises(RuntimeError, match="shutdown"):  # closed: no new reading is taken
        asyncio.run(after())


@pytest.mark.parametrize("confidence", [True, False])
def test_the_background_reader_leaves_a_surer_commit_alone(
    clip: np.ndarray, confidence: bool
) -> None:
    """With `background_confidence` the reader does not replace a word the stream's model was
    surer of (p 0.95 against its 0.9); without it, its reading always wins."""
    script = _truth_words()
    config = AsrConfig(**_FAST, background_confidence=confidence, effort_model_shift_s=0.0)
    stream_model = AlwaysMishearingTranscriber(clip, script, "engine", "engines", 0.95)
    reader = BackgroundReader(config, transcriber=ScriptedTranscriber(clip, script))
    events, _ = asyncio.run(_run(AsrStage(config, transcriber=stream_model, reader=reader), clip))
    assert ("engines" in _speech(events)) is confidence


class SlowTranscriber(ScriptedTranscriber):
    """Reads as scripted, taking `delay_s` of wall time per pass (a busy accurate model)."""

    def __init__(self, audio: np.ndarray, script: list[tuple[str, float, float]],
                 delay_s: float) -> None:  # fmt: skip
        super().__init__(audio, script)
        self.delay_s = delay_s

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        time.sleep(self.delay_s)
        return super().transcribe(audio, prompt, **kwargs)  # type: ignore[arg-type]


def test_offline_the_readings_land_alike_however_fast_the_reader_reads(
    clip: np.ndarray,
) -> None:
    """Offline (a file run) each background reading lands at the next utterance end, whether
    the reader finished at once or took long: the run's events do not depend on its speed."""
    script = _truth_words()

    def run(delay_s: float) -> list[tuple[str, str, float]]:
        config = AsrConfig(**_FAST, background_confidence=False)
        stream_model = AlwaysMishearingTranscriber(clip, script, "engine", "engines", 0.4)
        reader = BackgroundReader(config, transcriber=SlowTranscriber(clip, script, delay_s))
        stage = AsrStage(config, transcriber=stream_model, reader=reader, live=False)
        events, _ = asyncio.run(_run(stage, clip))
        return [(e.type, e.payload.fields().get("text", ""), e.t_media) for e in events]

    instant, slow = run(0.0), run(0.3)
    assert any(kind == "asr_revision" for kind, _, _ in instant)
    assert instant == slow


@pytest.mark.parametrize("prime_stream", [True, False])
def test_the_background_reader_reads_primed_and_guarded_as_the_stream_would(
    clip: np.ndarray, prime_stream: bool
) -> None:
    """The stream's model never gets "engine" (reads "engines", unsure). The reader (the
    accurate model) mishears it as "and gin" unprimed and gets it primed, where it also imitates
    slide terms after "spoken". With the slides on screen its reading is guarded like the
    stream's full passes: the term is kept, the imitation dropped; without slides its reading
    "and gin" (surer than "engines") replaces the commit. With `prime_stream` off the stream's
    own passes are never primed; the reader's readings are, as before."""
    script = _truth_words()

    def run(
        slides: ScreenTerms | None,
    ) -> tuple[list[str], SlideBiasedTranscriber, list[list[str]]]:
        # The scripted models place words alike: no clock shift between them.
        config = AsrConfig(
            **_FAST,
            prime_max_terms=20,
            prime_guard="full",
            prime_trust_terms=0,
            prime_stream=prime_stream,
            effort_model_shift_s=0.0,
        )
        stream_model = AlwaysMishearingTranscriber(clip, script, "engine", "engines", 0.4)
        accurate = SlideBiasedTranscriber(clip, script)
        reader = BackgroundReader(config, transcriber=accurate)
        stage = AsrStage(config, transcriber=stream_model, screen_terms=slides, reader=reader)
        return _speech(asyncio.run(_run(stage, clip))[0]), accurate, stream_model.hotwords

    slides = ScreenTerms()
    slides.add(["The engine reads Kubelet logs"], 0.0)
    words, accurate, stream_hotwords = run(slides)
    assert words == [w for w, _, _ in script]
    assert any(accurate.hotwords) and not all(accurate.hotwords)  # unprimed and primed
    assert any(stream_hotwords) is prime_stream
    words, accurate, stream_hotwords = run(None)
    assert "gin" in words and not any(accurate.hotwords) and not any(stream_hotwords)


def test_a_missing_accurate_model_leaves_the_stream_running(
    clip: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    """The reviser is optional: without its model the stage says so and goes on as before."""
    script = _truth_words()
    config = AsrConfig(**_FAST, effort_model="/no/such/whisper-base")
    stage = AsrStage(
        config, transcriber=ScriptedTranscriber(clip, script), reader=BackgroundReader(config)
    )
    events, _ = asyncio.run(_run(stage, clip))
    assert stage.reader is None
    assert "no background reviser" in caplog.text and "/no/such/whisper-base" in caplog.text
    assert _speech(events) == [w for w, _, _ in script]


class LoopingTranscriber(ScriptedTranscriber):
    """Reads as scripted, and where a pass's audio ends inside the second utterance, Whisper's
    decoder loop follows its words (noise sets it off): a phrase read again and again, the
    words crowded at the audio's end (no sound under them), unsure."""

    LOOP = "I'm going to be on the beach, and " * 3

    def transcribe(self, audio: np.ndarray, prompt: str = "", **kwargs: object) -> list[Word]:
        words = super().transcribe(audio, prompt, **kwargs)  # type: ignore[arg-type]
        end = self._offset(audio) + len(audio) / SR
        if not 5.0 < end < 8.0:
            return words
        t = len(audio) / SR
        return words + [Word(" " + w, t, t, 0.2) for w in self.LOOP.split()]


@pytest.mark.parametrize("loop_ngram", [4, 0])
def test_a_repetition_loop_is_never_committed(clip: np.ndarray, loop_ngram: int) -> None:
    """Passes that end in a decoder loop are cut where the loop starts: no word of it is
    committed, and every spoken word still is. With the cut off (0) the loop's words are
    committed, some by the age rule long after the time the model gave them."""
    script = _truth_words()
    fake = LoopingTranscriber(clip, script)
    config = AsrConfig(**_FAST, loop_ngram=loop_ngram, background_revise=False)
    events, _ = asyncio.run(_run(AsrStage(config, transcriber=fake), clip))
    first = _first_commits(events)
    if loop_ngram:
        assert "beach," not in first
        assert _speech(events) == [w for w, _, _ in script]
    else:
        assert "beach," in first


def test_a_phrase_said_twice_is_not_a_loop() -> None:
    """Speech repeats itself (twice within a sentence, or a word said over): kept whole."""
    from streamfuse.audio.stage import _cut_repetition_loop

    def words(text: str) -> list[Word]:
        return [Word(" " + w, i * 0.3, i * 0.3 + 0.25, 0.9) for i, w in enumerate(text.split())]

    dickens = words(
        "It was the best of times, it was the worst of times, it was the age of wisdom, "
        "it was the age of foolishness, it was the epoch of belief"
    )
    assert _cut_repetition_loop(dickens, 4) == dickens
    stutter = words("we we we we need this")
    assert _cut_repetition_loop(stutter, 4) == stutter
    loop = words("the spectral theorem says thank you thank you thank you thank you")
    assert [w.word for w in _cut_repetition_loop(loop, 4)] == [
        " the",
        " spectral",
        " theorem",
        " says",
    ]
    assert _cut_repetition_loop(loop, 0) == loop
