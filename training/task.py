"""The contract between a task (Sudoku, classification, the two MIM stages) and the shared trainer.

A task subclasses ``Task``: it must say what it trains (``model_config``), how big its training set is
(``train_size``), what a batch is (``batch``), the loss and the evaluation. The optional hooks have defaults here:
the module built from the config (``build_model``), the order of examples (``batch_indices``), the weight of a
micro-batch (``loss_weight``), how a checkpoint is written (``save``) and what the run records about the data
(``describe``). The trainer calls every hook directly; it never looks one up.
"""

from __future__ import annotations

import abc
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyperset.config import MAX_ITERS
from hyperset.models import HyperSETModel, save_checkpoint

from .epochs import epoch_indices

Batch = dict[str, torch.Tensor]


class Task(abc.ABC):
    """What the trainer needs from a task.

    Attributes: ``name`` (recorded in checkpoints; a resume must match it) and ``select_metric`` (a key of
    ``evaluate``'s result, higher is better: the best checkpoint is chosen on it).
    """

    name: str
    select_metric: str

    # ------------------------------------------------------------------ required

    @abc.abstractmethod
    def model_config(self) -> Any:
        """The config of the trained module (a ModelConfig, or the VQ tokenizer's VQConfig)."""

    @abc.abstractmethod
    def train_size(self) -> int:
        """How many training examples ``batch_indices`` draws from."""

    @abc.abstractmethod
    def batch(self, step: int, batch_size: int, seed: int, device: torch.device) -> Batch:
        """The global batch of optimizer step ``step``: a pure function of (seed, step), so that a resumed run
        replays it. Every tensor's first dimension is the example (the trainer splits batches along it)."""

    @abc.abstractmethod
    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor | float]]:
        """(the loss to minimise, logged values): mean over the batch's supervised units. Logged values stay
        tensors on the device (detached): the trainer averages them and reads them only at logging intervals."""

    @abc.abstractmethod
    def evaluate(self, model: torch.nn.Module, device: torch.device, autocast: Any) -> dict[str, float]:
        """Validation metrics, ``select_metric`` among them (``autocast()`` gives the run's mixed precision)."""

    # ------------------------------------------------------------------ optional, with defaults

    def build_model(self) -> torch.nn.Module:
        """The module to train (default: a HyperSETModel of ``model_config``)."""
        return HyperSETModel(self.model_config())

    def batch_indices(self, step: int, batch_size: int, seed: int) -> np.ndarray:
        """The training examples of step ``step`` (default: seeded epoch permutations, ``epoch_indices``)."""
        return epoch_indices(step, batch_size, self.train_size(), seed)

    def loss_weight(self, batch: Batch) -> torch.Tensor | float:
        """How many supervised units a (micro-)batch holds (default: its rows). Micro-batches are weighted by it,
        so that accumulation and processes add up to the mean over the global batch."""
        return float(len(next(iter(batch.values()))))

    def save(self, directory: Path, model: torch.nn.Module, info: dict[str, Any]) -> None:
        """Write a loadable checkpoint of ``model`` into ``directory`` (default: a Hyper-SET checkpoint)."""
        save_checkpoint(directory, model, info)

    def describe(self) -> dict[str, Any]:
        """What the run records about its data and objective (config.json "data")."""
        return {}


# ---------------------------------------------------------------------- depths drawn per step


def check_depth_range(key: str, value: Any, lo_min: int = 1) -> None:
    """Raise a ValueError naming ``objective.KEY`` unless ``value`` is empty (off) or [lo, hi], whole numbers with
    lo_min <= lo <= hi."""
    if value and not (isinstance(value, (list, tuple)) and len(value) == 2
                      and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
                      and lo_min <= value[0] <= value[1]):
        raise ValueError(f"objective.{key} must be [lo, hi] with {lo_min} <= lo <= hi, got {value}")


def draw_depth(rng: np.random.Generator, value: list[int], default: int) -> int:
    """An iteration count drawn uniformly from [lo, hi] = ``value``, or ``default`` where ``value`` is empty."""
    return int(rng.integers(value[0], value[1] + 1)) if value else default


# ---------------------------------------------------------------------- deep supervision over detached segments


def check_eval_iters(values: Any) -> None:
    """Raise a ValueError naming ``objective.eval_iters`` unless it holds iteration counts in [1, MAX_ITERS]."""
    if any(isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= MAX_ITERS for i in values):
        raise ValueError(f"objective.eval_iters must hold iteration counts in [1, {MAX_ITERS}], got {values}")


def check_segments(segments: Any, weights: Any) -> None:
    """Raise a ValueError naming the objective key unless ``segments`` is a whole number >= 1 and ``weights`` is
    empty or one finite weight >= 0 per segment, not all zero."""
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"objective.segments must be a whole number >= 1, got {segments!r}")
    if weights and (not isinstance(weights, (list, tuple)) or len(weights) != segments
                    or any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in weights)
                    or any(not (math.isfinite(w) and w >= 0) for w in weights) or sum(weights) <= 0):
        raise ValueError(f"objective.segment_weights must hold one finite weight >= 0 per segment "
                         f"({segments}), not all zero; got {weights}")


def segment_outputs(model: torch.nn.Module, inputs: torch.Tensor, iters: int, segments: int,
                    energies: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The model's outputs after each of ``segments`` segments of ``iters`` iterations, (segments, ...): one pass
    of segments x iters iterations whose state is carried on detached between segments (deep supervision at
    constant memory: the gradient of a segment's loss reaches back to the start of that segment only). With
    ``energies``, also E_ATTN + E_FF after every iteration of the pass, with its gradient, (segments x iters, B)."""
    out = model(inputs, iters=iters * segments, all_logits=True, detach_every=iters if segments > 1 else 0,
                energies=energies)
    if energies:
        every, energy = out
        return every[iters - 1:: iters], energy
    return out[iters - 1:: iters]


# a rise of E_ATTN + E_FF by more than this share of its size counts (as the benchmarks count it)
RISE_RTOL = 1e-5


def check_nonnegative(section: str, key: str, value: Any) -> None:
    """A recipe number that is finite and >= 0, else a ValueError naming ``section.key``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{section}.{key} must be a finite number >= 0, got {value!r}")


def energy_rise(energy: torch.Tensor) -> torch.Tensor:
    """How far E_ATTN + E_FF rises from one iteration to the next, (T, B) -> scalar: the mean over iterations
    2..T and samples of max(0, (E_t - E_{t-1}) / |E_{t-1}| + RISE_RTOL), E_{t-1} held constant (the penalty moves
    the later state down, never the earlier one up). Zero exactly where every sample's energy falls by more than
    the share a benchmark counts as a rise, at every iteration."""
    if len(energy) < 2:
        return energy.new_zeros(())
    before = energy[:-1].detach().float()
    return torch.relu((energy[1:].float() - before) / before.abs().clamp_min(1e-6) + RISE_RTOL).mean()


def segment_mean(losses: torch.Tensor, weights: list[float] | None = None) -> torch.Tensor:
    """The segments' losses averaged, equally or by ``weights`` (one per segment)."""
    if not weights:
        return losses.mean()
    w = torch.tensor(weights, dtype=losses.dtype, device=losses.device)
    return (losses * w).sum() / w.sum()
