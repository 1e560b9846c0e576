"""The deadline-aware UDP link (asyncio): messages cut into MTU-sized fragments, NACK-driven
selective retransmission while a message's deadline allows, RFC 6298 RTO with a tail-loss probe,
and estimates of RTT, loss and bottleneck bandwidth that the edge's keep-ratio policy reads.
First copies leave through a pacer at `PACING_GAIN` x the measured bandwidth, so a message
sized to the link's budget waits in the sender (where nothing is dropped and a repair can go
first), not in the bottleneck's bounded queue (which tail-drops).
Past its deadline the sender resends nothing, but waits up to one more RTO for the message's
acknowledgement (one that arrived just in time is acknowledged a one-way delay later) before it
gives the message up as lost.

`UdpSender` (edge) sends messages; `UdpReceiver` (cloud) reassembles them, delivers them in
order within each lane (`lane`: speech does not wait for a key frame sent before it; the pacer
sends it first too), gives up on a message `deadline_s` after it was first missed (dropped and
counted; its late fragments too), handles duplicates and reordering, and counts and drops any
malformed datagram: nothing a peer sends raises out of its receive path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from streamfuse.clock import now_wall
from streamfuse.errors import StreamfuseError
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.wire import (
    OVERHEAD,
    Kind,
    Modality,
    Packet,
    WireError,
    decode,
    encode,
    fragment,
)

log = logging.getLogger(__name__)

#: Packet flag: the sender retransmits until acknowledged; a barrier (delivered after every
#: message before it, and every message after it follows it), delivered even after its slot was
#: skipped.
RELIABLE = 0x1
#: Packet flag: a retransmission (the receiver's loss count looks at first copies only).
RETRANSMIT = 0x2
# first copies of the message's fragments received, its fragment count, its bytes, and the
# arrival dispersion of its fragments (us)
_ACK = struct.Struct("!IIII")
_LOSS_WINDOW = 400  # fragments the loss estimate looks back over
_TICK_S = 0.005
_SEND_LOG = 10_000  # messages whose send time the sender remembers
#: Sequences ahead of the next one due that the receiver accepts: a (buggy or hostile) packet
#: far ahead must not make it track billions of "missing" messages.
SEQUENCE_WINDOW = 4096
#: Full datagrams in the bandwidth probe an edge sends after opening its stream.
PROBE_DATAGRAMS = 4
#: First copies leave at this multiple of the measured bandwidth: above 1 so the estimate can
#: see a faster link (a sample is at most the rate we sent at), below 2 so a message sized to
#: the link builds at most a third of its own length as queue at the bottleneck (BBR probes at
#: 1.25, WebRTC's pacer runs video at 2.5 x its target rate).
PACING_GAIN = 1.5
#: Datagrams the pacer may send back to back after the event loop was late (no larger
#: credit: a stall must not turn into the burst pacing is there to avoid).
_PACE_BURST = 2


def lane(p: Packet) -> int:
    """The delivery lane of a message (its header): control messages, speech, video patches,
    ... each keep their own order, and one lane's lost or slow message does not hold up the
    others (a speech chunk is not kept waiting behind a key frame still crossing a slow link).
    Lanes are a sender's choice, sent as each message's `follows_back`."""
    return -1 if p.kind is Kind.CONTROL else int(p.modality)


def _priority(p: Packet) -> int:
    """The pacer's order for first copies: control, then speech and edge-read text (small,
    and late is useless), then everything else in the order it was sent."""
    if p.kind is Kind.CONTROL:
        return 0
    return 1 if p.modality in (Modality.AUDIO_OPUS, Modality.TEXT_LINES) else 2


class TransportError(StreamfuseError):
    """The link cannot be set up or a reliable message was never acknowledged."""


class RttEstimator:
    """RFC 6298 smoothed RTT, variance and retransmission timeout (clock granularity 1 ms),
    and the smallest of the last `RECENT` samples (`min_rtt_s`: the path's delay without the
    queue our own messages build at the bottleneck)."""

    RECENT = 32

    def __init__(self, initial_rto_s: float = 1.0, min_rto_s: float = 0.05) -> None:
        self.srtt_s: float | None = None
        self.rttvar_s = 0.0
        self.rto_s = initial_rto_s
        self.min_rto_s = min_rto_s
        self._recent: deque[float] = deque(maxlen=self.RECENT)

    @property
    def min_rtt_s(self) -> float | None:
        return min(self._recent) if self._recent else None

    def sample(self, rtt_s: float) -> None:
        self._recent.append(rtt_s)
        if self.srtt_s is None:
            self.srtt_s, self.rttvar_s = rtt_s, rtt_s / 2
        else:
            self.rttvar_s = 0.75 * self.rttvar_s + 0.25 * abs(self.srtt_s - rtt_s)
            self.srtt_s = 0.875 * self.srtt_s + 0.125 * rtt_s
        self.rto_s = max(self.min_rto_s, self.srtt_s + max(0.001, 4 * self.rttvar_s))

    def backoff(self) -> None:
        self.rto_s = min(60.0, 2 * self.rto_s)


class BandwidthEstimator:
    """Bottleneck bandwidth from delivery-rate samples, one per message of two or more first
    copies: its bytes after the first over the longer of the receiver's arrival spread and our
    own send spread (BBR's delivery rate: a train we paced cannot show a faster link than we
    sent it at, however a stalled event loop bunched its arrivals). The estimate is the lower
    median of the last `WINDOW` samples: one sample off either way (arrivals bunched by a CPU
    stall, or spread by one) does not move it."""

    WINDOW = 5

    def __init__(self) -> None:
        self._samples: deque[float] = deque(maxlen=self.WINDOW)
        #: The estimate (None: no sample yet); read for every datagram the pacer sends.
        self.bps: float | None = None

    def sample(self, trailing_bytes: int, received_s: float, sent_s: float = 0.0) -> None:
        """`trailing_bytes` after a message's first datagram arrived `received_s` after it
        and left `sent_s` after it."""
        spread_s = max(received_s, sent_s)
        if spread_s > 0:
            self._samples.append(8.0 * trailing_bytes / spread_s)
            ordered = sorted(self._samples)
            self.bps = ordered[(len(ordered) - 1) // 2]


@dataclass(frozen=True, slots=True)
class LinkEstimate:
    """What the edge knows about the link now (None: not measured yet)."""

    srtt_s: float | None
    rto_s: float
    loss: float
    bandwidth_bps: float | None
    #: Payload bytes sent and not yet acknowledged (in flight or queued at the bottleneck):
    #: what a new message waits behind.
    queued_bytes: int = 0
    #: The smallest recent RTT sample: the path without our own queue (None: no sample).
    min_rtt_s: float | None = None


@dataclass
class SenderStats:
    messages: int = 0
    datagrams: int = 0
    bytes: int = 0
    retransmits: int = 0
    nacks: int = 0
    acks: int = 0
    #: ACKs that came after their message's deadline (the cloud had it; not expired).
    late_acks: int = 0
    #: Messages given up: no ACK by their deadline plus the wait for a late one.
    expired: int = 0
    #: Messages withdrawn before all of them left (`abandon`: a refinement part that a new
    #: key frame overtook).
    abandoned: int = 0
    malformed: int = 0


@dataclass
class ReceiverStats:
    datagrams: int = 0
    bytes: int = 0
    malformed: int = 0
    duplicates: int = 0
    late_fragments: int = 0
    late_dropped: int = 0
    delivered: int = 0
    reordered: int = 0
    nacks_sent: int = 0
    #: Well-formed datagrams of another stream, or too far ahead of the sequence window.
    foreign: int = 0
    #: Messages the sender withdrew (`Kind.ABANDON`), skipped without waiting for them.
    abandoned: int = 0
    #: Messages delivered ahead of an earlier one (of another lane) still on its way.
    ahead: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _Out:
    seq: int
    datagrams: list[bytes]
    packets: list[Packet]
    size: int
    deadline_wall: float
    reliable: bool
    sent_wall: float = 0.0
    last_send_wall: float = 0.0
    retransmitted: bool = False
    acked: asyncio.Future[None] | None = None
    ack_by_wall: float = 0.0  # past the deadline: given up if no ACK by then
    sent_at: dict[int, float] = field(default_factory=dict)  # fragment -> last resend
    #: fragment -> when the pacer let its first copy go, and when (at the measured bandwidth,
    #: behind what left before it) it has passed the bottleneck
    released: dict[int, float] = field(default_factory=dict)
    passed: dict[int, float] = field(default_factory=dict)
    #: Bytes this end had sent when the first and when the last first copy left: what passed
    #: the bottleneck between them, other lanes' datagrams included (the packet train).
    bytes_first: int = 0
    bytes_last: int = 0


class _UdpEnd:
    """What both ends share: a UDP socket, the periodic tick that runs beside it, and the
    handlers the socket's callbacks call."""

    _transport: asyncio.DatagramTransport | None = None
    _ticker: asyncio.Task[None] | None = None

    async def _open(self, what: str, **endpoint: Any) -> None:
        """Open the socket (`create_datagram_endpoint` arguments) and start the tick."""
        loop = asyncio.get_running_loop()
        try:
            self._transport, _ = await loop.create_datagram_endpoint(
                lambda: _Endpoint(self), **endpoint
            )
        except OSError as e:
            raise TransportError(f"{what}: {e}") from e
        self._ticker = asyncio.create_task(self._tick_loop())

    async def _close_socket(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    async def _tick_loop(self) -> None:
        raise NotImplementedError

    def _on_datagram(self, data: bytes, addr: Any) -> None:
        raise NotImplementedError

    def _count_malformed(self) -> None:
        raise NotImplementedError


class _SenderBook:
    """What both edge ends (`UdpSender`, the TCP fallback's `TcpSender`) keep: sequence
    numbers, the wire header of a new message, the acknowledgement book with its waiters, and
    the RTT and bandwidth estimates the keep policy reads."""

    _out: dict[int, Any]  # the messages in flight, each with its payload `size`

    def __init__(self, config: TransportConfig, stream: int) -> None:
        self.config = config
        self.stream = stream
        self.stats = SenderStats()
        self.rtt = RttEstimator(config.initial_rto_s, config.min_rto_s)
        self.bandwidth = BandwidthEstimator()
        #: Share of first copies lost (0 where the link repairs loss itself: TCP).
        self.loss = 0.0
        #: Sequence -> wall time it was first sent.
        self.send_wall: dict[int, float] = {}
        self._seq = 0
        #: Lane -> its last message, and the last reliable message (a barrier), or -1.
        self._lane_last: dict[int, int] = {}
        self._barrier = -1
        self._acked: set[int] = set()
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._out = {}
        #: Messages past their deadline (nothing resent) whose late ACK may still come.
        self._late: dict[int, Any] = {}
        self._idle = asyncio.Event()  # set while nothing is outstanding
        self._idle.set()

    def send(
        self,
        template: Packet,
        payload: bytes,
        *,
        deadline_s: float | None = None,
        reliable: bool = False,
    ) -> int:
        raise NotImplementedError

    def _enlist(self, seq: int, out: Any, now: float, reliable: bool) -> None:
        """Book message `seq` (`out`: its in-flight record, with an `acked` field) as sent at
        `now`; a reliable one gets the future its acknowledgement resolves."""
        if reliable:
            out.acked = asyncio.get_running_loop().create_future()
        self._out[seq] = out
        self._idle.clear()
        self.send_wall[seq] = now
        if len(self.send_wall) > _SEND_LOG:  # a bounded log: the oldest entries go first
            del self.send_wall[next(iter(self.send_wall))]
        self.stats.messages += 1

    @property
    def bandwidth_bps(self) -> float | None:
        """The bottleneck bandwidth measured (None: not yet)."""
        return self.bandwidth.bps

    async def send_reliable(self, template: Packet, payload: bytes, timeout_s: float) -> int:
        """Send and wait for the acknowledgement (raises `TransportError` after `timeout_s`)."""
        seq = self.send(template, payload, deadline_s=timeout_s, reliable=True)
        fut = self._out[seq].acked
        assert fut is not None
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError as e:
            raise TransportError(f"no acknowledgement from the cloud within {timeout_s} s") from e
        return seq

    def estimate(self) -> LinkEstimate:
        """RTT, RTO, loss, bandwidth and the payload bytes still in flight, as the keep policy
        reads them."""
        queued = sum(out.size for out in self._out.values())
        return LinkEstimate(
            self.rtt.srtt_s,
            self.rtt.rto_s,
            self.loss,
            self.bandwidth_bps,
            queued,
            self.rtt.min_rtt_s,
        )

    def abandon(self, seq: int) -> bool:
        """Withdraw message `seq` before all of it is sent; returns whether it was withdrawn
        (here never: a link that sends every message at once cannot)."""
        return False

    def acked(self, seq: int) -> bool:
        """Whether the cloud acknowledged message `seq` (one of the last few hundred)."""
        return seq in self._acked

    def lost(self, seq: int) -> bool:
        """Whether message `seq` was sent and given up (past its deadline and the wait for a
        late acknowledgement, never acknowledged). Acknowledgements older than the last few
        hundred messages are forgotten: such a message reads as lost (remember `acked` where
        that matters)."""
        return (
            seq < self._seq
            and seq not in self._out
            and seq not in self._late
            and seq not in self._acked
        )

    def _note_acked(self, seq: int) -> None:
        self._acked.add(seq)
        if len(self._acked) > 512:
            self._acked = {s for s in self._acked if s > seq - 256}

    async def wait_acked(self, seq: int, timeout_s: float) -> bool:
        """Wait (at most `timeout_s`) until message `seq` is acknowledged or given up."""
        if seq in self._out or seq in self._late:
            fut = self._waiters.setdefault(seq, asyncio.get_running_loop().create_future())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        return self.acked(seq)

    def _wake(self, seq: int) -> None:
        waiter = self._waiters.pop(seq, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def probe(self) -> int:
        """Send a train of `PROBE_DATAGRAMS` full datagrams (modality NONE, which the cloud
        ignores) so the first key frame is sized from a measured bandwidth; returns its
        sequence."""
        room = self.config.mtu_bytes - OVERHEAD
        return self.send(Packet(), bytes(PROBE_DATAGRAMS * room))

    def _next_head(self, template: Packet, *, reliable: bool) -> Packet:
        """The header of the next message: `template`'s fields, this end's stream, the next
        sequence number, and the message it follows: the last of its lane, or the last
        reliable one if that came later (a reliable message follows none: it is a barrier)."""
        seq = self._seq
        self._seq += 1
        key = lane(template) if self.config.lanes else 0
        after = -1 if reliable else max(self._lane_last.get(key, -1), self._barrier)
        self._lane_last[key] = seq
        if reliable:
            self._barrier = seq
        back = seq - after if after >= 0 and seq - after <= 0xFFFF else 0
        return Packet(
            kind=template.kind,
            stream=self.stream,
            sequence=seq,
            follows_back=back,
            media_time_us=template.media_time_us,
            modality=template.modality,
            dtype=template.dtype,
            shape=template.shape,
            quant_scale=template.quant_scale,
            keep_ratio=template.keep_ratio,
            mask_bits=template.mask_bits,
            sample_rate=template.sample_rate,
            flags=template.flags | (RELIABLE if reliable else 0),
            traceparent=template.traceparent,
        )


class _Endpoint(asyncio.DatagramProtocol):
    """Glue from asyncio's callbacks to the owner's methods."""

    def __init__(self, owner: _UdpEnd) -> None:
        self.owner = owner

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        try:
            self.owner._on_datagram(data, addr)
        except Exception:  # the receive loop must survive anything a peer sends
            log.exception("datagram from %s dropped", addr)
            self.owner._count_malformed()

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable and the like: the peer is not there (yet); retransmission and
        # deadlines handle it.
        log.debug("socket error: %s", exc)


class UdpSender(_UdpEnd, _SenderBook):
    """The edge end: `send` messages towards one receiver."""

    _out: dict[int, _Out]

    def __init__(self, config: TransportConfig, stream: int = 0) -> None:
        super().__init__(config, stream)
        # (fragments, first copies lost) of recently acknowledged messages, and their sums
        self._loss_window: deque[tuple[int, int]] = deque()
        self._loss_n = 0
        self._loss_lost = 0
        #: When the bottleneck (at the measured bandwidth) has passed every datagram sent.
        self._drained_wall = 0.0
        #: First copies waiting for the pacer (message, fragment), oldest first, one queue
        #: per `_priority` (control, speech, the rest); when it may send the next datagram,
        #: and its timer.
        self._paced: tuple[deque[tuple[_Out, int]], ...] = (deque(), deque(), deque())
        self._pace_wall = 0.0
        self._pace_timer: asyncio.TimerHandle | None = None

    @classmethod
    async def connect(
        cls, host: str, port: int, config: TransportConfig | None = None, stream: int = 0
    ) -> UdpSender:
        sender = cls(config or TransportConfig(), stream)
        await sender._open(f"cannot open a UDP socket to {host}:{port}", remote_addr=(host, port))
        return sender

    def send(
        self,
        template: Packet,
        payload: bytes,
        *,
        deadline_s: float | None = None,
        reliable: bool = False,
    ) -> int:
        """Send one message now; returns its sequence number."""
        head = self._next_head(template, reliable=reliable)
        seq = head.sequence
        packets = fragment(head, payload, self.config.mtu_bytes)
        datagrams = [encode(p) for p in packets]
        now = now_wall()
        out = _Out(
            seq,
            datagrams,
            packets,
            len(payload),
            now + (deadline_s if deadline_s is not None else self.config.deadline_s),
            reliable,
            sent_wall=now,
            last_send_wall=now,
        )
        self._enlist(seq, out, now, reliable)
        queue = self._paced[_priority(head) if self.config.lanes else -1]
        queue.extend((out, i) for i in range(len(datagrams)))
        self._pump()
        return seq

    async def drain(self, timeout_s: float) -> None:
        """Wait until every message is acknowledged or given up."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)

    async def close(self) -> None:
        if self._pace_timer is not None:
            self._pace_timer.cancel()
            self._pace_timer = None
        for queue in self._paced:
            queue.clear()
        await self._close_socket()

    def abandon(self, seq: int) -> bool:
        """Withdraw message `seq` while some of its first copies still wait for the pacer:
        the rest is not sent, nothing of it is repaired, it reads as `lost`, and the receiver
        is told to skip it (`Kind.ABANDON`, sent twice) instead of holding the messages after
        it until its deadline. Returns whether it was withdrawn (False: all of it left
        already, or it is acknowledged or given up)."""
        out = self._out.get(seq)
        if out is None or out.reliable or len(out.released) == len(out.datagrams):
            return False
        del self._out[seq]
        self.stats.abandoned += 1
        notice = encode(Packet(kind=Kind.ABANDON, stream=self.stream, sequence=seq))
        for _ in range(2):
            self._put(notice)
        self._forget(seq)
        return True

    # -- internals ------------------------------------------------------------------------
    def _pump(self) -> None:
        """Send the first copies whose turn has come (`PACING_GAIN` x the measured bandwidth;
        all at once while none is measured: the probe), the most urgent queue first, and time
        the next turn."""
        self._pace_timer = None
        while queue := next((q for q in self._paced if q), None):
            out, i = queue[0]
            if self._out.get(out.seq) is not out:  # past its deadline: nothing more of it
                queue.popleft()
                continue
            now = now_wall()
            if self._pace_wall > now:
                loop = asyncio.get_running_loop()
                self._pace_timer = loop.call_later(self._pace_wall - now, self._pump)
                return
            queue.popleft()
            out.released[i] = now
            out.last_send_wall = now
            out.passed[i] = self._put(out.datagrams[i])
            if i == 0:
                out.bytes_first = self.stats.bytes
            if len(out.released) == len(out.datagrams):
                out.bytes_last = self.stats.bytes

    def _put(self, datagram: bytes) -> float:
        """Send one datagram now; returns when it will have passed the bottleneck (at the
        measured bandwidth, behind what we sent before it)."""
        now = now_wall()
        bandwidth = self.bandwidth_bps
        if bandwidth:
            interval = 8.0 * len(datagram) / (PACING_GAIN * bandwidth)
            credit = (_PACE_BURST - 1) * interval
            self._pace_wall = max(self._pace_wall, now - credit) + interval
        if self._transport is None:
            return now
        self._transport.sendto(datagram)
        self.stats.datagrams += 1
        self.stats.bytes += len(datagram)
        if bandwidth:
            start = max(now, self._drained_wall)
            self._drained_wall = start + 8.0 * len(datagram) / bandwidth
            return self._drained_wall
        return now

    def _forget(self, seq: int) -> None:
        """Message `seq` is acknowledged or given up: nothing more to wait for."""
        self._out.pop(seq, None)
        self._late.pop(seq, None)
        self._wake(seq)
        if not self._out and not self._late:
            self._idle.set()

    def _retransmit(self, out: _Out, index: int) -> None:
        """Resend one fragment now, ahead of the first copies waiting for the pacer (a repair
        races a deadline); it still takes its share of the pace."""
        out.sent_at[index] = now_wall()
        p = out.packets[index]
        self._put(encode(replace(p, flags=p.flags | RETRANSMIT)))
        self.stats.retransmits += 1

    def _count_malformed(self) -> None:
        self.stats.malformed += 1

    def _on_datagram(self, data: bytes, addr: Any) -> None:
        try:
            p = decode(data)
        except WireError:
            self.stats.malformed += 1
            return
        out = self._out.get(p.sequence)
        now = now_wall()
        if p.kind is Kind.NACK:
            self.stats.nacks += 1
            if out is None or now > out.deadline_wall:
                return
            if len(p.payload) % 2:
                self.stats.malformed += 1
                return
            wanted = struct.unpack(f"!{len(p.payload) // 2}H", p.payload)
            indices = [i for i in wanted if i < len(out.datagrams)] or range(len(out.datagrams))
            # A fragment that may still be on its way makes the NACK stale, and resending it
            # would only lengthen the queue (a retransmission storm on a slow link). A resend
            # is given one smoothed RTT. A first copy leaves the bottleneck after the datagrams
            # queued ahead of its message and the message's earlier fragments (measured
            # bandwidth), then takes the path's own delay: the smallest recent RTT, as the
            # deadline policy counts it. The smoothed RTT also holds the queue, counted here
            # already: with speech queued behind a key frame it made the sender refuse the
            # NACK for the frame's tail-dropped last fragment until its deadline was past.
            # A first copy still waiting for the pacer has not left at all.
            srtt = self.rtt.srtt_s or 0.0
            path = min(srtt, self.rtt.min_rtt_s or srtt)
            resend = [
                i
                for i in indices
                if i in out.passed
                and (
                    now - out.sent_at[i] >= srtt
                    if i in out.sent_at
                    else now - out.passed[i] >= path
                )
            ]
            if not resend:
                return
            out.retransmitted = True
            for i in resend:
                self._retransmit(out, i)
            out.last_send_wall = now
        elif p.kind is Kind.ACK:
            self.stats.acks += 1
            if len(p.payload) != _ACK.size:
                self.stats.malformed += 1
                return
            originals, count, _size, dispersion_us = _ACK.unpack(p.payload)
            if out is None:
                out = self._late.get(p.sequence)
                if out is None:
                    return  # a duplicate ACK
                self.stats.late_acks += 1
            self._forget(p.sequence)
            self._note_acked(p.sequence)
            if out.acked is not None and not out.acked.done():
                out.acked.set_result(None)
            first = out.released.get(0, out.sent_wall)
            if not out.retransmitted:  # Karn: no RTT sample from a retransmitted message
                # From its first datagram's departure, less the message's own spread at the
                # bottleneck: a 20 KB key frame on a 200 kbit/s link is not a 0.8 s round trip.
                self.rtt.sample(max(0.0, now - first - dispersion_us / 1e6))
            # Packet-train dispersion: the datagrams after the first arrived `dispersion` after
            # it, at the bottleneck's pace (0 from the receiver unless every fragment was a
            # first copy; too few bytes: timer noise dominates), and left us over `sent`.
            trailing = out.bytes_last - out.bytes_first
            if trailing >= self.config.mtu_bytes // 2 and dispersion_us > 0:
                sent_s = max(out.released.values(), default=first) - first
                self.bandwidth.sample(trailing, dispersion_us / 1e6, sent_s)
            if count:
                self._loss_window.append((count, max(0, count - originals)))
                self._loss_n += count
                self._loss_lost += max(0, count - originals)
                while self._loss_n - self._loss_window[0][0] >= _LOSS_WINDOW:
                    n, lost = self._loss_window.popleft()
                    self._loss_n -= n
                    self._loss_lost -= lost
                self.loss = self._loss_lost / self._loss_n

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            now = now_wall()
            for seq, out in list(self._out.items()):
                # The RTO counts from when the message's last byte could have left the
                # bottleneck: on a slow link a big message (and what is queued before it)
                # takes longer than a round trip to go through.
                unsent = len(out.released) < len(out.datagrams)
                through = max(out.passed.values(), default=now)
                serial = max(0.0, through - out.last_send_wall)
                if now > out.deadline_wall:
                    # Nothing is resent now, but a message that reached the cloud just in
                    # time is acknowledged a one-way delay later: wait one RTO (at most a
                    # deadline) for that ACK before the message counts as lost. (Its first
                    # copies still waiting for the pacer are not sent.)
                    del self._out[seq]
                    out.ack_by_wall = now + min(
                        self.config.deadline_s, self.rtt.rto_s + max(0.0, through - now)
                    )
                    self._late[seq] = out
                    continue
                if not unsent and now - out.last_send_wall >= self.rtt.rto_s + serial:
                    # Tail-loss probe: resend the last fragment; the receiver NACKs the rest.
                    self._retransmit(out, len(out.packets) - 1)
                    out.retransmitted = True
                    out.last_send_wall = now
                    self.rtt.backoff()
            for seq, out in list(self._late.items()):
                if now > out.ack_by_wall:
                    self._forget(seq)
                    self.stats.expired += 1
                    if out.acked is not None and not out.acked.done():
                        out.acked.set_exception(
                            TransportError(f"message {seq} was never acknowledged")
                        )
                        out.acked.exception()  # retrieved: send_reliable reports its own


@dataclass
class Message:
    """A reassembled message, as delivered by `UdpReceiver.messages`."""

    header: Packet
    payload: bytes
    first_seen_wall: float
    complete_wall: float


@dataclass
class _In:
    count: int
    header: Packet
    parts: dict[int, bytes] = field(default_factory=dict)
    first_seen_wall: float = 0.0
    first_arrival_wall: float = 0.0
    last_arrival_wall: float = 0.0
    last_nack_wall: float = 0.0
    nacks: int = 0
    originals: int = 0  # fragments that arrived as first copies


class UdpReceiver(_UdpEnd):
    """The cloud end: reassembles, orders and delivers one edge's messages."""

    def __init__(self, config: TransportConfig, stream: int = 0) -> None:
        self.config = config
        #: The stream number this receiver serves (the sender's `stream`).
        self.stream = stream
        self.stats = ReceiverStats()
        self.peer: Any = None
        self._incomplete: dict[int, _In] = {}
        #: Complete messages waiting for the one they follow.
        self._done: dict[int, Message] = {}
        self._known_since: dict[int, float] = {}  # missing sequence -> when first missed
        #: Every message before `_next` is delivered or skipped; `_settled` holds those after
        #: it that are (another lane's messages may go ahead of a message still incomplete).
        self._next = 0
        self._settled: set[int] = set()
        self._highest = -1
        #: Skipped as too late or withdrawn by the sender (the newest few thousand).
        self._given_up: set[int] = set()
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue()
        self._repair_s = 0.05  # NACK -> repair time, measured
        #: Gap between consecutive first copies of one message's fragments (EWMA): on a slow
        #: link a fragment still queued behind its predecessors is not lost, and NACKing it
        #: before its turn only adds a retransmission to the queue.
        self._gap_s = 0.0

        self._closed = False

    @classmethod
    async def listen(
        cls, host: str, port: int, config: TransportConfig | None = None, stream: int = 0
    ) -> UdpReceiver:
        receiver = cls(config or TransportConfig(), stream)
        await receiver._open(f"cannot listen on UDP {host}:{port}", local_addr=(host, port))
        return receiver

    @property
    def address(self) -> tuple[str, int]:
        assert self._transport is not None
        host, port = self._transport.get_extra_info("sockname")[:2]
        return str(host), int(port)

    async def messages(self) -> AsyncIterator[Message]:
        """Messages in order within each lane (late ones skipped) until `close`."""
        while True:
            m = await self._queue.get()
            if m is None:
                return
            yield m

    async def close(self) -> None:
        await self._close_socket()
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    # -- internals ------------------------------------------------------------------------
    def _count_malformed(self) -> None:
        self.stats.malformed += 1

    def _send(self, packet: Packet) -> None:
        if self._transport is not None and self.peer is not None:
            self._transport.sendto(encode(packet), self.peer)

    def _ack(self, header: Packet, originals: int, size: int, dispersion_s: float) -> None:
        body = _ACK.pack(
            originals,
            header.fragment_count if originals else 0,
            min(size, 2**32 - 1),
            min(2**32 - 1, round(dispersion_s * 1e6)),
        )
        self._send(
            Packet(kind=Kind.ACK, stream=header.stream, sequence=header.sequence, payload=body)
        )

    def _on_datagram(self, data: bytes, addr: Any) -> None:
        now = now_wall()
        try:
            p = decode(data)
        except WireError:
            self.stats.malformed += 1
            return
        if p.kind not in (Kind.DATA, Kind.CONTROL, Kind.ABANDON):
            self.stats.malformed += 1
            return
        if p.stream != self.stream or p.sequence >= self._next + SEQUENCE_WINDOW:
            self.stats.foreign += 1
            return
        if p.kind is Kind.ABANDON:
            self._abandon(p.sequence, now)
            return
        self.peer = addr
        self.stats.datagrams += 1
        self.stats.bytes += len(data)

        seq = p.sequence
        if seq in self._done:
            self.stats.duplicates += 1
            return
        if self._settled_already(seq):
            if seq not in self._given_up:
                self.stats.duplicates += 1
                self._ack(p, 0, 0, 0.0)  # our first ACK may have been lost
                return
            if not p.flags & RELIABLE:
                self.stats.late_fragments += 1
                return
        msg = self._incomplete.get(seq)
        if msg is None:
            msg = _In(p.fragment_count, p, first_seen_wall=self._known_since.get(seq, now))
            self._incomplete[seq] = msg
        if msg.count == 0:  # NACKed whole before any fragment arrived
            msg.count, msg.header = p.fragment_count, p
        if p.fragment_count != msg.count:
            self.stats.malformed += 1
            return
        if p.fragment_index in msg.parts:
            self.stats.duplicates += 1
            return
        if msg.nacks and len(msg.parts) and now - msg.last_nack_wall > 0:
            self._repair_s = 0.8 * self._repair_s + 0.2 * (now - msg.last_nack_wall)
        if seq < self._highest:
            self.stats.reordered += 1
        if msg.parts and not p.flags & RETRANSMIT and p.fragment_index == max(msg.parts) + 1:
            # Up at once (a slower link), down slowly (one quick pair is no proof).
            gap = now - msg.last_arrival_wall
            self._gap_s = max(gap, 0.9 * self._gap_s + 0.1 * gap)
        msg.parts[p.fragment_index] = p.payload
        if not p.flags & RETRANSMIT:
            msg.originals += 1
        if not msg.first_arrival_wall:
            msg.first_arrival_wall = now
        msg.last_arrival_wall = now
        for missing in range(self._highest + 1, seq):
            self._known_since.setdefault(missing, now)
        self._highest = max(self._highest, seq)
        if len(msg.parts) == msg.count:
            del self._incomplete[seq]
            self._known_since.pop(seq, None)
            payload = b"".join(msg.parts[i] for i in range(msg.count))
            # Every fragment a first copy: their spread is the bottleneck's pace.
            dispersion = now - msg.first_arrival_wall if msg.originals == msg.count else 0.0
            self._ack(msg.header, msg.originals, len(payload), dispersion)
            m = Message(msg.header, payload, msg.first_seen_wall, now)
            if self._settled_already(seq):  # a reliable message that came after its skip
                self._given_up.discard(seq)
                self._deliver(m)
            else:
                self._done[seq] = m
                self._release()

    def _abandon(self, seq: int, now: float) -> None:
        """The sender withdrew message `seq`: skip it at once, not at its deadline (what
        arrived of it is dropped, its stragglers are late; a second notice changes nothing)."""
        if self._settled_already(seq) or seq in self._done:
            return
        self.stats.abandoned += 1
        self._incomplete.pop(seq, None)
        for missing in range(self._highest + 1, seq):
            self._known_since.setdefault(missing, now)
        self._highest = max(self._highest, seq)
        self._skip(seq)
        self._release()

    def _deliver(self, m: Message) -> None:
        self.stats.delivered += 1
        self._queue.put_nowait(m)

    def _settled_already(self, seq: int) -> bool:
        """Whether message `seq` was delivered or skipped."""
        return seq < self._next or seq in self._settled

    def _settle(self, seq: int) -> None:
        self._settled.add(seq)
        self._known_since.pop(seq, None)
        while self._next in self._settled:
            self._settled.discard(self._next)
            self._next += 1
        if len(self._given_up) > 4096:
            self._given_up = {s for s in self._given_up if s >= self._next - 2048}

    def _skip(self, seq: int) -> None:
        """Give message `seq` up: the messages that follow it need not wait for it."""
        self._given_up.add(seq)  # its stragglers are late
        self._settle(seq)

    def _ready(self, header: Packet) -> bool:
        """Whether a complete message may be delivered: a reliable one once everything
        before it is settled, any other once the message it follows is."""
        if header.flags & RELIABLE:
            return header.sequence == self._next
        back = header.follows_back
        return back == 0 or self._settled_already(header.sequence - back)

    def _advance(self, now: float) -> None:
        """Skip what is too late to be useful, whatever its lane (its stragglers count as
        late), then deliver what that released (the tick's work)."""
        for seq in range(self._next, self._highest + 1):
            if seq in self._done or seq in self._settled:
                continue
            inc = self._incomplete.get(seq)
            since = inc.first_seen_wall if inc is not None else self._known_since.get(seq)
            if since is not None and now - since >= self.config.deadline_s:
                self.stats.late_dropped += 1
                self._incomplete.pop(seq, None)
                self._skip(seq)
        self._release()

    def _release(self) -> None:
        """Deliver each complete message whose predecessor is settled, oldest first, until
        none is left that may go."""
        delivered = True
        while delivered and self._done:
            delivered = False
            for seq in sorted(self._done):
                m = self._done[seq]
                if self._ready(m.header):
                    del self._done[seq]
                    if seq != self._next:
                        self.stats.ahead += 1
                    self._deliver(m)
                    self._settle(seq)
                    delivered = True

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            now = now_wall()
            self._advance(now)
            interval = max(2 * self.config.nack_delay_s, 1.5 * self._repair_s)
            for seq in range(self._next, self._highest + 1):
                if seq in self._done or seq in self._settled:
                    continue
                msg = self._incomplete.get(seq)
                since = msg.last_arrival_wall if msg else self._known_since.get(seq, now)
                last = msg.last_nack_wall if msg else 0.0
                wait = max(self.config.nack_delay_s, 3.0 * self._gap_s)
                if now - since < wait or now - last < max(interval, wait):
                    continue
                if msg is None:
                    # Nothing of it arrived: NACK the whole message (empty list).
                    msg = _In(1, Packet(sequence=seq), first_seen_wall=since)
                    msg.last_arrival_wall = since
                    self._incomplete[seq] = msg
                    missing: list[int] = []
                    msg.count = 0  # unknown until a fragment arrives
                else:
                    missing = [i for i in range(msg.count) if i not in msg.parts]
                msg.last_nack_wall = now
                msg.nacks += 1
                self.stats.nacks_sent += 1
                missing = missing[:500]  # the rest after these are repaired
                payload = struct.pack(f"!{len(missing)}H", *missing)
                self._send(Packet(kind=Kind.NACK, sequence=seq, payload=payload))


__all__ = [
    "PACING_GAIN",
    "RELIABLE",
    "RETRANSMIT",
    "BandwidthEstimator",
    "LinkEstimate",
    "Message",
    "ReceiverStats",
    "RttEstimator",
    "SenderStats",
    "TransportError",
    "UdpReceiver",
    "UdpSender",
]
