"""The session cache on a real KV pool at toy size: versions, rollback, LRU eviction, close."""

from __future__ import annotations

import itertools

import pytest

from streamfuse.lm.kv_pool import KVPool
from streamfuse.lm.request import EngineStats
from streamfuse.lm.sessions import SessionCache
from streamfuse.testing.tiny_lm import tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture
def pool() -> KVPool:
    return tiny_model().kv_pool(num_slots=2, max_tokens=32)


def cache(pool: KVPool) -> SessionCache:
    ticks = itertools.count()
    return SessionCache(pool, EngineStats(), clock=lambda: float(next(ticks)))


def run(c: SessionCache, key: str, ids: list[int], version: int = 0) -> None:
    """One request that appends `ids` to the context and keeps them (a feed)."""
    s = c.open(key)
    slot = s.slot or c.pool.acquire()
    assert slot is not None
    cached, unfed = c.begin(s, version, slot)
    done = cached + unfed + ids
    c.pool.set_length(slot, len(done))  # as if prefilled
    c.end(s, slot, done, [])


def test_a_context_is_reused_while_the_version_matches(pool: KVPool) -> None:
    c = cache(pool)
    run(c, "a", [2, 5, 6])
    run(c, "a", [7])
    assert c.get("a") is not None and c.get("a").context == [2, 5, 6, 7]  # type: ignore[union-attr]
    assert c.stats.reused_tokens == 3 and c.stats.invalidations == 0
    assert c.context_len("a", 0) == 4 and c.context_len("a", 1) == 0
    run(c, "a", [9], version=1)  # another version: the old context is dropped, not mixed in
    assert c.get("a").context == [9]  # type: ignore[union-attr]
    assert c.stats.invalidations == 1


def test_rollback_is_a_shorter_slot_length(pool: KVPool) -> None:
    c = cache(pool)
    run(c, "a", [2, 5, 6, 7])
    s = c.open("a")
    assert s.slot is not None
    cached, unfed = c.begin(s, 0, s.slot)
    assert s.busy and cached == [2, 5, 6, 7] and unfed == []
    pool.set_length(s.slot, 9)  # question + answer prefilled
    c.rollback(s, s.slot, cached + [10, 11, 12, 13, 14], [], base_len=4)
    assert s.context == [2, 5, 6, 7] and pool.length(s.slot) == 4 and not s.busy
    # Cut before the context was fully prefilled: what was not cached stays to be fed.
    cached, unfed = c.begin(s, 0, s.slot)
    c.rollback(s, s.slot, cached[:2], cached[2:] + [10], base_len=4)
    assert s.ids == [2, 5] and s.unfed == [6, 7] and pool.length(s.slot) == 2


def test_lru_evicts_the_least_recently_used_idle_session_sparing_queued_ones(
    pool: KVPool,
) -> None:
    c = cache(pool)
    run(c, "a", [2, 5])
    run(c, "b", [2, 6])
    run(c, "a", [7])  # a is now the most recently used
    assert pool.num_free == 0
    assert c.evict_lru(spare={"b"})  # b is older but has work queued: a goes
    a, b = c.get("a"), c.get("b")
    assert a is not None and b is not None
    assert a.slot is None and a.unfed == [2, 5, 7] and b.slot is not None
    assert pool.num_free == 1 and c.stats.evictions == 1
    # The evicted context is recomputed in whatever slot it gets next.
    slot = pool.acquire()
    assert slot is not None
    cached, unfed = c.begin(a, 0, slot)
    assert cached == [] and unfed == [2, 5, 7] and c.stats.recomputed_tokens == 3


def test_busy_sessions_are_never_evicted_and_close_frees_the_slot(pool: KVPool) -> None:
    c = cache(pool)
    run(c, "a", [2, 5])
    s = c.open("a")
    assert s.slot is not None
    c.begin(s, 0, s.slot)
    assert not c.evict_lru()  # the only session holding a slot is running
    c.idle(s)
    c.close("a")
    assert "a" not in c and pool.num_free == 2
    assert not pool.is_live(s.slot)
