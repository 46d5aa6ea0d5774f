"""The Hyper-SET layer's two operators with hand-written backward passes, for training without a compiler.

Autograd of the written-out layer keeps every intermediate of the RMSNorms, the ReLU and the bi-softmax, and its
backward walks the feedforward's (B, N, M) hidden tensor about fifteen times per iteration: on a CPU that memory
traffic, not the matmuls, is most of a training step. These functions compute the same values and gradients
(the tests compare them with autograd of the written-out form) with two passes over the hidden tensor forward and
two backward:

- `relu_descent`: -dE_FF/dX = ReLU(RMSNorm(X D)) D^T, with the norm folded into the weights as at inference
  (``HyperSETLayer.ff_descent``): r ReLU(X (D s)) (D |g|)^T, r = 1 / rms(X D) per token, s = sign(g). The folded
  weights (`fold_ff`) are made once per pass, like the step sizes.
- `bisoftmax_grad`: dE_ATTN/dX = merge((P + P^T) Zn) W^T, Zn the head projections on their spheres and
  P = softmax(beta Zn Zn^T). The map Zn -> (P + P^T) Zn is the gradient of the attention energy, so its Jacobian
  is the energy's Hessian, which is symmetric: the backward pass is the map's directional derivative along the
  incoming gradient dG, S dG + (dP + dP^T) Zn with S = P + P^T and dP the softmax's derivative along
  beta (dG Zn^T + Zn dG^T), from the saved P and S.

On x86 CPUs with AVX-512 or AVX2 the attention maps of `bisoftmax_grad` (Zn Zn^T, the softmax, (P + P^T) Zn, and their
backward pass) run fused per (board, head) in a C kernel where `hyperset.accel.cpu_kernels` says so; it saves P
alone and makes S again from it backward.

Their products of a state by a weight (X D, ReLU(U) D^T, X W, G W^T and the backward passes' dY D, dU D^T, ...), and
the layer's at inference, run through `matmul`: on an x86 CPU in fp32 it can take oneDNN's GEMM instead of ATen's
(MKL in the x86 wheels). MKL's fp32 GEMM runs these shapes at its full rate on Intel CPUs but not on others, where
oneDNN's is the faster (bench/peer_bench.py --cpu-matmul; docs/sudoku.md, "Speed"). The weight-gradient products
(X^T dU) stay on ATen, which ran them about as fast as oneDNN or faster. Which library is
used: `cpu_matmul_library`; ``auto`` (the default) picks oneDNN on x86 CPUs not made by Intel, and
``$HYPERSET_CPU_MATMUL`` (auto, onednn, aten) or `using_cpu_matmul` choose.

They are used where they win: gradients on, no autocast, not in an export (see `usable`), in eager mode and under
``torch.compile``, which traces their forward and backward passes and fuses the elementwise work between their
matmuls (bench/peer_bench.py --compile compares the three). ``with written_out():`` turns them off, and with
them the step sizes made once per pass under gradients (``RecurrentCore._fixed_steps``, eager or compiled): the
unoptimised path that the tests and bench/peer_bench.py compare with. Their backward passes are first-order
only: gradients of gradients need `written_out` (torch.func's transforms get the written-out layer by themselves).
"""

from __future__ import annotations

import contextlib
import math
import platform
import threading
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.flop_counter import register_flop_formula

from .. import device
from . import cpu_kernels
from .cpu_kernels import define_op, eager_or_compiled, env_choice

CPU_MATMULS = ("auto", "onednn", "aten")

_state = threading.local()


def enabled() -> bool:
    """Whether training may take the optimised paths (off inside `written_out`)."""
    return _state.__dict__.get("enabled", True)


@contextlib.contextmanager
def written_out() -> Iterator[None]:
    """Run the written-out layer under autograd, with the step sizes made at every iteration, in this thread."""
    before = enabled()
    _state.enabled = False
    try:
        yield
    finally:
        _state.enabled = before


def plain(x: Tensor) -> bool:
    """Whether an update of x runs as written: no autocast, in eager mode or under torch.compile
    (`eager_or_compiled`), where the library's own operators may stand in for the written-out ones."""
    return not torch.is_autocast_enabled(x.device.type) and eager_or_compiled()


def usable(x: Tensor) -> bool:
    """Whether the fused operators should run for an update of x: a gradient will be taken, and `plain`."""
    return enabled() and torch.is_grad_enabled() and plain(x)


def onednn_here() -> bool:
    """Whether `matmul` can run products on oneDNN's GEMM here: an x86 CPU, and PyTorch built with oneDNN."""
    return platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()


def _resolve_cpu_matmul(name: str) -> str:
    """"onednn" or "aten" for a choice in CPU_MATMULS; auto: oneDNN on an x86 CPU not made by Intel where PyTorch
    has oneDNN, else ATen."""
    if name not in CPU_MATMULS:
        raise ValueError(f"CPU matmul library {name!r}: expected one of {', '.join(CPU_MATMULS)}")
    if name == "auto":
        return "onednn" if onednn_here() and not device.made_by_intel_or_unknown() else "aten"
    return "aten" if name == "onednn" and not onednn_here() else name


_cpu_matmul = _resolve_cpu_matmul(env_choice("HYPERSET_CPU_MATMUL", CPU_MATMULS))


def cpu_matmul_library() -> str:
    """Which library `matmul` runs fp32 CPU products with: "onednn" or "aten"."""
    return _cpu_matmul


@contextlib.contextmanager
def using_cpu_matmul(name: str) -> Iterator[str]:
    """`matmul` with the library `name` (auto, onednn, aten) for fp32 CPU products inside the block (for the whole
    process: a compiled model made inside recompiles outside); yields the library it resolved to ("onednn" asked
    for where PyTorch has no oneDNN, or off x86, is "aten")."""
    global _cpu_matmul
    before, _cpu_matmul = _cpu_matmul, _resolve_cpu_matmul(name)
    try:
        yield _cpu_matmul
    finally:
        _cpu_matmul = before


def _onednn_mm_kernel(a: Tensor, b: Tensor) -> Tensor:
    """a @ b, a (..., k) and b (k, n), by oneDNN's GEMM (its linear layer, y = a (b^T)^T)."""
    return torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], "")


def _onednn_mm_fake(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty(*a.shape[:-1], b.shape[-1])


define_op("onednn_mm", "(Tensor a, Tensor b) -> Tensor", _onednn_mm_kernel, _onednn_mm_fake)
_onednn_mm = torch.ops.hyperset.onednn_mm


@register_flop_formula(torch.ops.hyperset.onednn_mm)
def _onednn_mm_flops(a_shape: torch.Size, b_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(a_shape) * b_shape[-1]


CPU_PRECISIONS = ("fp32", "bf16")


def _resolve_cpu_precision(name: str) -> str:
    """"fp32" or "bf16" for a choice in CPU_PRECISIONS; bf16 only where the CPU has native bf16 dot products."""
    if name not in CPU_PRECISIONS:
        raise ValueError(f"CPU inference precision {name!r}: expected one of {', '.join(CPU_PRECISIONS)}")
    return "bf16" if name == "bf16" and device.cpu_has_native_bf16() else "fp32"


_cpu_precision = _resolve_cpu_precision(env_choice("HYPERSET_CPU_PRECISION", CPU_PRECISIONS))


def cpu_precision() -> str:
    """The operands' precision of `onednn_matmul`'s products at inference: "fp32" (the default) or "bf16"."""
    return _cpu_precision


@contextlib.contextmanager
def using_cpu_precision(name: str) -> Iterator[str]:
    """`onednn_matmul`'s products at inference with operands in `name` (fp32, bf16) inside the block, for the whole
    process; yields the precision it resolved to (bf16 asked for on a CPU without native bf16 is fp32)."""
    global _cpu_precision
    before, _cpu_precision = _cpu_precision, _resolve_cpu_precision(name)
    try:
        yield _cpu_precision
    finally:
        _cpu_precision = before


def onednn_matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b on oneDNN's GEMM for a state a (..., k) and a weight-like b (k, n) where it can run there: fp32
    operands, b a matrix, no gradient to take through it; else ``a @ b``. For CPU tensors outside autocast, a
    trace, an export and torch.func's transforms (`matmul` checks those; ``hyperset.accel.policy`` too).

    With `cpu_precision` "bf16" (``$HYPERSET_CPU_PRECISION``, `using_cpu_precision`), at inference, both operands
    are rounded to bf16 and the product (oneDNN's bf16 GEMM: sums in fp32, the result rounded to bf16) comes back
    in fp32: the CPU's bf16 dot products, about twice its fp32 multiply-add rate; the rest of the update stays fp32
    (bench/bf16_check.py measures speed and accuracy)."""
    if (a.dtype == torch.float32 and b.dtype == torch.float32 and b.dim() == 2 and a.dim() >= 2
            and not (torch.is_grad_enabled() and (a.requires_grad or b.requires_grad))):
        if _cpu_precision == "bf16" and not torch.is_grad_enabled():
            return _onednn_mm(a.to(torch.bfloat16), b.to(torch.bfloat16)).float()
        return _onednn_mm(a, b)
    return a @ b


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for a state a (..., k) and a weight-like b (k, n). fp32 on a CPU, with no gradient to take through it,
    it runs on `cpu_matmul_library`'s GEMM; otherwise (autocast, a trace or an export, torch.func's transforms,
    other devices and dtypes) it is ``a @ b``."""
    if _cpu_matmul == "onednn" and a.device.type == "cpu" and not torch.compiler.is_exporting() and plain(a):
        return onednn_matmul(a, b)
    return a @ b


def _inv_rms(x: Tensor, eps: float) -> Tensor:
    """1 / rms of each row, (..., 1), as hyperset.energies.inv_rms computes it."""
    sq = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square()
    return torch.rsqrt(sq / x.shape[-1] + eps)


def _rows(t: Tensor) -> Tensor:
    return t.reshape(-1, t.shape[-1])


def fold_ff(D: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """The feedforward's weights with its RMSNorm gain g folded in: (D s, D |g|), s = sign(g) (+1 at 0). They do not
    depend on the state, so a pass makes them once (``HyperSETLayer.pass_weights``) and autograd sums their
    gradients over the iterations, as for the step sizes."""
    s = torch.where(g >= 0, 1.0, -1.0).to(g.dtype)
    return D * s, D * g.abs()


def folded_relu(X: Tensor, Ds: Tensor, Dg: Tensor, eps: float) -> tuple[Tensor, ...]:
    """ReLU(RMSNorm_g(X D)) D^T from the folded weights (Ds, Dg) = `fold_ff(D, g)`: (the result, U, ReLU(U), r, Y0)
    with U = X (D s), r = 1/rms(U) = 1/rms(X D) per token and Y0 = ReLU(U) (D |g|)^T; the result is r Y0. The
    inference path (``HyperSETLayer.ff_descent``) and `relu_descent`'s forward both run this."""
    U = matmul(X, Ds)  # (B, N, M): X D with the columns of negative gain flipped
    r = _inv_rms(U, eps)  # (B, N, 1)
    V = torch.relu(U)
    Y0 = matmul(V, Dg.transpose(0, 1))
    return Y0 * r, U, V, r, Y0


def folded_relu_rows(X: Tensor, Ds: Tensor, Dg: Tensor, eps: float) -> Tensor:
    """`folded_relu`'s result alone, at inference on the C kernel: (r ReLU(U)) (D |g|)^T, the row scale r taken with
    the ReLU in one call (``cpu_kernels.relu_rms``) before the product, the same value within fp32 rounding."""
    return matmul(cpu_kernels.relu_rms(matmul(X, Ds), eps), Dg.transpose(0, 1))


class _ReLUDescent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X: Tensor, Ds: Tensor, Dg: Tensor, eps: float) -> Tensor:
        out, U, V, r, Y0 = folded_relu(X, Ds, Dg, eps)
        ctx.save_for_backward(X, Ds, Dg, U, V, r, Y0)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dF: Tensor) -> tuple[Tensor | None, ...]:
        X, Ds, Dg, U, V, r, Y0 = ctx.saved_tensors
        M = U.shape[-1]
        dY0 = dF * r
        # d r / d U = -r^3 U / M per token
        coef = (dF * Y0).sum(-1, keepdim=True).mul_(r.pow(3)).mul_(-1.0 / M)
        dU = matmul(dY0, Dg)
        torch.ops.aten.threshold_backward.grad_input(dU, U, 0.0, grad_input=dU)  # through the ReLU, in place
        dU.addcmul_(U, coef)  # through r
        dX = matmul(dU, Ds.t()) if ctx.needs_input_grad[0] else None
        dDs = _rows(X).t() @ _rows(dU) if ctx.needs_input_grad[1] else None  # (d, M)
        dDg = _rows(dY0).t() @ _rows(V) if ctx.needs_input_grad[2] else None  # (d, M)
        return dX, dDs, dDg, None


def relu_descent(X: Tensor, Ds: Tensor, Dg: Tensor, eps: float) -> Tensor:
    """ReLU(RMSNorm_g(X D)) D^T, (B, N, d), from the folded weights (Ds, Dg) = `fold_ff(D, g)`: the feedforward
    step's direction, -dE_FF/dX (eq. 11). The gradients of D and g flow through `fold_ff`."""
    return _ReLUDescent.apply(X, Ds, Dg, eps)


def _split(z: Tensor, heads: int) -> Tensor:
    """(B, N, H*p) -> (B*H, N, p), contiguous."""
    b, n, d = z.shape
    return z.view(b, n, heads, d // heads).transpose(1, 2).reshape(b * heads, n, d // heads)


def _merge(z: Tensor, batch: int) -> Tensor:
    """(B*H, N, p) -> (B, N, H*p)."""
    bh, n, p = z.shape
    return z.view(batch, bh // batch, n, p).transpose(1, 2).reshape(batch, n, bh // batch * p)


def _sym(a: Tensor) -> Tensor:
    """a + a^T for a batch of square matrices, written in a^T's layout: the same values (the sum is symmetric),
    and the add reads the transposed operand in its own order, which a CPU does faster than a + a^T."""
    return torch.add(a.transpose(1, 2), a)


class _BiSoftmaxGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X: Tensor, W: Tensor, g: Tensor, heads: int, eps: float) -> Tensor:
        B = X.shape[0]
        Z = _split(matmul(X, W), heads)  # (B*H, N, p)
        beta = 1.0 / math.sqrt(Z.shape[-1])
        r = _inv_rms(Z, eps)
        Zn = Z * r * g
        if cpu_kernels.usable(Zn):  # the maps fused per (board, head); S is made again from P backward
            P, G = cpu_kernels.bisoftmax_maps(Zn, beta)
            S = None
        else:
            A = torch.baddbmm(Zn.new_empty(Zn.shape[0], Zn.shape[1], Zn.shape[1]), Zn, Zn.transpose(1, 2),
                              beta=0.0, alpha=beta)
            P = torch.softmax(A, dim=-1)
            S = _sym(P)
            G = torch.bmm(S, Zn)
        Gm = _merge(G, B)
        ctx.heads, ctx.beta = heads, beta
        ctx.save_for_backward(X, W, g, Z, r, Zn, P, S, Gm)
        return matmul(Gm, W.t())

    @staticmethod
    @once_differentiable
    def backward(ctx, dY: Tensor) -> tuple[Tensor | None, ...]:
        X, W, g, Z, r, Zn, P, S, Gm = ctx.saved_tensors
        B, beta = X.shape[0], ctx.beta
        dG = _split(matmul(dY, W), ctx.heads)  # (B*H, N, p)
        # the Hessian of the energy at Zn applied to dG: S dG + dS Zn, dS = dP + dP^T, dP the softmax's
        # derivative along dA = beta (dG Zn^T + Zn dG^T)
        if S is None:
            dZn = cpu_kernels.bisoftmax_maps_backward(Zn, P, dG, beta)
        else:
            Q = torch.bmm(dG, Zn.transpose(1, 2))
            dP = torch._softmax_backward_data(torch.add(Q, Q.transpose(1, 2)), P, -1, P.dtype)
            # (dP + dP^T) Zn as two products: cheaper than the transposed add
            dZn = torch.baddbmm(torch.baddbmm(torch.bmm(S, dG), dP, Zn, alpha=beta), dP.transpose(1, 2), Zn,
                                alpha=beta)
        # through Zn = Z r g
        dZg = dZn * g
        dZ = dZg * r - Z * ((dZg * Z).sum(-1, keepdim=True) * r.pow(3) / Z.shape[-1])
        dZ = _merge(dZ, B)
        dX = matmul(dZ, W.t()) if ctx.needs_input_grad[0] else None
        dW = torch.addmm(_rows(X).t() @ _rows(dZ), _rows(dY).t(), _rows(Gm)) if ctx.needs_input_grad[1] else None
        dg = _rows(dZn * Z * r).sum(0) if ctx.needs_input_grad[2] else None
        return dX, dW, dg, None, None


def bisoftmax_grad(X: Tensor, W: Tensor, g: Tensor, heads: int, eps: float) -> Tensor:
    """merge((P + P^T) Zn) W^T, (B, N, d): dE_ATTN/dX with the projections Zn = RMSNorm_g(split(X W)) (eq. 9)."""
    return _BiSoftmaxGrad.apply(X, W, g, heads, eps)
