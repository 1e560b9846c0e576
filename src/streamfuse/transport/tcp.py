"""The TCP fallback of the edge-cloud link, for networks that block UDP (asyncio streams).

The same wire packets as over UDP (docs/wire-format.md, CRC32C and all), each framed by a
uint32 length. TCP repairs loss itself, so there are no NACKs and nothing is skipped: a late
message arrives late (head-of-line blocking is TCP's price). The cloud still ACKs every
message, so the edge's RTT and bandwidth estimates, and the keep policy reading them, work.
`open_link` tries UDP first and falls back to TCP on the same port when the open goes
unanswered; `DualReceiver` listens on both and serves whichever the edge uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from streamfuse.clock import now_wall
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.udp import (
    _ACK,
    Message,
    ReceiverStats,
    TransportError,
    UdpReceiver,
    UdpSender,
    _SenderBook,
)
from streamfuse.transport.wire import Kind, Packet, WireError, decode, encode, fragment

log = logging.getLogger(__name__)

_LEN = struct.Struct("!I")
#: Largest frame accepted: a datagram of the largest `mtu_bytes` (a bigger length is garbage).
MAX_FRAME = 65_536


async def _read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next length-framed packet (None at the end of the stream). Raises `WireError` on a
    length no sender writes (the stream cannot be resynchronised after that)."""
    try:
        head = await reader.readexactly(_LEN.size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    (n,) = _LEN.unpack(head)
    if not 0 < n <= MAX_FRAME:
        raise WireError(f"TCP frame of {n} bytes")
    try:
        return await reader.readexactly(n)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


@dataclass
class _Pending:
    size: int
    datagrams: int
    sent_wall: float
    acked: asyncio.Future[None] | None = None


class TcpSender(_SenderBook):
    """The edge end over TCP: the `UdpSender` interface (`send`, `send_reliable`, `probe`,
    `estimate`, `drain`, `close`, `stats`, `send_wall`)."""

    _out: dict[int, _Pending]

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        config: TransportConfig,
        stream: int = 0,
    ) -> None:
        super().__init__(config, stream)
        self._reader, self._writer = reader, writer
        self._acks = asyncio.create_task(self._read_acks())

    @classmethod
    async def connect(
        cls, host: str, port: int, config: TransportConfig | None = None, stream: int = 0
    ) -> TcpSender:
        config = config or TransportConfig()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), config.udp_timeout_s
            )
        except (OSError, TimeoutError) as e:
            raise TransportError(f"cannot open a TCP connection to {host}:{port}: {e}") from e
        return cls(reader, writer, config, stream)

    def send(
        self,
        template: Packet,
        payload: bytes,
        *,
        deadline_s: float | None = None,
        reliable: bool = False,
    ) -> int:
        """Queue one message on the connection now; returns its sequence number."""
        head = self._next_head(template, reliable=reliable)
        seq = head.sequence
        datagrams = [encode(p) for p in fragment(head, payload, self.config.mtu_bytes)]
        now = now_wall()
        self._enlist(seq, _Pending(len(payload), len(datagrams), now), now, reliable)
        if self._writer.is_closing():
            raise TransportError("the TCP connection to the cloud is closed")
        for d in datagrams:
            self._writer.write(_LEN.pack(len(d)) + d)
            self.stats.datagrams += 1
            self.stats.bytes += len(d) + _LEN.size
        return seq

    async def drain(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(self._writer.drain(), timeout_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def close(self) -> None:
        self._acks.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._acks
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()

    async def _read_acks(self) -> None:
        while True:
            try:
                frame = await _read_frame(self._reader)
            except WireError:
                self.stats.malformed += 1
                return
            if frame is None:
                return
            try:
                p = decode(frame)
            except WireError:
                self.stats.malformed += 1
                continue
            if p.kind is not Kind.ACK or len(p.payload) != _ACK.size:
                self.stats.malformed += 1
                continue
            self.stats.acks += 1
            pending = self._out.pop(p.sequence, None)
            self._wake(p.sequence)
            if pending is None:
                continue
            self._note_acked(p.sequence)
            if not self._out:
                self._idle.set()
            if pending.acked is not None and not pending.acked.done():
                pending.acked.set_result(None)
            _originals, _count, size, dispersion_us = _ACK.unpack(p.payload)
            now = now_wall()
            self.rtt.sample(max(0.0, now - pending.sent_wall - dispersion_us / 1e6))
            if pending.datagrams >= 2 and dispersion_us > 0:
                trailing = size * (pending.datagrams - 1) // pending.datagrams
                self.bandwidth.sample(trailing, dispersion_us / 1e6)


@dataclass
class _Partial:
    count: int
    header: Packet
    parts: dict[int, bytes] = field(default_factory=dict)
    first_wall: float = 0.0


class TcpReceiver:
    """The cloud end over TCP: serves the first edge that connects (later ones are refused),
    reassembles its messages in order and ACKs each."""

    def __init__(self, config: TransportConfig, stream: int = 0) -> None:
        self.config = config
        self.stream = stream
        self.stats = ReceiverStats()
        self._server: asyncio.Server | None = None
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue()
        self._peer: asyncio.StreamWriter | None = None
        self._closed = False

    @classmethod
    async def listen(
        cls, host: str, port: int, config: TransportConfig | None = None, stream: int = 0
    ) -> TcpReceiver:
        receiver = cls(config or TransportConfig(), stream)
        try:
            receiver._server = await asyncio.start_server(receiver._serve, host, port)
        except OSError as e:
            raise TransportError(f"cannot listen on TCP {host}:{port}: {e}") from e
        return receiver

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def messages(self) -> AsyncIterator[Message]:
        while True:
            m = await self._queue.get()
            if m is None:
                return
            yield m

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._peer is not None:
            self._peer.close()  # the handler's read ends, and with it the handler
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._peer is not None:  # one edge per receiver, as over UDP
            writer.close()
            return
        self._peer = writer
        partial: dict[int, _Partial] = {}
        try:
            while True:
                try:
                    frame = await _read_frame(reader)
                except WireError:
                    self.stats.malformed += 1
                    break  # the framing is lost: nothing after this can be trusted
                if frame is None:
                    break
                self._on_frame(frame, partial, writer)
        finally:
            writer.close()

    def _on_frame(self, frame: bytes, partial: dict[int, _Partial], writer: Any) -> None:
        now = now_wall()
        try:
            p = decode(frame)
        except WireError:
            self.stats.malformed += 1
            return
        if p.kind not in (Kind.DATA, Kind.CONTROL) or p.stream != self.stream:
            self.stats.foreign += 1
            return
        self.stats.datagrams += 1
        self.stats.bytes += len(frame) + _LEN.size
        msg = partial.setdefault(p.sequence, _Partial(p.fragment_count, p, first_wall=now))
        if p.fragment_count != msg.count or p.fragment_index in msg.parts:
            self.stats.malformed += 1
            return
        msg.parts[p.fragment_index] = p.payload
        if len(msg.parts) < msg.count:
            return
        del partial[p.sequence]
        payload = b"".join(msg.parts[i] for i in range(msg.count))
        body = _ACK.pack(msg.count, msg.count, len(payload), round((now - msg.first_wall) * 1e6))
        ack = encode(Packet(kind=Kind.ACK, stream=p.stream, sequence=p.sequence, payload=body))
        writer.write(_LEN.pack(len(ack)) + ack)
        self.stats.delivered += 1
        self._queue.put_nowait(Message(msg.header, payload, msg.first_wall, now))


class DualReceiver:
    """The cloud listening on UDP and TCP on one port: serves whichever link the edge's first
    message comes over (the other is closed then)."""

    def __init__(self, udp: UdpReceiver, tcp: TcpReceiver) -> None:
        self.udp, self.tcp = udp, tcp
        self.config = udp.config
        self.chosen: UdpReceiver | TcpReceiver = udp

    @classmethod
    async def listen(cls, host: str, port: int, config: TransportConfig | None = None) -> Any:
        config = config or TransportConfig()
        udp = await UdpReceiver.listen(host, port, config)
        try:
            tcp = await TcpReceiver.listen(host, udp.address[1], config)
        except TransportError:
            await udp.close()
            raise
        return cls(udp, tcp)

    @property
    def address(self) -> tuple[str, int]:
        return self.udp.address

    @property
    def stats(self) -> ReceiverStats:
        return self.chosen.stats

    @property
    def link(self) -> str:
        return "tcp" if self.chosen is self.tcp else "udp"

    async def messages(self) -> AsyncIterator[Message]:
        streams = {"udp": self.udp.messages(), "tcp": self.tcp.messages()}
        waiting = {name: asyncio.ensure_future(anext(it)) for name, it in streams.items()}
        try:
            done, _ = await asyncio.wait(waiting.values(), return_when=asyncio.FIRST_COMPLETED)
            name = "udp" if waiting["udp"] in done else "tcp"
        except asyncio.CancelledError:
            for fut in waiting.values():
                fut.cancel()
            raise
        other = "tcp" if name == "udp" else "udp"
        waiting[other].cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await waiting[other]
        await (self.tcp if other == "tcp" else self.udp).close()
        self.chosen = self.udp if name == "udp" else self.tcp
        try:
            first = waiting[name].result()
        except StopAsyncIteration:
            return
        yield first
        async for m in streams[name]:
            yield m

    async def close(self) -> None:
        await self.udp.close()
        await self.tcp.close()


async def open_link(
    host: str, port: int, config: TransportConfig, hello: Packet, body: bytes
) -> tuple[UdpSender | TcpSender, int]:
    """Connect to the cloud and send `hello` reliably: over UDP, and when that goes
    unacknowledged for `udp_timeout_s` (`link="auto"`), over TCP to the same port.
    Returns the sender and the hello's sequence. Raises `TransportError`."""
    if config.link != "tcp":
        udp = await UdpSender.connect(host, port, config)
        try:
            seq = await udp.send_reliable(hello, body, config.udp_timeout_s)
            return udp, seq
        except TransportError:
            await udp.close()
            if config.link == "udp":
                raise
            log.warning("no answer over UDP from %s:%s: falling back to TCP", host, port)
    tcp = await TcpSender.connect(host, port, config)
    try:
        return tcp, await tcp.send_reliable(hello, body, config.udp_timeout_s)
    except TransportError:
        await tcp.close()
        raise


__all__ = ["MAX_FRAME", "DualReceiver", "TcpReceiver", "TcpSender", "open_link"]
