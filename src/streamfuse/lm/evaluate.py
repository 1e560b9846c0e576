"""Scoring helpers: per-token negative log-likelihood of a text through one KV slot.

`stream_nll` feeds ids chunk by chunk into a slot exactly as the engine does (sink + window
truncation when the slot is full), so comparing a small slot against one that holds the whole
text measures what truncation costs in perplexity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from streamfuse.lm.gemma import GemmaModel, Segment


@torch.inference_mode()
def stream_nll(
    model: GemmaModel,
    ids: Sequence[int],
    *,
    max_tokens: int,
    sink_tokens: int = 4,
    window_tokens: int | None = None,
    chunk: int = 64,
) -> list[float]:
    """NLL (nats) of ids[1:], each predicted from what the slot holds at that point."""
    pool = model.kv_pool(num_slots=1, max_tokens=max_tokens)
    slot = pool.acquire()
    assert slot is not None
    keep = window_tokens if window_tokens is not None else (max_tokens * 3) // 4 - sink_tokens
    length = 0
    nll: list[float] = []
    pos = 0
    while pos < len(ids) - 1:
        n = min(chunk, len(ids) - 1 - pos, max_tokens - sink_tokens - keep)
        if length + n > max_tokens:
            length = model.compact(pool, slot.index, length, sink_tokens, keep)
        x = torch.tensor(ids[pos : pos + n])
        logits = model.forward(x, [Segment(slot.index, length, n)], pool)
        target = torch.tensor(ids[pos + 1 : pos + n + 1])
        nll.extend(F.cross_entropy(logits, target, reduction="none").tolist())
        length += n
        pos += n
    return nll


def perplexity(nll: Sequence[float]) -> float:
    return math.exp(sum(nll) / max(1, len(nll)))
