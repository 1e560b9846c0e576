"""F12 adapter and F13 alignment-gradient resolution step on a tiny torch model."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from streamfuse.errors import ConfigError
from tools.st_adapter import (
    AlignmentResolutionConfig,
    SpatioTemporalAdapter,
    alignment_grad_norms,
    alignment_loss,
    alignment_scale,
    article_resolution_step,
    resolution_step,
)

pytestmark = pytest.mark.unit


class TinyVideoTextModel(nn.Module):
    """Patchify 32x32 frames into a 4x4 grid of 16-d tokens, adapt, pool; embed text tokens."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, stride=8)
        self.adapter = SpatioTemporalAdapter(dim, (4, 4), spatial_ratio=4, temporal_ratio=4)
        self.text = nn.EmbeddingBag(50, dim)

    def forward(self, video: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t = video.shape[:2]
        x = self.patch(video.flatten(0, 1))  # (b*t, dim, 4, 4)
        x = x.flatten(2).transpose(1, 2).reshape(b, t, 16, -1)
        x = self.adapter(x)
        return x.mean(dim=(1, 2)), self.text(tokens)


def test_adapter_keeps_shape_and_is_identity_at_init() -> None:
    torch.manual_seed(0)
    ad = SpatioTemporalAdapter(32, (3, 5))
    x = torch.randn(2, 4, 15, 32)
    y = ad(x)
    assert y.shape == x.shape
    assert torch.equal(y, x)
    with pytest.raises(ConfigError):
        ad(torch.randn(2, 4, 16, 32))


def test_gradients_reach_every_adapter_parameter() -> None:
    torch.manual_seed(0)
    model = TinyVideoTextModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    video, tokens = torch.randn(2, 3, 3, 32, 32), torch.randint(0, 50, (2, 5))
    # First step: only the zero-initialized up projections get gradient (as in LoRA-style
    # adapters); after it, the whole adapter learns.
    for _ in range(2):
        opt.zero_grad()
        v, t = model(video, tokens)
        alignment_loss(v, t).backward()
        opt.step()
    for name, p in model.adapter.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_causal_temporal_branch_never_looks_ahead() -> None:
    torch.manual_seed(0)
    ad = SpatioTemporalAdapter(16, (2, 2), temporal_ratio=2, temporal_kernel=3)
    for m in (ad.spatial_up, ad.temporal_up):
        nn.init.normal_(m.weight)
    x = torch.randn(1, 6, 4, 16)
    y = ad(x)
    x2 = x.clone()
    x2[:, 4:] += 5.0  # change the future
    y2 = ad(x2)
    assert torch.allclose(y[:, :4], y2[:, :4])
    assert not torch.allclose(y[:, 4:], y2[:, 4:])


def test_scale_stays_in_bounds_and_follows_the_gap_direction() -> None:
    assert alignment_scale(1.0, 1.0) == 1.0
    assert alignment_scale(0.0, 0.0) == 1.0
    assert alignment_scale(5.0, 0.0) == pytest.approx(1.5)
    assert alignment_scale(0.0, 5.0) == pytest.approx(0.8)
    ups = [alignment_scale(v, 1.0) for v in (1.2, 2.0, 4.0, 100.0)]
    downs = [alignment_scale(1.0, t) for t in (1.2, 2.0, 4.0, 100.0)]
    assert all(1.0 < s <= 1.5 for s in ups) and ups == sorted(ups)
    assert all(0.8 <= s < 1.0 for s in downs) and downs == sorted(downs, reverse=True)
    # Unit-free: scaling both norms does not change the decision.
    assert alignment_scale(3e-4, 1e-4) == pytest.approx(alignment_scale(3.0, 1.0))
    # Deadband: a 2 % gap is noise.
    assert alignment_scale(1.02, 1.0) == 1.0
    with pytest.raises(ConfigError):
        alignment_scale(float("nan"), 1.0)
    for v in (0.0, 0.3, 1.0, 7.0):
        for t in (0.0, 0.3, 1.0, 7.0):
            assert 0.8 <= alignment_scale(v, t) <= 1.5


def test_resolution_step_rounds_to_32_and_respects_limits() -> None:
    cfg = AlignmentResolutionConfig(min_side_px=224, max_side_px=1024)
    sides = [resolution_step(v, t, 512, cfg) for v in (0.1, 1.0, 3.0) for t in (0.1, 1.0, 3.0)]
    assert all(s % 32 == 0 and 224 <= s <= 1024 for s in sides)
    assert resolution_step(1.0, 1.0, 512, cfg) == 512
    assert resolution_step(9.0, 0.0, 512, cfg) == 768  # 512 x 1.5
    assert resolution_step(0.0, 9.0, 512, cfg) == 416  # 512 x 0.8 = 409.6 -> 416
    assert resolution_step(9.0, 0.0, 1000, cfg) == 1024  # ceiling
    assert resolution_step(0.0, 9.0, 240, cfg) == 224  # floor
    with pytest.raises(ValidationError):
        AlignmentResolutionConfig(min_side_px=512, max_side_px=256)


def test_step_direction_from_real_gradients_of_a_tiny_model() -> None:
    torch.manual_seed(0)
    model = TinyVideoTextModel()
    for m in (model.adapter.spatial_up, model.adapter.temporal_up):
        nn.init.normal_(m.weight, std=0.1)
    video, tokens = torch.randn(2, 3, 3, 32, 32), torch.randint(0, 50, (2, 5))
    v, t = model(video, tokens)
    # Make the vision side carry the misalignment: the text embedding is large (its gradient
    # through the cosine shrinks as 1/|t|), the vision embedding small.
    v_small, t_large = v * 0.01, t * 100.0
    gv, gt = alignment_grad_norms(alignment_loss(v_small, t_large), v_small, t_large)
    assert gv > gt
    assert resolution_step(gv, gt, 512) > 512
    v_large, t_small = v * 100.0, t * 0.01
    gv, gt = alignment_grad_norms(alignment_loss(v_large, t_small), v_large, t_small)
    assert gv < gt
    assert resolution_step(gv, gt, 512) < 512


def test_article_formula_is_reproduced_verbatim() -> None:
    # Small gap -> huge "align score" -> scale 1.5; large gap -> 0.8; floored to 32 px.
    assert article_resolution_step(1.0, 1.0, 512) == 768
    assert article_resolution_step(10.0, 1.0, 512) == 384  # 409.6 floored to 32
    assert article_resolution_step(10.0, 1.0, 500) == 384
