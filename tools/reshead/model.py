"""The resolution head network (torch): a depthwise-separable CNN under 100K parameters.

Input: a standardized grey thumbnail rearranged space-to-depth (N, 16, H/4, W/4) (see
`preprocess`). Output: logits over ladder rungs, index 0 the largest; the class is the lowest
rung at which OCR still reads the frame. The space-to-depth input makes the first convolution a
dense 3x3 over 16 channels instead of a 1-channel one, which INT8 kernels on AVX2 run far
better (a 1-channel INT8 stem was 2-3x slower than FP32 and made the whole INT8 model slower).
Also here: BatchNorm folding into the preceding convolution and a MAC/FLOP counter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

# (out_channels, stride) of each depthwise-separable block after the stem.
# The first block strides at once: ONNX Runtime's INT8 depthwise kernel is slower than its FP32
# one, so little depthwise work runs at the stem's resolution.
DEFAULT_BLOCKS: tuple[tuple[int, int], ...] = (
    (64, 2),
    (96, 1),
    (128, 2),
    (128, 1),
    (160, 2),
)


def _conv_bn_relu(cin: int, cout: int, k: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, padding=k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class DepthwiseSeparable(nn.Module):
    """3x3 depthwise conv + BN + ReLU, then 1x1 pointwise conv + BN + ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.dw = _conv_bn_relu(cin, cin, 3, stride, groups=cin)
        self.pw = _conv_bn_relu(cin, cout, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(self.dw(x))


class ResHeadNet(nn.Module):
    """Dense 3x3 stem, depthwise-separable blocks, [mean, max] global pooling, linear classifier.

    Max pooling is there because the smallest text anywhere on the frame decides the rung.
    """

    def __init__(
        self,
        n_classes: int = 7,
        in_channels: int = 16,
        stem_channels: int = 48,
        blocks: Sequence[tuple[int, int]] = DEFAULT_BLOCKS,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_relu(in_channels, stem_channels, 3, 1)]
        cin = stem_channels
        for cout, stride in blocks:
            layers.append(DepthwiseSeparable(cin, cout, stride))
            cin = cout
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(2 * cin, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        pooled = torch.cat([f.mean(dim=(2, 3)), f.amax(dim=(2, 3))], dim=1)
        return self.classifier(self.dropout(pooled))


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_macs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of convolutions and linear layers for one input of `input_shape`.

    FLOPs are conventionally 2 x MACs. BatchNorm, ReLU and pooling are not counted (BN folds
    away; the others are a small fraction).
    """
    macs = 0

    def conv_hook(m: nn.Module, _inp: object, out: torch.Tensor) -> None:
        nonlocal macs
        assert isinstance(m, nn.Conv2d)
        kh, kw = m.kernel_size
        macs += out.numel() * (m.in_channels // m.groups) * kh * kw

    def linear_hook(m: nn.Module, _inp: object, out: torch.Tensor) -> None:
        nonlocal macs
        assert isinstance(m, nn.Linear)
        macs += out.numel() * m.in_features

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros((1, *input_shape)))
    model.train(was_training)
    for h in handles:
        h.remove()
    return macs


def fold_conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """A conv with bias equal to `bn(conv(x))` in eval mode.

    w' = w * gamma / sqrt(var + eps) per output channel; b' = (b - mean) * gamma / sqrt(var +
    eps) + beta.
    """
    assert bn.running_mean is not None and bn.running_var is not None
    std = torch.sqrt(bn.running_var + bn.eps)
    gamma = bn.weight if bn.weight is not None else torch.ones_like(std)
    beta = bn.bias if bn.bias is not None else torch.zeros_like(std)
    factor = gamma / std
    fused = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,  # type: ignore[arg-type]
        conv.stride,  # type: ignore[arg-type]
        conv.padding,  # type: ignore[arg-type]
        conv.dilation,  # type: ignore[arg-type]
        conv.groups,
        bias=True,
    )
    bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
    with torch.no_grad():
        fused.weight.copy_(conv.weight * factor.reshape(-1, 1, 1, 1))
        assert fused.bias is not None
        fused.bias.copy_((bias - bn.running_mean) * factor + beta)
    return fused


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """Fold every Conv2d directly followed by a BatchNorm2d in an `nn.Sequential`, in place.

    The BatchNorm becomes `nn.Identity`. Call on an eval-mode model; returns it.
    """
    for module in model.modules():
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        for (name_a, a), (name_b, b) in zip(children, children[1:], strict=False):
            if isinstance(a, nn.Conv2d) and isinstance(b, nn.BatchNorm2d):
                setattr(module, name_a, fold_conv_bn(a, b))
                setattr(module, name_b, nn.Identity())
    return model
