"""Typed messages that travel between stages.

Every frame carries `t_media` (seconds on the stream's media clock, where the content starts) and
`arrival_wall` (`now_wall()`, monotonic seconds, when the input it derives from was released by
the source).
Data frames may be dropped by an overload policy; `SystemFrame`s (end of stream, errors) never are.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamfuse.clock import now_wall
from streamfuse.events import ErrorPayload, EventType, GapPayload, Payload


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Frame:
    """Base of every message. `stream_id` names the input stream the frame belongs to."""

    stream_id: str = "main"
    t_media: float = 0.0
    arrival_wall: float = field(default_factory=now_wall)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class VideoFrame(Frame):
    """One decoded picture, RGB uint8 of shape (height, width, 3)."""

    image: np.ndarray
    index: int = 0
    fps: float = 30.0

    @property
    def t_end(self) -> float:
        return self.t_media + 1.0 / self.fps

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return int(self.image.shape[1]), int(self.image.shape[0])


#: The rate of every audio frame in a pipeline: sources resample to it, VAD and ASR require it.
AUDIO_SAMPLE_RATE_HZ = 16_000


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class AudioFrame(Frame):
    """A window of mono float32 samples in [-1, 1] (20 ms at 16 kHz by default)."""

    samples: np.ndarray
    sample_rate: int = AUDIO_SAMPLE_RATE_HZ
    index: int = 0

    @property
    def duration_s(self) -> float:
        return len(self.samples) / self.sample_rate

    @property
    def t_end(self) -> float:
        return self.t_media + self.duration_s


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TextFrame(Frame):
    """A text message or token chunk from a text input stream."""

    text: str
    t_end: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ContextFrame(Frame):
    """Text that extends a stream's running context (e.g. one line of the fused timeline),
    spanning `t_media`..`t_end`. `checkpoint`: the context changed enough since the previous
    checkpoint that a standing question deserves a fresh answer (`text` may then be empty).
    `window`: a stable key naming this piece of context across revisions (None: plain text to
    append); a frame with a known key and a higher `version` replaces that window's text in
    place (a slide read again better), so the LM recomputes its KV from there on.
    """

    text: str
    t_end: float
    checkpoint: bool = False
    window: str | None = None
    version: int = 0


def _envelope(frame: Frame, kind: str, t_end: float, emitted_wall: float | None) -> dict[str, Any]:
    emitted = now_wall() if emitted_wall is None else emitted_wall
    return {
        "type": str(kind),
        "stream_id": frame.stream_id,
        "t_start": round(frame.t_media, 3),
        "t_end": round(t_end, 3),
        "latency_ms": round(max(0.0, emitted - frame.arrival_wall) * 1000.0, 1),
    }


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EventFrame(Frame):
    """A result on the timeline: a typed `payload` (`streamfuse.events`) spanning
    `t_media`..`t_end`. `to_record` renders the JSON Lines contract: the envelope (`type`,
    `stream_id`, `t_start`, `t_end`, `latency_ms`) and the payload's fields.
    """

    payload: Payload
    t_end: float

    @property
    def type(self) -> str:
        return self.payload.type

    def to_record(self, emitted_wall: float | None = None) -> dict[str, Any]:
        record = _envelope(self, self.payload.type, self.t_end, emitted_wall)
        record.update(self.payload.fields())
        return record


_uids = itertools.count(1)


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SystemFrame(Frame):
    """Frames that overload policies never drop and stages pass through when not consumed.

    `uid` identifies the frame across paths: where two paths of the graph join, the consumer
    is given it once.
    """

    uid: int = field(default_factory=lambda: next(_uids))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class EndOfStream(SystemFrame):
    """The producer has no more frames; consumers flush and forward it."""

    reason: str = "end"


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class ErrorFrame(SystemFrame):
    """A failure that did not stop the stream; sinks render it as an `error` event."""

    stage: str
    message: str
    fatal: bool = False

    @property
    def payload(self) -> ErrorPayload:
        return ErrorPayload(stage=self.stage, message=self.message, fatal=self.fatal)

    def to_record(self, emitted_wall: float | None = None) -> dict[str, Any]:
        record = _envelope(self, EventType.ERROR, self.t_media, emitted_wall)
        record.update(self.payload.fields())
        return record


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class GapFrame(SystemFrame):
    """Media time `t_media`..`t_end` an input did not deliver (a live feed dropped and was
    reconnected). A system frame, so it passes every stage, is never dropped, and reaches the
    sinks as a `gap` event placed between the frames before and after it.
    """

    t_end: float
    reason: str
    attempts: int = 0

    @property
    def payload(self) -> GapPayload:
        return GapPayload(reason=self.reason, attempts=self.attempts)

    def to_record(self, emitted_wall: float | None = None) -> dict[str, Any]:
        record = _envelope(self, EventType.GAP, self.t_end, emitted_wall)
        record.update(self.payload.fields())
        return record
