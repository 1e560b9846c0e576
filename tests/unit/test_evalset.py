"""Finding an evaluation set's items and their splits, and pooling their scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamfuse.errors import EvalError
from streamfuse.evalset import _pooled, _Samples, find_items
from streamfuse.text import wer, word_errors

pytestmark = pytest.mark.unit


def _item(folder: Path, name: str, suffix: str = ".mp4") -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}{suffix}").write_bytes(b"")
    (folder / f"{name}.truth.json").write_text("{}")


def test_items_take_their_split_from_the_manifest_or_their_folder(tmp_path: Path) -> None:
    _item(tmp_path / "dev", "a")
    _item(tmp_path / "heldout", "b", ".mkv")
    _item(tmp_path / "speech", "c", ".ogg")
    _item(tmp_path / "speech", "d", ".ogg")
    manifest = {"clips": [{"name": "c", "split": "heldout"}, {"name": "d"}]}
    (tmp_path / "speech" / "set.json").write_text(json.dumps(manifest))
    items = find_items(tmp_path)
    assert [(i.name, i.split, i.media.suffix) for i in items] == [
        ("a", "dev", ".mp4"),
        ("b", "heldout", ".mkv"),
        ("c", "heldout", ".ogg"),
        ("d", "speech", ".ogg"),
    ]


def test_a_truth_without_media_or_an_empty_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(EvalError, match="no .*truth.json files"):
        find_items(tmp_path)
    (tmp_path / "lonely.truth.json").write_text("{}")
    with pytest.raises(EvalError, match="lonely.truth.json: no media file lonely"):
        find_items(tmp_path)
    with pytest.raises(EvalError, match="not a folder"):
        find_items(tmp_path / "lonely.truth.json")


def test_set_figures_pool_edits_not_average_rates() -> None:
    rows = [
        {"ocr_edits": 1, "ocr_chars": 100, "asr_edits": 5, "asr_words": 10},
        {"ocr_edits": 9, "ocr_chars": 10, "asr_edits": 0, "asr_words": 90},
    ]
    samples = [_Samples([100.0], [], [500.0, 700.0]), _Samples([300.0], [], [900.0])]
    pooled = _pooled(rows, samples)
    assert pooled["ocr_cer"] == pytest.approx(10 / 110)  # not the mean of 1% and 90%
    assert pooled["asr_wer"] == pytest.approx(5 / 100)
    assert pooled["word_ms_p50"] == 700.0
    assert "asr_ms_p50" not in pooled


def test_word_errors_count_substitutions_deletions_insertions() -> None:
    assert word_errors("the cat sat on the mat", "the cat sit on mat mat too") == (3, 6)
    assert wer("the cat sat on the mat", "the cat sit on mat mat too") == 0.5
    assert wer("", "") == 0.0 and wer("", "noise") == 1.0 and wer("words here", "") == 1.0


def test_a_missing_stream_the_truth_does_not_score_is_not_an_item_error(tmp_path: Path) -> None:
    from streamfuse.app import NO_AUDIO_NOTE, NO_VIDEO_NOTE
    from streamfuse.evalset import EvalItem, score_item
    from streamfuse.frames import ErrorFrame

    def error(message: str) -> dict:
        return ErrorFrame(stream_id="s", stage="input", message=message).to_record()

    slides_only = tmp_path / "slides.truth.json"
    slides_only.write_text(
        json.dumps({"duration_s": 5, "ocr": [{"t_start": 0, "t_end": 5, "lines": ["Hi"]}]})
    )
    speech_only = tmp_path / "speech.truth.json"
    speech_only.write_text(
        json.dumps({"duration_s": 5, "asr": [{"t_start": 0, "t_end": 5, "text": "hi"}]})
    )
    records = [
        error(f"clip.mp4: {NO_AUDIO_NOTE}"),
        error(f"clip.mp4: {NO_VIDEO_NOTE}"),
        error("clip.mp4: a corrupt packet was skipped"),
    ]
    for truth, kept in (
        (slides_only, [f"clip.mp4: {NO_VIDEO_NOTE}", "clip.mp4: a corrupt packet was skipped"]),
        (speech_only, [f"clip.mp4: {NO_AUDIO_NOTE}", "clip.mp4: a corrupt packet was skipped"]),
    ):
        item = EvalItem(name="clip", media=tmp_path / "clip.mp4", truth=truth, split="dev")
        row = score_item(item, records, video=True, audio=False)
        assert row["errors"] == kept
