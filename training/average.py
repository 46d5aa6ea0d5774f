"""`hyperset-train average`: the weighted mean of the weights of checkpoints of one model (a weight-space ensemble),
written as a new checkpoint.

Checkpoints that continue one another (a fine-tune and its start, two fine-tunes of one model) usually lie in one
basin of the loss, where the mean of their weights is a model as good as either or better. The checkpoints must
have the same task, weights and shapes; the first one's model settings are kept, except those `--set model.KEY=VALUE`
changes that leave the weights' shapes as they are (the step-length control, say), and config.json records what was
averaged, with which weights, and each one's recipe and steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hyperset.checkpoint import CheckpointError
from hyperset.config import ModelConfig, TableError
from hyperset.models import HyperSETModel, load_checkpoint, save_checkpoint

from .recipes import parse_value

# the first checkpoint's config.json entries kept for the mean: what it is, what it was trained on and how
KEPT_INFO = ("task", "recipe", "train", "data", "objective", "trained_iterations", "solve_iterations",
             "search_iterations")


def model_settings(overrides: list[str]) -> dict[str, Any]:
    """`model.KEY=VALUE` texts as {KEY: value}."""
    out = {}
    for text in overrides:
        key, eq, value = text.partition("=")
        if not eq or not key.startswith("model.") or not key[6:]:
            raise ValueError(f"--set {text!r}: expected model.KEY=VALUE (a model setting of the mean)")
        out[key[6:]] = parse_value(value)
    return out


def average_checkpoints(paths: list[str], weights: list[float] | None = None, device: torch.device | str = "cpu",
                        settings: dict[str, Any] | None = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The first checkpoint's model holding the weighted mean of every checkpoint's weights (equal weights by
    default; computed in float64 on `device`), with `settings` changed in its model config, and the config.json
    entries to save with it."""
    if len(paths) < 2:
        raise ValueError(f"averaging needs at least two checkpoints, got {len(paths)}")
    weights = [1.0] * len(paths) if not weights else list(weights)
    if len(weights) != len(paths):
        raise ValueError(f"{len(weights)} weights for {len(paths)} checkpoints: give one --weight per checkpoint")
    if not all(0 < w < float("inf") for w in weights):
        raise ValueError(f"the weights must be positive finite numbers, got {weights}")
    total = sum(weights)
    models, configs = [], []
    for path in paths:
        model, config = load_checkpoint(path, map_location=device, dtype=torch.float64)
        models.append(model)
        configs.append(config)
    first = models[0]
    states = [m.state_dict() for m in models]
    ref = states[0]
    for path, model, state in zip(paths[1:], models[1:], states[1:]):
        if model.cfg.task != first.cfg.task:
            raise ValueError(f"{path} is a {model.cfg.task} model, {paths[0]} a {first.cfg.task} model")
        if state.keys() != ref.keys() or any(state[k].shape != ref[k].shape for k in ref):
            odd = sorted(set(state) ^ set(ref)) or [k for k in ref if state[k].shape != ref[k].shape]
            raise ValueError(f"{path} does not have the weights of {paths[0]} (differs at {', '.join(odd[:3])})")
    mean = {k: sum(state[k] * (w / total) for state, w in zip(states, weights)) if v.is_floating_point() else v
            for k, v in ref.items()}
    if settings:
        try:
            first = HyperSETModel(ModelConfig.from_dict({**first.cfg.to_dict(), **settings})).double()
        except (TableError, TypeError, ValueError) as e:
            raise ValueError(f"--set model.*: {e}") from None
        if {k: v.shape for k, v in first.state_dict().items()} != {k: v.shape for k, v in ref.items()}:
            raise ValueError(f"--set {', '.join(f'model.{k}' for k in settings)}: the mean's settings may not change "
                             "its weights' shapes")
    first.load_state_dict(mean)
    first = first.float().cpu().eval()
    info = {k: configs[0][k] for k in KEPT_INFO if k in configs[0]}
    info["averaged_from"] = [{"checkpoint": str(p), "weight": w / total, "recipe": c.get("recipe"),
                              "steps": c.get("steps")} for p, w, c in zip(paths, weights, configs)]
    return first, info


def average(paths: list[str], out: Path, weights: list[float] | None = None, device: torch.device | str = "cpu",
            settings: dict[str, Any] | None = None) -> tuple[Path, dict[str, Any]]:
    """Write the mean of `paths` (weighted) to `out`, a new or empty folder; the folder and its config.json
    entries."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"{out} already holds files: write the mean to a new folder")
    model, info = average_checkpoints(paths, weights, device, settings)
    return save_checkpoint(out, model, info), info
