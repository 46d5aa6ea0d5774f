"""The solver on puzzles it was not trained near: generated ones, split by how hard they are.

The shipped model's accuracies in the README are on the validation draw of its training data, where 89% of the
puzzles fall to naked and hidden singles alone. This benchmark generates puzzles with the project's generator
(``hyperset.sudoku.exact.generate``: a random full grid, digits removed at random while the solution stays
unique), solves them with a strategy, checks every board against the exact solution, and splits the results by
whether singles alone solve the puzzle (``hyperset.sudoku.exact.propagate_singles``) and by the number of givens.

    python bench/sudoku_generated.py [--checkpoint DIR] [--puzzles 300] [--givens 22 30] [--seed 5]

Writes ``bench/results/sudoku_generated.json``.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_args  # noqa: E402

from hyperset.checkpoint import atomic_write_json  # noqa: E402
from hyperset.solve import DEFAULT_PASSES, Solver  # noqa: E402
from hyperset.sudoku.exact import _LOWEST_REACHABLE, generate, propagate_singles  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _share(rows: list[dict[str, Any]]) -> dict[str, Any]:
    solved = sum(r["valid"] for r in rows)
    return {"puzzles": len(rows), "solved": solved, "accuracy": solved / len(rows) if rows else None}


def measure(checkpoint: str | None, n: int, givens: tuple[int, int], seed: int, strategy: str,
            iters: int | str | None, threads: int) -> dict[str, Any]:
    """Generate, solve, check and split; the JSON document."""
    torch.set_num_threads(threads)
    made = generate(n, givens[0], givens[1], seed=seed)
    solver = Solver.load(checkpoint, "cpu")
    start = time.perf_counter()
    results = solver.solve([p for p, _ in made], iters=iters, strategy=strategy)
    seconds = time.perf_counter() - start
    rows = []
    for (puzzle, solution), r in zip(made, results):
        if r.valid and r.prediction != solution:  # a unique solution: a valid board is that one
            raise RuntimeError(f"a board called valid differs from the solution of {puzzle}")
        rows.append({"givens": 81 - puzzle.count("0"), "singles": "0" not in propagate_singles(puzzle),
                     "valid": r.valid, "iterations": r.iterations})
    by_givens = {str(g): _share([r for r in rows if r["givens"] == g]) for g in sorted({r["givens"] for r in rows})}
    return {
        "checkpoint": checkpoint or "shipped", "strategy": strategy, "iters": iters or solver.default_iters,
        "passes": DEFAULT_PASSES if strategy == "commit" else 1,
        "generator": f"hyperset.sudoku.exact.generate({n}, {givens[0]}, {givens[1]}, seed={seed})",
        "all": _share(rows), "singles_solve": _share([r for r in rows if r["singles"]]),
        "needs_more_than_singles": _share([r for r in rows if not r["singles"]]), "by_givens": by_givens,
        "mean_iterations": sum(r["iterations"] for r in rows) / len(rows), "seconds": round(seconds, 2),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": threads,
                    "torch": torch.__version__},
    }


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the shipped model)")
    ap.add_argument("--puzzles", type=bench_args.count, default=300)
    ap.add_argument("--givens", type=bench_args.at_least(17), nargs=2, default=(22, 30), metavar=("LOW", "HIGH"))
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--strategy", choices=("commit", "single"), default="commit")
    ap.add_argument("--iters", type=bench_args.iterations, default=None,
                    help="iterations per pass (default: the model's)")
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--out", type=bench_args.output_file, default=RESULTS / "sudoku_generated.json")
    args = ap.parse_args(argv)
    if args.givens[0] > args.givens[1] or not _LOWEST_REACHABLE <= args.givens[1] <= 80:
        ap.error(f"--givens {args.givens[0]} {args.givens[1]}: expected LOW <= HIGH and {_LOWEST_REACHABLE} <= HIGH "
                 f"<= 80 (removing cells at random practically never leaves fewer than {_LOWEST_REACHABLE} givens)")
    doc = measure(args.checkpoint, args.puzzles, tuple(args.givens), args.seed, args.strategy, args.iters,
                  args.threads)
    doc["command"] = bench_args.command_line("sudoku_generated", argv)
    atomic_write_json(args.out, doc)
    a, s, m = doc["all"], doc["singles_solve"], doc["needs_more_than_singles"]
    print(f"{a['solved']}/{a['puzzles']} solved ({100 * a['accuracy']:.1f}%): {s['solved']}/{s['puzzles']} of "
          f"those singles solve, {m['solved']}/{m['puzzles']} of those that need more; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
