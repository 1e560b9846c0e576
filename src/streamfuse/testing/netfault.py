"""A UDP fault proxy on loopback (asyncio): what a bad uplink does to datagrams, reproducibly.

`FaultProxy(target, faults)` listens on a local port and forwards each datagram to `target`
(and replies back to the last client) after delay + jitter, Bernoulli or Gilbert-Elliott
(bursty) loss, reordering, duplication, bit corruption and a bandwidth cap with a bounded queue.
Every decision comes from one seeded RNG; `stats` counts what was done. Run by hand:
``python -m streamfuse.testing.netfault --listen 127.0.0.1:9001 --to 127.0.0.1:9000 loss=0.05``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.clock import now_wall


class FaultConfig(BaseModel):
    """Faults applied to each direction of the link (`both_ways=False`: uplink only, but
    delay applies both ways)."""

    model_config = ConfigDict(extra="forbid")

    delay_ms: float = Field(0.0, ge=0.0, le=10_000.0, description="One-way base delay.")
    jitter_ms: float = Field(
        0.0, ge=0.0, le=10_000.0, description="Uniform extra delay in [0, jitter] (reorders)."
    )
    loss: float = Field(0.0, ge=0.0, le=1.0, description="Bernoulli loss probability.")
    ge_p_bad: float = Field(
        0.0, ge=0.0, le=1.0, description="Gilbert-Elliott: P(good -> bad) per datagram (0: off)."
    )
    ge_p_good: float = Field(0.3, gt=0.0, le=1.0, description="Gilbert-Elliott: P(bad -> good).")
    ge_loss_bad: float = Field(0.8, ge=0.0, le=1.0, description="Loss probability when bad.")
    reorder: float = Field(0.0, ge=0.0, le=1.0, description="P(a datagram is held back).")
    reorder_ms: float = Field(30.0, ge=0.0, le=10_000.0, description="How long it is held.")
    duplicate: float = Field(0.0, ge=0.0, le=1.0, description="P(a datagram is sent twice).")
    corrupt: float = Field(0.0, ge=0.0, le=1.0, description="P(a datagram gets a bit flipped).")
    bandwidth_bps: float | None = Field(
        None, gt=0.0, description="Bottleneck rate (None: unlimited)."
    )
    queue_s: float = Field(
        1.0, gt=0.0, le=60.0, description="Bottleneck queue, in seconds at its rate (tail drop)."
    )
    both_ways: bool = Field(False, description="Also apply loss/corruption to replies.")
    seed: int = 0

    @classmethod
    def parse(cls, spec: str) -> FaultConfig:
        """From `key=value,key=value` (e.g. `loss=0.05,delay_ms=50,jitter_ms=20`)."""
        values: dict[str, Any] = {}
        for item in filter(None, (x.strip() for x in spec.split(","))):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"fault spec item {item!r} is not key=value")
            values[key.strip()] = value.strip()
        return cls.model_validate(values)


@dataclass
class FaultStats:
    forwarded: int = 0
    lost: int = 0
    queue_dropped: int = 0
    duplicated: int = 0
    corrupted: int = 0
    reordered: int = 0
    replies: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Side(asyncio.DatagramProtocol):
    def __init__(self, proxy: FaultProxy, upstream: bool) -> None:
        self.proxy = proxy
        self.upstream = upstream

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.proxy._received(data, addr, self.upstream)


class FaultProxy:
    """Forwards client -> `target` with faults, and target -> client replies."""

    def __init__(self, target: tuple[str, int], faults: FaultConfig | None = None) -> None:
        self.target = target
        self.faults = faults or FaultConfig()
        self.stats = FaultStats()
        self._rng = random.Random(self.faults.seed)
        self._bad = False
        self._free_at = {True: 0.0, False: 0.0}  # bottleneck busy until, per direction
        self._client: Any = None
        self._front: asyncio.DatagramTransport | None = None
        self._back: asyncio.DatagramTransport | None = None
        self._timers: set[asyncio.TimerHandle] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        """Listen; returns the address clients should send to."""
        loop = asyncio.get_running_loop()
        self._front, _ = await loop.create_datagram_endpoint(
            lambda: _Side(self, True), local_addr=(host, port)
        )
        self._back, _ = await loop.create_datagram_endpoint(
            lambda: _Side(self, False), remote_addr=self.target
        )
        h, p = self._front.get_extra_info("sockname")[:2]
        return str(h), int(p)

    async def close(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        for t in (self._front, self._back):
            if t is not None:
                t.close()

    async def __aenter__(self) -> FaultProxy:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _lost(self) -> bool:
        f, rng = self.faults, self._rng
        if f.ge_p_bad > 0:
            if self._bad:
                self._bad = rng.random() >= f.ge_p_good
            else:
                self._bad = rng.random() < f.ge_p_bad
            if self._bad and rng.random() < f.ge_loss_bad:
                return True
        return rng.random() < f.loss

    def _received(self, data: bytes, addr: Any, upstream: bool) -> None:
        f, rng = self.faults, self._rng
        if upstream:
            self._client = addr
        else:
            self.stats.replies += 1
        faulty = upstream or f.both_ways
        if faulty and self._lost():
            self.stats.lost += 1
            return
        copies = 1
        if faulty and f.duplicate and rng.random() < f.duplicate:
            copies = 2
            self.stats.duplicated += 1
        for _ in range(copies):
            payload = data
            if faulty and f.corrupt and rng.random() < f.corrupt and data:
                b = bytearray(data)
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                payload = bytes(b)
                self.stats.corrupted += 1
            now = now_wall()
            depart = now
            if f.bandwidth_bps is not None:
                start = max(now, self._free_at[upstream])
                if start - now > f.queue_s:
                    self.stats.queue_dropped += 1
                    continue
                depart = start + 8.0 * len(payload) / f.bandwidth_bps
                self._free_at[upstream] = depart
            delay = f.delay_ms / 1000.0 + rng.uniform(0.0, f.jitter_ms / 1000.0)
            if faulty and f.reorder and rng.random() < f.reorder:
                delay += f.reorder_ms / 1000.0
                self.stats.reordered += 1
            self._schedule(depart + delay - now, payload, upstream)

    def _schedule(self, after_s: float, payload: bytes, upstream: bool) -> None:
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle | None = None

        def fire() -> None:
            assert handle is not None
            self._timers.discard(handle)
            if upstream and self._back is not None:
                self._back.sendto(payload)
                self.stats.forwarded += 1
            elif not upstream and self._front is not None and self._client is not None:
                self._front.sendto(payload, self._client)

        handle = loop.call_later(max(0.0, after_s), fire)
        self._timers.add(handle)


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT clients send to")
    parser.add_argument("--to", required=True, help="HOST:PORT of the real receiver")
    parser.add_argument("faults", nargs="?", default="", help="key=value,... (FaultConfig)")
    args = parser.parse_args(argv)

    async def serve() -> None:
        proxy = FaultProxy(_addr(args.to), FaultConfig.parse(args.faults))
        await proxy.start(*_addr(args.listen))
        try:
            await asyncio.Event().wait()
        finally:
            await proxy.close()

    asyncio.run(serve())


if __name__ == "__main__":
    main()


__all__ = ["FaultConfig", "FaultProxy", "FaultStats"]
