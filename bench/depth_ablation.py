"""Depth ablations for the Sudoku model: which training change buys accuracy past the trained depth.

    python bench/depth_ablation.py list                                        # the arms and what each changes
    python bench/depth_ablation.py run --arm ft-deep4 --data DIR --budget 720   # train + evaluate one arm
    python bench/depth_ablation.py table                                       # every arm run: JSON + PNG

Every arm trains with the shared trainer on one thread for the same CPU-time budget: a short calibration measures
the arm's CPU-seconds per optimizer step (arms differ: deep supervision runs more iterations per step), the step
count is the budget divided by it, and the lr follows a full warm-up + cosine over those steps. Arms of the family
"scratch" start from a new model; arms of the family "finetune" start from the shipped model's weights. A killed
arm continues with the same command (the trainer resumes; the calibration is kept in the run folder).

Each arm is then measured on the paper protocol's seeded draw of the validation file: board and cell accuracy of one
pass at T, 2T, 4T and 8T (one pass to 8T, read out on the way), the share of boards whose E_ATTN + E_FF never rises
over those 8T iterations, the default solver strategy, and the default strategy on the 17-given puzzles. Results go
to bench/results/depth_ablation/ARM.json; `table` gathers them into bench/results/depth_ablation.json and .png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import bench_args
import numpy as np
import torch

from hyperset.checkpoint import atomic_write_json
from hyperset.config import STEP_CONTROLS
from hyperset.device import cpu_has_native_bf16, cpu_model
from hyperset.models import HyperSETModel, load_checkpoint
from hyperset.pretrained import resolve
from hyperset.solve import DEFAULT_PASSES, DEFAULT_STRATEGY, Solver
from hyperset.sudoku.data import find_split, givens_count, load_csv, protocol_split
from hyperset.training.cli import build_task
from hyperset.training.recipes import apply_overrides, load_recipe
from hyperset.training.trainer import TrainConfig, Trainer, make_optimizer

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
RUNS = ROOT.parent / "runs" / "ablations"
DEAD = ["model.time_init=\"zero\""]  # the shipped recipe's (and the authors') dead time network
FINETUNE = ["train.lr=3e-4", "train.min_lr=1e-5"]
# torch.compile is off in the classifier arms: its first-step compile time would land in one arm's calibration
CLS_FINETUNE = FINETUNE + ["train.compile=false", "objective.eval_iters=[12, 24, 48]"]

# name -> family, --set overrides on the sudoku-cpu recipe, what it tests
ARMS: dict[str, dict[str, Any]] = {
    "scratch-dead": {"family": "scratch", "set": DEAD,
                     "note": "the shipped recipe: time network dead from init (authors' init), signed steps"},
    "scratch-live": {"family": "scratch", "set": [], "note": "time network live (L1, L2 default init, L3 zero)"},
    "scratch-live-positive": {"family": "scratch", "set": ["model.step_sign=\"positive\""],
                              "note": "live time network, step sizes through a softplus (every step descends)"},
    "scratch-dead-positive": {"family": "scratch", "set": DEAD + ["model.step_sign=\"positive\""],
                              "note": "dead time network, positive step sizes"},
    "scratch-live-deep2": {"family": "scratch", "set": ["objective.segments=2"],
                           "note": "live, deep supervision over 2 segments of T (state carried detached)"},
    "ft-base": {"family": "finetune", "set": DEAD + FINETUNE,
                "note": "control: the shipped model trained on with its own recipe (dead t)"},
    "ft-live": {"family": "finetune", "set": FINETUNE,
                "note": "the shipped model with its time network revived (outputs unchanged at start)"},
    "ft-deep2": {"family": "finetune", "set": DEAD + FINETUNE + ["objective.segments=2"],
                 "note": "deep supervision: 2 segments of T iterations, detached between them (t runs on)"},
    "ft-deep4": {"family": "finetune", "set": DEAD + FINETUNE + ["objective.segments=4"],
                 "note": "deep supervision: 4 segments of T (training sees t up to 4T)"},
    "ft-progressive": {"family": "finetune", "set": DEAD + FINETUNE + ["objective.skip_iters=[0, 48]"],
                       "note": "progressive loss: a no-grad prefix of 0-48 iterations, then T supervised ones"},
    "ft-randdepth": {"family": "finetune", "set": DEAD + FINETUNE + ["objective.train_iters=[8, 32]"],
                     "note": "random depth: T ~ U{8..32} per step, all-iteration loss"},
    "ft-live-deep4": {"family": "finetune", "set": FINETUNE + ["objective.segments=4"],
                      "note": "revived time network + 4 segments of deep supervision"},
    "ft-live-deep4-tmax": {"family": "finetune", "set": FINETUNE + ["objective.segments=4", "model.time_max=16"],
                           "note": "revived time network, 4 segments, t clamped at T"},
    # The first shipped CIFAR-10 classifier (d=192, T=12) trained on with its own recipe at a fine-tuning lr: does a
    # live time network or deep supervision change its drop past T? Measured to 4T (depth curve and energy per image).
    "cls-ft-dead": {"family": "classify", "set": DEAD + CLS_FINETUNE,
                    "note": "control: the first shipped classifier trained on with its dead time network"},
    "cls-ft-live": {"family": "classify", "set": CLS_FINETUNE,
                    "note": "the first shipped classifier with its time network revived (outputs unchanged at start)"},
    "cls-ft-live-deep2": {"family": "classify", "set": CLS_FINETUNE + ["objective.segments=2"],
                          "note": "revived time network + deep supervision over 2 detached segments of T"},
    "cls-ft-live-deep4": {"family": "classify", "set": CLS_FINETUNE + ["objective.segments=4"],
                          "note": "revived time network + deep supervision over 4 detached segments of T"},
    "cls-ft-dead-deep2": {"family": "classify", "set": DEAD + CLS_FINETUNE + ["objective.segments=2"],
                          "note": "dead time network + deep supervision over 2 detached segments of T"},
    "cls-ft-live-deep2-rand": {"family": "classify",
                               "set": CLS_FINETUNE + ["objective.segments=2", "objective.train_iters=[8, 16]"],
                               "note": "revived time network + 2 detached segments of 8-16 iterations drawn per step"},
    "cls-ft-live-deep4-rand": {"family": "classify",
                               "set": CLS_FINETUNE + ["objective.segments=4", "objective.train_iters=[6, 12]"],
                               "note": "revived time network + 4 detached segments of 6-12 iterations drawn per step"},
}
# family -> task, recipe, start: a shipped model's name or a checkpoint folder; the classifier arms start from the
# first shipped classifier, the end of the run cifar10-cpu
RECIPES = {"finetune": ("sudoku", "sudoku-cpu", "sudoku"), "scratch": ("sudoku", "sudoku-cpu", None),
           "classify": ("classify", "cifar10-cpu", str(ROOT.parent / "runs" / "cifar10-cpu" / "best"))}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def arm_recipe(arm: str) -> tuple[str, dict[str, Any]]:
    name, recipe = load_recipe(RECIPES[ARMS[arm]["family"]][1])
    return name, apply_overrides(recipe, list(ARMS[arm]["set"]))


def calibrate(task: Any, train: TrainConfig, steps: int = 6) -> float:
    """CPU-seconds per optimizer step of this arm, measured in this process on one thread (two warm-up steps).

    The cost depends on the arm's shapes and iterations, not on the weights, so a new model is timed."""
    model = HyperSETModel(task.model_config()).train()
    opt = make_optimizer(model, train)
    autocast = Trainer(task, train, Path("/nonexistent"), quiet=True)._autocast(torch.device("cpu"))
    times = []
    for step in range(steps + 2):
        t0 = cpu_seconds()
        batch = task.batch(step, train.batch_size, train.seed, torch.device("cpu"))
        with autocast():
            loss, _ = task.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(cpu_seconds() - t0)
    return float(np.mean(times[2:]))


def run_arm(arm: str, data: str, budget: float, threads: int) -> tuple[Path, Any]:
    """Train the arm (or finish it) and return its run folder and its task (data loaded once)."""
    torch.set_num_threads(threads)
    spec = ARMS[arm]
    out = RUNS / arm
    out.mkdir(parents=True, exist_ok=True)
    name, recipe = arm_recipe(arm)
    task_name, _, start = RECIPES[spec["family"]]
    task = build_task(task_name, recipe, data)
    train = TrainConfig.from_dict({**recipe.get("train", {}), "threads": threads})
    init_from = str(resolve(start)) if start else None
    plan_file = out / "arm.json"
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else None
    if plan is None:
        per_step = calibrate(task, train)
        steps = max(50, int(budget / per_step))
        plan = {"arm": arm, **spec, "budget_cpu_seconds": budget, "calibrated_seconds_per_step": per_step,
                "steps": steps, "cpu_seconds": 0.0, "init_from": init_from}
        atomic_write_json(plan_file, plan)
        print(f"{arm}: {per_step:.3f} CPU-s/step -> {steps} steps for {budget:.0f} CPU-s", file=sys.stderr)
    steps = plan["steps"]
    warmup = min(train.warmup_steps, steps // 10) if init_from is None else steps // 20
    train = TrainConfig.from_dict({**recipe.get("train", {}), "threads": threads, "steps": steps,
                                   "warmup_steps": warmup, "eval_every": steps, "save_every_seconds": 120.0})
    resume = (out / "last" / "trainer.json").is_file()
    if not resume or json.loads((out / "last" / "trainer.json").read_text()).get("step", 0) < steps:
        t0 = cpu_seconds()
        Trainer(task, train, out, resume=resume, recipe_name=name, quiet=not sys.stderr.isatty(),
                init_from=init_from).fit()
        plan["cpu_seconds"] += cpu_seconds() - t0
        atomic_write_json(plan_file, plan)
    return out, task


@torch.no_grad()
def depth_curve(model: torch.nn.Module, puzzles: np.ndarray, solutions: np.ndarray, max_iters: int,
                batch: int = 125) -> dict[str, Any]:
    """One pass to max_iters: board/cell accuracy at every t and whether each board's total energy never rose."""
    board = np.zeros((max_iters, len(puzzles)), dtype=bool)
    cells = np.zeros(max_iters)
    energy = np.zeros((max_iters, len(puzzles)))
    for i in range(0, len(puzzles), batch):
        p = torch.from_numpy(puzzles[i: i + batch]).long()
        s = torch.from_numpy(solutions[i: i + batch]).long()
        for layer, t, x in model.core.iterate(model.stem(p), max_iters):
            digits = torch.where(p > 0, p, model.readout(x).argmax(-1) + 1)
            ok = digits == s
            board[t - 1, i: i + len(p)] = ok.all(-1).numpy()
            cells[t - 1] += (ok & (p == 0)).sum().item()
            energy[t - 1, i: i + len(p)] = sum(v.double() for v in layer.energy(x, t).values()).numpy()
    # non-increasing up to float noise: a rise of more than 1e-5 relative counts
    rises = np.diff(energy, axis=0) > 1e-5 * np.abs(energy[:-1]).clip(min=1.0)
    return {"board_acc": board.mean(1).tolist(), "cell_acc": (cells / (puzzles == 0).sum()).tolist(),
            "energy_mean": energy.mean(1).tolist(), "energy_monotone": float((~rises.any(0)).mean())}


def default_strategy(solver: Solver, puzzles: np.ndarray, solutions: np.ndarray, **kw: Any) -> dict[str, float]:
    """The solver's defaults (or `kw`, e.g. iters="auto") on the puzzles: board accuracy, boards/s, iterations."""
    strings = lambda a: ["".join(map(str, r)) for r in a.tolist()]  # noqa: E731
    t0 = time.perf_counter()
    res = solver.solve(strings(puzzles), solutions=strings(solutions), **kw)
    dt = time.perf_counter() - t0
    return {"board_acc": float(np.mean([r.correct for r in res])), "boards_per_s": len(res) / dt,
            "mean_iterations": float(np.mean([r.iterations for r in res]))}


def auto_against_fixed(solver: Solver, puzzles: np.ndarray, solutions: np.ndarray,
                       curve: dict[str, Any]) -> dict[str, Any]:
    """`--iters auto` (one pass, each board stops when valid or settled) against one fixed pass of as many
    iterations as auto's mean, rounded up (the fairer side for the fixed count), and the best fixed count up to
    auto's mean; accuracies of fixed passes come from the depth curve of the same puzzles."""
    auto = default_strategy(solver, puzzles, solutions, iters="auto")
    at = min(len(curve["board_acc"]), math.ceil(auto["mean_iterations"]))
    best = int(np.argmax(curve["board_acc"][:at])) + 1
    return {**auto, "max_iterations": 4 * solver.trained_iters, "fixed_at_mean": {
                "iters": at, "board_acc": curve["board_acc"][at - 1]},
            "best_fixed_up_to_mean": {"iters": best, "board_acc": curve["board_acc"][best - 1]},
            "auto_wins": auto["board_acc"] >= max(curve["board_acc"][:at])}


def default_speed(checkpoint: Path | str, data: str, threads: int, n: int = 256) -> dict[str, Any]:
    """Boards/s of the solver's defaults (strategy, depth per pass, batch size) with `threads` threads on the first
    `n` puzzles of the protocol's draw, best of two runs, with the load average (other work on the machine)."""
    torch.set_num_threads(threads)
    solver = Solver.load(checkpoint, "cpu")
    p, s = load_csv(find_split(data, "valid"))
    vp, vs = protocol_split(p, s, 1000, 0)
    load = os.getloadavg()[0]
    runs = [default_strategy(solver, vp[:n], vs[:n]) for _ in range(2)]
    best = max(runs, key=lambda r: r["boards_per_s"])
    return {**best, "threads": threads, "puzzles": n, "batch_size": solver.default_batch_size,
            "iters_per_pass": solver.default_iters, "load_average_1min_before": load,
            "load_average_1min_after": os.getloadavg()[0]}


def check_puzzle_counts(data: str, n: int, n17: int, speed: bool = False) -> None:
    """A `BenchInputError` unless the validation file under `data` holds `n` puzzles and `n17` with 17 givens
    (what `evaluate_arm` draws), and with `speed` the 1,000 `default_speed` draws, checked before any training or
    measuring."""
    p, _ = load_csv(find_split(data, "valid"))
    seventeen = int((givens_count(p) == 17).sum())
    wants = [(f"--n {n}", n, len(p), "puzzles")]
    if speed:
        wants.append(("--speed-threads (timed on the protocol's draw of 1,000 puzzles)", 1000, len(p), "puzzles"))
    wants.append((f"--n17 {n17}", n17, seventeen, "17-given puzzles"))
    for what_for, wanted, held, what in wants:
        if wanted > held:
            raise bench_args.BenchInputError(f"{what_for}: the validation file of {data} holds {held:,} {what}")


def evaluate_arm(checkpoint: Path | str, data: str, n: int, n17: int, threads: int) -> dict[str, Any]:
    torch.set_num_threads(threads)
    solver = Solver.load(checkpoint, "cpu")
    model, T = solver.model, solver.trained_iters
    p, s = load_csv(find_split(data, "valid"))
    vp, vs = protocol_split(p, s, n, 0)
    curve = depth_curve(model, vp, vs, 8 * T)
    g17 = givens_count(p) == 17
    hp, hs = protocol_split(p[g17], s[g17], n17, 0)
    depths = {f"{k}T": k * T for k in (1, 2, 4, 8)}
    return {
        "checkpoint": str(checkpoint), "trained_iterations": T, "puzzles": n, "puzzles_17": n17,
        "single_pass": {k: {"iters": d, "board_acc": curve["board_acc"][d - 1], "cell_acc": curve["cell_acc"][d - 1]}
                        for k, d in depths.items()},
        "energy_monotone_8T": curve["energy_monotone"], "curve": curve,
        "default_strategy": {"name": f"{DEFAULT_STRATEGY}@{solver.default_iters}x{DEFAULT_PASSES}",
                             "all": default_strategy(solver, vp, vs), "givens17": default_strategy(solver, hp, hs)},
        "auto": auto_against_fixed(solver, vp, vs, curve),
    }


DEPTH_MULTIPLES = (1, 2, 4, 8, 16)  # the multiples of T a classifier is read out at


def depth_key(k: int) -> str:
    """"T", "2T", "4T", ...: the name of the read-out at k x T."""
    return f"{k}T" if k > 1 else "T"


@torch.no_grad()
def image_depth_curve(model: torch.nn.Module, split: Any, max_iters: int, batch: int = 250) -> dict[str, Any]:
    """One pass to max_iters over a classification split (fp32): top-1 at every t, and per image whether
    E_ATTN + E_FF never rose from iteration 1 up to T, 2T, 4T ... (a rise of more than 1e-5 relative counts)."""
    correct = np.zeros(max_iters)
    energy = np.zeros((max_iters, len(split)))
    seen = 0
    for images, labels in split.batches(batch):
        for layer, t, x in model.core.iterate(model.stem(images), max_iters):
            correct[t - 1] += int((model.readout(x).argmax(-1) == labels).sum())
            energy[t - 1, seen: seen + len(labels)] = sum(v.double() for v in layer.energy(x, t).values()).numpy()
        seen += len(labels)
    rises = np.diff(energy, axis=0) > 1e-5 * np.abs(energy[:-1]).clip(min=1.0)
    T = model.cfg.iters
    never = {depth_key(k): float((~rises[: k * T - 1].any(0)).mean()) for k in DEPTH_MULTIPLES if k * T <= max_iters}
    return {"top1": (correct / max(seen, 1)).tolist(), "energy_never_rises": never}


def classifier_depth(checkpoint: Path, data_dir: str, split: str, depth: int, threads: int,
                     step_control: str | None = None, backtrack_from: int | None = None) -> dict[str, Any]:
    """`image_depth_curve` of a classifier checkpoint on a CIFAR split (its own dataset; val: the held-out part of
    train at the checkpoint's recorded fraction and seed), read out at T, 2T, ... depth x T; `step_control` and
    `backtrack_from` (None: the checkpoint's) replace the model's at inference."""
    from hyperset.checkpoint import read_config
    from hyperset.training.classify_task import ClassifyData, load_split

    torch.set_num_threads(threads)
    model, _ = load_checkpoint(checkpoint, map_location="cpu")
    model.set_step_control(step_control, backtrack_from)
    data = read_config(Path(checkpoint)).get("data") or {}
    images = load_split(ClassifyData(dataset=data.get("dataset", "cifar10"), data_dir=data_dir,
                                     val_fraction=data.get("val_fraction", 0.1), seed=data.get("seed", 0)), split)
    T = model.cfg.iters
    curve = image_depth_curve(model.eval(), images, depth * T)
    return {"checkpoint": str(checkpoint), "split": split, "images": len(images), "trained_iterations": T,
            "step_control": model.cfg.step_control, "backtracks": model.cfg.backtracks,
            "backtrack_from": model.cfg.backtrack_from,
            "top1": {depth_key(k): curve["top1"][k * T - 1] for k in DEPTH_MULTIPLES if k <= depth},
            "energy_never_rises": curve["energy_never_rises"], "curve": curve["top1"]}


def evaluate_classifier_arm(out: Path, task: Any, threads: int, depth: int = 4) -> dict[str, Any]:
    """One fp32 pass to ``depth`` x T over the validation images (the held-out 10% of the training set), before and
    after the arm's training: top-1 at every iteration (and at the recipe's depths), and the share of images whose
    energy never rises."""
    torch.set_num_threads(threads)
    result: dict[str, Any] = {"trained_iterations": task.model.iters, "val_images": len(task.val)}
    for label, ckpt in (("start", resolve(RECIPES["classify"][2])), ("end", out / "last")):
        model, _ = load_checkpoint(ckpt, map_location="cpu")
        curve = image_depth_curve(model.eval(), task.val, max(depth * task.model.iters, *task.eval_iters))
        result[label] = {f"val/top1@{k}": curve["top1"][k - 1] for k in task.eval_iters}
        result[label + "_curve"] = curve
    return result


def table(out_json: Path) -> dict[str, Any]:
    rows, classifier = [], []
    for f in sorted((RESULTS / "depth_ablation").glob("*.json")):
        r = json.loads(f.read_text())
        (classifier if r["family"] == "classify" else rows).append(r)
    result = {"recipe": RECIPES["finetune"][1], "arms": rows,
              "columns": "single-pass board accuracy at T/2T/4T/8T, default strategy (all, 17 givens), "
                         "share of boards whose energy never rises to 8T, CPU-seconds of training",
              "classifier_recipe": RECIPES["classify"][1], "classifier_arms": classifier}
    atomic_write_json(out_json, result)
    plot(rows, out_json.with_suffix(".png"))
    for r in rows:
        sp = r["eval"]["single_pass"]
        d = r["eval"]["default_strategy"]
        print(f"{r['arm']:24s} " + " ".join(f"{k} {100 * v['board_acc']:5.1f}" for k, v in sp.items())
              + f" | default {100 * d['all']['board_acc']:5.1f} 17g {100 * d['givens17']['board_acc']:5.1f}"
              + f" | mono {100 * r['eval']['energy_monotone_8T']:5.1f}% | {r['cpu_seconds']:6.0f} CPU-s")
    for r in classifier:
        e = r["eval"]
        print(f"{r['arm']:24s} " + " ".join(f"{k} " + " ".join(f"{m.split('/')[-1]} {100 * v:5.2f}" for m, v in
                                                               e[k].items()) + " |" for k in ("start", "end"))
              + f" {r['cpu_seconds']:6.0f} CPU-s")
    return result


def markdown(result: dict[str, Any]) -> str:
    """The tables of docs/sudoku.md and docs/step-sizes.md, from the gathered results."""
    start = {"finetune": "shipped model", "scratch": "scratch", "classify": "first shipped classifier"}
    lines = ["| arm | start | what changes | CPU-s | one pass T / 2T / 4T / 8T (board %) | cell % at 4T "
             "| energy never rises to 8T | default strategy (all / 17 givens) |", "|---|---|---|---|---|---|---|---|"]
    for r in result["arms"]:
        e = r["eval"]
        sp, d = e["single_pass"], e["default_strategy"]
        lines.append(f"| {r['arm']} | {start[r['family']]} | {r['note']} | {r['cpu_seconds']:.0f} | "
                     + " / ".join(f"{100 * v['board_acc']:.1f}" for v in sp.values())
                     + f" | {100 * sp['4T']['cell_acc']:.1f} | {100 * e['energy_monotone_8T']:.1f}% | "
                     f"{100 * d['all']['board_acc']:.1f} / {100 * d['givens17']['board_acc']:.1f} |")
    if result["classifier_arms"]:
        lines += ["", "| arm | what changes | CPU-s | validation top-1 at T / 2T, before | after |",
                  "|---|---|---|---|---|"]
        for r in result["classifier_arms"]:
            e, T = r["eval"], r["eval"]["trained_iterations"]
            pair = [f"{100 * e[k][f'val/top1@{T}']:.2f} / {100 * e[k][f'val/top1@{2 * T}']:.2f}"
                    for k in ("start", "end")]
            lines.append(f"| {r['arm']} | {r['note']} | {r['cpu_seconds']:.0f} | {pair[0]} | {pair[1]} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
    for ax, family in zip(axes, ("finetune", "scratch")):
        for r in (r for r in rows if r["family"] == family):
            acc = 100 * np.array(r["eval"]["curve"]["board_acc"])
            ax.plot(np.arange(1, len(acc) + 1), acc, label=r["arm"])
        T = rows[0]["eval"]["trained_iterations"] if rows else 16
        for k in (1, 2, 4, 8):
            ax.axvline(k * T, color="gray", lw=0.6, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("iterations (one pass)")
        ax.set_title({"finetune": "from the shipped model", "scratch": "from scratch"}[family]
                     + " (equal CPU time per arm)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("board accuracy, % (validation)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def curve_plot(files: list[Path], path: Path) -> None:
    """One-pass board accuracy and E_ATTN + E_FF against iterations (to 8T) for measured checkpoints."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, e_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    T = 16
    for f in files:
        r = json.loads(f.read_text())
        e, T = r["eval"], r["eval"]["trained_iterations"]
        acc = 100 * np.array(e["curve"]["board_acc"])
        t = np.arange(1, len(acc) + 1)
        default = 100 * e["default_strategy"]["all"]["board_acc"]
        acc_ax.plot(t, acc, label=f"{r['name']} (default strategy {default:.1f}%)")
        e_ax.plot(t, e["curve"]["energy_mean"], label=r["name"])
    for ax in (acc_ax, e_ax):
        for k in (1, 2, 4, 8):
            ax.axvline(k * T, color="gray", lw=0.6, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"iterations of one pass (trained: {T})")
        ax.legend(fontsize=8)
    acc_ax.set_ylabel("board accuracy, % (1,000 validation puzzles)")
    e_ax.set_ylabel("mean E_ATTN + E_FF")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    run = sub.add_parser("run")
    run.add_argument("--arm", required=True, choices=sorted(ARMS))
    run.add_argument("--data", required=True, help="Sudoku data folder (train + valid CSVs)")
    run.add_argument("--budget", type=bench_args.seconds, default=1200.0, help="CPU-seconds of training (one thread)")
    run.add_argument("--n", type=bench_args.count, default=500, help="validation puzzles for the measurements")
    run.add_argument("--n17", type=bench_args.count, default=300,
                     help="17-given validation puzzles for the default strategy")
    run.add_argument("--threads", type=bench_args.count, default=1)
    run.add_argument("--out", type=bench_args.output_file, default=None,
                     help="the arm's result (default: bench/results/depth_ablation/ARM.json, which `table` reads)")
    meas = sub.add_parser("measure", help="measure a checkpoint as the arms are measured (e.g. a shipped model)")
    meas.add_argument("--checkpoint", required=True, help="checkpoint folder or shipped model name")
    meas.add_argument("--name", required=True, help="result name: bench/results/sudoku_depth/NAME.json")
    meas.add_argument("--data", required=True, help="Sudoku data folder (train + valid CSVs)")
    meas.add_argument("--n", type=bench_args.count, default=1000,
                      help="validation puzzles (the paper protocol's seeded draw)")
    meas.add_argument("--n17", type=bench_args.count, default=1000,
                      help="17-given validation puzzles for the default strategy")
    meas.add_argument("--threads", type=bench_args.count, default=1)
    meas.add_argument("--speed-threads", type=bench_args.at_least(0), default=2,
                      help="also time the default strategy with this many threads on 256 puzzles (0: skip)")
    meas.add_argument("--out", type=bench_args.output_file, default=None,
                      help="the result (default: bench/results/sudoku_depth/NAME.json, which `curve` reads)")
    cls = sub.add_parser("classifier", help="a classifier in one fp32 pass to --depth x T on a CIFAR split: top-1 "
                         "at every iteration and the share of images whose energy never rises")
    cls.add_argument("--checkpoint", required=True, help="checkpoint folder or shipped model name")
    cls.add_argument("--data", required=True, help="CIFAR folder")
    cls.add_argument("--split", choices=("test", "val"), default="test", help="val: the held-out 10%% of train")
    cls.add_argument("--depth", type=bench_args.count, default=4, help="the deepest read-out, in T")
    cls.add_argument("--threads", type=bench_args.count, default=1)
    cls.add_argument("--step-control", choices=STEP_CONTROLS, default=None,
                     help="the model's step_control at inference (default: the checkpoint's); backtrack: the energy "
                          "never rises, by construction")
    cls.add_argument("--backtrack-from", type=bench_args.count, default=None,
                     help="the first iteration the control applies to (default: the checkpoint's; T + 1: the "
                          "trained depth runs as trained, the iterations past it cannot raise the energy)")
    cls.add_argument("--out", type=bench_args.output_file, required=True, help="the result JSON")
    sub.add_parser("curve", help="plot every measured checkpoint's one-pass curve -> bench/results/sudoku_depth.png")
    tab = sub.add_parser("table")
    tab.add_argument("--markdown", action="store_true", help="also print the tables as Markdown")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for name, spec in ARMS.items():
            print(f"{name:24s} {spec['family']:9s} {spec['note']}  [{' '.join(spec['set'])}]")
        return
    if args.cmd == "table":
        result = table(RESULTS / "depth_ablation.json")
        if args.markdown:
            print(markdown(result))
        return
    if args.cmd == "curve":
        curve_plot(sorted((RESULTS / "sudoku_depth").glob("*.json")), RESULTS / "sudoku_depth.png")
        return
    if args.cmd == "classifier":
        result = classifier_depth(resolve(args.checkpoint), args.data, args.split, args.depth, args.threads,
                                  args.step_control, args.backtrack_from)
        result.update(device=f"{cpu_model()}, {args.threads} thread(s)",
                      command=bench_args.command_line("depth_ablation", argv))
        atomic_write_json(args.out, result)
        print(json.dumps({k: result[k] for k in ("top1", "energy_never_rises")}), file=sys.stderr)
        return
    if args.cmd == "measure":
        ckpt = resolve(args.checkpoint)
        check_puzzle_counts(args.data, args.n, args.n17, speed=args.speed_threads > 0)
        result = {"name": args.name, "eval": evaluate_arm(ckpt, args.data, args.n, args.n17, args.threads),
                  "device": f"{cpu_model()}, {args.threads} thread(s)"}
        if args.speed_threads:
            result["speed"] = default_speed(ckpt, args.data, args.speed_threads)
        out_json = args.out or RESULTS / "sudoku_depth" / f"{args.name}.json"
        out_json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out_json, result)
        print(json.dumps({**{k: result["eval"][k] for k in ("single_pass", "default_strategy", "auto",
                                                           "energy_monotone_8T")}, "speed": result.get("speed")},
                         indent=1))
        return
    if ARMS[args.arm]["family"] != "classify":
        check_puzzle_counts(args.data, args.n, args.n17)
    out, task = run_arm(args.arm, args.data, args.budget, args.threads)
    plan = json.loads((out / "arm.json").read_text())
    amp = TrainConfig.from_dict(arm_recipe(args.arm)[1]["train"]).amp
    measure = (evaluate_classifier_arm(out, task, args.threads) if plan["family"] == "classify"
               else evaluate_arm(out / "last", args.data, args.n, args.n17, args.threads))
    result = {**plan, "eval": measure,
              "device": f"{cpu_model()}, {args.threads} thread(s); training amp={amp} (native bf16: "
                        f"{'yes' if cpu_has_native_bf16() else 'no'})"}
    out_json = args.out or RESULTS / "depth_ablation" / f"{args.arm}.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_json, result)
    if plan["family"] == "classify":
        print(json.dumps({"arm": args.arm, **measure}, indent=1))
        return
    print(json.dumps({"arm": args.arm, "single_pass": result["eval"]["single_pass"],
                      "default": result["eval"]["default_strategy"],
                      "energy_monotone_8T": result["eval"]["energy_monotone_8T"]}, indent=1))


if __name__ == "__main__":
    main()
