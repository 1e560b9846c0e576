"""Media files, URLs and capture devices through PyAV.

Video frames come at the stream's native rate as RGB arrays; audio is resampled to 16 kHz mono
float32 and cut into fixed windows (20 ms by default). Frames leave in media-time order, paced
at wall-clock speed with ``realtime=True`` (files) or at the feed's own pace (live inputs: RTSP,
UDP, RTP, devices, live HLS), where the arrival time is when the data came in. A URL or device
that drops or stalls is reopened with backoff (`SourceConfig`): the timeline continues after a
`GapFrame`, and an input that does not come back fails with `SourceError` (frames kept).
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
import math
import re
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any, ClassVar

import av
import numpy as np

from streamfuse.clock import DriftEstimator
from streamfuse.errors import MediaDecodeError, SourceError
from streamfuse.frames import (
    AUDIO_SAMPLE_RATE_HZ,
    AudioFrame,
    ErrorFrame,
    Frame,
    GapFrame,
    VideoFrame,
    now_wall,
)
from streamfuse.pipeline.source import Pacer, Source
from streamfuse.sources.config import SourceConfig

log = logging.getLogger(__name__)

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")

#: Protocols whose feed paces itself and has no duration.
_LIVE_SCHEMES = frozenset({"rtsp", "rtsps", "rtmp", "rtmps", "rtp", "udp", "srt", "tcp"})
#: A jump of media time this long (s) within one connection is reported as a gap.
_HOLE_S = 1.0
#: Reads of corrupt data in a row a live feed may have before it counts as dropped.
_MAX_BAD_READS = 20
#: `scheme://name` device inputs and the FFmpeg input formats that read them.
_DEVICES = {"v4l2": ("video4linux2", "v4l2"), "alsa": ("alsa",), "pulse": ("pulse",)}


_MAX_PLAUSIBLE_FPS = 240.0


def is_url(location: str) -> bool:
    return bool(_URL.match(location))


def _scheme(location: str) -> str | None:
    return location.split("://", 1)[0].lower() if is_url(location) else None


class _Dropped(Exception):
    """The connection ended before the media did (error, stall, early end)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass
class _Resume:
    """Where a reconnected input picks up: the media end released before the drop, how long
    the outage lasted, and whether the new connection was sought to that point."""

    media_end_s: float
    outage_s: float
    sought: bool


class MediaSource(Source):
    """A file path, URL (file, http(s), hls, rtsp, udp, ...) or device read with PyAV."""

    #: Its video frames are key frames already (chosen upstream, e.g. by an edge running the
    #: change detector): the main job sends them straight to OCR.
    selects_key_frames: ClassVar[bool] = False

    def __init__(
        self,
        location: str | Path,
        *,
        stream_id: str = "main",
        realtime: bool = False,
        video: bool = True,
        audio: bool = True,
        window_ms: float = 20.0,
        config: SourceConfig | None = None,
        open_timeout_s: float | None = None,
        lookahead_s: float = 1.5,
    ) -> None:
        self.location = str(location)
        super().__init__(
            name=f"media:{Path(self.location).name or self.location}", stream_id=stream_id
        )
        self.config = config or SourceConfig()
        if open_timeout_s is not None:
            self.config = self.config.model_copy(update={"open_timeout_s": open_timeout_s})
        self.pacer = Pacer(realtime)
        self.want_video = video
        self.want_audio = audio
        self.window_samples = round(AUDIO_SAMPLE_RATE_HZ * window_ms / 1000.0)
        self.open_timeout_s = self.config.open_timeout_s
        #: How far one stream may be decoded ahead of another while frames wait to go out in
        #: time order (bounds the memory held: ~45 frames of video at 30 fps).
        self.lookahead_s = lookahead_s
        self._container: Any = None
        self.has_video = False
        self.has_audio = False
        #: A live feed: no duration, no seeking, paced by the sender (set by `open`).
        self.live = False
        self.fps: float | None = None
        self.video_size: tuple[int, int] | None = None
        #: Maps the audio sample clock (samples / 16 kHz) onto the container (video) clock
        #: (restarted with each connection).
        self.audio_clock = DriftEstimator()
        #: Reconnections made so far, and the warning about far-apart streams (at most one).
        self.reconnects = 0
        self.interleave_warning: str | None = None
        self._origin_s = 0.0  # container time of media time 0 (first connection)
        self._shift_s = 0.0  # added to this connection's media times
        self._resume: _Resume | None = None
        self._pending_gap: tuple[float, str, int] | None = None
        self._media_end_s = 0.0
        self._last_video_t = -math.inf
        self._audio_end_s = -math.inf
        self._n_video = 0
        self._n_windows = 0
        self._n_out = 0
        # Damaged packets of a file skipped in a row, and [first media time, count, reason].
        self._bad_in_row = 0
        self._damaged: list[Any] | None = None
        # Media times before which frames are decoded but not released (`resume_from`).
        self._video_from_s = -math.inf
        self._audio_from_s = -math.inf
        # Set by `resume_from` (None: not resuming); 0 once the first audio window is out.
        self._resume_align: int | None = None
        self._audio_t0 = 0.0  # media time of the first audio sample (this connection)

    @property
    def reconnectable(self) -> bool:
        """URLs and devices are reopened when they drop; local files are not."""
        return is_url(self.location) or self._device() is not None

    def resume_from(
        self, *, video_s: float | None = None, audio_s: float | None = None, audio_align: int = 1
    ) -> None:
        """Release video frames from media time `video_s` and audio windows from `audio_s` on
        (a run continued after an interruption), the first audio window being one whose index
        is a multiple of `audio_align` (so a consumer that cuts audio into larger blocks, the
        VAD, sees the same blocks as in the first run). The input is still decoded from its
        start and the frames before are dropped unpaced, so each keeps the time and index it
        had in the first run (the audio windows stay on the same grid, which a seek would not
        give); the skipped part costs decoding only. A live feed cannot be rewound."""
        if self.live or self.reconnectable and self.duration_s is None:
            raise SourceError(f"{self.location}: a live input cannot be resumed (no rewinding)")
        # Records round times to the ms: a frame at 4.5999999 s is the one logged at 4.6 s.
        if video_s is not None:
            self._video_from_s = video_s - 0.0006
        self._resume_align = 0
        if audio_s is not None:
            self._audio_from_s = audio_s - 0.0006
            self._resume_align = audio_align

    def _resumed(self, frame: Frame) -> Frame | None:
        """`frame` as a resumed run releases it, or None before the resume point."""
        if isinstance(frame, VideoFrame) and frame.t_media < self._video_from_s:
            return None
        if isinstance(frame, AudioFrame) and self._resume_align:
            if frame.t_media < self._audio_from_s or frame.index % self._resume_align:
                return None
            self._resume_align = 0  # every window from here on
            # A consumer counting samples from its first window (the recognizer) then has
            # the clock it had in the first run: the sample clock, not the drift-corrected
            # time of this window (they part by ~1 ms, which moved every word time).
            nominal = self._audio_t0 + frame.index * self.window_samples / AUDIO_SAMPLE_RATE_HZ
            return dataclasses.replace(frame, t_media=nominal)
        return frame

    # -- opening ----------------------------------------------------------------------------
    async def open(self) -> None:
        await asyncio.to_thread(self._open_sync)

    def _open_sync(self) -> None:
        self._container = self._open_container()
        self._inspect()

    def _inspect(self) -> None:
        """Read the opened container's streams: which to decode, duration, rate, size."""
        c, loc = self._container, self.location
        self.has_video = bool(c.streams.video) and self.want_video
        self.has_audio = bool(c.streams.audio) and self.want_audio
        if not c.streams.video and not c.streams.audio:
            raise SourceError(f"no audio or video stream in {loc}")
        # A damaged header can name a codec FFmpeg has no decoder for (no codec context): that
        # stream is unusable, the other may not be (the build notes the path it skips, and an
        # input left with neither is refused with its name).
        for kind, streams in (("video", c.streams.video), ("audio", c.streams.audio)):
            if streams and streams[0].codec_context is None and getattr(self, f"has_{kind}"):
                log.warning("%s: no decoder for its %s stream; %s skipped", loc, kind, kind)
                setattr(self, f"has_{kind}", False)
        # Inputs without a duration over HTTP (MPEG-TS streams, live HLS, fragmented MP4)
        # are paced like files when asked: only these protocols and devices pace themselves.
        self.live = self._is_live()
        if c.duration and not self.live:
            self.duration_s = c.duration / av.time_base
        self._origin_s = c.start_time / av.time_base if c.start_time is not None else 0.0
        if self.has_video:
            vs = c.streams.video[0]
            rate = vs.average_rate or vs.guessed_rate
            # Above this a rate is a timebase guess (WebM's 1 kHz from a browser), not a rate.
            self.fps = float(rate) if rate and rate <= _MAX_PLAUSIBLE_FPS else 30.0
            self.video_size = (vs.codec_context.width, vs.codec_context.height)
        log.info(
            "opened %s: video=%s audio=%s duration=%s live=%s",
            loc,
            self.has_video,
            self.has_audio,
            self.duration_s,
            self.live,
        )

    def _is_live(self) -> bool:
        """The input paces itself (a network feed or a device): no duration, no seeking,
        frames arrive when decoded, a damaged packet is skipped rather than fatal."""
        return _scheme(self.location) in _LIVE_SCHEMES or self._device() is not None

    @property
    def passive(self) -> bool:
        """The input listens rather than asks (UDP and RTP datagrams sent to a local port, an
        RTSP, TCP, SRT or RTMP listener): reopening it asks no server for anything, and while it
        is closed what the sender sends is lost, so a reconnection's first attempt is at once."""
        scheme = _scheme(self.location)
        if scheme in ("udp", "rtp"):
            return True
        options = self.config.input_options
        query = self.location.partition("?")[2].split("&")
        return (
            "listen" in options.get("rtsp_flags", "")
            or options.get("listen", "0") not in ("", "0")
            or any(q == "listen" or (q.startswith("listen=") and q != "listen=0") for q in query)
        )

    def reconnect_wait_s(self, attempt: int) -> float:
        """Wait before reconnection attempt `attempt` (1-based): the config's backoff, but none
        before the first attempt for a `passive` input."""
        if attempt == 1 and self.passive:
            return 0.0
        return self.config.backoff_s(attempt)

    def _device(self) -> tuple[str, str] | None:
        """(device name, FFmpeg input format) for a capture device input, else None."""
        scheme = _scheme(self.location)
        if scheme in _DEVICES:
            name = self.location.split("://", 1)[1]
        elif self.location.startswith("/dev/video"):
            scheme, name = "v4l2", self.location
        else:
            return None
        assert scheme is not None
        usable = [f for f in _DEVICES[scheme] if f in av.formats_available]
        if not usable:
            raise SourceError(
                f"{self.location}: this FFmpeg build (PyAV {av.__version__}) has no {scheme} "
                f"input; capture from {scheme} devices needs PyAV built against an FFmpeg with "
                f"{scheme} enabled (e.g. `pip install av --no-binary av` with the system FFmpeg)"
            )
        return name, usable[0]

    def _open_container(self) -> Any:
        """The opened PyAV input container (raising `SourceError` naming the problem); called
        again for each reconnection."""
        loc = self.location
        cfg = self.config
        device = self._device()
        options = dict(cfg.input_options)
        fmt = options.pop("format", None)
        target = loc
        if device is not None:
            target, fmt = device
        elif not is_url(loc):
            path = Path(loc)
            if not path.exists():
                raise SourceError(f"input not found: {loc}")
            if path.is_dir():
                raise SourceError(f"input is a directory, expected a media file: {loc}")
        timeout: float | tuple[float, float] = cfg.open_timeout_s
        if self.reconnectable:
            # No data for `stall_timeout_s` interrupts the read: the feed has stalled.
            timeout = (cfg.open_timeout_s, cfg.stall_timeout_s)
            if is_url(loc):
                rw_us = int(max(cfg.open_timeout_s, cfg.stall_timeout_s) * 1e6)
                options.setdefault("rw_timeout", str(rw_us))
            if "listen" in options.get("rtsp_flags", ""):
                # FFmpeg's RTSP listener passes its default listen_timeout (-1 s) on as -1000 ms,
                # which the TCP layer rejects: give it the open timeout instead.
                options.setdefault("listen_timeout", str(math.ceil(cfg.open_timeout_s)))
        try:
            return av.open(target, format=fmt, options=options, timeout=timeout)
        except av.error.FileNotFoundError as e:
            if device is not None:
                raise SourceError(f"no such {fmt} device: {target} ({_reason(e)})") from e
            raise SourceError(f"input not found: {loc}") from e
        except (av.error.ConnectionRefusedError, av.error.HTTPError, OSError) as e:
            if device is not None:
                raise SourceError(f"cannot open {fmt} device {target}: {_reason(e)}") from e
            if is_url(loc):
                raise SourceError(f"cannot reach {loc}: {_reason(e)}") from e
            raise SourceError(f"cannot read {loc}: {_reason(e)}") from e
        except av.error.ExitError as e:
            raise SourceError(
                f"cannot reach {loc}: nothing received within {cfg.open_timeout_s:g} s"
            ) from e
        except av.error.FFmpegError as e:
            if device is not None:
                raise SourceError(f"cannot open {fmt} device {target}: {_reason(e)}") from e
            raise SourceError(
                f"not a readable media file: {loc} ({_reason(e)}; truncated or not audio/video?)"
            ) from e

    # -- frames -----------------------------------------------------------------------------
    async def frames(self) -> AsyncIterator[Frame]:
        """Frames in media-time order across streams, each released when it is due; after a
        reconnection, a `GapFrame` covering the media that did not arrive comes first."""
        if self._container is None:
            await self.open()
        while True:
            dropped: _Dropped | None = None
            gen = self._decode(self._container)
            try:
                async for frame in self._in_time_order(gen):
                    if isinstance(frame, VideoFrame):
                        if frame.t_media <= self._last_video_t:
                            continue  # already delivered before a reconnection
                        self._last_video_t = frame.t_media
                    elif isinstance(frame, AudioFrame):
                        if frame.t_media < self._audio_end_s - 0.005:
                            continue
                        self._audio_end_s = frame.t_end
                    if self._resume_align is not None:
                        resumed = self._resumed(frame)
                        if resumed is None:
                            continue
                        frame = resumed
                    if self._pending_gap is not None:
                        yield self._gap(frame.t_media)
                    elif self.live and self._n_out and frame.t_media - self._media_end_s > _HOLE_S:
                        # A feed skipped ahead on the same connection (a sender restarted
                        # before the stall timeout, lost packets): the missing media is a gap
                        # too. (In a file, a hole is content: a slideshow's sparse frames.)
                        self._pending_gap = (self._media_end_s, "no media received", 0)
                        yield self._gap(frame.t_media)
                    self._n_out += 1
                    if self.live:
                        # The feed paces itself: a frame arrived when it was decoded off the
                        # network (its creation time), however long it then waited here.
                        wall = frame.arrival_wall
                    else:
                        wall = await self.pacer.wait_until(frame.t_media)
                    self._media_end_s = max(self._media_end_s, _t_end(frame))
                    yield _with_arrival(frame, wall)
            except _Dropped as e:
                dropped = e
            finally:
                gen.close()
            if dropped is None:
                if self._pending_gap is not None:
                    yield self._gap(self._media_end_s)
                return
            await self._reconnect(dropped)

    def _gap(self, t_end: float) -> GapFrame:
        assert self._pending_gap is not None
        t_start, reason, attempts = self._pending_gap
        self._pending_gap = None
        return GapFrame(
            stream_id=self.stream_id,
            t_media=t_start,
            t_end=max(t_start, t_end),
            reason=reason,
            attempts=attempts,
        )

    async def _in_time_order(self, gen: Generator[Frame, None, None]) -> AsyncIterator[Frame]:
        """Decoded frames in media-time order.

        Containers interleave streams in chunks (audio often sits up to ~1 s behind the video
        of the same time), so decoding order is not time order. Frames wait in a small heap
        until every stream has been decoded past them, then leave in time order: a paced
        file's consumer sees audio and video arrive together, as from a real feed. A live
        feed's frames leave as they are decoded, each stream in its own order: its sender
        interleaved them as it could, and a stream encoded late (a browser's video runs
        100s of ms behind its microphone) must not delay the other's results by as much.
        When decoding fails, the frames already decoded still leave before the failure is
        raised.
        """
        heap: list[tuple[float, int, Frame]] = []
        latest: dict[type, float] = {}
        expected = int(self.has_video) + int(self.has_audio)
        seq = 0
        done = False
        failure: BaseException | None = None
        while True:
            while not done and not self._releasable(heap, latest, expected):
                try:
                    frame = await _next_in_thread(gen)
                except Exception as e:
                    failure, frame = e, None
                if frame is None:
                    done = True
                    break
                if isinstance(frame, VideoFrame | AudioFrame):  # not a note about damage
                    latest[type(frame)] = frame.t_media
                heapq.heappush(heap, (frame.t_media, seq, frame))
                seq += 1
            if not heap:
                if failure is not None:
                    raise failure
                return
            yield heapq.heappop(heap)[2]

    def _releasable(
        self, heap: list[tuple[float, int, Frame]], latest: dict[type, float], expected: int
    ) -> bool:
        """The earliest queued frame can go: every stream is decoded past it, or one stream
        ran `lookahead_s` ahead (the other is late or has ended); a live feed's at once."""
        if not heap:
            return False
        if self.live:
            return True  # as decoded: a stream the sender encodes late holds no other back
        t = heap[0][0]
        if len(latest) >= expected and t <= min(latest.values()):
            return True
        return max(latest.values()) - t > self.lookahead_s

    def _packets(self, c: Any, streams: list[Any]) -> Iterator[Any]:
        """The container's packets in time order, as far as a bounded buffer allows.

        A seekable file is read in time order by FFmpeg itself; a non-seekable one (a URL
        without Range support, a pipe) is read in file order, where a badly interleaved file
        stores one stream's media far behind the other's. Packets (compressed, small) wait
        here until every stream has been read past them; past `interleave_buffer_s` or
        `interleave_buffer_mb` they go out anyway, with one warning. A live feed's packets
        go on as they are read (see `_in_time_order`).
        """
        if self.live:
            yield from self._demux(c, streams)
            return
        cfg = self.config
        # Feeds (inputs without a duration: MPEG-TS over HTTP, live HLS) are interleaved by
        # their sender; a stream of theirs may also never send a packet.
        feed = self.duration_s is None
        hold_s = self.lookahead_s if feed else max(self.lookahead_s, cfg.interleave_buffer_s)
        max_bytes = cfg.interleave_buffer_mb * 2**20
        # A stream that ended early is waited for no more. Only local files' stream durations
        # are trusted: read without seeking, a fragmented MP4 reports its first fragment's.
        ends = {s.index: None if is_url(self.location) else _stream_end_s(s) for s in streams}
        heap: list[tuple[float, int, Any]] = []
        latest: dict[int, float] = {}
        flushes: list[Any] = []
        held = 0
        seq = 0
        for packet in self._demux(c, streams):
            index = packet.stream.index
            stamp = packet.dts if packet.dts is not None else packet.pts
            if stamp is None:
                if packet.size == 0:
                    flushes.append(packet)  # end of the stream: flush its decoder last
                    continue
                t = latest.get(index, -math.inf)
            else:
                t = float(stamp * packet.time_base)
                latest[index] = max(latest.get(index, -math.inf), t)
            heapq.heappush(heap, (t, seq, packet))
            seq += 1
            held += packet.size
            while heap:
                t0 = heap[0][0]
                behind = [
                    i
                    for i, end in ends.items()
                    if latest.get(i, -math.inf) < t0
                    and (end is None or latest.get(i, -math.inf) < end)
                ]
                if behind:
                    span = max(latest.values()) - t0
                    if span <= hold_s and held <= max_bytes:
                        break
                    if not feed and span > self.lookahead_s:
                        self._warn_interleave(span, held)
                _, _, out = heapq.heappop(heap)
                held -= out.size
                yield out
        while heap:
            yield heapq.heappop(heap)[2]
        yield from flushes

    def _demux(self, c: Any, streams: list[Any]) -> Iterator[Any]:
        """The container's packets; a live feed's corrupt data (a sender restarting midway
        through a packet, a lost datagram) is skipped, a few times in a row at most."""
        errors = 0
        while True:
            try:
                for packet in c.demux(streams):
                    errors = 0
                    yield packet
                return
            except av.error.InvalidDataError as e:
                errors += 1
                if not self.live or errors > _MAX_BAD_READS:
                    raise
                log.info("%s: skipped corrupt data (%s)", self.location, _reason(e))

    def _warn_interleave(self, span_s: float, held_bytes: int) -> None:
        if self.interleave_warning is not None:
            return
        self.interleave_warning = (
            f"{self.location}: its audio and video are stored more than {span_s:.0f} s apart "
            f"and the input cannot be read out of order (not seekable); past the buffer bound "
            f"({held_bytes / 2**20:.1f} MiB held, source.interleave_buffer_s="
            f"{self.config.interleave_buffer_s:g}) one stream arrives late. Serve a "
            "time-interleaved file (`ffmpeg -i in.mp4 -c copy out.mp4` rewrites it so) or a "
            "server with Range support"
        )
        log.warning("%s", self.interleave_warning)

    def _decode(self, c: Any) -> Generator[Frame, None, None]:
        """Frames of one connection, in decoding order (raises `_Dropped` when a URL or
        device ends early, `MediaDecodeError` when a local file does)."""
        streams = []
        if self.has_video and c.streams.video:
            streams.append(c.streams.video[0])
            c.streams.video[0].thread_type = "AUTO"
        if self.has_audio and c.streams.audio:
            streams.append(c.streams.audio[0])
        if not streams:
            return
        fps = self.fps or 30.0
        self.audio_clock = DriftEstimator()
        to_mono = MonoResampler()
        carry = np.zeros(0, dtype=np.float32)
        audio_t0: float | None = None
        n_samples = 0
        n_video = 0
        decoded_video_t = -math.inf
        mapped = False
        priming = _Priming(c.streams.audio[0]) if self.has_audio else None
        try:
            for packet in self._packets(c, streams):
                if not mapped and packet.pts is not None:
                    self._map_clock(float(packet.pts * packet.time_base))
                    mapped = True
                if priming is not None:
                    priming.saw(packet)
                for decoded in self._decoded(packet):
                    if isinstance(decoded, av.VideoFrame):
                        t = (
                            self._media_t(decoded.time)
                            if decoded.time is not None
                            else self._last_video_t + 1.0 / fps
                        )
                        decoded_video_t = max(decoded_video_t, t)
                        yield VideoFrame(
                            stream_id=self.stream_id,
                            t_media=max(0.0, t),
                            image=decoded.to_ndarray(format="rgb24"),
                            index=self._n_video,
                            fps=fps,
                        )
                        self._n_video += 1
                        n_video += 1
                    elif isinstance(decoded, av.AudioFrame):
                        if priming is not None and priming.drops(decoded):
                            # Media time 0 is where the sound starts, as in an MP4 of the
                            # same recording (only while no frame has been made).
                            first = n_video == 0 and self.reconnects == 0
                            if first and abs((decoded.time or 0.0) - self._origin_s) < 1e-3:
                                self._origin_s += decoded.samples / decoded.sample_rate  # > 0
                            continue
                        if audio_t0 is None:
                            audio_t0 = max(0.0, self._media_t(decoded.time or self._origin_s))
                            self._audio_t0 = audio_t0
                        if decoded.time is not None:
                            # One reading of both clocks: samples delivered so far vs the pts.
                            queued = len(carry) / AUDIO_SAMPLE_RATE_HZ
                            self.audio_clock.update(
                                audio_t0 + n_samples / AUDIO_SAMPLE_RATE_HZ + queued,
                                self._media_t(decoded.time),
                            )
                        carry = np.concatenate([carry, to_mono(decoded)])
                        while len(carry) >= self.window_samples:
                            win, carry = carry[: self.window_samples], carry[self.window_samples :]
                            yield self._window(win, audio_t0, n_samples)
                            n_samples += len(win)
        except av.error.FFmpegError as e:
            self._damaged = None  # the failure below says more than a note would
            audio_s = n_samples / AUDIO_SAMPLE_RATE_HZ
            if self.reconnectable:
                if isinstance(e, av.error.ExitError):
                    raise _Dropped(f"stalled: no data for {self.config.stall_timeout_s:g} s") from e
                raise _Dropped(f"connection lost: {_reason(e)}") from e
            where = f"after {n_video} video frames and {audio_s:.2f} s of audio"
            raise MediaDecodeError(f"{self.location}: decoding failed {where}: {_reason(e)}") from e
        # The decoded end, not what has left `frames` yet: up to `lookahead_s` of frames may
        # still wait there (a file whose sound ends early looked truncated).
        last_t = max(
            self._last_video_t,
            decoded_video_t,
            (audio_t0 or 0.0) + n_samples / AUDIO_SAMPLE_RATE_HZ,
        )
        if self.duration_s and last_t < self.duration_s - 1.0:
            if self.reconnectable:
                raise _Dropped(f"ended early at {last_t:.1f} s of {self.duration_s:.1f} s")
            raise MediaDecodeError(
                f"{self.location}: stream ended at {last_t:.1f} s of {self.duration_s:.1f} s "
                "(truncated or corrupt)"
            )
        note = self._damage_note()  # after the end check: a truncated file gets its error only
        if note is not None:
            yield note
        if self.has_audio and audio_t0 is not None:
            carry = np.concatenate([carry, to_mono(None)])
            if len(carry):
                win = np.pad(carry, (0, self.window_samples - len(carry) % self.window_samples))
                for i in range(0, len(win), self.window_samples):
                    yield self._window(win[i : i + self.window_samples], audio_t0, n_samples)
                    n_samples += self.window_samples

    def _decoded(self, packet: Any) -> list[Any]:
        try:
            frames = list(packet.decode())
        except av.error.InvalidDataError as e:
            if not self.live:
                return self._skip_damaged(packet, e)
            # A damaged packet of a live feed (lost datagrams): the decoder recovers at the
            # next key frame; the media it held shows up as a gap.
            log.info("%s: skipped an undecodable packet (%s)", self.location, _reason(e))
            return []
        except av.error.ExitError:
            raise
        except av.error.FFmpegError as e:
            if self.live:
                raise
            return self._skip_damaged(packet, e)
        self._bad_in_row = 0
        return frames

    def _skip_damaged(self, packet: Any, e: av.error.FFmpegError) -> list[Any]:
        """A file's packet that does not decode (damaged bytes) is skipped, as one bad frame
        must not end a stream: the decoder recovers at the next key frame, and the stream
        gets one note (`_damage_note`). Many in a row mean the rest is unreadable: raised."""
        self._bad_in_row += 1
        if self._bad_in_row > _MAX_BAD_READS:
            raise e
        if self._damaged is None:
            stamp = packet.pts if packet.pts is not None else packet.dts
            t = self._media_t(float(stamp * packet.time_base)) if stamp is not None else 0.0
            self._damaged = [t, 0, _reason(e)]
        self._damaged[1] += 1
        log.info("%s: skipped an undecodable packet (%s)", self.location, _reason(e))
        return []

    def _damage_note(self) -> ErrorFrame | None:
        """One note for the packets skipped in this file (None: none were)."""
        if self._damaged is None:
            return None
        t, n, reason = self._damaged
        t = max(0.0, float(t))
        self._damaged = None
        return ErrorFrame(
            stream_id=self.stream_id,
            t_media=t,
            stage="input",
            message=f"{self.location}: skipped {n} damaged packet(s) from {t:.1f} s "
            f"({reason}); the media around them may be missing",
        )

    def _map_clock(self, first_s: float) -> None:
        """Place this connection's timestamps on the media timeline (first packet at
        container time `first_s`): after a reconnection, the same clock when the new
        timestamps continue the old ones, else by the wall time the outage lasted."""
        resume, self._resume = self._resume, None
        if resume is None:
            return
        rel = first_s - self._origin_s
        same_clock = resume.sought or (
            resume.media_end_s - 1.0 <= rel <= resume.media_end_s + resume.outage_s + 10.0
        )
        self._shift_s = 0.0 if same_clock else resume.media_end_s + resume.outage_s - rel

    def _media_t(self, container_s: float) -> float:
        return container_s - self._origin_s + self._shift_s

    def _window(self, samples: np.ndarray, t0: float, n_before: int) -> AudioFrame:
        frame = AudioFrame(
            stream_id=self.stream_id,
            t_media=max(0.0, self.audio_clock.to_reference(t0 + n_before / AUDIO_SAMPLE_RATE_HZ)),
            samples=np.ascontiguousarray(samples, dtype=np.float32),
            sample_rate=AUDIO_SAMPLE_RATE_HZ,
            index=self._n_windows,
        )
        self._n_windows += 1
        return frame

    # -- reconnection -----------------------------------------------------------------------
    async def _reconnect(self, dropped: _Dropped) -> None:
        """Reopen the input with backoff after it dropped, or raise `SourceError`."""
        cfg = self.config
        lost_wall = now_wall()
        lost_at = self._media_end_s
        await self.close()
        what = f"{self.location}: {dropped.reason} at {lost_at:.1f} s"
        if not self.reconnectable or cfg.reconnect_attempts == 0:
            raise SourceError(f"{what}; not reconnected (source.reconnect_attempts is 0)")
        last = dropped.reason
        for attempt in range(1, cfg.reconnect_attempts + 1):
            wait_s = self.reconnect_wait_s(attempt)
            log.warning(
                "%s; reconnecting in %.1f s (attempt %d of %d)",
                what,
                wait_s,
                attempt,
                cfg.reconnect_attempts,
            )
            await asyncio.sleep(wait_s)
            try:
                self._container = await asyncio.to_thread(self._open_container)
            except SourceError as e:
                last = str(e)
                continue
            sought = not self.live and await asyncio.to_thread(self._seek, lost_at)
            self._resume = _Resume(lost_at, now_wall() - lost_wall, sought)
            self._pending_gap = (lost_at, dropped.reason, attempt)
            self.reconnects += 1
            self.pacer = Pacer(self.pacer.realtime, self.pacer.speed)  # re-anchored at resume
            log.warning("%s: reconnected after %d attempt(s)", self.location, attempt)
            return
        raise SourceError(
            f"{what}; gave up after {cfg.reconnect_attempts} reconnection attempts (last: {last})"
        )

    def _seek(self, media_s: float) -> bool:
        """Seek the new connection to `media_s` (a file-like URL); False if it cannot."""
        try:
            self._container.seek(int((media_s + self._origin_s) * av.time_base))
        except (av.error.FFmpegError, OSError) as e:
            log.info("%s: cannot seek (%s): reading from the start", self.location, _reason(e))
            return False
        return True

    async def close(self) -> None:
        if self._container is not None:
            self._container.close()
            self._container = None


async def _next_in_thread(gen: Generator[Frame, None, None]) -> Frame | None:
    """`next(gen)` in a worker thread. Cancelled meanwhile, it still waits for that read to
    return before the cancellation goes on: closing the generator (or the container) while
    the thread is inside it failed with "generator already executing", which replaced the
    cancellation with an error event and left the source running."""
    read = asyncio.ensure_future(asyncio.to_thread(next, gen, None))
    try:
        return await asyncio.shield(read)
    except asyncio.CancelledError:
        await asyncio.wait({read})
        raise


def _stream_end_s(stream: Any) -> float | None:
    """Container time of a stream's last packet when the container says (files), else None."""
    if not stream.duration or stream.time_base is None:
        return None
    start = stream.start_time or 0
    # Within half a second of its end a stream counts as ended: nothing to wait for.
    return float((start + stream.duration) * stream.time_base) - 0.5


def _t_end(frame: Frame) -> float:
    return float(getattr(frame, "t_end", frame.t_media))


class MonoResampler:
    """Audio frames -> 16 kHz mono float32, the channels averaged.

    FFmpeg's own downmix to mono adds the channels at -3 dB each: a microphone recorded as two
    identical channels (browsers record so) comes out 1.41x louder and clips, which cost the
    recognizer ~7 WER points on browser audio.
    """

    def __init__(self) -> None:
        self._resampler = av.AudioResampler(format="fltp", rate=AUDIO_SAMPLE_RATE_HZ)
        self._input: tuple[str, str, int] | None = None

    def __call__(self, frame: av.AudioFrame | None) -> np.ndarray:
        """The samples `frame` completes (None: flush the resampler's tail)."""
        outs = []
        if frame is not None:
            shape = (frame.format.name, frame.layout.name, frame.sample_rate)
            if self._input is not None and shape != self._input:
                # The input changed sample rate, layout or format mid-stream (a feed that
                # switched settings): PyAV's resampler is fixed to its first frame's, so the
                # old one's tail is flushed and a new one takes over.
                outs += self._resampler.resample(None)
                self._resampler = av.AudioResampler(format="fltp", rate=AUDIO_SAMPLE_RATE_HZ)
            self._input = shape
        outs += self._resampler.resample(frame)
        planes = [out.to_ndarray() for out in outs]
        if not planes:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([p.mean(axis=0) for p in planes]).astype(np.float32, copy=False)


def _with_arrival(frame: Frame, wall: float) -> Frame:
    # The arrival time is when the pacer releases the frame, not when it was decoded.
    return dataclasses.replace(frame, arrival_wall=wall)


class _Priming:
    """The encoder's priming frame at the start of an AAC stream, when the container did not
    trim it. An AAC encoder puts one frame of delay (1,024 samples for AAC-LC) before the
    sound; MP4 marks it in an edit list and FFmpeg's decoder drops it, but MPEG-TS, ADTS, RTP
    and FLV carry no such mark, so the same sound cut from an MP4 into a live feed arrived
    21-64 ms late with a frame of near-silence in front (the speech recognizer's output moves
    with such shifts). The first decoded frame of a connection is dropped when its timestamp
    equals the first packet's (the decoder skipped nothing); joining a feed midway, that frame
    lacks the previous one its overlap-add needs, so it is not faithful sound either."""

    def __init__(self, stream: Any) -> None:
        ctx = stream.codec_context
        self._index = stream.index
        self._first_t: float | None = None
        self._done = ctx is None or ctx.name != "aac"

    def saw(self, packet: Any) -> None:
        if self._first_t is None and packet.stream.index == self._index and packet.pts is not None:
            self._first_t = float(packet.pts * packet.time_base)

    def drops(self, frame: Any) -> bool:
        """Whether `frame` (an audio frame of this stream, in decoding order) is the priming."""
        if self._done:
            return False
        self._done = True
        return (
            frame.time is not None
            and self._first_t is not None
            and frame.sample_rate > 0
            and abs(frame.time - self._first_t) < 0.5 / frame.sample_rate
        )


def _reason(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e)
    return str(msg).strip().rstrip(".")


__all__ = ["MediaSource", "SourceConfig", "is_url"]
