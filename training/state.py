"""Training state on disk without pickle: weights and optimizer moments in safetensors, the rest in JSON."""

from __future__ import annotations

import dataclasses
import json
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


def save_training_state(directory: Path, model: torch.nn.Module, opt: torch.optim.Optimizer,
                        progress: dict[str, Any], info: dict[str, Any], save_model: Any = None) -> None:
    """directory/ holds model.safetensors + config.json (a loadable checkpoint), optimizer.safetensors and
    trainer.json (step, best metric, RNG). trainer.json is written last: it marks a complete state."""
    directory = Path(directory)
    (save_model or save_checkpoint)(directory, model, info)
    opt_t, opt_plain = optimizer_tensors(opt)
    opt_t["rng.torch"] = torch.get_rng_state()
    save_tensors(directory / "optimizer.safetensors", opt_t)
    atomic_write_json(directory / "trainer.json", {**progress, "optimizer": opt_plain})


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
