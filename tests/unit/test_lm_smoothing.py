"""SmoothQuant-style balancing (lm/smoothing.py): the float function stays, int8 gets closer."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from streamfuse.lm.gemma import GemmaModel, Segment
from streamfuse.lm.loader import build_weights, fuse, model_from_state, quantize, weights_name
from streamfuse.lm.smoothing import activation_maxima, calibration_chunks, smooth
from streamfuse.testing.tiny_lm import CharTokenizer, tiny_config, tiny_state

pytestmark = pytest.mark.unit

TEXT = "The quick brown fox jumps over the lazy dog, then naps: 12 ms, 3.5 s, 42%."


def _outlier_state(seed: int = 0) -> tuple[object, dict[str, torch.Tensor]]:
    """A tiny model with Gemma-like outlier channels at every linear's input: a few hidden
    channels amplified by the norms (qkv, gate/up inputs), a few value and up rows (o and down
    inputs)."""
    config = tiny_config()
    state = tiny_state(config, seed)
    c = config
    for i in range(c.num_layers):
        p = f"layers.{i}."
        for norm in ("attn_norm", "pre_ffn_norm"):
            state[p + norm][[3, 17]] *= 40.0
        state[p + "v"][[5, 21]] *= 30.0
        state[p + "up"][[7, 40]] *= 30.0
    return config, state


def _logits(model: GemmaModel, ids: list[int]) -> torch.Tensor:
    pool = model.kv_pool(num_slots=1, max_tokens=len(ids))
    return model.forward(torch.tensor(ids), [Segment(0, 0, len(ids))], pool)


def _kl(logits: torch.Tensor, ref: torch.Tensor) -> float:
    lp, lr = F.log_softmax(logits, -1), F.log_softmax(ref, -1)
    return float(F.kl_div(lp, lr, log_target=True, reduction="none").sum(-1).mean())


def test_smoothing_leaves_the_float_function_unchanged() -> None:
    config, state = _outlier_state()
    fused = fuse(state, config)
    chunks = calibration_chunks(CharTokenizer(), max_tokens=64)
    maxima = activation_maxima(build_weights(fused, config), config, chunks)
    smoothed = smooth(fused, config, maxima, 0.7)
    # It did change the weights (otherwise the check below says nothing)...
    assert not torch.allclose(smoothed["layers.0.down.weight"], fused["layers.0.down.weight"])
    assert not torch.allclose(smoothed["layers.1.qkv.weight"], fused["layers.1.qkv.weight"])
    ids = [2, *CharTokenizer().encode(TEXT)]
    plain = _logits(GemmaModel(config, build_weights(fused, config)), ids)
    balanced = _logits(GemmaModel(config, build_weights(smoothed, config)), ids)
    # ...but not what the float model computes (GQA: o's scale is shared per KV group).
    assert torch.allclose(balanced, plain, rtol=1e-4, atol=1e-4 * float(plain.abs().max()))


def test_smoothed_int8_logits_are_closer_to_float_than_plain_int8() -> None:
    config, state = _outlier_state()
    tok = CharTokenizer()
    chunks = calibration_chunks(tok, max_tokens=64)  # generic text, not the input below
    ids = [2, *tok.encode(TEXT)]
    ref = _logits(model_from_state(config, state, "fp32"), ids)
    plain = _logits(model_from_state(config, state, "int8"), ids)
    smoothed = _logits(
        model_from_state(config, state, "int8", calibration=chunks, smooth_alpha=0.7), ids
    )
    kl_plain, kl_smooth = _kl(plain, ref), _kl(smoothed, ref)
    assert kl_smooth < 0.5 * kl_plain, (kl_smooth, kl_plain)


def test_activation_maxima_see_the_outlier_channels() -> None:
    config, state = _outlier_state()
    maxima = activation_maxima(
        build_weights(fuse(state, config), config), config, calibration_chunks(CharTokenizer())
    )
    qkv_in = maxima["layers.0.qkv"]
    assert set(torch.topk(qkv_in, 2).indices.tolist()) == {3, 17}
    assert set(maxima) == {
        f"layers.{i}.{n}" for i in range(2) for n in ("qkv", "o", "gate_up", "down")
    }


def test_no_calibration_or_alpha_zero_is_plain_int8() -> None:
    config, state = _outlier_state()
    plain = quantize(fuse(state, config))
    chunks = calibration_chunks(CharTokenizer(), max_tokens=64)
    off = model_from_state(config, state, "int8", calibration=chunks, smooth_alpha=0.0)
    assert torch.equal(off.weights.layers[0].down.qweight, plain["layers.0.down.qweight"])  # type: ignore[union-attr]


def test_smoothed_conversions_have_their_own_cache_file() -> None:
    assert weights_name("int8", 0.0) == "weights-int8.safetensors"
    assert weights_name("fp32", 0.7) == "weights-fp32.safetensors"
    name = weights_name("int8", 0.7)
    assert name.startswith("weights-int8-smooth0.7-") and name != weights_name("int8", 0.5)


def test_alpha_out_of_range_is_refused() -> None:
    config, state = _outlier_state()
    fused = fuse(state, config)
    with pytest.raises(ValueError, match="alpha"):
        smooth(fused, config, {}, 1.5)
