"""The timeline stage: where slide text and speech meet, in media order, as one text context.

Input: `ocr` events (a slide read: `OcrPayload`), `asr` events (committed speech:
`AsrPayload`), `text` events (chat or captions from a text stream: `TextPayload`, labelled by
their kind, `CHAT alice: ...`) and `TextFrame` prompts, which pass through in order. Each new
slide, stretch of speech or message becomes one `ContextFrame` line (`[12.0s] SLIDE: ...`),
the stream's first one led by the header; a slide read again unchanged adds nothing. Each line
names a context window (`slide:3`, `speech:4`): a later reading of the current slide that keeps
most of its words (a half-drawn slide settled, a bullet built up, a better read) revises that
slide's window (same key and timestamp, version + 1) instead of adding a line; an
`asr_revision` (speech corrected at an utterance end) revises the speech windows holding the
words it replaces the same way. A line
is a checkpoint (worth a fresh answer to a standing question) when it is a new slide, or when
`checkpoint_every_s` of media passed since the last checkpoint (and something was added since).
This is the only module that knows the OCR, ASR and text event kinds; the LM answer stage
(lm/stage.py) sees context text and prompts only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field
from rapidfuzz import fuzz

from streamfuse.events import (
    AsrPayload,
    AsrRevisionPayload,
    AsrWord,
    OcrPayload,
    TextPayload,
    join_speech,
)
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
    checkpoint_on_slide: bool = Field(
        default=True, description="A new or revised slide is a checkpoint."
    )
    slide_revision_similarity: float | None = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        description="A reading whose words overlap the current slide's at least this much "
        "(rapidfuzz token_set_ratio / 100) revises that slide's window (None: never).",
    )


@dataclass
class _Stream:
    started: bool = False
    last_slide: str = ""
    lines: int = 0  # windows named so far (keys are unique per stream)
    first_key: str | None = None  # the window the header leads
    slide_key: str | None = None  # the current slide's window
    slide_version: int = 0
    slide_t: float = 0.0
    last_checkpoint_t: float | None = None
    new_since_checkpoint: bool = False
    #: The latest speech windows, key -> (line time, version, words): what a revision edits.
    speech: OrderedDict[str, tuple[float, int, list[AsrWord]]] = field(default_factory=OrderedDict)


#: Speech windows a stream remembers for revisions (they correct the utterance just ended).
_SPEECH_WINDOWS_KEPT = 16


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
        if isinstance(payload, AsrRevisionPayload):
            for out in self._revise(frame, payload):
                yield out
            return
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
        key: str | None = None
        version = 0
        if text and not (is_slide and text == st.last_slide):
            t_line = frame.t_media
            if is_slide and self._same_slide(text, st):
                assert st.slide_key is not None
                st.slide_version += 1
                key, version, t_line = st.slide_key, st.slide_version, st.slide_t
            else:
                st.lines += 1
                kind = "slide" if is_slide else "speech" if label == cfg.speech_label else "text"
                key = f"{kind}:{st.lines}"
                if is_slide:
                    st.slide_key, st.slide_version, st.slide_t = key, 0, frame.t_media
            if is_slide:
                st.last_slide = text
            elif isinstance(payload, AsrPayload):
                st.speech[key] = (t_line, 0, list(payload.words))
                while len(st.speech) > _SPEECH_WINDOWS_KEPT:
                    st.speech.popitem(last=False)
            if not st.started:
                st.started = True
                st.first_key = key
            line = self._line(st, key, t_line, label, text)
            st.new_since_checkpoint = True
        checkpoint = self._due(frame.t_media, st, slide=line is not None and is_slide)
        if line is not None or checkpoint:
            yield self._context(
                frame, line or "", t_end=frame.t_end, checkpoint=checkpoint, window=key,
                version=version,
            )  # fmt: skip

    def _line(self, st: _Stream, key: str, t_line: float, label: str, text: str) -> str:
        line = f"[{t_line:.1f}s] {label}: {text}\n"
        if key == st.first_key:
            # One window, so the LM feeds the opening in one piece (one prefill, as before).
            line = self.config.header + line
        return line

    def _revise(self, frame: EventFrame, revision: AsrRevisionPayload) -> list[ContextFrame]:
        """Corrected speech: each remembered window holding a replaced word gets its new text
        (same key and time, version + 1); the new words go to the window of the first replaced
        word, or, when nothing was replaced, to the last window starting before them."""
        st = self._streams.get(frame.stream_id)
        if st is None or not st.speech:
            return []
        gone = {w.identity for w in revision.replaced}
        hit = [k for k, (_, _, ws) in st.speech.items() if any(w.identity in gone for w in ws)]
        if not hit and revision.words:
            t = revision.words[0].t_start
            hit = [k for k, (_, _, ws) in st.speech.items() if ws and ws[0].t_start <= t][-1:]
        out = []
        for i, key in enumerate(hit):
            t_line, version, words = st.speech[key]
            kept = [w for w in words if w.identity not in gone]
            if i == 0:
                kept = sorted([*kept, *revision.words], key=lambda w: w.t_start)
            st.speech[key] = (t_line, version + 1, kept)
            text = collapse_whitespace(join_speech(kept))
            line = self._line(st, key, t_line, self.config.speech_label, text)
            out.append(
                self._context(frame, line, t_end=frame.t_end, window=key, version=version + 1)
            )
        if out:
            st.new_since_checkpoint = True
        return out

    def _same_slide(self, text: str, st: _Stream) -> bool:
        """Is `text` a later reading of the current slide rather than a new slide?"""
        similarity = self.config.slide_revision_similarity
        if similarity is None or st.slide_key is None:
            return False
        return fuzz.token_set_ratio(text, st.last_slide) >= 100.0 * similarity

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
        cause: EventFrame,
        text: str,
        *,
        t_end: float,
        checkpoint: bool = False,
        window: str | None = None,
        version: int = 0,
    ) -> ContextFrame:
        return ContextFrame(
            stream_id=cause.stream_id,
            t_media=cause.t_media,
            arrival_wall=cause.arrival_wall,
            text=text,
            t_end=t_end,
            checkpoint=checkpoint,
            window=window,
            version=version,
        )
