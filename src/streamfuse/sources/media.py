"""Media files and URLs through PyAV.

Video frames come at the stream's native rate as RGB arrays; audio is resampled to 16 kHz mono
float32 and cut into fixed windows (20 ms by default). Frames are released in container order,
paced at wall-clock speed with ``realtime=True`` (as from a live feed) or as fast as possible.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import re
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import av
import numpy as np

from streamfuse.clock import DriftEstimator
from streamfuse.errors import MediaDecodeError, SourceError
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ, AudioFrame, Frame, VideoFrame
from streamfuse.pipeline.source import Pacer, Source

log = logging.getLogger(__name__)

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_url(location: str) -> bool:
    return bool(_URL.match(location))


class MediaSource(Source):
    """A file path or URL (file, http(s), rtsp, ...) read with PyAV."""

    def __init__(
        self,
        location: str | Path,
        *,
        stream_id: str = "main",
        realtime: bool = False,
        video: bool = True,
        audio: bool = True,
        window_ms: float = 20.0,
        open_timeout_s: float = 10.0,
        lookahead_s: float = 1.5,
    ) -> None:
        self.location = str(location)
        super().__init__(
            name=f"media:{Path(self.location).name or self.location}", stream_id=stream_id
        )
        self.pacer = Pacer(realtime)
        self.want_video = video
        self.want_audio = audio
        self.window_samples = round(AUDIO_SAMPLE_RATE_HZ * window_ms / 1000.0)
        self.open_timeout_s = open_timeout_s
        #: How far one stream may be decoded ahead of another while frames wait to go out in
        #: time order (bounds the memory held: ~45 frames of video at 30 fps).
        self.lookahead_s = lookahead_s
        self._container: Any = None
        self.has_video = False
        self.has_audio = False
        self.fps: float | None = None
        self.video_size: tuple[int, int] | None = None
        #: Maps the audio sample clock (samples / 16 kHz) onto the container (video) clock.
        self.audio_clock = DriftEstimator()

    async def open(self) -> None:
        await asyncio.to_thread(self._open_sync)

    def _open_sync(self) -> None:
        self._container = self._open_container()
        self._inspect()

    def _open_container(self) -> Any:
        """The opened PyAV input container (raising `SourceError` naming the problem)."""
        loc = self.location
        if not is_url(loc):
            path = Path(loc)
            if not path.exists():
                raise SourceError(f"input not found: {loc}")
            if path.is_dir():
                raise SourceError(f"input is a directory, expected a media file: {loc}")
        try:
            options = {"rw_timeout": str(int(self.open_timeout_s * 1e6))} if is_url(loc) else {}
            return av.open(loc, options=options, timeout=self.open_timeout_s)
        except av.error.FileNotFoundError as e:
            raise SourceError(f"input not found: {loc}") from e
        except (av.error.ConnectionRefusedError, av.error.HTTPError, OSError) as e:
            if is_url(loc):
                raise SourceError(f"cannot reach {loc}: {_reason(e)}") from e
            raise SourceError(f"cannot read {loc}: {_reason(e)}") from e
        except av.error.FFmpegError as e:
            raise SourceError(
                f"not a readable media file: {loc} ({_reason(e)}; truncated or not audio/video?)"
            ) from e

    def _inspect(self) -> None:
        """Read the opened container's streams: which to decode, duration, rate, size."""
        c, loc = self._container, self.location
        self.has_video = bool(c.streams.video) and self.want_video
        self.has_audio = bool(c.streams.audio) and self.want_audio
        if not c.streams.video and not c.streams.audio:
            raise SourceError(f"no audio or video stream in {loc}")
        if c.duration:
            self.duration_s = c.duration / av.time_base
        if self.has_video:
            vs = c.streams.video[0]
            rate = vs.average_rate or vs.guessed_rate
            self.fps = float(rate) if rate else 30.0
            self.video_size = (vs.codec_context.width, vs.codec_context.height)
            vs.thread_type = "AUTO"
        log.info(
            "opened %s: video=%s audio=%s duration=%s",
            loc,
            self.has_video,
            self.has_audio,
            self.duration_s,
        )

    async def frames(self) -> AsyncIterator[Frame]:
        """Frames in media-time order across streams, each released when it is due.

        Containers interleave streams in chunks (audio often sits up to ~1 s behind the video
        of the same time), so decoding order is not time order. Frames wait in a small heap
        until every stream has been decoded past them, then leave in time order: a live
        consumer sees audio and video arrive together, as from a real feed.
        """
        if self._container is None:
            await self.open()
        gen = self._decode()
        heap: list[tuple[float, int, Frame]] = []
        latest: dict[type, float] = {}
        expected = int(self.has_video) + int(self.has_audio)
        seq = 0
        done = False
        try:
            while True:
                while not done and not self._releasable(heap, latest, expected):
                    frame = await asyncio.to_thread(next, gen, None)
                    if frame is None:
                        done = True
                        break
                    latest[type(frame)] = frame.t_media
                    heapq.heappush(heap, (frame.t_media, seq, frame))
                    seq += 1
                if not heap:
                    return
                t, _, frame = heapq.heappop(heap)
                wall = await self.pacer.wait_until(t)
                yield _with_arrival(frame, wall)
        finally:
            gen.close()

    def _releasable(
        self, heap: list[tuple[float, int, Frame]], latest: dict[type, float], expected: int
    ) -> bool:
        """The earliest queued frame can go: every stream is decoded past it, or one stream
        ran `lookahead_s` ahead (the other is late or has ended)."""
        if not heap:
            return False
        t = heap[0][0]
        if len(latest) >= expected and t <= min(latest.values()):
            return True
        return max(latest.values()) - t > self.lookahead_s

    def _decode(self) -> Generator[Frame, None, None]:
        c = self._container
        streams = []
        if self.has_video:
            streams.append(c.streams.video[0])
        if self.has_audio:
            streams.append(c.streams.audio[0])
        if not streams:
            return
        t0 = c.start_time / av.time_base if c.start_time is not None else 0.0
        resampler = av.AudioResampler(format="flt", layout="mono", rate=AUDIO_SAMPLE_RATE_HZ)
        carry = np.zeros(0, dtype=np.float32)
        audio_t0: float | None = None
        n_samples = 0
        n_windows = 0
        n_video = 0
        try:
            for packet in c.demux(streams):
                for decoded in packet.decode():
                    if isinstance(decoded, av.VideoFrame):
                        t = (decoded.time if decoded.time is not None else n_video / self.fps) - t0
                        yield VideoFrame(
                            stream_id=self.stream_id,
                            t_media=max(0.0, t),
                            image=decoded.to_ndarray(format="rgb24"),
                            index=n_video,
                            fps=self.fps or 30.0,
                        )
                        n_video += 1
                    elif isinstance(decoded, av.AudioFrame):
                        if audio_t0 is None:
                            audio_t0 = max(0.0, (decoded.time or 0.0) - t0)
                        if decoded.time is not None:
                            # One reading of both clocks: samples delivered so far vs the pts.
                            queued = len(carry) / AUDIO_SAMPLE_RATE_HZ
                            self.audio_clock.update(
                                audio_t0 + n_samples / AUDIO_SAMPLE_RATE_HZ + queued,
                                decoded.time - t0,
                            )
                        for out in resampler.resample(decoded):
                            carry = np.concatenate([carry, out.to_ndarray().reshape(-1)])
                        while len(carry) >= self.window_samples:
                            win, carry = carry[: self.window_samples], carry[self.window_samples :]
                            yield self._window(win, audio_t0, n_samples, n_windows)
                            n_samples += len(win)
                            n_windows += 1
        except av.error.FFmpegError as e:
            audio_s = n_samples / AUDIO_SAMPLE_RATE_HZ
            where = f"after {n_video} video frames and {audio_s:.2f} s of audio"
            raise MediaDecodeError(f"{self.location}: decoding failed {where}: {_reason(e)}") from e
        last_t = max(n_video / (self.fps or 30.0), n_samples / AUDIO_SAMPLE_RATE_HZ)
        if self.duration_s and last_t < self.duration_s - 1.0:
            raise MediaDecodeError(
                f"{self.location}: stream ended at {last_t:.1f} s of {self.duration_s:.1f} s "
                "(truncated or corrupt)"
            )
        if self.has_audio:
            for out in resampler.resample(None):
                carry = np.concatenate([carry, out.to_ndarray().reshape(-1)])
            if len(carry):
                win = np.pad(carry, (0, self.window_samples - len(carry) % self.window_samples))
                for i in range(0, len(win), self.window_samples):
                    yield self._window(
                        win[i : i + self.window_samples], audio_t0 or 0.0, n_samples, n_windows
                    )
                    n_samples += self.window_samples
                    n_windows += 1

    def _window(self, samples: np.ndarray, t0: float, n_before: int, index: int) -> AudioFrame:
        return AudioFrame(
            stream_id=self.stream_id,
            t_media=max(0.0, self.audio_clock.to_reference(t0 + n_before / AUDIO_SAMPLE_RATE_HZ)),
            samples=np.ascontiguousarray(samples, dtype=np.float32),
            sample_rate=AUDIO_SAMPLE_RATE_HZ,
            index=index,
        )

    async def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None


def _with_arrival(frame: Frame, wall: float) -> Frame:
    # The arrival time is when the pacer releases the frame, not when it was decoded.
    return dataclasses.replace(frame, arrival_wall=wall)


def _reason(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e)
    return str(msg).strip().rstrip(".")


__all__ = ["MediaSource", "is_url"]
