"""The session cache: a rolling context per key, kept in a KV slot between requests.

A session's context carries a version: a request with another version drops it (invalidation)
instead of reusing it. Finer: a request may give its context as versioned windows
(`ContextWindow`: an ASR utterance, an OCR line); the cached KV is then reused only up to the
first window whose key or version differs from what the slot was computed over, and everything
after it is recomputed (later tokens attended to the old text, so their KV is stale too). Windows
that are left out (the stage dropping its oldest) are cut out instead when a `compact` callback
is given: the rows of the windows after them move into the gap (no recompute).
Idle sessions keep their slot until the pool runs out, then the least recently used one is
evicted (its context is recomputed on next use). A request that must not
leave its input and output behind rolls the context back to where it began: a shorter slot
length, no copy. One request per session runs at a time (`busy`). Not thread-safe on its own:
the engine calls it under its lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from streamfuse.lm.kv_pool import KVPool, Slot
from streamfuse.lm.request import ContextWindow, EngineStats

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WindowMark:
    """Window `key` at `version` occupies context offsets start..end-1."""

    key: str
    version: int
    start: int
    end: int


@dataclass(eq=False)
class Session:
    """One key's context: `ids` are cached in `slot` (in slot order: sinks + window), `unfed`
    still have to be prefilled before the next request's own tokens. `windows`: the versioned
    windows the context starts with, in order (empty when it was not given as windows, or was
    rewritten by truncation or token dropping since: then nothing is reused by window)."""

    key: str
    version: int = 0
    slot: Slot | None = None
    ids: list[int] = field(default_factory=list)
    unfed: list[int] = field(default_factory=list)
    last_used: float = 0.0
    busy: bool = False
    windows: list[WindowMark] = field(default_factory=list)

    @property
    def context(self) -> list[int]:
        return self.ids + self.unfed


#: Moves the cached rows of `slot` at the sorted `positions` to 0..len(positions)-1, keys
#: re-rotated to their new positions (`GemmaModel.compact_positions`).
Compact = Callable[[Slot, list[int]], None]


class SessionCache:
    """Sessions by key over a shared `KVPool`: versions, LRU eviction, rollback."""

    def __init__(
        self,
        pool: KVPool,
        stats: EngineStats | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        compact: Compact | None = None,
    ) -> None:
        self.pool = pool
        self.stats = stats or EngineStats()
        self._clock = clock
        self._compact = compact
        self._sessions: dict[str, Session] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, key: str) -> Session | None:
        return self._sessions.get(key)

    def open(self, key: str) -> Session:
        """The session for `key`, created empty on first use."""
        s = self._sessions.get(key)
        if s is None:
            s = Session(key=key, last_used=self._clock())
            self._sessions[key] = s
        return s

    def windows_len(self, windows: Sequence[ContextWindow]) -> int:
        """Context tokens a request giving its context as `windows` continues from."""
        return sum(len(w.ids) for w in windows)

    def context_len(self, key: str, version: int) -> int:
        """Context tokens a request with `version` would continue from (0 if it is stale)."""
        s = self._sessions.get(key)
        if s is None or s.version != version:
            return 0
        return len(s.ids) + len(s.unfed)

    # -- a request's life -----------------------------------------------------------------
    def begin(
        self,
        s: Session,
        version: int,
        slot: Slot,
        windows: Sequence[ContextWindow] | None = None,
    ) -> tuple[list[int], list[int]]:
        """A request of `s` starts in `slot`: returns (cached ids, ids still to prefill).

        A different version drops the context first; a slot that does not hold the context
        (the session was evicted and got a fresh one) starts clean and recomputes it.
        `windows`: the request's context is exactly these windows (its prompt follows them):
        the context is cut after the last leading window whose key and version match the
        cached ones, and the rest of the windows are queued to prefill.
        """
        s.busy = True
        s.last_used = self._clock()
        if s.version != version:
            if s.ids or s.unfed:
                self.stats.invalidations += 1
            self._reset(s, version)
        s.slot = slot
        if self.pool.length(slot) != len(s.ids):
            s.unfed = s.ids + s.unfed
            s.ids = []
            self.pool.set_length(slot, 0)
        if windows is not None:
            self._align(s, windows)
        self.stats.reused_tokens += len(s.ids)
        self.stats.recomputed_tokens += len(s.unfed)
        cached, unfed = list(s.ids), s.unfed
        s.unfed = []
        return cached, unfed

    def _align(self, s: Session, windows: Sequence[ContextWindow]) -> None:
        """Keep the leading windows that are unchanged, queue the others.

        A window matches when its key, version and tokens are those cached, in the same order.
        Without `compact` the matches must also sit where they did (any gap ends them); with it,
        windows left out (removed, as the stage trims its oldest) may leave gaps: the rows of
        the later matches move into them. Whatever follows the first window that does not match
        (new, revised, or reordered) is recomputed.
        """
        context = s.ids + s.unfed
        slot = s.slot if s.slot is not None and self.pool.is_live(s.slot) else None
        cached = len(s.ids) if slot is not None else 0
        index = {m.key: i for i, m in enumerate(s.windows)}
        kept: list[WindowMark] = []  # old marks, in order
        keep, last = 0, -1
        for new in windows:
            i = index.get(new.key, -1)
            if i <= last:
                break  # new, or out of its old order
            old = s.windows[i]
            if old.version != new.version or old.end - old.start != len(new.ids):
                break
            if context[old.start : old.end] != list(new.ids):
                break  # same version, other tokens: the caller broke the contract; recompute
            if old.start != keep and (self._compact is None or old.end > cached):
                break  # moving needs its rows in the slot
            kept.append(old)
            keep += old.end - old.start
            last = i
        marks: list[WindowMark] = []
        for m in kept:
            start = marks[-1].end if marks else 0
            marks.append(WindowMark(m.key, m.version, start, start + m.end - m.start))
        moved = [m for m, new in zip(kept, marks, strict=True) if m.start != new.start]
        # Stale KV: a window still wanted but not kept (revised, reordered), or stray tokens
        # after the windows; windows merely left out are not stale.
        wanted = {w.key for w in windows[len(kept) :]} & index.keys()
        if wanted or (keep < len(context) and len(kept) == len(s.windows) and not moved):
            self.stats.invalidations += 1
        tail: list[int] = []
        for w in windows[len(kept) :]:
            marks.append(
                WindowMark(w.key, w.version, keep + len(tail), keep + len(tail) + len(w.ids))
            )
            tail.extend(w.ids)
        s.windows = marks
        if moved:
            assert slot is not None and self._compact is not None
            positions = [p for m in kept for p in range(m.start, m.end)]
            self._compact(slot, positions)
            self.stats.moved_tokens += sum(m.end - m.start for m in moved)
            s.ids = [context[p] for p in positions]
            s.unfed = tail
            self.pool.set_length(slot, keep)
        elif keep <= len(s.ids):
            s.ids = s.ids[:keep]
            s.unfed = tail
            if slot is not None:
                self.pool.set_length(slot, keep)
        else:
            s.unfed = s.unfed[: keep - len(s.ids)] + tail

    def end(
        self, s: Session, slot: Slot, ids: list[int], unfed: list[int], *, rewritten: bool = False
    ) -> None:
        """The request ended; the context is now `ids` (cached in `slot`) then `unfed`.
        `rewritten`: truncation or token dropping moved tokens (window offsets are lost)."""
        if rewritten:
            s.windows = []
        s.ids, s.unfed = list(ids), list(unfed)
        s.slot = slot
        if self.pool.is_live(slot):
            self.pool.set_length(slot, len(s.ids))
        self.idle(s)

    def rollback(
        self,
        s: Session,
        slot: Slot,
        ids: list[int],
        pending: list[int],
        base_len: int,
        *,
        rewritten: bool = False,
    ) -> None:
        """End a request whose input and output must not stay: keep the first `base_len`
        tokens of the context (cached ones from `ids`, the rest from `pending`)."""
        s.windows = [] if rewritten else [m for m in s.windows if m.end <= base_len]
        if len(ids) >= base_len:
            self.end(s, slot, ids[:base_len], [])
        else:  # ended before the context was fully prefilled
            self.end(s, slot, ids, pending[: base_len - len(ids)])

    def idle(self, s: Session) -> None:
        """`s` has no running request any more (it may keep its slot)."""
        s.busy = False
        s.last_used = self._clock()

    # -- slots ----------------------------------------------------------------------------
    def evict_lru(self, spare: Collection[str] = ()) -> bool:
        """Free the slot of the least recently used idle session, preferring sessions not in
        `spare` (those with work queued); False when no idle session holds a slot."""
        idle = [s for s in self._sessions.values() if s.slot is not None and not s.busy]
        if not idle:
            return False
        victim = min(idle, key=lambda s: (s.key in spare, s.last_used))
        assert victim.slot is not None
        log.debug("evicting idle session %r (LRU)", victim.key)
        if self.pool.is_live(victim.slot):
            self.pool.release(victim.slot)
        victim.slot = None
        victim.unfed = victim.ids + victim.unfed  # recomputed on next use (windows still hold)
        victim.ids = []
        self.stats.evictions += 1
        return True

    def close(self, key: str) -> None:
        """Forget `key` and free its slot (the caller has ended its requests)."""
        s = self._sessions.pop(key, None)
        if s is not None and s.slot is not None and self.pool.is_live(s.slot):
            self.pool.release(s.slot)

    def _reset(self, s: Session, version: int) -> None:
        s.version = version
        s.ids = []
        s.unfed = []
        s.windows = []
        if s.slot is not None and self.pool.is_live(s.slot):
            self.pool.set_length(s.slot, 0)
