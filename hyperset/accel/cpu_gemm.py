"""Products of a state by a weight at inference in a C kernel (fp32, AVX-512 or AVX2 + FMA as the CPU has), and the
feedforward fused around them.

At inference a Hyper-SET iteration is five products of a state by a weight (X W, merge(G) W^T, Y (D s),
ReLU(U) (D |g|)^T, and the trace's X D) plus passes over their results in memory. ``kernels/gemm.c`` packs each
weight once into panels of 16 columns and sums tiles of 6 rows x 16 columns (AVX2) or x 64 columns (AVX-512) in
registers, and it fuses:

- `matmul`: a state (..., k) by a weight (k, n);
- `step_product`: a step along such a product, x + c s (a b), the attention step x - alpha merge(G) W^T stored as
  its product is summed;
- `ff_update`: the feedforward step y + gamma * (r ReLU(y D s)) (D |g|)^T (``HyperSETLayer.update``) for a block of
  rows at a time, the hidden row kept in the core's cache between the two products, the step added as it is stored;
- `relu_energy`: the trace's E_FF of x from x and D, the hidden tensor never written;
- `project_heads`: the head projections X W put on their spheres, head-major, as a block of rows of X W is summed.

The values are the written-out path's within fp32 rounding (the tests compare them). Which: ``$HYPERSET_CPU_GEMM``
(auto, on, off) or `using_cpu_gemm`; ``auto`` (the default) uses it where bench/onnx_bench.py measured the pass faster
with it than with the library's products: on x86 CPUs whose widest vectors are AVX2's and not made by Intel, and on
Intel CPUs with AVX-512 (elsewhere, e.g. AMD CPUs with AVX-512, it is unmeasured and off); ``on`` asks for it on any
x86 CPU with AVX2, built for the widest vectors ``hyperset.accel.cpu_kernels`` finds. It is built
with the attention maps' kernel's compiler and cache (`hyperset.cbuild`), runs on ``torch.get_num_threads()`` threads,
and is used only where that kernel is, with no gradient to take (`available`).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys
import threading
import weakref
from pathlib import Path

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from .. import cbuild, device
from . import cpu_kernels
from .cpu_kernels import define_op, env_choice

CHOICES = ("auto", "on", "off")
SOURCE = Path(__file__).with_name("kernels") / "gemm.c"
PANEL = 16  # columns of a packed panel: the products' widths must be multiples of it

_lock = threading.Lock()
_packs: dict[tuple[int, bool], tuple[weakref.ref, tuple[int, ...], int, tuple, Tensor]] = {}
MAX_PACKS = 32


def _resolve(name: str) -> bool:
    if name not in CHOICES:
        raise ValueError(f"CPU GEMM {name!r}: expected one of {', '.join(CHOICES)}")
    found = cpu_kernels.isa()
    if name == "auto":
        vendor = device.cpu_vendor()
        return ((found == "avx2" and vendor not in (None, "GenuineIntel"))
                or (found == "avx512" and vendor == "GenuineIntel"))
    return name == "on" and found is not None


_wanted = _resolve(env_choice("HYPERSET_CPU_GEMM", CHOICES))


def using_cpu_gemm(name: str) -> contextlib.AbstractContextManager[bool]:
    """The kernel on (``on``), off or as ``auto`` decides inside the block, for the whole process; yields whether
    it is wanted."""
    return cpu_kernels.switched(sys.modules[__name__], name)


def _build(isa: str | None = None) -> ctypes.CDLL:
    """Compile the kernel for `isa` ("avx512" or "avx2"; default this CPU's, `cpu_kernels.isa`) and load it."""
    handle = cbuild.load(SOURCE, cpu_kernels.build_flags(isa))
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    handle.hs_pack.argtypes = [i64, i64, ptr, i64, ptr]
    handle.hs_gemm.argtypes = [i64, i64, i64, i64, ptr, ptr, ptr, ptr, i64, ptr, f32]
    handle.hs_ff_update.argtypes = [i64, i64, i64, i64, f32, ptr, ptr, ptr, ptr, i64, ptr]
    handle.hs_relu_energy.argtypes = [i64, i64, i64, i64, i64, f32, ptr, ptr, ptr]
    handle.hs_gemm_heads.argtypes = [i64, i64, i64, i64, ptr, ptr, i64, i64, f32, ptr]
    for fn in (handle.hs_pack, handle.hs_gemm, handle.hs_ff_update, handle.hs_relu_energy, handle.hs_gemm_heads):
        fn.restype = ctypes.c_int
    return handle


_loaded = cbuild.Loaded(_build)
_library = _loaded.get


def status() -> str:
    """"on", or why the kernel is not used here: "off" (not wanted) or "off (...)" with the reason it could not be
    built or loaded."""
    if not _wanted:
        return "off"
    return "on" if _library() is not None else f"off ({_loaded.why_not})"


def available() -> bool:
    """Whether the kernel may run here: wanted, not under torch.compile, and built. The policy takes it for an update
    where also the attention maps' kernel runs (``cpu_kernels.usable``: fp32 on a CPU, no autocast) and no gradient
    is taken."""
    return _wanted and not torch.compiler.is_compiling() and _library() is not None


def runs_update(cfg: object) -> bool:
    """Whether a Hyper-SET layer of this config runs its whole update in the kernels at inference: the bi-softmax
    attention and the ReLU feedforward, dim and ff_hidden multiples of PANEL (`ff_update`, `step_product`)."""
    return (getattr(cfg, "layer", None) == "hyperset" and getattr(cfg, "attention", None) == "bisoftmax"
            and getattr(cfg, "feedforward", None) == "relu" and cfg.dim % PANEL == 0 and cfg.ff_hidden % PANEL == 0)


def _fits(a: Tensor, *weights: Tensor) -> bool:
    """fp32 CPU tensors with no gradient to take, every weight a matrix whose columns are a multiple of PANEL
    wide."""
    return (not torch.is_grad_enabled() and a.dtype == torch.float32 and a.dim() >= 2 and a.device.type == "cpu"
            and all(w.dtype == torch.float32 and w.dim() == 2 and w.device == a.device and w.shape[1] % PANEL == 0
                    for w in weights))


def _pack(b: Tensor) -> Tensor:
    k, n = b.shape
    bc = b.contiguous()
    bp = torch.empty(k * n, dtype=torch.float32)
    _library().hs_pack(k, n, bc.data_ptr(), n, bp.data_ptr())
    return bp


def packed(w: Tensor, transposed: bool = False) -> Tensor:
    """Weight w (or w^T with `transposed`) in the kernel's panels, packed once while this very tensor object is
    alive and unchanged (its change counter, as ``hyperset.accel.reuse`` keeps the head projections): a model's
    parameters, and the folded feedforward weights a pass makes once (``HyperSETLayer.pass_weights``). The caller
    holds the result while the kernel reads it."""
    key = (id(w), transposed)
    hit = _packs.get(key)
    if (hit is not None and hit[0]() is w and hit[1] == device.versions(w) and hit[2] == w.data_ptr()
            and hit[3] == (tuple(w.shape), tuple(w.stride()))):
        return hit[4]
    bp = _pack(w.t() if transposed else w)
    with _lock:
        if len(_packs) >= MAX_PACKS:
            for k in [k for k, v in _packs.items() if v[0]() is None] or list(_packs):
                del _packs[k]
        _packs[key] = (weakref.ref(w), device.versions(w), w.data_ptr(), (tuple(w.shape), tuple(w.stride())), bp)
    return bp


def _weight_panels(b: Tensor) -> Tensor:
    """b's panels: cached for a weight tensor or the transpose of one (a view whose base is the weight), else made
    for this call."""
    base = b._base
    if base is None:
        return packed(b)
    if base.dim() == 2 and b.shape == base.shape[::-1] and b.stride() == base.stride()[::-1]:
        return packed(base, transposed=True)
    return _pack(b)


def _matmul(a: Tensor, b: Tensor) -> Tensor:
    a = a.contiguous()
    k, n = b.shape
    rows = a.numel() // k
    out, bp = a.new_empty(*a.shape[:-1], n), _weight_panels(b)
    cpu_kernels._run(_library().hs_gemm, rows, n, k, a.data_ptr(), bp.data_ptr(), out.data_ptr(), None, 0, None, 0.0,
                     per_item=n * k)
    return out


def _matmul_fake(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty(*a.shape[:-1], b.shape[1])


def _rows_of(s: Tensor, width: int) -> Tensor:
    """s as a matrix of rows `width` wide, rows evenly apart and each contiguous (a view where s is one, as the
    step sizes' halves are), else a contiguous copy."""
    try:
        rows = s.view(-1, width)
    except RuntimeError:
        rows = s.reshape(-1, width)
    return rows if rows.stride(1) == 1 else rows.contiguous()


def _ff_update(y: Tensor, s: Tensor, Ds: Tensor, Dg: Tensor, eps: float) -> Tensor:
    y = y.contiguous()
    d, m = Ds.shape
    s = _rows_of(s, d)
    out, first, second = torch.empty_like(y), packed(Ds), packed(Dg, transposed=True)  # held
    cpu_kernels._run(_library().hs_ff_update, y.numel() // d, d, m, eps, y.data_ptr(), first.data_ptr(),
                     second.data_ptr(), s.data_ptr(), s.stride(0), out.data_ptr(), per_item=2 * d * m)
    return out


def _step_product(x: Tensor, s: Tensor, c: float, a: Tensor, b: Tensor) -> Tensor:
    x, a = x.contiguous(), a.contiguous()
    k, n = b.shape
    s = _rows_of(s, n)
    out, bp = torch.empty_like(x), _weight_panels(b)
    cpu_kernels._run(_library().hs_gemm, a.numel() // k, n, k, a.data_ptr(), bp.data_ptr(), out.data_ptr(),
                     s.data_ptr(), s.stride(0), x.data_ptr(), c, per_item=n * k)
    return out


def _step_product_fake(x: Tensor, s: Tensor, c: float, a: Tensor, b: Tensor) -> Tensor:
    return torch.empty_like(x)


def _ff_update_fake(y: Tensor, s: Tensor, Ds: Tensor, Dg: Tensor, eps: float) -> Tensor:
    return torch.empty_like(y)


def _relu_energy(x: Tensor, D: Tensor, eps: float) -> Tensor:
    x = x.contiguous()
    b, n, d = x.shape
    E, Dp = x.new_empty(b), _weight_panels(D)
    cpu_kernels._run(_library().hs_relu_energy, b, n, d, D.shape[1], eps, x.data_ptr(), Dp.data_ptr(), E.data_ptr(),
                     per_item=n * d * D.shape[1])
    return E


def _relu_energy_fake(x: Tensor, D: Tensor, eps: float) -> Tensor:
    return x.new_empty(x.shape[0])


def _project_heads(x: Tensor, w: Tensor, heads: int, eps: float) -> Tensor:
    x = x.contiguous()
    b, n, k = x.shape
    Zn, wp = x.new_empty(b, heads, n, w.shape[1] // heads), _weight_panels(w)
    cpu_kernels._run(_library().hs_gemm_heads, b * n, w.shape[1], k, x.data_ptr(), wp.data_ptr(), n, heads, eps,
                     Zn.data_ptr(), per_item=w.shape[1] * k)
    return Zn


def _project_heads_fake(x: Tensor, w: Tensor, heads: int, eps: float) -> Tensor:
    return x.new_empty(x.shape[0], heads, x.shape[1], w.shape[1] // heads)


define_op("gemm", "(Tensor a, Tensor b) -> Tensor", _matmul, _matmul_fake)
define_op("step_product", "(Tensor x, Tensor s, float c, Tensor a, Tensor b) -> Tensor", _step_product,
          _step_product_fake)
define_op("ff_update", "(Tensor y, Tensor s, Tensor Ds, Tensor Dg, float eps) -> Tensor", _ff_update, _ff_update_fake)
define_op("relu_energy_x", "(Tensor x, Tensor D, float eps) -> Tensor", _relu_energy, _relu_energy_fake)
define_op("project_heads", "(Tensor x, Tensor w, int heads, float eps) -> Tensor", _project_heads, _project_heads_fake)


@register_flop_formula(torch.ops.hyperset.gemm)
def _gemm_flops(a_shape: torch.Size, b_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(a_shape) * b_shape[1]


@register_flop_formula(torch.ops.hyperset.project_heads)
def _project_heads_flops(x_shape: torch.Size, w_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    return _gemm_flops(x_shape, w_shape)


@register_flop_formula(torch.ops.hyperset.step_product)
def _step_product_flops(x_shape: torch.Size, s_shape: torch.Size, c: float, a_shape: torch.Size, b_shape: torch.Size,
                        *args, out_shape=None, **kwargs) -> int:
    return _gemm_flops(a_shape, b_shape)


@register_flop_formula(torch.ops.hyperset.ff_update)
def _ff_update_flops(y_shape: torch.Size, s_shape: torch.Size, ds_shape: torch.Size, *args, out_shape=None,
                     **kwargs) -> int:
    return 2 * 2 * math.prod(y_shape) * ds_shape[1]


@register_flop_formula(torch.ops.hyperset.relu_energy_x)
def _relu_energy_flops(x_shape: torch.Size, d_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(x_shape) * d_shape[1]


def matmul(a: Tensor, b: Tensor) -> Tensor | None:
    """a @ b for a state a (..., k) and a weight b (k, n) in the kernel; None where it cannot run it (dtypes,
    gradients, n not a multiple of PANEL)."""
    if not _fits(a, b) or a.shape[-1] != b.shape[0]:
        return None
    return torch.ops.hyperset.gemm(a, b)


def step_product(x: Tensor, s: Tensor, c: float, a: Tensor, b: Tensor) -> Tensor | None:
    """x + c s (a @ b) for a state x (..., n), step sizes s (x's shape, or broadcast to it), a number c, and a
    (..., k) by a weight b (k, n): a step along a product in one call; None where the kernel cannot run it."""
    if (not _fits(a, b) or a.shape[-1] != b.shape[0] or x.shape != (*a.shape[:-1], b.shape[1])
            or x.dtype != torch.float32 or s.dtype != torch.float32 or s.device != x.device):
        return None
    return torch.ops.hyperset.step_product(x, s.expand_as(x), float(c), a, b)


def ff_update(y: Tensor, gamma: Tensor, Ds: Tensor, Dg: Tensor, eps: float) -> Tensor | None:
    """y + gamma (r ReLU(y Ds)) Dg^T, r = 1/rms(y Ds) per row, from the folded feedforward weights (Ds, Dg) (d, M)
    (``hyperset.accel.fused.fold_ff``) and the step sizes gamma (y's shape, or broadcast to it): the feedforward
    step in one call; None where the kernel cannot run it."""
    d = y.shape[-1]
    if not _fits(y, Ds, Dg.transpose(0, 1)) or Ds.shape != Dg.shape or Ds.shape[0] != d:
        return None
    if gamma.dtype != torch.float32 or gamma.device != y.device:
        return None
    return torch.ops.hyperset.ff_update(y, gamma.expand_as(y), Ds, Dg, float(eps))


def relu_energy(x: Tensor, D: Tensor, eps: float) -> Tensor | None:
    """-1/2 sum_i |ReLU(u_i)|^2 / (mean(u_i^2) + eps) over the rows u_i = x_i D of each sample of x (B, N, d) ->
    (B,): the normalised ReLU energy E_FF from x and D, U never written; None where the kernel cannot run it."""
    if x.dim() != 3 or not _fits(x, D) or x.shape[-1] != D.shape[0]:
        return None
    return torch.ops.hyperset.relu_energy_x(x, D, float(eps))


def project_heads(x: Tensor, w: Tensor, heads: int, eps: float) -> Tensor | None:
    """The head projections of x (B, N, d) by w (d, n) on their spheres, (B, heads, N, n / heads): each head's row z
    of x w as z / sqrt(mean(z^2) + eps), in one call; None where the kernel cannot run it."""
    if x.dim() != 3 or not _fits(x, w) or x.shape[-1] != w.shape[0] or w.shape[1] % heads:
        return None
    return torch.ops.hyperset.project_heads(x, w, int(heads), float(eps))
