"""SmoothQuant-style balancing of activation outliers before int8 quantization.

Per-row int8 activations take each row's absmax as its scale; Gemma's few outlier channels
make that scale 26-143x a row's median, so most values round to a handful of levels (the
down projection's input rounded ~35% of its values to 0). Each linear's input channel j is
divided by s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) and its weight column multiplied by
s_j: the float function is unchanged, the activation's outliers shrink and the weight takes
part of them. 1/s is folded into what produces the input, exactly (no extra work at run time):
the RMSNorm multiplier before qkv and gate/up, the value rows of qkv before o (attention is
linear in the values; heads of one KV group share the scale), the up rows before down (GeGLU
is linear in up). The output head, tied to the embedding, is left alone (its input norm feeds
only the head, but smoothing it would need a second 168 MB copy of the table).

max|X_j| comes from an fp32 forward over generic calibration text (`calibration.txt`: prose,
notes, code, dialogue; none of the evaluation sets), once, when the int8 conversion is made.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from streamfuse.lm.gemma import GemmaConfig, GemmaModel, GemmaWeights, Segment
from streamfuse.lm.quant import DenseLinear
from streamfuse.lm.tokenizer import TextCodec

CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")
#: Migration strength: 0 leaves activations as they are, 1 moves all of their range into the
#: weights. Chosen on int8-vs-fp32 KL of the evaluation context (docs/token-dropping.md).
DEFAULT_ALPHA = 0.5
#: The linears smoothed, by runtime name.
LINEARS = ("qkv", "o", "gate_up", "down")


class _Recorder(DenseLinear):
    """A float linear that keeps the running per-input-channel absmax of what it sees."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__(weight)
        self.amax = torch.zeros(self.in_features)

    def __call__(self, x: Tensor) -> Tensor:
        torch.maximum(self.amax, x.detach().abs().amax(dim=0), out=self.amax)
        return super().__call__(x)


def calibration_chunks(tokenizer: TextCodec, max_tokens: int = 512) -> list[list[int]]:
    """The calibration text as token id chunks of at most `max_tokens` (paragraph-aligned)."""
    encode = tokenizer.encode
    chunks: list[list[int]] = []
    cur: list[int] = []
    for para in CALIBRATION_TEXT.read_text().split("\n\n"):
        ids = list(encode(para.strip() + "\n\n"))
        if cur and len(cur) + len(ids) > max_tokens:
            chunks.append(cur)
            cur = []
        cur += ids[:max_tokens]
    if cur:
        chunks.append(cur)
    return chunks


@torch.inference_mode()
def activation_maxima(
    weights: GemmaWeights, config: GemmaConfig, chunks: Iterable[Sequence[int]]
) -> dict[str, Tensor]:
    """Per-input-channel absmax of each linear's input (`layers.{i}.{name}`) over an fp32
    forward of each id chunk (float `weights`, e.g. `loader.build_weights` of the fused
    runtime-format tensors; its linears are swapped for recorders, so pass a throwaway)."""
    recorders: dict[str, _Recorder] = {}
    for i, lw in enumerate(weights.layers):
        for name in LINEARS:
            rec = _Recorder(getattr(lw, name).dense_weight())
            setattr(lw, name, rec)
            recorders[f"layers.{i}.{name}"] = rec
    model = GemmaModel(config, weights, fused=False)
    for ids in chunks:
        n = len(ids)
        if n == 0:
            continue
        pool = model.kv_pool(num_slots=1, max_tokens=n)
        model.forward(torch.tensor(list(ids)), [Segment(0, 0, n)], pool, return_hidden=True)
    return {k: r.amax.clone() for k, r in recorders.items()}


def _scale(x_max: Tensor, w_max: Tensor, alpha: float) -> Tensor:
    s = x_max.clamp_min(1e-5).pow(alpha) / w_max.clamp_min(1e-5).pow(1.0 - alpha)
    # A channel the calibration never lit (or an all-zero column) keeps its scale.
    return torch.where((x_max > 0) & (w_max > 0), s, torch.ones_like(s))


def smooth(
    fused: dict[str, Tensor],
    config: GemmaConfig,
    maxima: dict[str, Tensor],
    alpha: float = DEFAULT_ALPHA,
) -> dict[str, Tensor]:
    """`fused` with every linear's input balanced by `maxima` (see the module docstring): the
    same float function (up to rounding), smaller activation outliers. Returns new tensors."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    out = dict(fused)
    c = config
    q_width, kv_width = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    group = c.num_heads // c.num_kv_heads
    for i in range(c.num_layers):
        p = f"layers.{i}."
        # Inputs that an RMSNorm multiplier produces: qkv, gate_up.
        for lin, norm in (("qkv", "attn_norm"), ("gate_up", "pre_ffn_norm")):
            w = fused[p + lin + ".weight"]
            s = _scale(maxima[p + lin], w.abs().amax(dim=0), alpha)
            out[p + lin + ".weight"] = w * s[None, :]
            out[p + norm] = fused[p + norm] / s
        # o's input is attention over the values: one scale per (kv head, dim), shared by the
        # query heads of the group, divided out of the value rows of qkv.
        wo = fused[p + "o.weight"]
        x_g = maxima[p + "o"].view(c.num_kv_heads, group, c.head_dim).amax(dim=1)
        w_g = wo.abs().amax(dim=0).view(c.num_kv_heads, group, c.head_dim).amax(dim=1)
        s_kv = _scale(x_g, w_g, alpha)  # (kv, d)
        s_o = s_kv[:, None, :].expand(c.num_kv_heads, group, c.head_dim).reshape(-1)
        out[p + "o.weight"] = wo * s_o[None, :]
        qkv = out[p + "qkv.weight"].clone()
        qkv[q_width + kv_width :] /= s_kv.reshape(-1)[:, None]
        out[p + "qkv.weight"] = qkv
        # down's input is gelu(gate) * up: divide the up rows.
        wd = fused[p + "down.weight"]
        s = _scale(maxima[p + "down"], wd.abs().amax(dim=0), alpha)
        out[p + "down.weight"] = wd * s[None, :]
        gu = out[p + "gate_up.weight"].clone()
        gu[c.intermediate_size :] /= s[:, None]
        out[p + "gate_up.weight"] = gu
    return out
