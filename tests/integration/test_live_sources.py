"""Live inputs against real servers on loopback (HTTP with and without Range, HLS, fragmented
MP4, MPEG-TS over UDP, RTSP), reconnection after a dropped feed, far-apart streams over a
non-seekable URL. Short clips, a few seconds each (devices: tests/unit/test_sources.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from streamfuse.errors import SourceError
from streamfuse.frames import AudioFrame, Frame, GapFrame, VideoFrame
from streamfuse.sources import SourceConfig
from streamfuse.sources.media import MediaSource
from streamfuse.sources.pipe import BytePipe, PipeSource
from streamfuse.testing.live import HttpServer, Pusher, RtspServer, free_port, wait_udp_listener
from streamfuse.testing.media import apart, cut, fragmented, hls, interleave, lagged

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "assets" / "test" / "short.mp4"


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A served folder: the short clip, its first 4.4 s, badly interleaved and fragmented
    copies, and an HLS rendition."""
    root = tmp_path_factory.mktemp("served")
    interleave(SHORT, root / "short.mp4")
    cut(SHORT, root / "head.mp4", 4.4)
    apart(SHORT, root / "apart.mp4")
    fragmented(SHORT, root / "frag.mp4")
    hls(SHORT, root / "hls", segment_s=2.0)
    return root


async def _collect(src: MediaSource, until_s: float | None = None) -> list[Frame]:
    await src.open()
    got: list[Frame] = []
    try:
        async for f in src.frames():
            got.append(f)
            if until_s is not None and f.t_media >= until_s:
                break
    finally:
        await src.close()
    return got


def _read(src: MediaSource, until_s: float | None = None) -> list[Frame]:
    return asyncio.run(_collect(src, until_s))


def _split(frames: list[Frame]) -> tuple[list[VideoFrame], list[AudioFrame]]:
    video = [f for f in frames if isinstance(f, VideoFrame)]
    audio = [f for f in frames if isinstance(f, AudioFrame)]
    return video, audio


def _worst_skew_s(frames: list[Frame]) -> float:
    """How far one modality ran ahead of the other in the order frames were released."""
    latest: dict[type, float] = {}
    worst = 0.0
    for f in frames:
        if isinstance(f, VideoFrame | AudioFrame):
            latest[type(f)] = f.t_media
            if len(latest) == 2:
                worst = max(worst, abs(latest[VideoFrame] - latest[AudioFrame]))
    return worst


@pytest.fixture(scope="module")
def file_frames(media: Path) -> list[Frame]:
    return _read(MediaSource(media / "short.mp4"))


def _same_media(frames: list[Frame], reference: list[Frame], tol_s: float = 0.15) -> None:
    video, audio = _split(frames)
    ref_video, ref_audio = _split(reference)
    assert abs(len(video) - len(ref_video)) <= 2
    assert abs(len(audio) - len(ref_audio)) <= 10  # 20 ms windows: none lost or doubled
    assert audio[-1].t_end == pytest.approx(ref_audio[-1].t_end, abs=tol_s)
    assert video[0].t_media == pytest.approx(ref_video[0].t_media, abs=tol_s)
    assert audio[0].t_media == pytest.approx(ref_audio[0].t_media, abs=tol_s)
    assert _worst_skew_s(frames) < 1.6  # released in time order across streams


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_http_progressive(media: Path, file_frames: list[Frame], ranges: bool) -> None:
    with HttpServer(media, ranges=ranges) as server:
        src = MediaSource(server.url("short.mp4"))
        frames = _read(src)
    assert src.duration_s == pytest.approx(12.2, abs=0.1) and not src.live
    _same_media(frames, file_frames)


def test_far_apart_streams_over_http_without_range_are_buffered(
    media: Path, file_frames: list[Frame]
) -> None:
    """Audio stored 12 s behind the video: packets wait in the bounded buffer, so frames
    still leave in time order (the old reader released video 12 s ahead of the audio)."""
    with HttpServer(media, ranges=False) as server:
        src = MediaSource(server.url("apart.mp4"))
        frames = _read(src)
    assert src.interleave_warning is None
    _same_media(frames, file_frames)


def test_far_apart_streams_past_the_bound_give_one_warning(
    media: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="streamfuse.sources.media")
    with HttpServer(media, ranges=False) as server:
        src = MediaSource(server.url("apart.mp4"), config=SourceConfig(interleave_buffer_s=3.0))
        frames = _read(src)
    warnings = [r for r in caplog.records if "stored more than" in r.getMessage()]
    assert len(warnings) == 1 and "apart.mp4" in warnings[0].getMessage()
    video, audio = _split(frames)
    assert len(video) >= 360 and audio[-1].t_end > 12.0  # nothing lost, only late


def test_hls_playlist_over_http(media: Path, file_frames: list[Frame]) -> None:
    with HttpServer(media) as server:
        src = MediaSource(server.url("hls/index.m3u8"))
        frames = _read(src)
        assert any("index2.ts" in r for r in server.requests)
    _same_media(frames, file_frames, tol_s=0.2)


def test_fragmented_mp4_over_http_without_range(media: Path, file_frames: list[Frame]) -> None:
    with HttpServer(media, ranges=False) as server:
        frames = _read(MediaSource(server.url("frag.mp4")))
    _same_media(frames, file_frames)


def test_mpegts_over_udp(media: Path) -> None:
    """A live feed: no duration; frames arrive at the sender's pace; when it stops, the stall
    is named (UDP has no end of stream)."""
    port = free_port(socket.SOCK_DGRAM)
    url = f"udp://127.0.0.1:{port}"
    reference = _read(MediaSource(media / "head.mp4"))
    config = SourceConfig(stall_timeout_s=1.5, reconnect_attempts=0)
    src = MediaSource(url, config=config)
    got: list[Frame] = []
    with (
        Pusher(media / "head.mp4", f"{url}?pkt_size=1316", format="mpegts", delay_s=0.5),
        pytest.raises(SourceError, match=r"stalled: no data for 1\.5 s.*not reconnected"),
    ):
        asyncio.run(_collect_into(src, got))
    assert src.live and src.duration_s is None
    _same_media(got, reference, tol_s=0.2)
    # Paced by the sender, not released in a burst (what arrived while FFmpeg probed the
    # stream, ~1 s, comes at once).
    media_span_s = got[-1].t_media - got[0].t_media
    assert got[-1].arrival_wall - got[0].arrival_wall > media_span_s - 2.0


def test_a_live_feeds_audio_is_not_held_back_for_video_written_late(
    media: Path, tmp_path: Path
) -> None:
    """A browser's recorder writes its video some 100s of ms after the audio of the same time
    (the encoder runs behind the microphone). A live feed's frames leave as they are decoded,
    each stream in its own order: the audio, and speech recognition, does not wait for that
    video (held in time order, the browser path's commit p95 was 1.2-1.4x a file run's). A
    file keeps time order (`_same_media` above)."""
    clip = lagged(media / "head.mp4", tmp_path / "lagged.ts", video_lag_s=0.8)
    pipe = BytePipe()
    asyncio.run(pipe.write_chunk(clip.read_bytes()))
    pipe.end()
    frames = _read(PipeSource(pipe))
    video, audio = _split(frames)
    ref_video, ref_audio = _split(_read(MediaSource(media / "head.mp4")))
    assert abs(len(video) - len(ref_video)) <= 2 and abs(len(audio) - len(ref_audio)) <= 10
    assert [f.t_media for f in video] == sorted(f.t_media for f in video)
    assert [f.t_media for f in audio] == sorted(f.t_media for f in audio)
    # Released as stored: audio of 1.6 s and later before the video of 1.0 s (time order,
    # which waited for every stream up to 1.5 s, released none of it before).
    first_video_1s = next(i for i, f in enumerate(frames) if f in video and f.t_media >= 1.0)
    early = [f for f in frames[:first_video_1s] if f in audio and f.t_media >= 1.6]
    assert early, _worst_skew_s(frames)


async def _collect_into(src: MediaSource, got: list[Frame]) -> None:
    await src.open()
    try:
        async for f in src.frames():
            got.append(f)
    finally:
        await src.close()


def test_rtsp_push_to_a_listening_reader(media: Path) -> None:
    port = free_port()
    url = f"rtsp://127.0.0.1:{port}/live"
    reference = _read(MediaSource(media / "head.mp4"))
    config = SourceConfig(input_options={"rtsp_flags": "listen", "rtsp_transport": "tcp"})
    src = MediaSource(url, config=config)
    with Pusher(
        media / "head.mp4", url, format="rtsp", options={"rtsp_transport": "tcp"}, delay_s=1.0
    ):
        frames = _read(src)  # the sender's TEARDOWN ends the stream
    assert src.live
    _same_media(frames, reference, tol_s=0.25)


@pytest.mark.parametrize("join", ["mid-stream", "before-the-first-packet"])
def test_rtsp_pulled_from_a_real_server(media: Path, join: str) -> None:
    """A camera-like feed: a sender publishes to an RTSP server and we PLAY it from there,
    joining a relay already forwarding, or one whose sender holds its first packet until we
    have joined."""
    try:
        server = RtspServer()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    clip = media / "short.mp4"
    reference = _read(MediaSource(clip))
    # A relay never ends the stream: when the sender is done it stalls, and with no
    # reconnection the source stops there with an error naming the stall.
    # RTP over UDP: a large receive buffer keeps a busy machine from dropping video packets.
    config = SourceConfig(
        stall_timeout_s=5.0, reconnect_attempts=0, input_options={"buffer_size": "8388608"}
    )
    src = MediaSource(server.url(), config=config)
    frames: list[Frame] = []

    async def pull() -> None:
        await src.open()
        try:
            async for f in src.frames():
                frames.append(f)
        finally:
            await src.close()

    hold = join == "before-the-first-packet"
    push = {"rtsp_transport": "udp"}
    with server, Pusher(clip, server.publish_url(), format="rtsp", options=push, hold=hold) as p:
        server.wait_published()
        if hold:
            server.release_on_join(p)
        with pytest.raises(SourceError, match="stalled: no data for 5 s"):
            asyncio.run(pull())
    assert src.live
    video, audio = _split(frames)
    ref_video, ref_audio = _split(reference)
    assert all(b.t_media > a.t_media for a, b in zip(video, video[1:], strict=False))
    # Pictures and sound end together, as in the clip.
    clip_skew = ref_audio[-1].t_end - ref_video[-1].t_media
    assert audio[-1].t_end - video[-1].t_media == pytest.approx(clip_skew, abs=0.5)
    if hold:
        # Joined before the first packet: the whole clip, pictures from the first one.
        assert audio[-1].t_end == pytest.approx(ref_audio[-1].t_end, abs=0.25)
        assert audio[0].t_media == pytest.approx(ref_audio[0].t_media, abs=0.05)
        assert video[0].t_media == pytest.approx(ref_video[0].t_media, abs=0.05)
        # (RTP over UDP: the last windows before the sender stops may not make it.)
        assert len(audio) >= len(ref_audio) - 10 and len(video) >= len(ref_video) - 5, (
            len(audio),
            len(ref_audio),
            len(video),
            len(ref_video),
        )
    else:
        # A reader of a relay gets the stream from when it joined (well inside the first
        # second here) and decodes pictures from the next key frame; then everything to the end,
        # without a hole. The relay sends no clip position (no RTP-Info), so the reader's
        # timeline starts at its first packet.
        assert audio[0].t_media < 0.6 and len(audio) >= len(ref_audio) - 30
        covered = sum(f.t_end - f.t_media for f in audio)
        assert audio[-1].t_end - audio[0].t_media == pytest.approx(covered, abs=0.25)
        assert len(video) >= 0.6 * len(ref_video)


def test_udp_feed_killed_for_5s_reconnects_with_a_gap(media: Path) -> None:
    """The sender dies 3 s in and a new one starts 5 s later at the live position: the
    reader stalls, reconnects, and the timeline goes on after a gap covering the lost media."""
    port = free_port(socket.SOCK_DGRAM)
    url = f"udp://127.0.0.1:{port}?pkt_size=1316"
    clip = media / "short.mp4"
    config = SourceConfig(stall_timeout_s=1.5, reconnect_attempts=3, reconnect_backoff_s=0.2)
    src = MediaSource(url.split("?")[0], config=config)
    with (
        Pusher(clip, url, format="mpegts", delay_s=1.0, stop_s=3.0),
        Pusher(clip, url, format="mpegts", delay_s=1.0 + 3.0 + 5.0, start_s=8.0),
    ):
        frames = _read(src, until_s=11.5)
    gaps = [f for f in frames if isinstance(f, GapFrame)]
    assert len(gaps) == 1 and src.reconnects == 1
    gap = gaps[0]
    assert gap.reason.startswith("stalled") and gap.attempts >= 1
    assert 2.5 < gap.t_media < 3.5 and 7.0 < gap.t_end < 9.0, (gap.t_media, gap.t_end)
    record = gap.to_record()
    assert record["type"] == "gap" and record["t_end"] > record["t_start"]
    at = frames.index(gap)
    before = [f for f in frames[:at] if isinstance(f, VideoFrame | AudioFrame)]
    after = [f for f in frames[at + 1 :] if isinstance(f, VideoFrame | AudioFrame)]
    assert before and after
    assert max(f.t_media for f in before) <= gap.t_media + 0.05
    assert min(f.t_media for f in after) >= gap.t_end - 0.05
    video_after, audio_after = _split(after)
    assert video_after and audio_after and audio_after[-1].t_end > 11.0


def test_feed_that_never_returns_fails_after_the_retries(media: Path) -> None:
    port = free_port(socket.SOCK_DGRAM)
    url = f"udp://127.0.0.1:{port}"
    # Opening waits for the sender's first packets (a Python process starting: seconds on a
    # loaded machine); each reconnection attempt then waits as long in vain.
    config = SourceConfig(
        stall_timeout_s=1.0, open_timeout_s=4.0, reconnect_attempts=2, reconnect_backoff_s=0.1
    )
    src = MediaSource(url, config=config)
    got: list[Frame] = []
    with (
        Pusher(media / "head.mp4", f"{url}?pkt_size=1316", format="mpegts"),
        pytest.raises(SourceError, match=r"gave up after 2 reconnection attempts") as e,
    ):
        asyncio.run(_collect_into(src, got))
    assert "udp://127.0.0.1" in str(e.value) and "stalled" in str(e.value)
    video, audio = _split(got)
    assert len(video) > 100 and audio[-1].t_end > 4.0  # what arrived was kept


def test_cli_run_keeps_events_around_a_gap_and_fails_when_the_feed_is_gone(
    media: Path, tmp_path: Path
) -> None:
    """`streamfuse run udp://...`: the sender dies at 3 s and a new one starts 5 s later; the
    run emits a gap event and keeps the events before and after it; when the feed ends for
    good the run ends with a clear error after the retries, exit status 1, events kept."""
    port = free_port(socket.SOCK_DGRAM)
    url = f"udp://127.0.0.1:{port}"
    clip = media / "short.mp4"
    out = tmp_path / "ev.jsonl"
    cmd = [sys.executable, "-m", "streamfuse.cli", "run", url, "--out", str(out), "--no-live"]
    cmd += ["--reconnect-attempts", "1", "--stall-timeout-s", "2"]
    # The models load after the input opened: FFmpeg's UDP buffer holds the feed meanwhile.
    cmd += ["--input-option", "fifo_size=2000000", "--input-option", "overrun_nonfatal=1"]
    feed = f"{url}?pkt_size=1316"
    # Each sender starts when the run listens (a feed joined after its key frame has no
    # video until the next one, 4.5 s later in this clip): the first once the run has bound
    # the port, the second once the run has noticed the stall and is about to listen again.
    with (
        Pusher(clip, feed, format="mpegts", stop_s=3.0, hold=True) as first,
        Pusher(clip, feed, format="mpegts", start_s=8.0, hold=True) as second,
        subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) as proc,
    ):
        assert proc.stderr is not None
        lines: list[str] = []
        reconnecting = threading.Event()

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)
                if "reconnecting in" in line:
                    reconnecting.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        wait_udp_listener(port)
        first.release()
        assert reconnecting.wait(120), "".join(lines)
        # A UDP input listens: it reopens at once (no backoff), and waits up to the open
        # timeout (10 s) for the feed.
        wait_udp_listener(port, timeout_s=30)
        second.release()
        proc.wait(180)
        reader.join(10)
    run = subprocess.CompletedProcess(cmd, proc.returncode, None, "".join(lines))
    stderr = run.stderr
    assert run.returncode == 1, stderr
    kinds = [(e["type"], e["t_start"], e["t_end"]) for e in map(json.loads, out.open())]
    assert "gave up after 1 reconnection attempts" in stderr, (stderr, kinds)
    assert "partial results kept" in stderr
    evs = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    gaps = [e for e in evs if e["type"] == "gap"]
    assert len(gaps) == 1, kinds
    start, end = gaps[0]["t_start"], gaps[0]["t_end"]
    asr = [e for e in evs if e["type"] == "asr"]
    ocr = [e for e in evs if e["type"] == "ocr"]
    assert any(e["t_start"] < start for e in asr), (gaps, asr)
    assert any(e["t_start"] >= end - 0.1 for e in asr), (gaps, asr)
    assert any(e["t_start"] <= start for e in ocr) and any(e["t_start"] >= end - 0.1 for e in ocr)
    errors = [e for e in evs if e["type"] == "error"]
    assert errors and "gave up" in errors[-1]["message"]


@pytest.mark.parametrize("ranges", [True, False], ids=["range", "no-range"])
def test_http_download_broken_midway_resumes_without_losing_media(
    media: Path, file_frames: list[Frame], ranges: bool
) -> None:
    """The first response breaks off 40% into the file: the reader reconnects, seeks back
    (or, without Range, reads from the start again and skips what it already delivered),
    and every frame arrives once."""
    size = (media / "short.mp4").stat().st_size
    with HttpServer(media, ranges=ranges, drop_after_bytes=int(0.4 * size)) as server:
        src = MediaSource(server.url("short.mp4"), config=SourceConfig(reconnect_backoff_s=0.1))
        frames = _read(src)
    gaps = [f for f in frames if isinstance(f, GapFrame)]
    media_frames = [f for f in frames if not isinstance(f, GapFrame)]
    assert src.reconnects == 1 and len(gaps) == 1
    assert gaps[0].t_end - gaps[0].t_media < 0.1  # no media was missed
    video, audio = _split(media_frames)
    assert [f.t_media for f in video] == sorted({f.t_media for f in video})  # none twice
    _same_media(media_frames, file_frames)
