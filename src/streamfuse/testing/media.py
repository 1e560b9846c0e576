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
