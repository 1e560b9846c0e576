"""The timeline stage: where slide text and speech meet, in media order, as one text context.

Input: `ocr` events (a slide read: `OcrPayload`), `asr` events (committed speech:
`AsrPayload`), `text` events (chat or captions from a text stream: `TextPayload`, labelled by
their kind, `CHAT alice: ...`) and `TextFrame` prompts, which pass through in order. Each new
slide, stretch of speech or message becomes one `ContextFrame` line (`[12.0s] SLIDE: ...`),
the stream's first one led by the header; a slide read again unchanged adds nothing. A line
is a checkpoint (worth a fresh answer to a standing question) when it is a new slide, or when
`checkpoint_every_s` of media passed since the last checkpoint (and something was added since).
This is the only module that knows the OCR, ASR and text event kinds; the LM answer stage
(lm/stage.py) sees context text and prompts only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.events import AsrPayload, OcrPayload, TextPayload
from streamfuse.frames import ContextFrame, EventFrame, Frame, TextFrame
from streamfuse.pipeline.stage import Stage
from streamfuse.text import collapse_whitespace


class TimelineConfig(BaseModel):
    """How OCR and speech events become context lines and checkpoints."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    header: str = Field(
        default="Live notes. Timeline of slide text (SLIDE) and speech (SPEECH):\n",
        description="Text that opens every stream's context (the attention-sink tokens).",
    )
    slide_label: str = Field(default="SLIDE", min_length=1)
    speech_label: str = Field(default="SPEECH", min_length=1)
    checkpoint_every_s: float = Field(
        default=30.0, gt=0.0, le=3600.0, description="Media seconds between checkpoints."
    )
    checkpoint_on_slide: bool = Field(default=True, description="A new slide is a checkpoint.")


@dataclass
class _Stream:
    started: bool = False
    last_slide: str = ""
    last_checkpoint_t: float | None = None
    new_since_checkpoint: bool = False


class TimelineStage(Stage):
    """OCR + ASR events -> per-stream timeline `ContextFrame`s (prompts pass through)."""

    input_types = (EventFrame, TextFrame)

    def __init__(self, config: TimelineConfig | None = None, *, name: str | None = None) -> None:
        super().__init__(name or "timeline")
        self.config = config or TimelineConfig()
        self._streams: dict[str, _Stream] = {}

    async def process(self, frame: Frame) -> AsyncIterator[Frame]:
        if isinstance(frame, TextFrame):
            yield frame
            return
        assert isinstance(frame, EventFrame)
        payload = frame.payload
        cfg = self.config
        if isinstance(payload, OcrPayload):
            label = cfg.slide_label
        elif isinstance(payload, AsrPayload):
            label = cfg.speech_label
        elif isinstance(payload, TextPayload):
            label = payload.kind.upper() + (f" {payload.author}" if payload.author else "")
        else:
            return  # not part of the timeline (partial hypotheses, answers, ...)
        is_slide = isinstance(payload, OcrPayload)
        st = self._streams.setdefault(frame.stream_id, _Stream())
        text = collapse_whitespace(payload.text)
        line: str | None = None
        if text and not (is_slide and text == st.last_slide):
            if is_slide:
                st.last_slide = text
            line = f"[{frame.t_media:.1f}s] {label}: {text}\n"
            if not st.started:
                # One frame, so the LM feeds the opening in one piece (one prefill, as before).
                st.started = True
                line = cfg.header + line
            st.new_since_checkpoint = True
        checkpoint = self._due(frame.t_media, st, slide=line is not None and is_slide)
        if line is not None or checkpoint:
            yield self._context(frame, line or "", t_end=frame.t_end, checkpoint=checkpoint)

    def _due(self, t_media: float, st: _Stream, *, slide: bool) -> bool:
        """A checkpoint now? Only when something was added since the previous one."""
        cfg = self.config
        if not st.new_since_checkpoint:
            return False
        due = (
            (slide and cfg.checkpoint_on_slide)
            or st.last_checkpoint_t is None
            or t_media - st.last_checkpoint_t >= cfg.checkpoint_every_s
        )
        if due:
            st.last_checkpoint_t = t_media
            st.new_since_checkpoint = False
        return due

    @staticmethod
    def _context(
        cause: EventFrame, text: str, *, t_end: float, checkpoint: bool = False
    ) -> ContextFrame:
        return ContextFrame(
            stream_id=cause.stream_id,
            t_media=cause.t_media,
            arrival_wall=cause.arrival_wall,
            text=text,
            t_end=t_end,
            checkpoint=checkpoint,
        )
