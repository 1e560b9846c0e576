"""Resolution head (F14): generator, labels, network, BN folding, export, decision rule and the
shipped INT8 model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from streamfuse.errors import ConfigError
from streamfuse.qos.ladder import DEFAULT_LADDER
from streamfuse.vision.reshead import ResolutionHead
from streamfuse.vision.reshead.preprocess import space_to_depth, to_input
from streamfuse.vision.reshead.runtime import INT8_MODEL, METADATA
from tools.reshead.labels import guess_rung
from tools.reshead.model import (
    ResHeadNet,
    count_macs,
    count_params,
    fold_batchnorm,
)
from tools.reshead.synth import make_slide
from tools.reshead.train import choose_tau, export_onnx, pick_rungs, pick_stats

pytestmark = pytest.mark.unit

INPUT = (16, 36, 64)


def test_generator_is_deterministic_and_sizes_text_as_asked() -> None:
    a = make_slide(np.random.default_rng([7, 1]), 640, 360, min_text_px=(20, 24))
    b = make_slide(np.random.default_rng([7, 1]), 640, 360, min_text_px=(20, 24))
    assert a.lines == b.lines and np.array_equal(a.image, b.image)
    assert a.image.shape == (360, 640, 3) and a.image.dtype == np.uint8
    assert 20 <= a.min_text_px <= 24 and all(line.strip() for line in a.lines)
    with pytest.raises(ConfigError):
        make_slide(np.random.default_rng(0), min_text_px=(30, 20))


def test_guess_rung_grows_with_smaller_text() -> None:
    guesses = [guess_rung(DEFAULT_LADDER, px, 1920, 1080) for px in (72, 24, 14, 8)]
    assert guesses == sorted(guesses, reverse=True)
    assert guesses[0] == DEFAULT_LADDER.lowest


def test_network_is_small_and_counts_its_work() -> None:
    model = ResHeadNet()
    assert count_params(model) <= 100_000
    macs = count_macs(model, INPUT)
    assert 5e6 < macs < 60e6


def test_batchnorm_folding_preserves_outputs() -> None:
    torch.manual_seed(0)
    model = ResHeadNet().eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2.0)
            torch.nn.init.uniform_(m.weight, 0.5, 1.5)
            torch.nn.init.uniform_(m.bias, -0.5, 0.5)
    x = torch.randn(3, *INPUT)
    before = model(x)
    fold_batchnorm(model)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    assert torch.allclose(before, model(x), atol=1e-5)


def test_export_has_no_batchnorm_and_matches_torch(tmp_path: Path) -> None:
    import onnxruntime as ort

    torch.manual_seed(0)
    model = ResHeadNet().eval()
    x = torch.randn(1, *INPUT)
    expected = model(x).detach().numpy()
    ops = export_onnx(model, tmp_path / "head.onnx", (144, 256))
    assert "BatchNormalization" not in ops and "Conv" in ops
    sess = ort.InferenceSession(str(tmp_path / "head.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"thumb": x.numpy()})[0]
    assert np.allclose(got, expected, atol=1e-4)


def test_space_to_depth_matches_torch_pixel_unshuffle() -> None:
    x = np.random.default_rng(0).random((2, 8, 12)).astype(np.float32)
    ref = F.pixel_unshuffle(torch.from_numpy(x)[:, None], 4).numpy()
    assert np.array_equal(space_to_depth(x), ref)
    frame = np.zeros((1080, 1920, 3), np.uint8)
    assert to_input(frame).shape == (1, *INPUT)


def test_decision_rule_is_conservative_with_higher_tau() -> None:
    probs = np.array([[0.0, 0.0, 0.0, 0.0, 0.1, 0.3, 0.6], [0.5, 0.5, 0, 0, 0, 0, 0]])
    assert pick_rungs(probs, 0.5).tolist() == [6, 1]
    assert pick_rungs(probs, 0.9).tolist() == [5, 0]
    assert pick_rungs(probs, 1.0).tolist() == [4, 0]
    labels = np.array([5, 1])
    s = pick_stats(pick_rungs(probs, 0.9), labels, DEFAULT_LADDER)
    assert s.accuracy == 1.0 and s.exact == 0.5 and s.cost < 1.0
    assert choose_tau(probs, labels, DEFAULT_LADDER, target_accuracy=1.0) == 0.7


@pytest.mark.skipif(not INT8_MODEL.exists(), reason="model not trained yet")
def test_shipped_int8_head_prefers_larger_rungs_for_smaller_text() -> None:
    head = ResolutionHead()
    assert head.ladder == DEFAULT_LADDER and METADATA.exists()
    big = [make_slide(np.random.default_rng([99, i]), min_text_px=(60, 72)) for i in range(4)]
    small = [make_slide(np.random.default_rng([98, i]), min_text_px=(12, 13)) for i in range(4)]
    big_idx = [head.predict(s.image).rung_index for s in big]
    small_idx = [head.predict(s.image).rung_index for s in small]
    # Large text allows small rungs (high index); tiny text needs large ones.
    assert np.mean(big_idx) >= np.mean(small_idx) + 2, (big_idx, small_idx)
    pred = head.predict(big[0].image)
    assert pred.p_correct >= head.tau and abs(sum(pred.probs) - 1.0) < 1e-4
    assert head.det_side_px(big[0].image) <= 1920


@pytest.mark.slow
def test_labeler_reads_a_large_text_slide_at_the_lowest_rung() -> None:
    from tools.reshead.labels import RungLabeler

    slide = make_slide(np.random.default_rng([5, 5]), min_text_px=(60, 64))
    res = RungLabeler(threads=1).label(slide.image, slide.lines, start=DEFAULT_LADDER.lowest)
    assert res.readable and res.label == DEFAULT_LADDER.lowest
