"""Shared test setup: one torch thread (tests are small; two threads on two busy cores only spin)."""

import gzip
from pathlib import Path

import torch

from hyperset import energies
from hyperset.sudoku.exact import generate

torch.set_num_threads(1)


def energy_cases(table: dict[str, energies.Energy]) -> list[tuple[str, str]]:
    """(kind, phi) for every energy of a registry (energies.ATTENTION or FEEDFORWARD): each feature map where
    the energy has one, else the default. Tests parametrized by these cover an energy as soon as it is registered
    (tests/toy_energy.py shows it)."""
    return [(name, phi) for name, e in table.items() for phi in (energies.PHI if e.uses_phi else ["sigmoid"])]


def energy_combos() -> list[tuple[str, str]]:
    """(attention, feedforward) pairs in which every registered energy of both kinds appears at least once."""
    attn, ff = list(energies.ATTENTION), list(energies.FEEDFORWARD)
    return [(attn[i % len(attn)], ff[i % len(ff)]) for i in range(max(len(attn), len(ff)))]


def write_sudoku_csvs(root: Path, n_train: int, n_valid: int, seed: int) -> Path:
    """RRN-format train.csv.gz + valid.csv of generated puzzles (30-36 givens) in `root`."""
    rows = generate(n_train + n_valid, 30, 36, seed=seed)
    with gzip.open(root / "train.csv.gz", "wt") as f:
        f.writelines(f"{p},{s}\n" for p, s in rows[:n_train])
    (root / "valid.csv").write_text("".join(f"{p},{s}\n" for p, s in rows[n_train:]))
    return root


def write_tiny_sudoku_checkpoint(path: Path, *, dim: int = 32, heads: int = 2, ff_hidden: int = 64,
                                 time_dim: int = 16, iters: int = 3) -> Path:
    """A small untrained Sudoku checkpoint (seed 0) of the sudoku-cpu preset at `path`."""
    from hyperset.config import preset_config
    from hyperset.models import HyperSETModel, save_checkpoint

    torch.manual_seed(0)
    cfg = preset_config("sudoku-cpu", dim=dim, heads=heads, ff_hidden=ff_hidden, time_dim=time_dim, iters=iters)
    save_checkpoint(path, HyperSETModel(cfg), {"trained_iterations": iters})
    return path
