"""Training state on disk without pickle: weights and optimizer moments in safetensors, the rest in JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from hyperset.checkpoint import (
    CheckpointError,
    atomic_write_json,
    load_tensors,
    load_weights_into,
    read_config,
    save_checkpoint,
    save_tensors,
)


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
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], plain: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, values in plain.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(values)
    opt.load_state_dict({"state": state, "param_groups": plain["param_groups"]})


def _sibling(directory: Path, suffix: str) -> Path:
    return directory.with_name(f"{directory.name}.{suffix}")


def save_training_state(directory: Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
                        progress: dict[str, Any], info: dict[str, Any], save_model: Any = None) -> None:
    """directory/ holds model.safetensors + config.json (a loadable checkpoint), optimizer.safetensors and
    trainer.json (step, best metric, RNG). trainer.json is written last: it marks a complete state. The state is
    written into DIR.tmp, which then takes the place of DIR (the previous state waits in DIR.old meanwhile), so
    a kill at any moment leaves one complete state, never the files of two (see recover_training_state)."""
    directory = Path(directory)
    tmp, old = _sibling(directory, "tmp"), _sibling(directory, "old")
    shutil.rmtree(tmp, ignore_errors=True)
    (save_model or save_checkpoint)(tmp, model, info)
    opt_t, opt_plain = optimizer_tensors(opt)
    opt_t["rng.torch"] = torch.get_rng_state()
    save_tensors(tmp / "optimizer.safetensors", opt_t)
    atomic_write_json(tmp / "trainer.json", {**progress, "optimizer": opt_plain})
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(directory, old)
    os.replace(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)


def recover_training_state(directory: Path) -> None:
    """After a kill between the two renames of save_training_state, put the previous state back in place."""
    directory = Path(directory)
    old = _sibling(directory, "old")
    if not (directory / "trainer.json").is_file() and (old / "trainer.json").is_file():
        shutil.rmtree(directory, ignore_errors=True)
        os.replace(old, directory)


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


def load_training_state(directory: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / "trainer.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no trainer.json (expected a training state written by hyperset-train)")
    progress = json.loads(path.read_text())
    meta = read_config(directory)
    # the step budget the state was trained towards (its lr schedule), for runs resumed with another --steps
    progress.setdefault("saved_steps", (meta.get("train") or {}).get("steps"))
    current = model.cfg.to_dict() if hasattr(model.cfg, "to_dict") else dataclasses.asdict(model.cfg)
    if meta["model"] != current:
        diff = sorted(k for k in meta["model"] if meta["model"].get(k) != current.get(k))
        raise CheckpointError(f"{directory}: the saved model config differs from this run's in: {', '.join(diff)}")
    load_weights_into(model, directory, "model weights")
    opt_t = load_tensors(directory / "optimizer.safetensors", "optimizer state")
    rng = opt_t.pop("rng.torch", None)
    device = next(model.parameters()).device
    load_optimizer(opt, {k: v.to(device) for k, v in opt_t.items()}, progress.pop("optimizer"))
    if rng is not None:
        torch.set_rng_state(rng)
    return progress
