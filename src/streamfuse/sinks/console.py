"""A live terminal view of the timeline: progress, on-screen text, transcript, stage latency.

`ConsoleView` is an event sink that keeps the latest state per stream; `render` builds a rich
renderable from it and the pipeline's live stage figures. The CLI refreshes it a few times a
second; in a non-interactive terminal only the final state is printed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from streamfuse.pipeline import Pipeline
from streamfuse.sinks.base import EventSink


@dataclass
class _StreamState:
    screen: list[str] = field(default_factory=list)
    screen_t: float = 0.0
    transcript: deque[str] = field(default_factory=lambda: deque(maxlen=6))
    partial: str = ""
    answer: str = ""
    counts: dict[str, int] = field(default_factory=dict)


class ConsoleView(EventSink):
    def __init__(self, durations: dict[str, float | None] | None = None) -> None:
        super().__init__("console")
        self.durations = durations or {}
        self.streams: dict[str, _StreamState] = {}
        self.errors: deque[str] = deque(maxlen=4)

    def write(self, record: dict[str, Any]) -> None:
        st = self.streams.setdefault(record.get("stream_id", "main"), _StreamState())
        kind = record["type"]
        st.counts[kind] = st.counts.get(kind, 0) + 1
        if kind == "ocr":
            st.screen = [ln["text"] for ln in record.get("lines", [])]
            st.screen_t = record["t_start"]
        elif kind == "asr":
            st.transcript.append(f"[{record['t_start']:6.1f}s] {record.get('text', '')}")
            st.partial = ""
        elif kind == "asr_partial":
            st.partial = record.get("text", "")
        elif kind == "lm":
            st.answer = record.get("text", "")
        elif kind == "error":
            self.errors.append(f"{record.get('stage')}: {record.get('message')}")

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
            if name == self.name:
                continue
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
