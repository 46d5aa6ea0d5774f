"""Validation accuracy against CPU-hours of training, read from run folders' metrics.jsonl or compact logs.

    python bench/training_curve.py                  # the Sudoku runs -> bench/results/sudoku_training_curve.*
    python bench/training_curve.py --run NAME=DIR[@START] ...

DIR is a run folder or its compact log (`bench/training_logs.py`; the shipped runs' are under
bench/results/training_logs/).

Each run's evaluations (`{"step", "time", "eval": {...}}` lines) are placed on a CPU-hours axis: `time` is the
trainer's elapsed seconds, multiplied by the run's thread count. A run started from another run's weights
(`@START`, a run name given earlier) begins where that run ended, so a fine-tune is charged the hours of its start.
Reported per run and metric: the curve, and the CPU-hours to first reach 60% and 90%.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import bench_args
import training_logs

from hyperset.checkpoint import atomic_write_json

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
LOGS = "bench/results/training_logs"
DEFAULT_RUNS = [
    f"old recipe (sudoku-cpu)={LOGS}/sudoku-cpu.json",
    f"new recipe (sudoku-cpu-deep, from the old model)={LOGS}/sudoku-cpu-deep.json@old recipe (sudoku-cpu)",
    f"new recipe, second cycle (lr 3e-4, 3,000 steps)={LOGS}/sudoku-cpu-deep2.json@new recipe (sudoku-cpu-deep, "
    "from the old model)",
    f"new recipe, third cycle (lr 2e-4)={LOGS}/sudoku-cpu-deep3.json@new recipe, second cycle (lr 3e-4, 3,000 steps)",
    f"new recipe, fourth cycle (lr 1.5e-4)={LOGS}/sudoku-cpu-deep4.json@new recipe, third cycle (lr 2e-4)",
    f"new recipe, fifth cycle (lr 1e-4)={LOGS}/sudoku-cpu-deep5.json@new recipe, fourth cycle (lr 1.5e-4)",
    f"Transformer baseline (sudoku-cpu-transformer)={LOGS}/sudoku-cpu-transformer.json",
]
THRESHOLDS = (0.6, 0.9)


def read_run(folder: Path) -> tuple[list[dict[str, Any]], int]:
    """The run's evaluation lines (last one per step: a resumed run may repeat a step) and its thread count, from
    a run folder or its compact log (`training_logs.compact` reads both the same way)."""
    log = json.loads(folder.read_text()) if folder.suffix == ".json" else training_logs.compact(folder, 1)
    return log["evals"], int(log["threads"])


def curves(specs: list[str]) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    for spec in specs:
        name, _, rest = spec.partition("=")
        path, _, start = rest.partition("@")
        if not name or not path:
            raise bench_args.BenchInputError(f"--run {spec!r}: expected NAME=DIR[@START]")
        if start and start not in runs:
            raise bench_args.BenchInputError(f"--run {spec!r}: @{start} names no earlier --run")
        evals, threads = read_run(REPO / path)
        offset = runs[start]["end_cpu_hours"] if start else 0.0
        hours = [offset + r["time"] * threads / 3600 for r in evals]
        metrics = sorted({k for r in evals for k in r["eval"] if k.startswith("val/board_acc")})
        run: dict[str, Any] = {"folder": path, "threads": threads, "start": start or None,
                               "start_cpu_hours": offset, "end_cpu_hours": hours[-1] if hours else offset,
                               "steps": [r["step"] for r in evals], "cpu_hours": hours, "metrics": {}}
        for m in metrics:
            values = [r["eval"].get(m) for r in evals]
            reach = {f"{int(100 * th)}%": next((h for h, v in zip(hours, values) if v is not None and v >= th), None)
                     for th in THRESHOLDS}
            run["metrics"][m] = {"values": values, "cpu_hours_to": reach}
        runs[name] = run
    return runs


def plot(runs: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, run in runs.items():
        for m, rec in run["metrics"].items():
            pts = [(h, 100 * v) for h, v in zip(run["cpu_hours"], rec["values"]) if v is not None]
            if pts:
                ax.plot(*zip(*pts), marker=".", label=f"{name}: {m.split('/')[-1]}")
    for th in THRESHOLDS:
        ax.axhline(100 * th, color="gray", lw=0.6, ls=":")
    ax.set_xlabel("CPU-hours of training (one core)")
    ax.set_ylabel("validation board accuracy, %, one pass")
    ax.set_title("Sudoku: validation accuracy against training CPU time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@bench_args.input_errors_exit
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="append", metavar="NAME=DIR[@START]", help="a run folder (repeatable)")
    ap.add_argument("--out", type=bench_args.output_file, default=str(ROOT / "results" / "sudoku_training_curve.json"))
    args = ap.parse_args()
    runs = curves(args.run or DEFAULT_RUNS)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, {"runs": runs, "axis": "CPU-hours = trainer elapsed seconds x threads / 3600"})
    plot(runs, out.with_suffix(".png"))
    for name, run in runs.items():
        for m, rec in run["metrics"].items():
            last = next((v for v in reversed(rec["values"]) if v is not None), None)
            print(f"{name:52s} {m:22s} last {100 * (last or 0):5.1f}%  hours to 60%/90%: "
                  + " / ".join("-" if h is None else f"{h:.2f}" for h in rec["cpu_hours_to"].values()))


if __name__ == "__main__":
    main()
