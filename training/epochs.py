"""The order of training examples and the length of a run in epochs, shared by every task.

* ``epoch_indices(step, batch_size, n, seed)``: the example indices of optimizer step ``step``. The examples are
  visited in seeded per-epoch permutations laid end to end (epoch e is ``default_rng([seed, e]).permutation(n)``),
  and step s takes the next ``batch_size`` of them: a batch may straddle two epochs, and no batch is ever short.
  A batch is a pure function of (seed, step), so a resumed run replays exactly the batches of an unbroken one.
* ``epochs_to_steps(train, n)``: a recipe's ``[train]`` table in epochs rewritten in optimizer steps. Since the
  stream above has no partial batches, an epoch is ``n / batch_size`` steps, and every epoch count becomes
  ``ceil(epochs * n / batch_size)`` steps: the run sees each example at least ``epochs`` times (round would
  stop up to half a batch short).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

# [train] keys counted in epochs -> the step keys they become (and the least number of steps each may be)
EPOCH_KEYS = {"epochs": ("steps", 1), "warmup_epochs": ("warmup_steps", 0), "eval_every_epochs": ("eval_every", 1)}


def epoch_indices(step: int, batch_size: int, n: int, seed: int) -> np.ndarray:
    """Indices (batch_size,) int64 of batch ``step``: consecutive slices of seeded per-epoch permutations of
    range(n) (see the module docstring)."""
    if n < 1:
        raise ValueError("no training examples to draw batches from")
    start = step * batch_size
    out: list[int] = []
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        out.extend(perm[offset: offset + batch_size - len(out)].tolist())
    return np.asarray(out, dtype=np.int64)


def steps_for(epochs: float, n: int, batch_size: int) -> int:
    """ceil(epochs * n / batch_size), computed exactly (0.1 epochs of 1280 examples in batches of 128 is 1 step)."""
    return math.ceil(Fraction(repr(float(epochs))) * n / batch_size)


def epochs_to_steps(train: dict[str, Any], n: int) -> tuple[float | None, int]:
    """Rewrite ``epochs``, ``warmup_epochs`` and ``eval_every_epochs`` of a recipe's [train] table into
    ``steps``, ``warmup_steps`` and ``eval_every``, in place (``eval_every`` defaults to one epoch when the run is
    given in epochs). Returns (epochs or None, steps per epoch rounded up)."""
    for key in ("batch_size", *EPOCH_KEYS):
        if key in train and (isinstance(train[key], bool) or not isinstance(train[key], (int, float))):
            raise ValueError(f"train.{key} = {train[key]!r}: expected a number")
    batch = int(train.get("batch_size", 32))
    if batch < 1:
        raise ValueError(f"train.batch_size must be >= 1, got {batch}")
    per_epoch = steps_for(1, n, batch)
    epochs = train.get("epochs")
    if epochs is not None:
        if epochs <= 0:
            raise ValueError(f"train.epochs must be > 0, got {epochs}")
        if "eval_every" not in train and "eval_every_epochs" not in train:
            train["eval_every"] = per_epoch
    for key, (target, least) in EPOCH_KEYS.items():
        if key in train:
            if target in train:
                raise ValueError(f"the recipe gives both train.{target} and train.{key}; keep one")
            train[target] = max(least, steps_for(train.pop(key), n, batch))
    return epochs, per_epoch
