"""Hyper-SET vs the Transformer baseline on Sudoku at equal training budgets, from the two runs' own logs.

    python bench/sudoku_baseline.py                 # runs/sudoku-cpu vs runs/sudoku-cpu-transformer

Both runs use the same recipe family (data, augmentation, batch, optimizer, schedule, loss on every iteration;
`training/recipes/sudoku-cpu*.toml`) and the same seed, so at a given step they have seen the same batches.
The trainer evaluates both every 1,000 steps on the same 1,000 validation puzzles (paper protocol); this script
pairs those evaluations at the steps both runs have reached and writes bench/results/sudoku_baseline.json + .png.
A run's learning-rate schedule is part of its budget. Each run's recorded `schedule` (the piecewise cosine it
followed; the trainer writes it into last/trainer.json, the shipped model's config.json holds Hyper-SET's) is
compared step by step: rows where the two runs had followed different schedules are marked. The baseline replays
Hyper-SET's schedule with `hyperset-train sudoku --recipe sudoku-cpu-transformer --schedule hyperset/weights/sudoku`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import bench_args

from hyperset.checkpoint import atomic_write_json
from hyperset.training.trainer import parse_schedule, segment_budget

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
KEYS = ("val/board_acc@16", "val/cell_acc@16", "val/board_acc@32", "val/cell_acc@32")


def evaluations(run: Path) -> dict[int, dict[str, float]]:
    """{step: eval metrics} from a run's metrics.jsonl, its Sudoku evaluations (all of `KEYS`) only (the last
    evaluation wins if a step was re-run); a run with none, a `BenchInputError`."""
    out: dict[int, dict[str, float]] = {}
    with open(run / "metrics.jsonl") as f:
        for line in f:
            row = json.loads(line)
            if all(k in row.get("eval", {}) for k in KEYS):
                out[int(row["step"])] = {k: row["eval"][k] for k in KEYS}
    if not out:
        raise bench_args.BenchInputError(f"{run / 'metrics.jsonl'}: no Sudoku evaluations ({', '.join(KEYS)}); "
                                         "expected the log of a Sudoku training run")
    return out


def schedule_of(source: Path) -> list[dict[str, int]] | None:
    try:
        return parse_schedule(str(source))
    except ValueError:
        return None  # a run from before schedules were recorded


def same_schedule(a: list[dict[str, int]] | None, b: list[dict[str, int]] | None, step: int) -> bool | None:
    """Whether both plans gave every step before `step` the same cosine (None if a plan is unknown)."""
    if a is None or b is None:
        return None
    bounds = {p["from_step"] for p in a + b if p["from_step"] < step}
    return all(segment_budget(a, s) == segment_budget(b, s) for s in bounds)


def parameters(run: Path) -> int | None:
    for sub in ("last", "best"):
        cfg = run / sub / "config.json"
        if cfg.is_file():
            return json.loads(cfg.read_text()).get("parameters")
    return None


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", type=Path, default=ROOT / "runs" / "sudoku-cpu")
    ap.add_argument("--baseline", type=Path, default=ROOT / "runs" / "sudoku-cpu-transformer")
    ap.add_argument("--ours-schedule", type=Path, default=ROOT / "hyperset" / "weights" / "sudoku",
                    help="where Hyper-SET's recorded schedule is (its run predates the trainer recording it)")
    ap.add_argument("--out", type=bench_args.output_file, default=RESULTS / "sudoku_baseline.json")
    args = ap.parse_args(argv)
    ours, base = evaluations(args.ours), evaluations(args.baseline)
    steps = sorted(set(ours) & set(base))
    plans = {"hyperset": schedule_of(args.ours) or schedule_of(args.ours_schedule),
             "transformer": schedule_of(args.baseline)}
    rows = [{"step": s, "same_schedule": same_schedule(plans["hyperset"], plans["transformer"], s),
             "hyperset": ours[s], "transformer": base[s]} for s in steps]
    out = {"ours": str(args.ours), "baseline": str(args.baseline), "parameters": {
        "hyperset": parameters(args.ours), "transformer": parameters(args.baseline)},
        "schedules": plans, "ours_last_step": max(ours, default=0), "baseline_last_step": max(base, default=0),
        "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, out)
    print("| step | Hyper-SET board / cell @16 | Transformer board / cell @16 | board @32: Hyper-SET / Transformer |")
    print("|---|---|---|---|")
    for r in rows:
        h, t = r["hyperset"], r["transformer"]
        print(f"| {r['step']:,} | {100 * h['val/board_acc@16']:.1f}% / {100 * h['val/cell_acc@16']:.1f}% | "
              f"{100 * t['val/board_acc@16']:.1f}% / {100 * t['val/cell_acc@16']:.1f}% | "
              f"{100 * h['val/board_acc@32']:.1f}% / {100 * t['val/board_acc@32']:.1f}% |")
    plot(ours, base, args.out.with_suffix(".png"), out["parameters"])


def plot(ours: dict, base: dict, path: Path, params: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    for runs, label in ((ours, f"Hyper-SET ({params['hyperset'] or '?':,} params)"),
                        (base, f"Transformer ({params['transformer'] or '?':,} params)")):
        s = sorted(runs)
        ax[0].plot(s, [100 * runs[k]["val/board_acc@16"] for k in s], marker="o", ms=3, label=label)
        ax[1].plot(s, [100 * runs[k]["val/cell_acc@16"] for k in s], marker="o", ms=3, label=label)
    for a, title in zip(ax, ("board accuracy @16, %", "cell accuracy @16, %")):
        a.set_xlabel("training step (batch 32)")
        a.set_title(f"Validation {title}")
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
