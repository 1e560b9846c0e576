"""Linear layers the runtime can run: dense float32 and per-row int8.

`Int8Linear` quantizes each weight row (output channel) and, at run time, each activation row
to int8 with its own absmax scale, multiplies in exact int32 (`torch._int_mm`) and rescales.
Because every output row depends only on its own input row and integer sums are exact, results
do not depend on how many rows share a call: a sequence decodes to the same tokens alone, in a
batch of 8, or inside a speculative verification pass. That property is what makes speculative
decoding token-identical to greedy decoding here, not just "identical up to near-ties".
"""

from __future__ import annotations

from functools import cached_property
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

_QMAX = 127.0


class Linear(Protocol):
    """y = x @ W^T for x of shape (rows, in_features)."""

    in_features: int
    out_features: int

    def __call__(self, x: Tensor) -> Tensor: ...

    def argmax(self, x: Tensor) -> Tensor:
        """Index of the largest output per row (greedy decoding), without full logits."""
        ...

    def dense_weight(self) -> Tensor:
        """The float32 weight this layer represents (for checks and conversions)."""
        ...

    def nbytes(self) -> int: ...


class DenseLinear:
    """Plain float32 weight."""

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight.float().contiguous()
        self.out_features, self.in_features = self.weight.shape

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)

    def argmax(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight).argmax(dim=-1)

    def dense_weight(self) -> Tensor:
        return self.weight

    def rows(self, index: Tensor) -> Tensor:
        """Weight rows as float32 (the embedding lookup of a tied head)."""
        return self.weight.index_select(0, index)

    def nbytes(self) -> int:
        return self.weight.numel() * 4


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-row int8: returns (int8 [N, K], float32 scale [N])."""
    w = weight.float()
    scale = (w.abs().amax(dim=1) / _QMAX).clamp_min(1e-12)
    q = torch.round(w / scale[:, None]).clamp_(-_QMAX, _QMAX).to(torch.int8)
    return q.contiguous(), scale.contiguous()


class Int8Linear:
    """Per-row int8 weight x per-row int8 activation, exact int32 accumulation."""

    def __init__(self, qweight: Tensor, scale: Tensor) -> None:
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError(
                f"qweight must be a 2-D int8 tensor, got {qweight.dtype} {qweight.shape}"
            )
        self.qweight = qweight.contiguous()
        self.scale = scale.float().contiguous()
        self.out_features, self.in_features = self.qweight.shape
        # `_int_mm` wants (K, N); a transposed view of the row-major weight is its fast layout.
        self._qweight_t = self.qweight.t()
        self._out_scale = self.scale / _QMAX  # weight scale and the activation's 1/127 in one

    @classmethod
    def from_float(cls, weight: Tensor) -> Int8Linear:
        return cls(*quantize_rows(weight))

    @cached_property
    def symmetric(self) -> bool:
        """Whether every weight lies in [-127, 127] (no -128): what the compiled AVX2 product
        needs to stay exact (`kernels.int8_gemv`)."""
        return bool(self.qweight.min() > -128)

    @cached_property
    def row_sums_128(self) -> Tensor:
        """128 x each weight row's sum (int32): what the compiled AVX-512 VNNI product
        (`kernels.int8_gemv`, unsigned x signed bytes) takes off its +128-shifted activations
        (the AVX2 form needs no correction and ignores it)."""
        # An int8 product with a row of ones: exact, and unlike a sum to int32, which widens
        # its whole input first (672 MB for the head), it needs no temporary copy.
        ones = torch.ones(1, self.in_features, dtype=torch.int8)
        return torch._int_mm(ones, self._qweight_t)[0].mul_(128)

    def quantize_input(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The int8 rows of `x` (one absmax scale each) and the row absmax; an all-zero row has
        absmax 0, so whatever its (undefined) quantized values give is multiplied by 0."""
        amax = x.abs().amax(dim=-1, keepdim=True)
        return x.div(amax).mul_(_QMAX).round_().to(torch.int8), amax

    def accumulate(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Exact int32 products of the int8 rows of `x` and the weight, and the row absmax."""
        xq, amax = self.quantize_input(x)
        return torch._int_mm(xq, self._qweight_t), amax

    def __call__(self, x: Tensor) -> Tensor:
        return self.rescale(*self.accumulate(x))

    def rescale(self, acc: Tensor, amax: Tensor) -> Tensor:
        """Float outputs from the int32 products of rows quantized with absmax `amax`."""
        return acc.mul(amax).mul_(self._out_scale)

    def argmax(self, x: Tensor) -> Tensor:
        # A row's activation scale is one positive factor: it cannot change which output is
        # largest, so greedy decoding skips that pass over the (vocabulary-sized) logits.
        acc, _ = self.accumulate(x)
        return acc.mul(self.scale).argmax(dim=-1)

    def dense_weight(self) -> Tensor:
        return self.qweight.float() * self.scale[:, None]

    def rows(self, index: Tensor) -> Tensor:
        return (
            self.qweight.index_select(0, index)
            .float()
            .mul_(self.scale.index_select(0, index)[:, None])
        )

    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * 4
