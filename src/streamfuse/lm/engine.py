"""The LM engine: continuous batching over the KV slot pool, with sessions and cancellation.

Each `step()` asks the `Scheduler` (lm/scheduler.py) for the step's rows, runs one batched
forward, commits the sampled tokens to their sequences and emits them to the handles. Requests
join between steps; `cancel` frees a request's slot at once, from any thread, even while a step
is running. Sessions (lm/sessions.py) keep a per-stream rolling context in a slot between
requests: `feed` appends input, `submit` asks, `close_session` frees it. Forwards run with
`config.model.threads` torch threads on the engine's own thread (`start`); the engine leaves
the process's setting as it found it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Sequence as Seq

import torch

from streamfuse.errors import ConfigError
from streamfuse.lm.config import LMConfig
from streamfuse.lm.dropping import AttentionAccumulator, method_plan
from streamfuse.lm.gemma import GemmaModel, Segment
from streamfuse.lm.kv_pool import Slot
from streamfuse.lm.request import (
    EngineStats,
    FinishReason,
    Request,
    RequestHandle,
    Sequence,
    TokenCallback,
)
from streamfuse.lm.scheduler import Scheduler, Work
from streamfuse.lm.sessions import SessionCache
from streamfuse.lm.speculative import accept_greedy

__all__ = [
    "EngineStats",
    "FinishReason",
    "LMEngine",
    "Request",
    "RequestHandle",
    "TokenCallback",
]

log = logging.getLogger(__name__)


class LMEngine:
    """Continuous-batching greedy generation over a `GemmaModel` and a `KVPool`."""

    def __init__(self, model: GemmaModel, config: LMConfig | None = None) -> None:
        self.model = model
        self.config = config or LMConfig()
        c, pc = model.config, self.config.pool
        self.pool = model.kv_pool(num_slots=pc.num_slots, max_tokens=pc.max_tokens)
        self.stats = EngineStats()
        self.attention: AttentionAccumulator | None = None
        if self.config.truncation.policy == "heavy_hitter":
            self.attention = AttentionAccumulator(pc.num_slots, pc.max_tokens)
        move = self.config.truncation.removed_windows == "move"
        self.sessions = SessionCache(
            self.pool, self.stats, compact=self._move_rows if move else None
        )
        self.scheduler = Scheduler(
            self.config, self.pool, self.sessions, model, self.stats, self.attention
        )
        self.default_stop_ids: tuple[int, ...] = tuple(c.eos_token_ids)
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._stop = False
        self._step_lock = threading.Lock()  # one forward at a time

    # -- public API ---------------------------------------------------------------------------
    @property
    def running_in_background(self) -> bool:
        return self._thread is not None

    def submit(self, request: Request) -> RequestHandle:
        """Queue a request (thread-safe). Raises `CapacityError` if it can never fit."""
        if request.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be >= 0, got {request.max_new_tokens}")
        if request.keep_ratio is not None:
            if not 0.0 < request.keep_ratio <= 1.0:
                raise ConfigError(f"keep_ratio must be in (0, 1], got {request.keep_ratio}")
            if request.session is not None and not request.keep_output:
                # Rolling back would need the dropped prefix: drop in feeds or one-shot prompts.
                raise ConfigError("keep_ratio on a session request needs keep_output=True")
            if not 1 <= request.query_tokens <= len(request.prompt_ids):
                raise ConfigError(
                    f"query_tokens={request.query_tokens} must be in [1, "
                    f"{len(request.prompt_ids)}] (the prompt's trailing question)"
                )
        vocab = self.model.config.vocab_size
        bad = [t for t in request.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        with self._lock:
            key = request.session
            session = self.sessions.open(key) if key is not None else None
            if request.windows is not None and key is None:
                raise ConfigError("windows describe a session's context: set Request.session")
            if key is None:
                context = 0
            elif request.windows is not None:
                context = self.sessions.windows_len(request.windows)
            else:
                context = self.sessions.context_len(key, request.version)
            if context + len(request.prompt_ids) == 0:
                raise ConfigError("empty prompt and no session context to continue from")
            self.scheduler.check_fits(context + len(request.prompt_ids), request.max_new_tokens)
            handle = RequestHandle(self, next(self._ids), request)
            self.scheduler.add(Sequence(handle=handle, req=request, session=session))
            self._wake.notify_all()
        return handle

    def feed(
        self,
        session: str,
        prompt_ids: Seq[int],
        version: int = 0,
        *,
        keep_ratio: float | None = None,
        query_tokens: int = 1,
    ) -> RequestHandle:
        """Append input to a session's context (prefill only, nothing generated); with
        `keep_ratio`, only the tokens token dropping keeps (ranked by the last `query_tokens`)."""
        req = Request(
            prompt_ids=tuple(prompt_ids),
            max_new_tokens=0,
            session=session,
            version=version,
            keep_output=True,
            keep_ratio=keep_ratio,
            query_tokens=min(query_tokens, len(prompt_ids)) if keep_ratio else 1,
        )
        return self.submit(req)

    def generate(
        self,
        prompt_ids: Seq[int],
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
            seq = self.scheduler.find(handle)
            if seq is None:
                return False
            seq.cancelled = True
            self.scheduler.remove(seq)
            self.stats.cancellations += 1
            self._finish(seq, reason)
            return True

    def interrupt(self, session: str) -> bool:
        """Cut the session's running generation at the current token boundary."""
        with self._lock:
            seq = self._running_in(session)
            return seq is not None and self.cancel(seq.handle, reason="interrupted")

    def close_session(self, session: str) -> None:
        """End the session's requests (running and queued), forget it and free its slot."""
        with self._lock:
            for seq in list(self.scheduler):
                if seq.session is not None and seq.session.key == session:
                    self.cancel(seq.handle)
            self.sessions.close(session)

    def session_context(self, session: str) -> list[int]:
        """The token ids of a session's context as the model sees it (sinks + window)."""
        with self._lock:
            s = self.sessions.get(session)
            return [] if s is None else s.context

    @property
    def busy(self) -> bool:
        with self._lock:
            return self.scheduler.has_work

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
        # torch's intra-op thread count is per process for threads started later: set ours for
        # this thread's forwards and put the process value back when the loop ends.
        before = torch.get_num_threads()
        torch.set_num_threads(self.config.model.threads)
        try:
            while True:
                with self._lock:
                    while not self._stop and not self.scheduler.has_work:
                        self._wake.wait(timeout=0.5)
                    if self._stop:
                        return
                try:
                    self.step()
                except Exception:
                    log.exception("LM engine step failed")
        finally:
            torch.set_num_threads(before)

    # -- one step -----------------------------------------------------------------------------
    def step(self) -> int:
        """Run one batched forward; returns the number of rows processed (0: nothing to do)."""
        with self._step_lock:
            with self._lock:
                work = self.scheduler.schedule()
                for seq in self.scheduler.take_fed():
                    # A feed whose context was cached whole (the same windows sent again):
                    # nothing to prefill, so no forward would ever finish it.
                    self.scheduler.remove(seq)
                    self._finish(seq, "length")
                if not work:
                    return 0
                dropped = [w for w in work if w.kind == "prefill" and w.seq.req.keep_ratio]
                if dropped:  # a dropping prefill runs alone (one segment per drop plan)
                    return self._step_dropped(dropped[0])
                ids: list[int] = []
                segments: list[Segment] = []
                out_rows: list[int] = []
                for w in work:
                    assert w.seq.slot is not None
                    start = len(w.seq.ids)
                    if w.wants_logits:
                        first = len(ids) if w.kind == "decode" else len(ids) + len(w.tokens) - 1
                        out_rows.extend(range(first, len(ids) + len(w.tokens)))
                    exact = w.kind == "decode"  # drafts must verify bit-identically
                    segments.append(Segment(w.seq.slot.index, start, len(w.tokens), exact))
                    ids.extend(w.tokens)
            t0 = time.perf_counter()
            self.model.observer = self.attention
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
                            self.scheduler.remove(w.seq)
                            self._finish(w.seq, "error")
                return len(ids)
            finally:
                self.model.observer = None
            dt = time.perf_counter() - t0
            with self._lock:
                self.stats.steps += 1
                self.stats.forward_rows += len(ids)
                self.stats.forward_s += dt
                self._commit(work, preds)
            return len(ids)

    def _step_dropped(self, w: Work) -> int:
        """One sequence's whole prompt through a dropping forward (F18); the slot then holds
        the kept rows only, at consecutive positions, and decoding continues from there."""
        seq, req, dc = w.seq, w.seq.req, self.config.dropping
        assert seq.slot is not None and req.keep_ratio is not None
        start, n = len(seq.ids), len(w.tokens)
        info = req.drop_info
        if info is not None and int(info.groups.numel()) != n:
            info = None  # describes the request's prompt, not what is pending (session unfed)
        plan = method_plan(
            dc.method,
            n,
            req.keep_ratio,
            query_rows=min(req.query_tokens, n),
            info=info,
            seed=w.seq.handle.id,
            # Drop points past the model's depth would never run: the last one left keeps the ratio.
            layers=[li for li in dc.layers if li < self.model.config.num_layers],
            rates=(dc.rate_first, dc.rate_last),
        )
        t0 = time.perf_counter()
        try:
            pred = self.model.forward(
                torch.tensor(w.tokens, dtype=torch.long),
                [Segment(seq.slot.index, start, n)],
                self.pool,
                greedy=True,
                drop=plan,
            )
        except Exception as e:
            log.exception("LM forward (token dropping) failed")
            with self._lock:
                if not seq.cancelled:
                    seq.handle.error = e
                    self.scheduler.remove(seq)
                    self._finish(seq, "error")
            return n
        dt = time.perf_counter() - t0
        with self._lock:
            self.stats.steps += 1
            self.stats.forward_rows += n
            self.stats.forward_s += dt
            if seq.cancelled or not self.pool.is_live(seq.slot):
                return n
            kept = plan.kept
            self.stats.dropped_tokens += n - len(kept)
            self.stats.prefill_tokens += n - len(kept)
            if self.attention is not None:
                self.attention.clear_from(seq.slot.index, start)
            # The kept rows are now cache entries start..; the dropped ones never were. The
            # commit takes len(kept) tokens off `pending`: take the others off first.
            del seq.pending[: n - len(kept)]
            seq.rewritten = seq.rewritten or len(kept) < n
            work = Work(seq, [w.tokens[i] for i in kept], "prefill", [], w.wants_logits)
            self._commit([work], pred.tolist() if w.wants_logits else [])
        return n

    # -- results ------------------------------------------------------------------------------
    def _commit(self, work: list[Work], preds: list[int]) -> None:
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
                    self.scheduler.remove(seq)
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

    def _emit(self, seq: Sequence, new: list[int]) -> None:
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
            self.scheduler.remove(seq)
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        s, slot = seq.session, seq.slot
        if slot is not None:  # it was admitted (a queued request holds nothing yet)
            if s is None:
                if self.pool.is_live(slot):
                    self.pool.release(slot)
            elif seq.req.keep_output or seq.req.max_new_tokens == 0:
                tail = [seq.last_token] if seq.last_token is not None else []
                self.sessions.end(s, slot, seq.ids, seq.pending + tail, rewritten=seq.rewritten)
            else:
                # The question and answer leave the context: just a shorter slot length.
                self.sessions.rollback(
                    s, slot, seq.ids, seq.pending, seq.base_len, rewritten=seq.rewritten
                )
        seq.slot = None
        seq.handle._finish(reason)

    def _move_rows(self, slot: Slot, positions: list[int]) -> None:
        """A session's windows were cut out of its slot: the kept rows move into the gaps
        (called by the session cache while the scheduler admits, under the step lock)."""
        keep = torch.tensor(positions, dtype=torch.long)
        self.model.compact_positions(self.pool, slot.index, keep)
        if self.attention is not None:
            self.attention.moved(slot.index, keep)

    def _running_in(self, session: str) -> Sequence | None:
        for seq in self.scheduler.running:
            if seq.session is not None and seq.session.key == session:
                return seq
        return None
