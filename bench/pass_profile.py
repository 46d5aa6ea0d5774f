"""Where an inference pass's time goes on a CPU: the C kernels' calls one by one, against the pass.

    python bench/pass_profile.py --threads 1 --batch 128 --iters 16 --out bench/results/pass_profile.json

The runner of bench/onnx_bench.py named `pytorch` (the shipped Sudoku model, real puzzles tiled to the batch, one
traced pass as the solver runs it, in the library's slices of rows), with every call of the C kernels that the
acceleration policy makes (``hyperset.accel.cpu_gemm``: the products of a state by a weight and what is fused
around them; ``hyperset.accel.cpu_kernels``: the attention maps, their energy, the row passes) timed with a wall
clock around it; `other` is the pass less their sum: the step sizes, the embedding and readout, the library's own
calls and Python. Medians of --repeats passes after one of warm-up. For the products' operators the JSON gives the
GFLOP/s they ran at inside the pass (their multiply-adds x 2 over their time) and, beside them, the rate the same
call reaches alone on warm operands (`alone_gflops`: the same call with the same arguments, repeated).

The timers cost a few microseconds a call (tens of calls a pass), so the pass here runs within a percent or two of
bench/onnx_bench.py's; the JSON records both the pass with the timers and without them.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from hyperset.accel import cpu_gemm, cpu_kernels
from hyperset.checkpoint import atomic_write_json

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "results"

import bench_args  # noqa: E402
from onnx_bench import bench_boards, load_bench_model, machine_info  # noqa: E402

# the products' operators (hyperset.accel.cpu_gemm's functions) and the FLOPs of one call from its arguments: the
# formula registered for the operator each calls with the same arguments (for torch.utils.flop_counter)
PRODUCT_OPS = {"ff_update": torch.ops.hyperset.ff_update, "step_product": torch.ops.hyperset.step_product,
               "matmul": torch.ops.hyperset.gemm, "relu_energy": torch.ops.hyperset.relu_energy_x,
               "project_heads": torch.ops.hyperset.project_heads}
PRODUCT_FLOPS: dict[str, Callable[..., int]] = {name: flop_registry[op] for name, op in PRODUCT_OPS.items()}
# the other kernels' operators the policy calls
MAPS_OPERATORS = ("bisoftmax_attention_heads", "bisoftmax_attention", "bisoftmax_energy", "relu_energy", "relu_rms",
                  "heads_rms")


class Timers:
    """Wall-clock seconds and calls per operator while `on`, and one call's arguments per product operator (to time
    it alone afterwards)."""

    def __init__(self) -> None:
        self.on = False
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.flops: dict[str, int] = {}
        self.example: dict[str, tuple[Callable[..., Any], tuple]] = {}

    def reset(self) -> None:
        self.seconds, self.calls, self.flops = {}, {}, {}

    def wrap(self, module: Any, name: str, key: str) -> Callable[[], None]:
        """Time module.name under `key`; returns what puts the original back."""
        original = getattr(module, name)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            took = time.perf_counter() - t0
            if out is not None:
                self.seconds[key] = self.seconds.get(key, 0.0) + took
                self.calls[key] = self.calls.get(key, 0) + 1
                if key in PRODUCT_FLOPS:
                    self.flops[key] = self.flops.get(key, 0) + PRODUCT_FLOPS[key](*args, **kwargs)
                    self.example.setdefault(key, (original, args))
            return out

        setattr(module, name, timed)
        return lambda: setattr(module, name, original)


def alone_rate(fn: Callable[..., Any], args: tuple, flops: int, repeats: int = 20) -> float:
    """GFLOP/s of fn(*args) repeated on warm operands, best of `repeats`."""
    fn(*args)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return flops / best / 1e9


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model, _, source = load_bench_model()
    boards = bench_boards(args.batch)
    timers = Timers()
    restore = [timers.wrap(cpu_gemm, name, name) for name in PRODUCT_FLOPS]
    restore += [timers.wrap(cpu_kernels, name, f"maps:{name}") for name in MAPS_OPERATORS
                if callable(getattr(cpu_kernels, name, None))]
    passes, plain, per_op = [], [], []
    try:
        with torch.inference_mode():
            model.run(boards, iters=args.iters, trace=True)  # warm-up: kernels built, weights packed
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                model.run(boards, iters=args.iters, trace=True)
                plain.append(time.perf_counter() - t0)
                timers.reset()
                timers.on = True
                t0 = time.perf_counter()
                model.run(boards, iters=args.iters, trace=True)
                passes.append(time.perf_counter() - t0)
                timers.on = False
                per_op.append((dict(timers.seconds), dict(timers.calls), dict(timers.flops)))
            alone = {key: alone_rate(fn, a, PRODUCT_FLOPS[key](*a)) for key, (fn, a) in timers.example.items()}
    finally:
        for undo in restore:
            undo()
    pass_s = statistics.median(passes)
    ops = []
    for key in sorted({k for seconds, _, _ in per_op for k in seconds}):
        seconds = statistics.median(s.get(key, 0.0) for s, _, _ in per_op)
        row: dict[str, Any] = {"op": key, "seconds": seconds, "share_of_pass": seconds / pass_s,
                               "calls": per_op[0][1].get(key, 0)}
        if key in PRODUCT_FLOPS:
            row["gflops_in_pass"] = per_op[0][2][key] / seconds / 1e9
            row["alone_gflops"] = alone.get(key)
        ops.append(row)
    ops.sort(key=lambda r: -r["seconds"])
    timed = sum(r["seconds"] for r in ops)
    return {
        "machine": machine_info(args.threads), "model_source": source, "iters": args.iters, "batch": args.batch,
        "repeats": args.repeats, "pass_seconds": pass_s, "pass_seconds_without_timers": statistics.median(plain),
        "boards_per_s": args.batch / statistics.median(plain), "ops": ops,
        "other": {"seconds": pass_s - timed, "share_of_pass": (pass_s - timed) / pass_s},
        "note": "wall-clock time around each C kernel call of one traced pass; `other` is the rest of the pass",
    }


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=bench_args.count, default=1, help="torch intra-op threads [1]")
    parser.add_argument("--batch", type=bench_args.count, default=128, help="boards [128]")
    parser.add_argument("--iters", type=bench_args.iterations, default=16, help="iterations of the pass [16]")
    parser.add_argument("--repeats", type=bench_args.count, default=5, help="timed passes [5]")
    parser.add_argument("--out", type=bench_args.output_file, default=RESULTS / "pass_profile.json")
    args = parser.parse_args(argv)
    report = run(args)
    report["command"] = bench_args.command_line("pass_profile", argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    for row in report["ops"]:
        rate = (f"  {row['gflops_in_pass']:.0f} GFLOP/s (alone {row['alone_gflops']:.0f})"
                if "gflops_in_pass" in row else "")
        print(f"{row['op']:34s} {row['seconds'] * 1e3:8.1f} ms  {row['share_of_pass']:6.1%}{rate}")
    print(f"{'other':34s} {report['other']['seconds'] * 1e3:8.1f} ms  {report['other']['share_of_pass']:6.1%}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
