"""Sudoku evidence from a checkpoint (default: the shipped model), written to bench/results/ (or --out) as JSON + PNG.

    python bench/sudoku_eval.py --data data/sudoku                      # 1,000 seeded validation puzzles

Measures, on the paper protocol's seeded draw of the validation file:
  * board and cell accuracy after every iteration from 1 to 4x the trained depth (one pass, read out each step);
  * accuracy per givens count at the trained depth and at 2x;
  * E_ATTN and E_FF per iteration (mean and std over boards) past the trained depth;
  * effective rank and average angle per head vs iteration (the paper's figures 4-5);
  * the inference strategies (single pass at T and 2T, --iters auto, commit) with boards/s;
  * boards/s of a single pass and of the default strategy at several batch sizes (the solver's CPU default).

The measurements are the library's (hyperset.sudoku.evaluate, also behind `hyperset-eval sudoku`); this script
picks the settings, adds the batch-size sweep and the checks, and draws the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import bench_args
import numpy as np
import torch

from hyperset.checkpoint import atomic_write_json
from hyperset.device import cpu_model
from hyperset.solve import DEFAULT_PASSES, DEFAULT_STRATEGY, Solver, bundled_checkpoint
from hyperset.sudoku.data import SPLITS, givens_count
from hyperset.sudoku.evaluate import Boards, iteration_curve, load_boards, per_givens, run_strategy, to_strings

RESULTS = Path(__file__).resolve().parent / "results"


def strategy_settings(T: int) -> list[tuple[str, dict]]:
    """The inference settings the strategy table compares (name, run_strategy keyword arguments)."""
    return [(f"single@{T}", {"iters": T, "strategy": "single"}),
            (f"single@{2 * T}", {"iters": 2 * T, "strategy": "single"}),
            (f"single@{4 * T}", {"iters": 4 * T, "strategy": "single"}),
            ("auto", {"strategy": "auto"}),
            (f"commit@{T}x4", {"iters": T, "strategy": "commit", "passes": 4}),
            (f"commit@{T}x8", {"iters": T, "strategy": "commit", "passes": 8}),
            (f"commit@{T}x{DEFAULT_PASSES}", {"iters": T, "strategy": "commit", "passes": DEFAULT_PASSES}),
            (f"commit@{2 * T}x{DEFAULT_PASSES}", {"iters": 2 * T, "strategy": "commit", "passes": DEFAULT_PASSES}),
            (f"commit@{4 * T}x{DEFAULT_PASSES}", {"iters": 4 * T, "strategy": "commit", "passes": DEFAULT_PASSES})]


def strategies(solver: Solver, boards: Boards, T: int) -> list[dict]:
    rows = []
    default = (f"{DEFAULT_STRATEGY}@{solver.default_iters}"
               + (f"x{DEFAULT_PASSES}" if DEFAULT_STRATEGY == "commit" else ""))
    for name, kw in strategy_settings(T):
        row = run_strategy(solver, boards, name=name, **kw)
        row["default"] = name == default
        rows.append(row)
        print(f"  {name:14s} board {row['board_acc']:.3f} cell {row['cell_acc']:.4f} "
              f"{row['boards_per_s']:7.1f} boards/s", file=sys.stderr)
    for r in rows:  # Pareto frontier of accuracy against solve time: nothing else is both faster and better
        r["frontier"] = not any(o["seconds_per_board"] < r["seconds_per_board"] and o["board_acc"] >= r["board_acc"]
                                for o in rows if o is not r)
    return rows


def batch_sweep(solver: Solver, puzzles: list[str], T: int, sizes: list[int]) -> list[dict]:
    """Boards/s of a single pass at T and of the default strategy for several batch sizes (the evidence for the
    solver's CPU_BATCH_SIZE); the predictions do not depend on the batch size."""
    rows = []
    for kw in ({"strategy": "single", "iters": T}, {}):
        for bs in sizes:
            t0 = time.perf_counter()
            solver.solve(puzzles, batch_size=bs, **kw)
            dt = time.perf_counter() - t0
            name = kw.get("strategy", DEFAULT_STRATEGY) + ("" if kw else " (default)")
            rows.append({"strategy": name, "batch_size": bs, "boards_per_s": len(puzzles) / dt})
            print(f"  batch {bs:4d} {name:16s} {len(puzzles) / dt:7.1f} boards/s", file=sys.stderr)
    return rows


def plots(out: dict, folder: Path, prefix: str) -> None:
    """The figures, as FOLDER/PREFIX_accuracy.png, _energy.png (where the model has energies), _rank_angle.png
    (where geometry was measured) and _strategies.png (where strategies were)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T, curve = out["trained_iterations"], out["per_iteration"]
    t = np.arange(1, len(curve["board_acc"]) + 1)
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    ax[0].plot(t, curve["board_acc"], label="board accuracy")
    ax[0].plot(t, curve["cell_acc"], label="cell accuracy")
    ax[0].axvline(T, color="tab:red", ls="--", lw=1, label=f"trained depth {T}")
    ax[0].set_xlabel("iterations")
    ax[0].set_title("Accuracy vs iterations (single pass)")
    ax[0].legend(fontsize=8)
    g = out["per_givens"]
    ks = sorted(int(k) for k in g[str(T)])
    for key in (str(T), str(2 * T)):
        ax[1].plot(ks, [g[key][str(k)]["board_acc"] for k in ks], marker="o", label=f"{key} iterations")
    ax[1].set_xlabel("givens")
    ax[1].set_title("Board accuracy per givens count")
    ax[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / f"{prefix}_accuracy.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
    for a, (k, label) in zip(ax, (("attn", "E_ATTN"), ("ff", "E_FF")) if curve["energy"] else ()):
        m, s = np.array(curve["energy"][k]["mean"]), np.array(curve["energy"][k]["std"])
        a.plot(t, m)
        a.fill_between(t, m - s, m + s, alpha=0.2)
        a.axvline(T, color="tab:red", ls="--", lw=1)
        a.set_title(f"{label} per iteration (mean ± std)")
        a.set_xlabel("iteration t")
    fig.tight_layout()
    if curve["energy"]:
        fig.savefig(folder / f"{prefix}_energy.png", dpi=120)
    plt.close(fig)

    if "effective_rank" in curve:  # absent with --geometry-boards 0
        rank, angle = np.array(curve["effective_rank"]), np.array(curve["average_angle"])
        fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
        for h in range(rank.shape[1]):
            ax[0].plot(t, rank[:, h], label=f"head {h + 1}")
            ax[1].plot(t, angle[:, h], label=f"head {h + 1}")
        for a, title in zip(ax, ("Effective rank per head (eq. 17)", "Average angle per head, degrees (eq. 18)")):
            a.axvline(T, color="tab:red", ls="--", lw=1)
            a.set_title(title)
            a.set_xlabel("iteration t")
            a.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / f"{prefix}_rank_angle.png", dpi=120)
        plt.close(fig)

    if out.get("strategies"):
        rows = out["strategies"]
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for r in rows:
            style = dict(marker="*", s=160, color="tab:red") if r["default"] else dict(marker="o", color="tab:blue")
            ax.scatter(1000 * r["seconds_per_board"], 100 * r["board_acc"], **style)
            ax.annotate(r["strategy"], (1000 * r["seconds_per_board"], 100 * r["board_acc"]), fontsize=7,
                        xytext=(4, -3), textcoords="offset points")
        front = sorted((r for r in rows if r["frontier"]), key=lambda r: r["seconds_per_board"])
        ax.plot([1000 * r["seconds_per_board"] for r in front], [100 * r["board_acc"] for r in front], ls=":",
                color="gray", label="frontier (nothing faster is as accurate)")
        ax.set_xscale("log")
        ax.set_xlabel(f"solve time per board, ms (batches of {out['strategies_batch_size']}, {out['device']})")
        ax.set_ylabel("board accuracy, %")
        ax.set_title(f"Inference strategies on {out['strategies_puzzles']} puzzles (red star: the default)")
        ax.legend(fontsize=7, loc="center right")
        fig.tight_layout()
        fig.savefig(folder / f"{prefix}_strategies.png", dpi=120)
        plt.close(fig)


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the shipped model)")
    ap.add_argument("--data", required=True, help="folder with the validation CSV (valid.csv / rrnstyle_valid...)")
    ap.add_argument("--split", default="valid", choices=SPLITS)
    ap.add_argument("--n", type=bench_args.count, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-factor", type=bench_args.at_least(2), default=4,
                    help="iterate up to this multiple of the trained depth (at least 2: the per-givens table reads 2T)")
    ap.add_argument("--geometry-boards", type=bench_args.at_least(0), default=100)
    ap.add_argument("--threads", type=bench_args.at_least(0), default=0)
    ap.add_argument("--name", default="sudoku", help="prefix of the figures' files, and of --out's default")
    ap.add_argument("--out", type=bench_args.output_file, default=None,
                    help="the JSON to write, the figures beside it (default: bench/results/NAME_eval.json)")
    ap.add_argument("--no-strategies", action="store_true")
    ap.add_argument("--strategies-n", type=bench_args.count, default=None,
                    help="puzzles for the strategy table (default: --n)")
    ap.add_argument("--batch-sizes", type=lambda text: bench_args.counts(text) if text.strip() else [],
                    default=[1, 4, 16, 64, 256], help="batch sizes timed on 256 puzzles ('' to skip)")
    args = ap.parse_args(argv)
    out_json = args.out or RESULTS / f"{args.name}_eval.json"
    if args.threads:
        torch.set_num_threads(args.threads)
    solver = Solver.load(args.checkpoint, "cpu")
    T = solver.trained_iters
    try:
        boards = load_boards(args.data, args.split, args.n, args.seed)
    except ValueError as e:  # more boards asked for than the file holds
        raise bench_args.BenchInputError(str(e)) from None
    print(f"{args.n} puzzles from {args.data} ({args.split}, seed {args.seed}); trained depth {T}", file=sys.stderr)
    curve = iteration_curve(solver, boards, args.max_factor * T, batch_size=250,
                            geometry_boards=args.geometry_boards, progress=None)
    givens = givens_count(boards.puzzles)
    out = {
        "checkpoint": str(args.checkpoint or bundled_checkpoint()), "data": str(args.data), "split": args.split,
        "puzzles": args.n, "seed": args.seed, "protocol": "np.random.RandomState(seed).permutation, first n",
        "trained_iterations": T, "parameters": solver.model.num_parameters(),
        "model": solver.model.cfg.to_dict(), "device": solver.device_name(), "cpu": cpu_model(),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "command": bench_args.command_line("sudoku_eval", argv),
        "per_iteration": curve.to_json(),
        "per_givens": {str(k): {str(g): v for g, v in per_givens(curve.board_right[k - 1], givens).items()}
                       for k in (T, 2 * T)},
    }
    if not args.no_strategies:
        k = args.strategies_n or args.n
        out["strategies_puzzles"] = k
        out["strategies_batch_size"] = solver.default_batch_size
        part = Boards(boards.puzzles[:k], boards.solutions[:k], boards.source, boards.split, boards.seed)
        out["strategies"] = strategies(solver, part, T)
    if not args.no_strategies:
        by_name = {r["strategy"]: r for r in out["strategies"]}
        tag = f"x{DEFAULT_PASSES}" if DEFAULT_STRATEGY == "commit" else ""
        at_t, at_2t = by_name.get(f"{DEFAULT_STRATEGY}@{T}{tag}"), by_name.get(f"{DEFAULT_STRATEGY}@{2 * T}{tag}")
        if at_t and at_2t:
            out["default_checks"] = {"strategy": f"{DEFAULT_STRATEGY}{tag}", "board_acc@T": at_t["board_acc"],
                                     "board_acc@2T": at_2t["board_acc"],
                                     "accuracy_2T_ge_T": at_2t["board_acc"] >= at_t["board_acc"]}
    if args.batch_sizes:
        sizes = args.batch_sizes
        out["batch_sweep"] = batch_sweep(solver, to_strings(boards.puzzles[:256]), T, sizes)
    curve = out["per_iteration"]
    e = curve["energy"]
    total = [a + f for a, f in zip(e["attn"]["mean"], e["ff"]["mean"])] if e else None
    out["checks"] = {
        "board_acc@T": curve["board_acc"][T - 1], "board_acc@2T": curve["board_acc"][2 * T - 1],
        "energy@T": total[T - 1] if total else None, "energy@last": total[-1] if total else None,
        "accuracy_2T_ge_T": curve["board_acc"][2 * T - 1] >= curve["board_acc"][T - 1],
        "energy_last_lt_T": total[-1] < total[T - 1] if total else None,
    }
    if not e:
        out["checks"]["energy_note"] = "this model's layers define no E_ATTN / E_FF (a baseline), so none is reported"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_json, out)
    plots(out, out_json.parent, args.name)
    print(json.dumps({"single_pass": out["checks"], "default": out.get("default_checks")}, indent=1))


if __name__ == "__main__":
    main()
