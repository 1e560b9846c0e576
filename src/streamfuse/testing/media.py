"""Make the awkward inputs a media pipeline must survive, from one good file (PyAV remux)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import av


def remux(src: str | Path, dst: str | Path, *, video: bool = True, audio: bool = True) -> Path:
    """Copy `src` to `dst` keeping only the chosen streams (no re-encode)."""
    return _copy(
        src, dst, keep=lambda s: (s.type == "video" and video) or (s.type == "audio" and audio)
    )


def truncate(src: str | Path, dst: str | Path, fraction: float) -> Path:
    """Write the first `fraction` of `src`'s bytes to `dst` (a download cut short)."""
    data = Path(src).read_bytes()
    Path(dst).write_bytes(data[: int(len(data) * fraction)])
    return Path(dst)


def faststart(src: str | Path, dst: str | Path) -> Path:
    """Remux with the index at the front, as streamed files are, so a cut copy still opens."""
    return _copy(src, dst, format="mp4", options={"movflags": "faststart"})


def interleave(src: str | Path, dst: str | Path, *, options: dict[str, str] | None = None) -> Path:
    """Remux `src` with every stream's packets stored in time order (no re-encode), so a
    reader that cannot seek finds audio and video of the same moment together."""
    fmt = "mp4" if str(dst).endswith(".mp4") else None
    opts = options if options is not None else ({"movflags": "+faststart"} if fmt else {})
    return _copy(src, dst, format=fmt, options=opts, order=lambda p: (_time_s(p), p.stream.index))


def fragmented(src: str | Path, dst: str | Path) -> Path:
    """Remux `src` as fragmented MP4 (a fragment per key frame, index-free header), the
    layout of live fMP4 / CMAF feeds."""
    return interleave(src, dst, options={"movflags": "frag_keyframe+empty_moov+default_base_moof"})


def hls(src: str | Path, out_dir: str | Path, *, segment_s: float = 2.0) -> Path:
    """Write `src` as an HLS VOD playlist and MPEG-TS segments in `out_dir`; returns the
    playlist (`index.m3u8`). Segments are cut at key frames."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = {"hls_time": str(segment_s), "hls_list_size": "0", "hls_playlist_type": "vod"}
    return _copy(src, out_dir / "index.m3u8", format="hls", options=options)


def spread_s(path: str | Path) -> float:
    """How far apart (media seconds) the streams of `path` are stored, read in file order:
    the largest gap between the latest timestamps of two streams along the bytes."""
    with av.open(str(path)) as inp:
        found = [
            (p.pos, p.stream.index, float(p.dts * p.time_base))
            for p in inp.demux()
            if p.dts is not None and p.pos is not None and p.pos >= 0
        ]
    latest: dict[int, float] = {}
    worst = 0.0
    for _, index, t in sorted(found):
        latest[index] = t
        if len(latest) > 1:
            worst = max(worst, max(latest.values()) - min(latest.values()))
    return worst


def apart(src: str | Path, dst: str | Path) -> Path:
    """Remux `src` as MP4 with each stream stored whole, one after the other (no re-encode):
    the worst interleaving, which a reader that cannot seek must survive."""
    # A tiny interleave window makes the muxer write packets in the order given.
    options = {"movflags": "+faststart", "max_interleave_delta": "1"}
    return _copy(
        src, dst, format="mp4", options=options, order=lambda p: (p.stream.index, _time_s(p))
    )


def lagged(src: str | Path, dst: str | Path, video_lag_s: float) -> Path:
    """Remux `src` as MPEG-TS with each video packet stored `video_lag_s` after the audio of
    the same time (no re-encode), as a browser's recorder writes a video encoder that runs
    behind its microphone."""
    options = {"max_interleave_delta": "1"}

    def order(p: av.Packet) -> tuple[float, float]:
        t = _time_s(p)
        return (t + video_lag_s if p.stream.type == "video" else t, t)

    return _copy(src, dst, format="mpegts", options=options, order=order)


def cut(src: str | Path, dst: str | Path, end_s: float) -> Path:
    """The first `end_s` seconds of `src` (packets before it, no re-encode)."""
    return _copy(src, dst, end_s=end_s)


def _copy(
    src: str | Path,
    dst: str | Path,
    *,
    format: str | None = None,
    options: dict[str, str] | None = None,
    keep: Callable[[Any], bool] | None = None,
    order: Callable[[av.Packet], tuple[float, float]] | None = None,
    end_s: float | None = None,
) -> Path:
    """Stream-copy `src` to `dst` (no re-encode): the streams `keep` accepts, the packets
    before `end_s`, in demux order or sorted by `order`."""
    with (
        av.open(str(src)) as inp,
        av.open(str(dst), "w", format=format, options=options or {}) as out,
    ):
        streams = [s for s in inp.streams if keep is None or keep(s)]
        mapping = {s.index: out.add_stream_from_template(s) for s in streams}
        packets: Iterable[av.Packet] = (
            p
            for p in inp.demux(*streams)
            if p.dts is not None and (end_s is None or _time_s(p) < end_s)
        )
        if order is not None:
            packets = sorted(packets, key=order)
        for packet in packets:
            packet.stream = mapping[packet.stream.index]
            out.mux(packet)
    return Path(dst)


def _time_s(packet: av.Packet) -> float:
    assert packet.dts is not None and packet.time_base is not None
    return float(packet.dts * packet.time_base)


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
