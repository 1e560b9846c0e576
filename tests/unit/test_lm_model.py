"""The compact Gemma 3 model: equal to Hugging Face's, batch-invariant in int8, exact truncation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from streamfuse.lm.config import ModelConfig
from streamfuse.lm.gemma import Segment
from streamfuse.lm.kv_pool import KVPool
from streamfuse.lm.loader import load_model
from streamfuse.testing.tiny_lm import tiny_config, tiny_model

pytestmark = pytest.mark.unit


def _pool(model, slots: int = 4, max_tokens: int = 64) -> KVPool:
    return model.kv_pool(num_slots=slots, max_tokens=max_tokens)


def _full(model, ids: list[int], slot: int = 0, pool: KVPool | None = None) -> torch.Tensor:
    pool = pool or _pool(model)
    return model.forward(torch.tensor(ids), [Segment(slot, 0, len(ids))], pool)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Gemma3ForCausalLM saved as a Hugging Face folder."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Gemma3TextConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=16,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)  # HF stores w of the (1 + w) multiplier
            else:
                p.normal_(0.0, 0.2)
    out = tmp_path_factory.mktemp("hf-gemma")
    model.save_pretrained(out)
    ids = [2, *range(5, 29)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0]
    torch.save({"ids": ids, "logits": ref}, out / "ref.pt")
    return out


def test_matches_hugging_face_gemma3_on_a_sequence_longer_than_the_window(hf_dir: Path) -> None:
    model, tok = load_model(ModelConfig(source=str(hf_dir), weights="fp32"))
    assert tok is None  # no tokenizer.json in that folder
    assert json.loads((hf_dir / "config.json").read_text())["sliding_window"] == 8
    ref = torch.load(hf_dir / "ref.pt")
    ours = _full(model, ref["ids"])
    assert torch.allclose(ours, ref["logits"], atol=1e-4, rtol=1e-4)


def test_incremental_decode_equals_full_forward() -> None:
    model = tiny_model(weights="fp32")
    ids = list(range(3, 43))  # 40 rows: the prompt-chunk (fused attention) path
    pool = _pool(model)
    full = _full(model, ids, pool=pool)
    steps = [model.forward(torch.tensor([t]), [Segment(1, i, 1)], pool) for i, t in enumerate(ids)]
    assert torch.allclose(torch.cat(steps), full, atol=1e-5)


def test_chunked_prefill_across_the_window_equals_one_batched_forward() -> None:
    """Chunks as the live stage feeds them (short lines, a long one past the window, single
    tokens) give the batched forward's logits in float32: positions, RoPE offsets and the
    sliding-window mask with a cache are the same on both paths (only the order of float sums
    differs). The int8 path differs more (docs/token-dropping.md, "noise floor")."""
    model = tiny_model(weights="fp32")
    ids = [2, *range(3, 93)]  # 91 tokens, window 8
    pool = _pool(model, max_tokens=128)
    full = _full(model, ids, pool=pool)
    out, start = [], 0
    for size in (1, 5, 40, 1, 3, 33, 8):  # 40 and 33 rows: the fused (SDPA) chunk path at start > 0
        out.append(
            model.forward(torch.tensor(ids[start : start + size]), [Segment(1, start, size)], pool)
        )
        start += size
    assert start == len(ids)
    assert torch.allclose(torch.cat(out), full, atol=1e-5)


def test_int8_rows_do_not_depend_on_the_batch() -> None:
    """Per-row int8: a sequence's logits are bit-identical alone or batched with others."""
    model = tiny_model(weights="int8")
    pool = _pool(model)
    a, b = list(range(3, 15)), list(range(40, 52))
    alone = _full(model, a, slot=0, pool=pool)
    both = model.forward(torch.tensor(a + b), [Segment(1, 0, len(a)), Segment(2, 0, len(b))], pool)
    assert torch.equal(both[: len(a)], alone)


def test_compact_rerotation_equals_computing_the_kept_tokens_at_new_positions() -> None:
    """Sink + window truncation re-rotates keys: same cache as recomputing at the new positions."""
    model = tiny_model(weights="fp32")
    pool = _pool(model)
    ids = list(range(3, 33))  # 30 tokens
    _full(model, ids, slot=0, pool=pool)
    new_len = model.compact(pool, 0, len(ids), sink=2, keep=6)
    assert new_len == 8
    # The full layer (no window) sees exactly sinks + window: compare its keys with a slot
    # where only those 8 tokens were ever computed... keys depend on the token only (after the
    # layer-0 residual they depend on context), so check layer 0 keys, which are context-free.
    kept = ids[:2] + ids[-6:]
    _full(model, kept, slot=1, pool=pool)
    assert torch.allclose(pool.k[0][0, :, :8], pool.k[0][1, :, :8], atol=1e-5)
    assert torch.allclose(pool.v[0][0, :, :8], pool.v[0][1, :, :8], atol=1e-6)


def test_tiny_config_is_gemma_shaped() -> None:
    c = tiny_config()
    assert c.layer_types == ("sliding_attention", "full_attention")
    assert c.num_heads % c.num_kv_heads == 0


def test_loading_leaves_the_process_thread_count_alone(hf_dir: Path) -> None:
    """torch's thread count is process-wide: loading a model must not change it (the engine
    applies its own count on its own thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        load_model(ModelConfig(source=str(hf_dir), weights="fp32", threads=3))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
