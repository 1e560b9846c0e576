"""F12 spatio-temporal adapter and F13 alignment-gradient resolution step, for models that expose
features and gradients (a ViT-style encoder you train or fine-tune; not rapidocr, whose ONNX
models give neither).

`SpatioTemporalAdapter` adds, residually, a spatial branch (depthwise conv over the patch grid of
each frame) and a temporal branch (depthwise conv over frames, causal by default so a live
stream never waits for future frames), each through its own bottleneck projection. The up
projections start at zero, so an inserted adapter is the identity until trained.

`alignment_scale` maps the gap between the gradient norms of a vision-text alignment loss w.r.t.
the vision and the text embeddings to a resolution scale in [0.8, 1.5]:

    r = (|g_vision| - |g_text|) / (|g_vision| + |g_text|)          (in [-1, 1], unit-free)
    scale = 1 + gain * r * (max_scale - 1)   if r >= 0
            1 + gain * r * (1 - min_scale)   if r <  0,  then clipped to [min_scale, max_scale]

A vision gradient that dominates says the visual embedding is where the misalignment is, so look
closer; a small one says vision already aligns, so save pixels. `resolution_step` applies the
scale and rounds to a multiple of 32 px (ViT patch / detector stride). `article_resolution_step`
is the article's literal formula, kept for comparison (see docs/adaptive-vision.md for why it is
not the default).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from streamfuse.errors import ConfigError

ALIGN_PX = 32


class SpatioTemporalAdapter(nn.Module):
    """Residual adapter over tokens shaped (batch, frames, grid_h * grid_w, dim).

    spatial_ratio / temporal_ratio set the bottleneck widths (dim // ratio), as in the article's
    sketch; a wider temporal bottleneck than the default suits audio-rate or high-fps inputs.
    """

    def __init__(
        self,
        dim: int,
        grid_hw: tuple[int, int],
        spatial_ratio: int = 4,
        temporal_ratio: int = 8,
        spatial_kernel: int = 3,
        temporal_kernel: int = 3,
        causal: bool = True,
    ) -> None:
        super().__init__()
        if dim < spatial_ratio or dim < temporal_ratio:
            raise ConfigError(f"dim {dim} is smaller than a bottleneck ratio")
        if spatial_kernel % 2 == 0 or temporal_kernel < 1:
            raise ConfigError("spatial_kernel must be odd and temporal_kernel >= 1")
        self.grid_hw = grid_hw
        self.causal = causal
        self.temporal_kernel = temporal_kernel
        ds, dt = dim // spatial_ratio, dim // temporal_ratio
        self.spatial_down = nn.Linear(dim, ds)
        self.spatial_mix = nn.Conv2d(ds, ds, spatial_kernel, padding=spatial_kernel // 2, groups=ds)
        self.spatial_up = nn.Linear(ds, dim)
        self.temporal_down = nn.Linear(dim, dt)
        self.temporal_mix = nn.Conv1d(dt, dt, temporal_kernel, groups=dt)
        self.temporal_up = nn.Linear(dt, dim)
        for up in (self.spatial_up, self.temporal_up):
            nn.init.zeros_(up.weight)
            nn.init.zeros_(up.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ConfigError(f"expected (batch, frames, tokens, dim), got shape {tuple(x.shape)}")
        b, t, n, d = x.shape
        gh, gw = self.grid_hw
        if n != gh * gw:
            raise ConfigError(f"{n} tokens do not fill a {gh}x{gw} patch grid")

        # Spatial: per frame, mix neighbouring patches.
        s = self.spatial_down(x)  # (b, t, n, ds)
        ds = s.shape[-1]
        s = s.reshape(b * t, gh, gw, ds).permute(0, 3, 1, 2)
        s = self.spatial_mix(s).permute(0, 2, 3, 1).reshape(b, t, n, ds)
        s = self.spatial_up(F.gelu(s))

        # Temporal: per patch position, mix frames (left-padded when causal).
        u = self.temporal_down(x)  # (b, t, n, dt)
        dt = u.shape[-1]
        u = u.permute(0, 2, 3, 1).reshape(b * n, dt, t)
        k = self.temporal_kernel
        pad = (k - 1, 0) if self.causal else ((k - 1) // 2, k // 2)
        u = self.temporal_mix(F.pad(u, pad))
        u = u.reshape(b, n, dt, t).permute(0, 3, 1, 2)
        u = self.temporal_up(F.gelu(u))
        return x + s + u


# ----------------------------------------------------------------------------------------------
# F13: alignment-gradient resolution step


def alignment_loss(vision_emb: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
    """Mean (1 - cosine similarity) of paired embeddings (batch, dim): 0 when aligned."""
    return (1.0 - F.cosine_similarity(vision_emb, text_emb, dim=-1)).mean()


def alignment_grad_norms(
    loss: torch.Tensor, vision_emb: torch.Tensor, text_emb: torch.Tensor
) -> tuple[float, float]:
    """(|dL/d vision_emb|, |dL/d text_emb|), L2 norms; the graph is kept for the caller."""
    gv, gt = torch.autograd.grad(loss, [vision_emb, text_emb], retain_graph=True)
    return float(gv.norm()), float(gt.norm())


class AlignmentResolutionConfig(BaseModel):
    """Bounds and gain of the alignment-gradient resolution step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_scale: float = Field(0.8, gt=0.0, le=1.0, description="Smallest scale per step.")
    max_scale: float = Field(1.5, ge=1.0, le=4.0, description="Largest scale per step.")
    gain: float = Field(
        1.0,
        gt=0.0,
        le=10.0,
        description="Multiplies the normalized gradient gap; 1.0 maps a fully one-sided gap to "
        "exactly the bound, larger values saturate sooner.",
    )
    deadband: float = Field(
        0.05,
        ge=0.0,
        lt=1.0,
        description="Normalized gaps smaller than this give scale 1.0 (no change), so noise in "
        "the gradient estimate does not make the resolution wander.",
    )
    min_side_px: int = Field(64, ge=32, le=8192, description="Resolution floor, px.")
    max_side_px: int = Field(2048, ge=32, le=8192, description="Resolution ceiling, px.")

    @model_validator(mode="after")
    def _consistent(self) -> AlignmentResolutionConfig:
        if self.min_side_px > self.max_side_px:
            raise ValueError("min_side_px must be <= max_side_px")
        return self


def alignment_scale(
    vision_grad_norm: float,
    text_grad_norm: float,
    config: AlignmentResolutionConfig | None = None,
) -> float:
    """Scale in [min_scale, max_scale] from the normalized vision/text gradient-norm gap."""
    c = config or AlignmentResolutionConfig()
    for name, v in (("vision_grad_norm", vision_grad_norm), ("text_grad_norm", text_grad_norm)):
        if not (v >= 0.0 and math.isfinite(v)):
            raise ConfigError(f"{name} must be finite and >= 0, got {v}")
    total = vision_grad_norm + text_grad_norm
    if total <= 0.0:
        return 1.0
    r = (vision_grad_norm - text_grad_norm) / total
    if abs(r) < c.deadband:
        return 1.0
    r = max(-1.0, min(1.0, c.gain * r))
    scale = 1.0 + r * (c.max_scale - 1.0) if r >= 0 else 1.0 + r * (1.0 - c.min_scale)
    return min(c.max_scale, max(c.min_scale, scale))


def resolution_step(
    vision_grad_norm: float,
    text_grad_norm: float,
    current_side_px: int,
    config: AlignmentResolutionConfig | None = None,
) -> int:
    """Next input side in px: current x `alignment_scale`, rounded to the nearest multiple of 32
    and kept within [min_side_px, max_side_px] (themselves rounded to 32)."""
    c = config or AlignmentResolutionConfig()
    if current_side_px <= 0:
        raise ConfigError(f"current_side_px must be positive, got {current_side_px}")
    scale = alignment_scale(vision_grad_norm, text_grad_norm, c)
    lo = math.ceil(c.min_side_px / ALIGN_PX) * ALIGN_PX
    hi = max(lo, c.max_side_px // ALIGN_PX * ALIGN_PX)
    side = round(current_side_px * scale / ALIGN_PX) * ALIGN_PX
    return int(min(hi, max(lo, side)))


def article_resolution_step(vision_grad_norm: float, text_grad_norm: float, curr_res: int) -> int:
    """The article's formula, verbatim: scale = clip(1.2 / (1e-6 + |gv - gt|), 0.8, 1.5), result
    floored to 32 px. Not scale-invariant (gradient norms have arbitrary units) and it *raises*
    resolution when the gap is small, the opposite of its own prose; kept for comparison."""
    align_score = 1.0 / (1e-6 + abs(vision_grad_norm - text_grad_norm))
    scale = min(max(0.8, align_score * 1.2), 1.5)
    return int(round(curr_res * scale // 32 * 32))


__all__ = [
    "AlignmentResolutionConfig",
    "SpatioTemporalAdapter",
    "alignment_grad_norms",
    "alignment_loss",
    "alignment_scale",
    "article_resolution_step",
    "resolution_step",
]
