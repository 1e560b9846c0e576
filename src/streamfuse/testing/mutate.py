"""Damaged and awkward media made from good clips, for the corrupted-media suite.

`make_suite(clips, out_dir, n)` writes `n` files cycling through the families below (each
deterministic for its seed) and returns one `Mutation` per file. Byte-level families damage a
copy of a clip (bit flips, truncation, wrong headers, zero length, patched frame size); encoded
ones are written with PyAV from a clip's decoded media (huge frames, odd sample rates, variable
frame rate, a resolution or sample-rate change mid-stream, audio-only, video-only). A file
made so must end in a result, a partial result or a clear error: never a crash or a hang.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from streamfuse.testing.media import cut, faststart, remux


@dataclass(frozen=True)
class Mutation:
    """One file of the suite: its family (`kind`), a name saying how it was made, the path."""

    kind: str
    name: str
    path: Path


# -- byte-level damage ----------------------------------------------------------------------


def bit_flips(src: str | Path, dst: str | Path, n_bits: int, *, seed: int, skip: int = 0) -> Path:
    """Copy `src` with `n_bits` random bits flipped (after the first `skip` bytes)."""
    data = bytearray(Path(src).read_bytes())
    rng = random.Random(seed)
    for _ in range(n_bits):
        i = rng.randrange(min(skip, len(data) - 1), len(data))
        data[i] ^= 1 << rng.randrange(8)
    Path(dst).write_bytes(bytes(data))
    return Path(dst)


def truncated(src: str | Path, dst: str | Path, fraction: float) -> Path:
    """The first `fraction` of `src`'s bytes."""
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: int(len(data) * fraction)])
    return Path(dst)


def wrong_header(src: str | Path, dst: str | Path, how: str, *, seed: int = 0) -> Path:
    """`src` with a damaged start: `garbage` (first 64 bytes random), `magic` (the MP4 `ftyp`
    box renamed), `prefix` (4 KiB of noise before the real file), `swap` (the halves of the
    file exchanged), `codec` (the video sample entry `avc1` renamed: a stream FFmpeg finds
    but has no decoder for)."""
    data = bytearray(Path(src).read_bytes())
    rng = random.Random(seed)
    if how == "garbage":
        data[:64] = bytes(rng.randrange(256) for _ in range(64))
    elif how == "magic":
        data = bytearray(bytes(data).replace(b"ftyp", b"xxxx", 1))
    elif how == "prefix":
        data = bytearray(bytes(rng.randrange(256) for _ in range(4096))) + data
    elif how == "swap":
        half = len(data) // 2
        data = data[half:] + data[:half]
    elif how == "codec":
        data = bytearray(bytes(data).replace(b"avc1", b"xxxx"))
    else:
        raise ValueError(f"unknown header damage {how!r} (garbage, magic, prefix, swap, codec)")
    Path(dst).write_bytes(bytes(data))
    return Path(dst)


def empty(dst: str | Path) -> Path:
    Path(dst).write_bytes(b"")
    return Path(dst)


def patched_size(src: str | Path, dst: str | Path, width: int, height: int) -> Path:
    """An MP4 whose track header and sample entry claim a `width` x `height` picture (the
    coded stream is unchanged: container and codec disagree)."""
    data = bytearray(Path(src).read_bytes())
    i = data.find(b"tkhd")
    if i >= 0:
        version = data[i + 4]
        # tkhd: size(4) 'tkhd' version/flags(4) ... width and height are the last 8 bytes.
        size = struct.unpack(">I", data[i - 4 : i])[0]
        end = i - 4 + size
        data[end - 8 : end] = struct.pack(">II", width << 16, height << 16)
        del version
    j = data.find(b"avc1")
    if j >= 0:
        # Visual sample entry: 'avc1' + 6 reserved + 2 index + 16 predefined, then w, h.
        k = j + 4 + 6 + 2 + 16
        data[k : k + 4] = struct.pack(">HH", min(width, 0xFFFF), min(height, 0xFFFF))
    Path(dst).write_bytes(bytes(data))
    return Path(dst)


# -- encoded variants -----------------------------------------------------------------------


def _decoded(src: str | Path) -> tuple[list[av.VideoFrame], list[np.ndarray], float]:
    """(video frames, mono float32 audio chunks at `rate`, video fps) of `src`."""
    video: list[av.VideoFrame] = []
    audio: list[np.ndarray] = []
    fps = 30.0
    with av.open(str(src)) as inp:
        if inp.streams.video:
            rate = inp.streams.video[0].average_rate
            fps = float(rate) if rate else 30.0
        resampler = av.AudioResampler(format="flt", layout="mono", rate=48_000)
        for frame in inp.decode(*inp.streams.video[:1], *inp.streams.audio[:1]):
            if isinstance(frame, av.VideoFrame):
                video.append(frame)
            elif isinstance(frame, av.AudioFrame):
                for out in resampler.resample(frame):
                    audio.append(out.to_ndarray().reshape(-1))
    return video, audio, fps


def _audio_stream(out: Any, rate: int, layout: str, codec: str) -> Any:
    # Every stream is added before the first packet is muxed (the header is written then).
    return out.add_stream(codec, rate=rate, layout=layout)


def _write_audio(
    out: Any, stream: Any, samples: np.ndarray, rate: int, layout: str, t0_s: float = 0.0
) -> None:
    """Encode `samples` (mono float32 at 48 kHz) into `stream` of `out` at `rate`, starting at
    media time `t0_s`."""
    resampler = av.AudioResampler(format=stream.codec_context.format, layout=layout, rate=rate)
    src = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="flt", layout="mono")
    src.sample_rate = 48_000
    src.pts = 0
    n = round(t0_s * rate)
    for frame in [*resampler.resample(src), *resampler.resample(None)]:
        frame.pts, frame.time_base = n, Fraction(1, rate)
        n += frame.samples
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)


def odd_rate(src: str | Path, dst: str | Path, rate: int, *, layout: str = "mono") -> Path:
    """`src`'s sound alone at `rate` Hz (PCM in WAV or Matroska: any rate, even odd ones)."""
    _, audio, _ = _decoded(src)
    samples = np.concatenate(audio) if audio else np.zeros(48_000, np.float32)
    fmt = "wav" if str(dst).endswith(".wav") else "matroska"
    with av.open(str(dst), "w", format=fmt) as out:
        stream = _audio_stream(out, rate, layout, "pcm_s16le")
        _write_audio(out, stream, samples, rate, layout)
    return Path(dst)


def _video_stream(out: Any, size: tuple[int, int], codec: str = "libx264") -> Any:
    stream = out.add_stream(codec, rate=30)
    stream.width, stream.height = size
    stream.pix_fmt = "yuv420p"
    stream.codec_context.time_base = Fraction(1, 1000)
    stream.time_base = Fraction(1, 1000)
    if codec == "libx264":
        stream.options = {"preset": "ultrafast"}
    return stream


def _encode_video(
    out: Any,
    stream: Any,
    frames: Sequence[av.VideoFrame],
    size: tuple[int, int],
    times_s: Sequence[float],
) -> None:
    for frame, t in zip(frames, times_s, strict=True):
        img = frame.reformat(width=size[0], height=size[1], format="yuv420p")
        img.pts = round(t * 1000)
        img.time_base = Fraction(1, 1000)
        for packet in stream.encode(img):
            out.mux(packet)
    for packet in stream.encode(None):
        out.mux(packet)


def variable_rate(src: str | Path, dst: str | Path, *, seed: int) -> Path:
    """`src` re-encoded with irregular frame times (frames dropped, intervals 5..300 ms)."""
    video, audio, fps = _decoded(src)
    rng = random.Random(seed)
    kept, times, t = [], [], 0.0
    for frame in video:
        if rng.random() < 0.3:
            continue
        kept.append(frame)
        times.append(t)
        t += rng.uniform(0.005, 0.3)
    w, h = video[0].width, video[0].height
    with av.open(str(dst), "w", format="matroska") as out:
        vs = _video_stream(out, (w, h))
        aus = _audio_stream(out, 48_000, "stereo", "aac") if audio else None
        _encode_video(out, vs, kept, (w, h), times)
        if aus is not None:
            _write_audio(out, aus, np.concatenate(audio), 48_000, "stereo")
    return Path(dst)


def huge_frames(src: str | Path, dst: str | Path, size: tuple[int, int], n: int = 4) -> Path:
    """A few of `src`'s pictures scaled to `size` (e.g. 8K), one per second, with sound."""
    video, audio, _ = _decoded(src)
    step = max(1, len(video) // n)
    frames = video[::step][:n]
    with av.open(str(dst), "w", format="matroska") as out:
        vs = _video_stream(out, size)
        aus = _audio_stream(out, 48_000, "mono", "aac") if audio else None
        _encode_video(out, vs, frames, size, [float(i) for i in range(len(frames))])
        if aus is not None:
            samples = np.concatenate(audio)[: 48_000 * len(frames)]
            _write_audio(out, aus, samples, 48_000, "mono")
    return Path(dst)


def switching(
    src: str | Path,
    dst: str | Path,
    *,
    sizes: tuple[tuple[int, int], tuple[int, int]] | None = None,
    rates: tuple[int, int] = (48_000, 48_000),
) -> Path:
    """`src` as MPEG-TS whose second half has another picture size and/or sample rate (two
    encodes concatenated, as a feed that switches settings mid-stream)."""
    video, audio, fps = _decoded(src)
    samples = np.concatenate(audio) if audio else np.zeros(0, np.float32)
    half_v, half_a = len(video) // 2, len(samples) // 2
    w, h = video[0].width, video[0].height
    sizes = sizes or ((w, h), (w, h))
    parts = []
    for k, (frames, chunk, t0) in enumerate(
        [
            (video[:half_v], samples[:half_a], 0.0),
            (video[half_v:], samples[half_a:], half_a / 48_000),
        ]
    ):
        part = Path(f"{dst}.part{k}.ts")
        with av.open(str(part), "w", format="mpegts") as out:
            times = [t0 + i / fps for i in range(len(frames))]
            vs = _video_stream(out, sizes[k])
            aus = _audio_stream(out, rates[k], "stereo", "aac") if len(chunk) else None
            _encode_video(out, vs, frames, sizes[k], times)
            if aus is not None:
                _write_audio(out, aus, chunk, rates[k], "stereo", t0)
        parts.append(part)
    Path(dst).write_bytes(b"".join(p.read_bytes() for p in parts))
    for part in parts:
        part.unlink()
    return Path(dst)


def image_only(src: str | Path, dst: str | Path) -> Path:
    """A still picture (PNG) of `src`'s first frame: a valid file, but one frame, no sound."""
    video, _, _ = _decoded(src)
    video[0].to_image().save(str(dst))
    return Path(dst)


# -- the suite ------------------------------------------------------------------------------

#: A family: (kind, how to make file number `i` of it from clip `src` at `dst`).
Maker = Callable[[Path, Path, int], tuple[str, Path]]


def _families() -> list[tuple[str, str, Maker]]:
    """(kind, file suffix, maker) per family; a maker returns (name, path)."""

    def flips(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        n_bits = (1, 10, 100, 1000, 10000)[i % 5]
        skip = 0 if i % 2 else 2048  # keep or hit the header
        return f"bitflip-{n_bits}-skip{skip}-s{i}", bit_flips(src, dst, n_bits, seed=i, skip=skip)

    def cuts(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        fraction = ((i * 37) % 95 + 3) / 100
        if i % 2:
            front = faststart(src, dst.with_suffix(".fs.mp4"))
            made = truncated(front, dst, fraction)
            front.unlink()
            return f"truncate-faststart-{fraction:.2f}", made
        return f"truncate-{fraction:.2f}", truncated(src, dst, fraction)

    def headers(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        how = ("garbage", "magic", "prefix", "swap", "codec")[i % 5]
        return f"header-{how}-s{i}", wrong_header(src, dst, how, seed=i)

    def zero(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        if i % 3 == 0:
            return "empty", empty(dst)
        size = (16, 700)[i % 3 - 1]  # a few bytes: part of the first box, or its header only
        return f"first-{size}-bytes", truncated(src, dst, size / max(1, src.stat().st_size))

    def huge(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        if i % 2:
            w, h = ((65535, 65535), (16384, 16384), (1, 1))[i // 2 % 3]
            return f"claims-{w}x{h}", patched_size(src, dst, w, h)
        w, h = ((7680, 4320), (4096, 64), (64, 4096), (16, 16))[i // 2 % 4]
        return f"frames-{w}x{h}", huge_frames(src, dst.with_suffix(".mkv"), (w, h))

    def rates(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        rate = (8_000, 11_025, 12_345, 22_050, 44_100, 96_000, 192_000, 4_000, 1_000)[i % 9]
        layout = ("mono", "stereo", "5.1")[i % 3]
        suffix = ".wav" if i % 2 else ".mkv"
        return f"rate-{rate}-{layout}", odd_rate(src, dst.with_suffix(suffix), rate, layout=layout)

    def vfr(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        return f"vfr-s{i}", variable_rate(src, dst.with_suffix(".mkv"), seed=i)

    def switch(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        out = dst.with_suffix(".ts")
        if i % 2:
            return "switch-rate", switching(src, out, rates=(48_000, (16_000, 22_050)[i // 2 % 2]))
        size = ((640, 360), (320, 240), (1920, 1080))[i // 2 % 3]
        return f"switch-size-{size[0]}x{size[1]}", switching(src, out, sizes=(size, (352, 288)))

    def single(src: Path, dst: Path, i: int) -> tuple[str, Path]:
        if i % 3 == 2:
            return "image-only", image_only(src, dst.with_suffix(".png"))
        audio = i % 3 == 0
        made = remux(src, dst, video=not audio, audio=audio)
        return ("audio-only" if audio else "video-only"), made

    return [
        ("bitflip", ".mp4", flips),
        ("truncate", ".mp4", cuts),
        ("header", ".mp4", headers),
        ("empty", ".mp4", zero),
        ("huge", ".mp4", huge),
        ("rate", ".wav", rates),
        ("vfr", ".mkv", vfr),
        ("switch", ".ts", switch),
        ("single", ".mp4", single),
        # The cheapest family, and the commonest damage: twice, with other seeds.
        ("bitflip", ".mp4", lambda src, dst, i: flips(src, dst, i + 5000)),
    ]


def looped(src: str | Path, dst: str | Path, times: int) -> Path:
    """`src` played `times` times in a row, one file (stream copy, timestamps shifted): a
    long input made from a short clip, for soak runs."""
    with av.open(str(src)) as probe:
        # Plus a little: an audio encoder's priming packet starts before 0.
        span = 0.1 + max(
            float((s.duration or 0) * s.time_base) for s in probe.streams if s.time_base
        )
    with av.open(str(dst), "w") as out:
        mapping: dict[int, Any] = {}
        for k in range(times):
            with av.open(str(src)) as inp:
                if not mapping:
                    mapping = {s.index: out.add_stream_from_template(s) for s in inp.streams}
                for packet in inp.demux():
                    if packet.dts is None:
                        continue
                    assert packet.time_base is not None
                    shift = round(k * span / packet.time_base)
                    packet.dts += shift
                    if packet.pts is not None:
                        packet.pts += shift
                    packet.stream = mapping[packet.stream.index]
                    out.mux(packet)
    return Path(dst)


def base_clips(sources: Sequence[str | Path], out_dir: str | Path, seconds: float) -> list[Path]:
    """The first `seconds` of each source (stream copy), the material mutations start from."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [cut(src, out / f"base{k}.mp4", seconds) for k, src in enumerate(sources)]


def iter_suite(clips: Sequence[Path], out_dir: str | Path, n: int) -> Iterator[Mutation]:
    """Make `n` mutated files in `out_dir` (families in turn, clips in turn), yielding each
    as it is written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    families = _families()
    for i in range(n):
        kind, suffix, make = families[i % len(families)]
        src = clips[(i // len(families)) % len(clips)]
        name, path = make(src, out / f"m{i:04d}{suffix}", i // len(families))
        yield Mutation(kind=kind, name=name, path=path)


def make_suite(clips: Sequence[Path], out_dir: str | Path, n: int) -> list[Mutation]:
    return list(iter_suite(clips, out_dir, n))


__all__ = [
    "Mutation",
    "base_clips",
    "bit_flips",
    "empty",
    "huge_frames",
    "image_only",
    "iter_suite",
    "looped",
    "make_suite",
    "odd_rate",
    "patched_size",
    "switching",
    "truncated",
    "variable_rate",
    "wrong_header",
]
