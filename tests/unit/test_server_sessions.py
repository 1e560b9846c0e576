"""A session's results: kept for late subscribers, fanned out live, a subscriber that falls
too far behind cut off (the session never buffers for it without bound), and the end always
delivered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streamfuse.app import StreamfuseConfig
from streamfuse.server.config import ServeConfig
from streamfuse.server.sessions import Session, SessionRequest, SlowConsumer

pytestmark = pytest.mark.unit


def session(queue: int = 16) -> Session:
    return Session(
        id="s1",
        request=SessionRequest(),
        config=StreamfuseConfig(),
        serve=ServeConfig(session_queue=queue, token="x" * 8),
    )


def rec(i: int) -> dict[str, Any]:
    return {"type": "text", "i": i}


def test_late_subscribers_get_the_history_then_live_records_then_the_end() -> None:
    async def scenario() -> tuple[list[Any], list[Any]]:
        s = session()
        s.publish(rec(0))
        early = asyncio.create_task(_all(s))
        await asyncio.sleep(0)
        s.publish(rec(1))
        late = asyncio.create_task(_all(s))
        await asyncio.sleep(0)
        s.publish(rec(2))
        s._close_results()
        return await early, await late

    early, late = asyncio.run(scenario())
    assert [r["i"] for r in early] == [0, 1, 2] == [r["i"] for r in late]


def test_a_subscriber_too_far_behind_is_cut_off_and_the_end_always_fits() -> None:
    async def scenario() -> tuple[list[int], BaseException | None, list[int]]:
        s = session(queue=16)
        slow_got: list[int] = []
        slow_error: BaseException | None = None
        slow_it = s.follow()
        s.publish(rec(0))
        # The slow one subscribes, takes one record, then reads nothing while 17 go out.
        slow_got.append((await anext(slow_it))["i"])
        steady = asyncio.create_task(_all(s))
        await asyncio.sleep(0)
        for i in range(1, 18):
            s.publish(rec(i))
            await asyncio.sleep(0)  # the steady one keeps up
        try:
            async for r in slow_it:
                slow_got.append(r["i"])
        except SlowConsumer as e:
            slow_error = e
        for i in range(18, 18 + 16):  # exactly at the bound: the end still fits
            s.publish(rec(i))
        s._close_results()
        return slow_got, slow_error, [r["i"] for r in await steady]

    slow_got, error, steady = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert slow_got == [0]  # what it had queued was dropped with it
    assert isinstance(error, SlowConsumer) and "fell 16 events behind" in str(error)
    assert steady == list(range(34))


async def _all(s: Session) -> list[dict[str, Any]]:
    return [r async for r in s.follow()]
