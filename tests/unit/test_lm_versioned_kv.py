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
