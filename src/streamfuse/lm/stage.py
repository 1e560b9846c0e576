"""The `lm` answer stage: a rolling context per stream, and streamed answers to prompts.

Input: `ContextFrame`s (context text, e.g. the fused timeline from fusion/timeline.py) and
`TextFrame`s (prompts). Context is kept as an ordered list of versioned windows (F19): a
frame's `window` key names one (unkeyed text gets a key of its own), a newer version of a known
key replaces that window's text in place. Every change is sent at once as the session's whole
context (`Request.windows`, prefilled in the background, so a question finds its context
already computed): the engine reuses the cached KV up to the first changed window and
recomputes the rest. When the windows outgrow the slot (less room for a question and answer),
the oldest ones after the first (the header: attention sinks) are dropped, down to 3/4 of it:
the engine moves the KV of the windows after them into the gap (keys re-rotated, nothing
recomputed; with `truncation.removed_windows: recompute` it recomputes them instead, exact
but a prefill of half a slot, so the stage then drops down to half of it). With
`semantic_windows` or `feed_keep_ratio` (which hold back or drop text) context is appended
instead, and the session keeps the first tokens and the most recent window when the slot fills
(sink + window). A prompt (a TextFrame, or the configured `ask` at each context checkpoint and,
if context was added since, once more at the end of input) starts a generation whose text
streams out as `lm_token` events (incrementally detokenized) and ends as one `lm` event. A
newer prompt for the same stream cuts a running answer at a token boundary (its `lm` event says
`interrupted`). The question and answer are rolled back out of the context. At the end of input
every stream's last answer is completed and its session closed (its KV slot freed).

Output events: `lm_token` {text, request, prompt} and `lm` {text, prompt, request, finish,
interrupted, n_tokens, context_tokens, ttft_ms, tok_s}. Their `t_media`/`t_end` span the
context the answer saw; `arrival_wall` is when the prompt's trigger arrived, so `latency_ms` is
time to the token (or to the full answer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.errors import ModelError
from streamfuse.events import LmPayload, LmTokenPayload, Payload
from streamfuse.frames import ContextFrame, EventFrame, Frame, TextFrame
from streamfuse.lm.config import LMConfig
from streamfuse.lm.engine import LMEngine, Request, RequestHandle
from streamfuse.lm.request import ContextWindow
from streamfuse.lm.tokenizer import TextCodec, TextStream
from streamfuse.pipeline.stage import Stage
from streamfuse.telemetry.metrics import ModelInfo, watch_lm_engine

log = logging.getLogger(__name__)

#: Tokens of a slot kept free for a question (besides `max_new_tokens` for its answer).
_QUESTION_ROOM = 64


class LMStageConfig(BaseModel):
    """Configuration of the `lm` stage (the engine's own settings are in `lm`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lm: LMConfig = Field(
        default_factory=lambda: LMConfig.model_validate({"pool": {"num_slots": 4}}),
        description="Engine settings; 4 slots x 2048 tokens (288 MB of KV for Gemma 3 270M) "
        "by default: one per stream plus room for prompts.",
    )
    ask: str | None = Field(
        default=None,
        description="Standing question, asked at every context checkpoint (None: prompts only).",
    )
    ask_at_end: bool = Field(
        default=True,
        description="Ask once more at the end of input if context was added since the last ask.",
    )
    max_new_tokens: int = Field(default=48, ge=1, le=4096)
    question_template: str = "\nQuestion: {prompt}\nAnswer:"
    stop_at_newline: bool = Field(default=True, description="An answer ends at a line break.")
    poll_s: float = Field(
        default=0.05, gt=0.0, le=1.0, description="How often tokens are forwarded while idle."
    )
    semantic_windows: bool = Field(
        default=False,
        description="Feed context in semantic windows (F21): text waits until its sentence "
        "ends (or a clause mark once `window_max_words` wait), so the model never holds half "
        "a sentence; a checkpoint, a prompt or the end of input feeds whatever waits.",
    )
    window_max_words: int = Field(default=40, ge=4, le=1000)
    feed_keep_ratio: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="Token dropping (F18) on each fed piece of context: keep about this share, "
        "ranked by what its last tokens attend to (None: keep everything).",
    )


@dataclass
class _Answer:
    handle: RequestHandle
    prompt: str
    t_start: float
    t_end: float
    arrival_wall: float
    stream: TextStream
    queue: asyncio.Queue[list[int]] = field(default_factory=asyncio.Queue)
    fed: int = 0  # generated tokens passed to `stream`


@dataclass
class _StreamState:
    held: str = ""  # context text waiting for its sentence to end (semantic windows)
    #: The context as versioned windows by key, in context order (a revision keeps its place).
    windows: dict[str, ContextWindow] = field(default_factory=dict)
    unkeyed: int = 0  # keys handed to unkeyed text
    context_tokens: int = 0
    t_first: float | None = None
    t_last: float = 0.0
    new_since_ask: bool = False
    answer: _Answer | None = None


class LMStage(Stage):
    """Rolling context per stream + prompted, streamed, interruptible answers."""

    input_types = (ContextFrame, TextFrame)

    def __init__(
        self,
        config: LMStageConfig | None = None,
        *,
        engine: LMEngine | None = None,
        tokenizer: TextCodec | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name or "lm", threads=1)
        self.config = config or LMStageConfig()
        self.engine = engine
        self.tokenizer = tokenizer
        self._streams: dict[str, _StreamState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loaded = False  # `setup` loaded the configured model

    # -- lifecycle ----------------------------------------------------------------------------
    async def setup(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.engine is None or self.tokenizer is None:
            from streamfuse.lm.loader import load_model

            model, tok = await self.run_blocking(load_model, self.config.lm.model)
            if tok is None:
                raise ModelError(f"model {self.config.lm.model.source!r} has no tokenizer.json")
            self._loaded = self.engine is None
            self.engine = self.engine or LMEngine(model, self.config.lm)
            self.tokenizer = self.tokenizer or tok
        watch_lm_engine(self.engine)
        self.engine.start()

    def model_info(self) -> ModelInfo | None:
        if not self._loaded:
            return None  # not set up yet, or handed an engine (whose model it does not know)
        model = self.config.lm.model
        return ModelInfo(Path(model.source).name, model.weights, ("torch",))

    async def teardown(self) -> None:
        if self.engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.stop)

    # -- frames -------------------------------------------------------------------------------
    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        st = self._streams.setdefault(frame.stream_id, _StreamState())
        prompt: str | None = None
        if isinstance(frame, TextFrame):
            prompt = frame.text.strip() or None
            if prompt is not None:
                self._feed(frame.stream_id, st, "", force=True)  # the question sees it all
        elif isinstance(frame, ContextFrame):
            self._add_context(frame, st, force=frame.checkpoint)
            if frame.checkpoint and st.context_tokens:
                prompt = self.config.ask
        for out in self._drain(frame.stream_id, st):
            yield out
        if prompt is not None:
            async for out in self._ask(frame, st, prompt):
                yield out
        # Stream tokens while no new input waits; return as soon as some does.
        while st.answer is not None and self.backlog == 0:
            await self._wait_tokens(st.answer)
            for out in self._drain(frame.stream_id, st):
                yield out

    async def flush(self) -> AsyncIterator[Frame]:
        assert self.engine is not None
        cfg = self.config
        for stream_id, st in self._streams.items():
            self._feed(stream_id, st, "", force=True)
            if cfg.ask and cfg.ask_at_end and st.new_since_ask and st.context_tokens:
                cause = TextFrame(stream_id=stream_id, t_media=st.t_last, t_end=st.t_last, text="")
                async for out in self._ask(cause, st, cfg.ask):
                    yield out
            while st.answer is not None:
                await self._wait_tokens(st.answer)
                for out in self._drain(stream_id, st):
                    yield out
            # The stream has ended: its context will not be asked about again.
            self.engine.close_session(stream_id)

    # -- context ------------------------------------------------------------------------------
    @property
    def versioned(self) -> bool:
        """Context kept as versioned windows (off when text is held back or dropped)."""
        cfg = self.config
        return not cfg.semantic_windows and cfg.feed_keep_ratio is None

    def _add_context(self, frame: ContextFrame, st: _StreamState, *, force: bool) -> None:
        """Put the frame's text in the stream's context: as (a revision of) its window, or
        appended (at a semantic window boundary, if on)."""
        if frame.text:
            if st.context_tokens == 0 and not st.held:
                st.t_first = frame.t_media
            st.t_last = max(st.t_last, frame.t_end)
        if self.versioned:
            if frame.text:
                self._put_window(frame, st)
            return
        self._feed(frame.stream_id, st, frame.text, force=force)

    def _put_window(self, frame: ContextFrame, st: _StreamState) -> None:
        """Add or revise the frame's window, then send the whole context (the engine reuses
        the KV up to the first changed window)."""
        assert self.engine is not None and self.tokenizer is not None
        key = frame.window
        if key is None:
            st.unkeyed += 1
            key = f"~{st.unkeyed}"
        old = st.windows.get(key)
        if old is not None and old.version > frame.version:
            return  # an older revision arriving late: the newer text stays
        first = next(iter(st.windows), key)
        ids = tuple(self.tokenizer.encode(frame.text, add_bos=key == first))
        if not ids or (old is not None and (old.version, old.ids) == (frame.version, ids)):
            # Nothing to change: keep the cache as it is (no request for the engine).
            return
        st.windows[key] = ContextWindow(key, frame.version, ids)  # in place when revised
        st.context_tokens = self._trim(st)
        req = Request(
            prompt_ids=(),
            max_new_tokens=0,
            session=frame.stream_id,
            keep_output=True,
            windows=tuple(st.windows.values()),
        )
        self.engine.submit(req)
        st.new_since_ask = True

    def _trim(self, st: _StreamState) -> int:
        """Keep the windows within the slot, less room for a question and its answer: drop
        the oldest after the first. Where the engine moves the later windows' KV into the gap
        (`truncation.removed_windows: move`, the default) a trim costs a copy of the slot's
        rows, so it drops down to 3/4 of that room; where it recomputes everything after a
        dropped window, down to half (a recompute of about one token per new one; a quarter
        would cost three; a question waits for its session's recompute). Returns the
        context's tokens after trimming."""
        assert self.engine is not None
        lm = self.engine.config
        room = self.engine.pool.max_tokens
        budget = max(room // 4, room - self.config.max_new_tokens - _QUESTION_ROOM)
        total = sum(len(w.ids) for w in st.windows.values())
        if total <= budget:
            return total
        target = budget * 3 // 4 if lm.truncation.removed_windows == "move" else budget // 2
        keys = list(st.windows)[1:-1]  # never the first (sinks) nor the newest
        for key in keys:
            if total <= target:
                break
            total -= len(st.windows.pop(key).ids)
        return total

    def _feed(self, stream_id: str, st: _StreamState, text: str, *, force: bool) -> None:
        assert self.engine is not None and self.tokenizer is not None
        cfg = self.config
        if cfg.semantic_windows:
            from streamfuse.text.windows import split_ready

            text = st.held + text
            if force:
                st.held = ""
            else:
                text, st.held = split_ready(text, max_words=cfg.window_max_words)
        if not text:
            return
        ids = self.tokenizer.encode(text, add_bos=st.context_tokens == 0)
        ratio = cfg.feed_keep_ratio
        if ratio is not None and ratio < 1.0 and len(ids) > 8:
            self.engine.feed(stream_id, ids, keep_ratio=ratio, query_tokens=4)
        else:
            self.engine.feed(stream_id, ids)
        st.context_tokens += len(ids)
        st.new_since_ask = True

    # -- answers ------------------------------------------------------------------------------
    async def _ask(self, cause: Frame, st: _StreamState, prompt: str) -> AsyncIterator[Frame]:
        assert self.engine is not None and self.tokenizer is not None
        if st.answer is not None:  # a newer question makes the running answer stale: cut it
            self.engine.cancel(st.answer.handle, reason="interrupted")
            for out in self._drain(cause.stream_id, st):
                yield out
        text = self.config.question_template.format(prompt=prompt)
        ids = self.tokenizer.encode(text, add_bos=st.context_tokens == 0)
        req = Request(
            prompt_ids=tuple(ids),
            windows=tuple(st.windows.values()) if self.versioned and st.windows else None,
            max_new_tokens=self.config.max_new_tokens,
            session=cause.stream_id,
            keep_output=False,
            stop_ids=self._stops(),
            leading_ids=self._newlines() if self.config.stop_at_newline else (),
            priority=1,  # a question outranks other streams' background context feeds
        )
        handle = self.engine.submit(req)
        answer = _Answer(
            handle=handle,
            prompt=prompt,
            t_start=st.t_first if st.t_first is not None else cause.t_media,
            t_end=max(st.t_last, cause.t_media),
            arrival_wall=cause.arrival_wall,
            stream=TextStream(self.tokenizer),
        )
        loop = self._loop
        assert loop is not None

        def forward(_h: RequestHandle, new: list[int]) -> None:  # engine thread -> event loop
            loop.call_soon_threadsafe(answer.queue.put_nowait, new)

        handle.on_tokens(forward)
        st.answer = answer
        st.new_since_ask = False

    async def _wait_tokens(self, answer: _Answer) -> None:
        try:
            item = await asyncio.wait_for(answer.queue.get(), timeout=self.config.poll_s)
            answer.queue.put_nowait(item)  # _drain consumes it
        except TimeoutError:
            pass

    def _drain(self, stream_id: str, st: _StreamState) -> list[Frame]:
        """Token events for what the running answer produced so far, and its end."""
        a = st.answer
        if a is None:
            return []
        while not a.queue.empty():
            a.queue.get_nowait()
        h = a.handle
        out: list[Frame] = []
        ids = list(h.tokens)
        # A final stop token is not text; hold it back (a later token shows it was not final).
        ready = len(ids) - 1 if ids and ids[-1] in self._stops() else len(ids)
        if ready > a.fed:
            delta = a.stream.push(ids[a.fed : ready])
            a.fed = ready
            if delta:
                out.append(self._event(stream_id, a, LmTokenPayload, {"text": delta}))
        if h.done:
            tok_s = 0.0
            if h.first_token_wall and h.finished_wall and len(ids) > 1:
                tok_s = (len(ids) - 1) / max(1e-9, h.finished_wall - h.first_token_wall)
            ttft = (h.first_token_wall - h.submitted_wall) * 1000 if h.first_token_wall else None
            data = {
                "text": a.stream.text.strip(),
                "finish": h.finish_reason,
                "interrupted": h.finish_reason == "interrupted",
                "n_tokens": len(ids),
                "context_tokens": st.context_tokens,
                "ttft_ms": round(ttft, 1) if ttft is not None else None,
                "tok_s": round(tok_s, 1),
            }
            out.append(self._event(stream_id, a, LmPayload, data))
            st.answer = None
        return out

    def _newlines(self) -> tuple[int, ...]:
        assert self.tokenizer is not None
        ids = [i for nl in ("\n", "\n\n") for i in self.tokenizer.encode(nl)[-1:]]
        return tuple(dict.fromkeys(ids))

    def _stops(self) -> tuple[int, ...]:
        assert self.tokenizer is not None
        stops = list(self.tokenizer.stop_ids)
        if self.config.stop_at_newline:
            stops += self._newlines()
        return tuple(dict.fromkeys(stops))

    def _event(
        self, stream_id: str, a: _Answer, kind: type[Payload], data: Mapping[str, object]
    ) -> EventFrame:
        return EventFrame(
            stream_id=stream_id,
            t_media=a.t_start,
            t_end=a.t_end,
            arrival_wall=a.arrival_wall,
            payload=kind.model_validate({**data, "prompt": a.prompt, "request": a.handle.id}),
        )
