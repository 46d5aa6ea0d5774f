"""Training state on disk without pickle: weights and optimizer moments in safetensors, the rest in JSON."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from hyperset.checkpoint import (
    CheckpointError,
    atomic_write_json,
    load_tensors,
    load_weights_into,
    read_config,
    read_json_file,
    save_tensors,
)
from hyperset.models import save_checkpoint


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer state_dict into tensors (for safetensors) and plain data (for JSON)."""
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"state.{idx}.{key}"] = value
            else:
                scalars.setdefault(str(idx), {})[key] = value
    # which parameters have a state (those that had a gradient), so that a file missing one is not taken for a
    # parameter that never had one
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars, "with_state": sorted(sd["state"])}


def load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> None:
    """Load a state written by `optimizer_tensors` into `opt`, after checking that it fits (a ValueError naming
    what does not): tensor names, one tensor per parameter of its shape and a floating dtype, the same keys for
    every parameter, and param_groups with the keys and parameter counts of `opt`'s (torch's own
    load_state_dict takes a moment of the wrong shape and fails at the next step)."""
    params = [p for group in opt.param_groups for p in group["params"]]
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        head, _, rest = name.partition(".")
        idx, _, key = rest.partition(".")
        if head != "state" or not idx.isdigit() or not key:
            raise ValueError(f"tensor {name!r} is not an optimizer state entry (state.INDEX.KEY)")
        if int(idx) >= len(params):
            raise ValueError(f"tensor {name!r}: this run's optimizer has {len(params)} parameters")
        want = () if key == "step" else tuple(params[int(idx)].shape)  # AdamW's step count is a 0-d tensor
        if tuple(value.shape) != want or not value.is_floating_point():
            raise ValueError(f"tensor {name!r} is {str(value.dtype).removeprefix('torch.')} {tuple(value.shape)}, "
                             + ("expected a float scalar (a step count)" if key == "step" else
                                f"its parameter {tuple(params[int(idx)].shape)}"))
        state.setdefault(int(idx), {})[key] = value
    with_state = plain.get("with_state")
    present = set(state) | {int(i) for i in plain.get("scalars", {})}
    if isinstance(with_state, list) and present != set(with_state):
        lost = sorted(set(with_state) - present)
        raise ValueError(f"the states of parameters {lost[:5]} are missing (trainer.json lists {len(with_state)} "
                         f"parameters with a state, the file holds {len(present)})" if lost else
                         f"the file holds states of parameters trainer.json does not list "
                         f"({sorted(present - set(with_state))[:5]})")
    keys = {frozenset(values) for values in state.values()}
    if len(keys) > 1:
        raise ValueError(f"the parameters' states hold different entries ({' vs '.join(sorted(map(str, keys)))})")
    groups = plain.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(opt.param_groups):
        raise ValueError(f"param_groups: expected {len(opt.param_groups)} groups")
    for saved, mine in zip(groups, opt.param_groups):
        missing = sorted(set(mine) - {"params"} - set(saved)) if isinstance(saved, dict) else ["all"]
        if missing or len(saved.get("params", ())) != len(mine["params"]):
            raise ValueError(f"param_groups: a group lacks {', '.join(missing)}" if missing else
                             f"param_groups: a group of {len(saved.get('params', ()))} parameters, this run's has "
                             f"{len(mine['params'])}")
        for key in sorted(set(mine) - {"params"}):
            if not _fits(saved[key], mine[key]):
                raise ValueError(f"param_groups: {key} = {saved[key]!r} is not a value of its kind (this run's: "
                                 f"{mine[key]!r})")
    for idx, values in plain.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(values)
    opt.load_state_dict({"state": state, "param_groups": plain["param_groups"]})


def _fits(saved: Any, mine: Any) -> bool:
    """Whether a saved optimizer setting (read from trainer.json) is a value of the kind of this run's: a finite
    number for a number, a flag (or None) for a flag or None, a list of as many for a tuple (AdamW's betas)."""
    if mine is None or isinstance(mine, bool):
        return saved is None or isinstance(saved, bool)
    if isinstance(mine, (int, float)):
        return isinstance(saved, (int, float)) and not isinstance(saved, bool) and math.isfinite(saved)
    if isinstance(mine, (tuple, list)):
        return (isinstance(saved, (tuple, list)) and len(saved) == len(mine)
                and all(_fits(s, m) for s, m in zip(saved, mine)))
    if isinstance(mine, str):
        return isinstance(saved, str)
    return True  # a tensor learning rate and the like: torch checks it


def _sibling(directory: Path, suffix: str) -> Path:
    return directory.with_name(f"{directory.name}.{suffix}")


def replace_folder(directory: Path, write: Callable[[Path], None]) -> None:
    """Write a folder as one unit: `write` fills DIR.tmp, which then takes the place of DIR (the previous DIR waits
    in DIR.old meanwhile), so a kill at any moment leaves one complete folder, never the files of two (see
    recover_folder). A folder named DIR exists only once it is complete."""
    directory = Path(directory)
    tmp, old = _sibling(directory, "tmp"), _sibling(directory, "old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
    except BaseException:  # a full disk, a write error: the half-written DIR.tmp must not take the space meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)


def recover_folder(directory: Path) -> None:
    """After a kill inside replace_folder: the previous folder goes back in place if the new one had not taken it
    yet, and the leftovers (a half-written DIR.tmp, DIR.old) are removed."""
    directory = Path(directory)
    tmp, old = _sibling(directory, "tmp"), _sibling(directory, "old")
    if not directory.exists() and old.exists():
        os.replace(old, directory)
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover)


def save_training_state(directory: Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
                        progress: dict[str, Any], info: dict[str, Any], save_model: Any = None) -> None:
    """directory/ holds model.safetensors + config.json (a loadable checkpoint), optimizer.safetensors and
    trainer.json (step, best metric, RNG), written as one unit (replace_folder)."""

    def write(folder: Path) -> None:
        (save_model or save_checkpoint)(folder, model, info)
        opt_t, opt_plain = optimizer_tensors(opt)
        opt_t["rng.torch"] = torch.get_rng_state()
        device = next(model.parameters()).device
        if device.type == "cuda":  # dropout on a GPU draws from the device's generator
            opt_t["rng.cuda"] = torch.cuda.get_rng_state(device)
        save_tensors(folder / "optimizer.safetensors", opt_t)
        atomic_write_json(folder / "trainer.json", {**progress, "optimizer": opt_plain})

    replace_folder(directory, write)


class RunLocked(ValueError):
    """Another live trainer holds the run folder."""


@contextlib.contextmanager
def run_lock(directory: Path) -> Iterator[None]:
    """Hold DIR/.lock while training into DIR: a second trainer on the folder gets RunLocked. The lock is an flock,
    which the kernel drops when its process ends, so a crashed or killed trainer never leaves the folder locked
    (the file stays, with the pid of its last holder). Where the OS has no flock (Windows), nothing is locked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(Path(directory) / ".lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise RunLocked(f"{directory} is in use by another trainer (pid {holder}); wait for it to end or "
                            "choose another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def check_run(directory: Path, task: str, recipe: str) -> None:
    """Refuse to resume a state written by another task or recipe (its weights would not fit, or mean another
    experiment)."""
    meta = read_config(directory)
    found = {"task": meta.get("task"), "recipe": meta.get("recipe")}
    for key, want in (("task", task), ("recipe", recipe)):
        if found[key] and want and found[key] != want:
            raise CheckpointError(f"{directory} holds a {found['task']!r} run of recipe {found['recipe']!r}, not a "
                                  f"{task!r} run of recipe {recipe!r}; resume it with that recipe or choose "
                                  "another --out")


# trainer.json: the keys a resume needs, and the JSON types of those it reads
PROGRESS_REQUIRED = ("step", "optimizer")
PROGRESS_TYPES: dict[str, Any] = {"step": int, "optimizer": dict, "best": (int, float), "best_metrics": dict,
                                  "elapsed": (int, float), "schedule": list, "saved_steps": (int, type(None)),
                                  "command": dict, "pending": dict}


def read_progress(directory: Path) -> dict[str, Any]:
    """trainer.json of a training state, checked: a one-line CheckpointError naming the file and what is wrong."""
    path = Path(directory) / "trainer.json"
    expected = "expected a training state written by hyperset-train"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no trainer.json ({expected})")
    progress = read_json_file(path, "a training state written by hyperset-train")
    if not isinstance(progress, dict):
        raise CheckpointError(f"{path}: not a JSON object; {expected}")
    missing = [k for k in PROGRESS_REQUIRED if k not in progress]
    if missing:
        raise CheckpointError(f"{path}: missing {', '.join(missing)}; {expected}")
    for key, kind in PROGRESS_TYPES.items():
        if key in progress and (not isinstance(progress[key], kind) or isinstance(progress[key], bool)):
            raise CheckpointError(f"{path}: {key} = {progress[key]!r} has the wrong type; {expected}")
    if progress["step"] < 0:
        raise CheckpointError(f"{path}: step = {progress['step']}: must be >= 0; {expected}")
    if not isinstance(progress["optimizer"].get("param_groups"), list):
        raise CheckpointError(f"{path}: optimizer has no param_groups list; {expected}")
    return progress


# trainer.json's "command": the command-line settings a run was started with, and their types
COMMAND_TYPES: dict[str, Any] = {"set": list, "steps": int, "accum_steps": int, "preset": str, "dataset": str,
                                 "threads": int, "schedule": str, "recipe": str, "data": str}


def recorded_command(directory: Path) -> dict[str, Any]:
    """The command-line settings kept in DIR/trainer.json (empty when there is no readable state, or it was
    written before they were kept); a CheckpointError naming the file when they are malformed."""
    try:
        progress = read_progress(directory)
    except CheckpointError:
        return {}  # no state, or a broken one: the resume itself reports it
    command = progress.get("command") or {}
    where = Path(directory) / "trainer.json"
    for key, value in command.items():
        kind = COMMAND_TYPES.get(key)
        if kind is None or (value is not None and (not isinstance(value, kind) or isinstance(value, bool))) or (
                key == "set" and not all(isinstance(v, str) for v in value)):
            raise CheckpointError(f"{where}: command.{key} = {value!r} is not a setting hyperset-train keeps")
    return {k: v for k, v in command.items() if v is not None}


def model_config_diff(saved: dict[str, Any], cfg: Any) -> list[str]:
    """The fields in which a saved model config (a checkpoint's config.json "model") and `cfg` differ.

    A field the saved config lacks (it was written before the field existed) reads as the field's default, as
    the checkpoint loader reads it, so a run saved by an older version resumes unless the run now asks for
    something else there."""
    current = cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
    defaults = {f.name: f.default for f in dataclasses.fields(cfg) if f.default is not dataclasses.MISSING}
    missing = object()
    filled = {**{k: defaults.get(k, missing) for k in current}, **saved}
    return sorted(k for k in set(filled) | set(current) if filled.get(k, missing) != current.get(k, missing))


def load_training_state(directory: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    directory = Path(directory)
    progress = read_progress(directory)
    meta = read_config(directory)
    # the step budget the state was trained towards (its lr schedule), for runs resumed with another --steps
    progress.setdefault("saved_steps", (meta.get("train") or {}).get("steps"))
    diff = model_config_diff(meta["model"], model.cfg)
    if diff:
        raise CheckpointError(f"{directory}: the saved model config differs from this run's in: {', '.join(diff)}")
    load_weights_into(model, directory, "model weights")
    opt_t = load_tensors(directory / "optimizer.safetensors", "optimizer state")
    rng = opt_t.pop("rng.torch", None)
    rng_cuda = opt_t.pop("rng.cuda", None)
    device = next(model.parameters()).device
    try:
        load_optimizer(opt, {k: v.to(device) for k, v in opt_t.items()}, progress.pop("optimizer"))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{directory}: the optimizer state does not fit this run's optimizer ({e})") from None
    states = [("rng.torch", rng, torch.get_rng_state, torch.set_rng_state)]
    if rng_cuda is not None and device.type == "cuda":  # a run saved on a GPU and resumed on one
        states.append(("rng.cuda", rng_cuda, lambda: torch.cuda.get_rng_state(device),
                       lambda state: torch.cuda.set_rng_state(state, device)))
    for name, state, get, put in states:
        if state is None:
            continue
        expected = get()
        if state.dtype != expected.dtype or state.shape != expected.shape:
            raise CheckpointError(f"{directory / 'optimizer.safetensors'}: {name} is "
                                  f"{str(state.dtype).removeprefix('torch.')} {tuple(state.shape)}, a random state is "
                                  f"{str(expected.dtype).removeprefix('torch.')} {tuple(expected.shape)}")
        put(state)
    return progress
