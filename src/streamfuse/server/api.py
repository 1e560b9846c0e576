"""The HTTP side of `streamfuse serve`: REST for sessions, WebSockets for live inputs and
results, Server-Sent Events, `/health`, `/metrics` and the dashboard page.

Every route but `/health` (and `/metrics` when made public) needs the token: an
`Authorization: Bearer` header, a `?token=` query parameter or the cookie the dashboard page
sets. A bad message closes only the connection (and, for media, the input) it came on, with a
close reason naming the problem; every other session goes on, and what a session produced is
kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import HTTPConnection

from streamfuse import __version__, telemetry
from streamfuse.errors import StreamfuseError
from streamfuse.server.config import ServeConfig
from streamfuse.server.sessions import (
    Session,
    SessionLimit,
    SessionManager,
    SessionRejected,
    SessionRequest,
    SlowConsumer,
)

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).with_name("static")
COOKIE = "streamfuse_token"

# WebSocket close codes (RFC 6455) used to say why a connection was closed.
WS_POLICY = 1008  # missing or wrong token
WS_TOO_BIG = 1009
WS_BAD_DATA = 1007
WS_TRY_LATER = 1013  # too far behind / no room
WS_GONE = 4404  # no such session


class TextMessage(BaseModel):
    """One message on a session's text WebSocket."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=10_000)
    author: str | None = Field(None, max_length=100)
    kind: str = Field("chat", pattern=r"^[a-z_]{1,20}$")
    ask: bool = Field(False, description="Also put it to the language model as a question.")


def _token_of(conn: HTTPConnection) -> str | None:
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return conn.query_params.get("token") or conn.cookies.get(COOKIE)


def create_app(config: ServeConfig | None = None) -> FastAPI:
    """The service as an ASGI app (run it with uvicorn: `streamfuse.server.serve`)."""
    config = config or ServeConfig()
    # The job config's telemetry is the server's: one SDK installation for every session,
    # with a registry behind /metrics.
    tele = config.job.telemetry.model_copy(update={"prometheus_registry": True})
    config = config.model_copy(update={"job": config.job.model_copy(update={"telemetry": tele})})
    manager = SessionManager(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        telemetry.setup(tele)
        yield
        await manager.close()

    app = FastAPI(
        title="streamfuse",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,  # the docs pages load scripts from a CDN; /openapi.json stays
        redoc_url=None,
    )
    app.state.config = config
    app.state.sessions = manager
    app.add_middleware(_BodyLimit, max_bytes=config.max_message_bytes)

    def authorized(conn: HTTPConnection) -> bool:
        token = _token_of(conn)
        return token is not None and secrets.compare_digest(token.encode(), config.token.encode())

    def require_token(request: Request) -> None:
        if not authorized(request):
            raise HTTPException(
                401, "missing or wrong token", headers={"WWW-Authenticate": "Bearer"}
            )

    def session_or_404(session_id: str) -> Session:
        session = manager.get(session_id)
        if session is None:
            raise HTTPException(404, f"no session {session_id!r}")
        return session

    async def ws_guard(ws: WebSocket, session_id: str) -> Session | None:
        """Refuse a WebSocket before accepting it: 401 without the token, 404 without the
        session (as plain HTTP answers to the handshake)."""
        if not authorized(ws):
            await ws.send_denial_response(
                JSONResponse({"detail": "missing or wrong token"}, status_code=401)
            )
            return None
        session = manager.get(session_id)
        if session is None:
            await ws.send_denial_response(
                JSONResponse({"detail": f"no session {session_id!r}"}, status_code=404)
            )
            return None
        return session

    auth = [Depends(require_token)]

    # -- service -----------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": __version__, "sessions": len(manager.running)}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics(request: Request) -> PlainTextResponse:
        if not config.metrics_public:
            require_token(request)
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        active = telemetry.current()
        if active is None or active.prometheus_registry is None:
            raise HTTPException(503, "metrics are off (OTEL_SDK_DISABLED?)")
        body = generate_latest(active.prometheus_registry)
        return PlainTextResponse(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/", dependencies=auth, include_in_schema=False)
    async def dashboard(request: Request) -> Any:
        page = STATIC_DIR / "index.html"
        if not page.is_file():
            raise HTTPException(404, "the dashboard page is not installed")
        response = FileResponse(page, media_type="text/html")
        if request.query_params.get("token"):
            # The page's own requests (and its WebSockets) then carry the token as a cookie.
            response.set_cookie(COOKIE, config.token, httponly=True, samesite="strict")
        return response

    @app.get("/static/{name}", dependencies=auth, include_in_schema=False)
    async def static(name: str) -> FileResponse:
        path = (STATIC_DIR / name).resolve()
        if path.parent != STATIC_DIR.resolve() or not path.is_file():
            raise HTTPException(404, f"no static file {name!r}")
        return FileResponse(path)

    # -- sessions ----------------------------------------------------------------------------
    @app.post("/api/sessions", dependencies=auth, status_code=201)
    async def create_session(request: SessionRequest) -> dict[str, Any]:
        try:
            session = await manager.create(request)
        except SessionLimit as e:
            raise HTTPException(429, str(e)) from None
        except SessionRejected as e:
            raise HTTPException(400, str(e)) from None
        return session.info()

    @app.get("/api/sessions", dependencies=auth)
    async def list_sessions() -> list[dict[str, Any]]:
        return [s.info() for s in manager.sessions.values()]

    @app.get("/api/sessions/{session_id}", dependencies=auth)
    async def inspect_session(session_id: str) -> dict[str, Any]:
        return session_or_404(session_id).info(detail=True)

    @app.delete("/api/sessions/{session_id}", dependencies=auth)
    async def stop_session(session_id: str) -> dict[str, Any]:
        session = session_or_404(session_id)
        await manager.stop(session)
        return session.info(detail=True)

    @app.get("/api/sessions/{session_id}/events", dependencies=auth)
    async def events_sse(session_id: str) -> StreamingResponse:
        session = session_or_404(session_id)

        async def stream() -> AsyncIterator[str]:
            try:
                async for record in session.follow():
                    yield f"event: {record['type']}\ndata: {json.dumps(record)}\n\n"
            except SlowConsumer as e:
                yield f"event: overflow\ndata: {json.dumps({'detail': str(e)})}\n\n"

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.websocket("/api/sessions/{session_id}/events")
    async def events_ws(ws: WebSocket, session_id: str) -> None:
        session = await ws_guard(ws, session_id)
        if session is None:
            return
        await ws.accept()
        closer = asyncio.create_task(_until_closed(ws))
        try:
            async for record in session.follow():
                if closer.done():
                    return
                await ws.send_text(json.dumps(record))
            await ws.close(1000, "session ended")
        except SlowConsumer as e:
            await ws.close(WS_TRY_LATER, _reason(str(e)))
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client went away
        finally:
            closer.cancel()

    @app.websocket("/api/sessions/{session_id}/media")
    async def media_ws(ws: WebSocket, session_id: str) -> None:
        session = await ws_guard(ws, session_id)
        if session is None:
            return
        await ws.accept()
        if session.pipe is None or session.inputs_ended:
            await ws.close(WS_BAD_DATA, "this session takes no (more) media input")
            return

        async def on_bytes(data: bytes) -> str | None:
            try:
                await session.feed_media(data)
            except StreamfuseError as e:  # `IngestOverflow` (too far ahead), input ended
                return str(e)
            return None

        problem = await _receive_loop(
            ws, config.max_message_bytes, on_bytes=on_bytes, on_text=_media_control
        )
        if problem is not None:
            code, reason = problem
            session.note_error("media", f"media input closed: {reason}")
            await _close(ws, code, reason)
        # The media input is the live session's clock: when it ends, so does the session.
        session.end_inputs()

    @app.websocket("/api/sessions/{session_id}/text")
    async def text_ws(ws: WebSocket, session_id: str) -> None:
        session = await ws_guard(ws, session_id)
        if session is None:
            return
        await ws.accept()
        if session.text is None or session.inputs_ended:
            await ws.close(WS_BAD_DATA, "this session takes no (more) text input")
            return

        async def on_text(message: str) -> str | None:
            parsed = _parse_text(message)
            if isinstance(parsed, str):
                return parsed
            try:
                session.feed_text(
                    parsed.text, author=parsed.author, kind=parsed.kind, ask=parsed.ask
                )
            except asyncio.QueueFull as e:
                return f"text input full: {e}"
            return None

        async def on_bytes(data: bytes) -> str | None:
            return "binary message on the text stream: send JSON or plain text"

        problem = await _receive_loop(
            ws, config.max_message_bytes, on_bytes=on_bytes, on_text=on_text
        )
        if problem is not None:
            code, reason = problem
            session.note_error("text", f"text input closed: {reason}")
            await _close(ws, code, reason)

    return app


# -- WebSocket plumbing --------------------------------------------------------------------------

Handler = Callable[[Any], Awaitable[str | None]]


async def _media_control(message: str) -> str | None:
    try:
        control = json.loads(message)
    except json.JSONDecodeError:
        control = None
    if isinstance(control, dict) and control.get("type") == "end":
        return ""  # the client ended its input: a normal close
    return 'expected binary media or {"type": "end"}'


async def _receive_loop(
    ws: WebSocket, max_bytes: int, *, on_bytes: Handler, on_text: Handler
) -> tuple[int, str] | None:
    """Feed each message to its handler until the client closes (None), a message is over
    `max_bytes` (1009), a handler names a problem (1007 with it) or returns `""` (a normal
    end). Returns the close code and reason of a problem."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        data, text = message.get("bytes"), message.get("text") or ""
        size = len(data) if data is not None else len(text.encode())
        if size > max_bytes:
            return WS_TOO_BIG, _too_big(size, max_bytes)
        problem = await (on_bytes(data) if data is not None else on_text(text))
        if problem == "":
            await _close(ws, 1000, "input ended")
            return None
        if problem is not None:
            return WS_BAD_DATA, problem


def _parse_text(message: str) -> TextMessage | str:
    """A text-stream message, or the problem with it. Plain text (not starting with `{`)
    is a chat message as it is."""
    stripped = message.strip()
    if not stripped.startswith("{"):
        if not stripped:
            return "empty message"
        return TextMessage(text=stripped[:10_000])
    try:
        return TextMessage.model_validate_json(stripped)
    except ValidationError as e:
        problems = [
            f"{'.'.join(str(p) for p in err['loc']) or 'message'}: {err['msg']}"
            for err in e.errors()[:3]
        ]
        return "malformed text message: " + "; ".join(problems)


def _too_big(n: int, limit: int) -> str:
    return f"message of {n} bytes exceeds the {limit}-byte limit"


def _reason(text: str) -> str:
    # A close reason is at most 123 bytes (RFC 6455).
    data = text.encode()[:123]
    return data.decode(errors="ignore")


async def _close(ws: WebSocket, code: int, reason: str) -> None:
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await ws.close(code, _reason(reason))


async def _until_closed(ws: WebSocket) -> None:
    """Returns when the client closes a send-only WebSocket (events)."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        while (await ws.receive())["type"] != "websocket.disconnect":
            pass


class _BodyLimit:
    """ASGI middleware: a request body over `max_bytes` gets 413 (counted as it streams in,
    so a missing or false Content-Length does not get past it)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(
        self, scope: MutableMapping[str, Any], receive: Callable[..., Any], send: Callable[..., Any]
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send, int(declared))
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(seen)
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge as e:
            await self._refuse(scope, receive, send, e.size)

    async def _refuse(self, scope: Any, receive: Any, send: Any, size: int) -> None:
        detail = {"detail": _too_big(size, self.max_bytes)}
        await JSONResponse(detail, status_code=413)(scope, receive, send)


class _TooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size
