"""A compact Gemma 3 text model whose attention reads and writes the engine's KV slot pool.

One `forward` runs a flat batch: the new tokens of several sequences concatenated into one
(rows, hidden) matrix (decode rows, speculative drafts and prefill chunks mixed), described by
`Segment`s (slot, start, length). Linear layers see every row at once; attention runs per
segment against that segment's slot. Positions are slot indices: a sink+window truncation
re-rotates the kept keys (`compact`, `compact_positions`), so positions never exceed the slot
size. A `DropPlan` (lm/dropping.py) makes one segment's rows leave the forward after early
layers (F18); the survivors continue at compact positions and the earlier layers' cache rows
are moved and re-rotated to match, so the slot ends up as if only the kept tokens had run.

Architecture (Gemma 3): RMSNorm with a (1 + w) multiplier (stored folded), q/k RMSNorm, GQA,
sliding-window layers (local RoPE base) and full layers (global RoPE base), GeGLU (tanh GELU),
pre- and post-norms around attention and MLP, embeddings scaled by sqrt(hidden), tied head.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from streamfuse.lm.kernels import EVERY_CALL
from streamfuse.lm.kv_pool import KVPool
from streamfuse.lm.quant import DenseLinear, Int8Linear, Linear

if TYPE_CHECKING:
    from streamfuse.lm.dropping import AttentionObserver, DropPlan

log = logging.getLogger(__name__)

SLIDING = "sliding_attention"
_SDPA_MIN_ROWS = 32
FULL = "full_attention"


@dataclass(frozen=True, slots=True)
class GemmaConfig:
    """Shape and numerics of a Gemma 3 text model."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_local_theta: float = 10_000.0
    rope_linear_factor: float = 1.0
    sliding_window: int = 512
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    max_position_embeddings: int = 32768
    bos_token_id: int = 2
    eos_token_ids: tuple[int, ...] = (1,)
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries, expected {self.num_layers}"
            )
        bad = set(self.layer_types) - {SLIDING, FULL}
        if bad:
            raise ValueError(f"unknown layer types {sorted(bad)}; expected {SLIDING!r}/{FULL!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} not a multiple of {self.num_kv_heads}")

    @staticmethod
    def pattern(num_layers: int, every: int = 6) -> tuple[str, ...]:
        """Gemma 3's layer pattern: every `every`-th layer is full attention."""
        return tuple(FULL if (i + 1) % every == 0 else SLIDING for i in range(num_layers))

    def to_dict(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(slots=True)
class LayerWeights:
    attn_norm: Tensor  # folded (1 + w) multipliers
    q_norm: Tensor
    k_norm: Tensor
    post_attn_norm: Tensor
    pre_ffn_norm: Tensor
    post_ffn_norm: Tensor
    qkv: Linear  # fused q, k, v projections
    o: Linear
    gate_up: Linear  # fused gate and up projections
    down: Linear


@dataclass(slots=True)
class GemmaWeights:
    embed: DenseLinear | Int8Linear  # token embedding; also the output head (tied)
    final_norm: Tensor
    layers: list[LayerWeights] = field(default_factory=list)

    @property
    def output(self) -> Linear:
        """The output head: Gemma 3 ties it to the token embedding (an untied file is refused
        by the loader)."""
        return self.embed

    def nbytes(self) -> int:
        total = self.embed.nbytes() + self.final_norm.numel() * 4
        for lw in self.layers:
            total += sum(lin.nbytes() for lin in (lw.qkv, lw.o, lw.gate_up, lw.down))
            total += sum(
                t.numel() * 4
                for t in (
                    lw.attn_norm,
                    lw.q_norm,
                    lw.k_norm,
                    lw.post_attn_norm,
                    lw.pre_ffn_norm,
                    lw.post_ffn_norm,
                )
            )
        return total


@dataclass(frozen=True, slots=True)
class Segment:
    """`length` new tokens of the sequence in `slot`, at slot positions start .. start+length-1."""

    slot: int
    start: int
    length: int
    #: Rows computed exactly as one-token decode steps would be (draft verification, so that
    #: speculative output is bit-identical to greedy); prompt rows attend as one batch.
    exact_rows: bool = False


def _rope_tables(
    theta: float, head_dim: int, positions: int, factor: float
) -> tuple[Tensor, Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    t = torch.arange(positions, dtype=torch.float64) / factor
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    # rotate_half(x) = roll(x, d/2) * (-1 on the first half): the sign is folded into sin.
    sign = torch.cat([-torch.ones(head_dim // 2), torch.ones(head_dim // 2)]).double()
    return emb.cos().float().contiguous(), (emb.sin() * sign).float().contiguous()


def _rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


class GemmaModel:
    """Gemma 3 text forward over the slot pool. Not thread-safe: one engine thread drives it."""

    #: Per instruction set of the compiled int8 product, the most rows a call sends to it
    #: (`benchmarks/int8_gemv.py`). AVX-512 VNNI: up to 8 rows it beats oneDNN's on every layer
    #: shape, past that oneDNN's blocked GEMM (AMX where present) wins; the output head (168
    #: MB, read from memory every call) stays ahead up to twice that: draft verification's 9
    #: rows (1 + `max_draft` 8) take it too. AVX2: every call, prompt chunks included: without
    #: VNNI, torch._int_mm runs ATen's own int8 kernel, 13-35x slower at 1 to 512 rows.
    GEMV_MAX_ROWS = {"avx512_vnni": 8, "avx2": EVERY_CALL}
    GEMV_MAX_ROWS_HEAD = {"avx512_vnni": 16, "avx2": EVERY_CALL}

    def __init__(self, config: GemmaConfig, weights: GemmaWeights, fused: bool = True) -> None:
        """`fused`: run int8 layers through the compiled kernels (`lm.kernels`) when they can
        be built here; same math as the eager ops, ~4x fewer calls per layer."""
        self.config = config
        self.weights = weights
        self.scale = config.query_pre_attn_scalar**-0.5
        self.embed_scale = math.sqrt(config.hidden_size)
        self._rope_len = 0
        self._rope: dict[str, tuple[Tensor, Tensor]] = {}
        c = config
        # q/k RMSNorm multipliers of all heads side by side; the queries' also carry the
        # attention scale, so scores need no separate scaling pass.
        self._qk_norm = [
            torch.cat(
                [
                    (lw.q_norm * self.scale).expand(c.num_heads, -1),
                    lw.k_norm.expand(c.num_kv_heads, -1),
                ]
            )
            for lw in weights.layers
        ]
        self._kernels: Any = None
        #: Sees every explicit attention's probability mass per key (H2O accumulation, F17);
        #: while set, prompt chunks take the explicit path too (SDPA hides the weights).
        self.observer: AttentionObserver | None = None
        self._observing = 0  # slot whose attention runs now
        self._last_q: Tensor | None = None  # queries of the layer that ran last (dropping)
        # Per layer (qkv, o, gate_up, down) when every linear is int8: what the kernels run.
        self._int8: list[tuple[Int8Linear, Int8Linear, Int8Linear, Int8Linear]] = []
        for lw in weights.layers:
            lins = (lw.qkv, lw.o, lw.gate_up, lw.down)
            if not all(isinstance(lin, Int8Linear) for lin in lins):
                self._int8 = []
                break
            self._int8.append(lins)  # type: ignore[arg-type]  # narrowed by the check above
        if fused and self._int8:
            from streamfuse.lm.kernels import load_kernels

            self._kernels = load_kernels()
        #: The compiled int8 product (AVX-512 VNNI, or AVX2: `gemv_isa`) serves calls of at
        #: most this many rows (decoding, batched decoding, draft verification); longer prompt
        #: chunks go to torch._int_mm (oneDNN, AMX where present). Both are exact, so which one
        #: ran never shows in a token.
        self.gemv_isa = self._gemv_isa()
        self.gemv_rows = self.GEMV_MAX_ROWS.get(self.gemv_isa, 0)
        self.gemv_head_rows = self.GEMV_MAX_ROWS_HEAD.get(self.gemv_isa, 0)

    def _gemv_isa(self) -> str:
        """The compiled product's instruction set, or "" where it cannot serve these weights:
        the AVX2 form is exact for weights in [-127, 127] only (what `quantize_rows` makes)."""
        isa: str = self._kernels.int8_gemv_isa() if self._kernels is not None else ""
        head = self.weights.output
        lins = [lin for lins in self._int8 for lin in lins]
        if isinstance(head, Int8Linear):
            lins.append(head)
        if isa == "avx2" and not all(lin.symmetric for lin in lins):
            log.info("int8 weights hold -128: the AVX2 product would not be exact; not used")
            return ""
        return isa

    @property
    def fused(self) -> bool:
        """Whether the layers run through the compiled kernels."""
        return self._kernels is not None

    # -- helpers -----------------------------------------------------------------------------
    def _ensure_rope(self, positions: int) -> None:
        if positions <= self._rope_len:
            return
        n = max(positions, 2 * self._rope_len, 256)
        c = self.config
        self._rope = {
            FULL: _rope_tables(c.rope_theta, c.head_dim, n, c.rope_linear_factor),
            SLIDING: _rope_tables(c.rope_local_theta, c.head_dim, n, 1.0),
        }
        self._rope_len = n

    def _norm(self, x: Tensor, w: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.config.rms_norm_eps)

    def embed(self, ids: Tensor) -> Tensor:
        return self.weights.embed.rows(ids).mul_(self.embed_scale)

    def kv_pool(self, *, num_slots: int, max_tokens: int) -> KVPool:
        """A KV-cache pool shaped for this model: `num_slots` sequences of `max_tokens`."""
        c = self.config
        return KVPool(
            num_layers=c.num_layers,
            num_slots=num_slots,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            max_tokens=max_tokens,
        )

    # -- forward -----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        ids: Tensor,
        segments: Sequence[Segment],
        pool: KVPool,
        out_rows: Tensor | None = None,
        return_hidden: bool = False,
        greedy: bool = False,
        drop: DropPlan | None = None,
    ) -> Tensor:
        """Run `ids` (1-D, concatenated segments) and return logits of `out_rows` (all if None).

        `drop`: hierarchical token dropping (F18) for a single segment: after each of
        `drop.layers` the rows it does not keep leave the forward (later layers compute only
        the kept rows, at compact positions), and at the end every layer's cache holds exactly
        the kept rows at slot positions start .. start+kept-1 (`DropPlan.kept`). `out_rows`
        then index the kept rows.

        `greedy`: return each row's most likely next token id instead of its logits (cheaper:
        the int8 head skips a pass over the vocabulary; softcapping is monotonic).

        Writes each segment's keys/values into its slot at positions start .. start+length-1;
        the caller owns slot lengths (set them after a successful forward).
        """
        c = self.config
        rows = int(ids.shape[0])
        if rows != sum(s.length for s in segments):
            raise ValueError(f"{rows} ids but segments cover {sum(s.length for s in segments)}")
        max_end = max(s.start + s.length for s in segments)
        if max_end > pool.max_tokens:
            raise ValueError(f"segment ends at {max_end} > slot size {pool.max_tokens}")
        self._ensure_rope(max_end)
        s0 = segments[0]
        if len(segments) == 1:
            pos = torch.arange(s0.start, s0.start + s0.length)
            slot_idx = torch.full((rows,), s0.slot, dtype=torch.long)
        else:
            pos = torch.cat([torch.arange(s.start, s.start + s.length) for s in segments])
            slot_idx = torch.cat(
                [torch.full((s.length,), s.slot, dtype=torch.long) for s in segments]
            )
        rope = {
            kind: (cos.index_select(0, pos), sin.index_select(0, pos))
            for kind, (cos, sin) in self._rope.items()
        }
        H, KV, D = c.num_heads, c.num_kv_heads, c.head_dim
        q_width, kv_width = H * D, KV * D

        x = self.embed(ids)
        if drop is not None:
            if len(segments) != 1:
                raise ValueError("token dropping runs on one segment at a time")
            drop.begin(rows)
            # Layouts[li]: which of the segment's rows sit at start.. in layer li's cache.
            layouts: list[Tensor] = []
            if -1 in drop.layers:
                x, segments, pos, slot_idx, rope = self._drop_rows(-1, x, drop, pool, s0)
        for li, lw in enumerate(self.weights.layers):
            kind = c.layer_types[li]
            cos, sin = rope[kind]
            if drop is not None:
                layouts.append(drop.layout)
            if self._kernels is not None:
                x = self._fused_layer(li, lw, x, cos, sin, segments, pool, slot_idx, pos)
                if drop is not None and li in drop.layers:
                    x, segments, pos, slot_idx, rope = self._drop_rows(
                        li, x, drop, pool, segments[0]
                    )
                continue
            alive = x.shape[0]  # fewer than `rows` once a DropPlan has cut
            h = self._norm(x, lw.attn_norm)
            qkv = lw.qkv(h)
            # q and k heads side by side: one RMSNorm (per-head multipliers) and one RoPE.
            qk = qkv[:, : q_width + kv_width].view(alive, H + KV, D)
            qk = F.rms_norm(qk, (D,), None, c.rms_norm_eps).mul_(self._qk_norm[li])
            rot = torch.roll(qk, D // 2, dims=-1)  # (x2, x1); rotate_half's sign is in `sin`
            qk = qk.mul_(cos[:, None, :]).addcmul_(rot, sin[:, None, :])
            q, k = qk[:, :H], qk[:, H:]
            v = qkv[:, q_width + kv_width :].view(alive, KV, D)
            # Write K/V in place: the pool tensors are (slots, kv, tokens, dim); index the
            # (slots, tokens) pair through a permuted view so no copy is made.
            pool.k[li].permute(0, 2, 1, 3).index_put_((slot_idx, pos), k)
            pool.v[li].permute(0, 2, 1, 3).index_put_((slot_idx, pos), v)
            attn = self._attention(li, q, segments, pool)
            x = x + self._norm(lw.o(attn), lw.post_attn_norm)
            h = self._norm(x, lw.pre_ffn_norm)
            gate, up = lw.gate_up(h).chunk(2, dim=-1)
            x = x + self._norm(lw.down(F.gelu(gate, approximate="tanh").mul_(up)), lw.post_ffn_norm)
            if drop is not None and li in drop.layers:
                self._last_q = q
                x, segments, pos, slot_idx, rope = self._drop_rows(li, x, drop, pool, segments[0])

        if drop is not None:
            self._settle_layouts(pool, segments[0], layouts, drop.layout)
        x = self._norm(x, self.weights.final_norm)
        if drop is not None and out_rows is None:
            out_rows = torch.tensor([x.shape[0] - 1])  # the end of the (always kept) query
        if out_rows is not None:
            x = x.index_select(0, out_rows)
        if return_hidden:
            return x
        head = self.weights.output
        if greedy:
            if self._kernels is not None and isinstance(head, Int8Linear):
                xq, _ = head.quantize_input(x)
                acc = self._int8_product(xq, head, self.gemv_head_rows)
                return self._kernels.argmax_scaled(acc, head.scale)
            return head.argmax(x)
        if isinstance(head, Int8Linear) and x.shape[0] <= self.gemv_head_rows:
            xq, amax = head.quantize_input(x)  # Int8Linear.__call__ with the compiled product
            logits = head.rescale(self._int8_product(xq, head, self.gemv_head_rows), amax)
        else:
            logits = head(x)
        if c.final_logit_softcapping is not None:
            cap = c.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def _attention(self, li: int, q: Tensor, segments: Sequence[Segment], pool: KVPool) -> Tensor:
        """Each segment's queries (rows, H, D) against its slot's cache in layer `li`; returns
        (rows, H*D)."""
        c = self.config
        window = c.sliding_window if c.layer_types[li] == SLIDING else None
        if len(segments) == 1:
            s0 = segments[0]
            self._observing = s0.slot
            return self._attend(
                q, pool.k[li][s0.slot], pool.v[li][s0.slot], s0.start, window, s0.exact_rows
            )
        attn = torch.empty(q.shape[0], c.num_heads * c.head_dim)
        r0 = 0
        for s in segments:
            self._observing = s.slot
            attn[r0 : r0 + s.length] = self._attend(
                q[r0 : r0 + s.length],
                pool.k[li][s.slot],
                pool.v[li][s.slot],
                s.start,
                window,
                s.exact_rows,
            )
            r0 += s.length
        return attn

    def _fused_layer(
        self,
        li: int,
        lw: LayerWeights,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        segments: Sequence[Segment],
        pool: KVPool,
        slot_idx: Tensor,
        pos: Tensor,
    ) -> Tensor:
        """One decoder layer with int8 weights through the compiled kernels (same math as the
        eager path: norm, int8 products, q/k norm, RoPE, cache write, attention, GeGLU)."""
        c = self.config
        kern = self._kernels
        eps = c.rms_norm_eps
        H, KV, D = c.num_heads, c.num_kv_heads, c.head_dim
        qkv, o, gate_up, down = self._int8[li]
        xq, amax = kern.rms_norm_quantize(x, lw.attn_norm, eps)
        acc = self._int8_product(xq, qkv)
        qk, v = kern.qkv_norm_rope_acc(
            acc, amax, qkv._out_scale, self._qk_norm[li], cos, sin, H, KV, D, eps
        )
        kern.write_kv(pool.k[li], pool.v[li], qk[:, H:], v, slot_idx, pos)
        self._last_q = qk[:, :H]  # what token dropping scores with (a view, no copy)
        attn = self._attention(li, qk[:, :H], segments, pool)
        aq, amax = kern.quantize_rows(attn)
        x = kern.add_rms_norm_acc(
            x, self._int8_product(aq, o), amax, o._out_scale, lw.post_attn_norm, eps
        )
        hq, amax = kern.rms_norm_quantize(x, lw.pre_ffn_norm, eps)
        gq, amax = kern.geglu_quantize_acc(
            self._int8_product(hq, gate_up), amax, gate_up._out_scale
        )
        return kern.add_rms_norm_acc(
            x, self._int8_product(gq, down), amax, down._out_scale, lw.post_ffn_norm, eps
        )

    def _int8_product(self, xq: Tensor, lin: Int8Linear, max_rows: int | None = None) -> Tensor:
        """Exact int32 products of int8 rows `xq` with `lin`'s weight: the compiled product for
        up to `max_rows` rows (default `gemv_rows`; 0 where it is not built), else oneDNN's."""
        if xq.shape[0] <= (self.gemv_rows if max_rows is None else max_rows):
            return self._kernels.int8_gemv(xq, lin.qweight, lin.row_sums_128)
        return torch._int_mm(xq, lin._qweight_t)

    def _attend(
        self,
        q: Tensor,
        kc: Tensor,
        vc: Tensor,
        start: int,
        window: int | None,
        exact_rows: bool = False,
    ) -> Tensor:
        """Attention of n queries at slot positions start.. against the slot's cache (kv, T, d);
        `exact_rows`: each row as a one-token decode step would compute it (`Segment`)."""
        c = self.config
        n = q.shape[0]
        end = start + n
        lo = 0 if window is None else max(0, start - window + 1)
        keys = kc[:, lo:end]  # (kv, L, d) view of the pool, no copy
        vals = vc[:, lo:end]
        kvh, g = c.num_kv_heads, c.num_heads // c.num_kv_heads
        if n > _SDPA_MIN_ROWS and c.attn_logit_softcapping is None and self.observer is None:
            # Prompt chunks: torch's fused kernel (no materialized scores). Decode and draft
            # verification (few rows) keep the explicit path below, so their numerics match.
            allowed: Tensor | None = None
            if start > 0 or (window is not None and n > window):
                qpos = torch.arange(start, end)[:, None]
                kpos = torch.arange(lo, end)[None, :]
                allowed = kpos <= qpos
                if window is not None:
                    allowed &= kpos > qpos - window
            # else a plain causal prompt (from slot position 0, inside the window): the kernel's
            # own causal flag skips the masked blocks instead of computing and masking them
            # (about half the work, e.g. every layer of a prompt cut to a few hundred rows).
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                keys[None],
                vals[None],
                attn_mask=allowed,
                is_causal=allowed is None,
                scale=1.0,  # already in the queries' norm multipliers
                enable_gqa=True,
            )
            return o[0].transpose(0, 1).reshape(n, c.num_heads * c.head_dim)
        if exact_rows and 1 < n <= _SDPA_MIN_ROWS:
            # Draft verification: each row exactly as a one-token decode step at its position
            # would compute it (same shapes, same kernels), so speculative output is
            # bit-identical to greedy output, not merely equal up to rounding. (An observer sees
            # rejected drafts' attention too: a little noise in H2O's statistic.) A short prompt
            # chunk (a question) takes the batched path below: row by row it cost a pass over
            # the whole context per row (63 vs 33 ms for 20 rows against 1,936 tokens).
            return torch.cat(
                [self._attend(q[i : i + 1], kc, vc, start + i, window) for i in range(n)]
            )
        # (n, H, d) -> (kv, g*n, d): heads of one kv group share its keys.
        if n == 1:
            qh = q.reshape(kvh, g, c.head_dim)
        else:
            qh = q.view(n, kvh, g, c.head_dim).permute(1, 2, 0, 3).reshape(kvh, g * n, c.head_dim)
        scores = torch.matmul(qh, keys.transpose(1, 2))  # queries carry the scale
        if c.attn_logit_softcapping is not None:
            cap = c.attn_logit_softcapping
            scores = torch.tanh(scores / cap).mul_(cap)
        if n > 1:
            qpos = torch.arange(start, end)[:, None]
            kpos = torch.arange(lo, end)[None, :]
            allowed = kpos <= qpos
            if window is not None:
                allowed &= kpos > qpos - window
            scores = (
                scores.view(kvh, g, n, -1)
                .masked_fill_(~allowed, float("-inf"))
                .view(kvh, g * n, -1)
            )
        probs = torch.softmax(scores, dim=-1)
        if self.observer is not None:
            self.observer.observe(self._observing, probs.sum(dim=(0, 1)), lo)
        out = torch.matmul(probs, vals)  # (kv, g*n, d)
        if n == 1:
            return out.reshape(1, c.num_heads * c.head_dim)
        return (
            out.view(kvh, g, n, c.head_dim).permute(2, 0, 1, 3).reshape(n, c.num_heads * c.head_dim)
        )

    # -- token dropping (F18) ------------------------------------------------------------------
    def _drop_rows(
        self, li: int, x: Tensor, drop: DropPlan, pool: KVPool, seg: Segment
    ) -> tuple[Tensor, list[Segment], Tensor, Tensor, dict[str, tuple[Tensor, Tensor]]]:
        """Keep the rows `drop` selects after layer `li` (-1: before the first); the kept rows
        continue at compact positions start .. start+kept-1."""
        q = self._last_q if li >= 0 else None
        keys = pool.k[li][seg.slot][:, : seg.start + seg.length] if li >= 0 else None
        keep = drop.select(li, q, keys, seg.start)
        x = x.index_select(0, keep)
        m = int(keep.numel())
        pos = torch.arange(seg.start, seg.start + m)
        slot_idx = torch.full((m,), seg.slot, dtype=torch.long)
        rope = {
            kind: (cos.index_select(0, pos), sin.index_select(0, pos))
            for kind, (cos, sin) in self._rope.items()
        }
        return x, [Segment(seg.slot, seg.start, m)], pos, slot_idx, rope

    def _settle_layouts(
        self, pool: KVPool, seg: Segment, layouts: Sequence[Tensor], final: Tensor
    ) -> None:
        """Layers that ran before a drop cached rows that later left: move each layer's kept
        rows to start.. (re-rotated), so every layer holds the same rows at the same slots."""
        for li, layout in enumerate(layouts):
            if layout.numel() == final.numel():
                continue  # ran after the last drop: already in place
            idx = torch.searchsorted(layout, final)
            self._move_rows(pool, li, seg.slot, seg.start, idx)

    def _move_rows(self, pool: KVPool, li: int, slot: int, start: int, idx: Tensor) -> None:
        """Cache rows start+idx[i] -> start+i in layer `li`, keys re-rotated by -(idx[i]-i)."""
        m = int(idx.numel())
        shift = idx - torch.arange(m)
        self._ensure_rope(int(shift.max()) + 1 if m else 1)
        kind = FULL if self.config.layer_types[li] == FULL else SLIDING
        cos, sin = self._rope[kind]
        src = idx + start
        kc, vc = pool.k[li][slot], pool.v[li][slot]  # (kv, T, d)
        keys = kc.index_select(1, src)
        kc[:, start : start + m] = _rope(
            keys, cos.index_select(0, shift), -sin.index_select(0, shift)
        )
        vc[:, start : start + m] = vc.index_select(1, src)

    @torch.inference_mode()
    def compact_positions(self, pool: KVPool, slot: int, keep: Tensor) -> int:
        """Keep the cached rows at sorted positions `keep` of `slot`, moved to 0..len(keep)-1
        (keys re-rotated, so the cache is as if only they had been computed); returns the new
        length. Sink+window truncation is the special case of a contiguous tail."""
        keep = keep.to(torch.long)
        for li in range(self.config.num_layers):
            self._move_rows(pool, li, slot, 0, keep)
        return int(keep.numel())

    # -- truncation ----------------------------------------------------------------------------
    @torch.inference_mode()
    def compact(self, pool: KVPool, slot: int, length: int, sink: int, keep: int) -> int:
        """Keep the first `sink` and last `keep` cached tokens of `slot`; returns the new length.

        The kept recent keys move down by `shift` positions and are re-rotated by -shift (RoPE
        is a rotation, so this is exact up to rounding): the cache then looks as if those tokens
        had been computed right after the sinks, and positions stay below the slot size.
        """
        if sink + keep >= length:
            return length
        src = length - keep
        shift = src - sink
        self._ensure_rope(shift + 1)
        for li, kind in enumerate(self.config.layer_types):
            cos, sin = self._rope[FULL if kind == FULL else SLIDING]
            cs, sn = cos[shift], sin[shift]
            kc, vc = pool.k[li][slot], pool.v[li][slot]  # (kv, T, d)
            moved = kc[:, src:length]
            kc[:, sink : sink + keep] = _rope(moved, cs, -sn)  # rotate by -shift
            vc[:, sink : sink + keep] = vc[:, src:length].clone()
        return sink + keep
