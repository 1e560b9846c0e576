"""Token importance and hierarchical dropping on a real 6-layer toy Gemma 3: what a plan keeps,
cache consistency (slot rows and RoPE), H2O accumulation, and speculative == greedy after it."""

from __future__ import annotations

import pytest
import torch

from streamfuse.errors import ConfigError
from streamfuse.lm.config import LMConfig, WeightFormat
from streamfuse.lm.dropping import (
    AttentionAccumulator,
    ContextInfo,
    DropPlan,
    LayerView,
    compress_prefill,
    decaying_rates,
    method_plan,
    modal_entropy_gap,
    ours_scorer,
    query_attention,
    schedule_keeps,
)
from streamfuse.lm.engine import LMEngine, Request
from streamfuse.lm.gemma import GemmaModel, Segment
from streamfuse.lm.kv_pool import KVPool
from streamfuse.testing.tiny_lm import tiny_config, tiny_model

pytestmark = pytest.mark.unit

N = 64
QUERY = 6


@pytest.fixture(scope="module")
def model() -> GemmaModel:
    return tiny_model(tiny_config(num_layers=6, sliding_window=16), weights="int8", seed=3)


def prompt(seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [2] + [int(i) for i in torch.randint(4, 90, (N - 1,), generator=g)]


def info(n: int = N) -> ContextInfo:
    sim = torch.rand(n, generator=torch.Generator().manual_seed(n))
    return ContextInfo(torch.arange(n) // 8, (torch.arange(n) // 8) % 2, sim)


def test_schedule_decays_from_04_to_01_and_ends_at_the_ratio() -> None:
    rates = decaying_rates(4)
    assert rates[0] == pytest.approx(0.4) and rates[-1] == pytest.approx(0.1)
    keeps = schedule_keeps(1000, 0.25, rates)
    assert keeps[-1] == 250
    assert keeps == sorted(keeps, reverse=True)
    drops = [1 - b / a for a, b in zip([1000, *keeps], keeps, strict=False)]
    assert drops == sorted(drops, reverse=True)  # coarse first, gentler deeper


def test_plan_keeps_sinks_and_query_and_the_requested_count(model: GemmaModel) -> None:
    ids = prompt()
    for method in ("random", "recency", "sinks", "fastv", "h2o", "ours"):
        pool = model.kv_pool(num_slots=1, max_tokens=N + 8)
        r = compress_prefill(model, ids, pool, 0, method, 0.25, query_rows=QUERY, info=info())
        head = 4 if method == "sinks" else 1
        assert r.kept[:head] == list(range(head)), method
        assert r.kept[-QUERY:] == list(range(N - QUERY, N)), method
        assert len(r.kept) == head + QUERY + round((N - QUERY - head) * 0.25), method
        assert r.kept == sorted(set(r.kept))


def _check_input_level_drop(model: GemmaModel) -> None:
    """A cut before layer 0 equals a plain forward of the kept tokens."""
    ids = prompt(1)
    pool = model.kv_pool(num_slots=1, max_tokens=N + 8)
    r = compress_prefill(model, ids, pool, 0, "random", 0.5, query_rows=QUERY, seed=4)
    kept = [ids[i] for i in r.kept]
    ref = model.kv_pool(num_slots=1, max_tokens=N + 8)
    logits = model.forward(torch.tensor(kept), [Segment(0, 0, len(kept))], ref)
    torch.testing.assert_close(r.logits, logits[-1])


def _check_mid_network_drop(model: GemmaModel) -> tuple[KVPool, int]:
    """After a cut mid-network, layer 0 holds the kept rows as a fresh computation of the kept
    tokens at positions 0..m-1 would; returns the slot's pool and m."""
    ids = prompt(2)
    pool = model.kv_pool(num_slots=1, max_tokens=N + 8)
    r = compress_prefill(model, ids, pool, 0, "ours", 0.25, query_rows=QUERY, info=info())
    m = len(r.kept)
    assert m < N
    fresh = model.kv_pool(num_slots=1, max_tokens=N + 8)
    model.forward(torch.tensor([ids[i] for i in r.kept]), [Segment(0, 0, m)], fresh)
    torch.testing.assert_close(pool.k[0][0][:, :m], fresh.k[0][0][:, :m], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(pool.v[0][0][:, :m], fresh.v[0][0][:, :m])
    return pool, m


def test_input_level_drop_equals_a_plain_forward_of_the_kept_tokens(model: GemmaModel) -> None:
    _check_input_level_drop(model)


def test_after_a_mid_network_drop_every_layer_holds_the_kept_rows_at_compact_positions(
    model: GemmaModel,
) -> None:
    """Layer 0 keys depend only on the token and its position: after dropping (and moving the
    earlier layers' rows with a RoPE re-rotation) they equal a fresh computation of the kept
    tokens at positions 0..m-1. The slot then decodes like any other."""
    pool, m = _check_mid_network_drop(model)
    # Layers that ran after the last drop computed exactly the kept rows: nothing beyond m.
    assert float(pool.k[5][0][:, m:].abs().sum()) == 0.0


@pytest.mark.parametrize("weights", ["fp32", "int8"])
def test_dropping_runs_on_the_eager_path(weights: WeightFormat) -> None:
    """Without the compiled kernels (fp32 weights, or int8 where they cannot be built) a drop
    shrinks the rows mid-forward too: the input-level cut equals a plain forward of the kept
    tokens, and a cut after layer 1 leaves the slot as if only the kept rows had run."""
    tiny = tiny_model(tiny_config(num_layers=6, sliding_window=16), weights=weights, seed=3)
    eager = GemmaModel(tiny.config, tiny.weights, fused=False)
    _check_input_level_drop(eager)
    _check_mid_network_drop(eager)


def test_ratio_one_is_the_plain_forward(model: GemmaModel) -> None:
    ids = prompt(3)
    a = model.kv_pool(num_slots=1, max_tokens=N)
    b = model.kv_pool(num_slots=1, max_tokens=N)
    plan = method_plan("ours", N, 1.0, query_rows=QUERY, info=info())
    la = model.forward(torch.tensor(ids), [Segment(0, 0, N)], a, drop=plan)
    lb = model.forward(torch.tensor(ids), [Segment(0, 0, N)], b, out_rows=torch.tensor([N - 1]))
    torch.testing.assert_close(la, lb)
    assert plan.kept == list(range(N))


def test_fastv_keeps_what_the_query_attends_to(model: GemmaModel) -> None:
    seen: dict[str, torch.Tensor] = {}

    def scorer(view: LayerView) -> torch.Tensor:
        seen["att"] = query_attention(view, rows=1)
        return seen["att"]

    plan = DropPlan({2: 20}, scorer, protect_head=1, query_rows=QUERY)
    pool = model.kv_pool(num_slots=1, max_tokens=N)
    model.forward(torch.tensor(prompt(4)), [Segment(0, 0, N)], pool, drop=plan)
    att = seen["att"]
    assert att.shape == (N,)
    assert float(att.sum()) == pytest.approx(1.0, abs=1e-4)  # the whole prompt is visible
    free = [i for i in range(1, N - QUERY)]
    best = sorted(free, key=lambda i: -float(att[i]))[: 20 - 1 - QUERY]
    assert set(plan.kept) == {0, *best, *range(N - QUERY, N)}


def test_h2o_accumulator_keeps_sinks_recent_and_heavy_hitters_and_follows_moves() -> None:
    acc = AttentionAccumulator(num_slots=2, max_tokens=16)
    acc.observe(1, torch.tensor([5.0, 0, 0, 9, 0, 0, 7, 0, 0, 0, 0, 0]), 0)
    keep = acc.keep(1, 12, budget=6, sink=1, recent=3)
    assert keep.tolist() == [0, 3, 6, 9, 10, 11]
    acc.moved(1, keep)
    assert acc.mass[1, :6].tolist() == [5.0, 9.0, 7.0, 0.0, 0.0, 0.0]
    assert float(acc.mass[0].sum()) == 0.0


def test_modal_entropy_gap_sign() -> None:
    mass = torch.tensor([0.9, 0.05, 0.05, 0.25, 0.25, 0.25, 0.25])
    modality = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    assert modal_entropy_gap(mass, modality) > 0.5  # speech spread evenly, slides peaked


def _engine(model: GemmaModel, **over: dict) -> LMEngine:
    base: dict = {
        "pool": {"num_slots": 2, "max_tokens": 96},
        "scheduler": {"max_batch_tokens": 96, "prefill_chunk": 16},
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v}
    return LMEngine(model, LMConfig.model_validate(base))


@pytest.mark.parametrize("method", ["ours", "fastv", "recency"])
def test_engine_dropping_prefill_then_speculative_equals_greedy_on_the_kept_context(
    model: GemmaModel, method: str
) -> None:
    """The engine's dropping prefill keeps what `compress_prefill` keeps, and decoding on that
    cache is the same whether drafts are verified (speculative) or not, and equals plain
    one-token-at-a-time greedy decoding of the kept slot."""
    ids = [2] + [10, 11, 12, 13, 14, 15] * 9 + [10, 11, 12]  # repetitive: drafts get accepted
    n = len(ids)
    outs = {}
    for spec in (False, True):
        eng = _engine(model, dropping={"method": method})
        req = Request(prompt_ids=tuple(ids), max_new_tokens=16, keep_ratio=0.25, query_tokens=4,
                      speculative=spec, stop_ids=())  # fmt: skip
        outs[spec] = eng.submit(req).wait()
        assert eng.stats.dropped_tokens > 0
        if spec:
            assert eng.stats.draft_tokens > 0
    assert outs[True] == outs[False]
    # Reference: the same plan, then plain greedy decoding on the kept slot.
    pool = model.kv_pool(num_slots=1, max_tokens=96)
    plan = method_plan(method, n, 0.25, query_rows=4, seed=1, layers=LMConfig().dropping.layers)
    first = model.forward(torch.tensor(ids), [Segment(0, 0, n)], pool, drop=plan, greedy=True)
    ref = [int(first[0])]
    m = len(plan.kept)
    while len(ref) < 16:
        nxt = model.forward(torch.tensor([ref[-1]]), [Segment(0, m + len(ref) - 1, 1)], pool)
        ref.append(int(nxt[-1].argmax()))
    assert outs[False] == ref


def test_heavy_hitter_eviction_keeps_sinks_recent_and_most_attended(model: GemmaModel) -> None:
    eng = _engine(
        model,
        pool={"max_tokens": 48},
        truncation={"policy": "heavy_hitter", "sink_tokens": 2, "window_tokens": 24},
    )
    ids = prompt(5)[:40]
    out = eng.generate(ids, 20, speculative=False, stop_ids=())
    assert len(out) == 20
    assert eng.stats.truncations >= 1
    assert eng.attention is not None
    # After an eviction the slot holds sinks + window tokens, sinks first, recent last.
    eng2 = _engine(
        model,
        pool={"max_tokens": 48},
        truncation={"policy": "heavy_hitter", "sink_tokens": 2, "window_tokens": 24},
    )
    eng2.feed("s", ids)
    eng2.run_until_idle()
    eng2.feed("s", prompt(6)[1:20])
    eng2.run_until_idle()
    ctx = eng2.session_context("s")
    assert ctx[:2] == ids[:2]
    assert ctx[-12:] == prompt(6)[1:20][-12:]
    assert len(ctx) <= 48


def test_keep_ratio_on_a_question_that_rolls_back_is_refused(model: GemmaModel) -> None:
    eng = _engine(model)
    with pytest.raises(ConfigError):
        eng.submit(Request(prompt_ids=(2, 5, 6), session="s", keep_ratio=0.5))
    with pytest.raises(ConfigError):
        eng.submit(Request(prompt_ids=(2, 5, 6), keep_ratio=1.5))


def test_a_question_outranks_background_feeds_but_not_its_own_context(model: GemmaModel) -> None:
    eng = _engine(model, pool={"num_slots": 1}, scheduler={"max_running": 1})
    feed_a = eng.feed("a", prompt(7)[:30])
    question_b = eng.submit(Request(prompt_ids=(2, 5, 6, 7), max_new_tokens=2, priority=1))
    eng.step()
    # One slot: the later question of another stream went first.
    assert eng.scheduler.running[0].handle is question_b
    eng.run_until_idle()
    assert feed_a.done and question_b.done
    # Within one session the question waits for the context fed before it.
    feed = eng.feed("c", prompt(8)[:30])
    ask = eng.submit(Request(prompt_ids=(5, 6), max_new_tokens=2, session="c", priority=1))
    eng.step()
    assert eng.scheduler.running[0].handle is feed
    eng.run_until_idle()
    assert ask.done


def test_heavy_hitter_eviction_keeps_speculative_identical_to_greedy(model: GemmaModel) -> None:
    ids = [2] + [10, 11, 12, 13, 14] * 7  # repetitive: drafts get accepted
    outs = []
    for spec in (False, True):
        eng = _engine(
            model,
            pool={"max_tokens": 48},
            truncation={"policy": "heavy_hitter", "sink_tokens": 2, "window_tokens": 24},
        )
        outs.append(eng.generate(ids, 24, speculative=spec, stop_ids=()))
        assert eng.stats.truncations >= 1
    assert outs[0] == outs[1]


def test_ours_keeps_whole_lines_first_and_recent_lines_and_the_similar_one(
    model: GemmaModel,
) -> None:
    """Semantic units, not scattered tokens: the first line (the header), the lines just before
    the question and the line most similar to it survive whole; at most one line is cut."""
    lines, width, query = 14, 8, 4
    n = 1 + lines * width + query
    groups = torch.tensor([0] + [1 + i // width for i in range(lines * width)] + [99] * query)
    sim = torch.full((n,), 0.1)
    sim[groups == 6] = 0.9  # the question is about line 6
    sim[groups == 9] = 0.5
    ctx = ContextInfo(groups, groups % 2, sim)
    plan = method_plan("ours", n, 0.3, query_rows=query, info=ctx)
    model.forward(
        torch.tensor([2] + [4 + i % 80 for i in range(n - 1)]),
        [Segment(0, 0, n)],
        model.kv_pool(num_slots=1, max_tokens=n),
        drop=plan,
    )
    kept = torch.tensor(plan.kept)
    per_line = {g: int((groups[kept] == g).sum()) for g in range(1, lines + 1)}
    assert per_line[1] == width  # the header line
    assert per_line[6] == width  # the most similar line
    assert per_line[lines] == width  # the most recent line
    partial = [g for g, k in per_line.items() if 0 < k < width]
    assert len(partial) <= 1, per_line


def test_ours_ranks_by_line_similarity_alone_and_by_attention_only_without_it() -> None:
    """With MiniLM similarity the question's attention does not move a score (it only feeds
    the cross-modal entropy gap); without similarity it orders the lines."""
    n, kv, h, d = 40, 2, 4, 16
    g = torch.Generator().manual_seed(0)
    q, keys = torch.randn(n, h, d, generator=g), torch.randn(kv, n, d, generator=g)
    with_q = LayerView(1, q, keys, 0, torch.arange(n), n, 4)
    without_q = LayerView(-1, None, None, 0, torch.arange(n), n, 4)
    groups = torch.arange(n) // 4
    sim = torch.rand(n, generator=g)
    signals: dict[str, float] = {}
    ranked = ours_scorer(ContextInfo(groups, groups % 2, sim), 10, signals=signals)
    torch.testing.assert_close(ranked(with_q), ranked(without_q))
    assert "modal_entropy_gap" in signals
    blind = ours_scorer(ContextInfo(groups, groups % 2), 10)
    assert not torch.allclose(blind(with_q), blind(without_q))
