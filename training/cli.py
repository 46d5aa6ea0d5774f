"""`hyperset-train TASK --recipe NAME --data DIR --out DIR [--resume]`."""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from hyperset.cli_options import (
    OneLineGroup,
    device_option,
    error_line,
    stdout_to_devnull,
    threads_option,
    version_option,
)
from hyperset.config import ModelConfig, TableError, check_table, preset_config
from hyperset.download import DownloadError
from hyperset.extras import MissingExtra, require
from hyperset.sudoku.extreme import NAME as SUDOKU_EXTREME

from .recipes import apply_overrides, check_recipe, load_recipe, locate, recipe_names


def model_config(recipe: dict[str, Any]) -> ModelConfig:
    """The recipe's preset with its [model] overrides; unknown presets, keys and mistyped values are ValueErrors."""
    if "preset" not in recipe:
        raise ValueError("the recipe names no model preset (preset = \"...\"; see hyperset.list_presets())")
    overrides = recipe.get("model", {})
    check_table(ModelConfig, overrides, "model")
    try:
        return preset_config(recipe["preset"], **overrides)
    except KeyError as e:
        raise ValueError(e.args[0]) from None


def build_sudoku_task(model_cfg: ModelConfig, recipe: dict[str, Any], data_dir: str) -> Any:
    from .sudoku_task import SudokuData, SudokuTask

    if model_cfg.task != "sudoku":
        raise ValueError(f"preset {recipe['preset']!r} is a {model_cfg.task!r} model, not a sudoku model")
    data_table, objective = recipe.get("data", {}), recipe.get("objective", {})
    check_table(SudokuData, data_table, "data", [f.name for f in fields(SudokuData) if f.name != "data_dir"])
    check_table(SudokuTask, objective, "objective", ("supervise", "constraint_weight", "eval_iters", "eval_batch",
                                                       "train_iters", "segments", "skip_iters", "select_iters"))
    return SudokuTask(model=model_cfg, data=SudokuData(data_dir=data_dir, **data_table), **objective)


def fetch_data(task: str, recipe: dict[str, Any], data: str) -> None:
    """--download: put the task's public dataset into --data unless it is already there (checksum verified), or
    Sudoku-Extreme into the cache (format verified)."""
    if not data:
        raise ValueError("--download needs --data DIR (the folder to put the data in)")
    if task == "sudoku":
        from hyperset.sudoku import extreme
        from hyperset.sudoku.data import download_rrn

        if data == SUDOKU_EXTREME:
            extreme.cached_split("train", download=True)
        else:
            download_rrn(data)
        return
    dataset = recipe.get("data", {}).get("dataset", "cifar10")
    if dataset not in ("cifar10", "cifar100"):
        raise ValueError(f"--download fetches the Sudoku data and CIFAR-10/100, not {dataset}: get ImageNet from "
                         "image-net.org (its terms) and pass DIR with train/<wnid>/ and val/<wnid>/ folders")
    from hyperset.vision.data import download_cifar

    download_cifar(dataset, data)


def build_task(task: str, recipe: dict[str, Any], data_dir: str) -> Any:
    model_cfg = model_config(recipe)
    if task == "sudoku":
        return build_sudoku_task(model_cfg, recipe, data_dir)
    if task in ("classify", "mim"):
        require("train", "PIL", what=f"hyperset-train {task}")
    if task == "classify":
        from .classify_task import build_classify_task

        return build_classify_task(model_cfg, recipe, data_dir)
    if task == "mim":
        from .mim_task import build_mim_task

        return build_mim_task(model_cfg, recipe, data_dir)
    raise click.UsageError(f"unknown task {task!r}")


def _run(task: str, recipe_name: str | None, data: str, out: str, resume: bool, device: str, overrides: tuple[str, ...],
         steps: int | None, as_json: bool, quiet: bool, preset: str | None = None, dataset: str | None = None,
         accum_steps: int | None = None, schedule: str | None = None, download: bool = False,
         init_from: str | None = None, threads: int | None = None) -> None:
    # here, not at the top: --help and --version need none of them (torch takes seconds to import)
    import torch

    from hyperset.checkpoint import CheckpointError
    from hyperset.device import pick_device

    from .trainer import DivergedError, TrainConfig, Trainer, parse_schedule

    try:
        for option, value in (("--preset", preset), ("--schedule", schedule), ("--init-from", init_from)):
            if value is not None and not value.strip():
                raise ValueError(f"{option}: an empty value (leave the option out for the recipe's)")
        recipe_file = Path(recipe_name) if recipe_name and recipe_name.endswith(".toml") else None
        given = {"set": list(overrides), "steps": steps, "accum_steps": accum_steps, "preset": preset,
                 "dataset": dataset, "threads": threads, "schedule": schedule,
                 "recipe": str(recipe_file.resolve()) if recipe_file and recipe_file.is_file() else recipe_name,
                 "data": data if data == SUDOKU_EXTREME else str(Path(data).resolve()) if data else None}
        command = resume_command(Path(out), given, quiet or as_json) if resume else given
        overrides, steps, accum_steps = tuple(command["set"]), command["steps"], command["accum_steps"]
        preset, dataset, threads = command["preset"], command["dataset"], command["threads"]
        schedule = command["schedule"]
        data = command["data"] or ""
        if command["recipe"] is None:
            raise click.UsageError("Missing option '--recipe'" + (
                f" ({out}/last records none: the run was started by an older version)" if resume else ""))
        recipe_name = command["recipe"]
        name, recipe = load_recipe(recipe_name)
        if threads is not None:  # --threads N is --set train.threads=N (an explicit --set still wins)
            overrides = (f"train.threads={threads}", *overrides)
        check_recipe(recipe, task)
        recipe = apply_overrides(recipe, list(overrides))
        check_recipe(recipe, task)
        if preset:
            recipe["preset"] = preset
        if dataset:
            recipe.setdefault("data", {})["dataset"] = dataset
        if recipe.get("task", task) != task:
            raise ValueError(f"recipe {name} is for task {recipe['task']!r}, not {task!r}")
        pick_device(device)  # a bad --device fails before the data is loaded
        if download:
            fetch_data(task, recipe, data)
        built = build_task(task, recipe, data)  # may rewrite recipe["train"] (epochs -> steps)
        train = TrainConfig.from_dict(recipe.get("train", {}))
        if steps is not None:
            train.steps = steps
        if accum_steps is not None:
            train.accum_steps = accum_steps
        plan = parse_schedule(schedule) if schedule else None
        if plan and steps is not None and steps != plan[-1]["steps"]:
            raise ValueError(f"--steps {steps} contradicts --schedule, which ends at step {plan[-1]['steps']}")
        trainer = Trainer(built, train, Path(out), device=device, resume=resume, recipe_name=name,
                          quiet=quiet or as_json, plan=plan, init_from=init_from,
                          command={k: v for k, v in command.items() if v not in (None, [])})
        result = trainer.fit()
    except TableError as e:  # a recipe key: FILE:LINE where the recipe file sets it
        click.echo(error_line("hyperset-train", locate(e, recipe_name, overrides)), err=True)
        sys.exit(2)
    except (ValueError, CheckpointError, DownloadError, DivergedError, OSError, MissingExtra) as e:
        click.echo(error_line("hyperset-train", e), err=True)
        sys.exit(2)
    except (MemoryError, torch.cuda.OutOfMemoryError) as e:
        reason = (str(e) or type(e).__name__).splitlines()[0]
        click.echo(f"hyperset-train: error: out of memory ({reason}); lower train.batch_size or raise --accum-steps",
                   err=True)
        sys.exit(2)
    if result.get("rank", 0):  # under torchrun the main process reports the run, once
        return
    best = "" if result["best"] is None else f"best {result['best']:.4f}; best checkpoint in {out}/best"
    try:
        if as_json:
            click.echo(json.dumps(result))
        elif result["finished"]:
            click.echo(f"done: step {result['step']}" + (f", {best}" if best else ""))
        else:
            so_far = f"; {best.replace('best checkpoint', 'best checkpoint so far')}" if best else ""
            click.echo(f"stopped ({result['stopped_by']}) at step {result['step']} of {result['steps']}: the state is "
                       f"in {out}/last, continue with --resume{so_far}")
    except OSError:  # stdout gone (a `| tee` the Ctrl-C also ended): the state is saved; the exit code still says how
        stdout_to_devnull()
    if not result["finished"]:  # stopped by a signal: the shell's convention, 128 + its number (SIGINT: 130)
        by = result["stopped_by"]
        sys.exit(128 + (signal.Signals[by].value if by in signal.Signals.__members__ else signal.SIGTERM.value))


def resume_command(out: Path, given: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """The settings a resumed run goes on with: those it was started with (kept in OUT/last/trainer.json), with
    what this command gives on top (its --set after the recorded ones, its --steps / --accum-steps / --preset /
    --dataset / --threads / --schedule / --recipe / --data instead of theirs). `--resume` alone therefore continues
    the run as it was started."""
    from .state import recorded_command

    recorded = recorded_command(out / "last")
    sets = [*recorded.get("set", []), *given["set"]]
    # a value given again is kept once, where it was given last (the order decides which of two values wins)
    command = {**given, "set": [v for i, v in enumerate(sets) if v not in sets[i + 1:]]}
    single = ("steps", "accum_steps", "preset", "dataset", "threads", "schedule", "recipe", "data")
    for key in single:
        if command[key] is None:
            command[key] = recorded.get(key)
    kept = [f"--set {v}" for v in recorded.get("set", [])] + [
        f"--{k.replace('_', '-')} {recorded[k]}" for k in single if k in recorded and given[k] is None]
    if kept and not quiet:
        click.echo(f"resuming with the run's own settings: {' '.join(kept)}")
    return command


def _options(f: Any) -> Any:
    options = [
        click.option("--recipe", "recipe_name", default=None,
                     help=f"recipe name or .toml path (shipped: {', '.join(recipe_names())}) [required; with "
                          "--resume: the run's own]"),
        click.option("--data", default="",
                     help="data folder, or sudoku-extreme (the Hugging Face dataset, kept in the cache: trains on "
                          "its train.csv less the validation puzzles held out of it) [with --resume: the run's own]"),
        click.option("--download", is_flag=True,
                     help="fetch the data into --data first if it is not there (Sudoku RRN, CIFAR-10/100; "
                          "checksum verified), or sudoku-extreme into the cache (format verified)"),
        click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="run folder"),
        click.option("--resume", is_flag=True, help="continue the run in --out from its last saved state"),
        device_option(),
        threads_option(help="PyTorch CPU threads (the same as --set train.threads=N) [default: the recipe's]"),
        click.option("--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
                     help="override a recipe value, e.g. --set train.lr=1e-3 --set model.iters=32"),
        click.option("--steps", type=click.IntRange(min=1), default=None,
                     help="override the number of optimizer steps"),
        click.option("--accum-steps", type=click.IntRange(min=1), default=None,
                     help="gradient accumulation: split the global batch into this many micro-steps"),
        click.option("--schedule", default=None, metavar="FROM:STEPS,...|RUN",
                     help="planned lr schedule: from step FROM a cosine over STEPS steps (e.g. "
                          "0:30000,13166:22000,14000:15500), or a run folder / JSON file whose recorded schedule "
                          "to replay (the same budget as another run); ends at the last STEPS"),
        click.option("--init-from", default=None, metavar="CHECKPOINT",
                     help="start a new run from this checkpoint's weights (same model shapes): a fine-tune"),
        click.option("--preset", default=None, help="override the recipe's model preset (see hyperset.list_presets())"),
        click.option("--json", "as_json", is_flag=True, help="print the result as JSON"),
        click.option("--quiet", "-q", is_flag=True, help="no progress bar"),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@version_option("hyperset-train")
def main() -> None:
    """Train Hyper-SET models (and the baselines) with the shared-core trainer."""


@main.command()
@_options
def sudoku(**kw: Any) -> None:
    """Sudoku (RRN sudoku-hard format data)."""
    _run("sudoku", **kw)


@main.command()
@_options
@click.option("--dataset", type=click.Choice(["cifar10", "cifar100", "imagenet100"]), default=None,
              help="override the recipe's dataset")
def classify(**kw: Any) -> None:
    """Image classification: CIFAR-10/100 (python layout) or ImageNet-100 (ImageFolder)."""
    _run("classify", **kw)


@main.command()
@_options
def mim(**kw: Any) -> None:
    """Masked image modeling on VQ tokens (tokenizer and token model recipes)."""
    _run("mim", **kw)


@main.command()
@click.argument("checkpoints", nargs=-1, required=True)
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="new checkpoint folder")
@click.option("--weight", "-w", "weights", multiple=True, type=click.FloatRange(min=0, min_open=True),
              help="one per checkpoint, in order (default: equal)")
@click.option("--set", "overrides", multiple=True, metavar="model.KEY=VALUE",
              help="a model setting of the mean that keeps its weights' shapes (e.g. model.step_control=backtrack)")
@device_option(help="where the mean is computed: auto | cpu | cuda | cuda:N | mps")
@threads_option()
@click.option("--json", "as_json", is_flag=True, help="print the new checkpoint and what it averaged as JSON")
def average(checkpoints: tuple[str, ...], out: str, weights: tuple[float, ...], overrides: tuple[str, ...],
            device: str, threads: int | None, as_json: bool) -> None:
    """The mean of checkpoints' weights (same model, e.g. a fine-tune and its start) as a new checkpoint."""
    from hyperset.checkpoint import CheckpointError
    from hyperset.device import pick_device, set_cpu_threads

    from .average import average as write_average
    from .average import model_settings

    try:
        set_cpu_threads(threads)
        folder, info = write_average(list(checkpoints), Path(out), list(weights) or None, pick_device(device),
                                     model_settings(list(overrides)))
    except (ValueError, CheckpointError, OSError) as e:
        click.echo(error_line("hyperset-train", e), err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps({"out": str(folder), "averaged_from": info["averaged_from"]}))
    else:
        click.echo(f"{folder}: the mean of {len(checkpoints)} checkpoints")


if __name__ == "__main__":
    main()
