"""Media pushed in as bytes: one container stream (WebM from a browser's MediaRecorder, MPEG-TS,
fragmented MP4) written chunk by chunk into a `BytePipe` and decoded by PyAV as it arrives.

The container is opened when its first bytes arrive, so a session's pipeline and models are
ready before the sender starts. The pipe is bounded: a writer that outruns the decoder waits
(`write_chunk` is awaitable), and one that is still too far ahead after its timeout gets
`IngestOverflow`. The input has no duration and no seeking; frames leave as soon as they are
decoded (the sender paces them, live).
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import AsyncIterator
from typing import Any

import av

from streamfuse.errors import SourceError, StreamfuseError
from streamfuse.frames import Frame
from streamfuse.sources.media import MediaSource, _reason


class IngestOverflow(StreamfuseError):
    """The decoder fell too far behind the bytes pushed in."""


class BytePipe(io.RawIOBase):
    """A bounded, thread-safe byte queue: written from the event loop, read (blocking) by
    the decoder thread as a non-seekable file. `end()` marks the end of input."""

    def __init__(self, max_bytes: int = 32 << 20) -> None:
        super().__init__()
        self.max_bytes = max_bytes
        self.received = 0
        self._buf = bytearray()
        self._cond = threading.Condition()
        self._ended = False

    # -- writer side (event loop) ---------------------------------------------------------
    async def write_chunk(self, data: bytes, timeout_s: float = 10.0) -> None:
        """Append `data`, waiting up to `timeout_s` for the decoder to make room."""
        if not self._put(data):
            ok = await asyncio.to_thread(self._put, data, timeout_s)
            if not ok:
                raise IngestOverflow(
                    f"media input is {len(self._buf)} bytes ahead of the decoder (limit "
                    f"{self.max_bytes}): sending faster than real time?"
                )

    def _put(self, data: bytes, timeout_s: float = 0.0) -> bool:
        with self._cond:
            if self._ended:
                raise SourceError("media input already ended")
            fits = self._cond.wait_for(
                lambda: len(self._buf) + len(data) <= self.max_bytes or not self._buf,
                timeout=timeout_s,
            )
            if not fits:
                return False
            self._buf += data
            self.received += len(data)
            self._cond.notify_all()
            return True

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    # -- reader side (decoder thread) -----------------------------------------------------
    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, b: Any) -> int:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._buf) or self._ended)
            n = min(len(b), len(self._buf))
            b[:n] = self._buf[:n]
            del self._buf[:n]
            self._cond.notify_all()
            return n


class PipeSource(MediaSource):
    """A `MediaSource` over a `BytePipe` (see the module docstring)."""

    def __init__(
        self, pipe: BytePipe, *, stream_id: str = "live", label: str = "live", **kwargs: Any
    ) -> None:
        kwargs.setdefault("realtime", False)  # the sender paces the input
        super().__init__(label, stream_id=stream_id, **kwargs)
        self.name = f"media:{label}"
        self.pipe = pipe

    async def open(self) -> None:
        """Nothing to read yet: the container opens when the first bytes arrive (`frames`),
        so the pipeline (and its models) can be ready before the sender starts. Until then
        the streams asked for are assumed present."""
        self.has_video, self.has_audio = self.want_video, self.want_audio

    async def frames(self) -> AsyncIterator[Frame]:
        if self._container is None:
            try:
                await asyncio.to_thread(self._open_sync)  # waits for the stream's header
            except SourceError:
                if self.pipe.received == 0:
                    return  # ended before any media came: nothing to decode, nothing wrong
                raise
        async for frame in super().frames():
            yield frame

    def _open_container(self) -> Any:
        try:
            # Small probe: the stream parameters are in the header of the formats meant for
            # streaming, and every byte probed is latency before the first frame.
            return av.open(self.pipe, options={"probesize": "65536", "analyzeduration": "500000"})
        except av.error.FFmpegError as e:
            raise SourceError(
                f"{self.location}: not a media stream FFmpeg can read without seeking "
                f"({_reason(e)}; send WebM, MPEG-TS or fragmented MP4)"
            ) from e

    def _is_live(self) -> bool:
        return True  # pushed as it happens: whatever duration the header claims

    async def close(self) -> None:
        self.pipe.end()
        await super().close()


__all__ = ["BytePipe", "IngestOverflow", "PipeSource"]
