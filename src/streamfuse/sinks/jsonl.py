"""JSON Lines output: one event per line, written whole and flushed as produced.

Each record goes to the file in one `write` of the whole line, so a run that is killed leaves
complete lines; a write that fails part-way (a full disk) is cut back to the last whole line
and the sink reports a `SinkError` naming the path instead of writing on. `read_jsonl` reads
such a file back tolerating a torn last line (`streamfuse run --resume` appends after it).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamfuse.errors import SinkError
from streamfuse.sinks.base import EventSink


def _describe(e: OSError) -> str:
    if isinstance(e, FileExistsError | NotADirectoryError):
        return f"{e.filename or 'a parent folder'} is not a folder"
    return e.strerror or str(e)


class JsonlSink(EventSink):
    """Writes records to `path` (replaced; `append=True`: added after what is there, which
    must end with a whole line). `admit(record)` decides what of a record is written (None:
    nothing; a resumed run re-producing events already in the file: `ResumePoint.admit`)."""

    def __init__(
        self,
        path: str | Path,
        name: str | None = None,
        *,
        append: bool = False,
        admit: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> None:
        super().__init__(name)
        self.path = Path(path)
        self.append = append
        self.admit = admit
        self.written = 0
        self.skipped = 0
        #: The write failure that stopped this sink (None while it works).
        self.failure: SinkError | None = None
        #: Called once with the failure (e.g. to stop the run: nothing more can be kept).
        self.on_failure: Callable[[SinkError], None] | None = None
        self._fd: int | None = None

    def open(self) -> None:
        """Open the file now (raising `SinkError` naming the path if it cannot be)."""
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if self.append else os.O_TRUNC)
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            raise SinkError(f"cannot write events to {self.path}: {_describe(e)}") from e

    async def setup(self) -> None:
        self.open()

    def write(self, record: dict[str, Any]) -> None:
        if self.failure is not None:
            return
        if self.admit is not None:
            admitted = self.admit(record)
            if admitted is None:
                self.skipped += 1
                return
            record = admitted
        self.open()
        assert self._fd is not None
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            start = os.lseek(self._fd, 0, os.SEEK_END)
        except OSError:
            start = None  # not a regular file (a pipe, /dev/full): nothing to cut back
        done = 0
        try:
            while done < len(data):
                done += os.write(self._fd, data[done:])
        except OSError as e:
            if done and start is not None:
                # No torn line (the reader's contract); if even that fails, the failure
                # below is still what the user needs to see.
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, start)
            self._fail(SinkError(f"cannot write events to {self.path}: {_describe(e)}"))
            return
        self.written += 1

    def _fail(self, failure: SinkError) -> None:
        self.failure = failure
        if self.on_failure is not None:
            self.on_failure(failure)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):  # a device or pipe: nothing to sync
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    async def teardown(self) -> None:
        # Kept open: the job appends its final `stats` record after the pipeline ends.
        pass


@dataclass
class JsonlLog:
    """An events file read back: its records and where its last whole line ends."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    #: Bytes up to the end of the last whole record line.
    whole_bytes: int = 0
    #: Bytes after it: a line a killed run was writing (0 for a file written by this sink).
    torn_bytes: int = 0

    def cut_torn_tail(self) -> None:
        """Drop the torn last line from the file, so appending starts on a line of its own."""
        if self.torn_bytes:
            try:
                os.truncate(self.path, self.whole_bytes)
            except OSError as e:
                raise SinkError(f"cannot repair {self.path}: {_describe(e)}") from e
            self.torn_bytes = 0


def read_jsonl(path: str | Path) -> JsonlLog:
    """Read an events file; a last line without its newline or not valid JSON is torn
    (counted, not returned). Any other bad line is a `SinkError` naming it."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise SinkError(f"cannot read events file {p}: {_describe(e)}") from e
    log = JsonlLog(p)
    pos = 0
    line_no = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        line_no += 1
        last = end < 0 or end == len(data) - 1
        chunk = data[pos:] if end < 0 else data[pos:end]
        try:
            record = json.loads(chunk) if chunk.strip() else None
        except ValueError:
            if last:
                break
            raise SinkError(f"{p}:{line_no}: not a JSON record") from None
        if end < 0:
            break  # no newline: the writer was stopped inside this line
        if record is not None:
            if not isinstance(record, dict) or not isinstance(record.get("type"), str):
                raise SinkError(f"{p}:{line_no}: expected an event object with a 'type'")
            log.records.append(record)
        pos = end + 1
        log.whole_bytes = pos
    log.torn_bytes = len(data) - log.whole_bytes
    return log
