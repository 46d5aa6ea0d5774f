"""FLOP and byte model of a Hyper-SET model, and this machine's matmul roofline at the model's shapes.

    python bench/flops.py                                    # the authors' Sudoku configuration at d=128, batch 64
    python bench/flops.py --preset sudoku-cpu --batch 32     # the shipped recipe
    python bench/flops.py --set dim=256 --set heads=8 --iters 12 --threads 1

The model is a list of the matmuls one training step or one forward pass runs (`matmuls`), each named, sized and
given to a component: projections (X W and the back-projection), attention_maps (Z Z^T and S Z per head),
feedforward (X D and act(U) D^T), step_sizes (L3 per token and the time MLP L1, L2 once per iteration for the
whole batch; once per pass when they do not depend on t, see `steps_once`, and at every iteration with
`steps_every_t`, as the authors' code makes them), readout (the head), stem
(the patch embedding), lora and energies (the trace's X W, Z Z^T, X D).
A training step adds, for every matmul C = A B, the two of its backward (dA = dC B^T, dB = A^T dC) where the operand
needs a gradient. FLOPs are 2 per multiply-add, as torch.utils.flop_counter counts them (the test checks the count
against it for several configs). Elementwise work (norms, softmax, GELU, residual updates) is not in the FLOPs: it
is in the bytes.

Bytes are the traffic of an unfused fp32 run in which nothing stays in cache from one op to the next: every matmul
reads its operands and writes its result, every elementwise op of the Hyper-SET layer reads its inputs and writes
its output once. It is a model of the memory a step touches (an upper bound on DRAM traffic when the activations
do not fit in cache), not a measurement. Training is taken as 3x the forward bytes (the backward of each op reads
its saved input and the incoming gradient and writes a gradient per input). Elementwise traffic is modelled for the
Hyper-SET layer; for the baselines the bytes are those of their matmuls only.

The roofline is measured in the same run: every distinct matmul shape of the model (forward, and for training the
backward ones with their transposed operands) is timed with torch at the chosen number of threads, in fp32, and in
bf16 where the CPU has native bf16 (avx512_bf16 or amx_bf16). The time the model's matmuls alone would need at those
rates bounds the boards/s from above: `roofline_boards_per_s`. A measured rate divided by it is the share of the
roofline. Writes bench/results/flops.json.

That roofline is at PyTorch's own rates: ATen's matmul (MKL in the PyPI wheels for x86) and, for fp32 products of
one matrix by another, oneDNN's GEMM, which the library's layer runs its main products on where it is chosen
(`hyperset.accel.fused.matmul`; on x86 CPUs not made by Intel): each such shape at the faster of the two (both rates are
in the JSON's shapes, `flops_per_s_by_library`). Whether it is also the CPU's limit depends on the CPU. With
`--other-blas` the same fp32 shapes are timed with numpy's BLAS (OpenBLAS in the PyPI wheels) in a subprocess at the
same thread count, and the JSON gets `roofline_other_blas`: the rooflines at those rates, and the library's name,
and `roofline_best_of_libraries`: the rooflines at the better of the two at each shape. Where they are higher, the
other library shows what the CPU can do that PyTorch's matmuls leave: on an AMD EPYC (Zen 4) OpenBLAS ran the Sudoku
model's fp32 training matmuls 1.15-1.6x faster than MKL alone, and its batched products (the attention maps) faster
than PyTorch's at any setting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import bench_args
import torch
from call_timing import seconds_per_call

from hyperset.accel import cpu_gemm, cpu_kernels, fused
from hyperset.checkpoint import atomic_write_json
from hyperset.config import ModelConfig
from hyperset.device import cpu_has_native_bf16, cpu_model

RESULTS = Path(__file__).resolve().parent / "results"
COMPONENTS = ("projections", "attention_maps", "feedforward", "step_sizes", "lora", "readout", "stem", "energies")
BYTES = 4  # fp32
# the authors' Sudoku model at d=128 (their code's defaults otherwise: time embedding 512, zero time network)
PEER_D128 = ["dim=128", "heads=4", "ff_hidden=512", "iters=24", "time_init=zero"]


@dataclass(frozen=True)
class MatMul:
    """`count` products of an (m x k) by a (k x n) matrix; `once`: per pass, else per iteration.

    `layout` says which operand is a transposed view ("nn", "tn", "nt", "tt"), as autograd's backward calls them.
    """

    component: str
    name: str
    m: int
    k: int
    n: int
    count: int = 1
    once: bool = False
    grad_a: bool = True
    grad_b: bool = True
    layout: str = "nn"

    @property
    def flops(self) -> int:
        return 2 * self.count * self.m * self.k * self.n

    @property
    def bytes(self) -> int:
        return BYTES * self.count * (self.m * self.k + self.k * self.n + self.m * self.n)

    def backward(self) -> list[MatMul]:
        """dA = dC B^T (m x n by n x k) and dB = A^T dC (k x m by m x n), where the operand needs a gradient."""
        out = []
        if self.grad_a:
            out.append(replace(self, name=f"d/dA {self.name}", k=self.n, n=self.k, layout="nt"))
        if self.grad_b:
            out.append(replace(self, name=f"d/dB {self.name}", m=self.k, k=self.m, layout="tn"))
        return out


def tokens(cfg: ModelConfig) -> int:
    return cfg.patch_grid**2 + 1 if cfg.task == "classify" else cfg.seq_len


def _attention_maps(cfg: ModelConfig, batch: int, component: str = "attention_maps") -> list[MatMul]:
    """The per-head matmuls of the attention energy's gradient (or of softmax attention for the baselines)."""
    N, p, bh = tokens(cfg), cfg.head_dim, batch * cfg.heads
    if cfg.layer == "hyperset" and cfg.attention == "linear":
        return [MatMul(component, "phi(Z)^T phi(Z)", p, N, p, bh), MatMul(component, "phi(Z) K", N, p, p, bh)]
    return [MatMul(component, "Z Z^T", N, p, N, bh), MatMul(component, "S Z", N, N, p, bh)]


def _lora(cfg: ModelConfig, component: str) -> list[MatMul]:
    """The depth-wise LoRA deltas B_t A_t of W and D, made once per iteration (again for the energies)."""
    d, r, M = cfg.dim, cfg.lora_rank, cfg.ff_hidden
    return [MatMul(component, "B_t A_t (W)", d, r, d), MatMul(component, "B'_t A'_t (D)", d, r, M)]


def steps_once(cfg: ModelConfig) -> bool:
    """Whether the step sizes are made once per pass, at inference and in an eager training step
    (hyperset.core.RecurrentCore._fixed_steps): they are conditioned on x0 and the time network gives every t the
    same output (the authors' zero init leaves it dead; a config says so by time_init "zero")."""
    return cfg.step == "adaptive" and cfg.step_cond == "x0" and cfg.time_mlp and cfg.time_init == "zero"


def _hyperset_layer(cfg: ModelConfig, batch: int, steps_every_t: bool = False) -> list[MatMul]:
    R, d, M = batch * tokens(cfg), cfg.dim, cfg.ff_hidden
    once = steps_once(cfg) and not steps_every_t
    mms = [MatMul("projections", "X W", R, d, d), *_attention_maps(cfg, batch),
           MatMul("projections", "G W^T", R, d, d),
           MatMul("feedforward", "X D", R, d, M), MatMul("feedforward", "act(U) D^T", R, M, d)]
    if cfg.lora_rank:
        mms += _lora(cfg, "lora")
    if cfg.step == "adaptive":
        if cfg.time_mlp:  # one time embedding per iteration, shared by the batch; sin(t) needs no gradient
            mms += [MatMul("step_sizes", "L1 sin(t)", 1, cfg.time_dim, d, grad_a=False, once=once),
                    MatMul("step_sizes", "L2", 1, d, d, once=once)]
        mms.append(MatMul("step_sizes", "L3 (per token)", R, d, 2 * d, once=once))
    return mms


def _baseline_layer(cfg: ModelConfig, batch: int) -> list[MatMul]:
    R, d, M = batch * tokens(cfg), cfg.dim, cfg.ff_hidden
    if cfg.layer == "transformer":
        return [*(MatMul("projections", f"X W_{w}", R, d, d) for w in "qkvo"), *_attention_maps(cfg, batch),
                MatMul("feedforward", "fc1", R, d, M), MatMul("feedforward", "fc2", R, M, d)]
    if cfg.layer in ("crate", "crate-t"):
        return [MatMul("projections", "X W", R, d, d), *_attention_maps(cfg, batch),
                MatMul("projections", "o W" if cfg.layer == "crate-t" else "to_out", R, d, d),
                MatMul("feedforward", "y D", R, d, d), MatMul("feedforward", "y D^T", R, d, d),
                MatMul("feedforward", "(y D^T) D", R, d, d)]
    raise ValueError(f"no FLOP model for layer {cfg.layer!r} (the Energy Transformer differentiates its energy "
                     "with autograd inside the forward pass)")


def _energies(cfg: ModelConfig, batch: int, shared: bool = False) -> list[MatMul]:
    """The trace's E_ATTN and E_FF after an update: X W, the per-head scores (or the linear kernel) and X D. With
    `shared`, X W is made once per pass (for the first step) instead: each energy's projections are the next
    attention step's (the ONNX Loop graph carries them, hyperset.exports.export._carries)."""
    R, d, M = batch * tokens(cfg), cfg.dim, cfg.ff_hidden
    lora = _lora(cfg, "energies") if cfg.lora_rank else []
    xw = MatMul("energies", "X W (the first step's)" if shared else "X W", R, d, d, once=shared)
    return [*lora, xw, _attention_maps(cfg, batch, "energies")[0], MatMul("energies", "X D", R, d, M)]


def _once(cfg: ModelConfig, batch: int) -> list[MatMul]:
    """The stem and the readout, once per pass."""
    d, C = cfg.dim, cfg.num_classes
    if cfg.task == "classify":
        f = (cfg.img_size // cfg.patch_grid) ** 2 * cfg.channels
        # the patches need no gradient, unless a LayerNorm with parameters comes first
        return [MatMul("stem", "patch embedding", batch * cfg.patch_grid**2, f, d, once=True,
                       grad_a=cfg.stem == "ln-linear-ln"),
                MatMul("readout", "head (CLS)", batch, d, C, once=True)]
    return [MatMul("readout", "head", batch * tokens(cfg), d, C, once=True)]


def matmuls(cfg: ModelConfig, batch: int, energies: bool = False, steps_every_t: bool = False,
            shared_projections: bool = False) -> list[MatMul]:
    """The matmuls of one forward pass, per iteration (once=False) and per pass (once=True); step sizes that do not
    depend on t are made once per pass, unless `steps_every_t` (the configuration's work as the authors' code runs
    it); `shared_projections`: the energies reuse the next step's X W (see `_energies`)."""
    layer = (_hyperset_layer(cfg, batch, steps_every_t) if cfg.layer == "hyperset"
             else _baseline_layer(cfg, batch))
    if energies:
        if cfg.layer != "hyperset":
            raise ValueError(f"layer {cfg.layer!r} defines no energies")
        layer += _energies(cfg, batch, shared_projections)
    return layer + _once(cfg, batch)


def training_matmuls(cfg: ModelConfig, batch: int, steps_every_t: bool = False) -> list[MatMul]:
    """Forward and backward matmuls of one training step (no trace; the loss on the last iteration)."""
    forward = matmuls(cfg, batch, steps_every_t=steps_every_t)
    return forward + [b for mm in forward for b in mm.backward()]


def elementwise_bytes(cfg: ModelConfig, batch: int, energies: bool = False,
                      once_steps: bool = False) -> dict[str, int]:
    """Per-iteration bytes read + written by the Hyper-SET layer's elementwise ops, by component (see module doc);
    `once_steps`: the step sizes are made once per pass (`steps_once`)."""
    if cfg.layer != "hyperset":
        return {}
    R, d, M, H, N = batch * tokens(cfg), cfg.dim, cfg.ff_hidden, cfg.heads, tokens(cfg)
    S = batch * H * N * N  # attention-map elements
    rms = 7  # x^2 (r+w), mean (r), x * rsqrt (r+w), * gain (r+w): elements moved per element normalised
    out = {
        # c + cond, GELU; a norm on the condition and a softplus where configured
        "step_sizes": (4 * R * d + (rms - 2) * R * d * (cfg.step_norm != "none")
                       + 4 * R * d * (cfg.step_sign == "positive")) if cfg.step == "adaptive" else 0,
        # RMSNorm of Z, merge heads (copy), alpha * G, x - (.)
        "projections": rms * R * d + 2 * R * d + 3 * R * d + 3 * R * d,
        # beta Z, softmax, P + P^T
        "attention_maps": 2 * R * d + 2 * S + 3 * S,
        # ReLU: the norm of U (r), ReLU (r+w), 1/rms(U) * (.) after D^T, gamma * (.), x + (.) (the RMSNorm folded
        # into the weights, hyperset.layers.HyperSETLayer.ff_descent); other activations: RMSNorm of U, activation
        "feedforward": (R * M + 2 * R * M + 3 * R * d if cfg.feedforward == "relu" else rms * R * M + 2 * R * M)
                       + 3 * R * d + 3 * R * d,
    }
    if once_steps:
        out["step_sizes"] = 0  # made once per pass
    if energies:  # RMSNorm of Z without gain, beta Z, logsumexp; the norms of U and ReLU(U), ReLU
        out["energies"] = 5 * R * d + 2 * R * d + S + batch * H * N + R * M + 2 * R * M + R * M
    return {k: BYTES * v for k, v in out.items()}


def _by_component(mms: list[MatMul], key: str, once: bool) -> dict[str, int]:
    out = {c: 0 for c in COMPONENTS}
    for mm in mms:
        if mm.once == once:
            out[mm.component] += getattr(mm, key)
    return {k: v for k, v in out.items() if v}


def count(cfg: ModelConfig, batch: int, iters: int | None = None, energies: bool = False,
          steps_every_t: bool = False) -> dict[str, Any]:
    """FLOPs and bytes per board: per iteration and per pass by component, forward (inference, with or without the
    energy trace) and training step (forward + backward), at `iters` iterations per layer; with `steps_every_t`
    the step sizes are made at every iteration (the authors' code). With the trace, the energy's head projections
    are the next step's (`shared_projections`), as inference runs them, where the weights are the same at every t
    (no depth-wise LoRA: hyperset.accel.reuse hands on projections of the same weight only)."""
    steps = (cfg.iters if iters is None else iters) * cfg.n_layers
    fwd = matmuls(cfg, batch, energies, steps_every_t, shared_projections=energies and cfg.lora_rank == 0)
    train = training_matmuls(cfg, batch, steps_every_t)
    ew = elementwise_bytes(cfg, batch, energies, steps_once(cfg) and not steps_every_t)
    flops_it, flops_once = _by_component(fwd, "flops", False), _by_component(fwd, "flops", True)
    bytes_it = _by_component(fwd, "bytes", False)
    for k, v in ew.items():
        bytes_it[k] = bytes_it.get(k, 0) + v
    bytes_once = _by_component(fwd, "bytes", True)

    def total(per_it: dict[str, int], once: dict[str, int]) -> float:
        return (steps * sum(per_it.values()) + sum(once.values())) / batch

    train_it, train_once = _by_component(train, "flops", False), _by_component(train, "flops", True)
    forward_bytes = total(bytes_it, bytes_once)
    return {
        "batch": batch, "iterations": steps, "energies": energies,
        "forward_flops_per_iteration": {k: v / batch for k, v in flops_it.items()},
        "forward_flops_per_pass": {k: v / batch for k, v in flops_once.items()},
        "forward_bytes_per_iteration": {k: v / batch for k, v in bytes_it.items()},
        "training_flops_per_iteration": {k: v / batch for k, v in train_it.items()},
        "forward_flops": total(flops_it, flops_once),
        "training_flops": total(train_it, train_once),
        "forward_bytes": forward_bytes,
        "training_bytes": 3 * forward_bytes,
        "forward_intensity_flops_per_byte": total(flops_it, flops_once) / forward_bytes,
    }


# ---------------------------------------------------------------------------------------------- the roofline


def _operands(mm: MatMul, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a_t, b_t = mm.layout[0] == "t", mm.layout[1] == "t"  # which operand is a transposed view
    a_shape = (mm.count, mm.k, mm.m) if a_t else (mm.count, mm.m, mm.k)
    b_shape = (mm.count, mm.n, mm.k) if b_t else (mm.count, mm.k, mm.n)
    a, b = torch.randn(a_shape).to(dtype), torch.randn(b_shape).to(dtype)
    a = a.transpose(-1, -2) if a_t else a
    b = b.transpose(-1, -2) if b_t else b
    return (a[0], b[0]) if mm.count == 1 else (a, b)


def last_level_cache_bytes(caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest CPU cache's size (Linux sysfs: `caches`/index*/size, "48K", "2048K"), None where not readable."""
    sizes = []
    for index in caches.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


COLD_MIN_BYTES = 256 << 20  # what the cold timing's copies fill at least (where the cache size is unknown)
COLD_MAX_COPIES = 512


def onednn_applies(mm: MatMul, dtype: torch.dtype) -> bool:
    """Whether oneDNN's GEMM (`hyperset.accel.fused.matmul`'s other library) can run mm in this PyTorch: an fp32 product
    of one matrix by another, on x86 with oneDNN built in."""
    return dtype == torch.float32 and mm.count == 1 and fused.onednn_here()


def time_matmul(mm: MatMul, dtype: torch.dtype = torch.float32, min_seconds: float = 0.02,
                repeats: int = 3, cold: bool = False, library: str = "aten") -> float:
    """FLOP/s of one matmul shape: best of `repeats` runs of enough calls to take `min_seconds`, with ATen's
    ``torch.matmul`` or (`library` "onednn", warm only) oneDNN's GEMM as `hyperset.accel.fused.matmul` calls it.
    Warm (the
    roofline's timing), every call takes the same operands, which stay in cache. With `cold` the calls go round
    copies of the operands and of the output that together fill twice the last-level cache (at least
    `COLD_MIN_BYTES`, at most `COLD_MAX_COPIES` copies), so each call reads its operands from memory and writes to
    an output that is not in cache: the rate of a product whose operands an earlier op wrote out to memory."""
    a, b = _operands(mm, dtype)
    if library == "onednn":
        if cold or not onednn_applies(mm, dtype):
            raise ValueError(f"oneDNN's GEMM is timed warm, for fp32 products of one matrix by another: {mm}")
        call = lambda i: fused._onednn_mm(a, b)  # noqa: E731
    elif not cold:
        call = lambda i: torch.matmul(a, b)  # noqa: E731
    else:
        out = torch.matmul(a, b)
        size = sum(t.numel() * t.element_size() for t in (a, b, out))
        copies = min(COLD_MAX_COPIES, max(2, -(-2 * max(last_level_cache_bytes() or 0, COLD_MIN_BYTES) // size)))
        sets = [(a.clone(), b.clone(), torch.empty_like(out)) for _ in range(copies)]  # clones keep the layouts

        def call(i: int) -> None:
            sa, sb, so = sets[i % copies]
            torch.matmul(sa, sb, out=so)
    call(0)
    return mm.flops / seconds_per_call(call, min_seconds, repeats, copies if cold else 1)


def _shape_key(mm: MatMul) -> tuple[int, int, int, int, str]:
    return mm.m, mm.k, mm.n, mm.count, mm.layout


def _listed_key(shape: dict[str, Any]) -> tuple[int, int, int, int, str]:
    """`_shape_key` of a shape as the rooflines list it ({"m", "k", "n", "count", "layout", ...})."""
    return shape["m"], shape["k"], shape["n"], shape["count"], shape["layout"]


# the warm fp32 rates of ATen and oneDNN by shape where `rate` timed both (for the JSON's shapes)
LIBRARY_RATES: dict[tuple, dict[str, float]] = {}


def rate(mm: MatMul, rates: dict[tuple, float], dtype: torch.dtype = torch.float32, cold: bool = False) -> float:
    """FLOP/s of mm's shape and layout (`time_matmul`, warm or `cold`), timed once per shape: `rates` caches them
    (filled in; one cache for warm rates, another for cold ones). Warm fp32 products of two matrices are timed with
    ATen's matmul and with oneDNN's GEMM (`onednn_applies`), and the rate is the faster: PyTorch offers both (the
    library's operators take oneDNN's where `hyperset.accel.fused.cpu_matmul_library` says so), so its roofline is the
    better of the two at each shape (both kept in `LIBRARY_RATES`)."""
    key = _shape_key(mm)
    if key not in rates:
        rates[key] = time_matmul(mm, dtype, cold=cold)
        if not cold and onednn_applies(mm, dtype):
            LIBRARY_RATES[key] = {"aten": rates[key], "onednn": time_matmul(mm, dtype, library="onednn")}
            rates[key] = max(LIBRARY_RATES[key].values())
    return rates[key]


def roofline(mms: list[MatMul], steps: int, batch: int, dtype: torch.dtype = torch.float32,
             rates: dict[tuple, float] | None = None) -> dict[str, Any]:
    """Boards/s if the matmuls ran at their measured rates and nothing else took time. `rates` caches FLOP/s by
    shape across calls (and is filled in)."""
    rates = {} if rates is None else rates
    seconds, flops = 0.0, 0
    for mm in mms:
        reps = 1 if mm.once else steps
        seconds += reps * mm.flops / rate(mm, rates, dtype)
        flops += reps * mm.flops
    return {"dtype": str(dtype).removeprefix("torch."), "seconds_per_batch": seconds,
            "roofline_boards_per_s": batch / seconds, "matmul_flops_per_s": flops / seconds}


def measure_rooflines(cfg: ModelConfig, batch: int, iters: int | None = None, energies: bool = False,
                      steps_every_t: bool = False,
                      cache: dict[str, dict[tuple, float]] | None = None) -> dict[str, Any]:
    """fp32 (and bf16 where native) rooflines for inference and a training step at this config and batch; with
    `steps_every_t` for the work of step sizes made at every iteration (see `count`). `cache` ({dtype name: rates
    by shape}) lets several calls time each shape once."""
    dtypes = [torch.float32] + ([torch.bfloat16] if cpu_has_native_bf16() else [])
    cache = {} if cache is None else cache
    out = {str(dtype).removeprefix("torch."): _rooflines_at(cfg, batch, iters, energies, steps_every_t, dtype,
                                                           cache.setdefault(str(dtype).removeprefix("torch."), {}))
           for dtype in dtypes}
    for shape in out["float32"]["shapes"]:  # each library's rate beside the better of the two
        key = _listed_key(shape)
        if key in LIBRARY_RATES:
            shape["flops_per_s_by_library"] = dict(LIBRARY_RATES[key])
    return out


def best_of_rooflines(cfg: ModelConfig, batch: int, iters: int | None, steps_every_t: bool,
                      *timed: dict[str, Any]) -> dict[str, Any]:
    """The fp32 inference and training rooflines at the best rate any of `timed` (fp32 rooflines of the same
    config with their shapes: PyTorch's from `measure_rooflines`, numpy's from `other_blas_rooflines`) reached at
    each shape: the least time the CPU is known to need for the matmuls."""
    rates: dict[tuple, float] = {}
    for roof in timed:
        for shape in roof["shapes"]:
            key = _listed_key(shape)
            rates[key] = max(rates.get(key, 0.0), shape["flops_per_s"])
    return _rooflines_at(cfg, batch, iters, False, steps_every_t, torch.float32, rates)


def _rooflines_at(cfg: ModelConfig, batch: int, iters: int | None, energies: bool, steps_every_t: bool,
                  dtype: torch.dtype, rates: dict[tuple, float]) -> dict[str, Any]:
    """The inference and training rooflines at `rates` (FLOP/s by shape; shapes missing from it are timed with
    torch and filled in), and the rates by shape."""
    steps = (cfg.iters if iters is None else iters) * cfg.n_layers
    return {"inference": roofline(matmuls(cfg, batch, energies, steps_every_t), steps, batch, dtype, rates),
            "training": roofline(training_matmuls(cfg, batch, steps_every_t), steps, batch, dtype, rates),
            "shapes": [{"m": k[0], "k": k[1], "n": k[2], "count": k[3], "layout": k[4], "flops_per_s": r}
                       for k, r in rates.items()]}


# timed in a fresh interpreter, so that the thread-count variables are read before numpy loads its BLAS
_OTHER_BLAS_TIMING = r"""
import json, sys
sys.path.insert(0, sys.argv[3])  # bench/, for call_timing (which imports neither torch nor numpy)
from call_timing import seconds_per_call
import numpy as np
shapes, min_seconds = json.loads(sys.argv[1]), float(sys.argv[2])
rng = np.random.default_rng(0)
rates = []
for m, k, n, count, layout in shapes:
    a = rng.standard_normal((count, k, m) if layout[0] == "t" else (count, m, k), dtype=np.float32)
    b = rng.standard_normal((count, n, k) if layout[1] == "t" else (count, k, n), dtype=np.float32)
    a = a.swapaxes(-1, -2) if layout[0] == "t" else a
    b = b.swapaxes(-1, -2) if layout[1] == "t" else b
    a, b = (a[0], b[0]) if count == 1 else (a, b)
    np.matmul(a, b)
    rates.append(2 * count * m * k * n / seconds_per_call(lambda i: np.matmul(a, b), min_seconds))
try:
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    name = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
except Exception:
    name = "unknown"
print(json.dumps({"rates": rates, "library": f"numpy {np.__version__}, {name}"}))
"""


def other_blas_rooflines(cfg: ModelConfig, batch: int, iters: int | None, threads: int,
                         steps_every_t: bool = False, min_seconds: float = 0.02) -> dict[str, Any]:
    """The fp32 inference and training rooflines at the rates numpy's BLAS reaches at the same shapes and layouts,
    `threads` threads (timed in a subprocess: OPENBLAS_NUM_THREADS, OMP_NUM_THREADS and MKL_NUM_THREADS set). A
    `bench_args.BenchInputError` where that subprocess fails (numpy not installed)."""
    mms = matmuls(cfg, batch, False, steps_every_t) + training_matmuls(cfg, batch, steps_every_t)
    rates, library = other_blas_rates([_shape_key(mm) for mm in mms], threads, min_seconds)
    return {"library": library, "threads": threads,  # every shape is in `rates`: nothing is timed with torch
            "float32": _rooflines_at(cfg, batch, iters, False, steps_every_t, torch.float32, rates)}


def other_blas_rates(keys: list[tuple], threads: int, min_seconds: float = 0.02) -> tuple[dict[tuple, float], str]:
    """({shape key: fp32 FLOP/s of numpy's matmul}, numpy's BLAS by name) at `threads` threads, timed in a fresh
    interpreter (the thread-count variables set before numpy loads its BLAS). A `bench_args.BenchInputError` where
    that subprocess fails (numpy not installed)."""
    keys = list(dict.fromkeys(keys))
    env = dict(os.environ) | {v: str(threads) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    run = subprocess.run([sys.executable, "-c", _OTHER_BLAS_TIMING, json.dumps(keys), str(min_seconds),
                          str(Path(__file__).resolve().parent)], env=env, capture_output=True, text=True)
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise bench_args.BenchInputError(f"--other-blas: numpy's matmuls could not be timed: {last}")
    timed = json.loads(run.stdout)
    return dict(zip(keys, timed["rates"])), timed["library"]


def ort_rates(keys: list[tuple], threads: int, min_seconds: float = 0.02) -> dict[tuple, float]:
    """{shape key: fp32 FLOP/s of ONNX Runtime's CPU MatMul / Gemm} at `threads` intra-op threads: per shape one
    graph of R independent products of the same operands (R so that a run holds about 1e7 FLOPs, which spreads the
    per-run overhead of a small product), the weight operand a constant as in an exported model. Products of two
    matrices run as a Gemm with the shape's transposes; batched products as a MatMul of operands laid out plainly
    (ONNX's MatMul has no transpose flags; an exported graph that needs one runs a Transpose first)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    out: dict[tuple, float] = {}
    rng = np.random.default_rng(0)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    for key in dict.fromkeys(keys):
        m, k, n, count, layout = key
        flops = 2 * count * m * k * n
        reps = int(min(64, max(1, 1e7 // flops)))
        if count == 1:
            a_shape, y_shape = ([k, m] if layout[0] == "t" else [m, k]), [m, n]
            b = rng.standard_normal((n, k) if layout[1] == "t" else (k, n), dtype=np.float32)
            nodes = [helper.make_node("Gemm", ["a", "b"], [f"y{i}"], transA=int(layout[0] == "t"),
                                      transB=int(layout[1] == "t")) for i in range(reps)]
        else:
            a_shape, y_shape = [count, m, k], [count, m, n]
            b = rng.standard_normal((count, k, n), dtype=np.float32)
            nodes = [helper.make_node("MatMul", ["a", "b"], [f"y{i}"]) for i in range(reps)]
        graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)],
                                  [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, y_shape)
                                   for i in range(reps)], [numpy_helper.from_array(b, "b")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = min(model.ir_version, 8)
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        feed = {"a": rng.standard_normal(a_shape, dtype=np.float32)}
        sess.run(None, feed)
        out[key] = reps * flops / seconds_per_call(lambda i, s=sess, f=feed: s.run(None, f), min_seconds)
    return out


def share(boards_per_s: float, roof: dict[str, Any]) -> float:
    """A measured rate as a share of a roofline's boards/s."""
    return boards_per_s / roof["roofline_boards_per_s"]


# ---------------------------------------------------------------------------------------------- the machine


def load_average() -> float | None:
    """The 1-minute load average (2 decimals), None where the system does not tell it."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")  # env vars that cap the SIMD


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo's text: {"cpu family": "25", "model": "17", "flags": ...}."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if not key.strip():
            if fields:
                break  # the blank line that ends the first processor's block
            continue
        fields.setdefault(key.strip(), value.strip())
    return fields


def machine(threads: int) -> dict[str, Any]:
    """Facts about this machine: CPU model (with the family and model numbers, which name the generation where a
    virtual machine's model name does not: AMD family 25 model 17 is Zen 4), cores, native bf16, its widest SIMD
    and matrix units (`simd_flags`), the SIMD level PyTorch's kernels use (`cpu_capability`) and any environment
    variables set to cap it (`isa_limits`: ATen's and torch.compile's, MKL's, oneDNN's), the library the model's
    fp32 products of a state by a weight run on (`cpu_matmul_library`, see hyperset.accel.fused.matmul), whether the
    attention maps run in hyperset.accel.cpu_kernels' kernel (`cpu_kernels`: "on", or why not), versions, the 1-minute
    load average now."""
    try:
        fields = cpuinfo_fields(Path("/proc/cpuinfo").read_text())
    except OSError:
        fields = {}
    cpu = fields.get("model name") or cpu_model()  # cpu_model reads the file again only where it has no name
    flags = fields.get("flags", "").split()
    native = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    numbers = {k: int(fields[f]) for k, f in (("cpu_family", "cpu family"), ("cpu_model_number", "model"))
               if fields.get(f, "").isdigit()}
    return {"cpu": cpu, **numbers, "logical_cpus": os.cpu_count(), "threads": threads, "native_bf16": bool(native),
            "bf16_flags": native, "simd_flags": [f for f in ("avx2", "fma", "avx512f", "amx_tile") if f in flags],
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "vendor": fields.get("vendor_id"), "cpu_matmul_library": fused.cpu_matmul_library(),
            "cpu_kernels": cpu_kernels.status(), "cpu_kernels_isa": cpu_kernels.isa(), "cpu_gemm": cpu_gemm.status(),
            "isa_limits": {k: os.environ[k] for k in ISA_LIMITS if k in os.environ},
            "torch": torch.__version__, "python": platform.python_version(),
            "load_average_1min_at_start": load_average()}


def report(cfg: ModelConfig, batch: int, iters: int | None, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    info = machine(threads)
    counts = {"inference": count(cfg, batch, iters), "inference_with_energies": count(cfg, batch, iters, True),
              "steps_every_t": count(cfg, batch, iters, steps_every_t=True)}
    roofs = measure_rooflines(cfg, batch, iters)
    info["load_average_1min_at_end"] = load_average()
    return {"machine": info, "config": cfg.to_dict(), "counts": counts, "roofline": roofs,
            "matmuls": [asdict(mm) | {"flops": mm.flops} for mm in matmuls(cfg, batch, True)]}


def print_report(rep: dict[str, Any]) -> None:
    c = rep["counts"]["inference"]
    print(f"per board, {c['iterations']} iterations, batch {c['batch']}:")
    print(f"  {'component':16s} {'MFLOP/iter':>10s} {'share':>6s} {'MB/iter':>8s}")
    fl, by = c["forward_flops_per_iteration"], c["forward_bytes_per_iteration"]
    per_it = sum(fl.values())
    for k in COMPONENTS:
        if k in fl or k in by:
            print(f"  {k:16s} {fl.get(k, 0) / 1e6:10.2f} {100 * fl.get(k, 0) / per_it:5.1f}% {by.get(k, 0) / 1e6:8.2f}")
    e, every = rep["counts"]["inference_with_energies"], rep["counts"]["steps_every_t"]
    once = c["forward_flops_per_pass"].get("step_sizes")
    if once:
        print(f"  step sizes made once per pass: {once / 1e6:.2f} MFLOP")
    print(f"  forward {c['forward_flops'] / 1e9:.3f} GFLOP (with energies {e['forward_flops'] / 1e9:.3f}), "
          f"training step {c['training_flops'] / 1e9:.3f} GFLOP; forward {c['forward_bytes'] / 1e6:.1f} MB")
    print(f"  with the step sizes at every iteration (the authors' code): forward "
          f"{every['forward_flops'] / 1e9:.3f} GFLOP, training step {every['training_flops'] / 1e9:.3f} GFLOP")
    for dtype, r in rep["roofline"].items():
        print(f"  {dtype} roofline: inference {r['inference']['roofline_boards_per_s']:.1f} boards/s "
              f"({r['inference']['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s), training "
              f"{r['training']['roofline_boards_per_s']:.1f} boards/s "
              f"({r['training']['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s)")
    other = rep.get("roofline_other_blas")
    if other:
        mine, theirs = rep["roofline"]["float32"]["training"], other["float32"]["training"]
        print(f"  float32 training roofline at {other['library']}'s rates: {theirs['roofline_boards_per_s']:.1f} "
              f"boards/s ({theirs['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s, "
              f"{theirs['roofline_boards_per_s'] / mine['roofline_boards_per_s']:.2f}x PyTorch's)")
        best = rep["roofline_best_of_libraries"]["training"]
        print(f"  float32 training roofline at the better of the two at each shape: "
              f"{best['roofline_boards_per_s']:.1f} boards/s ({best['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s)")
    m = rep["machine"]
    print(f"  {m['cpu']}, {m['threads']} thread(s), native bf16: {m['native_bf16']}, load "
          f"{m['load_average_1min_at_start']} -> {m['load_average_1min_at_end']}")


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", type=bench_args.preset, default="sudoku")
    ap.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                    help="config overrides [default, with --preset sudoku: the authors' d=128 configuration]")
    ap.add_argument("--batch", type=bench_args.count, default=64)
    ap.add_argument("--iters", type=bench_args.count, default=None)
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--other-blas", action="store_true",
                    help="also the fp32 rooflines at the rates numpy's BLAS reaches at the same shapes")
    ap.add_argument("--out", type=bench_args.output_file, default=RESULTS / "flops.json")
    args = ap.parse_args(argv)
    sets = args.set if args.set is not None else (PEER_D128 if args.preset == "sudoku" else [])
    cfg = bench_args.model_config(args.preset, sets)
    rep = report(cfg, args.batch, args.iters, args.threads)
    if args.other_blas:
        rep["roofline_other_blas"] = other_blas_rooflines(cfg, args.batch, args.iters, args.threads)
        rep["roofline_best_of_libraries"] = best_of_rooflines(cfg, args.batch, args.iters, False,
                                                              rep["roofline"]["float32"],
                                                              rep["roofline_other_blas"]["float32"])
    rep["command"] = bench_args.command_line("flops", argv)
    print_report(rep)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, rep)
    print(f"wrote {args.out}")

if __name__ == "__main__":
    main()
