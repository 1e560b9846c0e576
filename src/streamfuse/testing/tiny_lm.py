"""A real Gemma 3 model at toy size with seeded random weights, for tests and examples.

Same code path as the bundled model (fused int8 or float32 linears, sliding and full layers,
GQA), small enough that a forward takes about a millisecond.
"""

from __future__ import annotations

import torch
from torch import Tensor

from streamfuse.lm.config import WeightFormat
from streamfuse.lm.gemma import FULL, SLIDING, GemmaConfig, GemmaModel
from streamfuse.lm.loader import model_from_state


def tiny_config(
    *,
    vocab_size: int = 96,
    hidden_size: int = 32,
    num_layers: int = 2,
    sliding_window: int = 8,
) -> GemmaConfig:
    """Two layers by default: one sliding-window layer (window 8) and one full layer."""
    kinds = tuple(FULL if i % 2 else SLIDING for i in range(num_layers))
    return GemmaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        layer_types=kinds,
        sliding_window=sliding_window,
        query_pre_attn_scalar=16.0,
        rope_theta=10_000.0,
        rope_local_theta=1_000.0,
        eos_token_ids=(1,),
    )


def tiny_state(config: GemmaConfig, seed: int = 0) -> dict[str, Tensor]:
    """Random runtime-named float tensors (norm multipliers folded, around 1)."""
    g = torch.Generator().manual_seed(seed)
    c = config

    def w(rows: int, cols: int) -> Tensor:
        return torch.randn(rows, cols, generator=g) / cols**0.5

    def norm(n: int) -> Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    state: dict[str, Tensor] = {
        "embed": torch.randn(c.vocab_size, c.hidden_size, generator=g),
        "final_norm": norm(c.hidden_size),
    }
    for i in range(c.num_layers):
        p = f"layers.{i}."
        state |= {
            p + "attn_norm": norm(c.hidden_size),
            p + "q_norm": norm(c.head_dim),
            p + "k_norm": norm(c.head_dim),
            p + "post_attn_norm": norm(c.hidden_size),
            p + "pre_ffn_norm": norm(c.hidden_size),
            p + "post_ffn_norm": norm(c.hidden_size),
            p + "q": w(c.num_heads * c.head_dim, c.hidden_size),
            p + "k": w(c.num_kv_heads * c.head_dim, c.hidden_size),
            p + "v": w(c.num_kv_heads * c.head_dim, c.hidden_size),
            p + "o": w(c.hidden_size, c.num_heads * c.head_dim),
            p + "gate": w(c.intermediate_size, c.hidden_size),
            p + "up": w(c.intermediate_size, c.hidden_size),
            p + "down": w(c.hidden_size, c.intermediate_size),
        }
    return state


def tiny_model(
    config: GemmaConfig | None = None, *, weights: WeightFormat = "int8", seed: int = 0
) -> GemmaModel:
    config = config or tiny_config()
    return model_from_state(config, tiny_state(config, seed), weights)


class CharTokenizer:
    """One id per character (ids 4..vocab-1), for the tiny model; 2 = <bos>, 1 = <eos>."""

    bos_id: int | None = 2
    eos_id: int | None = 1
    stop_ids: tuple[int, ...] = (1,)

    def __init__(self, vocab_size: int = 96) -> None:
        self.vocab_size = vocab_size

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        span = self.vocab_size - 4
        ids = [4 + (ord(ch) - 32) % span for ch in text]
        return [2, *ids] if add_bos else ids

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        return "".join(chr(32 + i - 4) for i in ids if i >= 4)
