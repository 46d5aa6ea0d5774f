"""What the parser's check of a puzzle costs: the bounded count of its solutions, in C and in Python.

    python bench/parse_check.py --rrn data/sudoku --out bench/results/parse_check.json

Every puzzle read without its solution is counted to 2 solutions within hyperset.sudoku.parse.SEARCH_NODES search
nodes (`hyperset.sudoku.rated.count_solutions_within`: the C library where it can be had, else
`hyperset.sudoku.exact`'s search in Python; the same search node for node). Per set, for each: ms per puzzle
(mean, median, max), the share told (not None), and whether the two gave the same answers. The sets: the
17-given puzzles of the RRN validation split (--rrn, first --n) and --n generated puzzles of each rated bucket
(hyperset.sudoku.rated, `--seed`). One thread; writes the JSON with the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import bench_args
from flops import machine
from search_bench import puzzles_of

from hyperset.checkpoint import atomic_write_json
from hyperset.sudoku import exact, rated
from hyperset.sudoku.data import find_split, givens_count, load_csv
from hyperset.sudoku.parse import SEARCH_NODES


def timed_counts(count: Any, puzzles: list[str]) -> tuple[list[int | None], list[float]]:
    found, ms = [], []
    for p in puzzles:
        t0 = time.perf_counter()
        found.append(count(p, 2, SEARCH_NODES))
        ms.append(1e3 * (time.perf_counter() - t0))
    return found, ms


def measure(puzzles: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"puzzles": len(puzzles)}
    answers = {}
    for name, count in (("c", rated.count_solutions_within), ("python", exact.count_solutions_within)):
        if name == "c" and rated._library() is None:
            out["c"] = {"skipped": rated.engine()}
            continue
        found, ms = timed_counts(count, puzzles)
        answers[name] = found
        out[name] = {"ms_mean": round(statistics.mean(ms), 4), "ms_median": round(statistics.median(ms), 4),
                     "ms_max": round(max(ms), 3), "told": round(sum(f is not None for f in found) / len(found), 4)}
    if len(answers) == 2:
        out["same_answers"] = answers["c"] == answers["python"]
        out["python_over_c"] = round(out["python"]["ms_mean"] / out["c"]["ms_mean"], 1)
    return out


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rrn", default=None, help="RRN data folder: its validation split's 17-given puzzles")
    ap.add_argument("--n", type=bench_args.count, default=1000, help="puzzles per set")
    ap.add_argument("--seed", type=int, default=3, help="the rated puzzles' seed")
    ap.add_argument("--buckets", nargs="*", choices=rated.BUCKETS, default=list(rated.BUCKETS))
    ap.add_argument("--out", type=bench_args.output_file, default="bench/results/parse_check.json")
    args = ap.parse_args(argv)
    sets: dict[str, list[str]] = {}
    if args.rrn:
        puzzles, _ = load_csv(find_split(args.rrn, "valid"))
        picked = puzzles[givens_count(puzzles) == 17][:args.n]
        sets["rrn valid, 17 givens"] = ["".join(map(str, p)) for p in picked]
    for b in args.buckets:
        sets[f"rated {b}"] = [p.puzzle for p in puzzles_of(b, args.n, args.seed, 1)]
    out: dict[str, Any] = {"search_nodes": SEARCH_NODES, "engine": rated.engine(), "machine": machine(1),
                           "command": bench_args.command_line("parse_check", argv), "sets": {}}
    for name, puzzles in sets.items():
        out["sets"][name] = measure(puzzles)
        row = out["sets"][name]
        print(f"{name}: {row}", file=sys.stderr)
        atomic_write_json(args.out, out)


if __name__ == "__main__":
    main()
