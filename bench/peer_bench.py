"""Same-work speed: the authors' Sudoku model and ours at one configuration, interleaved in one process.

The authors' code (huyunzhe/hyper-set, MIT) is not part of this repository; get a checkout anywhere and install the
few packages its Sudoku model's imports need (measured with commit 5e5cc36, einops 0.8.2, hydra-core 1.3.8 with
omegaconf 2.3.1, loguru 0.7.3):

    git clone https://github.com/huyunzhe/hyper-set /tmp/hyper-set-peer
    pip install einops==0.8.2 hydra-core==1.3.8 loguru==0.7.3
    python bench/peer_bench.py --peer /tmp/hyper-set-peer [--rounds 7] [--threads 1] [--bf16] [--compile [--slices 4]]
    python bench/peer_bench.py --peer /tmp/hyper-set-peer --compile --compile-options '{"max_autotune": true}'
    python bench/peer_bench.py --peer /tmp/hyper-set-peer --device cuda [--bf16] [--compile]

(`sudoku/models.py` imports einops and `utils.metric_utils`; the `utils` package's `__init__` also imports
`utils.training_utils`, which imports hydra, omegaconf and loguru. numpy and torch are already here. wandb is
imported only inside a function and is not needed.)

Configuration, the authors' Sudoku model at d=128: 4 heads, M=4d, 24 iterations, time embedding 512, learned
positions, X0-conditioned step sizes, embedding dropout 0.1, batch 64, loss on the last iteration (cross-entropy on
the blank cells), fp32, one thread. Ours is the `sudoku` preset at the same values (`flops.PEER_D128`). Both take
the authors' training step: AdamW (lr 1e-4, betas 0.9/0.95, weight decay 0.1), gradient clipping at 1.0. Inference
is one forward pass without the energy trace, in eval mode, under torch.no_grad.

Before timing, the script checks that the two compute the same function: our randomised weights copied into the
authors' model give the same logits (`parity_max_abs_diff`), and torch's FLOP counter counts, for each, the FLOPs
of bench/flops.py's model (`flops_counted`): the authors' code makes the step sizes at every iteration
(`steps_every_t`), ours once per pass where they do not depend on t (the authors' dead time network), with the
same gradients. Then rounds alternate: a training step of each runner and an inference pass of each, the order
reversed every round; medians are reported, with boards/s, the ratios, and shares of two fp32 matmul rooflines
measured at the model's shapes (bench/flops.py) before and after the rounds (the better of the two, the one with
less contention, is used; both are in the JSON with the load average):

    share_of_roofline              the configuration's matmuls as the authors' code runs them (step sizes at
                                   every iteration): the same yardstick for both codes
    share_of_least_work_roofline   the matmuls the function needs (step sizes once per pass): what no code can beat

Runners: `ours` (the library as it trains in eager mode: hyperset.accel.fused, step sizes once), `ours_written_out`
(the same model inside hyperset.accel.fused.written_out(): the layer written out under autograd, step sizes at every
iteration; its inference is ours), `peer` (the authors' code), and with --compile `ours_compiled` (the model
under torch.compile as the trainer runs it with train.compile = true: hyperset.accel.fused traced and fused by the
compiler) and, in fp32, `ours_compiled_written_out` (the written-out path compiled: what the compiler makes of
the layer without the hand-written backward passes; under bf16 autocast the two are the same code); with
--compile --slices N, in fp32, also `ours_compiled_sliced` and `peer_sliced`: the same training step with the
batch's forward and backward passes run in N slices, gradients accumulated (`in_slices`: the same update, as the
trainer's train.accum_steps = N makes it) with 1/N of the working set; they train only (inference does not
slice); with --compile --compile-options JSON, in fp32, also `ours_compiled_options`: ours compiled with these
Inductor settings (`torch.compile(model, options=...)`, e.g. {"max_autotune": true} or {"cpp_wrapper": true}),
timed beside `ours_compiled` in the same rounds, so a compiler setting is measured at the same work; with
--cpu-matmul LIB (auto, onednn, aten), in fp32, also `ours_cpu_matmul` (and with --compile
`ours_compiled_cpu_matmul`): ours with the layer's products of a state by a weight on LIB's GEMM
(hyperset.accel.fused.matmul; the default is `machine.cpu_matmul_library`), beside ours in the same rounds; with
--cpu-kernels auto|on|off likewise `ours_cpu_kernels` (`ours_compiled_cpu_kernels`): ours with the attention maps'
C kernel so (hyperset.accel.cpu_kernels; the default is `machine.cpu_kernels`).
`goal` in the JSON (and the summary's last line) holds fp32 training on a CPU against the speed goal this
benchmark was built for: at least 1.3x the authors' boards/s and 85% of the roofline, for `ours` and `ours_compiled`.
The roofline above is PyTorch's: each plain fp32 shape at the faster of ATen's matmul and oneDNN's GEMM
(bench/flops.py). The goal's share is of the CPU's roofline (`share_of_cpu_roofline`): the same work at the best
rate PyTorch or numpy's BLAS reaches at each shape (`roofline_best_of_libraries`; numpy's rates in
`roofline_other_blas`, bench/flops.py --other-blas; both timed before and after the rounds), since PyTorch's
libraries are not the fastest on every CPU (on an AMD EPYC, Zen 4, OpenBLAS ran the attention maps' batched
products up to 2x faster than MKL).
With `--device cuda` both models train and infer on the GPU (the parity check stays on the CPU), each timed call
ends with a synchronize, and no roofline is measured: at batch 64 these kernels are bound by their launches.
Writes bench/results/peer_bench.json (peer_bench_cuda.json on a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import importlib.metadata
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_args
import flops
import torch
import torch.nn.functional as F
from torch import nn

from hyperset.accel import cpu_kernels as hyperset_cpu_kernels
from hyperset.accel import fused
from hyperset.checkpoint import atomic_write_json
from hyperset.models import HyperSETModel

RESULTS = Path(__file__).resolve().parent / "results"
PEER_PACKAGES = ("einops", "hydra-core", "omegaconf", "loguru")
BATCH = 64
# the speed goal for an fp32 training step at this configuration on a CPU: this ratio to the authors' code and this
# share of the roofline
GOAL_RATIO, GOAL_SHARE = 1.3, 0.85


def our_config() -> Any:
    return bench_args.model_config("sudoku", flops.PEER_D128)


def random_model(dead_time_network: bool = True, device: str | torch.device = "cpu") -> HyperSETModel:
    """Our model at the shared configuration without dropout, every weight random (seed 0): for comparing the
    optimised and the written-out training paths (tests/accel/test_fused.py, gpu_check's fused check). With
    `dead_time_network` the step-size network's L1 and L2 weights stay zero, as the authors' init leaves them (step
    sizes the same at every t, made once per pass); else they are random too."""
    torch.manual_seed(0)
    model = HyperSETModel(our_config().replace(emb_dropout=0.0)).to(device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not (dead_time_network and name.startswith(("core.step_sizes.L1", "core.step_sizes.L2.weight"))):
                p.add_(0.05 * torch.randn_like(p))
    return model


def load_peer(peer_dir: Path, cfg: Any) -> nn.Module:
    """The authors' Sudoku `Model` at `cfg`'s values, as their `sudoku/utils.py` builds it (training.dropout 0)."""
    if not (peer_dir / "sudoku" / "models.py").is_file():
        raise bench_args.BenchInputError(f"{peer_dir} is not a checkout of huyunzhe/hyper-set (no sudoku/models.py)")
    sys.path.insert(0, str(peer_dir))
    try:
        models = importlib.import_module("sudoku.models")
    except ModuleNotFoundError as e:
        raise bench_args.BenchInputError(f"the authors' model needs {e.name!r}: pip install einops==0.8.2 "
                                         "hydra-core==1.3.8 loguru==0.7.3") from None
    if not all(hasattr(models, name) for name in ("ModelConfig", "Model")):
        raise bench_args.BenchInputError(f"{peer_dir / 'sudoku' / 'models.py'} has no ModelConfig and Model: not the "
                                         "checkout of huyunzhe/hyper-set this benchmark reads (commit 5e5cc36)")
    peer_cfg = models.ModelConfig(
        vocab_size=cfg.vocab_size, block_size=cfg.seq_len, n_layer=cfg.n_layers, n_head=cfg.heads, n_embd=cfg.dim,
        time_emb=cfg.time_dim, multiplier=cfg.ff_hidden // cfg.dim, num_classes=cfg.num_classes, n_recur=cfg.iters,
        model_type="hyper-set", resid_pdrop=0.0, attn_pdrop=0.0, adaptive_mode="gd_with_learnable_step_size",
        phi_func=None, pos_emb="learnable", input_cond=cfg.step_cond == "x0")
    return models.Model(peer_cfg)


@torch.no_grad()
def copy_ours_into_peer(ours: HyperSETModel, peer: nn.Module) -> None:
    """The same function in their layout: Z = X W is their qkv(X) (weight W^T), U = X D their mlp(X) (weight D^T)."""
    layer, steps = ours.core.layers[0], ours.core.step_sizes
    block = peer.blocks[0]
    pairs = [(peer.tok_emb.weight, ours.stem.tok.weight), (peer.pos_emb[0], ours.stem.pos),
             (block.attn.qkv.weight, layer.W.t()), (block.attn.ln1.weight, layer.norm_attn.weight),
             (block.mlp.weight, layer.D.t()), (block.ln2.weight, layer.norm_ff.weight),
             (peer.ln_f.weight, ours.head_norm.weight), (peer.head.weight, ours.head.weight)]
    for theirs, mine in zip((peer.time_mlp[0][1], peer.time_mlp[0][3], peer.time_mlp[1][1]),
                            (steps.L1, steps.L2, steps.L3)):
        pairs += [(theirs.weight, mine.weight), (theirs.bias, mine.bias)]
    for theirs, mine in pairs:
        theirs.copy_(mine)


def parity(cfg: Any, peer: nn.Module, boards: torch.Tensor) -> float:
    """Max |logits difference| of our model with random weights (every parameter non-zero) and the authors' model
    given the same weights, in eval mode. A fresh model of ours is used, so the timed ones keep their init. It takes
    the RMSNorm epsilon of the authors' nn.RMSNorm (float32 eps; ours is 1e-6, which moves logits by ~4e-3 here)."""
    torch.manual_seed(1)
    ours = HyperSETModel(cfg.replace(norm_eps=torch.finfo(torch.float32).eps)).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.copy_(p + 0.05 * torch.randn_like(p))
    state = {k: v.clone() for k, v in peer.state_dict().items()}
    copy_ours_into_peer(ours, peer)
    peer.eval()
    with torch.no_grad():
        diff = (ours(boards) - peer(boards)[0]).abs().max().item()
    peer.load_state_dict(state)
    return diff


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Boards with blanks (0) and their targets (-100 on givens, as the authors' dataset writes them)."""
    g = torch.Generator().manual_seed(seed)
    boards = torch.randint(0, 10, (BATCH, 81), generator=g)
    targets = torch.where(boards == 0, torch.randint(0, 9, (BATCH, 81), generator=g), -100)
    return boards, targets


def loss_fn(kind: str, model: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The last-iteration cross-entropy; the authors' model computes it inside its forward."""
    if kind == "peer":
        return lambda x, y: model(x, y)[1]
    return lambda x, y: F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def in_slices(x: torch.Tensor, y: torch.Tensor, slices: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The batch as `slices` row slices, each with its share of the supervised cells: the slices' losses (means over
    their cells) weighted by these shares and summed are the batch's loss, so are their gradients."""
    total = (y != -100).sum()
    return [(xs, ys, (ys != -100).sum() / total) for xs, ys in zip(x.chunk(slices), y.chunk(slices))]


class Runner:
    """A model with the authors' optimizer; `train` is one training step, `infer` one forward pass. With
    ``compiled`` the model runs through ``torch.compile`` as the trainer runs it (``train.compile = true``): the
    optimizer holds the same parameters, only the forward and backward passes are compiled. With ``written_out``
    the steps run inside ``hyperset.accel.written_out()``; `compile_options` are Inductor settings for the
    compiler
    (``torch.compile(model, options=...)``). With `slices` > 1 a training step runs the batch's forward
    and backward passes slice by slice (`in_slices`), gradients accumulated (the trainer's ``train.accum_steps``):
    the same update, with a smaller working set. With `cpu_matmul` (auto, onednn, aten) its steps run inside
    ``hyperset.accel.fused.using_cpu_matmul(cpu_matmul)``, with `cpu_kernels` (auto, on, off) inside
    ``hyperset.accel.cpu_kernels.using_cpu_kernels(cpu_kernels)``."""

    def __init__(self, kind: str, model: nn.Module, bf16: bool, compiled: bool = False, written_out: bool = False,
                 device: torch.device = torch.device("cpu"), slices: int = 1,
                 compile_options: dict[str, Any] | None = None, cpu_matmul: str | None = None,
                 cpu_kernels: str | None = None):
        self.model, self.slices = model.to(device), slices
        self.mode = (fused.written_out if written_out else
                     functools.partial(fused.using_cpu_matmul, cpu_matmul) if cpu_matmul else
                     functools.partial(hyperset_cpu_kernels.using_cpu_kernels, cpu_kernels) if cpu_kernels else
                     contextlib.nullcontext)
        self.net = torch.compile(model, options=compile_options) if compiled else model  # what the steps run
        self.loss = loss_fn(kind, self.net)
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def train(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        self.opt.zero_grad()
        with self.mode(), self.autocast:
            if self.slices == 1:
                self.loss(x, y).backward()
            else:
                for xs, ys, share in in_slices(x, y, self.slices):
                    (self.loss(xs, ys) * share).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()

    def infer(self, x: torch.Tensor) -> None:
        self.model.eval()
        with self.mode(), torch.no_grad(), self.autocast:
            self.net(x)


def counted_flops(runner: Runner, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """FLOPs per board that torch's FLOP counter sees in one inference pass and one training step."""
    from torch.utils.flop_counter import FlopCounterMode

    out = {}
    for name, fn in (("inference", lambda: runner.infer(x)), ("training", lambda: runner.train(x, y))):
        with FlopCounterMode(display=False) as counter:
            fn()
        out[name] = counter.get_total_flops() / len(x)
    return out


def interleaved(runners: dict[str, Runner], x: torch.Tensor, y: torch.Tensor, rounds: int) -> dict[str, Any]:
    """Seconds per training step and per inference pass, each runner in turn, the order reversed every round (on a
    GPU each timed call ends with a synchronize). Runners in slices train only (inference does not slice)."""
    works = {n: ("train",) if r.slices > 1 else ("train", "inference") for n, r in runners.items()}
    times: dict[str, list[float]] = {f"{n}_{w}": [] for n in runners for w in works[n]}
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    for r in range(rounds + 1):  # round 0 warms up
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        for work in ("train", "inference"):
            for name in (n for n in order if work in works[n]):
                sync()
                t0 = time.perf_counter()
                runners[name].train(x, y) if work == "train" else runners[name].infer(x)
                sync()
                if r:
                    times[f"{name}_{work}"].append(time.perf_counter() - t0)
    return times


def versions(peer_dir: Path) -> dict[str, str]:
    out = {"torch": torch.__version__}
    for pkg in PEER_PACKAGES:
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    try:
        out["peer_commit"] = subprocess.run(["git", "-C", str(peer_dir), "rev-parse", "HEAD"], capture_output=True,
                                            text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        out["peer_commit"] = "unknown (not a git checkout)"
    return out


RUNNERS = ("ours", "ours_written_out", "ours_cpu_matmul", "ours_cpu_kernels", "ours_compiled",
           "ours_compiled_options", "ours_compiled_cpu_matmul", "ours_compiled_cpu_kernels",
           "ours_compiled_written_out", "ours_compiled_sliced", "peer", "peer_sliced")


def summarise(times: dict[str, list[float]], roof: dict[str, Any] | None, fpb: dict[str, float],
              least: dict[str, Any] | None = None) -> dict[str, Any]:
    """Boards/s from the medians, the ratio to the authors' of each of ours (``ours``, and ``ours_written_out`` and
    the compiled ones when they ran), GFLOP/s of the configuration's work (`fpb`), and shares of the roofline
    `roof` (and of `least`, the least-work roofline, when given); also from the fastest round of each (`best_*`),
    which other processes on a shared machine disturb least."""
    out: dict[str, Any] = {}
    for work, key in (("train", "training"), ("inference", "inference")):
        names = [n for n in RUNNERS if f"{n}_{work}" in times]
        rates = {n: BATCH / statistics.median(times[f"{n}_{work}"]) for n in names}
        best = {n: BATCH / min(times[f"{n}_{work}"]) for n in names}
        row = out[key] = {f"{n}_boards_per_s": v for n, v in rates.items()}
        others = [n for n in names if n != "peer"]
        for n in others:
            row[f"ratio_{n}_to_peer"] = rates[n] / rates["peer"]
        row.update({f"best_{n}_boards_per_s": v for n, v in best.items()})
        for n in others:
            row[f"best_ratio_{n}_to_peer"] = best[n] / best["peer"]
        if roof is not None:
            row.update({f"best_{n}_share_of_roofline": flops.share(v, roof[key]) for n, v in best.items()})
            row["roofline_boards_per_s"] = roof[key]["roofline_boards_per_s"]
            row.update({f"{n}_share_of_roofline": flops.share(v, roof[key]) for n, v in rates.items()})
        if least is not None:
            row["least_work_roofline_boards_per_s"] = least[key]["roofline_boards_per_s"]
            row.update({f"{n}_share_of_least_work_roofline": flops.share(v, least[key]) for n, v in rates.items()})
        row.update({f"{n}_gflop_per_s": v * fpb[key] / 1e9 for n, v in rates.items()})
    return out


def goal(results: dict[str, Any], other_blas: dict[str, Any] | None = None,
         best_of_libraries: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """fp32 training of `ours` and `ours_compiled` (where it ran) against GOAL_RATIO and GOAL_SHARE: each one's ratio
    to the authors' and share of the roofline, and whether it reaches them. None without an fp32 roofline (a GPU).

    With `other_blas` (bench/flops.other_blas_rooflines at the configuration's work) the share is also taken of
    the roofline at numpy's BLAS rates, and the goal's share is of the higher roofline: where another library
    multiplies these matrices faster than PyTorch's, the CPU's limit is at least that fast
    (`share_of_cpu_roofline`). `best_of_libraries` (bench/flops.best_of_rooflines of the two) is the roofline at
    the best rate either reached at each shape, higher still where each library wins some shapes: the goal holds
    the share against it where given."""
    row = results.get("float32", {}).get("training", {})
    if "roofline_boards_per_s" not in row:
        return None
    out: dict[str, Any] = {"ratio_to_authors_at_least": GOAL_RATIO, "share_of_roofline_at_least": GOAL_SHARE}
    roof = row["roofline_boards_per_s"]
    if other_blas is not None:
        theirs = other_blas["float32"]["training"]["roofline_boards_per_s"]
        out["other_blas_library"] = other_blas["library"]
        out["other_blas_roofline_boards_per_s"] = theirs
        roof = max(roof, theirs)
    if best_of_libraries is not None:
        out["best_of_libraries_roofline_boards_per_s"] = best_of_libraries["training"]["roofline_boards_per_s"]
        roof = max(roof, out["best_of_libraries_roofline_boards_per_s"])
    out["cpu_roofline_boards_per_s"] = roof
    for n in ("ours", "ours_compiled"):
        if f"{n}_boards_per_s" in row:
            ratio, share = row[f"ratio_{n}_to_peer"], row[f"{n}_boards_per_s"] / roof
            out[n] = {"ratio_to_authors": ratio, "ratio_reached": ratio >= GOAL_RATIO,
                      "share_of_roofline": row[f"{n}_share_of_roofline"], "share_of_cpu_roofline": share,
                      "share_reached": share >= GOAL_SHARE}
    return out


def other_blas(cfg: Any, threads: int, batch: int = BATCH) -> dict[str, Any] | None:
    """bench/flops.other_blas_rooflines at the configuration's work (step sizes at every iteration), None where
    numpy cannot be run (then the goal is judged against PyTorch's roofline alone)."""
    try:
        return flops.other_blas_rooflines(cfg, batch, None, threads, steps_every_t=True)
    except (bench_args.BenchInputError, OSError, ValueError) as e:
        print(f"note: {e}; the goal is judged against PyTorch's roofline alone", flush=True)
        return None


def best_roofline(before: dict[str, Any], after: dict[str, Any], dtype: str) -> dict[str, Any]:
    return {k: max(before[dtype][k], after[dtype][k], key=lambda r: r["roofline_boards_per_s"])
            for k in ("inference", "training")}


def rooflines(cfg: Any, batch: int = BATCH, cache: dict[str, dict[tuple, float]] | None = None) -> dict[str, Any]:
    """The configuration's roofline (step sizes at every iteration, as the authors' code) and the least-work one,
    each matmul shape timed once for both (`cache`: bench/flops.measure_rooflines's, {dtype name: rates by shape},
    filled in)."""
    cache = {} if cache is None else cache
    return {"configuration": flops.measure_rooflines(cfg, batch, steps_every_t=True, cache=cache),
            "least_work": flops.measure_rooflines(cfg, batch, cache=cache)}


def machine_on(device: str, threads: int) -> tuple[torch.device, dict[str, Any]]:
    """The device to run on and the machine's facts, on a GPU with its name (a `BenchInputError` where PyTorch sees
    no such device)."""
    problem = bench_args.device_problem(device)
    if problem:
        raise bench_args.BenchInputError(f"--device {device}: {problem}")
    dev, info = torch.device(device), flops.machine(threads)
    if dev.type != "cpu":
        info.update(device=device, gpu=torch.cuda.get_device_name(dev), cuda=torch.version.cuda)
    return dev, info


def per_board(count: dict[str, Any]) -> dict[str, float]:
    return {"inference": count["forward_flops"], "training": count["training_flops"]}


def run(peer_dir: Path, rounds: int, threads: int, bf16: bool, compiled: bool = False,
        device: str = "cpu", slices: int = 1, compile_options: dict[str, Any] | None = None,
        cpu_matmul: str | None = None, cpu_kernels: str | None = None) -> dict[str, Any]:
    """The comparison on `device`; on a GPU without rooflines (kernels of these sizes are bound by their launches,
    not by the matmul rate) and with the GPU's name in the machine facts. With `compile_options` (and `compiled`)
    also `ours_compiled_options` in fp32; with `cpu_matmul` `ours_cpu_matmul` (and `ours_compiled_cpu_matmul`) in
    fp32, with `cpu_kernels` `ours_cpu_kernels` (and `ours_compiled_cpu_kernels`) in fp32."""
    torch.set_num_threads(threads)
    dev, info = machine_on(device, threads)
    cpu = dev.type == "cpu"
    cfg = our_config()
    if bf16 and not (info["native_bf16"] if cpu else torch.cuda.is_bf16_supported()):
        raise bench_args.BenchInputError(f"--bf16: this {'CPU' if cpu else 'GPU'} has no native bf16")
    torch.manual_seed(0)
    peer = load_peer(peer_dir, cfg)
    x, y = batch()
    diff = parity(cfg, peer, x)
    print(f"parity: max |logits ours - authors'| = {diff:.2e} (same weights, eval, on the CPU)", flush=True)
    x, y = x.to(dev), y.to(dev)
    dtypes = ["float32"] + (["bfloat16"] if bf16 else [])
    roof_before = rooflines(cfg) if cpu else None
    blas_before = other_blas(cfg, threads) if cpu else None
    fpb = {"configuration": per_board(flops.count(cfg, BATCH, steps_every_t=True)),
           "least_work": per_board(flops.count(cfg, BATCH))}
    rep: dict[str, Any] = {
        "machine": info, "versions": versions(peer_dir), "config": cfg.to_dict(), "batch": BATCH,
        "rounds": rounds, "compiled": compiled, "slices": slices, "compile_options": compile_options,
        "cpu_matmul": cpu_matmul, "cpu_kernels": cpu_kernels,
        "parity_max_abs_diff": diff,
        "flops_per_board_model": fpb,
        "flops_counted": {}, "results": {}, "times_s": {},
    }
    for dtype in dtypes:
        half = dtype == "bfloat16"
        runners = {}
        torch.compiler.reset()  # the previous dtype's graphs would count towards dynamo's recompile limit
        # the compiled variants beside ours_compiled (with other compiler settings, written out, in slices) only in
        # fp32: under bf16 autocast the fused operators step aside, and slicing is an fp32 question
        extra = compiled and not half
        ours = {"ours": {}, "ours_written_out": {"written_out": True}}
        ours.update({"ours_compiled": {"compiled": True}} if compiled else {})
        ours.update({"ours_compiled_options": {"compiled": True, "compile_options": compile_options}}
                    if extra and compile_options else {})
        ours.update({"ours_cpu_matmul": {"cpu_matmul": cpu_matmul}} if cpu_matmul and not half else {})
        ours.update({"ours_compiled_cpu_matmul": {"compiled": True, "cpu_matmul": cpu_matmul}}
                    if extra and cpu_matmul else {})
        ours.update({"ours_cpu_kernels": {"cpu_kernels": cpu_kernels}} if cpu_kernels and not half else {})
        ours.update({"ours_compiled_cpu_kernels": {"compiled": True, "cpu_kernels": cpu_kernels}}
                    if extra and cpu_kernels else {})
        ours.update({"ours_compiled_written_out": {"compiled": True, "written_out": True}} if extra else {})
        ours.update({"ours_compiled_sliced": {"compiled": True, "slices": slices}} if extra and slices > 1 else {})
        for name, kw in ours.items():
            torch.manual_seed(0)
            runners[name] = Runner("ours", HyperSETModel(cfg), half, device=dev, **kw)
        runners["peer"] = Runner("peer", load_peer(peer_dir, cfg), half, device=dev)
        if extra and slices > 1:
            runners["peer_sliced"] = Runner("peer", load_peer(peer_dir, cfg), half, device=dev, slices=slices)
        if dtype == "float32":
            rep["flops_counted"] = {n: counted_flops(r, x, y) for n, r in runners.items()
                                    if "compiled" not in n and r.slices == 1}
        print(f"{dtype}: {rounds} interleaved rounds ...", flush=True)
        rep["times_s"][dtype] = interleaved(runners, x, y, rounds)
    roof_after = rooflines(cfg) if cpu else None
    for dtype in dtypes:
        conf, least = ((best_roofline(roof_before[k], roof_after[k], dtype) for k in ("configuration", "least_work"))
                       if cpu else (None, None))
        rep["results"][dtype] = summarise(rep["times_s"][dtype], conf, fpb["configuration"], least)
    rep["roofline"] = {"before": roof_before, "after": roof_after} if cpu else None
    blas_after = other_blas(cfg, threads) if cpu else None
    rep["roofline_other_blas"] = {"before": blas_before, "after": blas_after} if cpu else None
    timed = [b for b in (blas_before, blas_after) if b is not None]
    best_blas = max(timed, key=lambda b: b["float32"]["training"]["roofline_boards_per_s"]) if timed else None
    best_of = (flops.best_of_rooflines(cfg, BATCH, None, True, *(r["configuration"]["float32"]
                                                                 for r in (roof_before, roof_after)),
                                       *(b["float32"] for b in timed)) if cpu else None)
    rep["roofline_best_of_libraries"] = best_of
    rep["goal"] = goal(rep["results"], best_blas, best_of)
    info["load_average_1min_at_end"] = flops.load_average()
    return rep


def print_summary(rep: dict[str, Any]) -> None:
    m = rep["machine"]
    if "gpu" in m:
        print(f"{m['gpu']} (CUDA {m['cuda']}), host {m['cpu']}")
    limits = "".join(f", {k}={v}" for k, v in m.get("isa_limits", {}).items())
    print(f"{m['cpu']}, {m['threads']} thread(s), native bf16 {m['native_bf16']}, PyTorch's kernels at "
          f"{m.get('cpu_capability')}{limits}; load {m['load_average_1min_at_start']:.2f} -> "
          f"{m['load_average_1min_at_end']:.2f}")
    conf, least = rep["flops_per_board_model"]["configuration"], rep["flops_per_board_model"]["least_work"]
    print(f"FLOPs per board: inference {conf['inference'] / 1e9:.3f} G, training step {conf['training'] / 1e9:.3f} G "
          f"(the configuration, step sizes at every iteration); least work {least['inference'] / 1e9:.3f} G and "
          f"{least['training'] / 1e9:.3f} G (step sizes once)")
    for dtype, res in rep["results"].items():
        for work in ("training", "inference"):
            r = res[work]
            roofed = "roofline_boards_per_s" in r
            if roofed:
                print(f"  {dtype} {work}: roofline {r['roofline_boards_per_s']:.1f} boards/s (least work "
                      f"{r['least_work_roofline_boards_per_s']:.1f})")
            else:
                print(f"  {dtype} {work}:")
            for n in RUNNERS:
                if f"{n}_boards_per_s" not in r:
                    continue
                ratio = f"  {r[f'ratio_{n}_to_peer']:.2f}x the authors'" if n != "peer" else ""
                shares = (f"  {100 * r[f'{n}_share_of_roofline']:3.0f}% of the roofline "
                          f"({100 * r[f'{n}_share_of_least_work_roofline']:.0f}% of least work)") if roofed else ""
                print(f"    {n:25s} {r[f'{n}_boards_per_s']:7.1f} boards/s{shares}{ratio}; "
                      f"fastest round {r[f'best_{n}_boards_per_s']:.1f}")
    g = rep.get("goal")
    if g:
        runs = []
        for n in ("ours", "ours_compiled"):
            if n in g:
                v = g[n]
                ratio = "reached" if v["ratio_reached"] else "not reached"
                share = "reached" if v["share_reached"] else "not reached"
                runs.append(f"{n} {v['ratio_to_authors']:.2f}x ({ratio}), "
                            f"{100 * v.get('share_of_cpu_roofline', v['share_of_roofline']):.0f}% ({share})")
        if "other_blas_roofline_boards_per_s" in g:
            mine = rep["results"]["float32"]["training"]["roofline_boards_per_s"]
            both = (f", at the better of the two at each shape {g['best_of_libraries_roofline_boards_per_s']:.1f}"
                    if "best_of_libraries_roofline_boards_per_s" in g else "")
            print(f"  float32 training roofline at {g['other_blas_library']}'s rates: "
                  f"{g['other_blas_roofline_boards_per_s']:.1f} boards/s ({mine:.1f} at PyTorch's{both}); the goal's "
                  f"share is of the highest, {g['cpu_roofline_boards_per_s']:.1f}")
        print(f"goal, fp32 training: >= {g['ratio_to_authors_at_least']}x the authors' and >= "
              f"{100 * g['share_of_roofline_at_least']:.0f}% of the roofline: {'; '.join(runs)}")


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", type=bench_args.peer_checkout, required=True, help="a checkout of huyunzhe/hyper-set")
    ap.add_argument("--rounds", type=bench_args.count, default=7)
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--bf16", action="store_true", help="also bf16 autocast rows (CPUs with native bf16)")
    ap.add_argument("--compile", action="store_true",
                    help="also our model under torch.compile, as the trainer runs it with train.compile = true")
    ap.add_argument("--slices", type=bench_args.count, default=1,
                    help="with --compile, also fp32 training steps in this many slices of the batch, gradients "
                         "accumulated (ours compiled and the authors')")
    ap.add_argument("--compile-options", type=bench_args.compile_options, default=None, metavar="JSON",
                    help="with --compile, also fp32 rows of ours compiled with these Inductor settings "
                         "(torch.compile(..., options=JSON)), beside ours compiled in the same rounds")
    ap.add_argument("--cpu-matmul", choices=fused.CPU_MATMULS, default=None,
                    help="also fp32 rows of ours (and ours compiled, with --compile) with the layer's products on "
                         "this library's GEMM (hyperset.accel.fused.matmul), beside ours in the same rounds")
    ap.add_argument("--cpu-kernels", choices=hyperset_cpu_kernels.CHOICES, default=None,
                    help="also fp32 rows of ours (and ours compiled, with --compile) with the attention maps' C "
                         "kernel on, off or auto (hyperset.accel.cpu_kernels), beside ours in the same rounds")
    ap.add_argument("--device", type=bench_args.device, default="cpu",
                    help="cpu (default) or cuda: where both models run")
    ap.add_argument("--out", type=bench_args.output_file, default=None,
                    help="default bench/results/peer_bench.json, peer_bench_cuda.json with --device cuda")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = RESULTS / ("peer_bench.json" if args.device == "cpu" else "peer_bench_cuda.json")
    if BATCH % args.slices:
        ap.error(f"--slices must divide the batch of {BATCH}")
    if args.compile_options and not args.compile:
        ap.error("--compile-options needs --compile")
    if args.slices > 1 and not args.compile:
        ap.error("--slices needs --compile")
    if args.cpu_matmul and args.device != "cpu":
        ap.error("--cpu-matmul is for --device cpu")
    if args.cpu_kernels and args.device != "cpu":
        ap.error("--cpu-kernels is for --device cpu")
    rep = run(args.peer, args.rounds, args.threads, args.bf16, args.compile, args.device, args.slices,
              args.compile_options, args.cpu_matmul, args.cpu_kernels)
    rep["command"] = bench_args.command_line("peer_bench", argv)
    print_summary(rep)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, rep)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
