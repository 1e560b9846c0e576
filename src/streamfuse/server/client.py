"""A Python client of `streamfuse serve` (the same HTTP API the dashboard uses).

async with ServeClient("http://127.0.0.1:8765", token) as client:
    session = await client.create_session()            # live: feed it media and text
    await client.send_media(session["id"], "talk.webm", pace_s=0.25)
    async for record in client.events(session["id"]):  # JSONL-sink records
        ...
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import websockets


class ServeClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=self.headers, timeout=timeout_s
        )

    async def __aenter__(self) -> ServeClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.http.aclose()

    def ws_url(self, session_id: str, channel: str) -> str:
        return self.base_url.replace("http", "ws", 1) + f"/api/sessions/{session_id}/{channel}"

    # -- REST ----------------------------------------------------------------------------------
    async def create_session(self, **request: Any) -> dict[str, Any]:
        """`POST /api/sessions` (raises `httpx.HTTPStatusError` naming the refusal)."""
        r = await self.http.post("/api/sessions", json=request)
        r.raise_for_status()
        return dict(r.json())

    async def session(self, session_id: str) -> dict[str, Any]:
        r = await self.http.get(f"/api/sessions/{session_id}")
        r.raise_for_status()
        return dict(r.json())

    async def stop(self, session_id: str) -> dict[str, Any]:
        r = await self.http.delete(f"/api/sessions/{session_id}")
        r.raise_for_status()
        return dict(r.json())

    # -- WebSockets ------------------------------------------------------------------------------
    async def events(self, session_id: str) -> AsyncIterator[dict[str, Any]]:
        """Every record of the session, from its start until it ends."""
        async with websockets.connect(
            self.ws_url(session_id, "events"), additional_headers=self.headers, max_size=None
        ) as ws:
            async for message in ws:
                yield json.loads(message)

    async def send_media(
        self,
        session_id: str,
        media: str | Path | bytes,
        *,
        chunk_bytes: int = 64 << 10,
        over_s: float = 0.0,
        end: bool = True,
    ) -> None:
        """Send a container stream (e.g. WebM) in chunks spread evenly over `over_s` seconds
        (its duration: about as a live sender would), then end the input."""
        data = (
            media if isinstance(media, bytes) else await asyncio.to_thread(Path(media).read_bytes)
        )
        n = max(1, -(-len(data) // chunk_bytes))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with websockets.connect(
            self.ws_url(session_id, "media"), additional_headers=self.headers
        ) as ws:
            for i in range(n):
                await ws.send(data[i * chunk_bytes : (i + 1) * chunk_bytes])
                await asyncio.sleep(max(0.0, t0 + over_s * (i + 1) / n - loop.time()))
            if end:
                await ws.send(json.dumps({"type": "end"}))
                await ws.wait_closed()

    async def send_text(self, session_id: str, messages: Iterable[str | dict[str, Any]]) -> None:
        """Send chat or caption messages (a dict: `text`, `author`, `kind`, `ask`)."""
        async with websockets.connect(
            self.ws_url(session_id, "text"), additional_headers=self.headers
        ) as ws:
            for message in messages:
                await ws.send(message if isinstance(message, str) else json.dumps(message))


__all__ = ["ServeClient"]
