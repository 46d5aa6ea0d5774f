"""Sudoku training and inference throughput on this machine (boards/s), written to bench/results/ (or --out) as JSON.

    python bench/train_throughput.py [--threads 1] [--steps 10]

Rows:
  reference   the authors' configuration at d=128 (4 heads, M=4d, 24 iterations, batch 64, loss on the last
              iteration, fp32) — the number the issue quotes for their code (~29 boards/s training here)
  paper-d768  the paper's model (d=768, 12 heads, 24 iterations, batch 16, fp32)
  ours        the shipped recipe (d=128, 16 iterations, batch 32, loss on every iteration) in fp32 and bf16
  *-compile   the same under torch.compile (warm-up time, which includes compilation, is recorded)
  *-accum2    the same training step in two parts of 16 boards, gradients accumulated (train.accum_steps = 2)
Each row is timed after warm-up steps; the machine's load at the time is recorded (a shared 2-core VM). Each row
also gets its share of the matmul roofline measured at its own shapes and dtype (bench/flops.py: the boards/s its
matmuls alone would allow; the readout is counted once per pass, also for the rows with a loss on every iteration,
where it is under 1% of the work). These rows differ in work: they are no speed comparison between codes (that is
bench/peer_bench.py).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import bench_args
import flops
import torch
import torch.nn.functional as F
from peer_bench import in_slices

from hyperset.checkpoint import atomic_write_json
from hyperset.config import preset_config
from hyperset.device import cpu_has_native_bf16
from hyperset.models import HyperSETModel

RESULTS = Path(__file__).resolve().parent / "results"

ROWS = {
    "reference-d128-fp32": dict(preset="sudoku", overrides=dict(dim=128, heads=4, ff_hidden=512, iters=24),
                                batch=64, supervise="last", amp=False),
    "paper-d768-fp32": dict(preset="sudoku", overrides={}, batch=16, supervise="last", amp=False),
    "ours-fp32": dict(preset="sudoku-cpu", overrides={}, batch=32, supervise="all", amp=False),
    "ours-bf16": dict(preset="sudoku-cpu", overrides={}, batch=32, supervise="all", amp=True),
    "ours-fp32-compile": dict(preset="sudoku-cpu", overrides={}, batch=32, supervise="all", amp=False, compile=True),
    "ours-bf16-compile": dict(preset="sudoku-cpu", overrides={}, batch=32, supervise="all", amp=True, compile=True),
    "ours-fp32-compile-accum2": dict(preset="sudoku-cpu", overrides={}, batch=32, supervise="all", amp=False,
                                     compile=True, accum=2),
    "ours-bf16-compile-accum2": dict(preset="sudoku-cpu", overrides={}, batch=32, supervise="all", amp=True,
                                     compile=True, accum=2),
}


def measure(row: dict, steps: int, warmup: int) -> dict:
    torch.compiler.reset()  # each row compiles anew: past rows' graphs would count towards dynamo's recompile limit
    torch.manual_seed(0)
    model = HyperSETModel(preset_config(row["preset"], **row["overrides"]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    net = torch.compile(model) if row.get("compile") else model
    b = row["batch"]
    puzzles = torch.randint(0, 10, (b, 81))
    target = torch.where(puzzles == 0, torch.randint(0, 9, (b, 81)), -100)

    def ctx() -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=row["amp"])

    def train_step() -> None:
        opt.zero_grad()
        for p, t, share in in_slices(puzzles, target, row.get("accum", 1)):  # weighted as the trainer does
            with ctx():
                if row["supervise"] == "all":
                    logits = net(p, all_logits=True)
                    loss = F.cross_entropy(logits.float().flatten(0, 2), t.repeat(len(logits), 1).flatten(),
                                           ignore_index=-100)
                else:
                    loss = F.cross_entropy(net(p).float().flatten(0, 1), t.flatten(), ignore_index=-100)
            (loss * share).backward()
        opt.step()

    t0 = time.perf_counter()
    for _ in range(warmup):  # includes compilation for the compiled rows
        train_step()
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        train_step()
    train_rate = steps * b / (time.perf_counter() - t0)
    model.eval()
    with torch.no_grad(), ctx():
        net(puzzles)
        t0 = time.perf_counter()
        for _ in range(steps):
            net(puzzles)
        infer_rate = steps * b / (time.perf_counter() - t0)
    roof = flops.measure_rooflines(model.cfg, b)["bfloat16" if row["amp"] else "float32"]
    train_roof, infer_roof = roof["training"]["roofline_boards_per_s"], roof["inference"]["roofline_boards_per_s"]
    return {**{k: v for k, v in row.items()}, "iters": model.cfg.iters, "dim": model.cfg.dim,
            "parameters": model.num_parameters(), "train_boards_per_s": train_rate,
            "inference_boards_per_s": infer_rate, "warmup_seconds": warmup_s,
            "train_roofline_boards_per_s": train_roof, "train_share_of_roofline": train_rate / train_roof,
            "inference_roofline_boards_per_s": infer_roof, "inference_share_of_roofline": infer_rate / infer_roof}


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--steps", type=bench_args.count, default=10)
    ap.add_argument("--warmup", type=bench_args.at_least(0), default=3)
    ap.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS), metavar="ROW",
                    help=f"rows to measure [all: {', '.join(ROWS)}]")
    ap.add_argument("--out", type=bench_args.output_file, default=RESULTS / "train_throughput.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    for name in args.rows:
        r = measure(ROWS[name], args.steps, args.warmup)
        r["name"] = name
        results.append(r)
        print(f"{name:22s} train {r['train_boards_per_s']:7.1f} boards/s ({100 * r['train_share_of_roofline']:.0f}% "
              f"of the roofline)   inference {r['inference_boards_per_s']:7.1f} boards/s "
              f"({100 * r['inference_share_of_roofline']:.0f}%)", flush=True)
    out = {"threads": args.threads, "torch": torch.__version__, "machine": flops.machine(args.threads),
           "native_bf16": cpu_has_native_bf16(), "load_average": os.getloadavg(), "rows": results,
           "command": bench_args.command_line("train_throughput", argv)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
