"""A handful of mutated files (`streamfuse.testing.mutate`) through the media source, no
models: each ends in frames, frames then a `MediaDecodeError`, or a `SourceError` naming the
file; never another exception. Three were weaknesses the reliability suite found: a sample
rate that changes mid-stream, a file whose sound ends early reported as truncated, and one
damaged packet ending the whole file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streamfuse.errors import MediaDecodeError, SourceError
from streamfuse.frames import AudioFrame, ErrorFrame, Frame, VideoFrame
from streamfuse.sources.media import MediaSource
from streamfuse.testing import mutate
from streamfuse.testing.media import cut

pytestmark = pytest.mark.unit

SHORT = Path(__file__).resolve().parents[2] / "assets" / "test" / "short.mp4"


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cut(SHORT, tmp_path_factory.mktemp("clip") / "clip.mp4", 3.0)


def _read(path: Path) -> tuple[list[Frame], BaseException | None]:
    async def main() -> tuple[list[Frame], BaseException | None]:
        source = MediaSource(path)
        frames: list[Frame] = []
        try:
            await source.open()
            async for frame in source.frames():
                frames.append(frame)
        except (SourceError, MediaDecodeError) as e:
            return frames, e
        finally:
            await source.close()
        return frames, None

    return asyncio.run(main())


def _audio_s(frames: list[Frame]) -> float:
    return sum(f.duration_s for f in frames if isinstance(f, AudioFrame))


def test_a_sample_rate_change_mid_stream_is_resampled_not_fatal(clip: Path, tmp_path: Path) -> None:
    path = mutate.switching(clip, tmp_path / "rate.ts", rates=(48_000, 22_050))
    frames, failure = _read(path)
    assert failure is None
    # All of it arrives (before the fix the resampler refused the second half's frames).
    assert _audio_s(frames) == pytest.approx(3.0, abs=0.2)


def test_sound_that_ends_before_the_picture_is_not_a_truncated_file(
    clip: Path, tmp_path: Path
) -> None:
    path = mutate.variable_rate(clip, tmp_path / "vfr.mkv", seed=0)
    frames, failure = _read(path)
    assert failure is None  # was "stream ended at ... (truncated or corrupt)"
    times = [f.t_media for f in frames if isinstance(f, VideoFrame)]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_a_damaged_packet_costs_its_frames_not_the_rest_of_the_file(
    clip: Path, tmp_path: Path
) -> None:
    # 20 bits flipped in the media data (seed chosen so some packets fail to decode): the
    # file used to end there with "decoding failed"; now those packets are skipped, noted once.
    path = mutate.bit_flips(clip, tmp_path / "flips.mp4", 20, seed=0, skip=20000)
    frames, failure = _read(path)
    assert failure is None
    notes = [f for f in frames if isinstance(f, ErrorFrame)]
    assert len(notes) == 1 and "damaged packet" in notes[0].message and not notes[0].fatal
    video = [f for f in frames if isinstance(f, VideoFrame)]
    assert len(video) >= 80 and video[-1].t_media > 2.5  # of 90 frames, up to the end


def test_a_stream_without_a_decoder_is_skipped_not_fatal(clip: Path, tmp_path: Path) -> None:
    # Bit flips in the video sample entry left a stream with no codec context: opening the
    # file raised AttributeError (a crash in the 1000-file run); now the sound is still read.
    path = mutate.wrong_header(clip, tmp_path / "codec.mp4", "codec")
    frames, failure = _read(path)
    assert failure is None
    assert not [f for f in frames if isinstance(f, VideoFrame)]
    assert _audio_s(frames) == pytest.approx(3.0, abs=0.2)


@pytest.mark.parametrize(
    "make",
    [
        lambda src, d: mutate.empty(d / "empty.mp4"),
        lambda src, d: mutate.truncated(src, d / "cut.mp4", 0.4),
        lambda src, d: mutate.wrong_header(src, d / "garbage.mp4", "garbage", seed=1),
        lambda src, d: mutate.wrong_header(src, d / "prefix.mp4", "prefix", seed=2),
        lambda src, d: mutate.bit_flips(src, d / "flips.mp4", 300, seed=3, skip=2048),
        lambda src, d: mutate.patched_size(src, d / "claims.mp4", 65535, 65535),
        lambda src, d: mutate.odd_rate(src, d / "odd.wav", 12_345, layout="5.1"),
        lambda src, d: mutate.switching(src, d / "size.ts", sizes=((320, 240), (176, 144))),
    ],
    ids=["empty", "truncated", "garbage", "prefix", "flips", "claims", "odd-rate", "size"],
)
def test_damaged_files_end_in_frames_or_a_clear_error(clip: Path, tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    path = make(clip, tmp_path)
    frames, failure = _read(path)
    if failure is not None:
        assert path.name in str(failure)
    else:
        assert frames


def test_the_suite_cycles_families_and_is_deterministic(clip: Path, tmp_path: Path) -> None:
    first = mutate.make_suite([clip], tmp_path / "a", 10)
    again = mutate.make_suite([clip], tmp_path / "b", 10)
    assert len({m.kind for m in first}) == 9  # every family once, bit flips twice
    assert [m.name for m in first] == [m.name for m in again]
    for a, b in zip(first, again, strict=True):
        if a.kind in ("bitflip", "truncate", "header", "empty"):
            assert a.path.read_bytes() == b.path.read_bytes()
