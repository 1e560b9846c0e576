"""Chromium's fake camera and microphone made from a media file, to drive the dashboard in a real
browser: `fake_capture(src)` writes an MJPEG (30 fps, Chromium's rate for it) or raw Y4M video
and a 16-bit WAV, cached by content; `chromium_launch_options(fake)` launches Debian's
Chromium playing them (Playwright's `chromium.launch(**options)`; no browser download)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import av

#: Chromium's file-backed fake camera plays MJPEG at this fixed rate (Y4M carries its own).
MJPEG_FPS = 30
#: The fake microphone's WAV: 16-bit mono at the rate browsers capture at.
WAV_RATE = 48_000
#: Where converted files are cached unless told otherwise (they are large: ~2 MB per second).
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "streamfuse-fake-capture"
CHROMIUM_ENV = "STREAMFUSE_CHROMIUM"


@dataclass(frozen=True, slots=True)
class FakeCapture:
    video: Path
    audio: Path
    duration_s: float
    width: int
    height: int


def _key(src: Path, *parts: object) -> str:
    h = hashlib.sha256()
    with src.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    h.update(repr(parts).encode())
    return h.hexdigest()[:16]


def _write_video(
    src: Path, dst: Path, kind: str, fps: int, max_duration_s: float | None, qscale: int
) -> tuple[int, int, int]:
    """Every 1/fps s of `src`, the newest decoded frame -> (frames, width, height)."""
    n = 0
    fmt = {"mjpeg": "mjpeg", "y4m": "yuv4mpegpipe"}[kind]
    with av.open(str(src)) as inp, av.open(str(dst), "w", format=fmt) as out:
        vin = inp.streams.video[0]
        vin.thread_type = "AUTO"
        if kind == "mjpeg":
            vout = out.add_stream("mjpeg", rate=fps)
            vout.pix_fmt = "yuvj420p"
            # A fixed quantizer (ffmpeg's -q:v) keeps small slide text sharp at any bitrate.
            vout.codec_context.qmin = vout.codec_context.qmax = qscale
        else:
            vout = out.add_stream("wrapped_avframe", rate=fps)  # raw frames, no coding loss
            vout.pix_fmt = "yuv420p"
        vout.width = vin.codec_context.width
        vout.height = vin.codec_context.height
        pending: av.VideoFrame | None = None
        for frame in inp.decode(vin):
            t = float(frame.time or 0.0)
            if max_duration_s is not None and t >= max_duration_s:
                break
            # Emit the previous frame for every output tick before this one's time (repeats
            # frames of a slower source, skips frames of a faster one).
            while pending is not None and n / fps < t:
                n = _encode(out, vout, pending, n, fps)
            pending = frame
        end = max_duration_s if max_duration_s is not None else float("inf")
        if pending is not None:
            last = float(pending.time or 0.0) + 1.0 / float(vin.average_rate or fps)
            while n / fps < min(last, end):
                n = _encode(out, vout, pending, n, fps)
        for packet in vout.encode(None):
            out.mux(packet)
        return n, vout.width, vout.height


def _encode(out: Any, stream: Any, frame: av.VideoFrame, n: int, fps: int) -> int:
    img = frame.reformat(format=stream.pix_fmt)
    img.pts = n
    img.time_base = Fraction(1, fps)
    for packet in stream.encode(img):
        out.mux(packet)
    return n + 1


def _write_wav(src: Path, dst: Path, max_duration_s: float | None) -> None:
    with av.open(str(src)) as inp, av.open(str(dst), "w", format="wav") as out:
        ain = inp.streams.audio[0]
        aout = out.add_stream("pcm_s16le", rate=WAV_RATE, layout="mono")
        resampler = av.AudioResampler(format="s16", layout="mono", rate=WAV_RATE)
        limit = None if max_duration_s is None else int(max_duration_s * WAV_RATE)
        written = 0
        for frame in [*inp.decode(ain), None]:
            for chunk in resampler.resample(frame):
                if limit is not None and written + chunk.samples > limit:
                    keep = limit - written
                    if keep <= 0:
                        break
                    arr = chunk.to_ndarray()[:, :keep]
                    chunk = av.AudioFrame.from_ndarray(arr, format="s16", layout="mono")
                    chunk.sample_rate = WAV_RATE
                chunk.pts = None
                written += chunk.samples
                for packet in aout.encode(chunk):
                    out.mux(packet)
        for packet in aout.encode(None):
            out.mux(packet)


def fake_capture(
    src: str | Path,
    *,
    cache_dir: str | Path | None = None,
    max_duration_s: float | None = None,
    video_format: Literal["mjpeg", "y4m"] = "mjpeg",
    fps: int = MJPEG_FPS,
    jpeg_qscale: int = 2,
) -> FakeCapture:
    """Chromium fake-capture files for `src` (its first `max_duration_s` seconds if given).

    MJPEG plays at 30 fps (Chromium's fixed rate for it; `fps` must be 30) and is small: at
    `jpeg_qscale` 2 (2 = near lossless, 31 = worst) the demo's frames come back at 47-50 dB
    PSNR, ~1.7 MB/s. Y4M is raw I420 at any `fps` (~1.4 MB per 720p frame) and costs the
    browser no decoding, which matters on a small, loaded machine. Files are cached under
    `cache_dir` by the source's content and these options, written to a temporary name first
    so a crash leaves no torn file.
    """
    if video_format == "mjpeg" and fps != MJPEG_FPS:
        raise ValueError(f"Chromium plays MJPEG fake capture at {MJPEG_FPS} fps, not {fps}")
    src = Path(src)
    folder = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    folder.mkdir(parents=True, exist_ok=True)
    key = _key(src, max_duration_s, video_format, fps, jpeg_qscale, WAV_RATE)
    video = folder / f"{src.stem}-{key}.{video_format}"
    audio = folder / f"{src.stem}-{key}.wav"
    meta = folder / f"{src.stem}-{key}.txt"
    if not (video.exists() and audio.exists() and meta.exists()):
        tmp = folder / f".{key}.{os.getpid()}"
        tmp.mkdir(exist_ok=True)
        try:
            frames, width, height = _write_video(
                src, tmp / "v", video_format, fps, max_duration_s, jpeg_qscale
            )
            if frames == 0:
                raise ValueError(f"{src}: no video frames to make a fake camera from")
            _write_wav(src, tmp / "a.wav", max_duration_s)
            (tmp / "v").replace(video)
            (tmp / "a.wav").replace(audio)
            meta.write_text(f"{frames} {width} {height}\n", encoding="utf-8")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    frames, width, height = (int(x) for x in meta.read_text(encoding="utf-8").split())
    return FakeCapture(video, audio, frames / fps, width, height)


def chromium_executable() -> str:
    """Debian's Chromium (or `$STREAMFUSE_CHROMIUM`); raises FileNotFoundError naming both."""
    path = (
        os.environ.get(CHROMIUM_ENV) or shutil.which("chromium") or shutil.which("chromium-browser")
    )
    if not path:
        raise FileNotFoundError(f"no chromium on PATH and ${CHROMIUM_ENV} unset")
    return path


def chromium_launch_options(
    fake: FakeCapture | None = None, *, headless: bool = True
) -> dict[str, Any]:
    """Keyword arguments for Playwright's `chromium.launch`: the system Chromium, camera and
    microphone granted without a prompt, fed from `fake`'s files (they loop), autoplay allowed."""
    args = [
        "--use-fake-ui-for-media-stream",
        "--use-fake-device-for-media-stream",
        "--autoplay-policy=no-user-gesture-required",
        # Keep a hidden or background page's timers and capture running at full rate.
        "--disable-background-timer-throttling",
        "--disable-renderer-backgrounding",
        "--disable-backgrounding-occluded-windows",
    ]
    if fake is not None:
        args += [
            f"--use-file-for-fake-video-capture={fake.video}",
            f"--use-file-for-fake-audio-capture={fake.audio}",
        ]
    return {"executable_path": chromium_executable(), "headless": headless, "args": args}


@dataclass(frozen=True, slots=True)
class LiveRun:
    """What `run_live_session` saw in the page: the session, how long it recorded, and how many
    seconds the microphone and camera had played before recording began (None if the browser
    cannot say; `capture_offset_s` is the microphone's, else the camera's)."""

    session_id: str
    recorded_s: float
    capture_offset_s: float | None
    audio_offset_s: float | None
    video_offset_s: float | None
    chunks_sent: int
    bytes_sent: int


def run_live_session(
    page: Any,
    base_url: str,
    token: str,
    duration_s: float,
    *,
    chat: Sequence[tuple[float, str, str]] = (),
    ask: str | None = None,
    end_timeout_s: float = 120.0,
    before_stop: Callable[[Any], None] | None = None,
    stop_early_s: float = 0.3,
) -> LiveRun:
    """Open the dashboard in a Playwright `page`, start a live session from the (fake) camera
    and microphone, type each `(at_s, author, text)` of `chat` into the chat box at that
    recording time, stop once the camera has played `duration_s` seconds (the fake files loop:
    recording starts a little after the camera, so it stops that much earlier), and wait for
    the session's final stats. `before_stop(page)` runs just before stopping (a screenshot
    with the live preview, say)."""
    page.goto(f"{base_url}/?token={token}")
    if ask:
        page.fill("#ask", ask)
    page.click("#start")
    page.wait_for_function("window.streamfuse.state.recordingStartedAt !== null", timeout=30_000)
    elapsed = "performance.now() - window.streamfuse.state.recordingStartedAt"
    for at_s, author, text in sorted(chat):
        page.wait_for_function(
            f"{elapsed} >= {at_s * 1000}", polling=50, timeout=(at_s + 30) * 1000
        )
        page.fill("#chat-author", author)
        page.fill("#chat-text", text)
        page.click("#chat-form button[type=submit]")
    played = f"{elapsed} + 1000 * (window.streamfuse.state.captureOffsetS || 0)"
    page.wait_for_function(
        f"{played} >= {(duration_s - stop_early_s) * 1000}",
        polling=20,
        timeout=(duration_s + 30) * 1000,
    )
    recorded_s = page.evaluate(elapsed) / 1000.0
    if before_stop is not None:
        before_stop(page)
    page.click("#stop")
    page.wait_for_function("window.streamfuse.state.ended", timeout=end_timeout_s * 1000)
    state = page.evaluate("window.streamfuse.state")
    return LiveRun(
        session_id=state["sessionId"],
        recorded_s=recorded_s,
        capture_offset_s=state["captureOffsetS"],
        audio_offset_s=state["audioOffsetS"],
        video_offset_s=state["videoOffsetS"],
        chunks_sent=state["chunksSent"],
        bytes_sent=state["bytesSent"],
    )
