"""Comparing runs by what they committed: a stream's words and slide texts from its records, a
reference run of the main job in this process, and a sink that tells when speech arrived."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from streamfuse.sinks import CollectSink

if TYPE_CHECKING:
    from streamfuse.app import StreamfuseConfig

_NOT_WORD = re.compile(r"[^\w']")


def committed_words(records: Sequence[dict[str, Any]], stream_id: str) -> list[str]:
    """The stream's committed words in order, without case or punctuation (so two runs that
    cut the same speech into other events compare equal)."""
    words = [
        _NOT_WORD.sub("", w["word"].lower())
        for r in records
        if r["type"] == "asr" and r["stream_id"] == stream_id
        for w in r["words"]
    ]
    return [w for w in words if w]


def slide_texts(records: Sequence[dict[str, Any]], stream_id: str) -> list[str]:
    """The text of every `ocr` event of the stream, in order."""
    return [r["text"] for r in records if r["type"] == "ocr" and r["stream_id"] == stream_id]


def run_local(inputs: Sequence[str], config: StreamfuseConfig) -> list[dict[str, Any]]:
    """The records of one run of the main job in this process (no final `stats`)."""
    from streamfuse.app import build_pipeline, run_job

    async def main() -> list[dict[str, Any]]:
        sink = CollectSink()
        job = await build_pipeline(list(inputs), config, [sink])
        await run_job(job, [sink])
        return sink.records

    return asyncio.run(main())


class SpeechWatch(CollectSink):
    """Collects records; `first_speech` is set when the first committed speech arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.first_speech = asyncio.Event()

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)
        if record["type"] == "asr":
            self.first_speech.set()


__all__ = ["SpeechWatch", "committed_words", "run_local", "slide_texts"]
