"""The LM engine: continuous batching over the KV slot pool, with sessions and cancellation.

Each `step()` runs one forward over a flat batch: every decoding sequence contributes its last
token (plus prompt-lookup drafts when speculative decoding is on) and waiting prompts add
chunks of at most `prefill_chunk` tokens within `max_batch_tokens`, so a long prompt never
stalls the others. New requests join between steps.

Sessions keep a per-stream rolling context in a slot between requests (`feed` appends input,
`submit` asks). A session's context carries a version: a request whose version differs drops
the cached context (invalidation) instead of reusing it. Idle sessions' slots are evicted
least-recently-used when the pool is full; an evicted context is recomputed on next use. A
slot that fills up is truncated to sink + window tokens (StreamingLLM), or the request is
refused up front under the 'reject' policy. `cancel` frees a request's slot at once, from any
thread, even while a step is running.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from streamfuse.errors import CapacityError, ConfigError
from streamfuse.lm.config import LMConfig
from streamfuse.lm.gemma import GemmaModel, Segment
from streamfuse.lm.kv_pool import Slot
from streamfuse.lm.speculative import NgramDrafter, accept_greedy

log = logging.getLogger(__name__)

FinishReason = Literal["length", "stop", "cancelled", "interrupted", "error"]
TokenCallback = Callable[["RequestHandle", list[int]], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One generation (or, with `max_new_tokens=0`, one context feed).

    `prompt_ids` are appended to the session's context (or form the whole context when
    `session` is None). With `keep_output=False` a session's context is rolled back to what it
    was before the request once it finishes (the answer does not pollute the context).
    """

    prompt_ids: tuple[int, ...]
    max_new_tokens: int = 64
    session: str | None = None
    version: int = 0
    keep_output: bool = False
    speculative: bool | None = None  # None: the engine's configured default
    stop_ids: tuple[int, ...] | None = None  # None: the model's end-of-sequence ids
    #: Stop ids that do not stop the answer while nothing but them has been generated (a base
    #: model often opens an answer with a line break before the text).
    leading_ids: tuple[int, ...] = ()


@dataclass
class EngineStats:
    """Counters since the engine started (read them; the engine only increments)."""

    steps: int = 0
    forward_rows: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    draft_tokens: int = 0
    accepted_drafts: int = 0
    reused_tokens: int = 0
    recomputed_tokens: int = 0
    invalidations: int = 0
    evictions: int = 0
    truncations: int = 0
    cancellations: int = 0
    forward_s: float = 0.0


class RequestHandle:
    """What `submit` returns: generated tokens so far, completion, cancellation."""

    def __init__(self, engine: LMEngine, request_id: int, request: Request) -> None:
        self._engine = engine
        self.id = request_id
        self.request = request
        self.tokens: list[int] = []
        self.finish_reason: FinishReason | None = None
        self.error: BaseException | None = None
        self.submitted_wall = time.monotonic()
        self.first_token_wall: float | None = None
        self.finished_wall: float | None = None
        self._done = threading.Event()
        self._callbacks: list[TokenCallback] = []

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def on_tokens(self, callback: TokenCallback) -> None:
        """Call `callback(handle, new_tokens)` from the engine thread as tokens are produced
        (and once with [] when the request finishes)."""
        self._callbacks.append(callback)

    def wait(self, timeout: float | None = None) -> list[int]:
        """Block until finished (drives the engine itself when no background loop runs)."""
        if not self._engine.running_in_background:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self.done:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"request {self.id} not finished after {timeout} s")
                if self._engine.step() == 0 and not self.done:
                    time.sleep(0.001)
        elif not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} not finished after {timeout} s")
        if self.error is not None:
            raise self.error
        return list(self.tokens)

    def cancel(self) -> bool:
        """Stop now; the slot is free when this returns. False if it had already finished."""
        return self._engine.cancel(self)

    def _emit(self, new: list[int]) -> None:
        for cb in self._callbacks:
            try:
                cb(self, new)
            except Exception:  # a consumer's bug must not kill the engine loop
                log.exception("token callback of request %d failed", self.id)

    def __repr__(self) -> str:
        return f"<RequestHandle {self.id} tokens={len(self.tokens)} finish={self.finish_reason}>"


@dataclass
class _Session:
    key: str
    version: int = 0
    slot: Slot | None = None
    ids: list[int] = field(default_factory=list)  # context, in slot order (sinks + window)
    unfed: list[int] = field(default_factory=list)  # context tokens not yet in the slot
    last_used: float = 0.0
    active: _Seq | None = None


@dataclass(eq=False)
class _Seq:
    handle: RequestHandle
    req: Request
    session: _Session | None
    slot: Slot | None = None
    ids: list[int] = field(default_factory=list)  # tokens whose K/V are in the slot
    pending: list[int] = field(default_factory=list)  # still to prefill
    last_token: int | None = None  # sampled, not yet in the slot
    base_len: int = 0  # session context length before this request (rollback point)
    drafter: NgramDrafter | None = None
    speculative: bool = False
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class _Work:
    seq: _Seq
    tokens: list[int]  # rows fed for this sequence
    kind: Literal["prefill", "decode"]
    drafts: list[int]
    wants_logits: bool


class LMEngine:
    """Continuous-batching greedy generation over a `GemmaModel` and a `KVPool`."""

    def __init__(self, model: GemmaModel, config: LMConfig | None = None) -> None:
        self.model = model
        self.config = config or LMConfig()
        c, pc = model.config, self.config.pool
        self.pool = model.kv_pool(num_slots=pc.num_slots, max_tokens=pc.max_tokens)
        self.stats = EngineStats()
        self.default_stop_ids: tuple[int, ...] = tuple(c.eos_token_ids)
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._stop = False
        self._step_lock = threading.Lock()  # one forward at a time
        t = self.config.truncation
        self._sink = t.sink_tokens
        self._window = self.config.window_tokens

    # -- public API ---------------------------------------------------------------------------
    @property
    def running_in_background(self) -> bool:
        return self._thread is not None

    def submit(self, request: Request) -> RequestHandle:
        """Queue a request (thread-safe). Raises `CapacityError` if it can never fit."""
        if request.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be >= 0, got {request.max_new_tokens}")
        vocab = self.model.config.vocab_size
        bad = [t for t in request.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        with self._lock:
            session = self._session(request.session) if request.session is not None else None
            context = 0
            if session is not None and session.version == request.version:
                context = len(session.ids) + len(session.unfed)
            if context + len(request.prompt_ids) == 0:
                raise ConfigError("empty prompt and no session context to continue from")
            self._check_fits(context + len(request.prompt_ids), request.max_new_tokens)
            handle = RequestHandle(self, next(self._ids), request)
            self._waiting.append(_Seq(handle=handle, req=request, session=session))
            self._wake.notify_all()
        return handle

    def feed(self, session: str, prompt_ids: Sequence[int], version: int = 0) -> RequestHandle:
        """Append input to a session's context (prefill only, nothing generated)."""
        req = Request(
            prompt_ids=tuple(prompt_ids),
            max_new_tokens=0,
            session=session,
            version=version,
            keep_output=True,
        )
        return self.submit(req)

    def generate(
        self,
        prompt_ids: Sequence[int],
        max_new_tokens: int = 64,
        *,
        session: str | None = None,
        version: int = 0,
        speculative: bool | None = None,
        stop_ids: tuple[int, ...] | None = None,
    ) -> list[int]:
        """Submit and wait (drives the engine when no background loop runs)."""
        req = Request(
            prompt_ids=tuple(prompt_ids),
            max_new_tokens=max_new_tokens,
            session=session,
            version=version,
            speculative=speculative,
            stop_ids=stop_ids,
        )
        return self.submit(req).wait()

    def cancel(self, handle: RequestHandle, reason: FinishReason = "cancelled") -> bool:
        """Finish `handle` now and free its slot (thread-safe; no need to wait for a step)."""
        with self._lock:
            if handle.done:
                return False
            seq = self._find(handle)
            if seq is None:
                return False
            seq.cancelled = True
            if seq in self._running:
                self._running.remove(seq)
            else:
                self._waiting.remove(seq)
            self.stats.cancellations += 1
            self._finish(seq, reason)
            return True

    def interrupt(self, session: str) -> bool:
        """Cut the session's running generation at the current token boundary."""
        with self._lock:
            s = self._sessions.get(session)
            if s is None or s.active is None:
                return False
            return self.cancel(s.active.handle, reason="interrupted")

    def invalidate(self, session: str) -> None:
        """Drop a session's cached context (its next request starts from scratch)."""
        with self._lock:
            s = self._sessions.get(session)
            if s is None:
                return
            if s.active is not None:
                self.cancel(s.active.handle)
            self._reset_session(s, s.version)
            self.stats.invalidations += 1

    def close_session(self, session: str) -> None:
        """Forget a session and free its slot."""
        with self._lock:
            s = self._sessions.get(session)
            if s is None:
                return
            if s.active is not None:
                self.cancel(s.active.handle)
            for seq in [q for q in self._waiting if q.session is s]:
                self.cancel(seq.handle)
            if s.slot is not None and self.pool.is_live(s.slot):
                self.pool.release(s.slot)
            del self._sessions[session]

    def session_context(self, session: str) -> list[int]:
        """The token ids of a session's context as the model sees it (sinks + window)."""
        with self._lock:
            s = self._sessions.get(session)
            return [] if s is None else list(s.ids) + list(s.unfed)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._running or self._waiting)

    def run_until_idle(self) -> None:
        while self.busy:
            self.step()

    # -- background loop ----------------------------------------------------------------------
    def start(self) -> None:
        """Run steps on a daemon thread until `stop()`; handles' `wait` then just waits."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="sf-lm-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop = True
            self._wake.notify_all()
        if thread is not None:
            thread.join()

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not (self._running or self._waiting):
                    self._wake.wait(timeout=0.5)
                if self._stop:
                    return
            try:
                self.step()
            except Exception:
                log.exception("LM engine step failed")

    # -- one step -----------------------------------------------------------------------------
    def step(self) -> int:
        """Run one batched forward; returns the number of rows processed (0: nothing to do)."""
        with self._step_lock:
            with self._lock:
                self._admit()
                work = self._plan()
                if not work:
                    return 0
                ids: list[int] = []
                segments: list[Segment] = []
                out_rows: list[int] = []
                for w in work:
                    assert w.seq.slot is not None
                    start = len(w.seq.ids)
                    if w.wants_logits:
                        first = len(ids) if w.kind == "decode" else len(ids) + len(w.tokens) - 1
                        out_rows.extend(range(first, len(ids) + len(w.tokens)))
                    segments.append(Segment(w.seq.slot.index, start, len(w.tokens)))
                    ids.extend(w.tokens)
            t0 = time.perf_counter()
            try:
                next_ids = self.model.forward(
                    torch.tensor(ids, dtype=torch.long),
                    segments,
                    self.pool,
                    out_rows=torch.tensor(out_rows, dtype=torch.long) if out_rows else None,
                    return_hidden=not out_rows,
                    greedy=True,
                )
                preds = next_ids.tolist() if out_rows else []
            except Exception as e:
                log.exception("LM forward failed")
                with self._lock:
                    for w in work:
                        if not w.seq.cancelled:
                            w.seq.handle.error = e
                            self._running.remove(w.seq)
                            self._finish(w.seq, "error")
                return len(ids)
            dt = time.perf_counter() - t0
            with self._lock:
                self.stats.steps += 1
                self.stats.forward_rows += len(ids)
                self.stats.forward_s += dt
                self._commit(work, preds)
            return len(ids)

    # -- scheduling ---------------------------------------------------------------------------
    def _admit(self) -> None:
        sc = self.config.scheduler
        blocked: set[str] = set()
        pool_full = False
        for seq in list(self._waiting):
            if len(self._running) >= sc.max_running:
                break
            s = seq.session
            if s is not None and (s.active is not None or s.key in blocked):
                blocked.add(s.key)  # one request per session at a time, in order
                continue
            if s is not None and s.slot is not None:
                slot: Slot | None = s.slot  # an idle session resumes in its own slot
            elif pool_full:
                continue
            else:
                slot = self._take_slot()
            if slot is None:
                pool_full = True  # every slot runs: wait for one to finish
                if s is not None:
                    blocked.add(s.key)
                continue
            self._waiting.remove(seq)
            self._start(seq, slot)
            self._running.append(seq)

    def _take_slot(self) -> Slot | None:
        slot = self.pool.acquire()
        if slot is not None:
            return slot
        idle = [s for s in self._sessions.values() if s.slot is not None and s.active is None]
        if not idle:
            return None
        # Least recently used first, sparing sessions that already have a request queued.
        queued = {q.session.key for q in self._waiting if q.session is not None}
        victim = min(idle, key=lambda s: (s.key in queued, s.last_used))
        assert victim.slot is not None
        log.debug("evicting idle session %r (LRU)", victim.key)
        self.pool.release(victim.slot)
        victim.slot = None
        victim.unfed = victim.ids + victim.unfed  # recomputed on next use
        victim.ids = []
        self.stats.evictions += 1
        return self.pool.acquire()

    def _start(self, seq: _Seq, slot: Slot) -> None:
        req, s = seq.req, seq.session
        seq.slot = slot
        if s is None:
            seq.pending = list(req.prompt_ids)
        else:
            s.active = seq
            s.last_used = time.monotonic()
            if s.version != req.version:
                if s.ids or s.unfed:
                    self.stats.invalidations += 1
                self._reset_session(s, req.version)
            s.slot = slot
            if self.pool.length(slot) != len(s.ids):  # evicted/re-acquired: start clean
                s.unfed = s.ids + s.unfed
                s.ids = []
                self.pool.set_length(slot, 0)
            self.stats.reused_tokens += len(s.ids)
            self.stats.recomputed_tokens += len(s.unfed)
            seq.ids = list(s.ids)
            seq.pending = s.unfed + list(req.prompt_ids)
            s.unfed = []
            seq.base_len = len(seq.ids) + len(seq.pending) - len(req.prompt_ids)
        spec = self.config.speculative
        seq.speculative = spec.enabled if req.speculative is None else req.speculative
        if seq.speculative and req.max_new_tokens > 1:
            seq.drafter = NgramDrafter(
                seq.ids + seq.pending,
                max_ngram=spec.max_ngram,
                min_ngram=spec.min_ngram,
                window=spec.lookup_tokens,
                max_draft=spec.max_draft,
            )

    def _plan(self) -> list[_Work]:
        sc = self.config.scheduler
        budget = sc.max_batch_tokens
        work: list[_Work] = []
        # Decoding sequences first: they are latency-critical and cost one row each.
        for seq in self._running:
            if seq.pending or seq.last_token is None or budget <= 0:
                continue
            drafts: list[int] = []
            if seq.drafter is not None:
                left = seq.req.max_new_tokens - len(seq.handle.tokens) - 1
                k = min(seq.drafter.allowance(), left, budget - 1)
                drafts = seq.drafter.draft(k)
            tokens = [seq.last_token, *drafts]
            if not self._make_room(seq, len(tokens)):
                tokens = tokens[: self._room(seq)]
                drafts = tokens[1:]
            work.append(_Work(seq, tokens, "decode", drafts, True))
            budget -= len(tokens)
        # Then prompt chunks, oldest first, within what is left of the budget.
        for seq in self._running:
            if not seq.pending or budget <= 0:
                continue
            n = min(len(seq.pending), sc.prefill_chunk, budget)
            self._make_room(seq, n)
            n = min(n, self._room(seq))
            if n <= 0:
                continue
            tokens = seq.pending[:n]
            last = n == len(seq.pending)
            work.append(_Work(seq, tokens, "prefill", [], last and seq.req.max_new_tokens > 0))
            budget -= n
        return work

    def _room(self, seq: _Seq) -> int:
        return self.pool.max_tokens - len(seq.ids)

    def _make_room(self, seq: _Seq, n: int) -> bool:
        """Truncate `seq`'s slot to sink + window if `n` more tokens would not fit."""
        if len(seq.ids) + n <= self.pool.max_tokens:
            return True
        if self.config.truncation.policy != "sink_window":  # admitted, so it fits: defensive
            raise CapacityError(
                f"sequence needs {len(seq.ids) + n} tokens > slot size {self.pool.max_tokens}"
            )
        assert seq.slot is not None
        sink, keep = self._sink, self._window
        old = len(seq.ids)
        new_len = self.model.compact(self.pool, seq.slot.index, old, sink, keep)
        shift = old - new_len
        if shift > 0:
            seq.ids = seq.ids[:sink] + seq.ids[old - keep :]
            self.pool.set_length(seq.slot, new_len)
            # The rollback point moves with the tokens; if it fell into the evicted middle the
            # answer's start was evicted too, so keep what survived.
            if seq.base_len >= old - keep:
                seq.base_len -= shift
            elif seq.base_len > sink:
                seq.base_len = sink
            self.stats.truncations += 1
        return len(seq.ids) + n <= self.pool.max_tokens

    def _check_fits(self, context: int, max_new: int) -> None:
        if self.config.truncation.policy == "sink_window":
            return
        need = context + max_new
        if need > self.pool.max_tokens:
            raise CapacityError(
                f"request needs {need} tokens ({context} context + {max_new} new) but a KV slot "
                f"holds {self.pool.max_tokens} and truncation policy is 'reject'; raise "
                "pool.max_tokens, shorten the input, or use policy 'sink_window'"
            )

    # -- results ------------------------------------------------------------------------------
    def _commit(self, work: list[_Work], preds: list[int]) -> None:
        cursor = 0
        for w in work:
            seq = w.seq
            n_out = len(w.tokens) if w.kind == "decode" else int(w.wants_logits)
            mine = preds[cursor : cursor + n_out]
            cursor += n_out
            if seq.cancelled or seq.slot is None or not self.pool.is_live(seq.slot):
                continue  # cancelled while the forward ran: its slot is already free
            if w.kind == "prefill":
                seq.ids.extend(w.tokens)
                del seq.pending[: len(w.tokens)]
                self.stats.prefill_tokens += len(w.tokens)
                self.pool.set_length(seq.slot, len(seq.ids))
                if seq.pending:
                    continue
                if seq.req.max_new_tokens == 0:
                    self._running.remove(seq)
                    self._finish(seq, "length")
                    continue
                new = mine
                accepted = 0
            else:
                new = accept_greedy(w.drafts, mine)
                accepted = len(new) - 1
                # Rows t0, d1..d_accepted are now valid cache entries; the rest roll back.
                seq.ids.extend(w.tokens[: 1 + accepted])
                self.pool.set_length(seq.slot, len(seq.ids))
                self.stats.draft_tokens += len(w.drafts)
                self.stats.accepted_drafts += accepted
                if seq.drafter is not None:
                    seq.drafter.observe(len(w.drafts), accepted)
            self._emit(seq, new)

    def _emit(self, seq: _Seq, new: list[int]) -> None:
        req, handle = seq.req, seq.handle
        stops = set(self.default_stop_ids if req.stop_ids is None else req.stop_ids)
        room = req.max_new_tokens - len(handle.tokens)
        out: list[int] = []
        reason: FinishReason | None = None
        lead = req.leading_ids
        only_lead = bool(lead) and all(x in lead for x in handle.tokens)
        for t in new[:room]:
            out.append(t)
            if t in stops and not (only_lead and t in lead):
                reason = "stop"
                break
            only_lead = only_lead and t in lead
        if reason is None and len(handle.tokens) + len(out) >= req.max_new_tokens:
            reason = "length"
        if out and handle.first_token_wall is None:
            handle.first_token_wall = time.monotonic()
        if len(out) < len(new) and seq.slot is not None:
            # Accepted drafts beyond a stop token / the length limit leave the cache again.
            del seq.ids[len(seq.ids) - (len(new) - len(out)) :]
            self.pool.set_length(seq.slot, len(seq.ids))
        handle.tokens.extend(out)
        self.stats.decode_tokens += len(out)
        seq.last_token = out[-1] if out else None
        if seq.drafter is not None:
            seq.drafter.extend(out)
        if out:
            handle._emit(out)
        if reason is not None and not seq.cancelled:  # a callback may have cancelled it
            self._running.remove(seq)
            self._finish(seq, reason)

    def _finish(self, seq: _Seq, reason: FinishReason) -> None:
        handle = seq.handle
        s = seq.session
        if seq.slot is not None:
            if s is None:
                if self.pool.is_live(seq.slot):
                    self.pool.release(seq.slot)
            elif seq.req.keep_output or seq.req.max_new_tokens == 0:
                s.ids = list(seq.ids)
                tail = [seq.last_token] if seq.last_token is not None else []
                s.unfed = list(seq.pending) + tail
            else:
                # Roll the context back to before the request: just a shorter slot length.
                ctx = seq.base_len
                if len(seq.ids) >= ctx:
                    s.ids, s.unfed = list(seq.ids[:ctx]), []
                else:  # cancelled before the context was fully prefilled
                    s.ids, s.unfed = list(seq.ids), list(seq.pending[: ctx - len(seq.ids)])
                self.pool.set_length(seq.slot, len(s.ids))
            if s is not None:
                s.slot = seq.slot
        if s is not None:
            s.active = None
            s.last_used = time.monotonic()
        seq.slot = None
        handle.finish_reason = reason
        handle.finished_wall = time.monotonic()
        handle._done.set()
        handle._emit([])

    # -- sessions -----------------------------------------------------------------------------
    def _session(self, key: str) -> _Session:
        s = self._sessions.get(key)
        if s is None:
            s = _Session(key=key, last_used=time.monotonic())
            self._sessions[key] = s
        return s

    def _reset_session(self, s: _Session, version: int) -> None:
        s.version = version
        s.ids = []
        s.unfed = []
        if s.slot is not None and self.pool.is_live(s.slot):
            self.pool.set_length(s.slot, 0)

    def _find(self, handle: RequestHandle) -> _Seq | None:
        for seq in itertools.chain(self._running, self._waiting):
            if seq.handle is handle:
                return seq
        return None
