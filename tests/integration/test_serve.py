"""`streamfuse serve` over real sockets on loopback: live sessions fed as a browser feeds them
(WebM chunks + chat over WebSockets), URL sessions over REST, results over WebSocket and SSE,
and the limits: token, message size, session count, idle inputs. Bad input closes only its own
connection; every other session goes on and nothing produced is lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

from streamfuse.server import ServeConfig, create_app, serve_in_thread
from streamfuse.server.client import ServeClient
from streamfuse.testing.media import encode_webm

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SHORT = ROOT / "assets" / "test" / "short.mp4"
TRUTH = json.loads(SHORT.with_suffix(".truth.json").read_text())
TOKEN = "test-token-123"
LIMIT = 256 << 10


@pytest.fixture(scope="module")
def webm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return encode_webm(SHORT, tmp_path_factory.mktemp("media") / "short.webm")


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    config = ServeConfig(
        port=0, token=TOKEN, max_sessions=3, max_message_bytes=LIMIT, idle_timeout_s=4.0
    )
    with serve_in_thread(config) as url:
        yield url


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 240))


async def collect(client: ServeClient, session_id: str) -> list[dict[str, Any]]:
    return [r async for r in client.events(session_id)]


def of(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] == kind]


def assert_matches_truth(records: list[dict[str, Any]]) -> None:
    """The slides read and the words heard are the clip's (as in the CLI's file test)."""
    screen = " ".join(r["text"] for r in of(records, "ocr")).lower()
    for slide in TRUTH["ocr"]:
        words = [w for line in slide["lines"] for w in line.lower().split() if len(w) > 3]
        assert sum(w in screen for w in words) >= 0.8 * len(words), screen
    spoken = " ".join(r["text"] for r in of(records, "asr")).lower()
    truth = {w.strip(".,!?") for u in TRUTH["asr"] for w in u["text"].lower().split()}
    long_words = [w for w in truth if len(w) > 5]
    assert sum(w in spoken for w in long_words) >= 0.7 * len(long_words), spoken


def test_live_sessions_from_webm_chunks_and_chat_and_bad_messages_hit_only_their_sender(
    server: str, webm: Path
) -> None:
    data = webm.read_bytes()

    async def scenario() -> None:
        async with ServeClient(server, TOKEN) as client:
            good = (await client.create_session(stream_id="cam"))["id"]
            bad = (await client.create_session())["id"]
            results = [asyncio.create_task(collect(client, s)) for s in (good, bad)]

            async def chat_then_garbage() -> tuple[int, str]:
                async with websockets.connect(
                    client.ws_url(good, "text"), additional_headers=client.headers
                ) as ws:
                    await ws.send(json.dumps({"text": "which slide is this?", "author": "ann"}))
                    await ws.send("plain text works too")
                    await ws.send('{"txt": "typo in the field name"}')
                    with pytest.raises(ConnectionClosed) as closed:
                        await ws.recv()
                    assert closed.value.rcvd is not None
                    return closed.value.rcvd.code, closed.value.rcvd.reason

            async def some_media_then_oversized() -> tuple[int, str]:
                async with websockets.connect(
                    client.ws_url(bad, "media"), additional_headers=client.headers
                ) as ws:
                    for k in range(0, len(data) // 2, 32 << 10):
                        await ws.send(data[k : k + (32 << 10)])
                        await asyncio.sleep(0.1)
                    await ws.send(b"\0" * (LIMIT + 1))
                    with pytest.raises(ConnectionClosed) as closed:
                        await ws.recv()
                    assert closed.value.rcvd is not None
                    return closed.value.rcvd.code, closed.value.rcvd.reason

            _, text_closed, media_closed = await asyncio.gather(
                client.send_media(good, data, chunk_bytes=32 << 10, over_s=6.0),
                chat_then_garbage(),
                some_media_then_oversized(),
            )
            good_records, bad_records = await asyncio.gather(*results)
            # The SSE stream replays the same records after the end.
            async with client.http.stream("GET", f"/api/sessions/{good}/events") as r:
                sse = [
                    json.loads(ln[6:]) async for ln in r.aiter_lines() if ln.startswith("data: ")
                ]
            info = await client.session(good)

        assert text_closed[0] == 1007 and "txt: Extra inputs are not permitted" in text_closed[1]
        assert media_closed[0] == 1009 and f"exceeds the {LIMIT}-byte limit" in media_closed[1]
        # The good session: every result, the chat on its timeline, the bad text noted.
        assert_matches_truth(good_records)
        chat = of(good_records, "text")
        assert [(c["text"], c["author"]) for c in chat] == [
            ("which slide is this?", "ann"), ("plain text works too", None),
        ]  # fmt: skip
        assert all(c["stream_id"] == "cam" for c in chat + of(good_records, "ocr"))
        errors = of(good_records, "error")
        assert len(errors) == 1 and errors[0]["stage"] == "text", errors
        assert good_records[-1]["type"] == "stats" and good_records[-1]["final"] is True
        assert of(good_records, "stats")[0]["final"] is False  # live stats while it ran
        assert sse == good_records and info["status"] == "finished"
        # The bad session: ended by its oversized message, what it made before kept.
        assert any(
            e["stage"] == "media" and "limit" in e["message"] for e in of(bad_records, "error")
        )
        assert of(bad_records, "ocr"), "the first half of the clip was read before the end"
        assert bad_records[-1]["type"] == "stats" and bad_records[-1]["final"] is True

    run(scenario())


def test_url_session_over_rest_streams_and_stops(server: str) -> None:
    async def scenario() -> None:
        async with ServeClient(server, TOKEN) as client:
            session = await client.create_session(input=str(SHORT), realtime=True, asr=False)
            assert session["status"] in ("starting", "running") and session["live"] is False
            listed = (await client.http.get("/api/sessions")).json()
            assert session["id"] in [s["id"] for s in listed]
            got: list[dict[str, Any]] = []
            stopping: asyncio.Task[dict[str, Any]] | None = None
            async for record in client.events(session["id"]):
                got.append(record)
                if record["type"] == "ocr" and stopping is None:  # stop it mid-way
                    stopping = asyncio.create_task(client.stop(session["id"]))
            assert stopping is not None
            stopped = await stopping
        assert stopped["status"] == "stopped" and stopped["summary"]["final"] is True
        assert got[-1] == stopped["summary"]
        assert of(got, "ocr") and not of(got, "asr")  # asr: false in the request
        assert got[-1]["wall_s"] < 10.0  # stopped before the 12 s clip played out

    run(scenario())


def test_requests_that_cannot_start_a_session_are_refused_with_the_reason(server: str) -> None:
    async def scenario() -> None:
        async with ServeClient(server, TOKEN) as client:
            r = await client.http.post("/api/sessions", json={"input": "/no/such/clip.mp4"})
            assert r.status_code == 400 and "input not found: /no/such/clip.mp4" in r.text
            r = await client.http.post("/api/sessions", json={"input": "http://127.0.0.1:9/x.mp4"})
            assert r.status_code == 400 and "cannot reach http://127.0.0.1:9/x.mp4" in r.text
            r = await client.http.post("/api/sessions", json={"inptu": None})
            assert r.status_code == 422 and "inptu" in r.text
            r = await client.http.post("/api/sessions", content=b"{" + b" " * (LIMIT + 10) + b"}")
            assert r.status_code == 413 and f"exceeds the {LIMIT}-byte limit" in r.text
            assert (await client.http.get("/api/sessions/nope")).status_code == 404
            # The limit: three live sessions run (waiting for media); a fourth is refused.
            ids = [(await client.create_session())["id"] for _ in range(3)]
            r = await client.http.post("/api/sessions", json={})
            assert r.status_code == 429 and "session limit reached (3 running)" in r.text
            for session_id in ids:
                assert (await client.stop(session_id))["status"] == "stopped"
            assert (await client.http.post("/api/sessions", json={})).status_code == 201

    run(scenario())


def test_a_live_session_left_idle_ends_and_says_why(server: str) -> None:
    async def scenario() -> None:
        async with ServeClient(server, TOKEN) as client:
            session = (await client.create_session(media=False))["id"]
            await client.send_text(session, ["hello", {"text": "captions here", "kind": "caption"}])
            records = await collect(client, session)  # ends after the 4 s idle timeout
        assert [r["text"] for r in of(records, "text")] == ["hello", "captions here"]
        assert any("no input for" in e["message"] for e in of(records, "error"))
        assert records[-1]["type"] == "stats" and records[-1]["final"] is True

    run(scenario())


def test_every_route_but_health_needs_the_token(server: str) -> None:
    app = create_app(ServeConfig(token=TOKEN))
    http_routes, ws_routes = [], []
    for route in app.routes:
        path = getattr(route, "path", "")
        if path.startswith(("/openapi", "/docs")):
            continue
        url = path.replace("{session_id}", "abc").replace("{name}", "x.js")
        methods = getattr(route, "methods", None)
        if methods is None:
            ws_routes.append(url)
        else:
            http_routes += [(m, url) for m in methods if m != "HEAD"]
    assert len(http_routes) >= 8 and len(ws_routes) == 3
    with httpx.Client(base_url=server) as client:
        for method, url in http_routes:
            for headers in ({}, {"Authorization": "Bearer wrong-token"}):
                r = client.request(method, url, headers=headers)
                expected = 200 if url == "/health" else 401
                assert r.status_code == expected, (method, url, r.text)
        assert client.get("/metrics", params={"token": TOKEN}).status_code == 200
        r = client.get("/api/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200

    async def handshake(url: str) -> int:
        with pytest.raises(InvalidStatus) as refused:
            async with websockets.connect(server.replace("http", "ws") + url):
                pass
        return refused.value.response.status_code

    for url in ws_routes:
        assert run(handshake(url)) == 401, url
