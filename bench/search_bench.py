"""Inference-time scaling on rated puzzles: solve rate against compute for every strategy, and the model's share.

    python bench/search_bench.py --puzzles 1000 --seed 1 --threads 2 --out bench/results/search_bench.json

For each difficulty bucket of hyperset.sudoku.rated (0, 1-2, 3-10, 11-50, 51+; `--seed` draws the puzzles, never
a seed used for training), on the shipped model unless --checkpoint says otherwise:

  * the default command's solver (strategy search, its default budget): share solved, boards reported valid that
    are not (must be 0), puzzles/s, nodes (model calls) and backtracks per board, the share solved by the model
    without a single backtrack;
  * the same search with the exact checks first (the model sees what they leave, no first look at the puzzle
    as given) and with a uniform prior (same checks, same order rules, no model call): nodes and seconds. Those
    two at equal checks are the model's share;
  * single (T and 4T), auto, commit, views (the puzzle and 2 or 8 symmetry transforms, the exact check picks),
    the search with the views as its first look, and the search at smaller node budgets, on the first
    --baseline-puzzles boards: share solved, seconds, model iterations (every view and node counted);
  * the scaling curves: share solved within a budget of nodes (a depth-first search with budget k visits the
    first k nodes of the unbounded run, so one run gives the whole curve; the runs at smaller budgets check it,
    `budget_runs_monotone`) and against the iterations spent.

Writes the JSON and a PNG beside it (solve rate against model iterations per board, against seconds per puzzle,
and against nodes). Puzzles are
generated in --threads processes and cached in the package's cache folder (hyperset.cbuild.cache_dir's parent).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import bench_args
import torch
from flops import machine

from hyperset import cbuild
from hyperset.checkpoint import atomic_write_json
from hyperset.device import set_cpu_threads
from hyperset.solve import Solver
from hyperset.sudoku import rated
from hyperset.sudoku.board import validate

BUDGETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
SMALL_BUDGETS = [4, 32, 256]  # search runs of their own at these node budgets (the baseline puzzles)
ITER_BUDGETS = [8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192]


def _chunk(args: tuple[int, str, int, int]) -> list[tuple[str, str, int]]:
    n, bucket, seed, start = args
    return [(p.puzzle, p.solution, p.rating) for p in rated.generate_rated(n, bucket, seed=seed, start=start)]


def puzzles_of(bucket: str, n: int, seed: int, workers: int) -> list[rated.RatedPuzzle]:
    """n puzzles of a bucket, from the cache or made in `workers` processes (chunks of the generator's CHUNK)."""
    cache = cbuild.cache_dir().parent / "rated" / f"{bucket}-seed{seed}-n{n}.csv"
    if cache.exists():
        with open(cache, newline="") as f:
            return [rated.RatedPuzzle(p, s, int(r)) for p, s, r in csv.reader(f)]
    step = rated.CHUNK
    jobs = [(min(step, n - i), bucket, seed, i) for i in range(0, n, step)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        rows = [row for part in pool.map(_chunk, jobs) for row in part]
    print(f"  {bucket}: {n} puzzles made in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    tmp.replace(cache)
    return [rated.RatedPuzzle(p, s, r) for p, s, r in rows]


def timed(solver: Solver, puzzles: list[str], **kw) -> tuple[list, float]:
    t0 = time.perf_counter()
    results = solver.solve(puzzles, **kw)
    return results, time.perf_counter() - t0


def run_stats(results: list, solutions: list[str], seconds: float) -> dict:
    solved = [r.valid for r in results]
    wrong_valid = sum(r.valid and r.prediction != s for r, s in zip(results, solutions))
    invalid_reported_valid = sum(r.valid and not validate(r.prediction, r.puzzle).valid for r in results)
    out = {"puzzles": len(results), "solved": sum(solved), "solve_rate": sum(solved) / len(results),
           "reported_valid_but_invalid": invalid_reported_valid, "valid_but_not_the_solution": wrong_valid,
           "seconds": round(seconds, 3), "puzzles_per_s": round(len(results) / seconds, 3),
           "iterations_mean": statistics.mean(r.iterations for r in results),
           "model_iterations_mean": statistics.mean(model_iterations(r) for r in results)}
    if results and results[0].search is not None:
        nodes = [r.search["nodes"] for r in results]
        bts = [r.search["backtracks"] for r in results]
        out.update(nodes_median=statistics.median(nodes), nodes_mean=statistics.mean(nodes), nodes_max=max(nodes),
                   backtracks_median=statistics.median(bts),
                   no_backtrack_share=sum(r.valid and r.search["backtracks"] == 0 for r in results) / len(results),
                   statuses={s: sum(r.search["status"] == s for r in results)
                             for s in ("solved", "no solution", "budget")})
    return out


def model_iterations(r) -> int:
    """Iterations the model ran for a board: every view and node of a search or views run, else its iterations."""
    return r.search["model_iterations"] if r.search is not None and "model_iterations" in r.search else r.iterations


def curves(results: list) -> dict:
    """Share solved within each node budget, and the iterations each solved board spent."""
    nodes = [r.search["nodes"] if r.valid else None for r in results]
    iters = [model_iterations(r) if r.valid else None for r in results]
    return {"nodes_budget": BUDGETS, "solved_within_nodes": within(nodes, BUDGETS),
            "iterations_budget": ITER_BUDGETS, "solved_within_iterations": within(iters, ITER_BUDGETS)}


def within(spent: list[int | None], budgets: list[int]) -> list[float]:
    """Share of boards solved (spent not None) with at most each budget."""
    return [round(sum(1 for k in spent if k is not None and k <= b) / len(spent), 4) for b in budgets]


def bucket_run(solver: Solver, bucket: str, ps: list[rated.RatedPuzzle], baseline: int, T: int) -> dict:
    puzzles, solutions = [p.puzzle for p in ps], [p.solution for p in ps]
    print(f"  {bucket}: default (search)", file=sys.stderr)
    res, sec = timed(solver, puzzles)
    default = run_stats(res, solutions, sec)
    default["curve"] = curves(res)
    print(f"  {bucket}: checks first", file=sys.stderr)
    cres, csec = timed(solver, puzzles, first_look=False)
    checks_first = run_stats(cres, solutions, csec)
    checks_first["curve"] = curves(cres)
    print(f"  {bucket}: uniform prior", file=sys.stderr)
    ures, usec = timed(solver, puzzles, prior="uniform")
    uniform = run_stats(ures, solutions, usec)
    uniform["curve"] = curves(ures)
    out = {"ratings": {"min": min(p.rating for p in ps), "median": statistics.median(p.rating for p in ps),
                       "max": max(p.rating for p in ps)},
           "givens_mean": statistics.mean(81 - p.puzzle.count("0") for p in ps),
           "default": default, "search_checks_first": checks_first, "search_uniform": uniform,
           # at equal checks: the search with the checks first (the model sees what they leave) against the
           # uniform prior; the default adds the model's first look at the puzzle as given
           "model_share": {"nodes_median_model": checks_first["nodes_median"],
                           "nodes_median_uniform": uniform["nodes_median"],
                           "nodes_mean_model": checks_first["nodes_mean"], "nodes_mean_uniform": uniform["nodes_mean"],
                           "seconds_model": checks_first["seconds"], "seconds_uniform": uniform["seconds"],
                           "no_backtrack_share_model": checks_first["no_backtrack_share"],
                           "no_backtrack_share_uniform": uniform["no_backtrack_share"],
                           "model_needs_no_more_nodes_median":
                               checks_first["nodes_median"] <= uniform["nodes_median"]}}
    sub, sub_sol = puzzles[:baseline], solutions[:baseline]
    for name, kw in ((f"single@{T}", {"strategy": "single", "iters": T}),
                     (f"single@{4 * T}", {"strategy": "single", "iters": 4 * T}),
                     ("auto", {"strategy": "single", "iters": "auto"}),
                     ("commit", {"strategy": "commit"}),
                     ("views@2", {"strategy": "views", "views": 2}),
                     ("views@8", {"strategy": "views", "views": 8}),
                     *((f"search@{k}", {"strategy": "search", "nodes": k}) for k in SMALL_BUDGETS),
                     ("search", {"strategy": "search"}),
                     ("search+views@8", {"strategy": "search", "views": 8})):
        print(f"  {bucket}: {name} on {len(sub)}", file=sys.stderr)
        r, s = timed(solver, sub, **kw)
        out.setdefault("strategies", {})[name] = run_stats(r, sub_sol, s)
    rates = [out["strategies"][f"search@{k}"]["solve_rate"] for k in SMALL_BUDGETS]
    rates.append(out["strategies"]["search"]["solve_rate"])
    out["budget_runs_monotone"] = all(a <= b for a, b in zip(rates, rates[1:]))
    return out


def markdown(out: dict) -> str:
    """The tables of docs/search.md from a result: the default command, the model's share, the strategies."""
    rows = out["buckets"]
    lines = ["| bucket | median rating | default command: solved | reported valid but not | puzzles/s "
             "| nodes: median (mean, max) | no backtrack |", "|---|---|---|---|---|---|---|"]
    for b, r in rows.items():
        d = r["default"]
        lines.append(f"| {b} | {r['ratings']['median']:g} | {d['solved']:,} / {d['puzzles']:,} | "
                     f"{d['reported_valid_but_invalid']} | {d['puzzles_per_s']:.1f} | {d['nodes_median']:g} "
                     f"({d['nodes_mean']:.1f}, {d['nodes_max']}) | {100 * d['no_backtrack_share']:.1f}% |")
    lines += ["", "| bucket | nodes median, model | nodes median, uniform | nodes mean, model / uniform "
              "| no backtrack, model / uniform | seconds, model / uniform |", "|---|---|---|---|---|---|"]
    for b, r in rows.items():
        m = r["model_share"]
        lines.append(f"| {b} | {m['nodes_median_model']:g} | {m['nodes_median_uniform']:g} | "
                     f"{m['nodes_mean_model']:.1f} / {m['nodes_mean_uniform']:.1f} | "
                     f"{100 * m['no_backtrack_share_model']:.1f}% / {100 * m['no_backtrack_share_uniform']:.1f}% | "
                     f"{m['seconds_model']:.1f} / {m['seconds_uniform']:.1f} |")
    names = list(next(iter(rows.values()))["strategies"])
    lines += ["", "| bucket | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for b, r in rows.items():
        runs = r["strategies"]
        cells = [f"{100 * runs[k]['solve_rate']:.0f}% ({runs[k]['model_iterations_mean']:.0f} it, "
                 f"{runs[k]['puzzles_per_s']:.1f}/s)" for k in names]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    buckets = list(out["buckets"])
    fig, axes = plt.subplots(3, len(buckets), figsize=(3.2 * len(buckets), 9.4), squeeze=False)
    for j, b in enumerate(buckets):
        r = out["buckets"][b]
        runs = r["strategies"]
        searches = [k for k in runs if k.startswith("search@")] + ["search"]
        points = [k for k in runs if not k.startswith("search@") and k != "search"]
        for row, (key, label) in enumerate((("model_iterations_mean", "model iterations per board"),
                                            ("seconds_per_puzzle", "seconds per puzzle"))):
            ax = axes[row, j]
            x = lambda s, key=key: max(s[key] if key in s else s["seconds"] / s["puzzles"], 1e-4)  # noqa: E731
            if row == 0:
                cv = r["default"]["curve"]
                ax.step(cv["iterations_budget"], cv["solved_within_iterations"], where="post", color="C0",
                        label="search (one run, solved within)")
            ax.plot([x(runs[k]) for k in searches], [runs[k]["solve_rate"] for k in searches], "o-", color="C0",
                    alpha=0.6, label="search at 4 / 32 / 256 / 2,000 nodes")
            for k, name in enumerate(points):
                ax.scatter([x(runs[name])], [runs[name]["solve_rate"]], label=name, color=f"C{k + 1}", zorder=3)
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no crowded minor labels
            ax.set_ylim(0, 1.02)
            ax.set_xlabel(label)
            if row == 0:
                ax.set_title(f"bucket {b}")
            if j == 0:
                ax.set_ylabel("share solved")
                ax.legend(fontsize=6)
        ax = axes[2, j]
        for name, key, c in (("search (default)", "default", "C0"), ("search, checks first", "search_checks_first",
                                                                       "C1"),
                             ("search, uniform prior", "search_uniform", "C7")):
            cv = r[key]["curve"]
            ax.step(cv["nodes_budget"], cv["solved_within_nodes"], where="post", label=name, color=c)
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("budget: nodes per board")
        if j == 0:
            ax.set_ylabel("share solved")
            ax.legend(fontsize=7)
    fig.suptitle(f"Inference-time scaling on rated puzzles ({out['machine'].get('cpu', 'cpu')}, "
                 f"{out['settings']['threads']} threads)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--puzzles", type=bench_args.count, default=1000, help="puzzles per bucket")
    ap.add_argument("--baseline-puzzles", type=bench_args.count, default=200,
                    help="puzzles per bucket for single, auto and commit")
    ap.add_argument("--seed", type=int, default=1, help="the generator's seed (held out from training)")
    ap.add_argument("--buckets", nargs="+", default=list(rated.BUCKETS))
    ap.add_argument("--threads", type=bench_args.count, default=2)
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--out", type=bench_args.output_file, default="bench/results/search_bench.json")
    ap.add_argument("--markdown", metavar="JSON", default=None,
                    help="print the docs' tables of a result (and the figure beside it again), run nothing")
    args = ap.parse_args(argv)
    if args.markdown:
        import json

        result = json.loads(Path(args.markdown).read_text())
        print(markdown(result))
        plot(result, Path(args.markdown).with_suffix(".png"))
        return
    for b in args.buckets:
        rated.bucket_range(b)
    sets = {b: puzzles_of(b, args.puzzles, args.seed, args.threads) for b in args.buckets}
    set_cpu_threads(args.threads)
    solver = Solver.load(args.checkpoint, "cpu")
    T = solver.trained_iters
    out = {"settings": {"puzzles": args.puzzles, "baseline_puzzles": min(args.baseline_puzzles, args.puzzles),
                        "seed": args.seed, "threads": torch.get_num_threads(), "trained_iters": T,
                        "default_iters": solver.default_iters, "search_iters": solver.search_iters,
                        "checkpoint": args.checkpoint or "shipped", "generator": rated.engine(),
                        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])},
           "machine": machine(torch.get_num_threads()), "buckets": {}}
    for b, ps in sets.items():
        out["buckets"][b] = bucket_run(solver, b, ps, min(args.baseline_puzzles, len(ps)), T)
        d = out["buckets"][b]["default"]
        print(f"{b}: default solved {d['solve_rate']:.1%}, {d['puzzles_per_s']} puzzles/s, nodes median "
              f"{d['nodes_median']} (uniform {out['buckets'][b]['search_uniform']['nodes_median']})", flush=True)
        atomic_write_json(Path(args.out), out)
    plot(out, Path(args.out).with_suffix(".png"))


if __name__ == "__main__":
    main()
