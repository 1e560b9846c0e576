"""LM engine on a real 2-layer Gemma 3: batching, speculation, truncation, LRU, cancel, versions."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from streamfuse.errors import CapacityError
from streamfuse.lm.config import LMConfig
from streamfuse.lm.engine import LMEngine, Request
from streamfuse.lm.gemma import GemmaModel, Segment
from streamfuse.testing.tiny_lm import tiny_model

pytestmark = pytest.mark.unit

NO_STOP: tuple[int, ...] = ()


@pytest.fixture(scope="module")
def model() -> GemmaModel:
    return tiny_model(weights="int8", seed=1)


def make_engine(model: GemmaModel, **over: dict) -> LMEngine:
    base: dict = {
        "pool": {"num_slots": 3, "max_tokens": 64},
        "scheduler": {"max_batch_tokens": 64, "prefill_chunk": 16},
    }
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v}
    return LMEngine(model, LMConfig.model_validate(base))


def reference_greedy(model: GemmaModel, prompt: list[int], n: int) -> list[int]:
    """Plain greedy decoding, one token per forward, in a private pool."""
    pool = model.kv_pool(num_slots=1, max_tokens=len(prompt) + n + 1)
    logits = model.forward(torch.tensor(prompt), [Segment(0, 0, len(prompt))], pool)
    out = [int(logits[-1].argmax())]
    while len(out) < n:
        pos = len(prompt) + len(out) - 1
        logits = model.forward(torch.tensor([out[-1]]), [Segment(0, pos, 1)], pool)
        out.append(int(logits[-1].argmax()))
    return out


_SMALL: dict = {
    "pool": {"num_slots": 3, "max_tokens": 64},
    "scheduler": {"max_batch_tokens": 64, "prefill_chunk": 16},
}

PROMPT_A = [2, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11]  # repetitive: the drafter has matches
PROMPT_B = [2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58]


def test_plain_greedy_matches_reference(model: GemmaModel) -> None:
    eng = make_engine(model)
    out = eng.generate(PROMPT_B, 20, speculative=False, stop_ids=NO_STOP)
    assert out == reference_greedy(model, PROMPT_B, 20)


@pytest.mark.parametrize("prompt", [PROMPT_A, PROMPT_B])
def test_speculative_output_is_token_identical_to_greedy(
    model: GemmaModel, prompt: list[int]
) -> None:
    eng = make_engine(model, speculative={"max_draft": 6})
    out = eng.generate(prompt, 40, speculative=True, stop_ids=NO_STOP)
    assert out == reference_greedy(model, prompt, 40)
    assert eng.stats.draft_tokens > 0
    assert eng.stats.accepted_drafts > 0  # a random tiny model loops, so drafts do land
    assert eng.stats.steps < 40  # fewer forwards than tokens


def test_continuous_batching_gives_each_request_its_solo_output(model: GemmaModel) -> None:
    eng = make_engine(model, pool={"num_slots": 4})
    prompts = [PROMPT_A, PROMPT_B, [2, 7, 9, 11, 13, 15], [2, 60, 61]]
    handles = [
        eng.submit(Request(prompt_ids=tuple(p), max_new_tokens=12, stop_ids=NO_STOP))
        for p in prompts[:2]
    ]
    eng.step()
    eng.step()  # the first two are decoding when the others join
    handles += [
        eng.submit(Request(prompt_ids=tuple(p), max_new_tokens=12, stop_ids=NO_STOP))
        for p in prompts[2:]
    ]
    eng.run_until_idle()
    for p, h in zip(prompts, handles, strict=True):
        assert h.tokens == reference_greedy(model, p, 12)
    assert eng.stats.steps < 4 * 12  # requests shared forwards
    assert eng.pool.num_free == 4


def test_chunked_prefill_does_not_stall_a_decoding_stream(model: GemmaModel) -> None:
    eng = make_engine(
        model, scheduler={"prefill_chunk": 8, "max_batch_tokens": 9}, speculative={"enabled": False}
    )
    short = eng.submit(Request(prompt_ids=(2, 5, 6), max_new_tokens=30, stop_ids=NO_STOP))
    eng.step()  # prefill of the short prompt -> first token
    long_prompt = tuple([2] + list(range(10, 58)))  # 49 tokens = 7 chunks of <= 8
    long = eng.submit(Request(prompt_ids=long_prompt, max_new_tokens=2, stop_ids=NO_STOP))
    per_step = []
    while not long.done:
        before = len(short.tokens)
        eng.step()
        per_step.append(len(short.tokens) - before)
    assert len(per_step) >= 7
    assert all(n == 1 for n in per_step)  # one token every step while the long prompt loads
    eng.run_until_idle()
    assert long.tokens == reference_greedy(model, list(long_prompt), 2)


def test_pool_acquire_release_exhaustion_and_stale_handles(model: GemmaModel) -> None:
    c = model.config
    pool = model.kv_pool(num_slots=2, max_tokens=16)
    a, b = pool.acquire(), pool.acquire()
    assert a is not None and b is not None and a.index != b.index
    assert pool.acquire() is None and pool.num_free == 0
    pool.set_length(a, 5)
    pool.release(a)
    assert pool.num_free == 1
    with pytest.raises(CapacityError):
        pool.length(a)  # stale handle
    with pytest.raises(CapacityError):
        pool.release(a)
    c2 = pool.acquire()
    assert c2 is not None and c2.index == a.index and pool.length(c2) == 0
    with pytest.raises(CapacityError):
        pool.set_length(c2, 17)
    assert pool.nbytes == 2 * c.num_layers * 2 * c.num_kv_heads * 16 * c.head_dim * 4


def test_sink_window_truncation_keeps_sinks_and_recent_tokens(model: GemmaModel) -> None:
    eng = make_engine(
        model, pool={"max_tokens": 32}, truncation={"sink_tokens": 4, "window_tokens": 20}
    )
    ids = [2] + [10 + (i % 80) for i in range(99)]  # 100 tokens through a 32-token slot
    for i in range(0, 100, 10):
        eng.feed("s", ids[i : i + 10]).wait()
    ctx = eng.session_context("s")
    assert eng.stats.truncations >= 3
    assert ctx[:4] == ids[:4]  # attention sinks
    assert ctx[4:] == ids[len(ids) - (len(ctx) - 4) :]  # then the most recent tokens, in order
    assert 4 + 20 <= len(ctx) <= 32
    # Generation keeps running in bounded memory and only ever sees sinks + window.
    out = eng.submit(
        Request(prompt_ids=(5, 6), max_new_tokens=40, session="s", stop_ids=NO_STOP)
    ).wait()
    assert len(out) == 40


def test_lru_evicts_the_least_recently_used_idle_session(model: GemmaModel) -> None:
    eng = make_engine(model, pool={"num_slots": 2})
    eng.feed("a", PROMPT_A).wait()
    eng.feed("b", PROMPT_B).wait()
    before = eng.submit(
        Request(prompt_ids=(7,), max_new_tokens=5, session="b", stop_ids=NO_STOP)
    ).wait()
    eng.feed("a", [20, 21]).wait()  # a is now the most recent; b is the LRU idle session
    eng.feed("c", [2, 30, 31]).wait()  # pool full -> evict b, not a
    assert eng.stats.evictions == 1
    b, a = eng.sessions.get("b"), eng.sessions.get("a")
    assert b is not None and b.slot is None and a is not None and a.slot is not None
    # b's context is recomputed on next use and answers exactly as before.
    again = eng.submit(
        Request(prompt_ids=(7,), max_new_tokens=5, session="b", stop_ids=NO_STOP)
    ).wait()
    assert again == before
    assert eng.stats.evictions == 2  # b needed a slot back: the idle LRU (a) went


def test_cancel_frees_the_slot_at_once(model: GemmaModel) -> None:
    eng = make_engine(model, pool={"num_slots": 2})
    h = eng.submit(Request(prompt_ids=tuple(PROMPT_B), max_new_tokens=50, stop_ids=NO_STOP))
    eng.step()
    eng.step()
    assert eng.pool.num_free == 1 and not h.done
    assert h.cancel() is True
    assert eng.pool.num_free == 2  # no step needed
    assert h.done and h.finish_reason == "cancelled" and 1 <= len(h.tokens) < 50
    assert h.cancel() is False
    assert eng.step() == 0  # nothing left to run


def test_cancel_from_another_thread_while_the_engine_runs(model: GemmaModel) -> None:
    eng = make_engine(model, pool={"num_slots": 1}, speculative={"enabled": False})
    eng.start()
    try:
        h = eng.submit(Request(prompt_ids=tuple(PROMPT_B), max_new_tokens=10_000, stop_ids=NO_STOP))
        while len(h.tokens) < 3:
            time.sleep(0.001)
        freed = threading.Event()
        t = threading.Thread(target=lambda: (h.cancel(), freed.set()))
        t.start()
        t.join(timeout=5)
        assert freed.is_set() and eng.pool.num_free == 1
        nxt = eng.submit(Request(prompt_ids=tuple(PROMPT_A), max_new_tokens=8, stop_ids=NO_STOP))
        assert nxt.wait(timeout=10) == reference_greedy(model, PROMPT_A, 8)
    finally:
        eng.stop()


def test_interrupt_cuts_a_session_generation_at_a_token_boundary(model: GemmaModel) -> None:
    eng = make_engine(model)
    eng.feed("s", PROMPT_B).wait()
    h = eng.submit(Request(prompt_ids=(9,), max_new_tokens=100, session="s", stop_ids=NO_STOP))
    for _ in range(4):
        eng.step()
    assert eng.interrupt("s") is True
    assert h.finish_reason == "interrupted" and len(h.tokens) >= 3
    assert eng.session_context("s") == PROMPT_B  # the question and partial answer rolled back


def test_session_version_gates_prefix_reuse(model: GemmaModel) -> None:
    eng = make_engine(model, speculative={"enabled": False})
    eng.feed("s", PROMPT_B, version=1).wait()
    prefilled = eng.stats.prefill_tokens
    q = Request(prompt_ids=(7, 8), max_new_tokens=6, session="s", version=1, stop_ids=NO_STOP)
    same = eng.submit(q).wait()
    assert eng.stats.prefill_tokens - prefilled == 2  # only the question: the prefix was reused
    assert same == reference_greedy(model, PROMPT_B + [7, 8], 6)
    assert eng.session_context("s") == PROMPT_B  # the question and answer were rolled back
    # Version 2: the cached prefix must not be used even though the tokens would allow it.
    prefilled = eng.stats.prefill_tokens
    eng.feed("s", PROMPT_B, version=2).wait()
    assert eng.stats.invalidations == 1
    assert eng.stats.prefill_tokens - prefilled == len(PROMPT_B)  # recomputed from scratch
    again = eng.submit(
        Request(prompt_ids=(7, 8), max_new_tokens=6, session="s", version=2, stop_ids=NO_STOP)
    ).wait()
    assert again == same
    # A request carrying a stale version drops the context too (it is not silently mixed).
    eng.submit(
        Request(
            prompt_ids=tuple(PROMPT_A), max_new_tokens=2, session="s", version=1, stop_ids=NO_STOP
        )
    ).wait()
    assert eng.stats.invalidations == 2
    assert eng.session_context("s") == []


def test_a_request_that_can_never_fit_is_refused_clearly(model: GemmaModel) -> None:
    eng = make_engine(
        model, pool={"max_tokens": 32}, truncation={"policy": "reject", "window_tokens": 16}
    )
    with pytest.raises(CapacityError, match="KV slot holds 32"):
        eng.submit(Request(prompt_ids=tuple(range(2, 30)), max_new_tokens=10))
    assert eng.submit(Request(prompt_ids=tuple(range(2, 20)), max_new_tokens=10)).wait()


def test_decode_loop_never_reallocates_or_copies_the_kv_cache(model: GemmaModel) -> None:
    """The pool is allocated once; decode steps write into it and allocate nothing cache-sized."""
    from torch.profiler import ProfilerActivity, profile

    eng = make_engine(
        model, pool={"num_slots": 3, "max_tokens": 256}, speculative={"enabled": False}
    )
    pointers = eng.pool.storage_pointers()
    h = eng.submit(Request(prompt_ids=tuple(PROMPT_B), max_new_tokens=200, stop_ids=NO_STOP))
    h2 = eng.submit(Request(prompt_ids=tuple(PROMPT_A), max_new_tokens=200, stop_ids=NO_STOP))
    eng.step()  # prefill both

    def step_allocations() -> list[int]:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            eng.step()
        return [e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0]

    early = step_allocations()
    for _ in range(150):
        eng.step()
    late = step_allocations()
    assert eng.pool.storage_pointers() == pointers
    slot_layer_bytes = eng.pool.k[0][0].numel() * 4  # one slot's keys of one layer
    assert max(early + late) < slot_layer_bytes  # nothing cache-sized is ever allocated
    # Per-step temporaries are activations: they do not grow with the 150 cached tokens added
    # (apart from the attention scores, 4 bytes x heads x tokens per layer).
    growth = sum(late) - sum(early)
    c = model.config
    assert growth <= 4 * c.num_heads * 160 * c.num_layers * 2 * 2
    h.cancel()
    h2.cancel()


def test_leading_stop_ids_do_not_end_an_answer_before_its_text(model: GemmaModel) -> None:
    full = reference_greedy(model, PROMPT_B, 20)
    first = full[0]
    eng = make_engine(model)
    # As a plain stop id, the first token ends the answer at once (the empty-answer case).
    plain = Request(prompt_ids=tuple(PROMPT_B), max_new_tokens=20, stop_ids=(first,))
    assert eng.submit(plain).wait() == [first]
    # As a leading id it is kept; the answer stops at the first later occurrence after text
    # (or runs to the length limit when there is none).
    out = eng.submit(
        Request(
            prompt_ids=tuple(PROMPT_B),
            max_new_tokens=20,
            stop_ids=(first,),
            leading_ids=(first,),
            speculative=False,
        )
    ).wait()
    n_lead = next((i for i, t in enumerate(full) if t != first), len(full))
    later = [i for i, t in enumerate(full) if t == first and i > n_lead]
    assert out == full[: later[0] + 1] if later else out == full


class ThreadSpy(GemmaModel):
    """The tiny model, recording torch's thread count on the thread running each forward."""

    seen: list[int]

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.seen.append(torch.get_num_threads())
        return super().forward(*args, **kwargs)


def test_the_engine_thread_uses_its_threads_and_restores_the_process_value(
    model: GemmaModel,
) -> None:
    spy = ThreadSpy(model.config, model.weights)
    spy.seen = []
    eng = LMEngine(spy, LMConfig.model_validate({"model": {"threads": 2}, **_SMALL}))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eng.start()
        eng.submit(Request(prompt_ids=tuple(PROMPT_B), max_new_tokens=4, stop_ids=NO_STOP)).wait(
            timeout=30
        )
        eng.stop()
        assert spy.seen and set(spy.seen) == {2}  # the engine's forwards ran with its count
        # ...and the process value is back: for this thread and for threads started later.
        assert torch.get_num_threads() == 1
        later: list[int] = []
        t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert later == [1]
    finally:
        eng.stop()
        torch.set_num_threads(before)


def test_cancelling_a_queued_request_leaves_the_running_one_of_its_session_alone(
    model: GemmaModel,
) -> None:
    eng = make_engine(
        model, pool={"num_slots": 2, "max_tokens": 128}, speculative={"enabled": False}
    )
    eng.feed("s", PROMPT_B).wait()
    running = eng.submit(Request(prompt_ids=(7,), max_new_tokens=40, session="s", stop_ids=NO_STOP))
    eng.step()
    queued = eng.submit(Request(prompt_ids=(8,), max_new_tokens=3, session="s"))
    assert queued.cancel() is True
    eng.feed("c", [2, 30, 31]).wait()  # the second slot; "c" is idle afterwards
    eng.feed("d", [2, 40, 41]).wait(timeout=10)  # pool full: evict an idle session
    # "s" still runs a request, so "c" was the one to go, and the answer is undisturbed.
    c, s_ = eng.sessions.get("c"), eng.sessions.get("s")
    assert c is not None and c.slot is None and s_ is not None and s_.slot is not None
    assert running.wait(timeout=10) == reference_greedy(model, PROMPT_B + [7], 40)
