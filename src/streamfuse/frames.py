"""Typed messages that travel between stages.

Every frame carries `t_media` (seconds on the stream's media clock, where the content starts) and
`arrival_wall` (`time.monotonic()` when the input it derives from was released by the source).
Data frames may be dropped by an overload policy; `SystemFrame`s (end of stream, errors) never are.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def now_wall() -> float:
    """The wall clock all `arrival_wall` values use (monotonic seconds)."""
    return time.monotonic()


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


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class AudioFrame(Frame):
    """A window of mono float32 samples in [-1, 1] (20 ms at 16 kHz by default)."""

    samples: np.ndarray
    sample_rate: int = 16_000
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
class EventFrame(Frame):
    """A result on the timeline (`ocr`, `asr`, `asr_partial`, `lm`, `stats`, ...).

    `data` holds the type-specific fields; `to_record` renders the JSON Lines contract:
    `type`, `t_start`, `t_end`, `latency_ms` and the data fields.
    """

    type: str
    t_end: float
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_record(self, emitted_wall: float | None = None) -> dict[str, Any]:
        emitted = now_wall() if emitted_wall is None else emitted_wall
        record: dict[str, Any] = {
            "type": self.type,
            "stream_id": self.stream_id,
            "t_start": round(self.t_media, 3),
            "t_end": round(self.t_end, 3),
            "latency_ms": round(max(0.0, emitted - self.arrival_wall) * 1000.0, 1),
        }
        record.update(self.data)
        return record


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class SystemFrame(Frame):
    """Frames that overload policies never drop and stages pass through when not consumed."""


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

    def to_record(self, emitted_wall: float | None = None) -> dict[str, Any]:
        emitted = now_wall() if emitted_wall is None else emitted_wall
        return {
            "type": "error",
            "stream_id": self.stream_id,
            "t_start": round(self.t_media, 3),
            "t_end": round(self.t_media, 3),
            "latency_ms": round(max(0.0, emitted - self.arrival_wall) * 1000.0, 1),
            "stage": self.stage,
            "message": self.message,
            "fatal": self.fatal,
        }
