"""Sessions of `streamfuse serve`: one job each, its results kept and fanned out live.

A session runs one pipeline (`app.build_pipeline`) over a URL or file, or over live inputs
pushed by a client: media bytes (`sources.pipe.PipeSource`) and text messages
(`sources.text.TextSource`). Every record it produces is kept (replayed to late subscribers)
and sent to each live subscriber; a subscriber that falls `session_queue` records behind is
cut off rather than letting the session buffer without bound. `SessionManager` enforces the
session limit and shares one OCR worker pool between sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.app import Job, StreamfuseConfig, build_pipeline, run_job
from streamfuse.errors import SourceError, StreamfuseError
from streamfuse.events import EventType
from streamfuse.frames import ErrorFrame, now_wall
from streamfuse.lm.stage import LMStageConfig
from streamfuse.pipeline import Observer
from streamfuse.pipeline.source import Source
from streamfuse.scale.ray import RayStreams, StreamRun, merged_summary
from streamfuse.server.config import ServeConfig
from streamfuse.sinks.base import EventSink
from streamfuse.sources.media import is_url
from streamfuse.sources.pipe import BytePipe, PipeSource
from streamfuse.sources.text import TextSource
from streamfuse.telemetry.metrics import instruments

log = logging.getLogger(__name__)

_STREAM_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


class SessionRequest(BaseModel):
    """Body of `POST /api/sessions`."""

    model_config = ConfigDict(extra="forbid")

    input: str | None = Field(
        None,
        max_length=4096,
        description="A URL or file to read; None: a live session fed over the media and text "
        "WebSockets.",
    )
    media: bool = Field(True, description="A live session takes media (False: text only).")
    ocr: bool | None = None
    asr: bool | None = None
    realtime: bool | None = Field(None, description="Pace a URL or file at wall-clock speed.")
    ask: str | None = Field(
        None, max_length=2000, description="A standing question for the language model."
    )
    stream_id: str = Field("live", pattern=_STREAM_ID.pattern)


class SessionState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"


class SessionLimit(StreamfuseError):
    """No room for another session."""


class SlowConsumer(StreamfuseError):
    """A results subscriber fell too far behind and was cut off."""


class SessionRejected(StreamfuseError):
    """The request cannot start a session (bad input, forbidden file...)."""


@dataclass
class Subscriber:
    """One results stream's queue; `None` ends it, `overflowed` says it was cut off."""

    queue: asyncio.Queue[dict[str, Any] | None]
    overflowed: bool = False


class SessionSink(EventSink):
    """Hands each record to its session (kept, then sent to every subscriber)."""

    def __init__(self, session: Session) -> None:
        super().__init__(f"session:{session.id}")
        self.session = session

    def write(self, record: dict[str, Any]) -> None:
        self.session.publish(record)


@dataclass
class Session:
    id: str
    request: SessionRequest
    config: StreamfuseConfig
    serve: ServeConfig
    created: float = field(default_factory=time.time)
    created_wall: float = field(default_factory=now_wall)
    state: SessionState = SessionState.STARTING
    error: str | None = None
    job: Job | None = None
    pipe: BytePipe | None = None
    text: TextSource | None = None
    records: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=200_000))
    produced: int = 0
    errors: int = 0
    last_input_wall: float = field(default_factory=now_wall)
    summary: dict[str, Any] | None = None
    #: Where a session run on Ray (`ServeConfig.ray`) is: its nodes, restarts, events.
    ray_run: StreamRun | None = None
    task: asyncio.Task[None] | None = None
    _subscribers: list[Subscriber] = field(default_factory=list)
    inputs_ended: bool = False
    _closed: bool = False
    _media_t0: float | None = None

    @property
    def live(self) -> bool:
        return self.request.input is None

    @property
    def done(self) -> bool:
        return self.state in (SessionState.FINISHED, SessionState.FAILED, SessionState.STOPPED)

    # -- results ------------------------------------------------------------------------------
    def publish(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self.produced += 1
        if record["type"] == EventType.ERROR:
            self.errors += 1
        for sub in list(self._subscribers):
            if sub.queue.qsize() >= self.serve.session_queue:
                # A consumer this far behind would make the session buffer without bound.
                sub.overflowed = True
                self._subscribers.remove(sub)
                _drain(sub.queue)
                sub.queue.put_nowait(None)
            else:
                sub.queue.put_nowait(record)

    def subscribe(self) -> tuple[list[dict[str, Any]], Subscriber]:
        """What was produced so far and a subscription to what follows (atomically: nothing
        is published between the two on the event loop)."""
        sub = Subscriber(asyncio.Queue())  # bounded by `publish` (room kept for the end)
        history = list(self.records)
        if self._closed:
            sub.queue.put_nowait(None)
        else:
            self._subscribers.append(sub)
        return history, sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(sub)

    async def follow(self) -> AsyncIterator[dict[str, Any]]:
        """Every record of the session: the history, then live until it ends. Raises
        `SlowConsumer` if this consumer fell too far behind."""
        history, sub = self.subscribe()
        try:
            for record in history:
                yield record
            while True:
                item = await sub.queue.get()
                if item is None:
                    if sub.overflowed:
                        raise SlowConsumer(
                            f"results consumer fell {self.serve.session_queue} events behind"
                        )
                    return
                yield item
        finally:
            self.unsubscribe(sub)

    def _close_results(self) -> None:
        self._closed = True
        for sub in self._subscribers:
            sub.queue.put_nowait(None)
        self._subscribers.clear()

    # -- live inputs ----------------------------------------------------------------------------
    def media_clock(self) -> float:
        """Media seconds of a live session: since its first media bytes (or its start)."""
        t0 = self._media_t0 if self._media_t0 is not None else self.created_wall
        return now_wall() - t0

    async def feed_media(self, data: bytes) -> None:
        if self.pipe is None:
            raise SessionRejected(f"session {self.id} takes no media input")
        if self._media_t0 is None:
            self._media_t0 = now_wall()
        self.last_input_wall = now_wall()
        await self.pipe.write_chunk(data)

    def feed_text(self, text: str, *, author: str | None, kind: str, ask: bool = False) -> None:
        if self.text is None:
            raise SessionRejected(f"session {self.id} takes no text input")
        self.last_input_wall = now_wall()
        self.text.put(text, author=author, kind=kind, ask=ask)

    def end_inputs(self) -> None:
        self.inputs_ended = True
        if self.pipe is not None:
            self.pipe.end()
        if self.text is not None:
            self.text.end()

    def note_error(self, stage: str, message: str) -> None:
        """Put a problem with this session's input on its results stream."""
        frame = ErrorFrame(
            stream_id=self.request.stream_id, t_media=max(0.0, self.media_clock()),
            stage=stage, message=message,
        )  # fmt: skip
        self.publish(frame.to_record())

    # -- lifecycle --------------------------------------------------------------------------------
    def info(self, *, detail: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "status": self.state.value,
            "input": self.request.input,
            "live": self.live,
            "stream_id": self.request.stream_id,
            "created": round(self.created, 3),
            "events": self.produced,
            "errors": self.errors,
        }
        if detail:
            out["error"] = self.error
            out["request"] = self.request.model_dump(mode="json")
            out["stages"] = self.job.pipeline.snapshot() if self.job is not None else {}
            out["summary"] = self.summary
            if self.ray_run is not None:
                run = self.ray_run
                out["ray"] = {
                    "nodes": list(run.nodes),
                    "restarts": run.restarts,
                    "events": run.events,
                    "replayed": run.skipped,
                    "committed_s": round(run.committed_s, 3),
                    "error": run.error,
                }
        return out


class _MarkRunning(Observer):
    def __init__(self, session: Session) -> None:
        self.session = session

    def on_start(self, wall: float) -> None:
        if self.session.state is SessionState.STARTING:
            self.session.state = SessionState.RUNNING


def _drain(queue: asyncio.Queue[Any]) -> None:
    while not queue.empty():
        queue.get_nowait()


class SessionManager:
    """Creates, runs, lists and stops sessions within the configured limits."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.sessions: dict[str, Session] = {}
        self._ocr_pool: ThreadPoolExecutor | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._ray: RayStreams | None = None

    @property
    def running(self) -> list[Session]:
        return [s for s in self.sessions.values() if not s.done]

    def get(self, session_id: str) -> Session | None:
        return self.sessions.get(session_id)

    def job_config(self, request: SessionRequest) -> StreamfuseConfig:
        base = self.config.job
        update: dict[str, Any] = {
            k: v for k in ("ocr", "asr", "realtime") if (v := getattr(request, k)) is not None
        }
        if request.input is None:
            update["realtime"] = False  # the client paces its live input
        if request.ask is not None:
            update["lm"] = (base.lm or LMStageConfig()).model_copy(update={"ask": request.ask})
        config = base.model_copy(update=update)
        if not (config.ocr or config.asr) and request.input is not None:
            raise SessionRejected("both ocr and asr off: nothing to do")
        return config

    async def create(self, request: SessionRequest) -> Session:
        try:
            return await self._create(request)
        except SessionLimit:
            instruments().serve_refused.add(1, {"reason": "limit"})
            raise
        except SessionRejected:
            instruments().serve_refused.add(1, {"reason": "input"})
            raise

    async def _create(self, request: SessionRequest) -> Session:
        if len(self.running) >= self.config.max_sessions:
            raise SessionLimit(f"session limit reached ({self.config.max_sessions} running)")
        local = request.input is not None and not is_url(request.input)
        if local and not self.config.allow_files:
            raise SessionRejected("this server does not read local files; send a URL")
        session = Session(
            id=secrets.token_hex(4),
            request=request,
            config=self.job_config(request),
            serve=self.config,
        )
        inputs: list[str | Source] = []
        if session.live:
            if request.media:
                session.pipe = BytePipe(self.config.ingest_buffer_bytes)
                inputs.append(
                    PipeSource(
                        session.pipe,
                        stream_id=request.stream_id,
                        label=f"live:{session.id}",
                        video=session.config.ocr,
                        audio=session.config.asr,
                    )
                )
            session.text = TextSource(
                stream_id=request.stream_id,
                name=f"text:{session.id}",
                clock=session.media_clock,
                max_pending=self.config.session_queue,
            )
            inputs.append(session.text)
        else:
            inputs.append(request.input or "")
        self._forget_finished()
        self.sessions[session.id] = session
        ready: asyncio.Future[None] | None = None
        if not session.live:
            ready = asyncio.get_running_loop().create_future()
        session.task = asyncio.create_task(self._run(session, inputs, ready), name=session.id)
        if ready is not None:
            # A URL or file is opened before answering, so a bad one is the request's error.
            try:
                await ready
            except StreamfuseError as e:
                self.sessions.pop(session.id, None)
                raise SessionRejected(str(e)) from None
        self._ensure_watchdog()
        return session

    async def _run(
        self, session: Session, inputs: list[str | Source], ready: asyncio.Future[None] | None
    ) -> None:
        """Build and run the session's job; `ready` (URL and file sessions) is resolved once
        the input is open, or with the error that stopped it."""
        sink = SessionSink(session)
        running = instruments().serve_sessions
        attrs = {"live": str(session.live).lower()}
        running.add(1, attrs)
        try:
            await self._run_job(session, inputs, sink, ready)
        finally:
            running.add(-1, attrs)

    def _on_ray(self, session: Session) -> bool:
        """Whether `session` runs on the Ray cluster: a URL or file session, no language
        model (it spans the timeline and stays here), with `ServeConfig.ray` set."""
        return self.config.ray is not None and not session.live and session.config.lm is None

    async def _run_job(
        self,
        session: Session,
        inputs: list[str | Source],
        sink: SessionSink,
        ready: asyncio.Future[None] | None,
    ) -> None:
        if self._on_ray(session):
            assert isinstance(inputs[0], str)
            await self._run_on_ray(session, inputs[0], sink, ready)
            return
        try:
            if session.config.ocr and self._ocr_pool is None:
                # Every session's OCR reads go through one pool, a worker per core: reads are
                # served first come, first served instead of time-slicing the cores.
                self._ocr_pool = ThreadPoolExecutor(
                    max_workers=os.cpu_count() or 1, thread_name_prefix="sf-ocr"
                )
            job = await build_pipeline(
                inputs,
                session.config,
                [sink],
                ocr_pool=self._ocr_pool,
                n_streams=max(1, len(self.running)),
            )
        except Exception as e:
            if session.state is SessionState.STOPPED:  # stopped before its input began
                session._close_results()
                return
            session.state = SessionState.FAILED
            session.error = str(e) if isinstance(e, StreamfuseError) else f"{type(e).__name__}: {e}"
            if ready is not None:
                ready.set_exception(SourceError(session.error))
            session.note_error("input", session.error)
            session._close_results()
            session.end_inputs()
            return
        session.job = job
        # Running once every stage is set up (models loaded): a live client starts sending then.
        job.pipeline.observe(_MarkRunning(session))
        if ready is not None:
            ready.set_result(None)
        stats = asyncio.create_task(self._stats_loop(session, job))
        try:
            await run_job(job, [sink])
            if session.state in (SessionState.STARTING, SessionState.RUNNING):
                session.state = SessionState.FINISHED
        except asyncio.CancelledError:
            session.state = SessionState.STOPPED
        except Exception as e:  # the session ends; the server and other sessions go on
            log.exception("session %s failed", session.id)
            session.state = SessionState.FAILED
            session.error = f"{type(e).__name__}: {e}"
            session.note_error("session", session.error)
        finally:
            stats.cancel()
            session.summary = job.summary()
            session.publish(session.summary)
            session._close_results()

    async def _run_on_ray(
        self, session: Session, location: str, sink: SessionSink, ready: asyncio.Future[None] | None
    ) -> None:
        """The session's branch on a node of the Ray cluster; its events come back through
        `sink`, the merged final `stats` record last (also when stopped)."""
        assert self.config.ray is not None
        if self._ray is None:
            self._ray = RayStreams(self.config.ray)

        def started(run: StreamRun) -> None:
            session.ray_run = run
            if session.state is SessionState.STARTING:
                session.state = SessionState.RUNNING
            if ready is not None and not ready.done():
                ready.set_result(None)

        t0 = time.monotonic()
        report = None
        try:
            report = await self._ray.run(
                [location], session.config, [sink], keys=[session.id], on_start=started
            )
            run = report.streams[0]
            if run.error is not None:
                session.state = SessionState.FAILED
                session.error = run.error
                session.note_error("session", run.error)
            elif session.state in (SessionState.STARTING, SessionState.RUNNING):
                session.state = SessionState.FINISHED
        except asyncio.CancelledError:
            session.state = SessionState.STOPPED
        except Exception as e:  # the session ends; the server and other sessions go on
            session.state = SessionState.FAILED
            session.error = str(e) if isinstance(e, StreamfuseError) else f"{type(e).__name__}: {e}"
            if ready is not None and not ready.done():
                ready.set_exception(SourceError(session.error))
            else:
                log.warning("session %s failed on Ray: %s", session.id, session.error)
            session.note_error("session", session.error)
        finally:
            if ready is not None and not ready.done():
                ready.set_result(None)  # ended before it started (stopped): nothing to refuse
            if report is not None:
                session.summary = report.summary  # `run` sent it to the sink already
            else:
                runs = [session.ray_run] if session.ray_run is not None else []
                session.summary = merged_summary(
                    runs, session.config.realtime, time.monotonic() - t0
                )
                session.publish(session.summary)
            session._close_results()

    async def _stats_loop(self, session: Session, job: Job) -> None:
        while True:
            await asyncio.sleep(self.config.stats_interval_s)
            session.publish(job.stats_record(final=False))

    async def stop(self, session: Session, *, timeout_s: float = 15.0) -> None:
        """End the session's inputs; what was read drains to its results first."""
        if session.done or session.task is None:
            return
        session.state = SessionState.STOPPED
        session.end_inputs()
        if session.job is not None:
            session.job.pipeline.request_stop()
        elif self._on_ray(session):
            session.task.cancel()  # its branch on the node is stopped by the cancellation
        try:
            await asyncio.wait_for(asyncio.shield(session.task), timeout_s)
        except TimeoutError:
            session.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await session.task

    def _ensure_watchdog(self) -> None:
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._idle_watchdog())

    async def _idle_watchdog(self) -> None:
        """Ends live sessions whose client went quiet (a closed tab, a dead network)."""
        limit = self.config.idle_timeout_s
        while self.running:
            await asyncio.sleep(min(1.0, limit / 4))
            now = now_wall()
            for session in self.running:
                quiet = now - session.last_input_wall
                if session.live and quiet > limit and not session.inputs_ended:
                    session.note_error("input", f"no input for {quiet:.0f} s: session ended")
                    session.end_inputs()

    def _forget_finished(self) -> None:
        done = [s for s in self.sessions.values() if s.done]
        for session in done[: max(0, len(done) - self.config.keep_finished)]:
            del self.sessions[session.id]

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(s) for s in self.running), return_exceptions=True)
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._ocr_pool is not None:
            self._ocr_pool.shutdown(wait=False, cancel_futures=True)
        if self._ray is not None:
            import ray

            ray.shutdown()  # this process's connection (and a `local` instance it started)
