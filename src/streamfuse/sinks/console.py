"""A live terminal view of the timeline: progress, on-screen text, transcript, stage latency.

`ConsoleView` observes the pipeline (`Pipeline.observe`) and keeps the latest state per stream
from the events as they are created; `render` builds a rich renderable from it and the
pipeline's live stage figures. The CLI refreshes it a few times a
second; in a non-interactive terminal only the final state is printed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from streamfuse.events import (
    AsrPartialPayload,
    AsrPayload,
    AsrRevisionPayload,
    LmPayload,
    OcrPayload,
)
from streamfuse.frames import ErrorFrame, EventFrame, Frame
from streamfuse.pipeline import FrameEmitted, Observer, Pipeline


@dataclass
class _StreamState:
    screen: list[str] = field(default_factory=list)
    screen_t: float = 0.0
    transcript: deque[str] = field(default_factory=lambda: deque(maxlen=6))
    partial: str = ""
    answer: str = ""
    counts: dict[str, int] = field(default_factory=dict)


class ConsoleView(Observer):
    """The terminal view's state, fed by observing the pipeline's events (see module doc)."""

    def __init__(self, durations: dict[str, float | None] | None = None) -> None:
        self.durations = durations or {}
        self.streams: dict[str, _StreamState] = {}
        self.errors: deque[str] = deque(maxlen=4)

    def on_frame(self, event: FrameEmitted) -> None:
        if isinstance(event.frame, EventFrame | ErrorFrame):
            self.show(event.frame)

    def show(self, frame: Frame) -> None:
        """Take one event (or error) into the view."""
        if isinstance(frame, ErrorFrame):
            self.errors.append(f"{frame.stage}: {frame.message}")
            return
        if not isinstance(frame, EventFrame):
            return
        st = self.streams.setdefault(frame.stream_id, _StreamState())
        st.counts[frame.type] = st.counts.get(frame.type, 0) + 1
        p = frame.payload
        if isinstance(p, OcrPayload):
            st.screen = [ln.text for ln in p.lines]
            st.screen_t = frame.t_media
        elif isinstance(p, AsrPayload):
            st.transcript.append(f"[{frame.t_media:6.1f}s] {p.text}")
            st.partial = ""
        elif isinstance(p, AsrRevisionPayload):
            st.transcript.append(
                f"[{frame.t_media:6.1f}s] corrected: {p.replaced_text} -> {p.text}"
            )
        elif isinstance(p, AsrPartialPayload):
            st.partial = p.text
        elif isinstance(p, LmPayload):
            st.answer = p.text

    def render(self, pipeline: Pipeline) -> RenderableType:
        parts: list[RenderableType] = []
        ids = sorted(set(self.streams) | set(pipeline.media_time) | set(self.durations))
        for sid in ids:
            st = self.streams.get(sid, _StreamState())
            t = pipeline.media_time.get(sid, 0.0)
            dur = self.durations.get(sid)
            head = Table.grid(padding=(0, 1))
            head.add_row(
                Text(sid, style="bold"),
                ProgressBar(total=dur or None, completed=t, width=40),
                Text(f"{t:6.1f}s" + (f" / {dur:.1f}s" if dur else "")),
                Text("  ".join(f"{k}:{v}" for k, v in sorted(st.counts.items())), style="dim"),
            )
            screen = Text("\n".join(st.screen) or "(no text yet)")
            speech = Text("\n".join(st.transcript))
            if st.partial:
                speech.append(
                    ("\n" if st.transcript else "") + st.partial + " ...", style="italic dim"
                )
            body = Table.grid(expand=True, padding=(0, 2))
            body.add_column(ratio=1)
            body.add_column(ratio=1)
            body.add_row(
                Panel(screen, title=f"on screen @ {st.screen_t:.1f}s", border_style="cyan"),
                Panel(speech or Text("(no speech yet)"), title="transcript", border_style="green"),
            )
            parts.extend([head, body])
            if st.answer:
                parts.append(Panel(Text(st.answer), title="language model", border_style="magenta"))
        stages = Table(title="stages", title_justify="left", expand=False)
        for col in ("stage", "frames", "queue", "dropped", "errors", "p50 ms", "p95 ms"):
            stages.add_column(col, justify="right" if col != "stage" else "left")
        for name, s in pipeline.snapshot().items():
            stages.add_row(
                name,
                str(s["frames"]),
                str(s["queue_depth"]),
                str(s["dropped"]),
                str(s["errors"]),
                f"{s['latency_ms']['p50']:.0f}",
                f"{s['latency_ms']['p95']:.0f}",
            )
        parts.append(stages)
        if self.errors:
            parts.append(Text("\n".join(self.errors), style="red"))
        return Group(*parts)
