"""The scheduler: which sequences run and which rows one engine step carries.

`schedule()` admits waiting requests by priority, then first come, first served, into KV
slots (a session's own requests keep their order; an idle session resumes in its own slot; when
the pool is full the least recently used idle session is evicted, and a request waits when
every slot runs), then plans the step within `max_batch_tokens`: decoding sequences first
(their last token plus prompt-lookup drafts), then prompt chunks of at most `prefill_chunk`
tokens (a request with `keep_ratio` in one piece), by priority then oldest first, so a long
prompt never stalls the others. While prefills are heavy (the KV-cache hit rate over the last
100 admitted requests is under 85%, `HitRateWindow`), a higher-priority prefill (a question)
has the step's prompt rows to itself: lower-priority chunks wait (F19); a request queued
behind its own session's running request lends it its priority, so a question's context feed
never waits on the question. When a sequence's slot would overflow it is truncated to sink +
window tokens (StreamingLLM), or to sinks + recent + heavy hitters ('heavy_hitter', H2O), or,
under the 'reject' policy, refused up front (`check_fits`). It sees the pool only through
`Slot` handles and lengths; the model's part of a truncation is the injected `Compactor`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from streamfuse.errors import CapacityError
from streamfuse.lm.config import LMConfig
from streamfuse.lm.dropping import AttentionAccumulator
from streamfuse.lm.kv_pool import KVPool, Slot
from streamfuse.lm.request import EngineStats, RequestHandle, Sequence
from streamfuse.lm.sessions import SessionCache
from streamfuse.lm.speculative import NgramDrafter


class Compactor(Protocol):
    """Moves a slot's kept tokens into place (`GemmaModel.compact` for sink + window,
    `compact_positions` for any kept set); returns the new length."""

    def compact(self, pool: KVPool, slot: int, length: int, sink: int, keep: int) -> int: ...

    def compact_positions(self, pool: KVPool, slot: int, keep: Tensor) -> int: ...


class HitRateWindow:
    """KV-cache reuse over the last `size` admitted requests: the context tokens they continued
    from the cache over all the tokens their forward needed (cached + to prefill)."""

    def __init__(self, size: int) -> None:
        self._rows: deque[tuple[int, int]] = deque(maxlen=size)

    def record(self, reused: int, total: int) -> None:
        if total > 0:
            self._rows.append((reused, total))

    @property
    def rate(self) -> float | None:
        """Token-weighted hit rate (None before any request)."""
        total = sum(t for _, t in self._rows)
        return sum(r for r, _ in self._rows) / total if total else None

    def __len__(self) -> int:
        return len(self._rows)


@dataclass(frozen=True, slots=True)
class Work:
    """One sequence's rows in a step."""

    seq: Sequence
    tokens: list[int]  # rows fed for this sequence
    kind: Literal["prefill", "decode"]
    drafts: list[int]
    wants_logits: bool


class Scheduler:
    """First come, first served admission and token-budgeted step plans (not thread-safe on its
    own: the engine calls it under its lock)."""

    def __init__(
        self,
        config: LMConfig,
        pool: KVPool,
        sessions: SessionCache,
        model: Compactor,
        stats: EngineStats | None = None,
        attention: AttentionAccumulator | None = None,
    ) -> None:
        self.config = config
        self.pool = pool
        self.sessions = sessions
        self.model = model
        self.stats = stats or EngineStats()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        #: Context feeds admitted with nothing to prefill (their windows were cached whole):
        #: no forward will finish them, so the engine does at once (`take_fed`).
        self._fed: list[Sequence] = []
        self.hit_rate = HitRateWindow(config.scheduler.hit_rate_window)
        self._sink = config.truncation.sink_tokens
        self._window = config.window_tokens
        #: Attention each cached position received (the 'heavy_hitter' policy's statistic).
        self.attention = attention

    # -- queue ------------------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take `seq` out of the queues (it finished or was cancelled)."""
        if seq in self.running:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)

    def find(self, handle: RequestHandle) -> Sequence | None:
        return next((q for q in self if q.handle is handle), None)

    def __iter__(self) -> Iterator[Sequence]:
        return itertools.chain(self.running, self.waiting)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def check_fits(self, context: int, max_new: int) -> None:
        """Refuse up front a request that could never fit a slot under the 'reject' policy."""
        if self.config.truncation.policy != "reject":
            return
        need = context + max_new
        if need > self.pool.max_tokens:
            raise CapacityError(
                f"request needs {need} tokens ({context} context + {max_new} new) but a KV slot "
                f"holds {self.pool.max_tokens} and truncation policy is 'reject'; raise "
                "pool.max_tokens, shorten the input, or use policy 'sink_window'"
            )

    # -- one step ---------------------------------------------------------------------------
    def schedule(self) -> list[Work]:
        """Admit what fits, then plan the next step's rows (empty: nothing to run)."""
        self._admit()
        return self._plan()

    def _admit(self) -> None:
        sc = self.config.scheduler
        blocked: set[str] = set()
        pool_full = False
        # Priority first (stable: equal priorities keep arrival order); a session's requests
        # keep their own order, so a question never overtakes its context's feed.
        first_of: dict[str, Sequence] = {}
        for q in self.waiting:
            if q.session is not None:
                first_of.setdefault(q.session.key, q)
        for seq in sorted(self.waiting, key=lambda q: -q.req.priority):
            if len(self.running) >= sc.max_running:
                break
            s = seq.session
            if s is not None and first_of[s.key] is not seq:
                continue
            if s is not None and (s.busy or s.key in blocked):
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
            self.waiting.remove(seq)
            self._start(seq, slot)
            self.running.append(seq)
            if seq.req.max_new_tokens == 0 and not seq.pending:
                self._fed.append(seq)

    def take_fed(self) -> list[Sequence]:
        """The feeds admitted since the last call that have nothing to prefill."""
        fed, self._fed = self._fed, []
        return fed

    def _take_slot(self) -> Slot | None:
        slot = self.pool.acquire()
        if slot is not None:
            return slot
        # Evict the least recently used idle session, sparing those with a request queued.
        queued = {q.session.key for q in self.waiting if q.session is not None}
        if not self.sessions.evict_lru(spare=queued):
            return None
        return self.pool.acquire()

    def _start(self, seq: Sequence, slot: Slot) -> None:
        req, s = seq.req, seq.session
        seq.slot = slot
        if s is None:
            seq.pending = list(req.prompt_ids)
        else:
            seq.ids, unfed = self.sessions.begin(s, req.version, slot, req.windows)
            seq.pending = unfed + list(req.prompt_ids)
            seq.base_len = len(seq.ids) + len(unfed)
        self.hit_rate.record(len(seq.ids), len(seq.ids) + len(seq.pending))
        if self.attention is not None:
            # Positions past the reused prefix are rewritten: forget what they received.
            self.attention.clear_from(slot.index, len(seq.ids))
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

    def _plan(self) -> list[Work]:
        sc = self.config.scheduler
        budget = sc.max_batch_tokens
        work: list[Work] = []
        # Decoding sequences first: they are latency-critical and cost one row each.
        for seq in self.running:
            if seq.pending or seq.last_token is None or budget <= 0:
                continue
            drafts: list[int] = []
            if seq.drafter is not None:
                left = seq.req.max_new_tokens - len(seq.handle.tokens) - 1
                k = min(seq.drafter.allowance(), left, budget - 1)
                drafts = seq.drafter.draft(k)
            tokens = [seq.last_token, *drafts]
            if not self.make_room(seq, len(tokens)):
                tokens = tokens[: self._room(seq)]
                drafts = tokens[1:]
            work.append(Work(seq, tokens, "decode", drafts, True))
            budget -= len(tokens)
        # Then prompt chunks, by priority then oldest first, within what is left of the budget.
        ranked = self._ranked([q for q in self.running if q.pending])
        urgent = self._urgent([rank for rank, _ in ranked])
        deferred = 0
        for rank, seq in ranked:
            if urgent is not None and rank < urgent:
                deferred += 1
                continue
            if budget <= 0:
                continue
            n = min(len(seq.pending), sc.prefill_chunk, budget)
            if seq.req.keep_ratio is not None:
                # Dropping ranks the whole prompt against its question: one piece.
                n = len(seq.pending)
            self.make_room(seq, n)
            n = min(n, self._room(seq))
            if n <= 0:
                continue
            tokens = seq.pending[:n]
            last = n == len(seq.pending)
            work.append(Work(seq, tokens, "prefill", [], last and seq.req.max_new_tokens > 0))
            budget -= n
        if deferred:
            self.stats.rescheduled_steps += 1
            self.stats.deferred_chunks += deferred
        return work

    def _ranked(self, prefilling: list[Sequence]) -> list[tuple[int, Sequence]]:
        """Prefilling sequences with their priority, highest first (stable: oldest first among
        equals); a sequence takes the priority of any request queued behind it in its session
        (which cannot start before it)."""
        queued: dict[str, int] = {}
        for q in self.waiting:
            if q.session is not None:
                key = q.session.key
                queued[key] = max(queued.get(key, q.req.priority), q.req.priority)
        ranked = [
            (max(q.req.priority, queued.get(q.session.key, q.req.priority)), q)
            if q.session is not None
            else (q.req.priority, q)
            for q in prefilling
        ]
        return sorted(ranked, key=lambda r: -r[0])

    def _urgent(self, ranks: list[int]) -> int | None:
        """The priority that has this step's prompt rows to itself, or None (no rescheduling:
        off, prefills are cheap enough, or every prefilling sequence ranks the same)."""
        sc = self.config.scheduler
        rate = self.hit_rate.rate
        if not sc.reschedule or rate is None or rate >= sc.reschedule_below_hit_rate:
            return None
        if not ranks or max(ranks) == min(ranks):
            return None
        return max(ranks)

    # -- truncation -------------------------------------------------------------------------
    def _room(self, seq: Sequence) -> int:
        return self.pool.max_tokens - len(seq.ids)

    def make_room(self, seq: Sequence, n: int) -> bool:
        """Truncate `seq`'s slot to sink + window if `n` more tokens would not fit; returns
        whether they fit now."""
        if len(seq.ids) + n <= self.pool.max_tokens:
            return True
        policy = self.config.truncation.policy
        if policy == "reject":  # admitted, so it fits: defensive
            raise CapacityError(
                f"sequence needs {len(seq.ids) + n} tokens > slot size {self.pool.max_tokens}"
            )
        assert seq.slot is not None
        if policy == "heavy_hitter" and self.attention is not None:
            return self._evict_heavy(seq, n)
        sink, keep = self._sink, self._window
        old = len(seq.ids)
        new_len = self.model.compact(self.pool, seq.slot.index, old, sink, keep)
        shift = old - new_len
        if shift > 0:
            if self.attention is not None:
                self.attention.moved(
                    seq.slot.index, torch.cat([torch.arange(sink), torch.arange(old - keep, old)])
                )
            seq.ids = seq.ids[:sink] + seq.ids[old - keep :]
            seq.rewritten = True
            self.pool.set_length(seq.slot, new_len)
            # The rollback point moves with the tokens; if it fell into the evicted middle the
            # answer's start was evicted too, so keep what survived.
            if seq.base_len >= old - keep:
                seq.base_len -= shift
            elif seq.base_len > sink:
                seq.base_len = sink
            self.stats.truncations += 1
        return len(seq.ids) + n <= self.pool.max_tokens

    def _evict_heavy(self, seq: Sequence, n: int) -> bool:
        """H2O: keep the sinks, the most recent tokens and the positions that received the most
        attention so far, as many as a sink + window truncation keeps."""
        assert seq.slot is not None and self.attention is not None
        slot, old = seq.slot.index, len(seq.ids)
        heavy = int(self._window * self.config.truncation.heavy_fraction)
        keep = self.attention.keep(
            slot, old, self._sink + self._window, sink=self._sink, recent=self._window - heavy
        )
        if keep.numel() < old:
            self.model.compact_positions(self.pool, slot, keep)
            self.attention.moved(slot, keep)
            kept = keep.tolist()
            # The rollback point: the kept tokens that came before it.
            seq.base_len = sum(1 for i in kept if i < seq.base_len)
            seq.ids = [seq.ids[i] for i in kept]
            seq.rewritten = True
            self.pool.set_length(seq.slot, len(seq.ids))
            self.stats.truncations += 1
        return len(seq.ids) + n <= self.pool.max_tokens
