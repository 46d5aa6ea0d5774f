"""The forms an ONNX export writes for three of the reference math's functions: the same values, in the operators
ONNX Runtime's CPU kernels run fastest (``Ops.onnx`` while an export traces the model)."""

from __future__ import annotations

import torch
from torch import Tensor


def sq_norm(x: Tensor) -> Tensor:
    """|x|^2 of each row as ReduceSum(x * x): ONNX Runtime's CPU ReduceL2 and ReduceSumSquare over the last axis
    are slower than the two ops at the solver's shapes (bench/onnx_bench.py measures the graphs)."""
    return (x * x).sum(-1, keepdim=True)


def logsumexp(x: Tensor, dim: int = -1, bound: float | None = None) -> Tensor:
    """max + log(sum(exp(x - max))), which ONNX Runtime's CPU kernels run faster than its
    ReduceLogSumExp (the E_ATTN trace of every iteration). With `bound` >= |x| and small enough that exp cannot
    overflow, no max: log(sum(exp(x)))."""
    if bound is not None and bound <= 60.0:
        return torch.log(torch.exp(x).sum(dim=dim))
    m = x.amax(dim=dim, keepdim=True)
    return m.squeeze(dim) + torch.log(torch.exp(x - m).sum(dim=dim))


def rms_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x^2) + eps): Sqrt and Div, one node fewer than the Sqrt, Div(1, .) and Mul of
    x * rsqrt(...)."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
