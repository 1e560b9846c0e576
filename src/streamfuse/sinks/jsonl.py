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

    def _open(self) -> IO[str]:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("w", encoding="utf-8")
        return self._fh

    async def setup(self) -> None:
        self._open()

    def write(self, record: dict[str, Any]) -> None:
        fh = self._open()
        fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    async def teardown(self) -> None:
        # Kept open: the job appends its final `stats` record after the pipeline ends.
        if self._fh is not None:
            self._fh.flush()
