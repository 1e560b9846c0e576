"""How inputs are opened and kept alive: FFmpeg input options, stall detection, reconnection
with backoff, and how far one stream may be buffered waiting for another.

One `SourceConfig` is `StreamfuseConfig.source`; every `MediaSource` of a job gets it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SourceConfig(BaseModel):
    """Options for opening and reading media inputs (files, URLs, devices)."""

    model_config = ConfigDict(extra="forbid")

    input_options: dict[str, str] = Field(
        default_factory=dict,
        description="FFmpeg options for opening the input (`--input-option key=value`), e.g. "
        "`rtsp_transport=tcp`, `buffer_size=4194304`, `reconnect=1`. The key `format` picks the "
        "demuxer or device (`format=alsa`), as FFmpeg's `-f`.",
    )
    open_timeout_s: float = Field(
        10.0, gt=0.0, le=600.0, description="Give up opening an input after this long."
    )
    stall_timeout_s: float = Field(
        5.0,
        gt=0.0,
        le=600.0,
        description="A URL or device that delivers no data for this long has stalled and is "
        "reconnected (UDP and RTP have no end of stream: a feed that stops is a stall).",
    )
    reconnect_attempts: int = Field(
        5,
        ge=0,
        le=1000,
        description="Reconnection attempts after a URL or device drops or stalls, before the "
        "input fails with an error (0: fail at once). Local files are never reconnected.",
    )
    reconnect_backoff_s: float = Field(
        0.5, ge=0.0, le=60.0, description="Wait before the first attempt; doubles per attempt."
    )
    reconnect_backoff_max_s: float = Field(
        8.0, ge=0.0, le=600.0, description="Longest wait between two attempts."
    )
    interleave_buffer_s: float = Field(
        60.0,
        ge=0.0,
        le=3600.0,
        description="How far (media seconds) packets of one stream may be held while waiting "
        "for another stream stored later in the file (a non-seekable file or URL whose audio "
        "and video are far apart). Past it, frames go out late and one warning is logged.",
    )
    interleave_buffer_mb: float = Field(
        64.0,
        gt=0.0,
        le=4096.0,
        description="Memory bound of that buffer (compressed packets), MiB.",
    )

    @model_validator(mode="after")
    def _check_backoff(self) -> SourceConfig:
        if self.reconnect_backoff_max_s < self.reconnect_backoff_s:
            raise ValueError(
                f"reconnect_backoff_max_s ({self.reconnect_backoff_max_s}) must be >= "
                f"reconnect_backoff_s ({self.reconnect_backoff_s})"
            )
        return self

    def backoff_s(self, attempt: int) -> float:
        """Wait before reconnection attempt `attempt` (1-based)."""
        return min(self.reconnect_backoff_max_s, self.reconnect_backoff_s * 2 ** (attempt - 1))


__all__ = ["SourceConfig"]
