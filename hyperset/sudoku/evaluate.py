"""Sudoku evaluation: board and cell accuracy of a model over a set of puzzles with known solutions.

    from hyperset.solve import Solver
    from hyperset.sudoku.evaluate import evaluate, load_boards

    solver = Solver.load()                                       # the shipped model
    boards = load_boards("data/valid.csv", boards=1000)          # the paper protocol's seeded draw
    report = evaluate(solver, boards, iters=[16, 32], strategies=["single", "commit"])
    report["strategies"][0]["board_acc"]

Three measurements, all in one report (``evaluate``; ``hyperset-eval sudoku`` prints it or writes it as JSON):

* **per iteration**: one single pass of the recurrence up to the largest requested depth, read out after every
  iteration (board accuracy, cell accuracy over the blank cells, E_ATTN / E_FF where the layer defines them);
* **per givens**: board accuracy per number of givens at each requested depth (from the same pass);
* **per rating**, for boards with ratings (Sudoku-Extreme, :mod:`hyperset.sudoku.extreme`): board accuracy per
  rating bucket (:data:`hyperset.sudoku.rated.BUCKETS`) at each depth and of each strategy;
* **strategies**: each inference strategy of :class:`hyperset.solve.Solver` (single, auto, commit) at each
  requested depth (auto once: it picks its own depth), timed, with the share of valid boards.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..device import dtype_name
from ..files import json_safe
from ..solve import DEFAULT_PASSES, Solver, summarize
from ..strategy_registry import strategy_names
from .data import find_split, givens_count, load_csv, protocol_indices
from .rated import BUCKETS, bucket_range

PROTOCOL_BOARDS = 1000  # the paper's evaluation: 1,000 puzzles of the split (seed 0)
PROTOCOL = "np.random.RandomState(seed).permutation, first n"

__all__ = [
    "PROTOCOL_BOARDS",
    "Boards",
    "IterationCurve",
    "draw",
    "evaluate",
    "iteration_curve",
    "load_boards",
    "per_givens",
    "per_rating",
    "run_strategy",
    "strategy_name",
    "to_strings",
]


@dataclass
class Boards:
    """Puzzles and their solutions, (n, 81) uint8 each (0 = blank), with where they came from."""

    puzzles: np.ndarray
    solutions: np.ndarray
    source: str
    split: str | None = None
    seed: int = 0
    available: int = 0  # puzzles in the file before the draw
    ratings: np.ndarray | None = None  # (n,) each puzzle's rating, where the data has them

    def __len__(self) -> int:
        return len(self.puzzles)

    def describe(self) -> dict[str, Any]:
        return {"data": self.source, "split": self.split, "boards": len(self), "available": self.available,
                "seed": self.seed, "protocol": PROTOCOL}


def to_strings(a: np.ndarray) -> list[str]:
    """81-character strings of the rows of an (n, 81) digit array."""
    return ["".join(map(str, row)) for row in np.asarray(a).tolist()]


def load_boards(data: str | os.PathLike, split: str = "valid", boards: int | None = None, seed: int = 0
                ) -> Boards:
    """Puzzles with solutions from ``data``: an RRN-style ``puzzle,solution`` CSV file (plain, .gz or a zip
    member), or a folder holding the ``split`` file (see :func:`hyperset.sudoku.data.find_split`), drawn as
    :func:`draw` says. Raises ``PuzzleError`` (file, line, reason) for a malformed line, ``DataNotFoundError`` for
    a missing split, ``ValueError`` for more boards than the file has.
    """
    path = Path(data)
    used_split: str | None = None
    if path.is_dir():
        path = find_split(path, split)
        used_split = split
    puzzles, solutions = load_csv(path)
    return draw(puzzles, solutions, str(path), used_split, boards, seed)


def draw(puzzles: np.ndarray, solutions: np.ndarray, source: str, split: str | None = None,
         boards: int | None = None, seed: int = 0, ratings: np.ndarray | None = None) -> Boards:
    """``boards`` of the puzzles drawn with the paper's protocol (:func:`protocol_indices`, ``seed``): a seeded
    shuffle, then the first ``boards``, so every puzzle is as likely to be drawn (no stratification). None takes
    ``PROTOCOL_BOARDS`` or all if fewer; 0 takes all."""
    available = len(puzzles)
    if available == 0:
        raise ValueError(f"{source}: holds no puzzles")
    if boards is None:
        n = min(PROTOCOL_BOARDS, available)
    elif boards > available:
        raise ValueError(f"{source}: asked for {boards} boards but the file holds {available}")
    elif boards < 0:
        raise ValueError(f"boards must be at least 0 (0: all), got {boards}")
    else:
        n = boards or available
    idx = protocol_indices(available, n, seed)
    return Boards(puzzles[idx], solutions[idx], source, split, seed, available,
                  None if ratings is None else np.asarray(ratings)[idx])


@dataclass
class IterationCurve:
    """What one single pass read out after every iteration t = 1..T (arrays indexed by t - 1)."""

    board_right: np.ndarray  # (T, n) bool: the whole board equals the solution
    cell_right: np.ndarray  # (T,) blank cells right, summed over boards
    blanks: int
    energy: dict[str, np.ndarray]  # name -> (T, n), where the layer defines energies
    effective_rank: list[list[float]]  # (T, heads) on the first `geometry_boards` boards (if asked)
    average_angle: list[list[float]]
    seconds: float

    @property
    def iters(self) -> int:
        return self.board_right.shape[0]

    def board_acc(self, t: int) -> float:
        return float(self.board_right[t - 1].mean())

    def cell_acc(self, t: int) -> float:
        return float(self.cell_right[t - 1] / max(self.blanks, 1))

    def to_json(self) -> dict[str, Any]:
        """The layout of bench/results/*_eval.json ``per_iteration``: lists over t = 1..T."""
        out: dict[str, Any] = {
            "board_acc": self.board_right.mean(1).tolist(),
            "cell_acc": (self.cell_right / max(self.blanks, 1)).tolist(),
            "energy": {k: {"mean": v.mean(1).tolist(), "std": v.std(1).tolist()} for k, v in self.energy.items()},
        }
        if self.effective_rank:
            out["effective_rank"], out["average_angle"] = self.effective_rank, self.average_angle
        return out


def _progress(total: int, desc: str, enabled: bool | None) -> Any:
    from tqdm.auto import tqdm

    if enabled is None:
        enabled = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="board", disable=not enabled, leave=False, file=sys.stderr)


@torch.no_grad()
def iteration_curve(solver: Solver, boards: Boards, iters: int, batch_size: int | None = None,
                    geometry_boards: int = 0, progress: bool | None = False) -> IterationCurve:
    """One pass of ``iters`` iterations over ``boards``, read out after every iteration.

    ``geometry_boards`` > 0 also records the effective rank and average angle per head (the paper's eqs. 17-18)
    on that many boards of the first batch. ``progress``: a bar on standard error (None: on a terminal)."""
    from ..energies import average_angle, effective_rank

    if iters < 1:
        raise ValueError(f"iterations must be >= 1, got {iters}")
    batch = batch_size or solver.default_batch_size
    model, device = solver.model, solver.device
    puzzles, solutions = boards.puzzles, boards.solutions
    n = len(puzzles)
    board_right = np.zeros((iters, n), dtype=bool)
    cell_right = np.zeros(iters)
    energy: dict[str, np.ndarray] = {}
    rank: list[list[float]] = []
    angle: list[list[float]] = []
    start = time.perf_counter()
    with _progress(n, f"{iters} iterations", progress) as bar:
        for i in range(0, n, batch):
            p = torch.from_numpy(puzzles[i: i + batch]).long().to(device)
            s = torch.from_numpy(solutions[i: i + batch]).long().to(device)
            blank = p == 0
            for layer, t, x in model.core.iterate(model.stem(p), iters):
                digits = torch.where(blank, model.readout(x).argmax(-1) + 1, p)
                ok = digits == s
                board_right[t - 1, i: i + len(p)] = ok.all(-1).cpu().numpy()
                cell_right[t - 1] += (ok & blank).sum().item()
                for k, v in layer.energy(x, t).items():
                    energy.setdefault(k, np.zeros((iters, n)))[t - 1, i: i + len(p)] = v.float().cpu().numpy()
                if i == 0 and geometry_boards > 0:
                    z = layer.projections(x[:geometry_boards], t)
                    rank.append(effective_rank(z).mean(0).tolist())
                    angle.append(average_angle(z).mean(0).tolist())
            bar.update(len(p))
    blanks = int((puzzles == 0).sum())
    return IterationCurve(board_right, cell_right, blanks, energy, rank, angle, time.perf_counter() - start)


def per_givens(board_right: np.ndarray, givens: np.ndarray) -> dict[int, dict[str, float]]:
    """Board accuracy per number of givens: {givens: {"boards": count, "board_acc": share right}}."""
    return {int(g): {"boards": int((givens == g).sum()), "board_acc": float(board_right[givens == g].mean())}
            for g in np.unique(givens)}


def per_rating(board_right: np.ndarray, ratings: np.ndarray) -> dict[str, dict[str, Any]]:
    """Board accuracy per rating bucket, every bucket of BUCKETS in order: {bucket: {"boards": count,
    "board_acc": share right, None for an empty bucket}}."""
    right, ratings = np.asarray(board_right, dtype=bool), np.asarray(ratings)
    out = {}
    for bucket in BUCKETS:
        lo, hi = bucket_range(bucket)
        inside = (ratings >= lo) if hi is None else (ratings >= lo) & (ratings <= hi)
        out[bucket] = {"boards": int(inside.sum()), "board_acc": float(right[inside].mean()) if inside.any() else None}
    return out


def strategy_name(strategy: str, iters: int | None, passes: int = DEFAULT_PASSES) -> str:
    """single@16, commit@16x16, auto."""
    if strategy == "auto":
        return "auto"
    return f"{strategy}@{iters}" + (f"x{passes}" if strategy == "commit" else "")


def run_strategy(solver: Solver, boards: Boards, strategy: str, iters: int | None = None,
                 passes: int = DEFAULT_PASSES, batch_size: int | None = None, progress: bool | None = False,
                 name: str | None = None) -> dict[str, Any]:
    """Solve ``boards`` with one strategy of :class:`Solver` (``iters``: its depth; ignored by auto, which
    settles per board within 4x the trained depth), timed: board and cell accuracy, share of valid boards,
    boards/s, mean iterations and passes per board."""
    if strategy not in strategy_names():
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(strategy_names())}")
    puzzles, solutions = to_strings(boards.puzzles), to_strings(boards.solutions)
    kw: dict[str, Any] = {"iters": "auto"} if strategy == "auto" else {"iters": iters, "strategy": strategy}
    if strategy == "commit":
        kw["passes"] = passes
    depth = None if strategy == "auto" else (iters or solver.trained_iters)
    results = []
    start = time.perf_counter()
    with _progress(len(puzzles), name or strategy_name(strategy, depth, passes), progress) as bar:
        for r in solver.solve_iter(puzzles, solutions=solutions, batch_size=batch_size, **kw):
            results.append(r)
            bar.update(1)
    seconds = time.perf_counter() - start
    s = summarize(results, seconds, solver)
    n = len(results)
    row = {"strategy": name or strategy_name(strategy, depth, passes), "settings": kw,
           "board_acc": s.board_accuracy, "cell_acc": s.cell_accuracy, "valid": s.valid / n,
           "boards_per_s": n / seconds if seconds > 0 else None, "seconds_per_board": seconds / n,
           "seconds": seconds, "mean_iterations": float(np.mean([r.iterations for r in results])),
           "mean_passes": float(np.mean([r.passes for r in results]))}
    if boards.ratings is not None:
        row["per_rating"] = per_rating(np.array([bool(r.correct) for r in results]), boards.ratings)
    return row


def evaluate(solver: Solver, boards: Boards, iters: Sequence[int] | None = None,
             strategies: Sequence[str] = ("single",), passes: int = DEFAULT_PASSES, batch_size: int | None = None,
             geometry_boards: int = 0, progress: bool | None = False, checkpoint: str | None = None
             ) -> dict[str, Any]:
    """The whole report (a JSON-ready dict): the per-iteration curve up to max(``iters``) (default: the trained
    depth), per-givens accuracy and a ``depths`` row at each of ``iters``, and each strategy at each depth."""
    trained = solver.trained_iters
    depths = sorted(dict.fromkeys(int(d) for d in (iters or [trained])))
    if depths[0] < 1:
        raise ValueError(f"iterations must be >= 1, got {depths[0]}")
    for s in strategies:
        if s not in strategy_names():
            raise ValueError(f"unknown strategy {s!r}; choose from {', '.join(strategy_names())}")
    start = time.perf_counter()
    curve = iteration_curve(solver, boards, depths[-1], batch_size, geometry_boards, progress)
    givens = givens_count(boards.puzzles)
    rows = []
    for strategy in dict.fromkeys(strategies):
        for d in ([None] if strategy == "auto" else depths):
            rows.append(run_strategy(solver, boards, strategy, d, passes, batch_size, progress))
    model = solver.model
    return json_safe({
        "checkpoint": checkpoint,
        **boards.describe(),
        "trained_iterations": trained, "parameters": model.num_parameters(), "layer": model.cfg.layer,
        "device": solver.device_name(), "precision": dtype_name(next(model.parameters()).dtype),
        "batch_size": batch_size or solver.default_batch_size,
        "iters": depths,
        "depths": [{"iters": d, "board_acc": curve.board_acc(d), "cell_acc": curve.cell_acc(d)} for d in depths],
        "per_iteration": curve.to_json(),
        "per_givens": {str(d): {str(g): v for g, v in per_givens(curve.board_right[d - 1], givens).items()}
                       for d in depths},
        **({} if boards.ratings is None else
           {"per_rating": {str(d): per_rating(curve.board_right[d - 1], boards.ratings) for d in depths}}),
        "strategies": rows,
        "seconds": round(time.perf_counter() - start, 3),
    })

