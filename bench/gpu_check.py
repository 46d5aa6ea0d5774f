"""The GPU paths, checked on a CUDA machine: training with AMP, NCCL, the solver and ONNX Runtime's CUDA provider.

    python bench/gpu_check.py [--out bench/results/gpu_check.json]

On a machine where PyTorch sees no CUDA device it says so and exits 0 without writing anything. Otherwise it runs:

  training   a few AdamW steps with the trainer's mixed precision (hyperset.device.autocast_dtype: bf16 where the
             GPU has it, else fp16 with loss scaling) for a model of every task and a baseline (sudoku-cpu,
             cifar10-cpu, mim-cpu, sudoku-cpu-transformer) on random inputs; then the real trainer (Sudoku,
             amp "auto") on generated puzzles
  compile    the trainer on the paper's Sudoku recipe (d=768, batch 16, amp "auto"), 200 steps eager, 200 with
             train.compile = true and 200 with train.compile_mode = "reduce-overhead" as well (CUDA graphs):
             steps/s of each after compiling, and the logged losses of each within 0.05 of eager's
  depth      CUDA graphs where a pass is a graph per update: the CPU Sudoku recipe at 8 iterations with the depth
             drawn from 4-8 at every step, 200 steps compiled in the default mode and 200 in reduce-overhead:
             steps/s of each, the logged losses of the two within 0.05
  nccl       the trainer under torchrun with two processes, one GPU each (NCCL); skipped with one GPU, since NCCL
             refuses two ranks on one device
  fused      an fp32 training step of the peer configuration (bench/peer_bench.py, batch 8) through the fused
             operators (hyperset.accel.fused) and through the written-out layer: the same logits and gradients (1e-4
             of each tensor's largest value); then boards/s at batch 64 of each and of the trainer's mixed
             precision (autocast, where the fused operators step aside), median of 5 interleaved steps
  solver     the shipped model solving examples/ on CUDA and on the CPU: the same boards, and the seconds of each
  onnx       the shipped model exported unrolled at its trained depth and as the Loop graph (run at the trained
             depth and at 48 iterations), each run by ONNX Runtime's CUDA provider and its CPU provider: parity
             with torch (logits and energies) and boards/s at batch 256, median of 5; on CUDA also with TF32
             matrix products (ONNX Runtime's default, which OrtSession turns off)
  solve_cli  `hyperset-solve examples/*.txt --iters 48 --json` with torch on CUDA, ONNX Runtime on CUDA and torch
             on the CPU: every board valid, the same boards, and the device and provider each run reports
  search     the solver's default command (the search strategy) on 2,048 puzzles of the hardest generated bucket
             (51+, made on the machine's CPUs) at batches of 256, 1,024 and 2,048 boards, torch eager and ONNX
             Runtime's CUDA provider (bench/search_throughput.py's `measure`): puzzles/s, every board checked
             against the rules and the generator's solution, and the model's FLOP/s against fp32 and bf16
             matrix products measured on the same GPU (8,192 x 8,192)

Each check records its outcome and error instead of stopping the others; the exit code is 1 if any failed.
Writes bench/results/gpu_check.json, with the machine (GPU, torch, CUDA, ONNX Runtime) and command of each run.
`--only CHECK ...` runs some of the checks and replaces their results in an existing file, e.g. after installing
onnxruntime-gpu: `python bench/gpu_check.py --only onnx_cuda`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_args
import torch
import torch.nn.functional as F

from hyperset.checkpoint import atomic_write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TRAIN_PRESETS = ("sudoku-cpu", "cifar10-cpu", "mim-cpu", "sudoku-cpu-transformer")


class CheckFailed(RuntimeError):
    """A check whose runs finished but whose results failed it: what they measured is kept in the report."""

    def __init__(self, message: str, measured: dict[str, Any]):
        super().__init__(message)
        self.measured = measured


def _guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"ok": True, **fn()}
    except Exception as e:  # a failed check is a result: record it and go on with the others
        return {"ok": False, "error": f"{type(e).__name__}: {e}", **getattr(e, "measured", {}),
                "traceback": traceback.format_exc()[-3000:]}


def amp_steps(preset: str, device: torch.device, steps: int = 5) -> dict[str, Any]:
    """AdamW steps on one random batch under the trainer's autocast dtype: the loss must stay finite and fall."""
    from hyperset.config import preset_config
    from hyperset.device import autocast_dtype
    from hyperset.exports.export import example_inputs
    from hyperset.models import HyperSETModel

    torch.manual_seed(0)
    cfg = preset_config(preset)
    model = HyperSETModel(cfg).to(device)
    x = example_inputs(cfg, batch=8).to(device)
    shape = (8,) if cfg.task == "classify" else (8, cfg.seq_len)
    y = torch.randint(0, cfg.num_classes, shape, device=device)
    dtype = autocast_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x).float().flatten(0, -2), y.flatten())
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    finite = all(map(lambda v: v == v and abs(v) != float("inf"), losses))
    if not finite or losses[-1] >= losses[0]:
        raise RuntimeError(f"{preset}: losses {losses} under {dtype} did not stay finite and fall")
    return {"preset": preset, "dtype": str(dtype), "losses": losses}


def fused_check(device: torch.device, batch: int = 8, tol: float = 1e-4, speed_batch: int = 64,
                rounds: int = 5, compiled: bool = True) -> dict[str, Any]:
    """One fp32 training step (last-iteration cross-entropy) of the peer configuration with random weights through
    hyperset.accel.fused, through fused.written_out() and (`compiled`) through hyperset.accel.fused under
    torch.compile, as
    the trainer runs it with train.compile = true: logits and every gradient must agree with the written-out
    step's within `tol` of the reference tensor's largest magnitude. Then the boards/s at `speed_batch` of each and
    of the eager model under the trainer's autocast dtype (median of `rounds` interleaved steps after two warm-up
    rounds)."""
    import contextlib
    import copy

    import peer_bench

    from hyperset.accel import fused
    from hyperset.device import autocast_dtype

    model = peer_bench.random_model(dead_time_network=True, device=device)
    twin = copy.deepcopy(model)
    nets = {"fused": model, "written_out": twin}
    if compiled:
        nets["compiled"] = torch.compile(copy.deepcopy(model))
    x = torch.randint(0, 10, (batch, 81), device=device)
    y = torch.randint(0, 9, (batch, 81), device=device)

    def step(m: torch.nn.Module) -> tuple[torch.Tensor, float]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        logits = m(x)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return logits.detach(), time.perf_counter() - t0

    with fused.written_out():
        slow, _ = step(twin)
    differences = {}
    for kind, net in nets.items():
        if kind == "written_out":
            continue
        fast, _ = step(net)
        worst = {"logits": ((fast - slow).abs().max() / slow.abs().max().clamp_min(1e-12)).item()}
        for (name, p), q in zip(getattr(net, "_orig_mod", net).named_parameters(), twin.parameters()):
            worst[name] = ((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-3)).item()
        bad = {k: v for k, v in worst.items() if not v <= tol}
        if bad:
            raise RuntimeError(f"{kind} and written-out training steps differ on {device}: {bad}")
        differences[kind] = max(worst.values())
    # speed at the peer configuration's batch: warm, then interleaved rounds of one step of each
    x = torch.randint(0, 10, (speed_batch, 81), device=device)
    y = torch.randint(0, 9, (speed_batch, 81), device=device)
    amp = autocast_dtype(device)
    modes = {"fused": contextlib.nullcontext, "written_out": fused.written_out,
             "autocast": lambda: torch.autocast(device.type, dtype=amp, enabled=amp is not None)}
    if compiled:
        modes["compiled"] = contextlib.nullcontext
    times: dict[str, list[float]] = {k: [] for k in modes}
    for i in range(rounds + 2):
        for name, mode in modes.items():
            m = nets.get(name, model)
            m.zero_grad(set_to_none=True)
            with mode():
                seconds = step(m)[1]
            if i >= 2:
                times[name].append(seconds)
    speed = {f"{k}_boards_per_s": speed_batch / statistics.median(v) for k, v in times.items()}
    out = {"max_relative_difference": differences["fused"], "speed_batch": speed_batch, "rounds": rounds,
           "autocast_dtype": str(amp), **speed,
           "fused_over_written_out": speed["fused_boards_per_s"] / speed["written_out_boards_per_s"]}
    if compiled:
        out.update(compiled_max_relative_difference=differences["compiled"],
                   compiled_over_fused=speed["compiled_boards_per_s"] / speed["fused_boards_per_s"])
    return out


def sudoku_data(folder: Path, n_train: int = 64, n_valid: int = 16) -> Path:
    """Generated puzzles in the RRN layout the trainer reads (train.csv.gz, valid.csv)."""
    import gzip

    from hyperset.sudoku.exact import generate

    rows = generate(n_train + n_valid, 30, 36, seed=0)
    with gzip.open(folder / "train.csv.gz", "wt") as f:
        f.writelines(f"{p},{s}\n" for p, s in rows[:n_train])
    (folder / "valid.csv").write_text("".join(f"{p},{s}\n" for p, s in rows[n_train:]))
    return folder


TRAIN_ARGS = ["sudoku", "--recipe", "sudoku-cpu", "--steps", "3", "--quiet", "--json", "--set", "model.dim=64",
              "--set", "model.heads=2", "--set", "model.ff_hidden=128", "--set", "data.n_val=8",
              "--set", "data.n_select=8", "--set", "train.batch_size=8", "--set", "train.eval_every=1000",
              "--set", "train.warmup_steps=1", "--set", "train.amp=auto"]


# the paper's Sudoku recipe (d=768, 24 iterations, batch 16) on the generated puzzles, evaluated only at the end
COMPILE_ARGS = ["sudoku", "--recipe", "sudoku-paper", "--quiet", "--json", "--set", "data.n_train=64",
                "--set", "data.n_val=8", "--set", "data.n_select=8", "--set", "train.eval_every=100000"]


def trainer_run(data: Path, out: Path, nproc: int = 1, device: str = "cuda",
                args: list[str] = TRAIN_ARGS) -> dict[str, Any]:
    """`hyperset-train` with `args` on the GPU(s), as a subprocess (under torchrun when nproc > 1)."""
    launcher = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
                                   if nproc > 1 else [])
    cmd = [*launcher, "-m", "hyperset.training", *args, "--data", str(data), "--out", str(out),
           "--device", device]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    if proc.returncode:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr[-2000:]}")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"processes": nproc, "command": " ".join(cmd[1:]), "log": [m for m in metrics if "loss" in m]}


def trainer_arms(data: Path, folder: Path, device: str, args: list[str], steps: int, log_every: int,
                 extra: tuple[str, ...], arms: list[tuple[str, list[str]]]) -> dict[str, Any]:
    """`hyperset-train` with `args` for `steps` steps and each arm's extra arguments, from the same seed: the
    command, and for each arm the seconds of the whole run, steps/s from its first log line to its last
    (compiling happens before the first) and the mean loss of each logged interval."""
    args = [*args, "--steps", str(steps), "--set", f"train.log_every={log_every}", *extra]
    out: dict[str, Any] = {"command": "hyperset-train " + " ".join(args)}
    for name, more in arms:
        t0 = time.perf_counter()
        log = trainer_run(data, folder / name, device=device, args=[*args, *more])["log"]
        if len(log) < 2:
            raise RuntimeError(f"{name}: {len(log)} log lines; need steps >= 2 * log_every")
        first, last = log[0], log[-1]
        out[name] = {"seconds": time.perf_counter() - t0,
                     "steps_per_s": (last["step"] - first["step"]) / max(last["time"] - first["time"], 1e-3),
                     "losses": [m["loss"] for m in log]}
    return out


def loss_difference(out: dict[str, Any], a: str, b: str, tol: float) -> float:
    """The largest difference between the logged losses of arms a and b; beyond `tol` a CheckFailed that keeps
    the arms' measurements."""
    diff = max(abs(x - y) for x, y in zip(out[a]["losses"], out[b]["losses"]))
    if not diff <= tol:
        raise CheckFailed(f"{b.replace('_', ' ')} losses differ from {a.replace('_', ' ')} by {diff:.4g} (> {tol})",
                          {**out, "loss_max_abs_difference": diff})
    return diff


def speedup(out: dict[str, Any], a: str, b: str) -> float:
    """Arm a's steps/s over arm b's."""
    return out[a]["steps_per_s"] / out[b]["steps_per_s"]


COMPILED = ["--set", "train.compile=true"]
CUDA_GRAPHS = [*COMPILED, "--set", "train.compile_mode=reduce-overhead"]


def compile_check(data: Path, folder: Path, device: str = "cuda", steps: int = 200, log_every: int = 50,
                  extra: tuple[str, ...] = (), tol: float = 0.05, cuda_graphs: bool | None = None) -> dict[str, Any]:
    """The trainer on the paper's Sudoku recipe, eager, with ``train.compile = true`` (what the docs recommend on
    a GPU) and, on CUDA (`cuda_graphs`), also with ``train.compile_mode = "reduce-overhead"`` (the compiled graphs
    replayed as CUDA graphs), from the same seed: steps/s of each, and the mean losses of each logged interval,
    which must agree with eager's within `tol`."""
    arms = [("eager", []), ("compiled", COMPILED)]
    if device == "cuda" if cuda_graphs is None else cuda_graphs:
        arms.append(("compiled_cuda_graphs", CUDA_GRAPHS))
    out = trainer_arms(data, folder, device, COMPILE_ARGS, steps, log_every, extra, arms)
    out.update(loss_max_abs_difference=loss_difference(out, "eager", "compiled", tol),
               compiled_over_eager=speedup(out, "compiled", "eager"))
    if "compiled_cuda_graphs" in out:
        out.update(cuda_graphs_loss_max_abs_difference=loss_difference(out, "eager", "compiled_cuda_graphs", tol),
                   cuda_graphs_over_eager=speedup(out, "compiled_cuda_graphs", "eager"),
                   cuda_graphs_over_compiled=speedup(out, "compiled_cuda_graphs", "compiled"))
    return out


# the CPU Sudoku recipe at 8 iterations with the depth drawn from 4-8 at every step: a graph per update
DEPTH_ARGS = ["sudoku", "--recipe", "sudoku-cpu", "--quiet", "--json", "--set", "model.iters=8", "--set",
              "objective.train_iters=[4,8]", "--set", "data.n_val=8", "--set", "data.n_select=8", "--set",
              "train.warmup_steps=1", "--set", "train.eval_every=100000"]


def cuda_graphs_depth_check(data: Path, folder: Path, device: str = "cuda", steps: int = 200, log_every: int = 50,
                            extra: tuple[str, ...] = (), tol: float = 0.05) -> dict[str, Any]:
    """CUDA graphs where the compiler makes a graph per update (a depth drawn at every step, so a pass replays
    the update's graph a different number of times): the trainer compiled in the default mode and in
    reduce-overhead, from the same seed; the logged losses of the two within `tol`, as for compile_check. The two
    runs are not bitwise equal (bf16 autocast, and CUDA reductions whose order is not fixed: over 60 steps their
    logged losses differed by at most 1.2e-6 on an H100), and 200 steps of training carry the first differences
    on: there a bound of 1e-3 failed by 0.0061, the size of the compiled and eager runs' difference on the paper
    recipe."""
    out = trainer_arms(data, folder, device, DEPTH_ARGS, steps, log_every, extra,
                       [("compiled", COMPILED), ("compiled_cuda_graphs", CUDA_GRAPHS)])
    out.update(loss_max_abs_difference=loss_difference(out, "compiled", "compiled_cuda_graphs", tol),
               cuda_graphs_over_compiled=speedup(out, "compiled_cuda_graphs", "compiled"))
    return out


def nccl_run(data: Path, out: Path) -> dict[str, Any]:
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return {"skipped": f"needs 2 GPUs, this machine has {gpus} (NCCL refuses two ranks on one device)"}
    return trainer_run(data, out, nproc=2)


def solver_check(devices: tuple[str, str] = ("cuda", "cpu")) -> dict[str, Any]:
    """The shipped model solves the example puzzles on CUDA as on the CPU."""
    from hyperset.solve import Solver, timed_solve
    from hyperset.sudoku.parse import parse_file

    puzzles = [p.givens for f in sorted((ROOT / "examples").glob("*.txt")) for p in parse_file(f)]
    out = {}
    for device in devices:
        results, seconds, _ = timed_solve(Solver.load(device=device), puzzles)
        out[device] = {"seconds": seconds, "boards": [r.prediction for r in results],
                       "valid": sum(r.valid for r in results)}
    same = out[devices[0]]["boards"] == out[devices[1]]["boards"]
    if not same:
        raise RuntimeError(f"CUDA and CPU solved {len(puzzles)} puzzles differently")
    return {"puzzles": len(puzzles), "same_boards_as_cpu": same,
            **{f"{d}_{k}": out[d][k] for d in devices for k in ("seconds", "valid")}}


def _median_seconds(fn: Callable[[], Any], repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def onnx_check(folder: Path, batch: int = 256, devices: tuple[str, str] = ("cuda", "cpu"),
               loop_iters: int = 48) -> dict[str, Any]:
    """The unrolled graph (trained depth) and the Loop graph (trained depth and `loop_iters`) on ONNX Runtime's CUDA
    and CPU providers: parity with torch and boards/s."""
    from hyperset.exports import export as E
    from hyperset.exports.runtime import OrtSession
    from hyperset.models import load_checkpoint
    from hyperset.solve import bundled_checkpoint

    model, info = load_checkpoint(bundled_checkpoint(), task="sudoku")
    trained = E.trained_iterations(model, info)
    graphs = {"unrolled": E.export_unrolled(model, trained, folder / "sudoku.onnx", info=info).path,
              "loop": E.export_loop(model, folder / "sudoku-loop.onnx", info=info).path}
    runs = [("unrolled", trained), ("loop", trained), ("loop", loop_iters)]
    boards = E.example_inputs(model.cfg, batch=batch)
    out: dict[str, Any] = {"trained_iters": trained, "batch": batch}
    for graph, iters in runs:
        reference = E.torch_outputs(model, boards, iters)
        feed = None if graph == "unrolled" else iters
        row: dict[str, Any] = {}
        variants = [(d, d, False) for d in devices] + [("cuda_tf32", "cuda", True)] * ("cuda" in devices)
        for label, device, tf32 in variants:
            session = OrtSession(graphs[graph], device, cuda_tf32=tf32)
            if device == "cuda" and session.device != "cuda":
                raise RuntimeError(f"ONNX Runtime came up on {session.provider}: {session.reason}")
            seconds = _median_seconds(lambda s=session, f=feed: E.onnx_outputs(s, boards, f))
            row[label] = {"provider": session.provider,
                           "parity": E.compare(reference, E.onnx_outputs(session, boards, feed)),
                           "boards_per_s": batch / seconds}
        row[f"{devices[0]}_over_{devices[1]}"] = row[devices[0]]["boards_per_s"] / row[devices[1]]["boards_per_s"]
        out[f"{graph}_{iters}"] = row
    return out


def solve_cli_check(iters: int = 48, runs: tuple[tuple[str, str], ...] = (("torch", "cuda"), ("onnx", "cuda"),
                                                                          ("torch", "cpu"))) -> dict[str, Any]:
    """`hyperset-solve examples/*.txt --iters 48 --json` with each (backend, device): every board valid, the same
    boards, and the device and provider the summary reports."""
    files = [str(f) for f in sorted((ROOT / "examples").glob("*.txt"))]
    out: dict[str, Any] = {"iters": iters}
    boards = {}
    for backend, device in runs:
        cmd = [sys.executable, "-c", "from hyperset.cli import solve_main; solve_main()", *files, "--iters",
               str(iters), "--backend", backend, "--device", device, "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
        if proc.returncode:
            raise RuntimeError(f"{backend} on {device}: exit {proc.returncode}: {proc.stderr[-2000:]}")
        report = json.loads(proc.stdout)
        summary = report["summary"]
        if device == "cuda" and "CPUExecutionProvider" in summary["backend"]:
            raise RuntimeError(f"{backend} on {device} ran on {summary['backend']}")
        boards[f"{backend}_{device}"] = [r["prediction"] for r in report["results"]]
        out[f"{backend}_{device}"] = summary
    if len({tuple(b) for b in boards.values()}) != 1:
        raise RuntimeError(f"the runs {list(boards)} solved the examples differently")
    return out


def matmul_peaks(device: torch.device, n: int = 8192) -> dict[str, float]:
    """FLOP/s of an n x n x n matrix product on `device` in fp32 (TF32 off) and bf16, best of 5."""
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        if dtype is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            continue
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            best = min(_timed_sync(lambda a=a, b=b: a @ b, device) for _ in range(5))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
        out[str(dtype).removeprefix("torch.")] = 2 * n**3 / best
    return out


def _timed_sync(fn: Callable[[], Any], device: torch.device) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def search_check(device: str = "cuda", puzzles: int = 2048, batches: tuple[int, ...] = (256, 1024, 2048),
                 backends: tuple[str, ...] = ("torch", "onnx"), peak_n: int = 8192, bucket: str = "51+",
                 seed: int = 3) -> dict[str, Any]:
    """The default command's search on `puzzles` of the hardest bucket at each batch, through each backend on
    `device`: puzzles/s, every board checked, and the model's FLOP/s against measured matrix-product rates."""
    import os

    from flops import count
    from search_bench import puzzles_of
    from search_throughput import backend_solver, measure

    from hyperset.solve import Solver

    ps = puzzles_of(bucket, puzzles, seed, os.cpu_count() or 1)
    base = Solver.load(None, device)
    per_iteration = sum(count(base.model.cfg, 1, iters=1, energies=True)["forward_flops_per_iteration"].values())
    peaks = matmul_peaks(torch.device(device), peak_n)
    out: dict[str, Any] = {"bucket": bucket, "puzzles": puzzles, "seed": seed, "device": device,
                           "flops_per_board_iteration": per_iteration, "matmul_flops_per_s": peaks, "runs": []}
    for name in backends:
        solver = base if name == "torch" else backend_solver(base, name, None, device)
        if name == "onnx" and device == "cuda" and "CUDA" not in solver.backend_name:
            raise RuntimeError(f"ONNX Runtime came up on {solver.backend_name}")
        for batch in batches:
            row = {"backend": name, **measure(solver, ps, batch_size=batch)}
            flops = per_iteration * row["model_iterations_mean"] * row["puzzles"] / row["seconds"]
            row["model_flops_per_s"] = flops
            row["share_of_matmul_rate"] = {k: flops / v for k, v in peaks.items()}
            out["runs"].append(row)
    bad = [r for r in out["runs"] if r["reported_valid_but_invalid"] or r["valid_but_not_the_solution"]]
    if bad:
        raise CheckFailed(f"{len(bad)} runs reported a board valid that is not the solution", out)
    out["best_puzzles_per_s"] = max(r["puzzles_per_s"] for r in out["runs"])
    return out


CHECKS = ("training_amp", "fused_fp32", "trainer_amp", "trainer_compile", "cuda_graphs_depth", "nccl", "solver",
          "onnx_cuda", "solve_cli", "search")


def machine() -> dict[str, Any]:
    device = torch.device("cuda")
    info = {"gpu": torch.cuda.get_device_name(device), "gpus": torch.cuda.device_count(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "bf16_supported": torch.cuda.is_bf16_supported()}
    try:
        import onnxruntime

        info["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        info["onnxruntime"] = None
    return info


def run(checks: tuple[str, ...] = CHECKS) -> dict[str, Any]:
    """The named checks on the first CUDA device, each guarded."""
    device = torch.device("cuda")
    report: dict[str, Any] = {}
    if "training_amp" in checks:
        report["training_amp"] = {p: _guarded(lambda p=p: amp_steps(p, device)) for p in TRAIN_PRESETS}
    if "fused_fp32" in checks:
        report["fused_fp32"] = _guarded(lambda: fused_check(device))
    with tempfile.TemporaryDirectory(prefix="hyperset-gpu-") as tmp:
        folder = Path(tmp)
        trains = {"trainer_amp", "trainer_compile", "cuda_graphs_depth", "nccl"}
        data = sudoku_data(folder) if trains & set(checks) else folder
        if "trainer_amp" in checks:
            report["trainer_amp"] = _guarded(lambda: trainer_run(data, folder / "one"))
        if "trainer_compile" in checks:
            report["trainer_compile"] = _guarded(lambda: compile_check(data, folder / "compile"))
        if "cuda_graphs_depth" in checks:
            report["cuda_graphs_depth"] = _guarded(lambda: cuda_graphs_depth_check(data, folder / "depth"))
        if "nccl" in checks:
            report["nccl"] = _guarded(lambda: nccl_run(data, folder / "two"))
        if "solver" in checks:
            report["solver"] = _guarded(solver_check)
        if "onnx_cuda" in checks:
            report["onnx_cuda"] = _guarded(lambda: onnx_check(folder))
    if "solve_cli" in checks:
        report["solve_cli"] = _guarded(solve_cli_check)
    if "search" in checks:
        report["search"] = _guarded(search_check)
    return report


def failed(report: dict[str, Any]) -> list[str]:
    """The names of the checks in `report` that failed (a report may hold only some of them)."""
    named: dict[str, Any] = {f"training_amp/{k}": v for k, v in report.get("training_amp", {}).items()}
    named.update({k: report[k] for k in CHECKS[1:] if k in report})
    return [name for name, r in named.items() if not r["ok"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=bench_args.output_file, default=RESULTS / "gpu_check.json")
    ap.add_argument("--only", nargs="+", choices=CHECKS, metavar="CHECK",
                    help=f"run these checks and replace their results in an existing --out ({', '.join(CHECKS)})")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"gpu_check: PyTorch sees no CUDA device (torch {torch.__version__}, built with CUDA "
              f"{torch.version.cuda or 'none'}): nothing to check here, {args.out} left as it is")
        return 0
    checks = tuple(args.only or CHECKS)
    command = bench_args.command_line("gpu_check", argv)
    report: dict[str, Any] = {}
    if args.only and args.out.exists():
        report = json.loads(args.out.read_text())
        report["runs"] = [r for r in report.get("runs", []) if set(r["checks"]) - set(checks)]
    info = machine()
    results = run(checks)
    report.update(results)
    report["runs"] = [*report.get("runs", []), {"command": command, "checks": list(checks), **info}]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    bad = failed(results)
    print(f"gpu_check on {info['gpu']}: " + (f"FAILED {', '.join(bad)}" if bad else f"passed: {', '.join(checks)}"))
    print(f"wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
