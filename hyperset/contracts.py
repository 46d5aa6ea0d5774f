"""What a model of each task must read and answer for the front ends to use it: checked when one is loaded."""

from __future__ import annotations

import math
import os

from .checkpoint import CheckpointError
from .config import ModelConfig

SUDOKU_CELLS = 81  # a 9x9 board, one token per cell, row by row
SUDOKU_VOCAB = 10  # a cell: 0 blank, 1-9 a given digit
SUDOKU_CLASSES = 9  # the answer of a cell: the digits 1-9
TASK_NAMES = {"sudoku": "a 9x9 Sudoku model", "mim": "a masked token model", "classify": "an image classifier"}


def contract_problems(cfg: ModelConfig) -> list[str]:
    """How `cfg` differs from what a model of its task must be (empty: it fits).

    sudoku: 81 cells of vocabulary 10 in, 9 classes per cell out. mim: codes plus one mask id in (vocab_size =
    num_classes + 1) over a square grid of codes (the tokenizer's), as ``hyperset.vision.reconstruct``'s
    ``check_compatible`` needs. classify: at least two classes. The sizes the stem itself needs (img_size a
    multiple of patch_grid) are checked when the model is built."""
    if cfg.task == "sudoku":
        wanted = (("seq_len", SUDOKU_CELLS), ("vocab_size", SUDOKU_VOCAB), ("num_classes", SUDOKU_CLASSES))
        return [f"{key} {getattr(cfg, key)} (expected {want})" for key, want in wanted if getattr(cfg, key) != want]
    if cfg.task == "mim":
        problems = []
        if cfg.vocab_size != cfg.num_classes + 1:
            problems.append(f"vocab_size {cfg.vocab_size} (expected num_classes + 1 = {cfg.num_classes + 1}: the "
                            "codes and the mask id)")
        if math.isqrt(cfg.seq_len) ** 2 != cfg.seq_len:
            problems.append(f"seq_len {cfg.seq_len} (expected a square grid of codes)")
        return problems
    if cfg.task == "classify" and cfg.num_classes < 2:
        return [f"num_classes {cfg.num_classes} (expected at least 2)"]
    return []


def check_contract(cfg: ModelConfig, where: str | os.PathLike) -> None:
    """A one-line CheckpointError naming `where` unless `cfg` fits its task (`contract_problems`), e.g.
    ``ckpt: not a 9x9 Sudoku model: seq_len 80 (expected 81)``."""
    problems = contract_problems(cfg)
    if problems:
        raise CheckpointError(f"{where}: not {TASK_NAMES[cfg.task]}: {'; '.join(problems)}")
