"""Versioned context windows (F19): a revised window (an ASR partial replaced by its commit,
a corrected OCR line) invalidates the cached KV from that window on; the unchanged prefix is
reused. Real tiny model and KV pool: a stale reuse shows up as different cache rows."""

from __future__ import annotations

import itertools

import pytest
import torch

from streamfuse.errors import ConfigError
from streamfuse.lm.config import LMConfig
from streamfuse.lm.engine import LMEngine
from streamfuse.lm.gemma import GemmaModel, Segment
from streamfuse.lm.kv_pool import KVPool
from streamfuse.lm.request import ContextWindow, EngineStats, Request
from streamfuse.lm.sessions import SessionCache
from streamfuse.testing.tiny_lm import tiny_model

pytestmark = pytest.mark.unit

A = ContextWindow("slide:1", 0, (2, 10, 11, 12))
B = ContextWindow("asr:1", 0, (20, 21, 22, 23))
B_COMMIT = ContextWindow("asr:1", 1, (24, 25, 26, 27))  # same length, other text
C = ContextWindow("asr:2", 0, (30, 31, 32))
D = ContextWindow("asr:3", 0, (40, 41))


@pytest.fixture(scope="module")
def model() -> GemmaModel:
    return tiny_model(weights="int8", seed=1)


def cache(pool: KVPool) -> SessionCache:
    ticks = itertools.count()
    return SessionCache(pool, EngineStats(), clock=lambda: float(next(ticks)))


def feed(c: SessionCache, windows: tuple[ContextWindow, ...]) -> tuple[list[int], list[int]]:
    """One feed request giving the context as `windows`; returns what begin handed out."""
    s = c.open("s")
    slot = s.slot or c.pool.acquire()
    assert slot is not None
    cached, unfed = c.begin(s, 0, slot, windows)
    c.pool.set_length(slot, len(cached) + len(unfed))  # as if prefilled
    c.end(s, slot, cached + unfed, [])
    return cached, unfed


def test_prefix_is_reused_up_to_the_first_changed_window(model: GemmaModel) -> None:
    c = cache(model.kv_pool(num_slots=1, max_tokens=32))
    assert feed(c, (A, B, C)) == ([], [*A.ids, *B.ids, *C.ids])
    # Unchanged windows plus a new one: everything cached is reused.
    assert feed(c, (A, B, C, D)) == ([*A.ids, *B.ids, *C.ids], list(D.ids))
    assert c.stats.invalidations == 0
    # B revised: A stays, B's and everything after it (C, D attended to old B) is recomputed.
    cached, unfed = feed(c, (A, B_COMMIT, C, D))
    assert cached == list(A.ids)
    assert unfed == [*B_COMMIT.ids, *C.ids, *D.ids]
    assert c.stats.invalidations == 1
    s = c.get("s")
    assert s is not None and [(m.key, m.version, m.start) for m in s.windows] == [
        ("slide:1", 0, 0), ("asr:1", 1, 4), ("asr:2", 0, 8), ("asr:3", 0, 11)
    ]  # fmt: skip


def test_a_window_that_disappears_cuts_the_context_there(model: GemmaModel) -> None:
    c = cache(model.kv_pool(num_slots=1, max_tokens=32))
    feed(c, (A, B, C))
    assert feed(c, (A, C)) == (list(A.ids), list(C.ids))


def test_rewritten_context_is_not_reused_by_window(model: GemmaModel) -> None:
    c = cache(model.kv_pool(num_slots=1, max_tokens=32))
    feed(c, (A, B))
    s = c.open("s")
    assert s.slot is not None
    cached, unfed = c.begin(s, 0, s.slot, (A, B))
    # Truncation moved tokens: offsets no longer name the windows, so nothing is trusted.
    c.end(s, s.slot, cached[:1] + cached[3:], [], rewritten=True)
    assert feed(c, (A, B)) == ([], [*A.ids, *B.ids])


def engine(model: GemmaModel) -> LMEngine:
    cfg = {
        "pool": {"num_slots": 2, "max_tokens": 64},
        "scheduler": {"max_batch_tokens": 64, "prefill_chunk": 16},
    }
    return LMEngine(model, LMConfig.model_validate(cfg))


def fresh_cache(model: GemmaModel, ids: list[int]) -> KVPool:
    pool = model.kv_pool(num_slots=1, max_tokens=64)
    model.forward(torch.tensor(ids), [Segment(0, 0, len(ids))], pool)
    return pool


def test_engine_recomputes_from_the_revised_window_not_a_stale_cache(model: GemmaModel) -> None:
    eng = engine(model)
    ask = (7, 8)

    def question(windows: tuple[ContextWindow, ...]) -> list[int]:
        req = Request(prompt_ids=ask, max_new_tokens=5, session="s", windows=windows, stop_ids=())
        return eng.submit(req).wait()

    question((A, B, C))
    reused = eng.stats.reused_tokens
    out = question((A, B_COMMIT, C))
    assert eng.stats.reused_tokens - reused == len(A.ids)  # only the unchanged prefix
    context = [*A.ids, *B_COMMIT.ids, *C.ids]
    assert eng.session_context("s") == context  # the question and answer were rolled back
    # The slot's cache is the one a fresh prefill of the revised context computes: a reuse of
    # B's rows (or of C's, which attended to B) would leave other keys and values here.
    s = eng.sessions.get("s")
    assert s is not None and s.slot is not None
    ref = fresh_cache(model, context)
    n = len(context)
    for li in range(model.config.num_layers):
        torch.testing.assert_close(eng.pool.k[li][s.slot.index, :, :n], ref.k[li][0, :, :n])
        torch.testing.assert_close(eng.pool.v[li][s.slot.index, :, :n], ref.v[li][0, :, :n])
    # And the answer is the fresh context's answer.
    fresh = engine(model)
    assert out == fresh.generate([*context, *ask], 5, stop_ids=())


def test_a_feed_with_nothing_new_to_prefill_finishes_at_once(model: GemmaModel) -> None:
    """The same windows fed twice: the second feed finds everything cached. It must finish
    (and so free its session for the next request) instead of waiting for a prefill that never
    comes."""
    eng = engine(model)

    def feed_windows() -> list[int]:
        req = Request(prompt_ids=(), max_new_tokens=0, session="s", windows=(A,), keep_output=True)
        return eng.submit(req).wait(timeout=5)

    feed_windows()
    assert feed_windows() == []
    assert eng.session_context("s") == list(A.ids)
    # The session takes its next request.
    ask = Request(prompt_ids=(7, 8), max_new_tokens=3, session="s", windows=(A,), stop_ids=())
    assert len(eng.submit(ask).wait(timeout=5)) == 3


def test_windows_need_a_session(model: GemmaModel) -> None:
    with pytest.raises(ConfigError, match="session"):
        engine(model).submit(Request(prompt_ids=(7,), windows=(A,)))


# -- windows left out: moved, not recomputed ----------------------------------------------------
E = ContextWindow("asr:4", 0, (50, 51, 52))


def test_left_out_windows_are_cut_out_and_the_later_rows_move_into_the_gap(
    model: GemmaModel,
) -> None:
    moves: list[list[int]] = []
    ticks = itertools.count()
    c = SessionCache(
        model.kv_pool(num_slots=1, max_tokens=32),
        EngineStats(),
        clock=lambda: float(next(ticks)),
        compact=lambda _slot, positions: moves.append(positions),
    )
    feed(c, (A, B, C, D))
    # B dropped (the stage trimming its oldest) and E added: A, C and D stay cached.
    cached, unfed = feed(c, (A, C, D, E))
    assert cached == [*A.ids, *C.ids, *D.ids] and unfed == list(E.ids)
    assert moves == [[0, 1, 2, 3, 8, 9, 10, 11, 12]]  # A in place, C and D moved down by 4
    assert c.stats.moved_tokens == len(C.ids) + len(D.ids)
    assert c.stats.invalidations == 0  # nothing stale: the rest is exactly what it was
    s = c.get("s")
    assert s is not None and [(m.key, m.start, m.end) for m in s.windows] == [
        ("slide:1", 0, 4), ("asr:2", 4, 7), ("asr:3", 7, 9), ("asr:4", 9, 12)
    ]  # fmt: skip
    # A revised window after a gap is still recomputed from there on.
    moves.clear()
    cached, unfed = feed(c, (A, ContextWindow("asr:3", 1, (42, 43)), E))
    assert cached == list(A.ids) and unfed == [42, 43, *E.ids] and moves == []
    assert c.stats.invalidations == 1


def test_engine_moves_kept_windows_instead_of_recomputing_them(model: GemmaModel) -> None:
    """The stage drops B: the engine prefills only the new window, and the slot holds A, C
    and D exactly as a cache of A, B, C, D compacted to them (keys re-rotated), so the answer
    is the one over that compacted cache."""
    eng = engine(model)

    def windows_feed(windows: tuple[ContextWindow, ...]) -> None:
        req = Request(prompt_ids=(), max_new_tokens=0, session="s", windows=windows,
                      keep_output=True)  # fmt: skip
        eng.submit(req).wait(timeout=30)

    windows_feed((A, B, C, D))
    prefilled = eng.stats.prefill_tokens
    ask = Request(prompt_ids=(7, 8), max_new_tokens=5, session="s", windows=(A, C, D, E),
                  stop_ids=())  # fmt: skip
    out = eng.submit(ask).wait(timeout=30)
    assert eng.stats.prefill_tokens - prefilled == len(E.ids) + 2  # E and the question only
    assert eng.session_context("s") == [*A.ids, *C.ids, *D.ids, *E.ids]
    # Reference: a fresh cache of A, B, C, D compacted to A, C, D, then E prefilled after it.
    full = [*A.ids, *B.ids, *C.ids, *D.ids]
    ref = fresh_cache(model, full)
    keep = [0, 1, 2, 3, *range(8, len(full))]
    n = model.compact_positions(ref, 0, torch.tensor(keep))
    model.forward(torch.tensor(E.ids), [Segment(0, n, len(E.ids))], ref)
    s = eng.sessions.get("s")
    assert s is not None and s.slot is not None
    m = n + len(E.ids)
    for li in range(model.config.num_layers):
        torch.testing.assert_close(eng.pool.k[li][s.slot.index, :, :m], ref.k[li][0, :, :m])
        torch.testing.assert_close(eng.pool.v[li][s.slot.index, :, :m], ref.v[li][0, :, :m])
    # The same answer as decoding greedily from that reference cache.
    nxt = model.forward(torch.tensor([7, 8]), [Segment(0, m, 2)], ref, greedy=True)
    want = [int(nxt[-1])]
    for i in range(4):
        nxt = model.forward(torch.tensor(want[-1:]), [Segment(0, m + 2 + i, 1)], ref, greedy=True)
        want.append(int(nxt[0]))
    assert out == want


def test_recompute_policy_keeps_the_exact_recompute_of_what_follows_a_removed_window(
    model: GemmaModel,
) -> None:
    cfg = {
        "pool": {"num_slots": 2, "max_tokens": 64},
        "scheduler": {"max_batch_tokens": 64, "prefill_chunk": 16},
        "truncation": {"removed_windows": "recompute"},
    }
    eng = LMEngine(model, LMConfig.model_validate(cfg))
    for windows in ((A, B, C), (A, C)):
        req = Request(prompt_ids=(), max_new_tokens=0, session="s", windows=windows,
                      keep_output=True)  # fmt: skip
        eng.submit(req).wait(timeout=30)
    assert eng.stats.moved_tokens == 0
    s = eng.sessions.get("s")
    assert s is not None and s.slot is not None
    context = [*A.ids, *C.ids]
    ref = fresh_cache(model, context)  # C recomputed right after A: exact
    for li in range(model.config.num_layers):
        torch.testing.assert_close(
            eng.pool.k[li][s.slot.index, :, : len(context)], ref.k[li][0, :, : len(context)]
        )
