"""The scheduler on its own (real KV pool at toy size, tiny model for truncation): first come,
first served admission, token budget, chunked prefill, truncation and refusal decisions."""

from __future__ import annotations

import pytest

from streamfuse.errors import CapacityError
from streamfuse.lm.config import LMConfig
from streamfuse.lm.gemma import GemmaModel
from streamfuse.lm.request import EngineStats, Request, RequestHandle, Sequence
from streamfuse.lm.scheduler import HitRateWindow, Scheduler, Work
from streamfuse.lm.sessions import SessionCache
from streamfuse.testing.tiny_lm import tiny_model

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model() -> GemmaModel:
    return tiny_model()


def make(model: GemmaModel, **over: dict) -> Scheduler:
    base: dict = {
        "pool": {"num_slots": 2, "max_tokens": 32},
        "scheduler": {"max_batch_tokens": 10, "prefill_chunk": 4},
        "speculative": {"enabled": False},
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v}
    config = LMConfig.model_validate(base)
    pool = model.kv_pool(num_slots=config.pool.num_slots, max_tokens=config.pool.max_tokens)
    stats = EngineStats()
    return Scheduler(config, pool, SessionCache(pool, stats), model, stats)


_ids = iter(range(1, 1_000_000))


def add(
    sched: Scheduler,
    prompt: list[int],
    session: str | None = None,
    new: int = 5,
    priority: int = 0,
) -> Sequence:
    req = Request(prompt_ids=tuple(prompt), max_new_tokens=new, session=session, priority=priority)
    s = sched.sessions.open(session) if session is not None else None
    seq = Sequence(handle=RequestHandle(None, next(_ids), req), req=req, session=s)  # type: ignore[arg-type]
    sched.add(seq)
    return seq


def commit(sched: Scheduler, work: list[Work]) -> None:
    """What the engine does with a step's results (the model's token is always 9)."""
    for w in work:
        seq = w.seq
        assert seq.slot is not None
        seq.ids.extend(w.tokens)
        if w.kind == "prefill":
            del seq.pending[: len(w.tokens)]
        if w.wants_logits:
            seq.last_token = 9
        sched.pool.set_length(seq.slot, len(seq.ids))


def test_decoding_rows_come_first_then_prompt_chunks_within_the_budget(model: GemmaModel) -> None:
    sched = make(model)
    a = add(sched, [2, 3, 4])
    work = sched.schedule()
    assert [(w.seq, w.kind, w.tokens) for w in work] == [(a, "prefill", [2, 3, 4])]
    commit(sched, work)
    b = add(sched, list(range(10, 30)))  # 20 tokens: chunks of 4
    work = sched.schedule()
    # a decodes (1 row), b prefills one chunk; 5 of 10 rows used.
    assert [(w.seq, w.kind, len(w.tokens)) for w in work] == [(a, "decode", 1), (b, "prefill", 4)]
    assert not work[1].wants_logits  # not the prompt's last chunk: no logits needed
    commit(sched, work)
    steps = 0
    while b.pending:
        work = sched.schedule()
        assert work[0].seq is a and sum(len(w.tokens) for w in work) <= 10
        commit(sched, work)
        steps += 1
    assert steps == 4 and b.last_token == 9  # the last chunk asked for logits


def test_admission_is_first_come_first_served_one_request_per_session(
    model: GemmaModel,
) -> None:
    sched = make(model, scheduler={"max_running": 2})
    first = add(sched, [2, 5], session="s")
    second = add(sched, [6], session="s")  # same session: waits for the first
    other = add(sched, [2, 7])  # may pass it
    sched.schedule()
    assert sched.running == [first, other] and list(sched.waiting) == [second]
    # The pool is full (2 slots, both running): nothing more is admitted...
    late = add(sched, [2, 8])
    sched.schedule()
    assert late in sched.waiting
    # ...until a request ends: the session resumes in its own slot, in order.
    sched.remove(first)
    assert first.session is not None and first.slot is not None
    sched.sessions.end(first.session, first.slot, [2, 5], [])
    sched.schedule()
    assert second in sched.running and second.slot == first.slot and late in sched.waiting
    assert second.ids == [2, 5] and second.pending == [6] and second.base_len == 2


def test_a_full_pool_evicts_an_idle_session_for_a_new_request(model: GemmaModel) -> None:
    sched = make(model)
    for key in ("a", "b"):
        seq = add(sched, [2, 5], session=key)
        commit(sched, sched.schedule())
        sched.remove(seq)
        assert seq.session is not None and seq.slot is not None
        sched.sessions.end(seq.session, seq.slot, seq.ids, [])
    new = add(sched, [2, 9])
    sched.schedule()
    assert new in sched.running and sched.stats.evictions == 1
    a = sched.sessions.get("a")
    assert a is not None and a.slot is None and a.unfed == [2, 5]  # the LRU one went


def test_a_full_slot_is_truncated_to_sink_plus_window(model: GemmaModel) -> None:
    sched = make(model, truncation={"sink_tokens": 2, "window_tokens": 8})
    seq = add(sched, list(range(10, 40)), new=20)  # 30 tokens into a 32-token slot
    commit(sched, sched.schedule())
    while seq.pending:
        commit(sched, sched.schedule())
    seq.base_len = 28  # a rollback point inside the kept window moves with it
    commit(sched, sched.schedule())  # 31 tokens
    commit(sched, sched.schedule())  # 32: full
    assert len(seq.ids) == 32, len(seq.ids)
    work = sched.schedule()  # no room for the next token: truncate first
    assert sched.stats.truncations == 1
    assert seq.ids[:2] == [10, 11] and len(seq.ids) == 10 and work[0].tokens == [9]
    assert sched.pool.length(seq.slot) == 10  # type: ignore[arg-type]
    assert seq.base_len == 28 - 22


def test_reject_policy_refuses_up_front(model: GemmaModel) -> None:
    sched = make(model, truncation={"policy": "reject", "window_tokens": 16})
    with pytest.raises(CapacityError, match="KV slot holds 32"):
        sched.check_fits(30, 5)
    sched.check_fits(27, 5)  # exactly fits


def test_hit_rate_window_weighs_tokens_over_the_last_requests() -> None:
    w = HitRateWindow(3)
    assert w.rate is None
    w.record(0, 0)  # nothing to compute: not a request that says anything
    assert len(w) == 0
    w.record(90, 100)
    w.record(0, 100)
    assert w.rate == pytest.approx(0.45)
    w.record(100, 100)
    w.record(100, 100)  # the first (90, 100) leaves the window
    assert len(w) == 3 and w.rate == pytest.approx(200 / 300)


def prefill_rows(work: list[Work]) -> dict[Sequence, int]:
    return {w.seq: len(w.tokens) for w in work if w.kind == "prefill"}


@pytest.mark.parametrize("reschedule", [True, False])
def test_a_question_has_the_prompt_rows_to_itself_while_prefills_are_heavy(
    model: GemmaModel, reschedule: bool
) -> None:
    sched = make(model, pool={"num_slots": 3}, scheduler={"reschedule": reschedule})
    notes = add(sched, list(range(10, 30)), session="b")  # background, nothing cached
    sched.schedule()  # admitted: the hit rate so far is 0 (every token to compute)
    question = add(sched, list(range(40, 52)), session="a", priority=1)
    work = sched.schedule()
    if reschedule:
        assert prefill_rows(work) == {question: 4}  # the background chunk waits
        assert sched.stats.rescheduled_steps == 1 and sched.stats.deferred_chunks == 1
    else:
        assert prefill_rows(work) == {question: 4, notes: 4}
        assert sched.stats.deferred_chunks == 0
    commit(sched, work)
    while question.pending:
        commit(sched, sched.schedule())
    work = sched.schedule()  # the question decodes now: the background prefill goes on
    assert prefill_rows(work) == {notes: 4}


def test_no_rescheduling_while_the_cache_serves_most_context(model: GemmaModel) -> None:
    sched = make(model, pool={"num_slots": 3})
    for _ in range(20):
        sched.hit_rate.record(95, 100)  # recent requests continued from cached context
    notes = add(sched, list(range(10, 30)), session="b")
    question = add(sched, list(range(40, 52)), session="a", priority=1)
    work = sched.schedule()
    assert sched.hit_rate.rate is not None and sched.hit_rate.rate >= 0.85
    assert prefill_rows(work) == {question: 4, notes: 4}
    assert sched.stats.rescheduled_steps == 0


def test_a_queued_question_lends_its_priority_to_its_sessions_feed(model: GemmaModel) -> None:
    sched = make(model, pool={"num_slots": 3})
    feed = add(sched, list(range(10, 30)), session="a", new=0)  # the question's context
    other = add(sched, list(range(60, 80)), session="b", new=0)
    sched.schedule()
    question = add(sched, [5, 6], session="a", priority=1)  # waits: its feed runs first
    work = sched.schedule()
    assert question in sched.waiting
    # Without the lent priority both feeds rank 0 and share the rows; with it the question's
    # own context goes alone, and nothing waits on a request that cannot start.
    assert prefill_rows(work) == {feed: 4} and other in sched.running
    assert sched.stats.deferred_chunks == 1
