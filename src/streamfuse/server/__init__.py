"""`streamfuse serve`: the pipeline as a service (FastAPI + uvicorn).

`create_app(ServeConfig(...))` is the ASGI app; `serve(config)` runs it until interrupted;
`serve_in_thread(config)` runs it on a background thread (tests, notebooks, embedding).
The HTTP API is described in `docs/serve.md`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import uvicorn

from streamfuse.server.api import create_app
from streamfuse.server.config import ServeConfig


def _server(config: ServeConfig) -> uvicorn.Server:
    return uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host=config.host,
            port=config.port,
            log_level="warning",
            # uvicorn refuses far larger frames itself; ours name the limit (1009 + reason).
            ws_max_size=2 * config.max_message_bytes,
            ws="websockets-sansio",
            lifespan="on",
        )
    )


def serve(config: ServeConfig, announce: Callable[[str], None] | None = None) -> None:
    """Run the service in this thread until interrupted; `announce(base_url)` is called (on
    another thread) once it listens."""
    server = _server(config)
    if announce is not None:

        def wait_then_announce() -> None:
            while not server.started and not server.should_exit:
                time.sleep(0.02)
            if server.started:
                announce(bound_url(server))

        threading.Thread(target=wait_then_announce, daemon=True).start()
    server.run()


def bound_url(server: uvicorn.Server) -> str:
    sock = server.servers[0].sockets[0]
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


@contextlib.contextmanager
def serve_in_thread(config: ServeConfig, *, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Run the service on a daemon thread; yields its base URL, stops it on exit."""
    server = _server(config)
    thread = threading.Thread(target=server.run, name="streamfuse-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"streamfuse serve did not start on {config.host}:{config.port}")
        time.sleep(0.02)
    try:
        yield bound_url(server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


__all__ = ["ServeConfig", "bound_url", "create_app", "serve", "serve_in_thread"]
