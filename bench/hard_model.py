"""The hard-puzzle model: training data with rated puzzles, equal-budget ablations, and per-bucket measurements.

    python bench/hard_model.py data --rrn DIR --out data/sudoku-hard --rated-share 0.5   # the training mix
    python bench/hard_model.py run --arm hard-deep4 --data data/sudoku-hard --budget 1500
    python bench/hard_model.py measure --checkpoint runs/ablations/hard-deep4/best --name hard-deep4 --rrn DIR
    python bench/hard_model.py tune --checkpoint runs/sudoku-cpu-hard2/best --name hard-cpu2 [--write]
    python bench/hard_model.py search --checkpoint sudoku --name shipped      # the default strategy, every bucket
    python bench/hard_model.py paths --checkpoints sudoku runs/sudoku-cpu-hard2/best   # where the nodes go
    python bench/hard_model.py table                                               # every arm: JSON + PNG

`data` writes `train.csv.gz` (the RRN-style training puzzles and rated minimal puzzles of hyperset.sudoku.rated,
buckets 1-2 / 3-10 / 11-50 / 51+ at their own seeds, the rated rows repeated so that they make `--rated-share` of the
rows; augmentation makes every repeat a different board) and `valid.csv.gz` (the RRN validation file's seeded draw
of 1,000 and 200 rated puzzles of each bucket, other seeds), the selection split the trainer reads, and
`make.json` saying how. Every seed here is apart from the seeds the measurements and bench/search_bench.py use.

`run` trains one arm (bench/depth_ablation.py's machinery: one thread, a calibrated step count for the CPU-time
budget, resumable with the same command). `measure` scores a checkpoint on held-out rated puzzles (`--seed`, 11 by
default) per bucket: one pass at T, 2T, 4T, ... up to --max-depth (16T by default; board accuracy, and the share
of boards whose E_ATTN + E_FF never rises), commit decoding, and the search's model calls on the hardest bucket;
and on the RRN validation file's seeded draw: one pass to 8T and the default strategy, all and 17 givens. Results go to
bench/results/hard_model/NAME.json. `tune` chooses a checkpoint's inference defaults on the selection split's rated
puzzles (the seeds of `data`'s valid.csv.gz, never the measurements'): the commit strategy's iterations per pass
(the most puzzles solved over all buckets, the fewest iterations among ties) and the search's iterations per node
(the fewest model iterations, nodes x iterations per node, in all); bench/results/hard_model/tune-NAME.json, and
with `--write` the checkpoint's config.json `solve_iterations` / `search_iterations` with a note saying how.
`paths` runs the search on the hardest bucket's held-out puzzles
at equal checks (the checks first, no first look) for each checkpoint at its own iterations per node and with the
uniform prior, and splits each search's nodes into those on the way to the answer (its decisions, and the node
whose prediction answered) and those spent on decisions taken back (bench/results/hard_model/search-paths.json).
`table` gathers them into bench/results/hard_model.json and .png (one pass by depth), and hard_model_training.png: the
long run's accuracy per bucket against its training CPU-hours (`LONG_RUN`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import bench_args
import depth_ablation as da
import numpy as np
import torch
from search_bench import puzzles_of

from hyperset.checkpoint import atomic_write_bytes, atomic_write_json
from hyperset.device import cpu_model
from hyperset.pretrained import resolve
from hyperset.solve import Solver
from hyperset.sudoku import rated
from hyperset.sudoku.data import find_split, givens_count, load_csv, protocol_split

RESULTS = da.RESULTS / "hard_model"
# bucket -> (seed, puzzles) of the training mix and of the selection split; the measurements use other seeds
TRAIN_SETS = {"1-2": (104, 4000), "3-10": (101, 8000), "11-50": (102, 8000), "51+": (103, 2000)}
SELECT_SETS = {b: (200 + i, 200) for i, b in enumerate(rated.BUCKETS)}
DEPTHS = (1, 2, 4, 8, 16, 32, 64)  # multiples of T read out on one pass, up to --max-depth
LONG_RUN = ("hard-cpu-tuned", "hard-cpu2-tuned", "hard-cpu3-tuned")  # its checkpoints' rows, in training order

DEAD = da.DEAD
da.RECIPES["hard"] = ("sudoku", "sudoku-cpu-hard", "sudoku")
HARD_ARMS: dict[str, dict[str, Any]] = {
    "hard-deep4": {"family": "hard", "set": [], "data": "mix",
                   "note": "the shipped model on RRN + rated puzzles, 4 detached segments of T (dead t)"},
    "hard-live-deep4": {"family": "hard", "set": ["model.time_init=\"live\""], "data": "mix",
                        "note": "the same with the time network live"},
    "hard-deep4-rrn": {"family": "hard", "set": [], "data": "rrn",
                       "note": "control: the same recipe and budget on the RRN-style puzzles alone"},
    "hard-deep4-lr": {"family": "hard", "set": ["train.lr=5e-4"], "data": "mix",
                      "note": "the mix at a higher lr (5e-4 against 2e-4)"},
}
da.ARMS.update(HARD_ARMS)


def _rows(ps: list[rated.RatedPuzzle]) -> list[str]:
    return [f"{p.puzzle},{p.solution}" for p in ps]


def _write_csv_gz(path: Path, rows: list[str]) -> None:
    atomic_write_bytes(path, gzip.compress(("\n".join(rows) + "\n").encode(), mtime=0))


def make_data(rrn: str, out: Path, share: float, workers: int) -> None:
    p, s = load_csv(find_split(rrn, "train"))
    base = [f"{''.join(map(str, a))},{''.join(map(str, b))}" for a, b in zip(p.tolist(), s.tolist())]
    rated_rows: list[str] = []
    for b, (seed, n) in TRAIN_SETS.items():
        rated_rows += _rows(puzzles_of(b, n, seed, workers))
    repeat = max(1, round(share * len(base) / ((1 - share) * len(rated_rows)))) if share < 1 else 1
    rows = base + rated_rows * repeat
    order = np.random.RandomState(0).permutation(len(rows))
    vp, vs = load_csv(find_split(rrn, "valid"))
    vp, vs = protocol_split(vp, vs, 1000, 0)
    valid = [f"{''.join(map(str, a))},{''.join(map(str, b))}" for a, b in zip(vp.tolist(), vs.tolist())]
    for b, (seed, n) in SELECT_SETS.items():
        valid += _rows(puzzles_of(b, n, seed, workers))
    out.mkdir(parents=True, exist_ok=True)
    _write_csv_gz(out / "train.csv.gz", [rows[i] for i in order])
    _write_csv_gz(out / "valid.csv.gz", [valid[i] for i in np.random.RandomState(1).permutation(len(valid))])
    atomic_write_json(out / "make.json", {
        "rrn_rows": len(base), "rated_rows": len(rated_rows), "rated_repeat": repeat,
        "rated_share": round(len(rated_rows) * repeat / len(rows), 4), "train_sets": TRAIN_SETS,
        "select_sets": SELECT_SETS, "valid_rows": len(valid), "generator": rated.engine(),
        "command": bench_args.command_line("hard_model", None)})
    print(f"{out}: {len(rows):,} training rows ({len(rated_rows):,} rated x {repeat}), {len(valid):,} valid")


def _arrays(ps: list[rated.RatedPuzzle]) -> tuple[np.ndarray, np.ndarray]:
    to = lambda xs: np.array([[int(c) for c in x] for x in xs], dtype=np.int64)  # noqa: E731
    return to([p.puzzle for p in ps]), to([p.solution for p in ps])


def _solve(solver: Solver, ps: list[rated.RatedPuzzle], **kw: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    res = solver.solve([p.puzzle for p in ps], **kw)
    dt = time.perf_counter() - t0
    out: dict[str, Any] = {"solved": float(np.mean([r.valid for r in res])), "seconds": round(dt, 2)}
    if res and res[0].search is not None:
        nodes = [r.search["nodes"] for r in res]
        # the nodes on the way to an answer (its decisions' ancestors, and the node itself where the model's
        # prediction answered) against the rest, spent on decisions taken back
        path = [r.search["decisions"] + int(r.search["by_model"]) for r in res if r.valid]
        wasted = [r.search["nodes"] - k for r, k in zip([r for r in res if r.valid], path)]
        out.update(nodes_median=statistics.median(nodes), nodes_mean=statistics.mean(nodes),
                   no_backtrack=float(np.mean([r.valid and r.search["backtracks"] == 0 for r in res])))
        if path:
            out.update(path_nodes_median=statistics.median(path), path_nodes_mean=statistics.mean(path),
                       off_path_nodes_median=statistics.median(wasted), off_path_nodes_mean=statistics.mean(wasted))
    return out


def measure(checkpoint: str, rrn: str, n: int, seed: int, n_rrn: int, n17: int, threads: int,
            search_n: int, max_depth: int = 16) -> dict[str, Any]:
    torch.set_num_threads(threads)
    solver = Solver.load(checkpoint, "cpu")
    model, T = solver.model, solver.trained_iters
    depths = [k for k in DEPTHS if k <= max_depth]
    out: dict[str, Any] = {"checkpoint": str(checkpoint), "trained_iterations": T, "seed": seed,
                           "solve_iterations": solver.default_iters, "search_iterations": solver.search_iters,
                           "buckets": {}}
    for b in rated.BUCKETS:
        ps = puzzles_of(b, n, seed, threads)
        p, s = _arrays(ps)
        t0 = time.perf_counter()
        curve = da.depth_curve(model, p, s, depths[-1] * T)
        r = {"puzzles": n, "one_pass": {f"{k}T": curve["board_acc"][k * T - 1] for k in depths},
             "energy_never_rises": curve["energy_monotone"], "curve": curve["board_acc"],
             "commit": _solve(solver, ps, strategy="commit")}
        if b == rated.BUCKETS[-1]:
            sub = ps[:search_n]
            r["search"] = {"puzzles": len(sub), "model": _solve(solver, sub, first_look=False),
                           "uniform": _solve(solver, sub, prior="uniform"), "default": _solve(solver, sub)}
        out["buckets"][b] = r
        print(f"  {b}: one pass " + " ".join(f"{k} {100 * v:.1f}" for k, v in r["one_pass"].items())
              + f" | commit {100 * r['commit']['solved']:.1f}% ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    vp, vs = load_csv(find_split(rrn, "valid"))
    dp, ds = protocol_split(vp, vs, n_rrn, 0)
    g17 = givens_count(vp) == 17
    hp, hs = protocol_split(vp[g17], vs[g17], n17, 0)
    out["rrn"] = {**rrn_one_pass(model, T, dp, ds, 8),
                  "default": da.default_strategy(solver, dp, ds), "givens17": da.default_strategy(solver, hp, hs)}
    return out


def rrn_one_pass(model: Any, T: int, puzzles: np.ndarray, solutions: np.ndarray, max_depth: int) -> dict[str, Any]:
    """One pass on the RRN draw to max_depth x T: board accuracy at T, 2T, ... and the share of boards whose
    E_ATTN + E_FF never rises on the way (`energy_never_rises_{max_depth}T`)."""
    curve = da.depth_curve(model, puzzles, solutions, max_depth * T)
    return {"puzzles": len(puzzles),
            "one_pass": {f"{k}T": curve["board_acc"][k * T - 1] for k in DEPTHS if k <= max_depth},
            f"energy_never_rises_{max_depth}T": curve["energy_monotone"]}


def _solver(checkpoint: str, threads: int, backtrack_from: int | None) -> Solver:
    """The checkpoint's solver on the CPU at `threads` threads; with `backtrack_from` the step-length control from
    that iteration on, at inference."""
    torch.set_num_threads(threads)
    solver = Solver.load(checkpoint, "cpu")
    if backtrack_from is not None:
        solver.model.set_step_control("backtrack", backtrack_from)
    return solver


def rrn_depth(checkpoint: str, rrn: str, n_rrn: int, max_depth: int, threads: int,
              backtrack_from: int | None = None, buckets: int = 0, seed: int = 11) -> dict[str, Any]:
    """`measure`'s RRN draw (the same boards) in one pass to max_depth x T; with `backtrack_from` the model's step
    control set to "backtrack" from that iteration on, at inference. With `buckets` = n, also n held-out rated
    puzzles of every bucket, made with `measure`'s seed, each bucket's pass timed on its own."""
    solver = _solver(checkpoint, threads, backtrack_from)
    cfg, T = solver.model.cfg, solver.trained_iters
    vp, vs = load_csv(find_split(rrn, "valid"))
    dp, ds = protocol_split(vp, vs, n_rrn, 0)
    start = time.perf_counter()
    result = rrn_one_pass(solver.model, T, dp, ds, max_depth)
    result["seconds"] = time.perf_counter() - start
    if buckets:
        result["buckets"] = {}
        for b in rated.BUCKETS:
            p, s = _arrays(puzzles_of(b, buckets, seed, threads))
            start = time.perf_counter()
            result["buckets"][b] = {**rrn_one_pass(solver.model, T, p, s, max_depth),
                                    "seconds": time.perf_counter() - start}
            print(f"  {b}: one pass " + " ".join(f"{k} {100 * v:.1f}" for k, v in
                                                 result["buckets"][b]["one_pass"].items()), file=sys.stderr)
    return {"checkpoint": str(checkpoint), "trained_iterations": T, "step_control": cfg.step_control,
            "backtrack_from": cfg.backtrack_from, "backtracks": cfg.backtracks, **result,
            **({"bucket_seed": seed} if buckets else {})}


def control_cost(checkpoint: str, rrn: str, boards: int, iters: int, rounds: int, threads: int,
                 backtrack_from: int) -> dict[str, Any]:
    """The pass with the step-length control from `backtrack_from` against the plain pass, timed alternately in
    one run (medians of `rounds`): `boards` boards of the RRN validation draw in one batch, `iters` iterations,
    traced (a whole pass with the energies reported), untraced, and per iteration (the frames with their
    energies, as the solver's strategies read them); and, in a pass of each kind outside the timing, the energy
    evaluations the layer makes per board and iteration."""
    from hyperset.backends import TorchBackend

    torch.set_num_threads(threads)
    solver = Solver.load(checkpoint, "cpu")
    model, layer = solver.model, solver.model.core.layers[0]
    backend = TorchBackend(model, "cpu")
    vp, vs = load_csv(find_split(rrn, "valid"))
    dp, _ = protocol_split(vp, vs, boards, 0)
    x = torch.as_tensor(dp)
    settings = {"plain": ("none", None), "control": ("backtrack", backtrack_from)}
    modes = {"traced": lambda: backend.run(x, iters, energies=True)[0],
             "untraced": lambda: backend.run(x, iters, energies=False)[0],
             "per_iteration": lambda: [step.logits for step in backend.iterate(x, iters)][-1]}
    times: dict[str, list[float]] = {f"{k}_{m}": [] for k in settings for m in modes}
    answers, evaluations = {}, {}
    evaluate = layer._energy
    rows: list[int] = []
    layer._energy = lambda v, t=None: rows.append(len(v)) or evaluate(v, t)
    for name, (control, start) in settings.items():
        model.set_step_control(control, start)
        for mode, run in modes.items():
            rows.clear()
            logits = run()
            evaluations[f"{name}_{mode}"] = sum(rows) / (iters * len(x))
        answers[name] = logits.argmax(-1)
    del layer._energy
    for _ in range(rounds):
        for name, (control, start) in settings.items():
            model.set_step_control(control, start)
            for mode, run in modes.items():
                t0 = time.perf_counter()
                run()
                times[f"{name}_{mode}"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"checkpoint": str(checkpoint), "boards": boards, "iterations": iters, "rounds": rounds,
            "backtrack_from": backtrack_from, "backtracks": model.cfg.backtracks,
            "seconds_median": med, "seconds": times,
            "control_over_plain": {m: med[f"control_{m}"] / med[f"plain_{m}"] for m in modes},
            "energy_evaluations_per_board_iteration": evaluations,
            "boards_answered_differently": int((answers["plain"] != answers["control"]).any(-1).sum())}


def tune(checkpoint: str, n: int, commit_iters: list[int], node_iters: list[int], threads: int
         ) -> dict[str, Any]:
    """Commit at each iteration count and the search at each node depth on the selection split's rated puzzles."""
    torch.set_num_threads(threads)
    solver = Solver.load(checkpoint, "cpu")
    sets = {b: puzzles_of(b, n, seed, threads) for b, (seed, _) in SELECT_SETS.items()}
    out: dict[str, Any] = {"checkpoint": str(checkpoint), "puzzles_per_bucket": n,
                           "seeds": {b: s for b, (s, _) in SELECT_SETS.items()}, "commit": {}, "search": {}}
    for k in commit_iters:
        r = {b: _solve(solver, ps, strategy="commit", iters=k) for b, ps in sets.items()}
        out["commit"][str(k)] = r
        print(f"  commit @{k}: " + " ".join(f"{b} {100 * v['solved']:.1f}" for b, v in r.items()), file=sys.stderr)
    for k in node_iters:
        r = {b: _solve(solver, ps, node_iters=k) for b, ps in sets.items()}
        out["search"][str(k)] = r
        print(f"  search @{k}: nodes " + " ".join(f"{b} {v['nodes_mean']:.2f}" for b, v in r.items()),
              file=sys.stderr)
    solved = {k: sum(v["solved"] for v in r.values()) for k, r in out["commit"].items()}
    work = {k: int(k) * sum(v["nodes_mean"] for v in r.values()) for k, r in out["search"].items()}
    out["solve_iterations"] = int(max(solved, key=lambda k: (round(solved[k], 6), -int(k))))
    out["search_iterations"] = int(min(work, key=lambda k: (round(work[k], 6), int(k))))
    return out


def search_per_bucket(checkpoint: str, n: int, seed: int, threads: int,
                      backtrack_from: int | None = None) -> dict[str, Any]:
    """The solver's default strategy (the search, at the checkpoint's own iterations) on the first `n` held-out
    puzzles of every bucket: solved, nodes (median, mean), the share answered without a backtrack; with
    `backtrack_from` the step-length control from that iteration on (`hyperset-solve --descent` is 2)."""
    solver = _solver(checkpoint, threads, backtrack_from)
    out: dict[str, Any] = {"checkpoint": str(checkpoint), "seed": seed, "puzzles_per_bucket": n,
                           "step_control": solver.model.cfg.step_control,
                           "backtrack_from": solver.model.cfg.backtrack_from,
                           "solve_iterations": solver.default_iters, "search_iterations": solver.search_iters,
                           "buckets": {}}
    for b in rated.BUCKETS:
        r = _solve(solver, puzzles_of(b, n, seed, threads))
        out["buckets"][b] = r
        print(f"  {b}: solved {100 * r['solved']:.1f}%, nodes median {r['nodes_median']:g} mean "
              f"{r['nodes_mean']:.2f}, no backtrack {100 * r['no_backtrack']:.1f}%", file=sys.stderr)
    return out


def search_paths(checkpoints: list[str], n: int, seed: int, threads: int,
                 node_iters: list[int] | None = None) -> dict[str, Any]:
    """The search on the first `n` puzzles of the hardest bucket at `seed` (by default the held-out draw `measure`
    takes) at equal checks, for each checkpoint and with the uniform prior: nodes, and how many were on the way to
    the answer; at the checkpoint's own iterations per node, and with `node_iters` at each of those too
    (`by_node_iters`)."""
    torch.set_num_threads(threads)
    bucket = rated.BUCKETS[-1]
    ps = puzzles_of(bucket, 200, seed, threads)[:n]
    out: dict[str, Any] = {"bucket": bucket, "seed": seed, "puzzles": len(ps), "models": {}}
    solver = None
    say = lambda name, r: print(  # noqa: E731
        f"  {name}: nodes median {r['nodes_median']:g} (mean {r['nodes_mean']:.2f}); on the way to the answer "
        f"{r['path_nodes_median']:g} ({r['path_nodes_mean']:.2f}), taken back {r['off_path_nodes_median']:g} "
        f"({r['off_path_nodes_mean']:.2f})", file=sys.stderr)
    for ckpt in checkpoints:
        solver = Solver.load(resolve(ckpt), "cpu")
        entry: dict[str, Any] = {"search_iterations": solver.search_iters,
                                 "equal_checks": _solve(solver, ps, first_look=False)}
        say(ckpt, entry["equal_checks"])
        for k in node_iters or []:
            entry.setdefault("by_node_iters", {})[str(k)] = r = _solve(solver, ps, first_look=False, node_iters=k)
            say(f"{ckpt} at {k} iterations per node", r)
        out["models"][ckpt] = entry
    out["uniform"] = _solve(solver, ps, prior="uniform")
    return out


def write_choice(checkpoint: Path, choice: dict[str, Any], command: str) -> None:
    """The tuned defaults into the checkpoint's config.json, each with a note saying how they were chosen."""
    path = checkpoint / "config.json"
    config = json.loads(path.read_text())
    n, seeds = choice["puzzles_per_bucket"], choice["seeds"]
    where = f"{n} rated puzzles of each bucket at the selection seeds {sorted(seeds.values())} (`{command}`)"
    k, m = choice["solve_iterations"], choice["search_iterations"]
    commit = choice["commit"][str(k)]
    config["solve_iterations"] = k
    config["solve_iterations_note"] = (
        f"iterations per pass the solver runs by default: the commit strategy solved the most puzzles at {k} of "
        + ", ".join(choice["commit"]) + " on " + where + ": "
        + ", ".join(f"{b} {100 * v['solved']:.1f}%" for b, v in commit.items()))
    config["search_iterations"] = m
    config["search_iterations_note"] = (
        f"iterations per node of the search strategy: the fewest model iterations (nodes x iterations per node, "
        f"summed over the buckets' means) at {m} of "
        + ", ".join(choice["search"]) + " on " + where)
    atomic_write_json(path, config)


def table(path: Path) -> dict[str, Any]:
    files = [f for f in RESULTS.glob("*.json") if not f.name.startswith(("tune-", "search-"))]
    rows = sorted((json.loads(f.read_text()) for f in files),
                  key=lambda r: (r["name"] != "shipped", r["name"]))  # the shipped model first: the reference
    atomic_write_json(path, {"rows": rows})
    for r in rows:
        e = r["eval"]
        print(f"{r['name']:22s} " + " | ".join(
            f"{b} " + "/".join(f"{100 * v:.0f}" for v in x["one_pass"].values())
            + f" c{100 * x['commit']['solved']:.0f}" for b, x in e["buckets"].items())
            + f" | rrn default {100 * e['rrn']['default']['board_acc']:.1f}")
    plot(rows, path.with_suffix(".png"))
    training_curve(rows, path.with_name(path.stem + "_training.png"))
    return {"rows": rows}


def long_run(rows: list[dict[str, Any]]) -> list[tuple[float, dict[str, Any]]]:
    """The long run's measured checkpoints in order of training CPU-hours on the mix: the shipped model it starts
    from (0), then every `LONG_RUN` row measured (each at its tuned iterations)."""
    named = {r["name"]: r for r in rows}
    points = [(0.0, named["shipped"])] if "shipped" in named else []
    points += [(named[n]["cpu_seconds"] / 3600, named[n]) for n in LONG_RUN if n in named]
    return points


def training_curve(rows: list[dict[str, Any]], path: Path) -> None:
    """Accuracy per bucket against the long run's training CPU-hours: one pass at T and 16T, commit decoding."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = long_run(rows)
    if len(points) < 2:
        return
    buckets = list(points[0][1]["eval"]["buckets"])
    fig, axes = plt.subplots(1, len(buckets), figsize=(3.2 * len(buckets), 3.4), sharey=True, squeeze=False)
    hours = [h for h, _ in points]
    for ax, b in zip(axes[0], buckets):
        for label, value in (("one pass, T", lambda e: e["one_pass"]["1T"]),
                             ("one pass, 16T", lambda e: e["one_pass"]["16T"]),
                             ("commit", lambda e: e["commit"]["solved"])):
            ax.plot(hours, [100 * value(r["eval"]["buckets"][b]) for _, r in points], "o-", label=label)
        ax.set_title(f"bucket {b}")
        ax.set_xlabel("training CPU-hours on the mix")
    axes[0, 0].set_ylabel("board accuracy, %")
    axes[0, 0].legend(fontsize=6)
    fig.suptitle("The long run on rated puzzles (from the shipped model; " + ", ".join(
        r["name"] for _, r in points) + ")", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The docs' table: per arm, one pass at T / 4T / 16T per bucket, commit per bucket, the search's median nodes
    on the hardest bucket (model, uniform), and the RRN validation numbers."""
    if not rows:
        return ""
    buckets = list(rows[0]["eval"]["buckets"])
    head = ["arm", "training CPU-s", "iterations: commit / search node",
            *(f"{b}: one pass T / 4T / 16T" for b in buckets),
            *(f"{b}: commit" for b in buckets), f"{buckets[-1]}: search nodes, median (uniform)",
            "RRN: one pass T / 4T / 8T", "RRN: default (17 givens)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        e = r["eval"]
        spent = r.get("cpu_seconds") or (r.get("arm") or {}).get("cpu_seconds")
        cells = [r["name"], f"{spent:,.0f}" if spent else "-",
                 f"{e.get('solve_iterations', '-')} / {e.get('search_iterations', '-')}"]
        for b in buckets:
            op = e["buckets"][b]["one_pass"]
            cells.append(" / ".join(f"{100 * op[k]:.1f}" for k in ("1T", "4T", "16T") if k in op))
        cells += [f"{100 * e['buckets'][b]['commit']['solved']:.1f}" for b in buckets]
        sr = e["buckets"][buckets[-1]].get("search")
        cells.append(f"{sr['model']['nodes_median']:g} ({sr['uniform']['nodes_median']:g})" if sr else "-")
        rrn = e["rrn"]
        cells.append(" / ".join(f"{100 * rrn['one_pass'][k]:.1f}" for k in ("1T", "4T", "8T")))
        cells.append(f"{100 * rrn['default']['board_acc']:.1f} ({100 * rrn['givens17']['board_acc']:.1f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return
    buckets = list(rows[0]["eval"]["buckets"])
    fig, axes = plt.subplots(1, len(buckets), figsize=(3.2 * len(buckets), 3.4), sharey=True, squeeze=False)
    for ax, b in zip(axes[0], buckets):
        for r in rows:
            acc = 100 * np.array(r["eval"]["buckets"][b]["curve"])
            ax.plot(np.arange(1, len(acc) + 1), acc, label=r["name"])
        ax.set_xscale("log", base=2)
        ax.set_title(f"bucket {b}")
        ax.set_xlabel("iterations (one pass)")
    axes[0, 0].set_ylabel("board accuracy, %")
    axes[0, 0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="write the training mix and the selection split")
    d.add_argument("--rrn", required=True, help="folder of the RRN-style train/valid CSVs")
    d.add_argument("--out", required=True, type=Path)
    d.add_argument("--rated-share", type=float, default=0.5, help="share of training rows that are rated puzzles")
    d.add_argument("--workers", type=bench_args.count, default=2, help="processes that generate puzzles")
    run = sub.add_parser("run", help="train one arm for a CPU-time budget (resumes)")
    run.add_argument("--arm", required=True, choices=sorted(HARD_ARMS))
    run.add_argument("--data", required=True, help="the data folder the arm's 'data' names (mix or RRN-style)")
    run.add_argument("--budget", type=bench_args.seconds, default=1500.0)
    m = sub.add_parser("measure", help="score a checkpoint per bucket and on the RRN validation draw")
    m.add_argument("--checkpoint", required=True, help="checkpoint folder or shipped model name")
    m.add_argument("--name", required=True)
    m.add_argument("--rrn", required=True, help="folder of the RRN-style validation CSV")
    m.add_argument("--n", type=bench_args.count, default=200, help="rated puzzles per bucket")
    m.add_argument("--seed", type=int, default=11, help="the rated puzzles' seed (held out from training)")
    m.add_argument("--n-rrn", type=bench_args.count, default=500)
    m.add_argument("--n17", type=bench_args.count, default=300)
    m.add_argument("--search-puzzles", type=bench_args.count, default=100,
                   help="puzzles of the hardest bucket for the search's model calls")
    m.add_argument("--threads", type=bench_args.count, default=1)
    m.add_argument("--cpu-seconds", type=float, default=None, help="training CPU-seconds to record beside it")
    m.add_argument("--max-depth", type=int, choices=DEPTHS, default=16, help="the deepest one-pass read-out, in T")
    t = sub.add_parser("tune", help="choose a checkpoint's solve and search iterations on the selection split")
    t.add_argument("--checkpoint", required=True, help="checkpoint folder")
    t.add_argument("--name", required=True)
    t.add_argument("--n", type=bench_args.count, default=200, help="rated puzzles per bucket (at most 200)")
    t.add_argument("--commit-iters", type=bench_args.count, nargs="+", default=[16, 32, 64])
    t.add_argument("--node-iters", type=bench_args.count, nargs="+", default=[4, 8, 16])
    t.add_argument("--threads", type=bench_args.count, default=1)
    t.add_argument("--write", action="store_true", help="write the choice into the checkpoint's config.json")
    sr = sub.add_parser("search", help="the default strategy's nodes on every bucket's held-out puzzles")
    sr.add_argument("--checkpoint", required=True, help="checkpoint folder or shipped model name")
    sr.add_argument("--name", required=True)
    sr.add_argument("--n", type=bench_args.count, default=200, help="held-out puzzles per bucket")
    sr.add_argument("--seed", type=int, default=11, help="the rated puzzles' seed (held out from training)")
    sr.add_argument("--threads", type=bench_args.count, default=1)
    sr.add_argument("--backtrack-from", type=bench_args.count, default=None,
                    help="run with step_control 'backtrack' from this iteration on (hyperset-solve --descent: 2)")
    pa = sub.add_parser("paths", help="the hardest bucket's search at equal checks: nodes on the way to the answer")
    pa.add_argument("--checkpoints", nargs="+", required=True, help="checkpoint folders or shipped model names")
    pa.add_argument("--n", type=bench_args.count, default=100, help="held-out puzzles (at most 200)")
    pa.add_argument("--seed", type=int, default=11, help="the rated puzzles' seed (held out from training; the "
                    f"selection split's hardest bucket: {SELECT_SETS[rated.BUCKETS[-1]][0]})")
    pa.add_argument("--node-iters", type=bench_args.count, nargs="*", default=[],
                    help="also search at these iterations per node")
    pa.add_argument("--out", type=Path, default=None, help="the JSON (default bench/results/hard_model/"
                    "search-paths.json)")
    pa.add_argument("--threads", type=bench_args.count, default=1)
    rd = sub.add_parser("rrn-depth", help="measure's RRN draw in one pass to --max-depth x T, with the energy")
    rd.add_argument("--checkpoint", required=True, help="checkpoint folder or shipped model name")
    rd.add_argument("--name", required=True)
    rd.add_argument("--rrn", required=True, help="folder of the RRN-style validation CSV")
    rd.add_argument("--n-rrn", type=bench_args.count, default=500)
    rd.add_argument("--max-depth", type=int, choices=DEPTHS, default=64, help="the deepest read-out, in T")
    rd.add_argument("--threads", type=bench_args.count, default=1)
    rd.add_argument("--backtrack-from", type=bench_args.count, default=None,
                    help="run with step_control 'backtrack' from this iteration on (default: the checkpoint's "
                         "control); 2: every update but the first, so the energy never rises from iteration 1")
    rd.add_argument("--buckets", type=bench_args.count, default=None,
                    help="also this many held-out rated puzzles of every bucket (measure's seed)")
    rd.add_argument("--seed", type=int, default=11, help="the rated puzzles' seed (held out from training)")
    cc = sub.add_parser("control-cost", help="the pass with the step-length control against the plain pass, timed "
                        "alternately")
    cc.add_argument("--checkpoint", default="sudoku", help="checkpoint folder or shipped model name")
    cc.add_argument("--rrn", required=True, help="folder of the RRN-style validation CSV")
    cc.add_argument("--boards", type=bench_args.count, default=128, help="boards in the batch")
    cc.add_argument("--iters", type=bench_args.count, default=64)
    cc.add_argument("--rounds", type=bench_args.count, default=5)
    cc.add_argument("--threads", type=bench_args.count, default=1)
    cc.add_argument("--backtrack-from", type=bench_args.count, default=2)
    cc.add_argument("--out", type=Path, default=None,
                    help="the JSON (default bench/results/hard_model/control-cost.json)")
    tab = sub.add_parser("table")
    tab.add_argument("--markdown", action="store_true", help="also print the docs' table")
    args = ap.parse_args(argv)
    if args.cmd == "data":
        if not 0 < args.rated_share <= 1:
            raise bench_args.BenchInputError(f"--rated-share must be in (0, 1], got {args.rated_share}")
        make_data(args.rrn, args.out, args.rated_share, args.workers)
    elif args.cmd == "run":
        out, _ = da.run_arm(args.arm, args.data, args.budget, 1)
        print(f"{args.arm}: trained, {out}")
    elif args.cmd == "measure":
        ckpt = resolve(args.checkpoint)
        result = {"name": args.name, "eval": measure(ckpt, args.rrn, args.n, args.seed, args.n_rrn, args.n17,
                                                     args.threads, args.search_puzzles, args.max_depth),
                  "device": f"{cpu_model()}, {args.threads} thread(s)", "cpu_seconds": args.cpu_seconds,
                  "command": bench_args.command_line("hard_model", argv)}
        arm = HARD_ARMS.get(args.name)
        if arm is not None:
            plan = da.RUNS / args.name / "arm.json"
            result.update(note=arm["note"], arm=json.loads(plan.read_text()) if plan.is_file() else None)
        atomic_write_json(RESULTS / f"{args.name}.json", result)
    elif args.cmd == "control-cost":
        result = {**control_cost(resolve(args.checkpoint), args.rrn, args.boards, args.iters, args.rounds,
                                 args.threads, args.backtrack_from),
                  "device": f"{cpu_model()}, {args.threads} thread(s)",
                  "command": bench_args.command_line("hard_model", argv)}
        atomic_write_json(args.out or RESULTS / "control-cost.json", result)
        med = result["seconds_median"]
        print("; ".join(f"{m}: plain {med[f'plain_{m}']:.2f} s, control {med[f'control_{m}']:.2f} s"
                        for m in ("traced", "untraced", "per_iteration")))
    elif args.cmd == "rrn-depth":
        result = {"name": args.name, **rrn_depth(resolve(args.checkpoint), args.rrn, args.n_rrn, args.max_depth,
                                                 args.threads, args.backtrack_from, args.buckets or 0, args.seed),
                  "device": f"{cpu_model()}, {args.threads} thread(s)",
                  "command": bench_args.command_line("hard_model", argv)}
        atomic_write_json(RESULTS / f"rrn-depth-{args.name}.json", result)
        print(json.dumps({k: result[k] for k in result if k.startswith(("one_pass", "energy"))}), file=sys.stderr)
    elif args.cmd == "search":
        result = search_per_bucket(resolve(args.checkpoint), args.n, args.seed, args.threads, args.backtrack_from)
        result.update(name=args.name, device=f"{cpu_model()}, {args.threads} thread(s)",
                      command=bench_args.command_line("hard_model", argv))
        atomic_write_json(RESULTS / f"search-{args.name}.json", result)
    elif args.cmd == "paths":
        if args.n > 200:
            raise bench_args.BenchInputError(f"--n: at most the 200 held-out puzzles measure draws, got {args.n}")
        result = search_paths(args.checkpoints, args.n, args.seed, args.threads, args.node_iters)
        result.update(device=f"{cpu_model()}, {args.threads} thread(s)",
                      command=bench_args.command_line("hard_model", argv))
        atomic_write_json(args.out or RESULTS / "search-paths.json", result)
    elif args.cmd == "tune":
        if args.n > 200:
            raise bench_args.BenchInputError(f"--n: the selection split holds 200 puzzles a bucket, got {args.n}")
        command = bench_args.command_line("hard_model", argv)
        choice = tune(resolve(args.checkpoint), args.n, args.commit_iters, args.node_iters, args.threads)
        choice.update(device=f"{cpu_model()}, {args.threads} thread(s)", command=command)
        atomic_write_json(RESULTS / f"tune-{args.name}.json", choice)
        print(f"{args.name}: solve_iterations {choice['solve_iterations']}, "
              f"search_iterations {choice['search_iterations']}")
        if args.write:
            write_choice(Path(resolve(args.checkpoint)), choice, command)
    else:
        rows = table(da.RESULTS / "hard_model.json")["rows"]
        if args.markdown:
            print(markdown(rows))


if __name__ == "__main__":
    main()
