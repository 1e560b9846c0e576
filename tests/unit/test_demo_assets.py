"""The committed demo/test clips match their ground truth and the truth JSON contract; the demo
clip ships as package data and resolves through importlib.resources.

Reads container metadata only (no full decode), so it runs in well under a second. The clips
and truth files are produced by scripts/make_demo_clip.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import av
import pytest

import streamfuse
from streamfuse.assets import demo_dir, demo_files

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(streamfuse.__file__).resolve().parent
CLIPS = [PACKAGE / "assets" / "demo" / "lecture", ROOT / "assets" / "test" / "short"]
DURATION_TOLERANCE_S = 0.2


def _truth(stem: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(stem.with_suffix(".truth.json").read_text())
    return data


@pytest.mark.parametrize("stem", CLIPS, ids=lambda p: p.name)
def test_clip_streams_match_truth(stem: Path) -> None:
    truth = _truth(stem)
    with av.open(str(stem.with_suffix(".mp4"))) as container:
        assert len(container.streams.video) == 1
        assert len(container.streams.audio) == 1
        video = container.streams.video[0]
        audio = container.streams.audio[0]
        assert video.codec_context.name == "h264"
        assert audio.codec_context.name == "aac"
        assert (video.width, video.height) == (1280, 720)
        assert video.average_rate == 30
        assert audio.sample_rate in (44_100, 48_000)

        assert video.duration is not None and audio.duration is not None
        assert video.time_base is not None and audio.time_base is not None
        video_s = float(video.duration * video.time_base)
        audio_s = float(audio.duration * audio.time_base)
        assert container.duration is not None
        container_s = container.duration / av.time_base
        for measured_s in (video_s, audio_s, container_s):
            assert abs(measured_s - truth["duration_s"]) <= DURATION_TOLERANCE_S
        assert video.frames == round(truth["duration_s"] * 30)


def _check_intervals(entries: list[dict[str, Any]], duration_s: float) -> None:
    previous_end_s = 0.0
    for entry in entries:
        start_s, end_s = entry["t_start"], entry["t_end"]
        assert isinstance(start_s, int | float) and isinstance(end_s, int | float)
        assert 0.0 <= previous_end_s <= start_s < end_s <= duration_s, entry
        previous_end_s = end_s


@pytest.mark.parametrize("stem", CLIPS, ids=lambda p: p.name)
def test_truth_follows_schema(stem: Path) -> None:
    truth = _truth(stem)
    assert set(truth) == {"duration_s", "ocr", "asr"}
    duration_s = truth["duration_s"]
    assert isinstance(duration_s, int | float) and duration_s > 0

    assert truth["ocr"], "at least one slide"
    for entry in truth["ocr"]:
        assert set(entry) == {"t_start", "t_end", "lines"}
        assert entry["lines"] and all(
            isinstance(line, str) and line.strip() == line and line for line in entry["lines"]
        )
    _check_intervals(truth["ocr"], duration_s)

    assert truth["asr"], "at least one sentence"
    for entry in truth["asr"]:
        assert set(entry) == {"t_start", "t_end", "text"}
        assert isinstance(entry["text"], str) and entry["text"].strip()
    _check_intervals(truth["asr"], duration_s)


def test_demo_and_short_presets_have_expected_size() -> None:
    demo, short = (_truth(stem) for stem in CLIPS)
    assert 40.0 <= demo["duration_s"] <= 55.0
    assert 6 <= len(demo["ocr"]) <= 9
    assert 10.0 <= short["duration_s"] <= 14.0
    assert 2 <= len(short["ocr"]) <= 3 and 2 <= len(short["asr"]) <= 3


def test_demo_files_resolve_inside_the_package() -> None:
    # Not via the repository root: a non-editable install has no checkout around it.
    assert demo_dir().joinpath("lecture.mp4").is_file()
    with demo_files() as files:
        assert files.clip.is_file() and files.truth.is_file()
        assert PACKAGE in files.clip.resolve().parents
        assert json.loads(files.truth.read_text())["ocr"]


def test_demo_command_plays_the_clip_shipped_in_the_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not a path relative to the source checkout (gone after `pip install .`)."""
    from typer.testing import CliRunner

    from streamfuse import cli

    played: list[list[str]] = []

    def fake_run_main(inputs: list[str], *args: Any, **kwargs: Any) -> int:
        played.append(inputs)
        return 1  # stop before scoring: only the input path matters here

    monkeypatch.setattr(cli, "_run_main", fake_run_main)
    result = CliRunner().invoke(cli.app, ["demo", "--no-realtime", "--out", str(tmp_path / "e")])
    assert result.exit_code == 1, result.output
    (clip,) = played[0]
    assert Path(clip).is_file() and PACKAGE in Path(clip).resolve().parents
