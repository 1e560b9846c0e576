#!/usr/bin/env python
"""Generate the bundled synthetic lecture clips and their ground truth.

Contract: writes ``<out>/<name>.mp4`` (1280x720, 30 fps H.264 + 48 kHz mono AAC) and
``<out>/<name>.truth.json`` with exactly the keys ``duration_s``, ``ocr`` (one entry per
slide: ``t_start``, ``t_end``, ``lines`` in reading order, exactly as drawn) and ``asr``
(one entry per spoken sentence: ``t_start``, ``t_end``, ``text`` as spoken). All times are
media seconds. The output is deterministic for a given seed, toolchain and font set.

Regenerate the committed assets (takes well under a minute)::

    apt-get install -y espeak-ng fonts-dejavu fonts-liberation fonts-freefont-ttf
    .venv/bin/python scripts/make_demo_clip.py --preset demo --out src/streamfuse/assets/demo
    .venv/bin/python scripts/make_demo_clip.py --preset short --out assets/test

Both streams are stored time-interleaved (audio and video of the same moment side by side),
as live senders and ``ffmpeg -c copy`` write them; ``--reinterleave`` rewrites an existing
clip so without re-synthesising it.

Needs: ``espeak-ng`` on PATH (speech), the DejaVu / Liberation / FreeFont TTF files under
/usr/share/fonts/truetype (slides), and Python packages ``av`` (PyAV), ``Pillow``, ``numpy``.
Nothing here is needed at test time: tests read the committed files.

How the clip is built:
- Slides are drawn with Pillow in several fonts (28-64 px), light and dark backgrounds,
  left / centred / right alignment, a title-and-bullets, a two-column and a chart layout.
  Bullet markers and the chart are shapes, not text, so OCR truth is the text lines only.
- Within a slide the picture is exactly static, except on slides with a ``pointer`` path:
  there a small mouse-pointer arrow moves (and rests) in empty space, never over text.
  A change detector should not re-read the slide because of it.
- Each sentence is synthesised with espeak-ng (several voices and speeds), resampled to
  48 kHz with PyAV, trimmed of leading/trailing silence with numpy (so the truth times are
  accurate to a few ms), and placed with natural pauses inside its slide's interval.
  Seeded pink noise is mixed in at ``--snr-db`` (default 28 dB) relative to speech RMS.
- Slide boundaries fall on frame boundaries; the audio track has the same length as video.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import tempfile
import time
import wave
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av
import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw, ImageFont

logger = logging.getLogger("make_demo_clip")

WIDTH_PX = 1280
HEIGHT_PX = 720
FPS = 30
AUDIO_RATE_HZ = 48_000
AAC_FRAME_SAMPLES = 1024
FONT_DIR = Path("/usr/share/fonts/truetype")
# Chosen so that decoded frames inside a slide stay (almost always bit-) identical: no
# B-frames and a high I/P quality ratio stop x264 from "refining" a static picture frame after
# frame; scenecut puts an I-frame at each slide change; keyint=600 (20 s, longer than any
# slide) bounds seeks without a periodic I-frame inside a slide, which would re-code it.
# One thread keeps the output bytes identical across machines.
X264_OPTIONS: dict[str, str] = {
    "preset": "medium",
    "tune": "stillimage",
    "threads": "1",
    "x264-params": "keyint=600:scenecut=40:bframes=0:ipratio=2.0",
}

RGB = tuple[int, int, int]
Align = Literal["left", "center", "right"]

# Short names -> font files (Debian packages fonts-dejavu, fonts-liberation, fonts-freefont-ttf).
FONTS: dict[str, str] = {
    "dejavu-sans": "dejavu/DejaVuSans.ttf",
    "dejavu-sans-bold": "dejavu/DejaVuSans-Bold.ttf",
    "dejavu-serif": "dejavu/DejaVuSerif.ttf",
    "dejavu-serif-bold": "dejavu/DejaVuSerif-Bold.ttf",
    "dejavu-mono": "dejavu/DejaVuSansMono.ttf",
    "liberation-sans": "liberation/LiberationSans-Regular.ttf",
    "liberation-sans-bold": "liberation/LiberationSans-Bold.ttf",
    "liberation-serif": "liberation/LiberationSerif-Regular.ttf",
    "liberation-serif-bold": "liberation/LiberationSerif-Bold.ttf",
    "liberation-mono": "liberation/LiberationMono-Regular.ttf",
    "liberation-narrow": "liberation/LiberationSansNarrow-Regular.ttf",
    "free-sans": "freefont/FreeSans.ttf",
    "free-sans-bold": "freefont/FreeSansBold.ttf",
    "free-serif": "freefont/FreeSerif.ttf",
}


class AssetBuildError(RuntimeError):
    """A tool, font or layout problem that stops the clip from being built."""


@dataclass(frozen=True)
class TextBlock:
    """Lines drawn at one anchor; ``x`` is the left edge, centre or right edge per ``align``."""

    lines: tuple[str, ...]
    font: str
    size_px: int
    color: RGB
    x: int
    y: int
    align: Align = "left"
    line_spacing: float = 1.45
    bullet: RGB | None = None  # draw a square marker (a shape, not text) before each line


@dataclass(frozen=True)
class Sentence:
    """One spoken sentence: the words as spoken and the espeak-ng voice settings."""

    text: str
    voice: str = "en-us"
    speed_wpm: int = 160
    pitch: int = 50


@dataclass(frozen=True)
class Slide:
    """One slide: background, text blocks in reading order, optional shapes and pointer."""

    background: RGB
    blocks: tuple[TextBlock, ...]
    sentences: tuple[Sentence, ...]
    chart: tuple[int, int, int, int] | None = None  # bar-chart box (x0, y0, x1, y1)
    accent: RGB = (200, 80, 40)
    rule_y: int | None = None  # a horizontal rule under the title
    pointer: tuple[tuple[int, int], ...] = ()  # waypoints of the moving arrow (empty: none)
    lead_in_s: float = 0.5
    tail_s: float = 0.6
    extra_s: float = 0.0  # silent time added to the slide (nobody speaks)


@dataclass(frozen=True)
class Preset:
    name: str
    slides: tuple[Slide, ...]
    gap_s: tuple[float, ...] = (0.45, 0.6, 0.75, 0.55)  # pauses between sentences, cycled


@dataclass
class Timeline:
    """Placement of slides and sentences on the media clock (frames and seconds)."""

    slide_frames: list[tuple[int, int]] = field(default_factory=list)
    sentences: list[tuple[float, float, str]] = field(default_factory=list)
    n_frames: int = 0


# --------------------------------------------------------------------------------------------
# Content

WHITE: RGB = (255, 255, 255)
INK: RGB = (25, 25, 35)
NAVY: RGB = (18, 32, 64)
CREAM: RGB = (250, 246, 232)


def _demo_preset() -> Preset:
    slides = (
        Slide(  # centred title slide, dark background
            background=NAVY,
            blocks=(
                TextBlock(
                    ("Lecture 3: Streaming inference",),
                    "dejavu-sans-bold",
                    64,
                    WHITE,
                    640,
                    250,
                    "center",
                ),
                TextBlock(
                    ("Building real time pipelines on small devices",),
                    "dejavu-sans",
                    36,
                    (190, 210, 240),
                    640,
                    360,
                    "center",
                ),
                TextBlock(
                    ("Spring term 2025",), "dejavu-sans", 28, (150, 170, 200), 640, 470, "center"
                ),
            ),
            rule_y=335,
            accent=(240, 170, 60),
            sentences=(
                Sentence("Welcome to lecture three on streaming inference.", "en-us", 160),
                Sentence(
                    "Today we will look at real time pipelines for small devices.", "en-us", 160
                ),
            ),
        ),
        Slide(  # title and bullets, light, left aligned; pointer moves in the right margin
            background=WHITE,
            blocks=(
                TextBlock(("Why streaming matters",), "liberation-sans-bold", 56, INK, 90, 70),
                TextBlock(
                    (
                        "Users expect answers during the talk",
                        "Batch jobs wait for the whole file",
                        "Every stage must keep up with the input",
                        "Latency budget 300 ms",
                    ),
                    "liberation-sans",
                    38,
                    (40, 40, 40),
                    130,
                    210,
                    bullet=(30, 90, 200),
                ),
            ),
            rule_y=150,
            accent=(30, 90, 200),
            pointer=((1000, 560), (1120, 470), (1060, 640), (960, 600), (1150, 560)),
            sentences=(
                Sentence("A normal system waits until the recording is over.", "en-gb", 165, 45),
                Sentence(
                    "In a live system, each part must keep up within three hundred milliseconds.",
                    "en-gb",
                    165,
                    45,
                ),
            ),
        ),
        Slide(  # two columns, serif on cream
            background=CREAM,
            blocks=(
                TextBlock(
                    ("Audio path and video path",),
                    "liberation-serif-bold",
                    52,
                    INK,
                    640,
                    60,
                    "center",
                ),
                TextBlock(("Audio",), "liberation-serif-bold", 40, (150, 50, 30), 110, 190),
                TextBlock(
                    ("20 ms windows", "Voice activity detection", "Streaming speech model"),
                    "liberation-serif",
                    34,
                    INK,
                    110,
                    260,
                ),
                TextBlock(("Video",), "liberation-serif-bold", 40, (30, 100, 60), 690, 190),
                TextBlock(
                    ("30 frames per second", "Change detection", "Text recognition"),
                    "liberation-serif",
                    34,
                    INK,
                    690,
                    260,
                ),
            ),
            accent=(150, 120, 80),
            sentences=(
                Sentence(
                    "The microphone sends sound in small blocks, twenty milliseconds at a time.",
                    "en-us+m1",
                    155,
                ),
                Sentence(
                    "The camera gives us thirty frames per second, but slides rarely change.",
                    "en-us+m1",
                    155,
                ),
            ),
        ),
        Slide(  # chart with caption; pointer wanders over the empty area right of the chart
            background=(244, 247, 250),
            blocks=(
                TextBlock(("Where the time goes",), "free-sans-bold", 48, INK, 640, 50, "center"),
                TextBlock(
                    ("Figure 1: Latency per stage in one run",),
                    "free-sans",
                    30,
                    (70, 70, 80),
                    1180,
                    600,
                    "right",
                ),
            ),
            chart=(140, 150, 820, 560),
            accent=(220, 110, 40),
            pointer=((930, 300), (1010, 220), (1100, 380), (980, 470), (1120, 250)),
            sentences=(
                Sentence("The speech model takes the largest part of the time.", "en", 170),
            ),
            extra_s=1.5,
        ),
        Slide(  # dark, right aligned serif
            background=(30, 30, 34),
            blocks=(
                TextBlock(
                    ("Doing less work under load",),
                    "dejavu-serif-bold",
                    50,
                    (250, 220, 120),
                    1190,
                    90,
                    "right",
                ),
                TextBlock(
                    (
                        "Skip frames that did not change",
                        "Lower the resolution when busy",
                        "Keep only the important tokens",
                    ),
                    "dejavu-serif",
                    36,
                    (230, 230, 230),
                    1190,
                    260,
                    "right",
                ),
            ),
            rule_y=175,
            accent=(250, 220, 120),
            sentences=(
                Sentence(
                    "When the system is busy, it should do less work and not fall behind.",
                    "en-us+f3",
                    150,
                    60,
                ),
            ),
        ),
        Slide(  # monospace "numbers" slide
            background=(236, 244, 236),
            blocks=(
                TextBlock(("Measuring the pipeline",), "liberation-sans-bold", 46, INK, 90, 80),
                TextBlock(
                    ("frames in 1800", "frames read 42", "mean delay 180 ms", "peak memory 512 MB"),
                    "dejavu-mono",
                    32,
                    (20, 70, 30),
                    130,
                    220,
                    line_spacing=1.6,
                ),
            ),
            rule_y=150,
            accent=(40, 120, 60),
            sentences=(
                Sentence("We measure every stage to see where the delay comes from.", "en-us", 165),
            ),
        ),
        Slide(  # centred summary, large narrow sans
            background=(225, 236, 250),
            blocks=(
                TextBlock(("Summary",), "free-serif", 64, NAVY, 640, 110, "center"),
                TextBlock(
                    ("Stream, do not batch", "Measure every stage", "Degrade gracefully"),
                    "liberation-narrow",
                    44,
                    (40, 50, 90),
                    640,
                    270,
                    "center",
                ),
            ),
            accent=NAVY,
            sentences=(
                Sentence("To sum up, stream the data and measure every stage.", "en-gb", 160, 45),
                Sentence("Thank you for listening.", "en-gb", 160, 45),
            ),
        ),
    )
    return Preset("lecture", slides)


def _short_preset() -> Preset:
    slides = (
        Slide(
            background=NAVY,
            blocks=(
                TextBlock(("Short test clip",), "dejavu-sans-bold", 60, WHITE, 640, 270, "center"),
                TextBlock(
                    ("Slides and speech on one timeline",),
                    "dejavu-sans",
                    34,
                    (190, 210, 240),
                    640,
                    380,
                    "center",
                ),
            ),
            accent=(240, 170, 60),
            lead_in_s=0.5,
            tail_s=0.5,
            sentences=(
                Sentence("This short test covers the slides and the spoken words.", "en-us", 160),
            ),
        ),
        Slide(
            background=WHITE,
            blocks=(
                TextBlock(("Two things to check",), "liberation-sans-bold", 52, INK, 90, 80),
                TextBlock(
                    ("Text on each slide", "Words in the audio"),
                    "liberation-sans",
                    40,
                    (40, 40, 40),
                    130,
                    230,
                    bullet=(30, 90, 200),
                ),
            ),
            rule_y=155,
            accent=(30, 90, 200),
            pointer=((900, 520), (1100, 420), (1000, 620), (1150, 560)),
            lead_in_s=0.5,
            tail_s=0.5,
            sentences=(
                Sentence("The engine should read the text on each slide.", "en-gb", 165, 45),
            ),
        ),
        Slide(
            background=CREAM,
            blocks=(
                TextBlock(("The end",), "liberation-serif-bold", 56, INK, 1180, 260, "right"),
                TextBlock(
                    ("Thanks for watching",),
                    "liberation-serif",
                    34,
                    (90, 60, 40),
                    1180,
                    360,
                    "right",
                ),
            ),
            accent=(150, 120, 80),
            lead_in_s=0.5,
            tail_s=0.6,
            sentences=(
                Sentence(
                    "It should also write down every word that is spoken.", "en-us+f2", 150, 60
                ),
            ),
        ),
    )
    return Preset("short", slides)


PRESETS = {"demo": _demo_preset, "short": _short_preset}

# --------------------------------------------------------------------------------------------
# Slides


def _font(name: str, size_px: int) -> ImageFont.FreeTypeFont:
    path = FONT_DIR / FONTS[name]
    if not path.is_file():
        raise AssetBuildError(
            f"font {name!r} not found at {path}; install fonts-dejavu fonts-liberation "
            "fonts-freefont-ttf"
        )
    return ImageFont.truetype(str(path), size_px)


def _draw_block(draw: ImageDraw.ImageDraw, block: TextBlock) -> None:
    font = _font(block.font, block.size_px)
    step_px = round(block.size_px * block.line_spacing)
    for i, line in enumerate(block.lines):
        y = block.y + i * step_px
        x0, _, x1, _ = draw.textbbox((0, 0), line, font=font)
        width = x1 - x0
        x = {"left": block.x, "center": block.x - width // 2, "right": block.x - width}[block.align]
        if x < 20 or x + width > WIDTH_PX - 20 or y + step_px > HEIGHT_PX:
            raise AssetBuildError(f"text {line!r} does not fit on the slide (x={x}, y={y})")
        draw.text((x, y), line, font=font, fill=block.color)
        if block.bullet is not None:
            side = max(8, block.size_px // 4)
            cy = y + block.size_px // 2 + 2
            bx = x - side - 18
            draw.rectangle((bx, cy - side // 2, bx + side, cy + side // 2), fill=block.bullet)


def _draw_chart(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], color: RGB) -> None:
    x0, y0, x1, y1 = box
    draw.line((x0, y1, x1, y1), fill=(60, 60, 60), width=3)
    draw.line((x0, y0, x0, y1), fill=(60, 60, 60), width=3)
    shares = (0.35, 0.55, 0.95, 0.4, 0.2)  # decode, vision, speech, fusion, output
    slot = (x1 - x0 - 40) / len(shares)
    for i, share in enumerate(shares):
        left = x0 + 30 + i * slot
        shade = color if i != 2 else (190, 50, 40)
        draw.rectangle((left, y1 - share * (y1 - y0 - 20), left + slot * 0.6, y1 - 2), fill=shade)
    # a small pie-like marker next to the bars, again a shape only
    draw.ellipse((x1 - 90, y0 + 10, x1 - 20, y0 + 80), outline=(60, 60, 60), width=3)
    draw.pieslice((x1 - 90, y0 + 10, x1 - 20, y0 + 80), -90, 40, fill=(190, 50, 40))


def render_slide(slide: Slide) -> Image.Image:
    """Draw the static picture of a slide (without the pointer)."""
    img = Image.new("RGB", (WIDTH_PX, HEIGHT_PX), slide.background)
    draw = ImageDraw.Draw(img)
    if slide.rule_y is not None:
        draw.rectangle((90, slide.rule_y, WIDTH_PX - 90, slide.rule_y + 4), fill=slide.accent)
    if slide.chart is not None:
        _draw_chart(draw, slide.chart, slide.accent)
    for block in slide.blocks:
        _draw_block(draw, block)
    return img


_ARROW = ((0, 0), (0, 30), (8, 23), (14, 36), (19, 34), (13, 21), (23, 21))


def _draw_pointer(img: Image.Image, x: int, y: int) -> None:
    draw = ImageDraw.Draw(img)
    draw.polygon(
        [(x + px, y + py) for px, py in _ARROW], fill=(10, 10, 10), outline=(255, 255, 255), width=2
    )


def pointer_position(waypoints: Sequence[tuple[int, int]], t_s: float) -> tuple[int, int]:
    """Where the arrow is ``t_s`` seconds into its slide: 1.2 s moves alternate with 0.8 s rests."""
    move_s, rest_s = 1.2, 0.8
    leg = int(t_s // (move_s + rest_s))
    phase = min(1.0, (t_s - leg * (move_s + rest_s)) / move_s)
    phase = 0.5 - 0.5 * np.cos(np.pi * phase)  # ease in and out
    a = waypoints[leg % len(waypoints)]
    b = waypoints[(leg + 1) % len(waypoints)]
    return round(a[0] + (b[0] - a[0]) * phase), round(a[1] + (b[1] - a[1]) * phase)


def _check_pointer_clear(slide: Slide, base: Image.Image) -> None:
    """The pointer path must stay on background pixels so it never hides or touches text."""
    if not slide.pointer:
        return
    arr = np.asarray(base)
    bg = np.array(slide.background)
    xs = [p[0] for p in slide.pointer]
    ys = [p[1] for p in slide.pointer]
    region = arr[min(ys) - 4 : max(ys) + 44, min(xs) - 4 : max(xs) + 30]
    if np.any(np.abs(region.astype(int) - bg).sum(axis=-1) > 0):
        raise AssetBuildError("pointer path overlaps drawn content")


# --------------------------------------------------------------------------------------------
# Speech


def synthesize(sentence: Sentence, workdir: Path, index: int) -> NDArray[np.float32]:
    """espeak-ng -> 48 kHz float32 mono, leading/trailing silence trimmed."""
    wav_path = workdir / f"s{index:02d}.wav"
    cmd = [
        "espeak-ng",
        "-v",
        sentence.voice,
        "-s",
        str(sentence.speed_wpm),
        "-p",
        str(sentence.pitch),
        "-w",
        str(wav_path),
        sentence.text,
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise AssetBuildError(f"espeak-ng failed for {sentence.text!r}: {e}") from e
    with wave.open(str(wav_path), "rb") as w:
        rate_hz = w.getframerate()
        if w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise AssetBuildError(f"unexpected espeak-ng output format in {wav_path}")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
    frame.sample_rate = rate_hz
    resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_RATE_HZ)
    chunks = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    audio = np.concatenate(chunks).astype(np.float32)
    return trim_silence(audio)


def trim_silence(audio: NDArray[np.float32], rel_threshold: float = 0.01) -> NDArray[np.float32]:
    """Cut samples before the first and after the last one above ``rel_threshold`` x peak."""
    loud = np.flatnonzero(np.abs(audio) > rel_threshold * float(np.abs(audio).max()))
    if loud.size == 0:
        raise AssetBuildError("synthesised sentence is silent")
    return audio[loud[0] : loud[-1] + 1]


def pink_noise(n: int, rng: np.random.Generator) -> NDArray[np.float32]:
    """Unit-RMS pink (1/f power) noise, shaped in the frequency domain."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, d=1.0 / AUDIO_RATE_HZ)
    spectrum /= np.sqrt(np.maximum(freqs, 20.0))
    noise = np.fft.irfft(spectrum, n)
    unit: NDArray[np.float32] = (noise / np.sqrt(np.mean(noise**2))).astype(np.float32)
    return unit


# --------------------------------------------------------------------------------------------
# Assembly


def build_timeline(
    preset: Preset, clips: list[list[NDArray[np.float32]]]
) -> tuple[Timeline, NDArray[np.float32]]:
    """Place slides on frame boundaries and sentences inside them; return the speech track."""
    timeline = Timeline()
    placed: list[tuple[int, NDArray[np.float32]]] = []
    start_frame = 0
    gap_index = 0
    for slide, slide_clips in zip(preset.slides, clips, strict=True):
        t = start_frame / FPS + slide.lead_in_s
        for i, (sentence, clip) in enumerate(zip(slide.sentences, slide_clips, strict=True)):
            if i > 0:
                t += preset.gap_s[gap_index % len(preset.gap_s)]
                gap_index += 1
            first = round(t * AUDIO_RATE_HZ)
            placed.append((first, clip))
            t_start = first / AUDIO_RATE_HZ
            t_end = (first + len(clip)) / AUDIO_RATE_HZ
            timeline.sentences.append((t_start, t_end, sentence.text))
            t = t_end
        end_frame = int(np.ceil((t + slide.tail_s + slide.extra_s) * FPS))
        timeline.slide_frames.append((start_frame, end_frame))
        start_frame = end_frame
    timeline.n_frames = start_frame
    speech = np.zeros(round(timeline.n_frames / FPS * AUDIO_RATE_HZ), dtype=np.float32)
    for first, clip in placed:
        speech[first : first + len(clip)] += clip
    return timeline, speech


def mix_noise(speech: NDArray[np.float32], snr_db: float, seed: int) -> NDArray[np.float32]:
    """Scale speech to a sane level and add pink noise at ``snr_db`` below speech RMS."""
    active = np.abs(speech) > 1e-4
    speech_rms = float(np.sqrt(np.mean(speech[active] ** 2)))
    speech = speech * (0.12 / speech_rms)  # about -18 dBFS RMS while speaking
    noise = pink_noise(len(speech), np.random.default_rng(seed)) * 0.12 / 10 ** (snr_db / 20)
    mixed = speech + noise
    peak = float(np.abs(mixed).max())
    if peak > 0.95:
        mixed *= 0.95 / peak
    return mixed.astype(np.float32)


def encode(
    path: Path, preset: Preset, timeline: Timeline, audio: NDArray[np.float32], crf: int
) -> None:
    """Mux the slide frames (H.264) and the mixed audio (AAC) into ``path``."""
    bases = [render_slide(s) for s in preset.slides]
    for slide, base in zip(preset.slides, bases, strict=True):
        _check_pointer_clear(slide, base)
    with av.open(str(path), mode="w", options={"movflags": "+faststart"}) as container:
        vstream = container.add_stream("libx264", rate=FPS)
        vstream.width = WIDTH_PX
        vstream.height = HEIGHT_PX
        vstream.pix_fmt = "yuv420p"
        vstream.codec_context.time_base = Fraction(1, FPS)
        vstream.options = {"crf": str(crf), **X264_OPTIONS}
        astream = container.add_stream("aac", rate=AUDIO_RATE_HZ, layout="mono")
        astream.bit_rate = 64_000

        # Packets are collected and muxed in time order at the end: muxed stream after
        # stream, the file stores the audio ~40 s behind the video of the same moment, which
        # a reader that cannot seek (plain HTTP, a pipe) receives that late.
        packets: list[av.Packet] = []
        for (first, last), slide, base in zip(
            timeline.slide_frames, preset.slides, bases, strict=True
        ):
            static = av.VideoFrame.from_image(base).reformat(format="yuv420p")
            for index in range(first, last):
                if slide.pointer:
                    img = base.copy()
                    _draw_pointer(img, *pointer_position(slide.pointer, (index - first) / FPS))
                    frame = av.VideoFrame.from_image(img).reformat(format="yuv420p")
                else:
                    frame = static
                frame.pts = index
                frame.time_base = Fraction(1, FPS)
                packets += vstream.encode(frame)
        packets += vstream.encode(None)

        for offset in range(0, len(audio), AAC_FRAME_SAMPLES):
            chunk = audio[offset : offset + AAC_FRAME_SAMPLES]
            aframe = av.AudioFrame.from_ndarray(chunk[None, :], format="fltp", layout="mono")
            aframe.sample_rate = AUDIO_RATE_HZ
            aframe.pts = offset
            aframe.time_base = Fraction(1, AUDIO_RATE_HZ)
            packets += astream.encode(aframe)
        packets += astream.encode(None)
        mux_in_time_order(container, packets)


def _packet_time_s(packet: av.Packet) -> float:
    stamp = packet.dts if packet.dts is not None else packet.pts
    assert stamp is not None and packet.time_base is not None
    return float(stamp * packet.time_base)


def mux_in_time_order(container: av.container.OutputContainer, packets: list[av.Packet]) -> None:
    """Mux `packets` (of several streams, each in decoding order) time-interleaved: sorted by
    decoding time, a stable sort, so each stream keeps its order."""
    for packet in sorted(packets, key=_packet_time_s):
        container.mux(packet)


def reinterleave(path: Path) -> None:
    """Rewrite an existing clip time-interleaved, packets unchanged (its truth stays valid)."""
    tmp = path.with_suffix(".interleaved.mp4")
    with av.open(str(path)) as inp:
        packets = [p for p in inp.demux() if p.dts is not None]
        with av.open(str(tmp), "w", options={"movflags": "+faststart"}) as out:
            mapping = {s.index: out.add_stream_from_template(s) for s in inp.streams}
            for packet in packets:
                packet.stream = mapping[packet.stream.index]
            mux_in_time_order(out, packets)
    tmp.replace(path)


def truth_document(preset: Preset, timeline: Timeline) -> dict[str, object]:
    """The ground truth in the contract schema (times rounded to milliseconds)."""
    ocr = [
        {
            "t_start": round(first / FPS, 3),
            "t_end": round(last / FPS, 3),
            "lines": [line for block in slide.blocks for line in block.lines],
        }
        for (first, last), slide in zip(timeline.slide_frames, preset.slides, strict=True)
    ]
    asr = [
        {"t_start": round(s, 3), "t_end": round(e, 3), "text": text}
        for s, e, text in timeline.sentences
    ]
    return {"duration_s": round(timeline.n_frames / FPS, 3), "ocr": ocr, "asr": asr}


def build(
    preset: Preset,
    out_dir: Path,
    name: str,
    seed: int,
    snr_db: float,
    crf: int,
    slides_dir: Path | None,
) -> tuple[Path, Path]:
    if shutil.which("espeak-ng") is None:
        raise AssetBuildError("espeak-ng is not on PATH; apt-get install -y espeak-ng")
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sf_demo_") as tmp:
        clips: list[list[NDArray[np.float32]]] = []
        index = 0
        for slide in preset.slides:
            clips.append([])
            for sentence in slide.sentences:
                clips[-1].append(synthesize(sentence, Path(tmp), index))
                index += 1
    timeline, speech = build_timeline(preset, clips)
    audio = mix_noise(speech, snr_db, seed)
    if slides_dir is not None:
        slides_dir.mkdir(parents=True, exist_ok=True)
        for i, slide in enumerate(preset.slides):
            render_slide(slide).save(slides_dir / f"{name}_slide{i + 1}.png")
    video_path = out_dir / f"{name}.mp4"
    truth_path = out_dir / f"{name}.truth.json"
    encode(video_path, preset, timeline, audio, crf)
    truth = truth_document(preset, timeline)
    truth_path.write_text(json.dumps(truth, indent=2) + "\n")
    return video_path, truth_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="demo")
    parser.add_argument(
        "--out", type=Path, default=Path("src/streamfuse/assets/demo"), help="output folder"
    )
    parser.add_argument("--name", help="file stem (default: lecture for demo, short for short)")
    parser.add_argument("--seed", type=int, default=3, help="noise seed")
    parser.add_argument("--snr-db", type=float, default=28.0, help="speech-to-noise ratio")
    parser.add_argument("--crf", type=int, default=23, help="x264 constant rate factor")
    parser.add_argument("--slides-dir", type=Path, help="also save each slide as PNG here")
    parser.add_argument(
        "--reinterleave",
        action="store_true",
        help="only rewrite the existing <out>/<name>.mp4 time-interleaved (no synthesis; the "
        "packets and the truth file are unchanged)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    preset = PRESETS[args.preset]()
    name = args.name or preset.name
    if args.reinterleave:
        reinterleave(args.out / f"{name}.mp4")
        logger.info("rewrote %s time-interleaved", args.out / f"{name}.mp4")
        return 0
    t0 = time.perf_counter()
    video_path, truth_path = build(
        preset, args.out, name, args.seed, args.snr_db, args.crf, args.slides_dir
    )
    truth = json.loads(truth_path.read_text())
    logger.info(
        "wrote %s (%.1f KiB, %.3f s, %d slides, %d sentences) and %s in %.1f s",
        video_path,
        video_path.stat().st_size / 1024,
        truth["duration_s"],
        len(truth["ocr"]),
        len(truth["asr"]),
        truth_path,
        time.perf_counter() - t0,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
