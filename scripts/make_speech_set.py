#!/usr/bin/env python
"""Generate the harder speech evaluation set (`assets/eval/speech/`) and its ground truth.

Contract: writes one ``<clip>.ogg`` (16 kHz mono Opus, 32 kbit/s) and one ``<clip>.truth.json``
per clip, plus ``set.json`` (the clips, their split and conditions). A truth file has the keys
of the bundled clip's truth (``duration_s``, ``ocr`` = the slides on screen while it plays,
``asr`` = one entry per spoken sentence with its exact times) and ``meta`` (voice, speed, noise,
SNR, music, split, and whether the slides carry the spoken terms). Deterministic for a seed.

    apt-get install -y espeak-ng
    .venv/bin/python scripts/make_speech_set.py --out assets/eval/speech

Conditions: eight synthetic lectures, each in another espeak-ng voice or accent (US, Scottish,
Caribbean, RP, New York, West Midlands, Lancaster, a female variant) at 130-185 words/min, with
white, pink, brown or babble noise (reversed speech: voice-like but no words to transcribe)
at 5-20 dB SNR over the speech, three with a synthetic music bed; two clips of real human speech
(a LibriVox-style reading of Dickens and a Beckett line) taken from the ``moonshine-voice==0.1.0``
wheel (MIT), downloaded with pip unless ``--human-wheel`` names it. Six synthetic clips show
slides carrying their domain terms ("matched"); two show another lecture's slides ("mismatched":
priming must not insert those terms); one has a 3-s silent gap while terms are on screen.
Split: ``dev`` (choose parameters here) and ``heldout`` (report only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import wave
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
from numpy.typing import NDArray

RATE_HZ = 16_000
F32 = NDArray[np.float32]


@dataclass(frozen=True)
class Topic:
    slides: list[list[str]]  # each slide: title + lines, shown in order over the clip
    sentences: list[str]


TOPICS: dict[str, Topic] = {
    "kubernetes": Topic(
        [
            ["Kubernetes control plane", "etcd keeps the cluster state", "kubelet on every node"],
            ["Scheduling pods", "taints and tolerations", "horizontal pod autoscaler"],
        ],
        [
            "Kubernetes runs containers in small groups called pods.",
            "The control plane keeps all of its cluster state in etcd.",
            "On every node, the kubelet starts the pods that were assigned to it.",
            "Taints and tolerations keep some pods away from special nodes.",
            "The horizontal pod autoscaler adds replicas when the load goes up.",
        ],
    ),
    "mitochondria": Topic(
        [
            ["Mitochondria", "cristae and the inner membrane", "adenosine triphosphate"],
            ["Oxidative phosphorylation", "electron transport chain", "cytochrome c oxidase"],
        ],
        [
            "Mitochondria are the power plants of the eukaryotic cell.",
            "The inner membrane folds into cristae to gain surface area.",
            "Most adenosine triphosphate is made by oxidative phosphorylation.",
            "The electron transport chain pumps protons across the membrane.",
            "Cytochrome c oxidase passes the electrons on to oxygen.",
        ],
    ),
    "eigen": Topic(
        [
            ["Eigenvalues", "Hermitian matrices", "spectral theorem"],
            ["Factorisations", "Cholesky decomposition", "Gram Schmidt orthogonalisation"],
        ],
        [
            "A Hermitian matrix has only real eigenvalues.",
            "The spectral theorem says its eigenvectors are orthogonal.",
            "For a positive definite matrix we use the Cholesky decomposition.",
            "Gram Schmidt orthogonalisation turns any basis into an orthonormal one.",
        ],
    ),
    "paths": Topic(
        [
            ["Shortest paths", "Dijkstra with a binary heap", "Bellman Ford and negative edges"],
            ["A star search", "an admissible heuristic", "Floyd Warshall for all pairs"],
        ],
        [
            "Dijkstra's algorithm keeps the frontier in a binary heap.",
            "With negative edge weights we fall back to Bellman Ford.",
            "A star search adds an admissible heuristic to guide the frontier.",
            "For all pairs of vertices, Floyd Warshall fills a table in cubic time.",
        ],
    ),
    "bayes": Topic(
        [
            ["Bayesian inference", "prior, likelihood, posterior", "conjugate priors"],
            ["Sampling", "Markov chain Monte Carlo", "Metropolis Hastings acceptance ratio"],
        ],
        [
            "Bayesian inference multiplies the prior by the likelihood.",
            "With a conjugate prior the posterior has a closed form.",
            "Otherwise we draw samples with Markov chain Monte Carlo.",
            "Metropolis Hastings accepts a proposal with the acceptance ratio.",
        ],
    ),
    "glaciers": Topic(
        [
            ["The Pleistocene", "terminal moraines", "drumlins and eskers"],
            ["After the ice", "isostatic rebound", "proglacial lakes"],
        ],
        [
            "During the Pleistocene, ice sheets covered much of the north.",
            "A terminal moraine marks the furthest advance of a glacier.",
            "Drumlins and eskers were shaped by the moving ice and its meltwater.",
            "The land is still rising today through isostatic rebound.",
        ],
    ),
    "transport": Topic(
        [
            ["TCP congestion control", "slow start, congestion window", "Nagle's algorithm"],
            ["QUIC", "runs over UDP", "zero round trip handshake"],
        ],
        [
            "TCP congestion control begins with slow start.",
            "The congestion window doubles every round trip.",
            "Nagle's algorithm waits to merge small segments.",
            "QUIC runs over UDP and offers a zero round trip handshake.",
        ],
    ),
    "chemistry": Topic(
        [
            ["Chemical bonds", "electronegativity", "Lewis structures"],
            [
                "Molecular shape",
                "valence shell electron pair repulsion",
                "hybridisation of orbitals",
            ],
        ],
        [
            "Electronegativity tells how strongly an atom pulls shared electrons.",
            "A Lewis structure shows every bonding pair and lone pair.",
            "Valence shell electron pair repulsion predicts the shape of a molecule.",
            "Carbon in methane shows hybridisation of its orbitals.",
        ],
    ),
}


@dataclass(frozen=True)
class Clip:
    name: str
    topic: str
    voice: str
    speed_wpm: int
    noise: str  # none, white, pink, brown, babble
    snr_db: float | None
    music_db: float | None  # music bed level relative to speech, dB (None: no music)
    split: str
    slides_from: str | None = None  # another topic's slides: speech does not match the screen
    gap_s: float = 0.0  # a silent gap in the middle (terms on screen, nobody speaking)


CLIPS = [
    Clip("kubernetes-us-white20", "kubernetes", "en-us", 165, "white", 20, None, "dev"),
    Clip("mito-scot-pink18", "mitochondria", "en-gb-scotland", 145, "pink", 18, None, "heldout"),
    Clip("eigen-carib-babble15", "eigen", "en-029", 150, "babble", 15, None, "dev", gap_s=3.0),
    Clip("paths-rp-music", "paths", "en-gb-x-rp", 140, "none", None, -12, "heldout"),
    Clip("bayes-nyc-brown5", "bayes", "en-us-nyc", 160, "brown", 5, None, "dev"),
    Clip("glaciers-wmids-brown10", "glaciers", "en-gb-x-gbcwmd", 150, "brown", 10, -15, "heldout"),
    Clip(
        "transport-f-babble15-offslide",
        "transport",
        "en-us+f3",
        135,
        "babble",
        15,
        -14,
        "dev",
        slides_from="glaciers",
    ),
    Clip(
        "chem-lanc-white12-offslide",
        "chemistry",
        "en-gb-x-gbclan",
        160,
        "white",
        12,
        None,
        "heldout",
        slides_from="mitochondria",
    ),
]

#: Real human speech shipped in the moonshine-voice 0.1.0 wheel, with its known text.
HUMAN = {
    "human-beckett": (
        "beckett.wav",
        "dev",
        ["Ever tried. Ever failed. No matter. Try again. Fail again. Fail better."],
        [["Samuel Beckett", "Worstward Ho, 1983"]],
    ),
    "human-dickens": (
        "two_cities.wav",
        "heldout",
        [
            "It was the best of times, it was the worst of times, it was the age of wisdom, "
            "it was the age of foolishness, it was the epoch of belief, it was the epoch of "
            "incredulity, it was the season of Light, it was the season of Darkness, it was the "
            "spring of hope, it was the winter of despair, we had everything before us, we had "
            "nothing before us, we were all going direct to Heaven, we were all going direct the "
            "other way - in short, the period was so far like the present period, that some of "
            "its noisiest authorities insisted on its being received, for good or for evil, in "
            "the superlative degree of comparison only."
        ],
        [["Charles Dickens", "A Tale of Two Cities", "epoch of incredulity", "superlative degree"]],
    ),
}


def to_16k(pcm: NDArray[np.int16], rate_hz: int) -> F32:
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
    frame.sample_rate = rate_hz
    resampler = av.AudioResampler(format="flt", layout="mono", rate=RATE_HZ)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out).astype(np.float32)


def read_wav(path: Path) -> F32:
    with wave.open(str(path), "rb") as w:
        if w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise SystemExit(f"{path}: expected 16-bit mono WAV")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
        return to_16k(pcm, w.getframerate())


def synthesize(text: str, voice: str, speed_wpm: int, workdir: Path) -> F32:
    """espeak-ng -> 16 kHz float32, leading/trailing silence trimmed (exact truth times)."""
    wav_path = workdir / "s.wav"
    cmd = ["espeak-ng", "-v", voice, "-s", str(speed_wpm), "-w", str(wav_path), text]
    subprocess.run(cmd, check=True, capture_output=True)
    audio = read_wav(wav_path)
    loud = np.flatnonzero(np.abs(audio) > 0.01 * float(np.abs(audio).max()))
    return audio[loud[0] : loud[-1] + 1]


def shaped_noise(n: int, kind: str, rng: np.random.Generator) -> F32:
    """Unit-RMS white, pink (1/f) or brown (1/f^2) noise."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.maximum(np.fft.rfftfreq(n, d=1.0 / RATE_HZ), 20.0)
    if kind == "pink":
        spectrum /= np.sqrt(freqs)
    elif kind == "brown":
        spectrum /= freqs
    noise = np.fft.irfft(spectrum, n)
    return (noise / np.sqrt(np.mean(noise**2))).astype(np.float32)


def babble(n: int, rng: np.random.Generator, workdir: Path) -> F32:
    """Four time-reversed voices: speech-like spectrum and rhythm, but no words."""
    voices = ["en-us", "en-gb", "en-us+f2", "en-029"]
    texts = [s for t in TOPICS.values() for s in t.sentences]
    out = np.zeros(n, np.float32)
    for v in voices:
        track = np.concatenate(
            [synthesize(texts[int(rng.integers(len(texts)))], v, 170, workdir) for _ in range(8)]
        )[::-1]
        track = np.resize(track, n)
        out += np.roll(track, int(rng.integers(n)))
    return (out / np.sqrt(np.mean(out**2))).astype(np.float32)


def music_bed(n: int, rng: np.random.Generator) -> F32:
    """A chord progression with harmonics and a plucked arpeggio (unit RMS)."""
    t = np.arange(n) / RATE_HZ
    chords = [(220.0, 277.2, 329.6), (196.0, 246.9, 293.7), (174.6, 220.0, 261.6)]
    out = np.zeros(n)
    bar_s = 2.0
    for i in range(int(np.ceil(n / RATE_HZ / bar_s))):
        chord = chords[i % len(chords)]
        a, b = int(i * bar_s * RATE_HZ), min(n, int((i + 1) * bar_s * RATE_HZ))
        tt = t[a:b] - t[a]
        for f in chord:
            for h, amp in ((1, 1.0), (2, 0.4), (3, 0.2)):
                out[a:b] += amp * np.sin(2 * np.pi * f * h * tt) * np.minimum(1.0, tt * 8)
        for k in range(8):  # arpeggio, an eighth note each
            s = a + int(k * bar_s / 8 * RATE_HZ)
            e = min(b, s + int(bar_s / 8 * RATE_HZ))
            if s >= e:
                break
            f = chord[int(rng.integers(3))] * 2
            tk = t[s:e] - t[s]
            out[s:e] += 0.8 * np.sin(2 * np.pi * f * tk) * np.exp(-tk * 6)
    return (out / np.sqrt(np.mean(out**2))).astype(np.float32)


def encode_opus(audio: F32, path: Path) -> None:
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
    with av.open(str(path), "w", format="ogg") as out:
        stream = out.add_stream("libopus", rate=RATE_HZ)
        stream.bit_rate = 32_000
        stream.layout = "mono"  # type: ignore[union-attr]
        step = 960
        for i in range(0, len(pcm), step):
            frame = av.AudioFrame.from_ndarray(pcm[None, i : i + step], format="s16", layout="mono")
            frame.sample_rate = RATE_HZ
            frame.pts = i
            for packet in stream.encode(frame):  # type: ignore[union-attr]
                out.mux(packet)
        for packet in stream.encode(None):  # type: ignore[union-attr]
            out.mux(packet)


def place(parts: list[F32], pauses_s: list[float], lead_s: float) -> tuple[F32, list[tuple]]:
    """Concatenate sentences with pauses; return audio and (t_start, t_end) per sentence."""
    pieces = [np.zeros(int(lead_s * RATE_HZ), np.float32)]
    spans = []
    t = lead_s
    for part, pause in zip(parts, pauses_s, strict=True):
        spans.append((round(t, 3), round(t + len(part) / RATE_HZ, 3)))
        pieces += [part, np.zeros(int(pause * RATE_HZ), np.float32)]
        t += len(part) / RATE_HZ + int(pause * RATE_HZ) / RATE_HZ
    return np.concatenate(pieces), spans


def slide_times(spans: list[tuple], n_slides: int, duration_s: float) -> list[tuple[float, float]]:
    """Slides change where the sentences split evenly (a slide shows a little early)."""
    per = int(np.ceil(len(spans) / n_slides))
    starts = [0.0] + [max(0.0, spans[i * per][0] - 0.5) for i in range(1, n_slides)]
    ends = starts[1:] + [duration_s]
    return [(round(a, 3), round(b, 3)) for a, b in zip(starts, ends, strict=True)]


def mix(speech: F32, spans: list[tuple], clip: Clip, rng: np.random.Generator, wd: Path) -> F32:
    voiced = np.concatenate([speech[int(a * RATE_HZ) : int(b * RATE_HZ)] for a, b in spans])
    speech_rms = float(np.sqrt(np.mean(voiced**2)))
    out = speech.copy()
    n = len(out)
    if clip.noise != "none" and clip.snr_db is not None:
        noise = babble(n, rng, wd) if clip.noise == "babble" else shaped_noise(n, clip.noise, rng)
        out += noise * speech_rms * 10 ** (-clip.snr_db / 20)
    if clip.music_db is not None:
        out += music_bed(n, rng) * speech_rms * 10 ** (clip.music_db / 20)
    return (out * (0.5 / max(1e-6, float(np.abs(out).max())))).astype(np.float32)


def build_clip(clip: Clip, seed: int, out_dir: Path, wd: Path) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    topic = TOPICS[clip.topic]
    parts = [synthesize(s, clip.voice, clip.speed_wpm, wd) for s in topic.sentences]
    pauses = [float(rng.uniform(0.35, 0.9)) for _ in parts]
    if clip.gap_s:
        pauses[len(pauses) // 2 - 1] += clip.gap_s
    pauses[-1] = 1.0
    speech, spans = place(parts, pauses, lead_s=0.6)
    audio = mix(speech, spans, clip, rng, wd)
    duration = round(len(audio) / RATE_HZ, 3)
    shown = TOPICS[clip.slides_from or clip.topic].slides
    times = slide_times(spans, len(shown), duration)
    truth = {
        "duration_s": duration,
        "ocr": [
            {"t_start": a, "t_end": b, "lines": lines}
            for (a, b), lines in zip(times, shown, strict=True)
        ],
        "asr": [
            {"t_start": a, "t_end": b, "text": text}
            for (a, b), text in zip(spans, topic.sentences, strict=True)
        ],
        "meta": {
            "source": "espeak-ng",
            "voice": clip.voice,
            "speed_wpm": clip.speed_wpm,
            "noise": clip.noise,
            "snr_db": clip.snr_db,
            "music_db": clip.music_db,
            "silent_gap_s": clip.gap_s,
            "slides_match_speech": clip.slides_from is None,
            "split": clip.split,
        },
    }
    encode_opus(audio, out_dir / f"{clip.name}.ogg")
    return truth


def build_human(name: str, wheel: zipfile.ZipFile, out_dir: Path, wd: Path) -> dict[str, object]:
    wav_name, split, texts, slides = HUMAN[name]
    (wd / "h.wav").write_bytes(wheel.read(f"moonshine_voice/assets/{wav_name}"))
    audio = read_wav(wd / "h.wav")
    audio = np.concatenate([np.zeros(int(0.5 * RATE_HZ), np.float32), audio])
    loud = np.flatnonzero(np.abs(audio) > 0.02 * float(np.abs(audio).max()))
    duration = round(len(audio) / RATE_HZ, 3)
    encode_opus(
        (audio * (0.5 / float(np.abs(audio).max()))).astype(np.float32), out_dir / f"{name}.ogg"
    )
    t0, t1 = round(loud[0] / RATE_HZ, 3), round(loud[-1] / RATE_HZ, 3)
    return {
        "duration_s": duration,
        "ocr": [{"t_start": 0.0, "t_end": duration, "lines": slides[0]}],
        "asr": [{"t_start": t0, "t_end": t1, "text": " ".join(texts)}],
        "meta": {
            "source": f"moonshine-voice==0.1.0 assets/{wav_name} (MIT wheel; human reader)",
            "noise": "none",
            "snr_db": None,
            "music_db": None,
            "slides_match_speech": True,
            "split": split,
        },
    }


def human_wheel(path: Path | None, wd: Path) -> zipfile.ZipFile:
    if path is None:
        cmd = ["pip", "download", "--no-deps", "moonshine-voice==0.1.0", "-d", str(wd)]
        subprocess.run(cmd, check=True)
        path = next(wd.glob("moonshine_voice-0.1.0-*.whl"))
    return zipfile.ZipFile(path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("assets/eval/speech"))
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--human-wheel", type=Path, default=None, help="moonshine-voice 0.1.0")
    args = parser.parse_args(argv)
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng not found: apt-get install -y espeak-ng")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = []
    with tempfile.TemporaryDirectory() as tmp:
        wd = Path(tmp)
        for i, clip in enumerate(CLIPS):
            truth = build_clip(clip, args.seed + i, args.out, wd)
            (args.out / f"{clip.name}.truth.json").write_text(json.dumps(truth, indent=1) + "\n")
            manifest.append({"name": clip.name, **truth["meta"]})  # type: ignore[dict-item]
        wheel = human_wheel(args.human_wheel, wd)
        for name in HUMAN:
            truth = build_human(name, wheel, args.out, wd)
            (args.out / f"{name}.truth.json").write_text(json.dumps(truth, indent=1) + "\n")
            manifest.append({"name": name, **truth["meta"]})  # type: ignore[dict-item]
    (args.out / "set.json").write_text(json.dumps({"clips": manifest}, indent=1) + "\n")
    print(f"wrote {len(manifest)} clips to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
