"""What the LM engine is asked (`Request`), what a caller holds (`RequestHandle`), and the
per-request state its parts share (`Sequence`, `EngineStats`).

A `Sequence` is the engine's view of one admitted request: the scheduler fills and truncates
it, the engine commits model output to it. Callers only ever see the handle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from streamfuse.lm.dropping import ContextInfo
from streamfuse.lm.kv_pool import Slot
from streamfuse.lm.speculative import NgramDrafter

if TYPE_CHECKING:
    from streamfuse.lm.engine import LMEngine
    from streamfuse.lm.sessions import Session

log = logging.getLogger(__name__)

FinishReason = Literal["length", "stop", "cancelled", "interrupted", "error"]
TokenCallback = Callable[["RequestHandle", list[int]], None]


@dataclass(frozen=True, slots=True)
class ContextWindow:
    """One revisable piece of a session's context (an ASR utterance, an OCR line): `key`
    names it across revisions, `version` changes whenever its text does (a partial replaced
    by its commit, a corrected line)."""

    key: str
    version: int
    ids: tuple[int, ...]


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
    #: Token dropping (F18): prefill the prompt in one piece keeping about this share of it
    #: (None: keep everything). The last `query_tokens` prompt tokens (the question) are always
    #: kept and rank the rest; `drop_info` (lines, modality, MiniLM similarity per prompt token)
    #: lets the 'ours' method pool by line and drop coarsely before the first layer.
    keep_ratio: float | None = None
    query_tokens: int = 1
    #: Higher runs first (F19): a user's question (1) outranks background context feeds (0)
    #: of other sessions; within a session requests still run in submission order.
    priority: int = 0
    drop_info: ContextInfo | None = None
    #: A session request's whole context as versioned windows (the prompt follows them): the
    #: cached KV is reused up to the first window whose key or version changed, the rest is
    #: recomputed. None: the prompt is appended to the session's context as it is.
    windows: tuple[ContextWindow, ...] | None = None


@dataclass
class EngineStats:
    """Counters since the engine started (read them; the engine's parts only increment)."""

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
    moved_tokens: int = 0  # cached rows moved into the gap of a removed window (not recomputed)
    dropped_tokens: int = 0
    cancellations: int = 0
    rescheduled_steps: int = 0  # steps whose lower-priority prompt chunks waited (F19)
    deferred_chunks: int = 0  # prompt chunks that waited in those steps
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

    def _finish(self, reason: FinishReason) -> None:
        self.finish_reason = reason
        self.finished_wall = time.monotonic()
        self._done.set()
        self._emit([])

    def __repr__(self) -> str:
        return f"<RequestHandle {self.id} tokens={len(self.tokens)} finish={self.finish_reason}>"


@dataclass(eq=False)
class Sequence:
    """An admitted (or waiting) request as the scheduler and engine see it."""

    handle: RequestHandle
    req: Request
    session: Session | None
    slot: Slot | None = None
    ids: list[int] = field(default_factory=list)  # tokens whose K/V are in the slot
    pending: list[int] = field(default_factory=list)  # still to prefill
    last_token: int | None = None  # sampled, not yet in the slot
    base_len: int = 0  # session context length before this request (rollback point)
    #: Truncation or token dropping moved or removed cached tokens (window offsets are lost).
    rewritten: bool = False
    drafter: NgramDrafter | None = None
    speculative: bool = False
    cancelled: bool = False
