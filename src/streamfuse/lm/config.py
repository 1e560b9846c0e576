"""Validated configuration of the language-model runtime (one pydantic object per concern).

`LMConfig` is the top-level object handed to `LMEngine`; every field is typed, bounded and
documented. Defaults: a pool of 16 slots x 2048 tokens and 4 attention-sink tokens
(StreamingLLM), sized for the bundled Gemma 3 270M on a small CPU (docs/lm.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

WeightFormat = Literal["int8", "fp32"]
LongInputPolicy = Literal["sink_window", "heavy_hitter", "reject"]
RemovedWindows = Literal["move", "recompute"]
DropMethod = Literal["ours", "fastv", "random", "recency", "sinks"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelConfig(_Frozen):
    """Which weights to run and how."""

    source: str = Field(
        default="gemma3-270m",
        description="'gemma3-270m' (the bundled GGUF), a path to a .gguf file, or a local "
        "Hugging Face directory of a Gemma 3 text model (config.json + safetensors).",
    )
    weights: WeightFormat = Field(
        default="int8",
        description="'int8': per-row int8 weights with per-row int8 activations (exact integer "
        "matmul, batch-invariant); 'fp32': dequantized float32 (reference, ~4x more bytes).",
    )
    threads: int = Field(
        default=2,
        ge=1,
        le=256,
        description="torch intra-op threads of the engine's forwards on its background thread "
        "(`LMEngine.start`); loading sets nothing process-wide.",
    )
    smooth_alpha: float = Field(
        default=0.7,
        ge=0.0,
        le=1.0,
        description="int8 only: SmoothQuant migration strength (lm/smoothing.py): each linear's "
        "input channel j is divided by max|X_j|^alpha / max|W_j|^(1-alpha) and its weight column "
        "multiplied by it (the float function is unchanged; activation outliers shrink before "
        "per-row int8 rounding). Calibrated once at conversion on generic text. 0: off.",
    )


class PoolConfig(_Frozen):
    """The KV-cache slot pool (F7): fixed slots preallocated at start."""

    num_slots: int = Field(default=16, ge=1, le=1024, description="Sequences held at once.")
    max_tokens: int = Field(default=2048, ge=16, le=131072, description="Tokens per slot.")


class TruncationConfig(_Frozen):
    """What to do when a slot is full (F9).

    'sink_window' keeps the first `sink_tokens` and the most recent `window_tokens` of the slot
    (StreamingLLM) and re-rotates the kept keys so positions stay inside the slot;
    'heavy_hitter' (H2O) keeps as many, but `heavy_fraction` of the window is the positions that
    received the most attention so far (accumulated during every forward) instead of the oldest
    of the recent ones; 'reject' refuses any request that would not fit the slot.
    """

    policy: LongInputPolicy = "sink_window"
    sink_tokens: int = Field(default=4, ge=0, le=1024)
    window_tokens: int | None = Field(
        default=None,
        ge=8,
        description="Recent tokens kept after a truncation; default 3/4 of the slot so that "
        "truncation (a memmove of the window) happens once per slot/4 tokens, not every token.",
    )
    heavy_fraction: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="'heavy_hitter': share of the kept window chosen by accumulated attention.",
    )
    removed_windows: RemovedWindows = Field(
        default="move",
        description="A session request whose versioned windows leave out cached ones (the LM "
        "stage dropping its oldest when they outgrow the slot): 'move' the KV of the windows "
        "after the gap into it (keys re-rotated, as sink + window truncation does; they keep "
        "what they attended to in the removed text), or 'recompute' everything after the "
        "first removed window (exact for the shorter context, but a prefill of up to a slot).",
    )


class DroppingConfig(_Frozen):
    """Hierarchical token dropping during prefill (F18), for requests that ask for it
    (`Request.keep_ratio`): rows leave after `layers` (-1: before the first) at drop rates
    decaying from `rate_first` to `rate_last`, scaled so the last point keeps the ratio."""

    method: DropMethod = "ours"
    layers: tuple[int, ...] = Field(
        default=(-1, 1), min_length=1, description="Drop points, ascending (-1: input)."
    )
    rate_first: float = Field(default=0.4, gt=0.0, lt=1.0)
    rate_last: float = Field(default=0.1, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _ascending(self) -> DroppingConfig:
        if list(self.layers) != sorted(set(self.layers)) or self.layers[0] < -1:
            raise ValueError(f"layers must be ascending, distinct and >= -1, got {self.layers}")
        return self


class SchedulerConfig(_Frozen):
    """Continuous batching: what one engine step may contain."""

    max_batch_tokens: int = Field(
        default=256, ge=1, le=65536, description="Rows in one forward (decode + prefill chunks)."
    )
    prefill_chunk: int = Field(
        default=128, ge=1, le=65536, description="Largest prompt chunk one sequence adds per step."
    )
    max_running: int = Field(default=16, ge=1, le=1024, description="Sequences decoding at once.")
    reschedule: bool = Field(
        default=True,
        description=(
            "F19: while the KV-cache hit rate over the last `hit_rate_window` admitted requests "
            "is below `reschedule_below_hit_rate` (prefills are heavy), prompt chunks of lower "
            "priority wait for a higher-priority prefill (a question) to finish."
        ),
    )
    hit_rate_window: int = Field(default=100, ge=1, le=100_000, description="Requests counted.")
    reschedule_below_hit_rate: float = Field(default=0.85, ge=0.0, le=1.0)


class SpeculativeConfig(_Frozen):
    """Prompt-lookup (n-gram) drafting, verified in the same forward as normal decode (F6)."""

    enabled: bool = True
    max_draft: int = Field(default=8, ge=1, le=64, description="Draft tokens per step.")
    max_ngram: int = Field(default=3, ge=1, le=16, description="Longest suffix n-gram matched.")
    min_ngram: int = Field(default=1, ge=1, le=16)
    lookup_tokens: int = Field(
        default=4096, ge=16, description="How far back in the sequence the drafter searches."
    )

    @model_validator(mode="after")
    def _ngram_order(self) -> SpeculativeConfig:
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram={self.min_ngram} exceeds max_ngram={self.max_ngram}")
        return self


class LMConfig(_Frozen):
    """Top-level configuration of the language-model runtime."""

    model: ModelConfig = ModelConfig()
    pool: PoolConfig = PoolConfig()
    truncation: TruncationConfig = TruncationConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    speculative: SpeculativeConfig = SpeculativeConfig()
    dropping: DroppingConfig = DroppingConfig()

    @model_validator(mode="after")
    def _fits(self) -> LMConfig:
        room = self.pool.max_tokens - self.truncation.sink_tokens
        if self.truncation.policy in ("sink_window", "heavy_hitter"):
            win = self.window_tokens
            if win < 8 or win > room - 1:
                raise ValueError(
                    f"window_tokens={win} must be in [8, {room - 1}] for max_tokens="
                    f"{self.pool.max_tokens} and sink_tokens={self.truncation.sink_tokens}"
                )
        return self

    @property
    def window_tokens(self) -> int:
        """Recent tokens kept by a sink+window truncation."""
        if self.truncation.window_tokens is not None:
            return self.truncation.window_tokens
        return max(8, (self.pool.max_tokens * 3) // 4 - self.truncation.sink_tokens)
