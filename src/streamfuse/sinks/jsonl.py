"""JSON Lines output: one event per line, flushed as produced, so a crash loses nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from streamfuse.sinks.base import EventSink


class JsonlSink(EventSink):
    def __init__(self, path: str | Path, name: str | None = None) -> None:
        super().__init__(name)
        self.path = Path(path)
        self._fh: IO[str] | None = None

    async def setup(self) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("w", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            raise RuntimeError("JsonlSink.write before setup")
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()

    async def teardown(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
