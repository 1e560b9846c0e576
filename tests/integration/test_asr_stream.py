"""The real tiny.en streaming stage over the short test clip, through a Pipeline + CollectSink."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from streamfuse.audio import AsrConfig, AsrStage
from streamfuse.pipeline import Pipeline
from streamfuse.sinks import CollectSink
from streamfuse.sources.media import MediaSource
from streamfuse.text import normalize_english

pytestmark = pytest.mark.integration

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "test"


def test_tiny_en_transcribes_the_short_clip_with_word_times() -> None:
    truth = json.loads((ASSETS / "short.truth.json").read_text())
    sink = CollectSink()
    stage = AsrStage(AsrConfig(model="tiny.en"))
    source = MediaSource(ASSETS / "short.mp4", video=False)  # as fast as possible
    pipeline = Pipeline().link(source, stage, maxsize=3000).link(stage, sink)
    asyncio.run(pipeline.run())

    assert not sink.of_type("error")
    asr = sink.of_type("asr")
    said = set(normalize_english(" ".join(r["text"] for r in asr)).split())
    # Content words of the truth (4+ letters): tiny.en may miss one, not more.
    content = {w for u in truth["asr"] for w in normalize_english(u["text"]).split() if len(w) >= 4}
    missing = sorted(content - said)
    assert len(content) >= 8
    assert len(missing) <= max(1, len(content) // 10), f"missing {missing} from {sorted(said)}"

    intervals = [(u["t_start"] - 1.0, u["t_end"] + 1.0) for u in truth["asr"]]
    words = [w for r in asr for w in r["words"]]
    assert len(words) >= 20
    for w in words:
        assert w["t_start"] <= w["t_end"]
        assert 0.0 <= w["p"] <= 1.0
        assert any(a <= w["t_start"] and w["t_end"] <= b for a, b in intervals), w
    starts = [w["t_start"] for w in words]
    assert starts == sorted(starts)
    for r in asr:
        assert r["t_start"] == r["words"][0]["t_start"] and r["t_end"] == r["words"][-1]["t_end"]
        assert r["latency_ms"] >= 0.0


def test_a_forced_effort_rung_runs_its_model_on_every_full_pass() -> None:
    """`effort=2`: each full-window pass runs Whisper base (beam 5), fast updates tiny.en; the
    words still carry the clip's speech."""
    from streamfuse.audio.effort import EffortTranscriber
    from streamfuse.audio.transcriber import WhisperTranscriber

    sink = CollectSink()
    stage = AsrStage(AsrConfig(model="tiny.en", effort=2))
    source = MediaSource(ASSETS / "short.mp4", video=False)
    pipeline = Pipeline().link(source, stage, maxsize=3000).link(stage, sink)
    asyncio.run(pipeline.run())

    assert not sink.of_type("error")
    ladder = stage.effort
    assert isinstance(ladder, EffortTranscriber) and ladder.rung == 2
    assert ladder.passes[2] >= 2 and ladder.passes[:2] == [0, 0]
    assert [(r, reason) for _, r, reason in ladder.history] == [(2, "start")]
    base, fast = ladder.full[2], ladder.fast
    assert isinstance(base, WhisperTranscriber) and isinstance(fast, WhisperTranscriber)
    assert (base.config.model, base.config.full_beam_size) == ("base", 5)
    assert base.calls == ladder.passes[2] and fast.calls > 0  # fast updates stay on tiny.en
    said = normalize_english(" ".join(r["text"] for r in sink.of_type("asr"))).split()
    assert len(said) >= 20


SPEECH_SET = Path(__file__).resolve().parents[2] / "assets" / "eval" / "speech"


def test_build_pipeline_primes_each_asr_stage_with_its_streams_ocr() -> None:
    from streamfuse.app import StreamfuseConfig, build_pipeline

    clip = ASSETS / "short.mp4"
    primed = StreamfuseConfig()  # priming is on by default
    job = asyncio.run(build_pipeline([str(clip)], primed, [CollectSink()]))
    (asr,) = [s for s in job.pipeline.stages if isinstance(s, AsrStage)]
    assert asr.screen_terms is not None and asr.screen_terms.stream_id == clip.stem
    assert asr.screen_terms in job.pipeline.observers
    # No OCR on the stream, or priming off: nothing to prime with.
    off = StreamfuseConfig(asr_config=AsrConfig(prime_max_terms=0))
    for config in (StreamfuseConfig(ocr=False), off):
        job = asyncio.run(build_pipeline([str(clip)], config, [CollectSink()]))
        (asr,) = [s for s in job.pipeline.stages if isinstance(s, AsrStage)]
        assert asr.screen_terms is None


def test_live_speech_is_linked_to_shed_when_far_behind() -> None:
    """Live runs skip audio recognition has fallen `audio_shed_after_s` behind on; offline
    runs, and live ones with the bound at 0, never skip."""
    from streamfuse.app import StreamfuseConfig, build_pipeline
    from streamfuse.pipeline import OverloadPolicy

    clip = ASSETS / "short.mp4"
    for config, policy in (
        (StreamfuseConfig(ocr=False, realtime=True), OverloadPolicy.SHED_LATE),
        (StreamfuseConfig(ocr=False), OverloadPolicy.BLOCK),
        (StreamfuseConfig(ocr=False, realtime=True, audio_shed_after_s=0), OverloadPolicy.BLOCK),
    ):
        job = asyncio.run(build_pipeline([str(clip)], config, [CollectSink()]))
        (asr,) = [s for s in job.pipeline.stages if isinstance(s, AsrStage)]
        assert asr.input_policy is policy
        asyncio.run(job.sources[0].close())


def _transcribe(name: str, primed: bool) -> str:
    from faster_whisper import decode_audio

    from streamfuse.audio import ScreenTerms
    from streamfuse.events import EventRecord, speech_words
    from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ as SR
    from streamfuse.frames import AudioFrame, EventFrame
    from streamfuse.testing import run_stage

    truth = json.loads((SPEECH_SET / f"{name}.truth.json").read_text())
    audio = decode_audio(str(SPEECH_SET / f"{name}.ogg"), sampling_rate=SR)
    terms = None
    if primed:
        terms = ScreenTerms()
        for slide in truth["ocr"]:
            terms.add(slide["lines"], slide["t_start"] + 1.0)  # read a second after it shows
    stage = AsrStage(AsrConfig(prime_max_terms=20), screen_terms=terms)
    frames = [
        AudioFrame(t_media=i / SR, samples=audio[i : i + 320], arrival_wall=i / SR, index=i)
        for i in range(0, len(audio) - 320 + 1, 320)
    ]
    out = asyncio.run(run_stage(stage, frames))
    records = [
        EventRecord(type=f.type, stream_id=f.stream_id, t_start=f.t_media, t_end=f.t_end,
                    latency_ms=0.0, payload=f.payload)
        for f in out
        if isinstance(f, EventFrame)
    ]  # fmt: skip
    # The final transcript: the commits with their revisions (the background reviser's too).
    return " ".join(w.word for w, _ in speech_words(records))


@pytest.mark.slow
def test_slide_terms_fix_domain_words_and_off_topic_slides_do_not_leak() -> None:
    from streamfuse.text import wer

    name = "kubernetes-us-white20"
    ref = " ".join(
        u["text"] for u in json.loads((SPEECH_SET / f"{name}.truth.json").read_text())["asr"]
    )
    plain, primed = _transcribe(name, False), _transcribe(name, True)
    assert "kubernetes" not in normalize_english(plain).split()  # tiny.en alone mishears it
    assert "kubernetes" in normalize_english(primed).split(), primed
    assert wer(ref, primed) < wer(ref, plain), (plain, primed)
    # Slides of another lecture: none of their terms appear in the transcript.
    name = "chem-lanc-white12-offslide"
    truth = json.loads((SPEECH_SET / f"{name}.truth.json").read_text())
    shown = {w.lower() for s in truth["ocr"] for line in s["lines"] for w in line.split()}
    spoken = set(normalize_english(" ".join(u["text"] for u in truth["asr"])).split())
    leaked = (set(normalize_english(_transcribe(name, True)).split()) & shown) - spoken
    assert not leaked - {"and", "the", "of", "a", "c"}, leaked


def test_whisper_base_checks_a_slide_term_by_its_sound() -> None:
    """`Transcriber.score` and `priming.correct_terms` with the real accurate model: "Hastings"
    (on the slide, misheard unprimed) is put in place of the words spelled like it; the same
    audio with another lecture's slides is left as heard; scoring the heard words gives one
    (log p, tokens) per word, and a word the audio does not hold lowers the score."""
    from faster_whisper import decode_audio

    from streamfuse.audio import ScreenTerms
    from streamfuse.audio.priming import correct_terms, scorer
    from streamfuse.audio.reviser import accurate_config
    from streamfuse.audio.transcriber import WhisperTranscriber
    from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ as SR

    def slide_terms(name: str, t: float) -> list[str]:
        screen = ScreenTerms()
        for slide in json.loads((SPEECH_SET / f"{name}.truth.json").read_text())["ocr"]:
            screen.add(slide["lines"], slide["t_start"])
        return screen.terms(t, base.token_count)

    base = WhisperTranscriber(accurate_config(AsrConfig()))
    name = "bayes-nyc-brown5"
    said = json.loads((SPEECH_SET / f"{name}.truth.json").read_text())["asr"][3]
    assert "Hastings" in said["text"]
    audio = decode_audio(str(SPEECH_SET / f"{name}.ogg"), sampling_rate=SR)
    audio = audio[int((said["t_start"] - 0.3) * SR) : int((said["t_end"] + 0.3) * SR)]
    heard = base.transcribe(audio)
    texts = [w.word.strip() for w in heard]

    scores = base.score(audio, "", [texts, [*texts[:-1], "giraffe", texts[-1]]])
    assert scores is not None and len(scores[0]) == len(texts)
    assert all(log_p <= 0.0 and n >= 1 for log_p, n in scores[0])
    assert sum(s for s, _ in scores[1]) < sum(s for s, _ in scores[0]) - 5.0

    terms = slide_terms(name, said["t_end"])
    assert "Hastings" in terms and "hastings" not in normalize_english(" ".join(texts))
    fixed, n = correct_terms(heard, terms, scorer(base.score, audio, "", terms))
    assert n >= 1 and "hastings" in normalize_english(" ".join(w.word for w in fixed))
    assert all(w.checked for w in fixed if w not in heard)
    other = slide_terms("glaciers-wmids-brown10", 60.0)
    assert correct_terms(heard, other, scorer(base.score, audio, "", other)) == (heard, 0)


def test_a_short_tail_after_the_last_word_is_not_read_as_a_second_window() -> None:
    """faster-whisper reads the audio after a window's last word as one more window (a whole
    30 s encoder run) unless the window ended on a lone timestamp. Each utterance of the short
    clip, read with the text before it as prompt and 0.35 s of its pause: with
    `tail_window_min_s` 0 (faster-whisper as is) the tail is read again in some; by default no
    pass reads a second window, and every word before the tail is read alike."""
    from faster_whisper import decode_audio

    from streamfuse.audio.transcriber import WhisperTranscriber

    sr = 16000
    audio = np.asarray(decode_audio(str(ASSETS / "short.mp4"), sampling_rate=sr), np.float32)
    truth = json.loads((ASSETS / "short.truth.json").read_text())
    as_is = WhisperTranscriber(AsrConfig(model="tiny.en", tail_window_min_s=0.0))
    as_is.load()
    model = as_is._model
    windows: list[int] = []
    encode = model.encode

    def counted(features: np.ndarray) -> object:
        out = encode(features)  # raises where a tail is skipped: not counted
        windows[-1] += 1
        return out

    model.encode = counted
    prompt = ""
    tails = 0
    for utterance in truth["asr"]:
        piece = audio[round(utterance["t_start"] * sr) : round((utterance["t_end"] + 0.35) * sr)]
        read = {}
        for tail_s in (0.0, 1.0):
            windows.append(0)
            words = as_is.variant(tail_window_min_s=tail_s).transcribe(piece, prompt)
            read[tail_s] = [w.word for w in words]
        tails += windows[-2] > 1
        assert windows[-1] == 1
        assert read[1.0] and read[1.0] == read[0.0][: len(read[1.0])]
        prompt += " " + utterance["text"]
    assert tails >= 1, "no pass read a tail window: the test shows nothing here"
