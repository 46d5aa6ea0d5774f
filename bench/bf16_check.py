"""The bf16 products at inference against fp32: board accuracy on held-out boards and solving speed, one run.

    python bench/bf16_check.py --rrn data/sudoku --out bench/results/bf16_check.json

``HYPERSET_CPU_PRECISION=bf16`` (``hyperset.accel.fused.using_cpu_precision``) rounds both operands of the
update's products of a state by a weight to bf16 on CPUs with native bf16 dot products (avx512_bf16, amx_bf16);
everything else stays fp32. This script measures what that changes, with the shipped model (or --checkpoint):

- accuracy: the first --boards boards of the RRN validation split (--rrn; held out from training), one pass read
  out at each of --iters, and the solver's default strategy, in fp32 and in bf16; board accuracy, and the boards
  whose answer differs between the two;
- speed: a pass of a --batch-board batch (real puzzles from examples/mixed.csv, tiled) at each of --iters with the
  trace, as the solver runs it; fp32 and bf16 alternate within each of --rounds rounds, medians reported.

Writes the JSON with the machine (bench/flops.py) and the command. Exits 2 with a reason on a CPU without native
bf16, where bf16 is not used.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import bench_args
import numpy as np
import torch
from flops import machine
from onnx_bench import bench_boards

from hyperset.accel import fused
from hyperset.checkpoint import atomic_write_json
from hyperset.defaults import DEFAULT_STRATEGY
from hyperset.device import cpu_has_native_bf16
from hyperset.solve import Solver
from hyperset.sudoku.evaluate import iteration_curve, load_boards, run_strategy

PRECISIONS = ("fp32", "bf16")


def accuracy(solver: Solver, boards: Any, iters: list[int]) -> dict[str, Any]:
    """Per precision: board accuracy of one pass at each depth and of the default strategy, and which boards
    each one got right (for the differences)."""
    out: dict[str, Any] = {}
    for name in PRECISIONS:
        with fused.using_cpu_precision(name):
            curve = iteration_curve(solver, boards, max(iters), progress=None)
            default = run_strategy(solver, boards, DEFAULT_STRATEGY, progress=None)
        out[name] = {"one_pass": {str(k): float(curve.board_right[k - 1].mean()) for k in iters},
                     "right": {str(k): curve.board_right[k - 1] for k in iters},
                     "default_strategy": {"strategy": default["strategy"], "board_acc": default["board_acc"]}}
        print(f"  {name}: one pass " + " ".join(f"@{k} {100 * v:.1f}%" for k, v in out[name]["one_pass"].items())
              + f"; {default['strategy']} {100 * default['board_acc']:.1f}%", file=sys.stderr)
    for k in map(str, iters):
        a, b = out["fp32"]["right"][k], out["bf16"]["right"][k]
        out.setdefault("one_pass_change_points", {})[k] = round(100 * (b.mean() - a.mean()), 2)
        out.setdefault("one_pass_boards_differing", {})[k] = int(np.sum(a != b))
    out["default_strategy_change_points"] = round(
        100 * (out["bf16"]["default_strategy"]["board_acc"] - out["fp32"]["default_strategy"]["board_acc"]), 2)
    for name in PRECISIONS:
        del out[name]["right"]
    return out


def speed(model: Any, batch: int, iters: list[int], rounds: int) -> dict[str, Any]:
    """Boards/s of a traced pass per depth and precision, the precisions alternating within each round."""
    boards = bench_boards(batch)
    out: dict[str, Any] = {}
    for k in iters:
        times: dict[str, list[float]] = {name: [] for name in PRECISIONS}
        with torch.inference_mode():
            for _ in range(rounds + 1):  # the first round warms up
                for name in PRECISIONS:
                    with fused.using_cpu_precision(name):
                        t0 = time.perf_counter()
                        model.run(boards, iters=k, trace=True)
                        times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(ts[1:]) for name, ts in times.items()}
        out[str(k)] = {"batch": batch, **{f"{name}_boards_per_s": batch / med[name] for name in PRECISIONS},
                       "bf16_over_fp32": med["fp32"] / med["bf16"],
                       "times_s": {name: ts[1:] for name, ts in times.items()}}
        print(f"  @{k}: fp32 {batch / med['fp32']:.1f} boards/s, bf16 {batch / med['bf16']:.1f} "
              f"({med['fp32'] / med['bf16']:.2f}x)", file=sys.stderr)
    return out


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rrn", required=True, help="RRN data folder (its validation split)")
    ap.add_argument("--checkpoint", default=None, help="checkpoint folder [the shipped model]")
    ap.add_argument("--boards", type=bench_args.count, default=1000, help="held-out boards for the accuracy")
    ap.add_argument("--iters", type=bench_args.iteration_counts, default=[16, 64],
                    help="one-pass depths, comma-separated [16,64]")
    ap.add_argument("--batch", type=bench_args.count, default=128, help="boards per timed pass")
    ap.add_argument("--rounds", type=bench_args.count, default=5)
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--out", type=bench_args.output_file, default="bench/results/bf16_check.json")
    args = ap.parse_args(argv)
    if not cpu_has_native_bf16():
        raise bench_args.BenchInputError("this CPU has no native bf16 (avx512_bf16 or amx_bf16): bf16 is not used "
                                         "here, so there is nothing to compare")
    if fused.cpu_matmul_library() != "onednn":
        raise bench_args.BenchInputError("the products run on ATen here (HYPERSET_CPU_MATMUL), which bf16 does not "
                                         "change; bf16 applies to oneDNN's GEMM")
    torch.set_num_threads(args.threads)
    solver = Solver.load(args.checkpoint, "cpu")
    boards = load_boards(args.rrn, "valid", args.boards)
    out: dict[str, Any] = {"machine": machine(args.threads), "checkpoint": args.checkpoint or "shipped",
                           "boards": len(boards.puzzles), "command": bench_args.command_line("bf16_check", argv)}
    print("accuracy ...", file=sys.stderr)
    out["accuracy"] = accuracy(solver, boards, args.iters)
    print("speed ...", file=sys.stderr)
    out["speed"] = speed(solver.model, args.batch, args.iters, args.rounds)
    atomic_write_json(args.out, out)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
