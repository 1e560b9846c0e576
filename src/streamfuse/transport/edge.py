"""The edge end of the split: read an input, keep what matters, send it to the cloud.

`run_edge(location, host, port)` opens the input like `streamfuse run` does, runs the change
detector and the text detector on the video (key frames whose text changed since the last one
sent become sparse patch tokens, sized by the keep-ratio policy from the measured link, or,
when the link cannot carry them in time and the edge's recognizer can, the lines it reads
itself: `EdgeReadPolicy`, `transport.textlines`) and
VAD on the audio (speech only, as Opus), and sends them over the deadline-aware UDP link
(optionally through a local fault proxy). Returns `EdgeReport`: what was sent and what the link
measured.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from opentelemetry import trace
from opentelemetry.propagate import inject

from streamfuse.audio.config import AsrConfig
from streamfuse.events import EventRecord, LinkPayload
from streamfuse.frames import AudioFrame, VideoFrame
from streamfuse.sources.config import SourceConfig
from streamfuse.sources.media import MediaSource
from streamfuse.testing.netfault import FaultConfig, FaultProxy
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.keygate import ContentGate
from streamfuse.transport.patches import (
    REFERENCES_HELD,
    PatchMessage,
    Reference,
    TextBoxes,
    decode_patches,
    encode_patches,
)
from streamfuse.transport.policy import (
    FINEST,
    DeadlineKeepPolicy,
    EdgeReadPolicy,
    SplitDecision,
    Step,
    make_keep_policy,
)
from streamfuse.transport.refine import Refiner
from streamfuse.transport.speech import SpeechChunk, SpeechEncoder
from streamfuse.transport.tcp import TcpSender, open_link
from streamfuse.transport.textlines import TextReader, encode_text_lines, rec_width_px
from streamfuse.transport.udp import UdpSender
from streamfuse.transport.wire import Kind, Modality, Packet
from streamfuse.vision.change import ChangeTracker
from streamfuse.vision.change import key_frame as make_key_frame
from streamfuse.vision.config import ChangeDetectorConfig
from streamfuse.vision.frames import KeyFrame

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("streamfuse.transport")


@dataclass
class EdgeReport:
    stream_id: str = "main"
    #: The link the stream went over: udp, or tcp (the fallback when UDP is blocked).
    link_kind: str = "udp"
    key_frames: int = 0
    video_bytes: int = 0
    speech_messages: int = 0
    audio_bytes: int = 0
    speech_s: float = 0.0
    audio_s: float = 0.0
    media_s: float = 0.0
    #: Key frames of the change detector not sent: no text changed since the last one sent
    #: (camera shake, lighting, the detector's timeout; `TransportConfig.key_gate`).
    skipped_key_frames: int = 0
    keep_ratios: list[float] = field(default_factory=list)
    #: Text patches not sent because the cloud had them from an earlier key frame.
    reused_patches: int = 0
    #: Scale each key frame was sent at (1.0: full size; see `TransportConfig.text_px`).
    scales: list[float] = field(default_factory=list)
    #: Key frames sent coarser and then refined in full (`TransportConfig.refine`), and the
    #: messages (parts) that took.
    refined_key_frames: int = 0
    refine_parts: int = 0
    #: Refinement parts withdrawn before all of them left: a new key frame went first.
    refine_parts_abandoned: int = 0
    #: Key frames the edge read itself and sent as text lines (`TransportConfig.edge_read`),
    #: the bytes of those messages, and the recognizer's wall seconds on them.
    edge_read_frames: int = 0
    text_bytes: int = 0
    edge_read_s: float = 0.0
    #: Per key frame over its budget: where the split fell and why (`SplitDecision`).
    split_decisions: list[dict[str, Any]] = field(default_factory=list)
    #: The edge's `link` events (the same records it relays to the cloud), oldest first.
    link_events: list[dict[str, Any]] = field(default_factory=list)
    #: Per message sent: (sequence, modality, edge wall time it was sent).
    sent: list[tuple[int, str, float]] = field(default_factory=list)
    link: dict[str, Any] = field(default_factory=dict)
    sender: dict[str, Any] = field(default_factory=dict)
    proxy: dict[str, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("sent")
        return d


def held_reference(
    sent: Iterable[tuple[int, Reference]], acked: Callable[[int], bool]
) -> Reference | None:
    """Of the key frames sent (sequence, what the cloud rebuilds), oldest first: the newest
    the cloud acknowledged. The cloud holds the last message of each key frame (a refinement's
    last part): a frame whose last message is not acknowledged yet is skipped."""
    seen: set[int] = set()
    for seq, reference in reversed(list(sent)):
        if reference.index in seen:
            continue
        seen.add(reference.index)
        if acked(seq):
            return reference
    return None


def open_body(info: dict[str, Any]) -> bytes:
    """The CONTROL message that opens a stream on the cloud."""
    return json.dumps({"op": "open", **info}).encode()


def _traceparent() -> str:
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent", "")


class Edge:
    """The edge's work on one stream, independent of where frames come from."""

    def __init__(
        self,
        sender: UdpSender | TcpSender,
        config: TransportConfig,
        *,
        change: ChangeDetectorConfig | None = None,
        asr: AsrConfig | None = None,
        detector: TextBoxes | None = None,
    ) -> None:
        self.sender = sender
        self.config = config
        self.policy = make_keep_policy(config)
        self.tracker = ChangeTracker(change)
        self.gate = (
            ContentGate(config.key_gate_width_px, config.key_gate_min_frac)
            if config.key_gate
            else None
        )
        #: Sequence of the last key frame sent (the gate's reference), None before the first,
        #: and whether the cloud acknowledged it (remembered: the sender forgets old ACKs).
        self._gate_seq: int | None = None
        self._gate_held = False
        self.detector = detector or TextBoxes(config.det_max_side_px)
        asr = asr or AsrConfig()
        self.speech = SpeechEncoder(
            bitrate_bps=config.opus_bitrate_bps,
            chunk_s=config.speech_chunk_s,
            pad_s=config.speech_pad_s,
            start_threshold=asr.vad_start_threshold,
            end_threshold=asr.vad_end_threshold,
            min_silence_s=asr.min_silence_s,
        )
        self.report = EdgeReport()
        self.audio_end_s = 0.0
        self._media_t = 0.0
        self._next_report_t = config.link_report_s
        self._last_keep: float | None = None
        self._last_scale: float | None = None
        self._probe: int | None = None
        #: (sequence, rebuilt key frame) of the last key frames sent: the cloud holds as many.
        self._sent_refs: deque[tuple[int, Reference]] = deque(maxlen=REFERENCES_HELD)
        policy = self.policy
        self.refiner = (
            Refiner(sender, config, policy.budget_bytes, self._send_part, work=self._work)
            if config.refine and isinstance(policy, DeadlineKeepPolicy)
            else None
        )
        #: The edge's recognizer and where the split falls per key frame (deadline policy).
        self.reader = (
            TextReader(self.detector)
            if config.edge_read and isinstance(policy, DeadlineKeepPolicy)
            else None
        )
        self.split = EdgeReadPolicy(config.deadline_s, max_busy=config.edge_read_max_busy)

    def load_reader(self) -> None:
        """Load the edge's recognizer and time it (the split policy's prior); blocking."""
        if self.reader is not None and self.split.cost_s_per_px is None:
            self.split.cost_s_per_px = self.reader.load()

    async def _work(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on a worker thread, its wall time booked as the edge's busy
        time (the split policy's CPU headroom)."""
        t0 = time.perf_counter()
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        finally:
            self.split.observe_work(time.perf_counter() - t0, time.perf_counter())

    async def open(self, info: dict[str, Any], timeout_s: float = 10.0) -> None:
        """Open the stream on the cloud (`info`: stream id, tracks, size) over this sender."""
        await self.sender.send_reliable(
            Packet(kind=Kind.CONTROL, modality=Modality.JSON), open_body(info), timeout_s
        )
        self.opened(info)

    def opened(self, info: dict[str, Any]) -> None:
        """The cloud acknowledged the stream's open (`open`, or `open_link`)."""
        self.report.stream_id = str(info.get("stream_id", "main"))
        self.report.link_kind = "tcp" if isinstance(self.sender, TcpSender) else "udp"
        # A bandwidth sample before the first key frame, so the policy sizes that one too.
        self._probe = self.sender.probe()

    def _reference(self) -> Reference | None:
        return held_reference(self._sent_refs, self.sender.acked)

    async def video(self, frame: VideoFrame) -> None:
        decision = self.tracker.update(frame)
        if decision.key:
            await self._candidate(make_key_frame(frame, decision))

    async def _candidate(self, key: KeyFrame) -> None:
        """Send a key frame of the change detector's, unless the gate finds no text changed
        since the last one sent and the cloud holds (or will hold) that one."""
        if self.gate is not None:
            gate = self.gate
            if self._gate_seq is not None and not self._gate_held:
                if self.sender.acked(self._gate_seq):
                    self._gate_held = True
                elif self.sender.lost(self._gate_seq):
                    gate.reset()  # past its deadline: the cloud shows an older picture
            verdict = await self._work(gate.changed, key.image)
            if not verdict.changed:
                self.report.skipped_key_frames += 1
                return
            gate.accept(key.image)
        self._gate_seq, self._gate_held = await self.key_frame(key), False

    async def key_frame(self, key: KeyFrame) -> int:
        """Code and send `key` (sized by the keep policy); returns its sequence number."""
        if self.refiner is not None:
            self._withdraw(self.refiner.stop())  # the new picture goes first
        with _tracer.start_as_current_span("edge.key_frame", attributes={"t_media": key.t_media}):
            regions = await self._work(self.detector.regions, key.image)
            boxes = [box for box, _quad in regions]
            if self._probe is not None:  # size the first key frame from a measured link
                await self.sender.wait_acked(self._probe, 1.0)
                self._probe = None
            reference = self._reference()
            coded: dict[tuple[float, Step], PatchMessage] = {}

            def encode(keep: float, step: Step) -> PatchMessage:
                if (keep, step) not in coded:  # the split's check codes the finest once
                    factor, levels = step
                    coded[keep, step] = encode_patches(
                        key, boxes, keep, self.config, reference, factor, levels
                    )
                return coded[keep, step]

            link = self.sender.estimate()
            if self.reader is not None and isinstance(self.policy, DeadlineKeepPolicy):
                full = await self._work(encode, 1.0, FINEST)
                budget = self.policy.budget_bytes(link)
                if budget is not None and len(full.payload) > budget:
                    decision = self.split.decide(
                        link,
                        budget,
                        len(full.payload),
                        rec_width_px(boxes),
                        len(boxes),
                        time.perf_counter(),
                    )
                    self.report.split_decisions.append(
                        {"t": round(key.t_media, 3), **decision.as_dict()}
                    )
                    if decision.edge_read:
                        quads = [quad for _box, quad in regions]
                        return await self._edge_read(key, boxes, quads, decision)
            message = await self._work(self.policy.fit, link, encode)
            seq = self._send_patches(key, message)
        # What the cloud will rebuild, for later key frames to copy unchanged patches from.
        held = None if reference is None else {reference.index: reference.grey}
        rebuilt = await self._work(
            decode_patches,
            message.payload,
            message.shape,
            stream_id=key.stream_id,
            arrival_wall=0.0,
            references=held,
        )
        grey = rebuilt.image[..., 0]
        self._sent_refs.append((seq, Reference(key.index, grey)))
        if self.refiner is not None and not message.complete:
            self.refiner.start(key, boxes, seq, grey)
        self.report.key_frames += 1
        self.report.reused_patches += message.reused
        self.report.video_bytes += len(message.payload)
        self.report.keep_ratios.append(round(message.keep_ratio, 4))
        self.report.scales.append(round(message.scale, 4))
        self._last_keep, self._last_scale = min(1.0, message.keep_ratio), message.scale
        self._tick(key.t_media)
        self.report.sent.append((seq, "video", self.sender.send_wall[seq]))
        return seq

    async def _edge_read(
        self,
        key: KeyFrame,
        boxes: list[Any],
        quads: list[np.ndarray],
        decision: SplitDecision,
    ) -> int:
        """Read `key` here and send its lines (the cloud emits them as its `ocr` event);
        returns the message's sequence number. The cloud holds no pixels of this frame:
        later key frames copy patches only from older ones."""
        assert self.reader is not None
        reading = await self._work(self.reader, key.image, boxes, quads)
        self.split.observe_read(rec_width_px(boxes), reading.read_s)
        payload = encode_text_lines(
            key,
            reading.lines,
            read_ms=1000 * reading.read_s,
            det_side_px=self.config.det_max_side_px,
        )
        seq = self.sender.send(
            Packet(
                media_time_us=round(key.t_media * 1e6),
                modality=Modality.TEXT_LINES,
                traceparent=_traceparent(),
            ),
            payload,
        )
        log.debug("key frame %d read at the edge: %s", key.index, decision)
        self.report.key_frames += 1
        self.report.edge_read_frames += 1
        self.report.text_bytes += len(payload)
        self.report.edge_read_s = round(self.report.edge_read_s + reading.read_s, 3)
        self._tick(key.t_media)
        self.report.sent.append((seq, "text", self.sender.send_wall[seq]))
        return seq

    def _send_patches(self, key: KeyFrame, message: PatchMessage) -> int:
        rows, cols, _ = message.shape
        return self.sender.send(
            Packet(
                media_time_us=round(key.t_media * 1e6),
                modality=Modality.VIDEO_PATCHES,
                shape=message.shape,
                keep_ratio=min(1.0, message.keep_ratio),
                mask_bits=rows * cols,
                traceparent=_traceparent(),
            ),
            message.payload,
        )

    def _withdraw(self, seq: int | None) -> None:
        """Refinement part `seq` was withdrawn: the cloud will not hold it, later key frames
        must not copy from it."""
        if seq is None:
            return
        kept = [(s, ref) for s, ref in self._sent_refs if s != seq]
        self._sent_refs.clear()
        self._sent_refs.extend(kept)
        self.report.refine_parts_abandoned += 1

    def _send_part(self, key: KeyFrame, message: PatchMessage, rebuilt: np.ndarray) -> int:
        """Send one part of a refinement (`Refiner`); the cloud then holds `rebuilt`."""
        seq = self._send_patches(key, message)
        self._sent_refs.append((seq, Reference(key.index, rebuilt)))
        self.report.refine_parts += 1
        self.report.video_bytes += len(message.payload)
        self.report.sent.append((seq, "video", self.sender.send_wall[seq]))
        return seq

    def audio(self, window: AudioFrame) -> None:
        self.audio_end_s = max(self.audio_end_s, window.t_end)
        for chunk in self.speech.push(window):
            self._send_speech(chunk)
        self._tick(window.t_end)

    def link_payload(self, *, final: bool = False) -> LinkPayload:
        """The edge's view of the link now."""
        e, s = self.sender.estimate(), self.sender.stats
        return LinkPayload(
            role="edge",
            final=final,
            transport="tcp" if isinstance(self.sender, TcpSender) else "udp",
            deadline_s=self.config.deadline_s,
            rtt_ms=None if e.srtt_s is None else round(1000 * e.srtt_s, 2),
            rto_ms=round(1000 * e.rto_s, 2),
            loss=round(e.loss, 4),
            bandwidth_bps=None if e.bandwidth_bps is None else round(e.bandwidth_bps),
            queued_bytes=e.queued_bytes,
            keep_ratio=self._last_keep,
            scale=self._last_scale,
            messages=s.messages,
            retransmits=s.retransmits,
            expired=s.expired,
            abandoned=s.abandoned,
            datagrams=s.datagrams,
            bytes=s.bytes,
            malformed=s.malformed,
        )

    def report_link(self, *, final: bool = False) -> None:
        """Record the edge's `link` event and relay it to the cloud (in-band, best effort)."""
        payload = self.link_payload(final=final)
        t = round(self._media_t, 3)
        self.report.link_events.append(
            EventRecord(
                type=payload.type,
                stream_id=self.report.stream_id,
                t_start=t,
                t_end=t,
                latency_ms=0.0,
                payload=payload,
            ).to_json_dict()
        )
        body = json.dumps({"op": "link", **payload.fields()}).encode()
        self.sender.send(Packet(kind=Kind.CONTROL, modality=Modality.JSON), body)

    def _tick(self, t_media: float) -> None:
        self._media_t = max(self._media_t, t_media)
        if self._media_t >= self._next_report_t:
            self._next_report_t = self._media_t + self.config.link_report_s
            self.report_link()

    def _send_speech(self, chunk: SpeechChunk) -> None:
        payload = chunk.payload()
        seq = self.sender.send(
            Packet(
                media_time_us=round(chunk.t_media * 1e6),
                modality=Modality.AUDIO_OPUS,
                sample_rate=16_000,
                traceparent=_traceparent(),
            ),
            payload,
        )
        self.report.speech_messages += 1
        self.report.audio_bytes += len(payload)
        self.report.sent.append((seq, "audio", self.sender.send_wall[seq]))

    async def finish(self, timeout_s: float = 10.0) -> EdgeReport:
        for frame, decision in self.tracker.pending():
            await self._candidate(make_key_frame(frame, decision))
        for chunk in self.speech.flush():
            self._send_speech(chunk)
        if self.refiner is not None:
            # The last key frame's refinement, if any, before the end.
            await self.refiner.wait(self.refiner.max_parts * (self.config.deadline_s + 1.0))
            self.report.refined_key_frames = self.refiner.frames_refined
        self.report_link(final=True)
        # Everything, the last report too, delivered (or past its deadline) before the end:
        # the sender's socket closes after it and could not repair a loss any more.
        await self.sender.drain(self.config.deadline_s + 1.0)
        body = json.dumps({"op": "end", "audio_end_s": self.audio_end_s}).encode()
        await self.sender.send_reliable(
            Packet(kind=Kind.CONTROL, modality=Modality.JSON), body, timeout_s
        )
        r = self.report
        r.speech_s, r.audio_s = round(self.speech.speech_s, 3), round(self.speech.audio_s, 3)
        r.link = asdict(self.sender.estimate())
        r.sender = asdict(self.sender.stats)
        return r


async def run_edge(
    location: str,
    host: str,
    port: int,
    *,
    transport: TransportConfig | None = None,
    realtime: bool = False,
    video: bool = True,
    audio: bool = True,
    faults: FaultConfig | None = None,
    source_config: SourceConfig | None = None,
    stream_id: str | None = None,
) -> EdgeReport:
    """Send one input to the cloud listening at `host:port` (through a fault proxy on this
    machine when `faults` is given). Raises `SourceError` / `TransportError` on failure."""
    from pathlib import Path

    config = transport or TransportConfig()
    source = MediaSource(
        location,
        stream_id=stream_id or Path(location).stem,
        realtime=realtime,
        video=video,
        audio=audio,
        config=source_config,
    )
    await source.open()
    proxy: FaultProxy | None = None
    if faults is not None:
        proxy = FaultProxy((host, port), faults)
        host, port = await proxy.start()
    info = {
        "stream_id": source.stream_id,
        "video": source.has_video,
        "audio": source.has_audio,
        "duration_s": source.duration_s,
        "fps": source.fps,
        "size": source.video_size,
    }
    detector = TextBoxes(config.det_max_side_px)
    try:
        await asyncio.to_thread(detector.load)
        # UDP, or TCP to the same port when UDP goes unanswered (`TransportConfig.link`).
        sender, _ = await open_link(
            host, port, config, Packet(kind=Kind.CONTROL, modality=Modality.JSON), open_body(info)
        )
    except BaseException:
        await source.close()
        if proxy is not None:
            await proxy.close()
        raise
    edge = Edge(sender, config, detector=detector)
    try:
        await asyncio.to_thread(edge.load_reader)
        edge.opened(info)
        async for frame in source.frames():
            if isinstance(frame, VideoFrame):
                await edge.video(frame)
            elif isinstance(frame, AudioFrame):
                edge.audio(frame)
        report = await edge.finish()
        report.media_s = round(source.duration_s or edge.audio_end_s, 3)
        if proxy is not None:
            report.proxy = proxy.stats.as_dict()
        return report
    finally:
        if edge.refiner is not None:
            edge.refiner.stop()
        await sender.close()
        await source.close()
        if proxy is not None:
            await proxy.close()


__all__ = ["Edge", "EdgeReport", "held_reference", "run_edge"]
