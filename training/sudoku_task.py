"""Sudoku for the shared trainer: RRN "sudoku-hard" data or Sudoku-Extreme, loss on blank cells, board and cell
accuracy."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hyperset.config import ModelConfig, check_choice
from hyperset.models import HyperSETModel
from hyperset.sudoku import extreme
from hyperset.sudoku.board import UNITS
from hyperset.sudoku.data import augment, find_split, load_csv, protocol_indices, protocol_split

from .task import Task, check_depth_range, draw_depth


@dataclass
class SudokuData:
    """Where the puzzles come from, as in the paper's protocol (seeded permutation, first n rows).

    ``data_dir`` is a folder with train/valid CSVs, or ``"sudoku-extreme"`` (its cached train.csv, see
    :func:`extreme_train_valid`)."""

    data_dir: str = ""
    n_train: int = 9000  # 0: every training puzzle
    n_val: int = 1000  # the reported validation set: first n_val of a seed-0 permutation of valid
    n_select: int = 1000  # the next n_select rows: used to choose the best checkpoint
    augment: bool = False
    seed: int = 0


def board_metrics(pred: torch.Tensor, puzzles: torch.Tensor, solutions: torch.Tensor) -> dict[str, float]:
    """pred, puzzles, solutions: (B, 81) digits. Cell accuracy over blanks, board accuracy over boards."""
    blank = puzzles == 0
    right = (pred == solutions) | ~blank
    cells = ((pred == solutions) & blank).sum().item() / max(blank.sum().item(), 1)
    return {"board_acc": right.all(dim=1).float().mean().item(), "cell_acc": cells}


def predict_digits(logits: torch.Tensor, puzzles: torch.Tensor) -> torch.Tensor:
    """Argmax digit per cell, givens kept."""
    return torch.where(puzzles > 0, puzzles, logits.argmax(-1) + 1)


_UNITS = torch.tensor(UNITS)  # (27, 9) cell indices of every row, column and box


def constraint_loss(logits: torch.Tensor, puzzles: torch.Tensor) -> torch.Tensor:
    """L_sudoku: in every row, column and box each digit appears once, on straight-through binarised probabilities.

    logits (T, B, 81, 9); givens count as certain. Mean over iterations, boards, units and digits.
    """
    probs = torch.softmax(logits, -1)
    given = F.one_hot((puzzles - 1).clamp_min(0), 9).to(probs.dtype) * (puzzles > 0)[..., None]
    probs = torch.where(puzzles[None, ..., None] > 0, given[None], probs)
    hard = probs + ((probs >= 0.5).to(probs.dtype) - probs).detach()  # straight-through
    per_unit = hard[:, :, _UNITS.to(puzzles.device)].sum(3)  # (T, B, 27, 9): how often each digit stands in a unit
    return (per_unit - 1).pow(2).mean()


def extreme_train_valid(n_valid: int, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """Sudoku-Extreme's train.csv (from the cache) split in two: ``n_valid`` puzzles held out for validation and
    checkpoint selection, the first ``n_valid`` of a seeded permutation (``seed``), and the rest to train on. Its
    test.csv is never read here: it stays for ``hyperset-eval sudoku --data sudoku-extreme``."""
    rated = extreme.load(extreme.cached_split("train"))
    n = len(rated)
    if n_valid >= n:
        raise ValueError(f"data.n_val + data.n_select = {n_valid}, but Sudoku-Extreme's train.csv holds {n:,} "
                         "puzzles, and some must be left to train on")
    order = protocol_indices(n, n, seed)
    held, rest = order[:n_valid], np.sort(order[n_valid:])
    return (rated.puzzles[rest], rated.solutions[rest]), (rated.puzzles[held], rated.solutions[held])


@dataclass
class SudokuTask(Task):
    model: ModelConfig
    data: SudokuData
    supervise: str = "all"  # all: mean CE over every iteration; last: the paper's final-iteration loss
    constraint_weight: float = 0.0  # the Recurrent Transformer's L_sudoku (Yang et al. 2023), 0 = off
    # Depth-robust training (each off by default; drawn per step from (seed, step), so a resume replays them):
    train_iters: list[int] = field(default_factory=list)  # [lo, hi]: iterations per segment ~ U{lo..hi}
    segments: int = 1  # deep supervision: segments x iterations, the state carried on detached between segments
    skip_iters: list[int] = field(default_factory=list)  # [lo, hi]: a no-grad prefix (progressive loss)
    select_iters: int = 0  # the depth at which the best checkpoint is chosen on the selection split (0: trained)
    eval_iters: list[int] = field(default_factory=list)
    eval_batch: int = 500
    name: str = "sudoku"

    def __post_init__(self) -> None:
        if not self.data.data_dir:
            raise ValueError("no Sudoku data folder given (--data DIR): it must hold train/valid CSVs "
                             "(train.csv / valid.csv, *.csv.gz, rrnstyle_*.csv.gz or sudoku-hard.zip); or "
                             f"--data {extreme.NAME}")
        for key in ("n_train", "n_val", "n_select"):
            if getattr(self.data, key) < 0:
                raise ValueError(f"data.{key} = {getattr(self.data, key)}: must be >= 0")
        need = self.data.n_val + self.data.n_select
        if self.data.data_dir == extreme.NAME:
            train_file = valid_file = extreme.split_path("train")
            (puzzles, solutions), (vp, vs) = extreme_train_valid(need, self.data.seed)
        else:
            root = Path(self.data.data_dir)
            train_file, valid_file = find_split(root, "train"), find_split(root, "valid")
            puzzles, solutions = load_csv(train_file)
            vp, vs = load_csv(valid_file)
        if not len(puzzles):
            raise ValueError(f"{train_file}: no training puzzles")
        if self.data.n_train > len(puzzles):
            raise ValueError(f"data.n_train = {self.data.n_train}, but {train_file} holds {len(puzzles):,} "
                             "puzzles (0 takes them all)")
        if self.data.n_train:
            puzzles, solutions = protocol_split(puzzles, solutions, self.data.n_train, self.data.seed)
        self.train_puzzles, self.train_solutions = puzzles, solutions
        vp, vs = protocol_split(vp, vs, min(need, len(vp)), self.data.seed)
        self.val = (vp[: self.data.n_val], vs[: self.data.n_val])
        self.select = (vp[self.data.n_val:], vs[self.data.n_val:])
        if not len(vp):
            raise ValueError(f"{valid_file}: no validation puzzles for data.n_val = {self.data.n_val} "
                             f"and data.n_select = {self.data.n_select} (the best checkpoint is chosen on them)")
        self.eval_iters = self.eval_iters or [self.model.iters, 2 * self.model.iters]
        check_depth_range("train_iters", self.train_iters)
        check_depth_range("skip_iters", self.skip_iters, lo_min=0)
        check_choice("objective", "supervise", self.supervise, ("all", "last"))
        if self.segments < 1:
            raise ValueError(f"objective.segments must be >= 1, got {self.segments}")
        if self.select_iters < 0:
            raise ValueError(f"objective.select_iters must be >= 0 (0: the trained depth), got {self.select_iters}")
        self.select_iters = self.select_iters or self.model.iters
        self.select_metric = f"select/board_acc@{self.select_iters}"

    def model_config(self) -> ModelConfig:
        return self.model

    def build_model(self) -> HyperSETModel:
        model = super().build_model()
        # a depth drawn at every step: under torch.compile one graph per update, compiled once for every depth,
        # rather than the whole pass compiled again for each new depth (RecurrentCore.graph_per_update)
        model.core.graph_per_update = bool(self.train_iters or self.skip_iters)
        return model

    def train_size(self) -> int:
        return len(self.train_puzzles)

    def describe(self) -> dict[str, Any]:
        return {"data_dir": str(self.data.data_dir), "train_puzzles": int(len(self.train_puzzles)),
                "val_puzzles": int(len(self.val[0])), "select_puzzles": int(len(self.select[0])),
                "augment": self.data.augment, "protocol": "np.random.RandomState(seed).permutation, first n",
                "seed": self.data.seed, "supervise": self.supervise, "train_iters": self.train_iters,
                "segments": self.segments, "skip_iters": self.skip_iters}

    def batch(self, step: int, batch_size: int, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
        """Deterministic in (seed, step): epochs are seeded permutations, so a resumed run sees the same data."""
        idx = self.batch_indices(step, batch_size, seed)
        p, s = self.train_puzzles[idx], self.train_solutions[idx]
        if self.data.augment:
            p, s = augment(p, s, np.random.default_rng([seed, step, 1]))
        puzzles = torch.from_numpy(np.ascontiguousarray(p)).long().to(device)
        solutions = torch.from_numpy(np.ascontiguousarray(s)).long().to(device)
        # on the CPU: the loss reads it as Python ints, which must not wait for the device
        depth = torch.tensor(self.depth_draw(step, seed)).expand(len(puzzles), 2)
        return {"puzzles": puzzles, "solutions": solutions, "depth": depth}

    def depth_draw(self, step: int, seed: int) -> tuple[int, int]:
        """(iterations per segment, no-grad prefix) for a step: the model's depth, or draws from the ranges."""
        rng = np.random.default_rng([seed, step, 2])
        return draw_depth(rng, self.train_iters, self.model.iters), draw_depth(rng, self.skip_iters, 0)

    def loss(self, model: HyperSETModel, batch: dict[str, torch.Tensor]
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        puzzles, solutions = batch["puzzles"], batch["solutions"]
        target = torch.where(puzzles == 0, solutions - 1, torch.full_like(solutions, -100))
        iters, skip = (int(v) for v in batch["depth"][0]) if "depth" in batch else (self.model.iters, 0)
        logits = model(puzzles, iters=iters * self.segments, all_logits=True, skip=skip,
                       detach_every=iters if self.segments > 1 else 0)  # (segments x iters, B, 81, 9)
        if self.supervise == "last":  # the last iteration of every segment
            logits = logits[iters - 1:: iters]
        ce = F.cross_entropy(logits.float().flatten(0, 2), target.repeat(len(logits), 1).flatten(),
                             ignore_index=-100)
        final = logits[-1]
        logs = {}
        if self.constraint_weight:
            lc = constraint_loss(logits.float(), puzzles)
            ce = ce + self.constraint_weight * lc
            logs["constraint"] = lc.detach()
        with torch.no_grad():
            blank = puzzles == 0
            acc = ((final.argmax(-1) + 1 == solutions) & blank).sum() / blank.sum().clamp_min(1)
        return ce, {"acc": acc, **logs}

    def loss_weight(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Supervised cells in a batch: micro-batches are weighted by it, so accumulation equals one big batch."""
        return (batch["puzzles"] == 0).sum()

    @torch.no_grad()
    def evaluate(self, model: HyperSETModel, device: torch.device, autocast: Any) -> dict[str, float]:
        model.eval()
        out: dict[str, float] = {}
        val_iters = self.eval_iters if len(self.select[0]) else sorted({*self.eval_iters, self.select_iters})
        sets = [("val", self.val, val_iters), ("select", self.select, [self.select_iters])]
        for name, (p, s), iters_list in sets:
            if len(p) == 0:
                continue
            for iters in iters_list:
                preds = []
                for i in range(0, len(p), self.eval_batch):
                    puzzles = torch.from_numpy(p[i: i + self.eval_batch]).long().to(device)
                    with autocast():
                        logits = model(puzzles, iters=iters)
                    preds.append(predict_digits(logits.float(), puzzles).cpu())
                m = board_metrics(torch.cat(preds), torch.from_numpy(p).long(), torch.from_numpy(s).long())
                out.update({f"{name}/{k}@{iters}": v for k, v in m.items()})
        if not self.select[0].size:
            out[self.select_metric] = out[f"val/board_acc@{self.select_iters}"]
        return out
