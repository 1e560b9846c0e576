"""Static INT8 quantization through the shared calibration reader (the resolution head's
committed FP32 model, a few random thumbnails): the result loads and runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamfuse.vision.reshead.runtime import FP32_MODEL as HEAD
from tools.onnx_quant import calibration_reader
from tools.reshead import train

pytestmark = pytest.mark.unit


def test_reader_hands_out_feeds_then_stops() -> None:
    feeds = [{"x": np.zeros(2)}, {"x": np.ones(2)}]
    r = calibration_reader(iter(feeds))
    assert r.get_next() is feeds[0] and r.get_next() is feeds[1] and r.get_next() is None


def test_head_quantizes_with_the_shared_reader(tmp_path: Path) -> None:
    import onnxruntime as ort

    thumbs = np.random.default_rng(0).integers(0, 256, (4, 144, 256), dtype=np.uint8)
    out = tmp_path / "head.int8.onnx"
    train.quantize(HEAD, out, thumbs)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    x = train.model_input(thumbs[:1])
    (y,) = sess.run(None, {sess.get_inputs()[0].name: x})
    assert y.shape[0] == 1 and np.isfinite(y).all()
