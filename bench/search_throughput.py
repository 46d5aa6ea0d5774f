"""The search's throughput: puzzles per second per difficulty bucket, PyTorch and ONNX Runtime, 1 and 2 CPU threads.

    python bench/search_throughput.py --puzzles 200 --threads 1 2 --backends torch onnx \
        --out bench/results/search_throughput.json

For each bucket of hyperset.sudoku.rated (`--seed` draws the puzzles, a seed used for no training), on the shipped
model unless --checkpoint says otherwise, the solver's default command (the search strategy at its default budget
and batch) runs the bucket's puzzles as one list through each backend at each thread count, after a warm-up on a
few puzzles of the same bucket. Per run: puzzles/s and model calls (nodes) per second, the share solved, and every
board checked against the rules and against the generator's solution (`reported_valid_but_invalid` and
`valid_but_not_the_solution` must be 0). "end to end" times what `hyperset-solve` does with a list: the puzzles
are read and counted first (an exact search for how many solutions each has, so a puzzle with none or with several
is reported, not "solved"); "search only" gives the solutions (the check that needs no count), the search's own
time. The model's share (nodes of the same search with a uniform prior) is bench/search_bench.py's.

`measure` is the function bench/gpu_check.py runs on a GPU with larger batches. Writes the JSON (and says the
machine, its load and the ONNX Runtime provider that ran) and a PNG beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import bench_args
from flops import load_average, machine
from search_bench import puzzles_of, run_stats

from hyperset.checkpoint import atomic_write_json
from hyperset.device import set_cpu_threads
from hyperset.solve import Solver
from hyperset.sudoku import rated

BACKENDS = ("torch", "onnx")
WARMUP = 8  # puzzles of the bucket solved first (kernels, ONNX Runtime's allocations)


def measure(solver: Solver, ps: list[rated.RatedPuzzle], batch_size: int | None = None,
            search_only: bool = False) -> dict[str, Any]:
    """The default command's solve of `ps` (one list, after a warm-up on its first WARMUP puzzles) through
    `solver`: `run_stats` plus model calls per second, the batch and the load. `search_only`: the solutions are
    given, so the puzzles are not counted first."""
    puzzles, solutions = [p.puzzle for p in ps], [p.solution for p in ps]
    kw: dict[str, Any] = {"batch_size": batch_size}
    solver.solve(puzzles[:WARMUP], solutions=solutions[:WARMUP] if search_only else None, **kw)
    load = load_average()
    t0 = time.perf_counter()
    results = solver.solve(puzzles, solutions=solutions if search_only else None, **kw)
    seconds = time.perf_counter() - t0
    out = run_stats(results, solutions, seconds)
    nodes = sum(r.search["nodes"] for r in results if r.search is not None)
    out.update(nodes_per_s=round(nodes / seconds, 2), batch_size=batch_size or solver.default_batch_size,
               load_average_1min_before=load, load_average_1min_after=load_average(),
               runner=solver.backend_name, device=solver.device_name())
    return out


def backend_solver(base: Solver, name: str, threads: int | None, device: str = "cpu") -> Solver:
    """`base` on the backend called `name` (torch: the model itself) on `device`, at `threads` CPU threads (None:
    as they are)."""
    if threads is not None:
        set_cpu_threads(threads)
    if name == "torch":
        return base.with_backend(None)
    from hyperset.cli import make_backend

    return base.with_backend(make_backend(name, base, None, device, threads))


def run(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    sets = {b: puzzles_of(b, args.puzzles, args.seed, max(args.threads)) for b in args.buckets}
    base = Solver.load(args.checkpoint, "cpu")
    out: dict[str, Any] = {
        "settings": {"puzzles": args.puzzles, "seed": args.seed, "threads": args.threads, "backends": args.backends,
                     "checkpoint": args.checkpoint or "shipped", "strategy": "search (the default command)",
                     "search_iters": base.search_iters, "default_iters": base.default_iters,
                     "batch_size": args.batch_size or base.default_batch_size, "generator": rated.engine(),
                     "command": bench_args.command_line("search_throughput", argv)},
        "machine": machine(max(args.threads)), "runs": []}
    for threads in args.threads:
        for name in args.backends:
            solver = backend_solver(base, name, threads)
            for b, ps in sets.items():
                for search_only in (False, True):
                    row = {"bucket": b, "backend": name, "threads": threads,
                           "timing": "search only" if search_only else "end to end",
                           **measure(solver, ps, args.batch_size, search_only)}
                    out["runs"].append(row)
                    print(f"{b:>5} {name:5} {threads} thread(s) {row['timing']:10}: {row['puzzles_per_s']:8.2f} "
                          f"puzzles/s, {row['nodes_per_s']:8.1f} nodes/s, solved {row['solve_rate']:.1%}, "
                          f"reported valid but invalid {row['reported_valid_but_invalid']}", flush=True)
                    atomic_write_json(args.out, out)
    out["all_checked"] = all(r["reported_valid_but_invalid"] == 0 and r["valid_but_not_the_solution"] == 0
                             for r in out["runs"])
    atomic_write_json(args.out, out)
    return out


def markdown(out: dict[str, Any]) -> str:
    """The docs' table: puzzles/s per bucket for each backend and thread count (end to end / search only)."""
    runs = out["runs"]
    keys = list(dict.fromkeys((r["backend"], r["threads"]) for r in runs))
    buckets = list(dict.fromkeys(r["bucket"] for r in runs))
    lines = ["| bucket | " + " | ".join(f"{b}, {t} thread{'s' * (t > 1)}" for b, t in keys) + " | solved |",
             "|---|" + "---|" * (len(keys) + 1)]
    for bucket in buckets:
        cells, solved = [], []
        for b, t in keys:
            pair = {r["timing"]: r for r in runs if (r["bucket"], r["backend"], r["threads"]) == (bucket, b, t)}
            cells.append(" / ".join(f"{pair[k]['puzzles_per_s']:.1f}" for k in ("end to end", "search only")
                                    if k in pair))
            solved += [r["solve_rate"] for r in pair.values()]
        lines.append(f"| {bucket} | " + " | ".join(cells) + f" | {100 * min(solved):.1f}% |")
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in out["runs"] if r["timing"] == "end to end"]
    keys = list(dict.fromkeys((r["backend"], r["threads"]) for r in runs))
    buckets = list(dict.fromkeys(r["bucket"] for r in runs))
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / max(len(keys), 1)
    for i, (b, t) in enumerate(keys):
        rate = {r["bucket"]: r["puzzles_per_s"] for r in runs if (r["backend"], r["threads"]) == (b, t)}
        xs = [j + (i - (len(keys) - 1) / 2) * width for j in range(len(buckets))]
        ax.bar(xs, [rate.get(k, 0) for k in buckets], width, label=f"{b}, {t} thread{'s' * (t > 1)}")
    ax.set_xticks(range(len(buckets)), [f"bucket {k}" for k in buckets])
    ax.set_yscale("log")
    ax.set_ylabel("puzzles/s (the default command, every board checked)")
    ax.legend(fontsize=7)
    ax.set_title(f"The search's throughput ({out['machine'].get('cpu', 'cpu')})", fontsize=9)
    bench_args.save_figure(fig, path)


def _threads(text: str) -> int:
    n = bench_args.count(text)
    if n > (os.cpu_count() or 1):
        raise argparse.ArgumentTypeError(f"{n} threads: this machine has {os.cpu_count()} logical CPUs")
    return n


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--puzzles", type=bench_args.count, default=200, help="puzzles per bucket")
    ap.add_argument("--seed", type=int, default=3, help="the generator's seed (held out from training)")
    ap.add_argument("--buckets", nargs="+", choices=rated.BUCKETS, default=list(rated.BUCKETS))
    ap.add_argument("--threads", nargs="+", type=_threads, default=[1, 2], help="CPU thread counts")
    ap.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    ap.add_argument("--batch-size", type=bench_args.count, default=None, help="boards per batch [the solver's]")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--out", type=bench_args.output_file, default="bench/results/search_throughput.json")
    ap.add_argument("--markdown", metavar="JSON", default=None, help="print the docs' table of a result, run nothing")
    args = ap.parse_args(argv)
    if args.markdown:
        import json

        print(markdown(json.loads(Path(args.markdown).read_text())))
        return
    if "onnx" in args.backends:
        from hyperset.extras import MissingExtra, require

        try:
            require("onnx", "onnx", "onnxruntime", what="--backends onnx")
        except MissingExtra as e:
            raise bench_args.BenchInputError(str(e)) from None
    out = run(args, argv)
    plot(out, args.out.with_suffix(".png"))
    print(markdown(out))
    hardest = [r["puzzles_per_s"] for r in out["runs"] if r["bucket"] == args.buckets[-1]]
    print(f"hardest bucket: {min(hardest):.1f}-{max(hardest):.1f} puzzles/s; every board checked: "
          f"{out['all_checked']}", file=sys.stderr)


if __name__ == "__main__":
    main()
