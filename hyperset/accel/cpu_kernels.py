"""The bi-softmax attention maps fused per (board, head) in a C kernel, for fp32 on x86 CPUs with AVX-512 or AVX2.

The fused attention operator (`hyperset.accel.fused.bisoftmax_grad`) spends most of its time outside the feedforward on
the attention maps: per iteration a batch of B*H maps of N x N (256 of 81 x 81 at the Sudoku configuration,
6.6 MB) goes through two batched products, a softmax and a transposed add forward, and three products, two
transposed adds and the softmax's derivative backward, each a pass over memory. ``kernels/bisoftmax.c`` does the
whole chain for one (board, head) at a time, so its map never leaves the core's cache, and saves only
P = softmax(beta Zn Zn^T) for the backward pass (S = P + P^T is recomputed there from P):

- forward: P and G = (P + P^T) Zn from Zn;
- backward: dZn = S dG + (dP + dP^T) Zn from Zn, P and dG, dP the softmax's derivative along
  beta (dG Zn^T + Zn dG^T);
- inference (`bisoftmax_attention`, from ``hyperset.energies.attn_energy_grad_heads`` where no gradient is taken
  through it): G alone, P not written; where every score is bounded (|beta z_i.z_j| <= 80 by Cauchy-Schwarz from
  the rows' norms, as on the layer's spheres), from the symmetric scores' upper triangle, each pair's exponential
  made once and no max taken;
- the energy at inference (`bisoftmax_energy`, from ``hyperset.energies.attn_energy_heads``, the trace's E_ATTN):
  sum_i logsumexp_j(beta Zn Zn^T)_ij, the map never stored (bounded scores as for the attention);
- the feedforward at inference: its normalised ReLU for the update (`relu_rms`: ReLU(U) scaled by each row's
  1/rms, one call, for ``hyperset.accel.fused.folded_relu_rows``) and the trace's E_FF (`relu_energy`, one pass
  over U per board).

The values are the library path's within fp32 rounding (exp by Cephes' polynomial; the tests compare with it).
The products of these small batched shapes run on MKL in PyTorch's x86 wheels, far below the CPU's peak on AMD
CPUs; what the kernel buys is measured by bench/peer_bench.py (``--cpu-kernels off`` against ``on``, the same
rounds) and stated in docs/sudoku.md, "Speed".

The kernel is compiled on first use with the C compiler (``$CC``, else ``cc``; the flags name the instruction set
it needs, not the build machine: the AVX-512 subsets where PyTorch runs its own kernels at AVX-512, else AVX2 and
FMA, `ISA_FLAGS`) into ``$HYPERSET_CACHE_DIR``, else ``$XDG_CACHE_HOME/hyperset``, else ``~/.cache/hyperset``, and
loaded with ctypes; where that cannot be done (no compiler, neither instruction set, not x86) the operator runs on
PyTorch's calls as before, and `status` says why. It runs on ``torch.get_num_threads()`` threads,
each on its own share of the batch. Which: ``$HYPERSET_CPU_KERNELS`` (auto, on, off) or `using_cpu_kernels`;
``auto`` (the default) uses it where it was measured faster than PyTorch's calls: on x86 CPUs with AVX-512 of a known
vendor (AMD EPYCs, an Intel Xeon) and on those with AVX2 not made by Intel; on Intel CPUs with AVX2 alone it is
unmeasured, and ``on`` asks for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from .. import cbuild, device

CHOICES = ("auto", "on", "off")
SOURCE = Path(__file__).with_name("kernels") / "bisoftmax.c"
FLAGS = ("-O3", "-std=c11", "-shared", "-fPIC")
ISA_FLAGS = {"avx512": ("-mavx512f", "-mavx512vl", "-mavx512dq", "-mfma"), "avx2": ("-mavx2", "-mfma")}
MAX_TOKENS = 512  # scratch per thread: three maps of N x N
MIN_SHARE = 2 << 20  # multiply-adds: the least share of a call handed to another thread

_pools: dict[int, ThreadPoolExecutor] = {}


def isa() -> str | None:
    """The kernel's instruction set on this CPU, as PyTorch reads it: "avx512", "avx2" or None (not x86, or
    neither)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return "avx512" if capability in ("AVX512", "AVX512_BF16", "AMX") else "avx2" if capability == "AVX2" else None


def build_flags(which: str | None = None) -> tuple[str, ...]:
    """The compiler flags of a kernel built for the instruction set `which` ("avx512" or "avx2"; default this CPU's,
    `isa`, else AVX2)."""
    return (*FLAGS, *ISA_FLAGS[which or isa() or "avx2"])


def _resolve(name: str) -> bool:
    if name not in CHOICES:
        raise ValueError(f"CPU kernels {name!r}: expected one of {', '.join(CHOICES)}")
    if name == "auto":
        found, vendor = isa(), device.cpu_vendor()
        return found is not None and vendor is not None and (found == "avx512" or vendor != "GenuineIntel")
    return name == "on" and isa() is not None


def env_choice(variable: str, choices: tuple[str, ...]) -> str:
    """The value of an environment variable among `choices` (the first, "auto", where unset or empty); another
    value warns and is taken as the first."""
    choice = os.environ.get(variable, choices[0]).strip().lower() or choices[0]
    if choice not in choices:
        warnings.warn(f"{variable}={choice!r} is not one of {', '.join(choices)}: using {choices[0]}", stacklevel=3)
        choice = choices[0]
    return choice


def eager_or_compiled() -> bool:
    """Running in eager mode or under torch.compile: not in a trace or an ONNX export, nor under torch.func's
    transforms (which the library's own operators do not support)."""
    return (not torch.jit.is_tracing() and not device.in_onnx_export()
            and (torch.compiler.is_compiling() or not torch._C._are_functorch_transforms_active()))


_wanted = _resolve(env_choice("HYPERSET_CPU_KERNELS", CHOICES))


@contextlib.contextmanager
def switched(module: Any, name: str) -> Iterator[bool]:
    """A kernel module's `_wanted` as its `_resolve(name)` decides, inside the block, for the whole process; yields
    it."""
    before, module._wanted = module._wanted, module._resolve(name)
    try:
        yield module._wanted
    finally:
        module._wanted = before


def using_cpu_kernels(name: str) -> contextlib.AbstractContextManager[bool]:
    """The kernel on (``on``), off or as ``auto`` decides, inside the block, for the whole process (a compiled model
    made inside recompiles outside); yields whether it is wanted (``on`` off x86 or without AVX2 is off)."""
    return switched(sys.modules[__name__], name)


def _build() -> ctypes.CDLL:
    """Compile the kernel (once per source and flags) and load it."""
    handle = cbuild.load(SOURCE, build_flags())
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    handle.hs_bisoftmax_forward.argtypes = [i64, i64, i64, i64, f32, ptr, ptr, ptr]
    handle.hs_bisoftmax_backward.argtypes = [i64, i64, i64, i64, f32, ptr, ptr, ptr, ptr]
    handle.hs_bisoftmax_energy.argtypes = [i64, i64, i64, i64, f32, ptr, ptr]
    handle.hs_relu_rms_rows.argtypes = [i64, i64, i64, f32, ptr, ptr]
    handle.hs_relu_energy.argtypes = [i64, i64, i64, i64, f32, ptr, ptr]
    handle.hs_bisoftmax_attention_heads.argtypes = [i64, i64, i64, i64, i64, f32, ptr, ptr, ptr]
    handle.hs_heads_rms.argtypes = [i64, i64, i64, i64, i64, f32, ptr, ptr]
    for fn in (handle.hs_bisoftmax_forward, handle.hs_bisoftmax_backward, handle.hs_bisoftmax_energy,
               handle.hs_relu_rms_rows, handle.hs_relu_energy, handle.hs_bisoftmax_attention_heads,
               handle.hs_heads_rms):
        fn.restype = ctypes.c_int
    return handle


_loaded = cbuild.Loaded(_build)
_library = _loaded.get


def status() -> str:
    """"on" (built for `isa()`), or why the kernel is not used here: "off" (not wanted), "off (needs an x86 CPU
    with AVX2 or AVX-512)", or "off (...)" with the reason it could not be built or loaded."""
    if not _wanted:
        return "off" if isa() is not None else "off (needs an x86 CPU with AVX2 or AVX-512)"
    return "on" if _library() is not None else f"off ({_loaded.why_not})"


def usable(z: Tensor) -> bool:
    """Whether the attention maps of z (..., N, p) run in the kernel: wanted, fp32 on a CPU without autocast,
    N <= MAX_TOKENS, in eager mode or under torch.compile (not in a trace, an export or torch.func's transforms),
    and built."""
    return (_wanted and z.device.type == "cpu" and z.dtype == torch.float32 and z.dim() >= 3
            and z.shape[-2] <= MAX_TOKENS and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_exporting() and eager_or_compiled() and _library() is not None)


def threads_for(batch: int, per_item: int) -> int:
    """How many of torch.get_num_threads() threads a kernel call over `batch` items of `per_item` multiply-adds each
    takes: no more than the items, and each thread's share at least MIN_SHARE (handing a share to another thread
    costs tens of microseconds, a board's product of its state by a 128 x 128 weight about as much)."""
    threads = min(torch.get_num_threads(), batch)
    if MIN_SHARE:
        threads = min(threads, batch * per_item // MIN_SHARE)
    return max(1, threads)


def _run(fn, batch: int, *args, per_item: int) -> None:
    """fn(b0, b1, *args) over the batch, on `threads_for(batch, per_item)` threads (ctypes lets go of the GIL);
    per_item: an item's multiply-adds, 8 for each value an elementwise pass reads."""
    threads = threads_for(batch, per_item)
    if threads <= 1:
        failed = fn(0, batch, *args) != 0
    else:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools.setdefault(threads, ThreadPoolExecutor(threads, thread_name_prefix="hyperset-kernel"))
        cuts = [batch * t // threads for t in range(threads + 1)]
        failed = any(r != 0 for r in pool.map(lambda t: fn(cuts[t], cuts[t + 1], *args), range(threads)))
    if failed:
        raise MemoryError("the attention-map kernel could not allocate its scratch memory")


def define_op(name: str, schema: str, kernel: Callable[..., Any], fake: Callable[..., Any]) -> None:
    """The operator torch.ops.hyperset.NAME: `kernel` on CPU tensors, `fake` its outputs' shapes for torch.compile.
    Not torch.library.custom_op, whose kernels import torch._dynamo at their first call: about as long as importing
    torch, paid by every command at its first forward pass. The operators take no gradient (the autograd Functions
    of hyperset.accel.fused call them forward and backward)."""
    qualname = f"hyperset::{name}"
    torch.library.define(qualname, schema)
    torch.library.impl(qualname, "CPU", kernel)
    torch.library.register_fake(qualname, fake)


def _maps(z: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    z = z.contiguous()
    b, n, p = z.shape
    P, G = z.new_empty(b, n, n), torch.empty_like(z)
    _run(_library().hs_bisoftmax_forward, b, n, p, beta, z.data_ptr(), P.data_ptr(), G.data_ptr(),
         per_item=3 * n * n * p)
    return P, G


def _maps_fake(z: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    b, n, p = z.shape
    return z.new_empty(b, n, n), z.new_empty(b, n, p)


def _maps_backward(z: Tensor, P: Tensor, dG: Tensor, beta: float) -> Tensor:
    z, P, dG = z.contiguous(), P.contiguous(), dG.contiguous()
    b, n, p = z.shape
    dz = torch.empty_like(z)
    _run(_library().hs_bisoftmax_backward, b, n, p, beta, z.data_ptr(), P.data_ptr(), dG.data_ptr(), dz.data_ptr(),
         per_item=5 * n * n * p)
    return dz


def _attention(z: Tensor, beta: float) -> Tensor:
    z = z.contiguous()
    b, n, p = z.shape
    G = torch.empty_like(z)
    _run(_library().hs_bisoftmax_forward, b, n, p, beta, z.data_ptr(), None, G.data_ptr(), per_item=3 * n * n * p)
    return G


def _per_sample(kernel: str, x: Tensor, scalar: float, per_value: int) -> Tensor:
    """A kernel's number per sample of x (B, N, width): kernel(b0, b1, N, width, scalar, x, out); per_value: its
    multiply-adds per value of x."""
    x = x.contiguous()
    b, n, width = x.shape
    E = x.new_empty(b)
    _run(getattr(_library(), kernel), b, n, width, scalar, x.data_ptr(), E.data_ptr(), per_item=per_value * n * width)
    return E


def _per_sample_fake(x: Tensor, scalar: float) -> Tensor:
    return x.new_empty(x.shape[0])


def _energy(z: Tensor, beta: float) -> Tensor:
    return _per_sample("hs_bisoftmax_energy", z, beta, z.shape[-2])


def _relu_rms(u: Tensor, eps: float) -> Tensor:
    u = u.contiguous()
    m = u.shape[-1]
    V = torch.empty_like(u)
    _run(_library().hs_relu_rms_rows, u.numel() // m, m, eps, u.data_ptr(), V.data_ptr(), per_item=8 * m)
    return V


def _relu_energy(u: Tensor, eps: float) -> Tensor:
    return _per_sample("hs_relu_energy", u, eps, 8)


def _like_z(z: Tensor, *args: Any) -> Tensor:
    return torch.empty_like(z)


def _attention_heads(zn: Tensor, g: Tensor, beta: float) -> Tensor:
    zn, g = zn.contiguous(), g.contiguous()
    b, h, n, p = zn.shape
    Gm = zn.new_empty(b, n, h * p)
    _run(_library().hs_bisoftmax_attention_heads, b * h, n, p, h, beta, zn.data_ptr(), g.data_ptr(), Gm.data_ptr(),
         per_item=3 * n * n * p)
    return Gm


def _attention_heads_fake(zn: Tensor, g: Tensor, beta: float) -> Tensor:
    b, h, n, p = zn.shape
    return zn.new_empty(b, n, h * p)


def _heads_rms(xw: Tensor, heads: int, eps: float) -> Tensor:
    xw = xw.contiguous()
    b, n, d = xw.shape
    Zn = xw.new_empty(b, heads, n, d // heads)
    _run(_library().hs_heads_rms, b, n, heads, d // heads, eps, xw.data_ptr(), Zn.data_ptr(), per_item=8 * n * d)
    return Zn


def _heads_rms_fake(xw: Tensor, heads: int, eps: float) -> Tensor:
    b, n, d = xw.shape
    return xw.new_empty(b, heads, n, d // heads)


define_op("bisoftmax_maps", "(Tensor z, float beta) -> (Tensor, Tensor)", _maps, _maps_fake)
define_op("bisoftmax_maps_backward", "(Tensor z, Tensor P, Tensor dG, float beta) -> Tensor", _maps_backward,
          _like_z)
define_op("bisoftmax_attention", "(Tensor z, float beta) -> Tensor", _attention, _like_z)
define_op("bisoftmax_energy", "(Tensor z, float beta) -> Tensor", _energy, _per_sample_fake)
define_op("relu_rms", "(Tensor u, float eps) -> Tensor", _relu_rms, _like_z)
define_op("relu_energy", "(Tensor u, float eps) -> Tensor", _relu_energy, _per_sample_fake)
define_op("bisoftmax_attention_heads", "(Tensor zn, Tensor g, float beta) -> Tensor", _attention_heads,
          _attention_heads_fake)
define_op("heads_rms", "(Tensor xw, int heads, float eps) -> Tensor", _heads_rms, _heads_rms_fake)


@register_flop_formula(torch.ops.hyperset.bisoftmax_maps)
def _maps_flops(z_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    b, n, p = z_shape
    return 2 * (2 * b * n * n * p)  # Zn Zn^T, S Zn


@register_flop_formula(torch.ops.hyperset.bisoftmax_attention)
def _attention_flops(z_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    return _maps_flops(z_shape)


@register_flop_formula(torch.ops.hyperset.bisoftmax_attention_heads)
def _attention_heads_flops(zn_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    b, h, n, p = zn_shape
    return _maps_flops(torch.Size((b * h, n, p)))


@register_flop_formula(torch.ops.hyperset.bisoftmax_energy)
def _energy_flops(z_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    b, n, p = z_shape
    return 2 * b * n * n * p  # Zn Zn^T


@register_flop_formula(torch.ops.hyperset.bisoftmax_maps_backward)
def _maps_backward_flops(z_shape: torch.Size, *args, out_shape=None, **kwargs) -> int:
    b, n, p = z_shape
    return 3 * (2 * b * n * n * p)  # dG Zn^T, S dG, dS Zn


def bisoftmax_maps(z: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """(P, (P + P^T) z) for z (B*H, N, p), P = softmax(beta z z^T) over the last dimension."""
    return torch.ops.hyperset.bisoftmax_maps(z, float(beta))


def bisoftmax_attention(z: Tensor, beta: float) -> Tensor:
    """(P + P^T) z for z (..., N, p), P = softmax(beta z z^T): `bisoftmax_maps`'s G alone, for inference."""
    return torch.ops.hyperset.bisoftmax_attention(z.reshape(-1, *z.shape[-2:]), float(beta)).view(z.shape)


def bisoftmax_energy(z: Tensor, beta: float) -> Tensor:
    """sum_i logsumexp_j(beta z z^T)_ij for z (..., N, p) -> (...): the bi-softmax energy of each map times beta,
    for inference (no gradient)."""
    return torch.ops.hyperset.bisoftmax_energy(z.reshape(-1, *z.shape[-2:]), float(beta)).view(z.shape[:-2])


def bisoftmax_attention_heads(zn: Tensor, g: Tensor, beta: float) -> Tensor:
    """merge((P + P^T) (zn g)) for head-major zn (B, H, N, p) and a gain g (p,), P = softmax(beta (zn g)(zn g)^T):
    `bisoftmax_attention` of zn * g with the heads merged, (B, N, H*p), in one call (no gradient; inference)."""
    return torch.ops.hyperset.bisoftmax_attention_heads(zn, g, float(beta))


def heads_rms(xw: Tensor, heads: int, eps: float) -> Tensor:
    """The head projections of xw (B, N, H*p) on their spheres, head-major and contiguous (B, H, N, p):
    ``rms_normalize(split_heads(xw, heads), eps)`` in one pass (no gradient; inference)."""
    return torch.ops.hyperset.heads_rms(xw, int(heads), float(eps))


def relu_rms(u: Tensor, eps: float) -> Tensor:
    """ReLU(u) / sqrt(mean(u^2) + eps) per row of u (..., M), the rms over the whole row, in one call: the
    feedforward's normalised ReLU with its gain folded into the weights, at inference (no gradient)."""
    return torch.ops.hyperset.relu_rms(u, float(eps))


def relu_energy(u: Tensor, eps: float) -> Tensor:
    """-1/2 sum_i |ReLU(u_i)|^2 / (mean(u_i^2) + eps) over the rows u_i of each sample of u (B, N, M) -> (B,): the
    normalised ReLU energy E_FF of hidden activations u = X D, in one pass over u, at inference (no gradient)."""
    return torch.ops.hyperset.relu_energy(u, float(eps))


def bisoftmax_maps_backward(z: Tensor, P: Tensor, dG: Tensor, beta: float) -> Tensor:
    """The directional derivative of z -> (P + P^T) z along dG: S dG + (dP + dP^T) z."""
    return torch.ops.hyperset.bisoftmax_maps_backward(z, P, dG, float(beta))

