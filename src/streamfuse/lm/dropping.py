"""Token importance (F17) and hierarchical token dropping (F18) inside the Gemma runtime.

Importance comes from what the forward computes anyway (no second pass): attention received
from the query rows (FastV), per-token attention entropy averaged over heads, key norms, plus
MiniLM similarity of a token's line to the question and the cross-modal entropy gap (how
differently the query spreads its attention over slide vs speech tokens). A `DropPlan` tells
`GemmaModel.forward` after which layers rows leave the prefill and how many stay; kept rows
continue at compact positions and every layer's cache ends up holding exactly the kept rows
(see gemma.py), so the slot pool and RoPE stay consistent. `method_plan` builds the plans of
the compared methods (random, recency, StreamingLLM sinks, FastV, ours); H2O (`h2o_keep`)
accumulates attention over a full prefill through an `AttentionObserver` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from streamfuse.lm.gemma import GemmaModel
    from streamfuse.lm.kv_pool import KVPool

Method = Literal["random", "recency", "sinks", "fastv", "h2o", "minilm", "ours"]
METHODS: tuple[Method, ...] = ("random", "recency", "sinks", "fastv", "h2o", "minilm", "ours")


class AttentionObserver(Protocol):
    """Receives, for each explicit attention, the probability mass each key got (summed over
    heads and query rows) for keys lo.. of `slot`."""

    def observe(self, slot: int, mass: Tensor, lo: int) -> None: ...


@dataclass
class LayerView:
    """What a scorer sees after layer `layer` (-1: before the first): the queries of the alive
    rows (n, H, d) and the slot's keys up to the segment's end (kv, start+n, d)."""

    layer: int
    q: Tensor | None
    keys: Tensor | None
    start: int
    layout: Tensor  # segment offsets of the alive rows, ascending
    total: int  # rows of the segment before any drop
    query_rows: int  # the segment's last rows that are the query (always kept)


Scorer = Callable[[LayerView], Tensor]


# -- importance signals (F17) ---------------------------------------------------------------------
def _grouped(q: Tensor, kv_heads: int) -> Tensor:
    """(n, H, d) queries -> (kv, g*n, d): the heads of one kv group share its keys."""
    n, h, d = q.shape
    g = h // kv_heads
    return q.view(n, kv_heads, g, d).permute(1, 2, 0, 3).reshape(kv_heads, g * n, d)


def query_attention(view: LayerView, rows: int | None = None) -> Tensor:
    """Mean attention probability each alive row receives from the last `rows` query rows
    (default: all query rows), averaged over heads (FastV uses rows=1)."""
    assert view.q is not None and view.keys is not None
    # Over every cached key, also past a sliding layer's window: this ranks what the query
    # finds relevant, not what this one layer happens to be able to see.
    t = min(view.query_rows if rows is None else rows, view.q.shape[0])
    q = view.q[-t:]
    scores = torch.matmul(_grouped(q, view.keys.shape[0]), view.keys.transpose(1, 2))
    probs = torch.softmax(scores, dim=-1)  # queries carry the scale already
    return probs.mean(dim=(0, 1))[view.start :]


def attention_entropy(view: LayerView, block: int = 256) -> Tensor:
    """Entropy (nats) of each alive row's own causal attention distribution, mean over heads.
    Low: the token attends narrowly (it carries specific content)."""
    assert view.q is not None and view.keys is not None
    n = view.q.shape[0]
    kv, h = view.keys.shape[0], view.q.shape[1]
    g = h // kv
    out = torch.empty(n)
    kpos = torch.arange(view.keys.shape[1])
    for r0 in range(0, n, block):
        r1 = min(n, r0 + block)
        qh = _grouped(view.q[r0:r1], kv)  # (kv, g*b, d)
        scores = torch.matmul(qh, view.keys.transpose(1, 2)).view(kv, g, r1 - r0, -1)
        qpos = torch.arange(view.start + r0, view.start + r1)[:, None]
        scores.masked_fill_(kpos[None, :] > qpos, float("-inf"))
        logp = torch.log_softmax(scores, dim=-1)
        ent = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)  # (kv, g, b)
        out[r0:r1] = ent.mean(dim=(0, 1))
    return out


def key_norms(view: LayerView) -> Tensor:
    """L2 norm of each alive row's key, mean over kv heads."""
    assert view.keys is not None
    return view.keys[:, view.start :].norm(dim=-1).mean(0)


def modal_entropy_gap(mass: Tensor, modality: Tensor) -> float:
    """Normalized entropy of the query's attention over speech tokens (modality 1) minus over
    slide tokens (modality 0): > 0 when attention is spread thinner over speech than slides."""

    def norm_entropy(p: Tensor) -> float:
        if p.numel() < 2 or float(p.sum()) <= 0:
            return 0.0
        p = p / p.sum()
        return float(-(p * p.clamp_min(1e-12).log()).sum()) / math.log(p.numel())

    return norm_entropy(mass[modality == 1]) - norm_entropy(mass[modality == 0])


def _rank01(x: Tensor) -> Tensor:
    """Ranks scaled to [0, 1] (scale-free combination of signals)."""
    if x.numel() < 2:
        return torch.ones_like(x)
    return torch.argsort(torch.argsort(x)).float() / (x.numel() - 1)


def group_mean(x: Tensor, groups: Tensor) -> Tensor:
    """Each element replaced by the mean of its group (e.g. its timeline line)."""
    n = int(groups.max()) + 1 if groups.numel() else 0
    sums = torch.zeros(n).index_add_(0, groups, x)
    counts = torch.zeros(n).index_add_(0, groups, torch.ones_like(x))
    return (sums / counts.clamp_min(1))[groups]


# -- plans ----------------------------------------------------------------------------------------
@dataclass
class DropPlan:
    """After layer l in `keep`, keep `keep[l]` rows of the segment (protected ones included).

    Protected: the first `protect_head` rows (attention sinks) and the last `query_rows` (the
    question). `scorer` ranks the alive rows; `kept` / `layout` hold the surviving segment
    offsets once the forward has run; `signals` whatever the scorer recorded.
    """

    keep: dict[int, int]
    scorer: Scorer
    protect_head: int = 1
    query_rows: int = 1
    layout: Tensor = field(default_factory=lambda: torch.arange(0))
    total: int = 0
    signals: dict[str, float] = field(default_factory=dict)
    #: Call the scorer even where nothing is dropped (to read signals without dropping).
    probe: bool = False

    @property
    def layers(self) -> frozenset[int]:
        return frozenset(self.keep)

    @property
    def kept(self) -> list[int]:
        return [int(i) for i in self.layout]

    def begin(self, rows: int) -> None:
        self.total = rows
        self.layout = torch.arange(rows)

    def select(self, layer: int, q: Tensor | None, keys: Tensor | None, start: int) -> Tensor:
        """Indices (ascending) of the alive rows to keep after `layer`; updates `layout`."""
        n = int(self.layout.numel())
        target = min(n, max(self.keep[layer], 0))
        if target >= n and not self.probe:
            return torch.arange(n)
        view = LayerView(layer, q, keys, start, self.layout, self.total, self.query_rows)
        scores = self.scorer(view).float().clone()
        if target >= n:
            return torch.arange(n)
        protected = (self.layout < self.protect_head) | (
            self.layout >= self.total - self.query_rows
        )
        scores[protected] = float("inf")
        target = max(target, int(protected.sum()))
        idx = torch.topk(scores, target).indices.sort().values
        self.layout = self.layout.index_select(0, idx)
        return idx


def decaying_rates(layers: int, first: float = 0.4, last: float = 0.1) -> list[float]:
    """Drop rate at each of `layers` drop points, linear from `first` to `last`."""
    if layers == 1:
        return [first]
    return [first + (last - first) * i / (layers - 1) for i in range(layers)]


def schedule_keeps(droppable: int, ratio: float, rates: Sequence[float]) -> list[int]:
    """Rows kept after each drop point so that the shape of `rates` ends at `ratio` kept: the
    rates are scaled by one factor (found by bisection); the last point takes any rest."""
    if ratio >= 1.0:
        return [droppable] * len(rates)

    def kept(scale: float) -> float:
        return math.prod(1.0 - min(0.95, scale * r) for r in rates)

    lo, hi = 0.0, 0.95 / max(rates)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if kept(mid) > ratio else (lo, mid)
    out: list[int] = []
    frac = 1.0
    for r in rates:
        frac *= 1.0 - min(0.95, hi * r)
        out.append(max(0, round(droppable * frac)))
    out[-1] = max(0, round(droppable * ratio))
    return out


@dataclass(frozen=True)
class ContextInfo:
    """Per segment row: its timeline line (`groups`), modality (0 slide, 1 speech, -1 other)
    and the MiniLM similarity of its line to the question (`similarity`, or None)."""

    groups: Tensor
    modality: Tensor
    similarity: Tensor | None = None


#: Ours by default: a coarse cut before the first layer (whole lines, by MiniLM similarity to
#: the question, the first line and the most recent lines kept: no model work spent on what is
#: clearly off-topic, and the input-level cut is what makes prefill cheap), then the last cut
#: after layer 1 by the same line ranking (layers 0-1 see ~30% of the context, the others the
#: ratio). The rates decay 0.4 -> 0.1 with depth (scaled so the last point lands on the ratio).
#: The question's attention ranks lines only where no MiniLM similarity is given: beside it, at
#: any weight tried, it changed almost no kept set and no agreement (docs/token-dropping.md).
OURS_LAYERS: tuple[int, ...] = (-1, 1)
FASTV_LAYER = 2
SINK_TOKENS = 4
#: Share of ours' budget that goes to the most recent lines before the question (StreamingLLM's
#: window, at line granularity: the continuation depends on the latest context most).
RECENT_SHARE = 0.25


def ours_scorer(
    info: ContextInfo,
    budget: int,
    *,
    recent_share: float = RECENT_SHARE,
    signals: dict[str, float] | None = None,
) -> Callable[[LayerView], Tensor]:
    """Whole semantic units, not scattered tokens: every row scores as its line does. Ranked
    first the first line (the header the model continues from), then the lines holding the
    last `recent_share` of the `budget` context rows, then the rest by MiniLM similarity to
    the question, or, where `info.similarity` is None, by the question's attention pooled over
    the line (at drop points after a layer). Within a line earlier rows win (a line cut at the
    budget keeps its beginning). `info.groups` must number the lines in context order. The
    question's attention is also where `signals` gets the cross-modal entropy gap (F17)."""
    recent_rows = int(budget * recent_share)

    def units(view: LayerView) -> Tensor:
        layout = view.layout
        groups = info.groups.index_select(0, layout)
        ctx_end = view.total - view.query_rows
        s = torch.zeros(layout.numel())
        if info.similarity is not None:
            s += group_mean(_rank01(info.similarity.index_select(0, layout)), groups)
        if ctx_end > 1:
            s += 3.0 * (groups == info.groups[1]).float()  # row 0 is the sink anyway
            if recent_rows > 0:
                first_recent = info.groups[max(1, ctx_end - recent_rows) : ctx_end].min()
                s += 2.0 * ((groups >= first_recent) & (layout < ctx_end)).float()
        return s - 1e-3 * layout.float() / max(1, view.total)

    def score(view: LayerView) -> Tensor:
        s = units(view)
        record = signals is not None and "modal_entropy_gap" not in signals
        if view.q is None or (info.similarity is not None and not record):
            return s
        att = query_attention(view)
        if signals is not None and record:
            modality = info.modality.index_select(0, view.layout)
            signals["modal_entropy_gap"] = modal_entropy_gap(att, modality)
        if info.similarity is not None:
            return s
        # Under the first and recent lines' bonuses (3, 2): attention orders only the rest.
        groups = info.groups.index_select(0, view.layout)
        return s + 0.5 * group_mean(_rank01(att), groups)

    return score


def method_plan(
    method: Method,
    rows: int,
    ratio: float,
    *,
    query_rows: int,
    info: ContextInfo | None = None,
    seed: int = 0,
    layers: Sequence[int] = OURS_LAYERS,
    rates: tuple[float, float] = (0.4, 0.1),
) -> DropPlan:
    """The drop plan of `method` keeping `ratio` of the segment's context rows (the question
    and the first token are always kept). Not for 'h2o' (see `h2o_keep`)."""
    head = SINK_TOKENS if method == "sinks" else 1
    droppable = max(0, rows - query_rows - head)
    target = head + query_rows + round(droppable * ratio)
    if method in ("random", "recency", "sinks"):
        gen = torch.Generator().manual_seed(seed)
        if method == "random":

            def rand(view: LayerView) -> Tensor:
                return torch.rand(view.layout.numel(), generator=gen)

            scorer: Scorer = rand
        else:

            def recent(view: LayerView) -> Tensor:
                return view.layout.float()

            scorer = recent
        return DropPlan({-1: target}, scorer, protect_head=head, query_rows=query_rows)
    if method == "minilm":
        if info is None or info.similarity is None:
            raise ValueError("method 'minilm' needs ContextInfo.similarity")
        sim = info.similarity
        return DropPlan(
            {-1: target},
            lambda v: sim.index_select(0, v.layout),
            protect_head=head,
            query_rows=query_rows,
        )
    if method == "fastv":
        return DropPlan(
            {FASTV_LAYER: target},
            lambda v: query_attention(v, rows=1),
            protect_head=head,
            query_rows=query_rows,
        )
    if method == "ours":
        if info is None:  # no lines known: every token its own line, no similarity
            info = ContextInfo(torch.arange(rows), torch.full((rows,), -1))
        if info.similarity is None:  # nothing to drop on before the first layer
            layers = [li for li in layers if li >= 0] or [FASTV_LAYER]
        keeps = schedule_keeps(droppable, ratio, decaying_rates(len(layers), *rates))
        signals: dict[str, float] = {}
        return DropPlan(
            {li: head + query_rows + k for li, k in zip(layers, keeps, strict=True)},
            ours_scorer(info, round(droppable * ratio), signals=signals),
            protect_head=head,
            query_rows=query_rows,
            signals=signals,
        )
    raise ValueError(f"method {method!r} has no drop plan; expected one of {METHODS}")


class AttentionAccumulator:
    """H2O's heavy-hitter statistic: attention mass each cached position of each slot has
    received so far (summed over layers, heads and queries)."""

    def __init__(self, num_slots: int, max_tokens: int) -> None:
        self.mass = torch.zeros(num_slots, max_tokens)

    def observe(self, slot: int, mass: Tensor, lo: int) -> None:
        self.mass[slot, lo : lo + mass.numel()] += mass

    def reset(self, slot: int) -> None:
        self.mass[slot].zero_()

    def clear_from(self, slot: int, start: int) -> None:
        """Forget what positions start.. received (they were rewritten)."""
        self.mass[slot, start:].zero_()

    def keep(self, slot: int, length: int, budget: int, *, sink: int, recent: int) -> Tensor:
        """Positions to keep: `sink` first, `recent` last and the heaviest of the rest."""
        if budget >= length:
            return torch.arange(length)
        sink = min(sink, budget)
        recent = min(recent, budget - sink)
        heavy = budget - sink - recent
        mid = self.mass[slot, sink : length - recent]
        top = torch.topk(mid, min(heavy, mid.numel())).indices + sink
        keep = torch.cat([torch.arange(sink), top, torch.arange(length - recent, length)])
        return keep.sort().values

    def moved(self, slot: int, keep: Tensor) -> None:
        """Follow a compaction: keep[i] -> i."""
        kept = self.mass[slot].index_select(0, keep)
        self.mass[slot].zero_()
        self.mass[slot, : keep.numel()] = kept


@dataclass
class Compressed:
    """Result of `compress_prefill`: the next token's logits and the kept segment offsets."""

    logits: Tensor
    kept: list[int]
    signals: dict[str, float] = field(default_factory=dict)


@torch.inference_mode()
def compress_prefill(
    model: GemmaModel,
    ids: Sequence[int],
    pool: KVPool,
    slot: int,
    method: Method | Literal["full"],
    ratio: float,
    *,
    query_rows: int,
    info: ContextInfo | None = None,
    seed: int = 0,
) -> Compressed:
    """Prefill `ids` (context then a `query_rows`-token question) into an empty `slot` keeping
    about `ratio` of the context by `method`; the slot then holds the kept rows at 0..m-1."""
    from streamfuse.lm.gemma import Segment

    x = torch.tensor(list(ids), dtype=torch.long)
    n = int(x.numel())
    if method == "full" or ratio >= 1.0:
        logits = model.forward(x, [Segment(slot, 0, n)], pool, out_rows=torch.tensor([n - 1]))
        return Compressed(logits[0], list(range(n)))
    if method == "h2o":
        acc = AttentionAccumulator(pool.num_slots, pool.max_tokens)
        model.observer = acc
        try:
            logits = model.forward(x, [Segment(slot, 0, n)], pool, out_rows=torch.tensor([n - 1]))
        finally:
            model.observer = None
        droppable = max(0, n - query_rows - 1)
        budget = 1 + query_rows + round(droppable * ratio)
        # H2O's split: half of the context budget recent, half heavy hitters.
        recent = query_rows + (budget - 1 - query_rows) // 2
        keep = acc.keep(slot, n, budget, sink=1, recent=recent)
        model.compact_positions(pool, slot, keep)
        return Compressed(logits[0], [int(i) for i in keep])
    plan = method_plan(method, n, ratio, query_rows=query_rows, info=info, seed=seed)
    logits = model.forward(x, [Segment(slot, 0, n)], pool, drop=plan)
    return Compressed(logits[0], plan.kept, dict(plan.signals))
