"""The speed code, apart from the paper's math: faster implementations of the reference operators and the one
policy function that chooses among them.

The reference math (:mod:`hyperset.energies`, :mod:`hyperset.layers`, :mod:`hyperset.core`) is written once, as
the paper writes it, and asks `policy` (the only name it imports from here) which implementations to run for an
update of a tensor; where an entry is None, the written-out form runs. What the choices are:

- `fused`: the layer's two operators with hand-written backward passes (training without a compiler, and the
  compiled training step), the feedforward's RMSNorm folded into its weights, and products of a state by a weight
  on oneDNN's GEMM on x86 CPUs not made by Intel (``$HYPERSET_CPU_MATMUL``).
- `cpu_kernels`: the bi-softmax attention maps fused per (board, head) in a C kernel on x86 CPUs with AVX-512 or
  AVX2 (``$HYPERSET_CPU_KERNELS``), built by `hyperset.cbuild` (the C loader the rated-puzzle generator shares).
- `cpu_gemm`: at inference on x86 CPUs with AVX2, the products of a state by a weight in a C kernel, with the
  feedforward step, the attention step's back-projection and the trace's E_FF fused around them
  (``$HYPERSET_CPU_GEMM``).
- `rows`: inference on a CPU in slices of rows that stay in cache.
- `reuse`: the trace's head projections handed to the next update at inference.
- `onnx_forms`: the forms an ONNX export writes so that ONNX Runtime runs them fast (the same values).

``with written_out():`` turns the optimised training paths off (the unoptimised path the tests compare with).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import device
from . import cpu_gemm, cpu_kernels, fused, onnx_forms, reuse, rows
from .fused import written_out

__all__ = ["Ops", "held", "policy", "written_out"]


@dataclass(frozen=True)
class Ops:
    """The implementations `policy` chose for an update (read from their modules at each use); None: the reference
    math's written-out form.

    matmul          a state (..., k) times a weight (k, n) (on the GEMM kernel where `gemm`, at inference)
    bisoftmax_grad  dE_ATTN/dX of the normalised bi-softmax energy with its own backward pass (training)
    relu_descent    the normalised ReLU feedforward's step from folded weights, with its own backward (training)
    folded_relu     the same without gradients (returns the step first)
    relu_step       the same at inference on the C kernel (returns the step alone: ReLU and the row scale in one
                    call before the second product)
    relu_energy     the normalised ReLU energy of U = X D per sample in one pass of the C kernel, at inference
    relu_update     the feedforward step y + gamma (its direction) in one call of the GEMM kernel (`cpu_gemm`), at
                    inference; it returns None where that kernel cannot run it
    step_product    x + c s (a b), a step along a state-by-weight product, in one call of the GEMM kernel at inference
                    (None where it cannot run)
    relu_energy_x   the normalised ReLU energy from X and D in the GEMM kernel, U never written, at inference (None
                    where it cannot run)
    fold_ff         (D, g) -> the folded feedforward weights those two take
    attention_maps  (P + P^T) Z of the bi-softmax at inference, per (board, head) in C
    attention_energy  sum_i logsumexp_j(beta Z Z^T)_ij of the bi-softmax at inference, per (board, head) in C
    attention_heads the attention step's merge((P + P^T) (Z g)) from head-major projections and the gain, in one
                    C call, at inference (no gradient)
    heads_rms       the head projections of X W on their spheres, head-major, in one C pass, at inference
    project_heads   X W and `heads_rms` in one call of the GEMM kernel, at inference (None where it cannot run)
    steps_once      whether step sizes that do not depend on t may be made once per pass under gradients
    add_scaled      x + c s v for a step s (tensor) along v, c a number: one pass (torch.addcmul, the same values as
                    written out), written out in an export
    memo            the trace's head projections handed to the next update (the `reuse` module), at inference
    onnx            the export's forms (`onnx_forms`) while an ONNX export traces the model
    """

    train: bool = False  # the operators with their own backward passes
    fold: bool = False  # the feedforward on folded weights
    onednn: bool = False  # products of a state by a weight on oneDNN's GEMM
    maps: bool = False  # the attention maps' C kernel
    steps_once: bool = True
    export: bool = False
    hand_on: bool = False  # the trace's head projections to the next update
    gemm: bool = False  # products of a state by a weight and the feedforward on the GEMM kernel (inference)

    @property
    def matmul(self) -> Callable[[Tensor, Tensor], Tensor]:
        if self.gemm:
            return _kernel_matmul[self.onednn]
        return fused.onednn_matmul if self.onednn else torch.matmul

    @property
    def bisoftmax_grad(self) -> Callable[..., Tensor] | None:
        return fused.bisoftmax_grad if self.train else None

    @property
    def relu_descent(self) -> Callable[..., Tensor] | None:
        return fused.relu_descent if self.train else None

    @property
    def folded_relu(self) -> Callable[..., tuple[Tensor, ...]] | None:
        return fused.folded_relu if self.fold else None

    @property
    def relu_step(self) -> Callable[..., Tensor] | None:
        return fused.folded_relu_rows if self.fold and self.maps and not self.train else None

    @property
    def relu_energy(self) -> Callable[[Tensor, float], Tensor] | None:
        return cpu_kernels.relu_energy if self.maps else None

    @property
    def relu_update(self) -> Callable[..., Tensor | None] | None:
        return cpu_gemm.ff_update if self.gemm and self.fold else None

    @property
    def step_product(self) -> Callable[..., Tensor | None] | None:
        return cpu_gemm.step_product if self.gemm else None

    @property
    def relu_energy_x(self) -> Callable[[Tensor, Tensor, float], Tensor | None] | None:
        return cpu_gemm.relu_energy if self.gemm else None

    @property
    def fold_ff(self) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
        return fused.fold_ff

    @property
    def attention_maps(self) -> Callable[[Tensor, float], Tensor] | None:
        return cpu_kernels.bisoftmax_attention if self.maps else None

    @property
    def attention_energy(self) -> Callable[..., Tensor] | None:
        return cpu_kernels.bisoftmax_energy if self.maps else None

    @property
    def attention_heads(self) -> Callable[[Tensor, Tensor, float], Tensor] | None:
        return cpu_kernels.bisoftmax_attention_heads if self.maps and self.hand_on else None

    @property
    def heads_rms(self) -> Callable[[Tensor, int, float], Tensor] | None:
        return cpu_kernels.heads_rms if self.maps and self.hand_on else None

    @property
    def project_heads(self) -> Callable[[Tensor, Tensor, int, float], Tensor | None] | None:
        return cpu_gemm.project_heads if self.gemm and self.hand_on else None

    @property
    def add_scaled(self) -> Callable[[Tensor, Tensor, Tensor, float], Tensor]:
        return _add_scaled_written if self.export else _add_scaled

    @property
    def memo(self) -> Any:
        return reuse if self.hand_on else None

    @property
    def onnx(self) -> Any:
        return onnx_forms if self.export else None

    def slice_rows(self, cfg: Any, batch: int, where: torch.device) -> int:
        """Rows per slice for an inference update of `batch` rows (0: the whole batch at once); see `rows`."""
        return rows.slice_rows(cfg, batch, where, state_only=self.gemm and cpu_gemm.runs_update(cfg))

    by_rows = staticmethod(rows.by_rows)

    @staticmethod
    def hold(x: Tensor) -> contextlib.AbstractContextManager[None]:
        """`held`: the choice for the state x kept for the block, at inference (a pass's updates)."""
        return held(x)


def _add_scaled(x: Tensor, s: Tensor, v: Tensor, c: float) -> Tensor:
    return torch.addcmul(x, s, v, value=c)


def _add_scaled_written(x: Tensor, s: Tensor, v: Tensor, c: float) -> Tensor:
    if c == 1:
        return x + s * v
    if c == -1:
        return x - s * v
    return x + c * s * v


def _kernel_or(fallback: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    def mm(a: Tensor, b: Tensor) -> Tensor:
        out = cpu_gemm.matmul(a, b)
        return fallback(a, b) if out is None else out
    return mm


_kernel_matmul = {True: _kernel_or(fused.onednn_matmul), False: _kernel_or(torch.matmul)}
_OPS = {key: Ops(*key) for key in itertools.product((False, True), repeat=8)}
_EXPORT = Ops(export=True)


_held = threading.local()


@contextlib.contextmanager
def held(x: Tensor) -> Iterator[None]:
    """`policy`'s choice for a state x kept for the block where no gradient is taken (an inference pass, whose
    updates ask it about a dozen times each, in a context that does not change within the pass): tensors on x's
    device and of its dtype get it while gradients stay off; anything else is asked as usual. With gradients on it
    keeps nothing."""
    if torch.is_grad_enabled():
        yield
        return
    before = getattr(_held, "choice", None)
    _held.choice = (x.device, x.dtype, policy(x))
    try:
        yield
    finally:
        _held.choice = before


def policy(x: Tensor) -> Ops:
    """The implementations for an update of `x` (a state (B, N, d) or its head projections (B, H, N, p)), from the
    context: gradients on or off, autocast, a trace, an ONNX export or torch.func's transforms, torch.compile, the
    device and dtype, and the process's choices (``written_out``, ``$HYPERSET_CPU_MATMUL``,
    ``$HYPERSET_CPU_KERNELS``); inside `held`, the choice it keeps. The fast paths compute the reference's values
    (the tests compare them)."""
    kept = getattr(_held, "choice", None)
    if kept is not None and x.dtype is kept[1] and not torch.is_grad_enabled() and x.device == kept[0]:
        return kept[2]
    return _choose(x)


def _choose(x: Tensor) -> Ops:
    if device.in_onnx_export():
        return _EXPORT
    on = fused.enabled()
    grad = torch.is_grad_enabled()
    plain = fused.plain(x)
    train = on and grad and plain  # fused.usable(x)
    cpu32 = x.is_cpu and plain and x.dtype is torch.float32
    onednn = cpu32 and fused.cpu_matmul_library() == "onednn" and not torch.compiler.is_exporting()
    maps = cpu32 and not (grad and x.requires_grad) and cpu_kernels.usable(x)
    gemm = maps and on and not grad and cpu_gemm.available()
    return _OPS[train, train or not grad, onednn, maps, on, False, on and not grad, gemm]
