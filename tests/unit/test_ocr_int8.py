"""Choosing the INT8 OCR models: used only when built from the models rapidocr loaded."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from streamfuse.vision.ocr import INT8_DIR, int8_model_paths

pytestmark = pytest.mark.unit


def fake_rapid(det_path: Path, rec_path: Path) -> SimpleNamespace:
    def model(path: Path) -> SimpleNamespace:
        return SimpleNamespace(session=SimpleNamespace(session=SimpleNamespace(_model_path=path)))

    return SimpleNamespace(text_det=model(det_path), text_rec=model(rec_path))


def write_folder(folder: Path, source: Path, sha: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    digest = sha or hashlib.sha256(source.read_bytes()).hexdigest()
    (folder / "det.onnx").write_bytes(b"int8 model")
    manifest = {"sources": {"det": {"file": source.name, "sha256": digest}}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_matching_source_gives_our_file(tmp_path: Path) -> None:
    det = tmp_path / "det_fp32.onnx"
    det.write_bytes(b"fp32 detector")
    write_folder(tmp_path / "int8", det)
    paths = int8_model_paths(fake_rapid(det, tmp_path / "rec.onnx"), tmp_path / "int8")
    assert paths == {"det": tmp_path / "int8" / "det.onnx"}


def test_other_source_model_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    det = tmp_path / "det_fp32.onnx"
    det.write_bytes(b"a newer rapidocr detector")
    write_folder(tmp_path / "int8", det, sha="0" * 64)
    with caplog.at_level(logging.WARNING):
        assert int8_model_paths(fake_rapid(det, det), tmp_path / "int8") is None
    assert "reading in FP32" in caplog.text and "det_fp32.onnx" in caplog.text


def test_missing_folder_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    det = tmp_path / "det.onnx"
    det.write_bytes(b"x")
    with caplog.at_level(logging.WARNING):
        assert int8_model_paths(fake_rapid(det, det), tmp_path / "nothing") is None
    assert "INT8 OCR models unavailable" in caplog.text


def test_shipped_manifest_names_the_detector() -> None:
    manifest = json.loads((INT8_DIR / "manifest.json").read_text())
    assert set(manifest["sources"]) == {"det"}
    assert (INT8_DIR / "det.onnx").stat().st_size > 1_000_000
    assert (
        manifest["files"]["det.onnx"]
        == hashlib.sha256((INT8_DIR / "det.onnx").read_bytes()).hexdigest()
    )
