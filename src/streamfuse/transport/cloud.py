"""The cloud end of the split: `CloudSource` turns the edge's messages back into the frames a
local run's OCR and ASR stages see (key frames rebuilt from patch tokens; speech decoded onto
the media clock with silence between), so `build_pipeline` runs them unchanged and the sinks get
the same events, plus `link` records: the link's statistics as the cloud counts them and
as the edge measures them (relayed in-band), every few seconds of media and at the end.

`serve_cloud(host, port, ...)` listens, waits for one edge's stream, runs it to its end.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Literal

import numpy as np
from opentelemetry import trace
from opentelemetry.propagate import extract
from pydantic import ValidationError

from streamfuse.clock import now_wall
from streamfuse.errors import SourceError
from streamfuse.events import EventRecord, LinkPayload
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ, AudioFrame, ErrorFrame, Frame
from streamfuse.sinks.base import EventSink
from streamfuse.sources.media import MediaSource
from streamfuse.transport.config import TransportConfig
from streamfuse.transport.patches import REFERENCES_HELD, decode_patches
from streamfuse.transport.speech import SpeechDecoder
from streamfuse.transport.tcp import DualReceiver, TcpReceiver
from streamfuse.transport.textlines import decode_text_lines
from streamfuse.transport.udp import Message, UdpReceiver
from streamfuse.transport.wire import Kind, Modality, WireError

log = logging.getLogger(__name__)
_tracer = trace.get_tracer("streamfuse.transport")


class CloudSource(MediaSource):
    """Frames rebuilt from one edge stream. Key frames (not 30 fps video) come out, so the
    pipeline sends them straight to OCR (`selects_key_frames`)."""

    selects_key_frames: ClassVar[bool] = True

    def __init__(
        self,
        receiver: UdpReceiver | TcpReceiver | DualReceiver,
        *,
        idle_timeout_s: float = 30.0,
        video: bool = True,
        audio: bool = True,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        report_every_s: float = 5.0,
    ) -> None:
        host, port = receiver.address
        super().__init__(f"udp://{host}:{port}", video=video, audio=audio)
        self.name = "cloud"
        self.receiver = receiver
        self.idle_timeout_s = idle_timeout_s
        self.live = True
        self.undecodable = 0
        self.video_messages = 0
        self.audio_messages = 0
        #: TEXT_LINES messages: key frames the edge read itself (`transport.textlines`).
        self.text_messages = 0
        self._messages = receiver.messages()
        self._early: list[Message] = []
        self._speech = SpeechDecoder()
        self._audio_t = 0.0  # media time of the next audio window
        self._audio_buf = np.zeros(0, dtype=np.float32)
        self._n_windows = 0
        self._refs: dict[int, np.ndarray] = {}  # key frame index -> rebuilt grey
        #: Where `link` records go as they are made (the cloud's, and the edge's as relayed).
        self.on_record = on_record
        self.report_every_s = report_every_s
        self._link_t = 0.0  # latest media time a message carried
        self._next_report_t = report_every_s

    async def open(self) -> None:
        """Wait for the edge's `open` message (raises `SourceError` after `idle_timeout_s`)."""
        while True:
            m = await self._next(f"no edge connected within {self.idle_timeout_s} s")
            if m is None:
                raise SourceError("the link closed before an edge opened a stream")
            info = self._control(m)
            if info is None:
                self._early.append(m)  # data before the open (cannot happen: open is acked)
                continue
            if info.get("op") != "open":
                continue
            self.stream_id = str(info.get("stream_id") or "main")
            self.has_video = bool(info.get("video")) and self.want_video
            self.has_audio = bool(info.get("audio")) and self.want_audio
            self.duration_s = info.get("duration_s")
            self.fps = info.get("fps")
            size = info.get("size")
            self.video_size = (int(size[0]), int(size[1])) if size else None
            return

    async def _next(self, timeout_message: str) -> Message | None:
        try:
            return await asyncio.wait_for(anext(self._messages), self.idle_timeout_s)
        except StopAsyncIteration:
            return None
        except TimeoutError as e:
            raise SourceError(timeout_message) from e

    @staticmethod
    def _control(m: Message) -> dict[str, Any] | None:
        if m.header.kind is not Kind.CONTROL:
            return None
        try:
            info = json.loads(m.payload)
        except ValueError:
            return {}
        return info if isinstance(info, dict) else {}

    async def frames(self) -> AsyncIterator[Frame]:
        pending = self._early
        self._early = []
        while True:
            if pending:
                m: Message | None = pending.pop(0)
            else:
                try:
                    m = await self._next("")
                except SourceError:
                    yield ErrorFrame(
                        stream_id=self.stream_id,
                        stage="transport",
                        message=f"edge silent for {self.idle_timeout_s} s: stream ended",
                    )
                    break
            if m is None:
                break
            self._link_t = max(self._link_t, m.header.media_time_us / 1e6)
            if self._link_t >= self._next_report_t:
                self._next_report_t = self._link_t + self.report_every_s
                self._emit(self.link_record())
            info = self._control(m)
            if info is not None:
                if info.get("op") == "link":
                    self._relay_edge_link(info)
                    continue
                if info.get("op") == "end":
                    # Silence up to where the edge's audio ended, as a local run's ASR hears.
                    end_s = float(info.get("audio_end_s") or 0.0)
                    cursor = self._audio_t + len(self._audio_buf) / AUDIO_SAMPLE_RATE_HZ
                    if self.has_audio and end_s > cursor:
                        gap = round((end_s - cursor) * AUDIO_SAMPLE_RATE_HZ)
                        silence = np.zeros(gap, dtype=np.float32)
                        self._audio_buf = np.concatenate([self._audio_buf, silence])
                    break
                continue
            try:
                with _tracer.start_as_current_span(
                    "cloud.message",
                    context=extract({"traceparent": m.header.traceparent}),
                    attributes={"sequence": m.header.sequence, "bytes": len(m.payload)},
                ):
                    for frame in self._frames_of(m):
                        yield frame
            except WireError as e:
                self.undecodable += 1
                yield ErrorFrame(
                    stream_id=self.stream_id,
                    t_media=m.header.media_time_us / 1e6,
                    stage="transport",
                    message=f"message {m.header.sequence} dropped: {e}",
                )
        for frame in self._audio_until(final=True):
            yield frame

    def _frames_of(self, m: Message) -> list[Frame]:
        if m.header.modality is Modality.VIDEO_PATCHES and self.has_video:
            self.video_messages += 1
            key = decode_patches(
                m.payload,
                m.header.shape,
                stream_id=self.stream_id,
                arrival_wall=m.complete_wall,
                references=self._refs,
            )
            # Later key frames may copy unchanged patches from this one (the edge refers only
            # to the last REFERENCES_HELD it sent).
            self._refs[key.index] = key.image[..., 0]
            while len(self._refs) > REFERENCES_HELD:
                del self._refs[next(iter(self._refs))]
            return [key]
        if m.header.modality is Modality.TEXT_LINES and self.has_video:
            # Lines the edge read itself (it could not send the pixels in time): the OCR stage
            # emits them as its `ocr` event, `read_by` edge. Malformed: `WireError`, counted.
            self.text_messages += 1
            return [
                decode_text_lines(m.payload, stream_id=self.stream_id, arrival_wall=m.complete_wall)
            ]
        if m.header.modality is Modality.AUDIO_OPUS and self.has_audio:
            self.audio_messages += 1
            t, samples = self._speech.decode(m.payload)
            start = round(t * AUDIO_SAMPLE_RATE_HZ)
            cursor = round(self._audio_t * AUDIO_SAMPLE_RATE_HZ) + len(self._audio_buf)
            if start < cursor:  # overlaps what was already placed (a pre-roll): trim
                samples = samples[cursor - start :]
                start = cursor
            silence = np.zeros(start - cursor, dtype=np.float32)
            self._audio_buf = np.concatenate([self._audio_buf, silence, samples])
            return list(self._audio_until(final=False, arrival=m.complete_wall))
        return []

    def _audio_until(self, *, final: bool, arrival: float | None = None) -> list[AudioFrame]:
        """The complete 20 ms windows buffered (`final`: and the last partial one)."""
        out: list[AudioFrame] = []
        n = self.window_samples
        arrival_wall = now_wall() if arrival is None else arrival
        while len(self._audio_buf) >= n or (final and len(self._audio_buf)):
            chunk = self._audio_buf[:n]
            if len(chunk) < n:
                chunk = np.concatenate([chunk, np.zeros(n - len(chunk), dtype=np.float32)])
            self._audio_buf = self._audio_buf[n:]
            out.append(
                AudioFrame(
                    stream_id=self.stream_id,
                    t_media=self._audio_t,
                    arrival_wall=arrival_wall,
                    samples=chunk,
                    index=self._n_windows,
                )
            )
            self._n_windows += 1
            self._audio_t += n / AUDIO_SAMPLE_RATE_HZ
        return out

    async def close(self) -> None:
        await self.receiver.close()

    def _transport_kind(self) -> Literal["udp", "tcp"]:
        r = self.receiver
        tcp = isinstance(r, TcpReceiver) or (isinstance(r, DualReceiver) and r.link == "tcp")
        return "tcp" if tcp else "udp"

    def _emit(self, record: dict[str, Any]) -> None:
        if self.on_record is not None:
            self.on_record(record)

    def _relay_edge_link(self, info: dict[str, Any]) -> None:
        """The edge's view of the link, sent in-band: one `link` record with role edge."""
        fields = {k: v for k, v in info.items() if k != "op"}
        try:
            payload = LinkPayload.model_validate({**fields, "role": "edge"})
        except ValidationError:
            self.undecodable += 1
            return
        self._emit(self._record(payload))

    def _record(self, payload: LinkPayload) -> dict[str, Any]:
        t = round(self._link_t, 3)
        record = EventRecord(
            type=payload.type,
            stream_id=self.stream_id,
            t_start=t,
            t_end=t,
            latency_ms=0.0,
            payload=payload,
        )
        return record.to_json_dict()

    def link_record(self, *, final: bool = False) -> dict[str, Any]:
        """The cloud's view of the link now (`final`: at the end, over the whole stream)."""
        s = self.receiver.stats
        payload = LinkPayload(
            role="cloud",
            final=final,
            transport=self._transport_kind(),
            undecodable=self.undecodable,
            video_messages=self.video_messages,
            audio_messages=self.audio_messages,
            deadline_s=self.receiver.config.deadline_s,
            **s.as_dict(),
        )
        if final:
            self._link_t = max(self._link_t, self.duration_s or self._audio_t)
        return self._record(payload)


async def serve_cloud(
    host: str,
    port: int,
    config: Any,
    sinks: list[EventSink],
    *,
    transport: TransportConfig | None = None,
    idle_timeout_s: float = 30.0,
    on_listen: Callable[[tuple[str, int]], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one edge stream through the pipeline (`config`: a `StreamfuseConfig`); every record
    goes to `sinks`. Returns (the final stats record, the link record)."""
    from streamfuse.app import build_pipeline, run_job

    # UDP and TCP on the same port: the edge falls back to TCP where UDP is blocked.
    receiver = await DualReceiver.listen(host, port, transport or TransportConfig())
    if on_listen is not None:
        on_listen(receiver.address)

    def emit(record: dict[str, Any]) -> None:
        for sink in sinks:
            sink.emit(record)

    source = CloudSource(
        receiver,
        idle_timeout_s=idle_timeout_s,
        video=config.ocr,
        audio=config.asr,
        on_record=emit,
        report_every_s=receiver.config.link_report_s,
    )
    try:
        job = await build_pipeline([source], config, sinks)
        await run_job(job, sinks)
    finally:
        await source.close()
    link = source.link_record(final=True)
    summary = job.summary()
    emit(link)
    return summary, link


__all__ = ["CloudSource", "LinkPayload", "serve_cloud"]
