"""The TCP fallback: the same wire packets over a length-framed stream arrive intact and in
order and are acknowledged (the edge measures RTT and bandwidth); a damaged packet is counted
and skipped; an edge whose UDP goes unanswered falls back to TCP on the same port, and one whose
UDP works stays on UDP; the cloud's `DualReceiver` serves whichever the edge uses."""

from __future__ import annotations

import asyncio
import random
import socket

import pytest

from streamfuse.testing.live import ephemeral_low, free_port
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.tcp import DualReceiver, TcpReceiver, TcpSender, open_link
from streamfuse.transport.udp import UdpSender
from streamfuse.transport.wire import Kind, Modality, Packet, encode

pytestmark = pytest.mark.unit

HELLO = Packet(kind=Kind.CONTROL, modality=Modality.JSON)


def test_messages_cross_tcp_intact_in_order_and_a_damaged_packet_is_skipped() -> None:
    async def run() -> tuple[list[tuple[int, bytes]], dict[int, bytes], TcpSender, int]:
        config = TransportConfig()
        rx = await TcpReceiver.listen("127.0.0.1", 0, config)
        tx = await TcpSender.connect(*rx.address, config)
        rng = random.Random(4)
        sent = {await tx.send_reliable(HELLO, b'{"op": "open"}', 5): b'{"op": "open"}'}
        tx.probe()
        for _ in range(20):
            payload = rng.randbytes(rng.randrange(10, 9000))
            sent[tx.send(Packet(modality=Modality.VIDEO_PATCHES), payload)] = payload
        # A packet with a bad CRC, framed correctly: counted, the stream goes on.
        bad = bytearray(encode(Packet(sequence=999, payload=b"x" * 40)))
        bad[-1] ^= 0xFF
        tx._writer.write(len(bad).to_bytes(4, "big") + bytes(bad))
        sent[tx.send(Packet(modality=Modality.JSON), b"after")] = b"after"
        await tx.drain(5)
        got: list[tuple[int, bytes]] = []
        async for m in rx.messages():
            got.append((m.header.sequence, m.payload))
            if m.payload == b"after":
                break
        malformed = rx.stats.malformed
        await tx.close()
        await rx.close()
        return got, sent, tx, malformed

    got, sent, tx, malformed = asyncio.run(run())
    assert [s for s, _ in got if s != 1] == sorted(sent)  # 1: the probe
    assert all(sent[s] == p for s, p in got if s in sent)
    assert malformed == 1
    e = tx.estimate()
    assert e.srtt_s is not None and e.bandwidth_bps is not None and e.queued_bytes == 0


def test_an_edge_falls_back_to_tcp_when_udp_goes_unanswered() -> None:
    async def run() -> tuple[object, bytes]:
        config = TransportConfig(udp_timeout_s=0.5)
        # Only TCP listens on the port: UDP to it is "blocked" (nothing answers).
        rx = await TcpReceiver.listen(
            "127.0.0.1", free_port(socket.SOCK_STREAM, socket.SOCK_DGRAM), config
        )
        sender, _seq = await open_link(*rx.address, config, HELLO, b'{"op": "open"}')
        first = await anext(rx.messages())
        await sender.close()
        await rx.close()
        return sender, first.payload

    sender, first = asyncio.run(run())
    assert isinstance(sender, TcpSender) and first == b'{"op": "open"}'


def test_the_cloud_serves_udp_or_tcp_whichever_the_edge_uses() -> None:
    async def run(link: str) -> tuple[object, str, bytes]:
        config = TransportConfig(link=link, udp_timeout_s=2.0)  # type: ignore[arg-type]
        rx = await DualReceiver.listen("127.0.0.1", 0, config)
        sender, _ = await open_link(*rx.address, config, HELLO, b"hello " + link.encode())
        first = await anext(rx.messages())
        await sender.close()
        await rx.close()
        return sender, rx.link, first.payload

    sender, kind, first = asyncio.run(run("auto"))
    assert isinstance(sender, UdpSender) and kind == "udp" and first == b"hello auto"
    sender, kind, first = asyncio.run(run("tcp"))
    assert isinstance(sender, TcpSender) and kind == "tcp" and first == b"hello tcp"


def test_a_free_port_lies_below_the_kernels_own_range_and_binds_both_ways() -> None:
    # Outgoing connections take ports from the kernel's range; a test server's port must not
    # be one of them (it is bound seconds after it is drawn).
    for _ in range(20):
        port = free_port(socket.SOCK_STREAM, socket.SOCK_DGRAM)
        assert 1024 <= port < ephemeral_low()
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as s:
                s.bind(("127.0.0.1", port))
