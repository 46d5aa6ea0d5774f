"""The hard model's big training step on a lent GPU: one call of at most 10 minutes that trains, keeps its state
and brings it back as one file; the CPU run goes on from it.

    # here, once: the training mix and its selection split (bench/hard_model.py)
    python bench/hard_model.py data --rrn data/sudoku --out data/sudoku-hard --rated-share 0.5
    # here, a rehearsal of the same code path on the CPU (a small batch, two minutes)
    python bench/hard_model_gpu.py train --data data/sudoku-hard --out /tmp/rehearsal --device cpu --minutes 2 \
        --calibration-steps 10 --set train.batch_size=16 --set data.n_val=100 --set data.n_select=100
    # on the GPU machine, with data/sudoku-hard carried along and OUT the folder that comes back
    python3 bench/hard_model_gpu.py train --data data/sudoku-hard --out $OUT --minutes 8
    # back here: the run folder, then the per-bucket measurements and the CPU run from it
    python bench/hard_model_gpu.py unpack DIR/sudoku-gpu-hard.tar.gz --out runs/sudoku-gpu-hard
    python bench/hard_model.py measure --checkpoint runs/sudoku-gpu-hard/best --name hard-gpu --rrn data/sudoku
    hyperset-train sudoku --recipe sudoku-cpu-hard --data data/sudoku-hard --out runs/sudoku-cpu-hard-gpu \
        --init-from runs/sudoku-gpu-hard/best

`train` continues a checkpoint (`--init-from`: the long CPU run's, by default) with the recipe `sudoku-gpu-hard`
and fits its steps to the wall-clock budget (`--minutes`, everything included): a calibration run of
CALIBRATION_STEPS steps (the warm-up, at the recipe's batch halved until it fits in the GPU's memory; compiled
where the recipe says so, and without compiling if the compiled step fails) measures the seconds per step and what
an evaluation and a compile cost, then the same run is resumed with the steps that fill the rest, its cosine over
them. Should it still run late, a timer stops it at the deadline (after its current step, the state saved). It
writes into `--out` two files: `sudoku-gpu-hard.tar.gz` (the run folder: best/, last/, metrics.jsonl) and
`hard_model_gpu.json` (the machine, the calibration, the plan, the steps done, every evaluation, the command).
`unpack` extracts the archive into a new folder (plain files and folders only).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import io
import json
import math
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_args
import torch

from hyperset.checkpoint import atomic_write_bytes, atomic_write_json
from hyperset.device import cpu_model, pick_device
from hyperset.pretrained import resolve
from hyperset.training.cli import build_task
from hyperset.training.recipes import apply_overrides, load_recipe
from hyperset.training.trainer import TrainConfig, Trainer

ROOT = Path(__file__).resolve().parent.parent
RECIPE = "sudoku-gpu-hard"
START = ROOT / "runs" / "sudoku-cpu-hard2" / "best"  # the long CPU run's last kept checkpoint
ARCHIVE, REPORT = "sudoku-gpu-hard.tar.gz", "hard_model_gpu.json"
CALIBRATION_STEPS = 30  # the warm-up, timed (--calibration-steps)
CALIBRATION_LOG_EVERY = 5
MIN_BATCH = 64  # the batch is halved on running out of memory down to this
MARGIN_SECONDS = 15.0  # kept free at the end for the archive and the report


def machine(device: torch.device) -> dict[str, Any]:
    out = {"torch": torch.__version__, "cpu": cpu_model(), "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return out


def read_log(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def seconds_per_step(log: list[dict[str, Any]]) -> tuple[float, float]:
    """(seconds per step after the first log line, seconds to the first log line) from a run's training lines;
    the first line holds the compile and the first steps' allocations."""
    lines = [e for e in log if "loss" in e]
    if len(lines) < 2:
        raise ValueError("the calibration logged fewer than two training lines: no step rate to read")
    (s0, t0), (s1, t1) = (lines[0]["step"], lines[0]["time"]), (lines[-1]["step"], lines[-1]["time"])
    return (t1 - t0) / (s1 - s0), t0


def plan_steps(done: int, left_seconds: float, per_step: float, overhead: float) -> int:
    """The steps of the whole run: those done, and as many more as fit in what is left after the overhead."""
    return done + max(0, math.floor((left_seconds - overhead) / per_step))


def _settings(recipe: dict[str, Any], threads: int, **train: Any) -> TrainConfig:
    return TrainConfig.from_dict({**recipe.get("train", {}), "threads": threads, **train})


def calibrate(task: Any, recipe: dict[str, Any], run: Path, device: torch.device, init_from: str, threads: int,
              steps: int, say: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Train the warm-up `steps` into `run` (new), at the recipe's batch halved until it fits and compiled unless
    that fails; returns the recipe as it ran, what was measured and the trainer's result."""
    recipe = copy.deepcopy(recipe)
    tries: list[dict[str, Any]] = []
    while True:
        cfg = _settings(recipe, threads, steps=steps, warmup_steps=steps, log_every=CALIBRATION_LOG_EVERY,
                        eval_every=steps, save_every_seconds=3600.0)
        shutil.rmtree(run, ignore_errors=True)
        t0 = time.monotonic()
        try:
            result = Trainer(task, cfg, run, device=str(device), recipe_name=RECIPE, quiet=True,
                             init_from=init_from).fit()
        except torch.OutOfMemoryError as e:
            tries.append({"batch_size": cfg.batch_size, "compile": cfg.compile, "error": f"out of memory: {e}"[:300]})
            if cfg.batch_size // 2 < MIN_BATCH:
                raise
            recipe["train"]["batch_size"] = cfg.batch_size // 2
            say(f"batch {cfg.batch_size} ran out of memory; trying {cfg.batch_size // 2}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        except Exception as e:  # noqa: BLE001 - a compiler failure of any kind: the eager step is the fallback
            if not cfg.compile:
                raise
            tries.append({"batch_size": cfg.batch_size, "compile": True, "error": f"{type(e).__name__}: {e}"[:300]})
            recipe["train"]["compile"] = False
            say(f"the compiled step failed ({type(e).__name__}); calibrating without compiling")
            continue
        wall = time.monotonic() - t0
        log = read_log(run)
        per_step, first = seconds_per_step(log)
        trained = max(e["time"] for e in log if "loss" in e)
        measured = {"steps": steps, "batch_size": cfg.batch_size, "compile": cfg.compile,
                    "seconds_per_step": per_step, "seconds_to_first_log": first, "wall_seconds": wall,
                    "evaluation_and_save_seconds": max(0.0, wall - trained), "failed_tries": tries}
        return recipe, measured, result


def train(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.monotonic()
    deadline = t_start + args.minutes * 60.0
    if args.calibration_steps < 2 * CALIBRATION_LOG_EVERY:
        raise ValueError(f"--calibration-steps {args.calibration_steps}: at least {2 * CALIBRATION_LOG_EVERY}, two "
                         "log lines to read a step rate from")
    device = pick_device(args.device)
    if device.type != "cuda" and args.device == "auto":
        raise ValueError("no CUDA device here; --device cpu runs the same steps on the CPU as a rehearsal")

    def say(text: str) -> None:
        print(f"[{time.monotonic() - t_start:6.1f} s] {text}", file=sys.stderr, flush=True)

    _, recipe = load_recipe(args.recipe)
    recipe = apply_overrides(recipe, list(args.set))
    task = build_task("sudoku", recipe, str(args.data))
    init_from = str(resolve(args.init_from))
    work = Path(tempfile.mkdtemp(prefix="hyperset-gpu-hard-"))
    run = work / "run"
    threads = args.threads or (os.cpu_count() or 1)
    warmup = args.calibration_steps
    say(f"data loaded; calibrating {warmup} steps on {device} from {init_from}")
    report: dict[str, Any] = {
        "machine": machine(device), "recipe": args.recipe, "set": list(args.set), "init_from": args.init_from,
        "data": str(args.data), "minutes": args.minutes, "command": bench_args.command_line("hard_model_gpu", None)}
    result: dict[str, Any] = {}
    try:
        recipe, report["calibration"], result = calibrate(task, recipe, run, device, init_from, threads, warmup, say)
        result = _run_to_deadline(task, recipe, run, device, threads, warmup, deadline, report, say)
    except BaseException as e:
        report["error"] = f"{type(e).__name__}: {e}"[:500]  # what was saved before it still comes back
        raise
    finally:
        log = read_log(run)
        report.update(steps_done=result.get("step", 0), finished=result.get("finished", False),
                      stopped_by=result.get("stopped_by"), best=result.get("best"),
                      evaluations=[e for e in log if "eval" in e], training_log=[e for e in log if "loss" in e][-20:],
                      wall_seconds=time.monotonic() - t_start)
        args.out.mkdir(parents=True, exist_ok=True)
        if run.is_dir():
            atomic_write_bytes(args.out / ARCHIVE, pack(run))
        atomic_write_json(args.out / REPORT, report)
        shutil.rmtree(work, ignore_errors=True)
        say(f"step {report['steps_done']} of {report.get('planned_steps', '?')}; {args.out} written")
    return report


def _run_to_deadline(task: Any, recipe: dict[str, Any], run: Path, device: torch.device, threads: int, warmup: int,
                     deadline: float, report: dict[str, Any], say: Any) -> dict[str, Any]:
    """Resume the calibrated run with the steps that fit before the deadline, its cosine over them; a timer stops
    it at the deadline (`Trainer.stop`: after the current step, its state saved). The trainer's result."""
    cal = report["calibration"]
    left = deadline - time.monotonic() - MARGIN_SECONDS
    # the resumed run compiles again and evaluates at its quarters
    overhead = (cal["seconds_to_first_log"] if cal["compile"] else 0.0) + 5 * cal["evaluation_and_save_seconds"]
    steps = report["planned_steps"] = plan_steps(warmup, left, cal["seconds_per_step"], overhead)
    say(f"{cal['seconds_per_step']:.3f} s a step at batch {cal['batch_size']} (compiled: {cal['compile']}); "
        f"{steps} steps in all for the {left:.0f} s left")
    if steps <= warmup:
        return _saved(run)
    cfg = _settings(recipe, threads, steps=steps, warmup_steps=warmup, eval_every=math.ceil(steps / 4))
    report["train"] = dataclasses.asdict(cfg)
    trainer = Trainer(task, cfg, run, device=str(device), resume=True, recipe_name=RECIPE, quiet=True)
    stop = threading.Timer(max(0.0, deadline - MARGIN_SECONDS - time.monotonic()), trainer.stop, args=("deadline",))
    stop.daemon = True
    stop.start()
    try:
        return trainer.fit()
    finally:
        stop.cancel()


def _saved(run: Path) -> dict[str, Any]:
    """The trainer's result for the finished state in last/, when no trainer ran to give it."""
    state = json.loads((run / "last" / "trainer.json").read_text())
    return {"step": state["step"], "finished": True, "stopped_by": None, "best": state.get("best")}


def pack(run: Path) -> bytes:
    """The run folder as a gzip'd tar of its plain files (best/, last/, metrics.jsonl), paths relative to it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(p for p in run.rglob("*") if p.is_file() and not p.name.startswith(".")):
            tar.add(path, arcname=str(path.relative_to(run)), recursive=False)
    return buf.getvalue()


def unpack(archive: Path, out: Path) -> list[str]:
    """Extract into `out`, which must be new or empty: plain files and folders under it, nothing else."""
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty: unpack into a new folder")
    with tarfile.open(archive, mode="r:gz") as tar:
        names = tar.getnames()
        out.mkdir(parents=True, exist_ok=True)
        tar.extractall(out, filter="data")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train on the GPU within a wall-clock budget and pack the run")
    t.add_argument("--data", required=True, type=Path, help="the training mix (bench/hard_model.py data)")
    t.add_argument("--out", required=True, type=Path, help="folder for the archive and the report")
    t.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget, everything included")
    t.add_argument("--init-from", default=str(START), help="checkpoint folder or shipped model name to continue")
    t.add_argument("--recipe", default=RECIPE)
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override, repeatable")
    t.add_argument("--device", default="auto", help="auto (a CUDA device, else refuse), cuda, cpu")
    t.add_argument("--threads", type=int, default=0, help="CPU threads (0: every core)")
    t.add_argument("--calibration-steps", type=int, default=CALIBRATION_STEPS,
                   help="the warm-up steps that are timed (at least 2 x 5, the calibration's log interval)")
    u = sub.add_parser("unpack", help="extract an archive that train wrote into a new folder")
    u.add_argument("archive", type=Path)
    u.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "unpack":
            names = unpack(args.archive, args.out)
            print(f"{args.out}: {len(names)} entries")
        else:
            train(args)
    except (ValueError, OSError, tarfile.TarError, torch.OutOfMemoryError) as e:
        print(f"hard_model_gpu.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
