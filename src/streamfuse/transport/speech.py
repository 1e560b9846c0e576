"""Speech-only audio across the link: the edge gates 20 ms windows with Silero VAD and sends
only speech (plus `speech_pad_s` either side) as Opus; the cloud decodes it back onto the media
clock and fills the rest with silence, so its ASR sees the same timeline as a local run.

`SpeechEncoder.push(window)` returns the `SpeechChunk`s completed (one message each, about
`speech_chunk_s` of audio); `SpeechDecoder.decode(payload)` returns (media time, samples). Each
speech segment has its own Opus encoder and decoder, so a lost message costs only its own audio.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np

from streamfuse.audio.vad import SileroVad, SpeechGate
from streamfuse.frames import AUDIO_SAMPLE_RATE_HZ, AudioFrame
from streamfuse.transport.wire import WireError

#: Samples per Opus packet (20 ms at 16 kHz).
OPUS_FRAME = 320
#: libopus's encoder delay (pre-skip: 312 samples at 48 kHz) in 16 kHz samples; checked
#: against the codec by tests/unit/test_transport_media.py.
OPUS_DELAY = 104
_HEAD = struct.Struct("!IIqH")  # segment id, index of its first packet, segment start (us), n


@dataclass
class SpeechChunk:
    """One message of speech: Opus packets `first_packet..` of segment `segment`."""

    segment: int
    segment_start_s: float
    first_packet: int
    packets: list[bytes]
    #: Media time of the first sample this chunk's audio covers.
    t_media: float
    #: Edge wall time of the newest window in the chunk (latency is measured from it).
    arrival_wall: float = 0.0

    def payload(self) -> bytes:
        head = _HEAD.pack(
            self.segment,
            self.first_packet,
            round(self.segment_start_s * 1e6),
            len(self.packets),
        )
        return head + b"".join(struct.pack("!H", len(p)) + p for p in self.packets)


def _new_encoder(bitrate_bps: int) -> Any:
    enc = av.CodecContext.create("libopus", "w")
    enc.sample_rate = AUDIO_SAMPLE_RATE_HZ
    enc.layout = "mono"
    enc.format = "s16"
    enc.bit_rate = bitrate_bps
    enc.open()
    return enc


@dataclass
class _Segment:
    number: int
    start_s: float
    encoder: Any
    fed: int = 0  # samples given to the encoder
    out: int = 0  # packets produced
    pending: list[bytes] = field(default_factory=list)
    pending_first: int = 0


class SpeechEncoder:
    """Edge side: VAD-gated Opus encoding of one stream's 20 ms windows."""

    def __init__(
        self,
        *,
        bitrate_bps: int = 16_000,
        chunk_s: float = 0.6,
        pad_s: float = 0.3,
        start_threshold: float = 0.5,
        end_threshold: float = 0.35,
        min_silence_s: float = 0.4,
        vad: SileroVad | None = None,
    ) -> None:
        self.bitrate_bps = bitrate_bps
        self.chunk_packets = max(1, round(chunk_s * AUDIO_SAMPLE_RATE_HZ / OPUS_FRAME))
        self.pad_s = pad_s
        self.vad = vad or SileroVad()
        self.gate = SpeechGate(start_threshold, end_threshold, min_silence_s)
        self._history: deque[AudioFrame] = deque()
        self._segment: _Segment | None = None
        self._segments = 0
        self._until_s = -1.0  # media time up to which the current segment keeps audio
        self._buf = np.zeros(0, dtype=np.int16)
        self.speech_s = 0.0
        self.audio_s = 0.0

    def push(self, window: AudioFrame) -> list[SpeechChunk]:
        out: list[SpeechChunk] = []
        self.audio_s += window.duration_s
        for chunk in self.vad.push(window.samples):
            change = self.gate.update(chunk)
            if self.gate.in_speech:
                self._until_s = max(self._until_s, chunk.t_end + self.pad_s)
            elif change is not None:  # speech just ended: keep its tail pad
                self._until_s = max(self._until_s, change.t + self.pad_s)
        speaking = self.gate.in_speech or window.t_media < self._until_s
        if speaking and self._segment is None:
            # Start with the pre-roll: the windows of the last `pad_s` before speech began.
            history = [w for w in self._history if w.t_end > window.t_media - self.pad_s]
            first = history[0] if history else window
            self._segments += 1
            self._segment = _Segment(self._segments, first.t_media, _new_encoder(self.bitrate_bps))
            for w in history:
                self._feed(w, out)
        if self._segment is not None:
            if speaking:
                self._feed(window, out)
            else:
                self._finish(window.arrival_wall, out)
        self._history.append(window)
        while len(self._history) > 1 and self._history[0].t_media < window.t_media - self.pad_s:
            self._history.popleft()
        return out

    def flush(self, arrival_wall: float = 0.0) -> list[SpeechChunk]:
        out: list[SpeechChunk] = []
        if self._segment is not None:
            self._finish(arrival_wall, out)
        return out

    def _feed(self, window: AudioFrame, out: list[SpeechChunk]) -> None:
        seg = self._segment
        assert seg is not None
        pcm = np.clip(np.asarray(window.samples) * 32767.0, -32768, 32767).astype(np.int16)
        self._buf = np.concatenate([self._buf, pcm])
        self.speech_s += window.duration_s
        while len(self._buf) >= OPUS_FRAME:
            self._encode(seg, self._buf[:OPUS_FRAME])
            self._buf = self._buf[OPUS_FRAME:]
        if len(seg.pending) >= self.chunk_packets:
            out.append(self._chunk(seg, window.arrival_wall))

    def _encode(self, seg: _Segment, pcm: np.ndarray | None) -> None:
        frame = None
        if pcm is not None:
            frame = av.AudioFrame.from_ndarray(pcm[None, :], format="s16", layout="mono")
            frame.sample_rate = AUDIO_SAMPLE_RATE_HZ
            frame.pts = seg.fed
            seg.fed += len(pcm)
        for packet in seg.encoder.encode(frame):
            seg.pending.append(bytes(packet))
            seg.out += 1

    def _chunk(self, seg: _Segment, arrival_wall: float) -> SpeechChunk:
        first = seg.pending_first
        t = seg.start_s + (first * OPUS_FRAME - OPUS_DELAY) / AUDIO_SAMPLE_RATE_HZ
        chunk = SpeechChunk(seg.number, seg.start_s, first, seg.pending, max(0.0, t), arrival_wall)
        seg.pending_first += len(seg.pending)
        seg.pending = []
        return chunk

    def _finish(self, arrival_wall: float, out: list[SpeechChunk]) -> None:
        seg = self._segment
        assert seg is not None
        if len(self._buf):
            pad = np.zeros(OPUS_FRAME - len(self._buf), dtype=np.int16)
            self._encode(seg, np.concatenate([self._buf, pad]))
            self._buf = np.zeros(0, dtype=np.int16)
        self._encode(seg, None)  # drain the encoder's lookahead
        if seg.pending:
            out.append(self._chunk(seg, arrival_wall))
        self._segment = None


class SpeechDecoder:
    """Cloud side: Opus packets back to 16 kHz float32 samples on the media clock."""

    def __init__(self) -> None:
        self._decoders: dict[int, _Decoding] = {}

    def decode(self, payload: bytes) -> tuple[float, np.ndarray]:
        """(media time of the first sample, samples) of one speech message."""
        try:
            segment, first, start_us, n = _HEAD.unpack_from(payload)
            packets, offset = [], _HEAD.size
            for _ in range(n):
                (size,) = struct.unpack_from("!H", payload, offset)
                offset += 2
                if offset + size > len(payload):
                    raise WireError("speech message: packet runs past the payload")
                packets.append(payload[offset : offset + size])
                offset += size
        except struct.error as e:
            raise WireError(f"malformed speech message: {e}") from e
        if segment not in self._decoders:
            # Segments arrive in order; older decoders are done with.
            self._decoders = {s: d for s, d in self._decoders.items() if s > segment - 4}
            self._decoders[segment] = _Decoding(
                av.CodecContext.create("libopus", "r"),
                av.AudioResampler(format="flt", layout="mono", rate=AUDIO_SAMPLE_RATE_HZ),
            )
        d = self._decoders[segment]
        if first != d.next_packet:
            # A message of this segment was lost: restart the sample count at this packet.
            d.position = first * OPUS_FRAME
        d.next_packet = first + n
        pieces: list[np.ndarray] = []
        try:
            for data in packets:
                for frame in d.decoder.decode(av.Packet(data)):
                    for r in d.resampler.resample(frame):
                        pieces.append(r.to_ndarray().reshape(-1))
        except av.error.FFmpegError as e:
            raise WireError(f"speech message does not decode as Opus: {e}") from e
        samples = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
        # The resampler holds back a few samples for the next call: the samples out continue
        # where the previous message's ended, not at this message's first packet.
        t = start_us / 1e6 + (d.position - OPUS_DELAY) / AUDIO_SAMPLE_RATE_HZ
        d.position += len(samples)
        return t, samples.astype(np.float32)


@dataclass
class _Decoding:
    decoder: Any
    resampler: Any
    next_packet: int = 0
    position: int = 0  # samples of the segment decoded so far


__all__ = ["OPUS_DELAY", "OPUS_FRAME", "SpeechChunk", "SpeechDecoder", "SpeechEncoder"]
