"""One exception tree for streamfuse.

Every error the library raises on purpose derives from `StreamfuseError`; bad input names the
value and what was expected. In the streaming path, failures become `ErrorFrame`s instead.
"""

from __future__ import annotations


class StreamfuseError(Exception):
    """Base of every error streamfuse raises on purpose."""


class ConfigError(StreamfuseError):
    """A configuration value is out of range or inconsistent."""


class SourceError(StreamfuseError):
    """An input cannot be opened or read (missing path, not media, unreachable URL)."""


class MediaDecodeError(SourceError):
    """A media stream broke part-way (truncated or corrupt data)."""


class ModelError(StreamfuseError):
    """A model cannot be found, assembled or loaded."""


class StageError(StreamfuseError):
    """A stage failed on one frame; carried downstream as an error event."""


class PipelineError(StreamfuseError):
    """The pipeline graph is inconsistent (no consumer for a frame type, a cycle, ...)."""


class CapacityError(StreamfuseError):
    """A request can never fit the configured resources (e.g. KV-cache slot size)."""


class SinkError(StreamfuseError):
    """Events cannot be written or read back (unwritable path, full disk, damaged file)."""


class EvalError(StreamfuseError):
    """Ground truth or an events file is malformed."""
