"""Settings of `streamfuse serve`: where it listens, who may call it, and its limits."""

from __future__ import annotations

import secrets

from pydantic import BaseModel, ConfigDict, Field

from streamfuse.app import StreamfuseConfig
from streamfuse.scale.ray import RayConfig


class ServeConfig(BaseModel):
    """One validated configuration of the service (the CLI's `serve` options map onto it)."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(
        "127.0.0.1", description="Address to listen on (0.0.0.0 opens it to the network)."
    )
    port: int = Field(8765, ge=0, le=65_535, description="0: any free port.")
    token: str = Field(
        default_factory=lambda: secrets.token_urlsafe(18),
        min_length=8,
        description="Bearer token every route but /health requires (header, `?token=` or the "
        "cookie the dashboard sets). Default: a random one, printed at start.",
    )
    metrics_public: bool = Field(False, description="Serve /metrics without the token.")
    max_sessions: int = Field(8, ge=1, le=256, description="Sessions running at once.")
    max_message_bytes: int = Field(
        4 << 20, ge=1024, description="Largest WebSocket message or request body accepted."
    )
    session_queue: int = Field(
        1024,
        ge=16,
        description="Events a results subscriber may fall behind before it is disconnected; "
        "also text messages waiting to enter a session.",
    )
    ingest_buffer_bytes: int = Field(
        32 << 20, ge=1 << 20, description="Media bytes a live session may hold undecoded."
    )
    idle_timeout_s: float = Field(
        30.0,
        gt=0.0,
        description="A live session whose inputs send nothing for this long is ended (its "
        "results are kept).",
    )
    stats_interval_s: float = Field(
        1.0, gt=0.0, description="Seconds between a session's live `stats` records."
    )
    keep_finished: int = Field(
        32, ge=0, description="Finished sessions kept (with their results) for inspection."
    )
    allow_files: bool = Field(
        True,
        description="Sessions may read local files (`input` a path); off on a shared host.",
    )
    ray: RayConfig | None = Field(
        None,
        description="Run URL and file sessions on this Ray cluster (`serve --ray ADDRESS`): "
        "each session's branch is placed on a node (models loaded once per node), restarted "
        "on another node if its node dies, its events sent to the session's subscribers. "
        "Live sessions (media pushed to this server) and sessions that ask the language model "
        "stay in this process. None: every session runs here.",
    )
    job: StreamfuseConfig = Field(
        default_factory=lambda: StreamfuseConfig(realtime=True),
        description="Defaults of every session's job (a session request may change `realtime`, "
        "`ocr`, `asr` and ask a question).",
    )
