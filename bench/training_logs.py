"""A training run's log as one compact JSON: what the docs cite from a run, without its checkpoints.

    python bench/training_logs.py runs/sudoku-cpu runs/cifar10-cpu      # -> bench/results/training_logs/NAME.json
    python bench/training_logs.py runs/my-run --out /tmp/logs --rows 100

A run folder holds `metrics.jsonl` (a line per logged step, an `eval` line per evaluation) beside its `best/` and
`last/` checkpoints. The compact log keeps every evaluation line whole, the training lines thinned to at most
`--rows` evenly spaced ones (step, elapsed seconds, loss, accuracy, lr, and the energy-rise penalty where the run
logged it; the last step always kept), and from the
run's config.json the recipe, the training and data settings, the device and the parameter count.
`bench/training_curve.py` reads these files as it reads run folders.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import bench_args

from hyperset.checkpoint import atomic_write_json

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "training_logs"
COLUMNS = ("step", "time", "loss", "acc", "lr")
OPTIONAL = ("rise",)  # kept where the run logged them (the classifier's energy-rise penalty)
KEPT = ("recipe", "task", "parameters", "train", "data", "objective", "device", "steps", "schedule")


def _lines(folder: Path) -> list[dict[str, Any]]:
    path = folder / "metrics.jsonl"
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):  # a missing file: "PATH: No such file ..."
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise bench_args.BenchInputError(f"{path}:{i}: not JSON ({e.msg})") from None
    return out


def _config(folder: Path) -> dict[str, Any]:
    for sub in ("last", "best"):
        path = folder / sub / "config.json"
        if path.is_file():
            config = json.loads(path.read_text())
            return {k: config[k] for k in KEPT if k in config}
    return {}


def compact(folder: Path, rows: int) -> dict[str, Any]:
    """The compact log of one run folder (the last line of each step: a resumed run may repeat a step)."""
    evals: dict[int, dict[str, Any]] = {}
    steps: dict[int, dict[str, Any]] = {}
    for rec in _lines(folder):
        (evals if "eval" in rec else steps)[int(rec["step"])] = rec
    train = [steps[s] for s in sorted(steps)]
    stride = max(1, -(-len(train) // rows))
    kept = train[::stride] + ([train[-1]] if train and (len(train) - 1) % stride else [])
    config = _config(folder)
    columns = [*COLUMNS, *(c for c in OPTIONAL if any(c in r for r in train))]
    return {"run": folder.name, "config": config,
            "threads": int(config.get("train", {}).get("threads", 1)),
            "evals": [{"step": r["step"], "time": r["time"], "eval": r["eval"]} for r in map(evals.get, sorted(evals))],
            "train": {"columns": columns, "every": stride, "lines": len(train),
                      "rows": [[r.get(c) for c in columns] for r in kept]}}


@bench_args.input_errors_exit
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (holding metrics.jsonl)")
    ap.add_argument("--out", type=Path, default=OUT, help="folder of the compact logs (NAME.json each)")
    ap.add_argument("--rows", type=bench_args.count, default=200, help="most training lines kept per run")
    args = ap.parse_args()
    for folder in args.runs:
        log = compact(folder, args.rows)
        path = args.out / f"{folder.name}.json"
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, log)
        print(f"{path}: {len(log['evals'])} evaluations, {len(log['train']['rows'])} of "
              f"{log['train']['lines']} training lines")


if __name__ == "__main__":
    main()
