"""MediaSource on local files: frames, pacing, broken input, source options, devices, and
far-apart streams read without seeking. Live servers: tests/integration/test_live_sources.py."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from streamfuse.app import StreamfuseConfig
from streamfuse.cli import app as cli_app
from streamfuse.errors import MediaDecodeError, SourceError
from streamfuse.events import GapPayload, parse_record
from streamfuse.frames import AudioFrame, Frame, GapFrame, VideoFrame
from streamfuse.sources import SourceConfig
from streamfuse.sources.media import MediaSource
from streamfuse.testing.media import apart, faststart, interleave, remux, spread_s, truncate

pytestmark = pytest.mark.unit


def _read(source: MediaSource) -> list[Frame]:
    async def go() -> list[Frame]:
        await source.open()
        return [f async for f in source.frames()]

    return asyncio.run(go())


@pytest.fixture(scope="module")
def short(assets: Path) -> Path:
    return assets / "test" / "short.mp4"


def test_reads_native_fps_and_20ms_audio(short: Path) -> None:
    src = MediaSource(short)
    frames = _read(src)
    video = [f for f in frames if isinstance(f, VideoFrame)]
    audio = [f for f in frames if isinstance(f, AudioFrame)]
    assert src.fps == pytest.approx(30.0)
    assert len(video) == pytest.approx(src.duration_s * 30, abs=2)
    assert video[0].image.shape == (720, 1280, 3)
    assert all(len(a.samples) == 320 and a.sample_rate == 16_000 for a in audio)
    assert audio[-1].t_end == pytest.approx(src.duration_s, abs=0.1)
    # Media time is monotonic per modality and both share one clock.
    assert all(b.t_media > a.t_media for a, b in zip(video, video[1:], strict=False))
    assert all(b.t_media > a.t_media for a, b in zip(audio, audio[1:], strict=False))
    assert abs(video[-1].t_end - audio[-1].t_end) < 0.1
    assert abs(src.audio_clock.fit.skew_ppm) < 50


def test_realtime_pacing_releases_every_stream_on_time(short: Path) -> None:
    """Audio sits up to ~1 s behind video in the container; live, both must arrive on time."""

    async def go() -> list[Frame]:
        src = MediaSource(short, realtime=True)
        await src.open()
        got: list[Frame] = []
        async for f in src.frames():
            got.append(f)
            if f.t_media >= 2.0:
                break
        return got

    frames = asyncio.run(go())
    t0 = frames[0].arrival_wall
    lateness = [(f.arrival_wall - t0) - f.t_media for f in frames]
    assert {type(f) for f in frames} == {VideoFrame, AudioFrame}
    assert max(abs(x) for x in lateness) < 0.15
    assert all(b.t_media >= a.t_media for a, b in zip(frames, frames[1:], strict=False))


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="input not found: .*nope.mp4"):
        _read(MediaSource(tmp_path / "nope.mp4"))


def test_non_media_file(tmp_path: Path) -> None:
    bogus = tmp_path / "notes.mp4"
    bogus.write_text("these are not video frames\n" * 50)
    with pytest.raises(SourceError, match="not a readable media file"):
        _read(MediaSource(bogus))


def test_truncated_mp4_without_index_fails_to_open(short: Path, tmp_path: Path) -> None:
    cut = truncate(short, tmp_path / "cut.mp4", 0.5)
    with pytest.raises(SourceError, match="cut.mp4"):
        _read(MediaSource(cut))


def test_truncated_streamable_mp4_keeps_what_was_decoded(short: Path, tmp_path: Path) -> None:
    cut = truncate(faststart(short, tmp_path / "fs.mp4"), tmp_path / "fs_cut.mp4", 0.5)

    async def go() -> tuple[list[Frame], BaseException | None]:
        src = MediaSource(cut)
        await src.open()
        got: list[Frame] = []
        try:
            async for f in src.frames():
                got.append(f)
        except MediaDecodeError as e:
            return got, e
        return got, None

    frames, error = asyncio.run(go())
    video = [f for f in frames if isinstance(f, VideoFrame)]
    # Roughly the first half decodes, then the early end is named.
    assert 0.2 * 352 < len(video) < 0.9 * 352
    assert error is not None and "fs_cut.mp4" in str(error)
    assert "truncated or corrupt" in str(error) or "decoding failed" in str(error)


def test_audio_only_and_video_only(short: Path, tmp_path: Path) -> None:
    a = MediaSource(remux(short, tmp_path / "a.mp4", video=False))
    frames = _read(a)
    assert not a.has_video and a.has_audio
    assert frames and all(isinstance(f, AudioFrame) for f in frames)
    v = MediaSource(remux(short, tmp_path / "v.mp4", audio=False))
    frames = _read(v)
    assert v.has_video and not v.has_audio
    assert frames and all(isinstance(f, VideoFrame) for f in frames)


def test_unreachable_url() -> None:
    with pytest.raises(SourceError, match=r"127\.0\.0\.1:9"):
        _read(MediaSource("http://127.0.0.1:9/live.mp4", open_timeout_s=3))


# -- source options, devices, far-apart streams (issue 15) -----------------------------------


def test_source_config_backoff_doubles_up_to_the_cap() -> None:
    config = SourceConfig(reconnect_backoff_s=0.5, reconnect_backoff_max_s=3.0)
    assert [config.backoff_s(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValidationError, match="reconnect_backoff_max_s"):
        SourceConfig(reconnect_backoff_s=2.0, reconnect_backoff_max_s=1.0)
    assert StreamfuseConfig(source={"input_options": {"a": "b"}}).source.input_options == {"a": "b"}


@pytest.mark.parametrize(
    ("location", "options", "passive"),
    [
        ("udp://127.0.0.1:5000", {}, True),
        ("rtp://0.0.0.0:5004", {}, True),
        ("rtsp://0.0.0.0:8554/live", {"rtsp_flags": "listen"}, True),
        ("tcp://0.0.0.0:9000?listen", {}, True),
        ("srt://0.0.0.0:9000?mode=listener&listen=1", {}, True),
        ("rtmp://0.0.0.0/live", {"listen": "1"}, True),
        ("rtsp://camera.local/live", {}, False),
        ("tcp://10.0.0.2:9000", {}, False),
        ("tcp://10.0.0.2:9000?listen=0", {}, False),
        ("https://example.com/live.m3u8", {}, False),
    ],
)
def test_a_listening_input_reconnects_at_once_and_backs_off_after(
    location: str, options: dict[str, str], passive: bool
) -> None:
    # While a listener is closed, what its sender sends is lost, and there is no server to
    # spare: the first attempt waits for nothing. A server the input asks waits the backoff.
    config = SourceConfig(input_options=options, reconnect_backoff_s=2.0)
    src = MediaSource(location, config=config)
    assert src.passive is passive
    assert src.reconnect_wait_s(1) == (0.0 if passive else 2.0)
    assert src.reconnect_wait_s(2) == 4.0


def test_input_options_reach_ffmpeg(short: Path) -> None:
    # `format` is FFmpeg's -f: forcing MPEG-TS on an MP4 file cannot work.
    forced = MediaSource(short, config=SourceConfig(input_options={"format": "mpegts"}))
    with pytest.raises(SourceError, match="short.mp4"):
        _read(forced)
    assert _read(MediaSource(short, config=SourceConfig(input_options={"seekable": "0"})))


def test_missing_devices_are_clear_errors() -> None:
    with pytest.raises(SourceError, match=r"/dev/video99.*v4l2"):
        _read(MediaSource("/dev/video99"))
    with pytest.raises(SourceError, match=r"alsa device hw:99"):
        _read(MediaSource("alsa://hw:99"))


def _worst_skew_s(frames: list[Frame]) -> float:
    latest: dict[type, float] = {}
    worst = 0.0
    for f in frames:
        latest[type(f)] = f.t_media
        if len(latest) == 2:
            worst = max(worst, abs(latest[VideoFrame] - latest[AudioFrame]))
    return worst


def test_far_apart_streams_read_without_seeking_leave_in_time_order(
    short: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The audio stored after all of the video, read as a non-seekable stream (FFmpeg's
    `seekable=0`, as over HTTP without Range): held packets keep the streams together."""
    far = apart(short, tmp_path / "apart.mp4")
    assert spread_s(far) > 10
    unseekable = SourceConfig(input_options={"seekable": "0"})
    src = MediaSource(far, config=unseekable)
    frames = _read(src)
    assert _worst_skew_s(frames) < 1.6 and src.interleave_warning is None
    video = [f for f in frames if isinstance(f, VideoFrame)]
    assert len(video) == pytest.approx(12.2 * 30, abs=2)
    # Past a small bound the frames still all come, and one warning says why they are late.
    caplog.set_level(logging.WARNING, logger="streamfuse.sources.media")
    bounded = MediaSource(far, config=unseekable.model_copy(update={"interleave_buffer_s": 2.0}))
    late = _read(bounded)
    assert len([f for f in late if isinstance(f, VideoFrame)]) == len(video)
    assert _worst_skew_s(late) > 5
    warned = [r.getMessage() for r in caplog.records if "stored more than" in r.getMessage()]
    assert len(warned) == 1 and "apart.mp4" in warned[0] and "not seekable" in warned[0]


def test_interleaved_copy_stores_streams_together(short: Path, tmp_path: Path) -> None:
    assert spread_s(interleave(short, tmp_path / "il.mp4")) < 0.1


def test_gap_frame_is_a_gap_event() -> None:
    gap = GapFrame(stream_id="cam", t_media=3.0, t_end=8.0, reason="stalled", attempts=2)
    record = parse_record(gap.to_record())
    assert record.type == "gap" and (record.t_start, record.t_end) == (3.0, 8.0)
    assert isinstance(record.payload, GapPayload) and record.payload.attempts == 2


def test_cli_input_option_needs_key_and_value(short: Path) -> None:
    result = CliRunner().invoke(cli_app, ["run", str(short), "--input-option", "nokey"])
    assert result.exit_code == 2
    assert "--input-option expects key=value, got 'nokey'" in result.output


def test_bundled_demo_clip_is_time_interleaved() -> None:
    """Read in byte order (HTTP without Range), the audio must come with the video of the same
    moment; the clip once stored it ~39 s behind."""
    from streamfuse.assets import demo_files

    with demo_files() as files:
        assert spread_s(files.clip) < 0.5


def test_stereo_is_averaged_to_mono_not_summed(tmp_path: Path) -> None:
    """A browser records its microphone as two identical channels: the mono signal must keep
    their level (FFmpeg's downmix made it 1.41x louder and clipped)."""
    import av as _av

    from streamfuse.frames import AudioFrame
    from streamfuse.sources.media import MediaSource

    rate = 48_000
    t = np.arange(rate) / rate
    tone = (0.9 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    path = tmp_path / "stereo.wav"
    with _av.open(str(path), "w") as out:
        stream = out.add_stream("pcm_f32le", rate=rate, layout="stereo")
        frame = _av.AudioFrame.from_ndarray(
            np.stack([tone, tone]).reshape(1, -1, order="F"), format="flt", layout="stereo"
        )
        frame.rate = rate
        out.mux(stream.encode(frame))
        out.mux(stream.encode())

    async def samples() -> np.ndarray:
        source = MediaSource(path, video=False)
        await source.open()
        got = [f.samples async for f in source.frames() if isinstance(f, AudioFrame)]
        await source.close()
        return np.concatenate(got)

    mono = asyncio.run(samples())
    assert len(mono) >= 15_900
    assert 0.87 < float(np.abs(mono).max()) < 0.93


def test_mpeg_ts_copy_decodes_the_same_sound_and_times_as_the_mp4(
    short: Path, tmp_path: Path
) -> None:
    """MPEG-TS carries no edit list: its AAC track starts with the encoder's priming frame,
    which the MP4 trims. Both must give the same samples at the same media times."""
    mp4 = _read(MediaSource(short))
    ts = _read(MediaSource(remux(short, tmp_path / "clip.ts")))
    for kind in (AudioFrame, VideoFrame):
        a = [f for f in mp4 if isinstance(f, kind)]
        b = [f for f in ts if isinstance(f, kind)]
        assert abs(len(a) - len(b)) <= 1
        times = [(x.t_media, y.t_media) for x, y in zip(a, b, strict=False)]
        assert max(abs(x - y) for x, y in times) < 1e-3
    sound = [
        np.concatenate([f.samples for f in fs if isinstance(f, AudioFrame)]) for fs in (mp4, ts)
    ]
    n = min(map(len, sound))
    assert np.array_equal(sound[0][: n - 320], sound[1][: n - 320])
