"""Make the awkward inputs a media pipeline must survive, from one good file (PyAV remux)."""

from __future__ import annotations

from pathlib import Path

import av


def remux(src: str | Path, dst: str | Path, *, video: bool = True, audio: bool = True) -> Path:
    """Copy `src` to `dst` keeping only the chosen streams (no re-encode)."""
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        mapping = {}
        for s in inp.streams:
            if (s.type == "video" and video) or (s.type == "audio" and audio):
                mapping[s.index] = out.add_stream_from_template(s)
        for packet in inp.demux(*(inp.streams[i] for i in mapping)):
            if packet.dts is None:
                continue
            packet.stream = mapping[packet.stream.index]
            out.mux(packet)
    return Path(dst)


def truncate(src: str | Path, dst: str | Path, fraction: float) -> Path:
    """Write the first `fraction` of `src`'s bytes to `dst` (a download cut short)."""
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: int(len(data) * fraction)])
    return Path(dst)


def faststart(src: str | Path, dst: str | Path) -> Path:
    """Remux with the index at the front, as streamed files are, so a cut copy still opens."""
    with (
        av.open(str(src)) as inp,
        av.open(str(dst), "w", format="mp4", options={"movflags": "faststart"}) as out,
    ):
        mapping = {s.index: out.add_stream_from_template(s) for s in inp.streams}
        for packet in inp.demux():
            if packet.dts is None:
                continue
            packet.stream = mapping[packet.stream.index]
            out.mux(packet)
    return Path(dst)


def encode_webm(
    src: str | Path,
    dst: str | Path,
    *,
    video_bitrate: int = 6_000_000,
    fps: float | None = None,
    max_s: float | None = None,
) -> Path:
    """Re-encode `src` as a browser's MediaRecorder records it: WebM, VP8 video, Opus audio,
    streams interleaved in time order (`fps`: capture at this rate, as a camera asked for a
    lower rate does; `max_s`: only the first seconds)."""
    with av.open(str(src)) as inp, av.open(str(dst), "w", format="webm") as out:
        vin, ain = inp.streams.video[0], inp.streams.audio[0]
        vout = out.add_stream("libvpx", rate=round(fps or vin.average_rate or 30))
        next_video_t = 0.0
        vout.width, vout.height = vin.codec_context.width, vin.codec_context.height
        vout.pix_fmt, vout.bit_rate = "yuv420p", video_bitrate
        aout = out.add_stream("libopus", rate=48_000)
        for frame in inp.decode(vin, ain):
            if not isinstance(frame, av.VideoFrame | av.AudioFrame):
                continue
            if max_s is not None and frame.time is not None and frame.time >= max_s:
                continue
            if isinstance(frame, av.VideoFrame):
                if fps is not None and (frame.time or 0.0) < next_video_t - 1e-6:
                    continue
                next_video_t += 1.0 / fps if fps else 0.0
                out.mux(vout.encode(frame))
            elif isinstance(frame, av.AudioFrame):
                out.mux(aout.encode(frame))
        out.mux(vout.encode())
        out.mux(aout.encode())
    return Path(dst)
