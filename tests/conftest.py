"""Shared test setup: one torch thread (tests are small; two threads on two busy cores only spin)."""

import gzip
from pathlib import Path

import torch

from hyperset.sudoku.exact import generate

torch.set_num_threads(1)


def write_sudoku_csvs(root: Path, n_train: int, n_valid: int, seed: int) -> Path:
    """RRN-format train.csv.gz + valid.csv of generated puzzles (30-36 givens) in `root`."""
    rows = generate(n_train + n_valid, 30, 36, seed=seed)
    with gzip.open(root / "train.csv.gz", "wt") as f:
        f.writelines(f"{p},{s}\n" for p, s in rows[:n_train])
    (root / "valid.csv").write_text("".join(f"{p},{s}\n" for p, s in rows[n_train:]))
    return root
