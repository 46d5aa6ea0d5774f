"""The Sudoku solver: boards in, boards out, with the energy trace; every answer goes through the exact checker.

Strategies:
    single  one pass of N iterations, argmax per blank cell.
    auto    iterate until the prediction settles (a valid board, or unchanged for `patience` iterations),
            at most `max_iters`; each board reports the iteration where it settled.
    commit  MaskGIT-style decoding for Sudoku: run N iterations, commit the most confident predictions that
            do not clash with the board as new givens, run again, until the board is full.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .checkpoint import CheckpointError, load_checkpoint, trained_iterations
from .device import describe, pick_device
from .models import HyperSETModel
from .pretrained import PRETRAINED, weights_root
from .sudoku.board import UNITS, validate

STRATEGIES = ("single", "auto", "commit")
DEFAULT_STRATEGY = "commit"  # measured in bench/sudoku_eval.py (README, "Sudoku results")
DEFAULT_PASSES = 16  # most passes of the commit strategy
# Boards per forward pass. On a CPU small batches are faster per board: at 256 the activations and attention maps
# (256 x 4 x 81 x 81 floats) leave the cache. bench/sudoku_eval.py (`batch_sweep`, 2-core AMD EPYC, 1 thread, 256
# puzzles): one pass at 16 iterations 31.5 / 45.9 / 47.7 / 41.5 / 22.1 boards/s at batch 1 / 4 / 16 / 64 / 256,
# the default commit strategy 7.3 / 8.3 / 10.1 / 10.8 / 8.3. GPUs want big batches.
CPU_BATCH_SIZE = 16
GPU_BATCH_SIZE = 256


def bundled_checkpoint() -> Path:
    """The small Sudoku model shipped inside the package."""
    return weights_root() / PRETRAINED["sudoku"]


@dataclass
class SolveResult:
    puzzle: str
    prediction: str
    valid: bool
    reason: str
    conflicting_cells: list[int]
    iterations: int
    energy: dict[str, list[float]]
    confidence: float  # mean probability of the predicted digits over blank cells
    solution: str | None = None
    correct: bool | None = None
    passes: int = 1

    def to_json(self) -> dict[str, Any]:
        out = {"puzzle": self.puzzle, "prediction": self.prediction, "valid": self.valid, "reason": self.reason,
               "conflicting_cells": self.conflicting_cells, "iterations": self.iterations, "passes": self.passes,
               "confidence": _finite(round(self.confidence, 6)),
               "energy": {k: [_finite(e) for e in v] for k, v in self.energy.items()}}
        if self.solution is not None:
            out["solution"], out["correct"] = self.solution, self.correct
        return out


def _finite(x: float) -> float | None:
    """JSON has no NaN or infinity: a diverged value becomes null."""
    return x if math.isfinite(x) else None


def _board_tensor(puzzles: Sequence[str], device: torch.device) -> torch.Tensor:
    return torch.tensor([[int(c) for c in p] for p in puzzles], dtype=torch.long, device=device)


def _peer_mask() -> torch.Tensor:
    """(81, 81) bool: cells that share a row, column or box (not the cell itself)."""
    peers = torch.zeros(81, 81, dtype=torch.bool)
    for unit in UNITS:
        idx = torch.tensor(unit)
        peers[idx[:, None], idx[None, :]] = True
    peers.fill_diagonal_(False)
    return peers


_PEERS = _peer_mask()


class Solver:
    """Runs a Sudoku model (torch, or an ONNX Runtime session through `backend`) on batches of boards."""

    def __init__(self, model: HyperSETModel, device: torch.device, info: dict[str, Any] | None = None,
                 backend: Any = None):
        if model.cfg.task != "sudoku":
            raise ValueError(f"this is a {model.cfg.task!r} model; the solver needs a 'sudoku' model")
        self.model, self.device, self.info = model.eval(), device, info or {}
        self.backend = backend  # callable (boards LongTensor, iters) -> (logits, energy dict) or None

    @classmethod
    def load(cls, checkpoint: str | Path | None = None, device: str = "auto") -> Solver:
        dev = pick_device(device)
        path = checkpoint or bundled_checkpoint()
        model, info = load_checkpoint(path, task="sudoku", map_location=dev)
        bad = [k for k, v in model.state_dict().items() if v.is_floating_point() and not bool(v.isfinite().all())]
        if bad:
            raise CheckpointError(f"{path}: weights hold NaN or infinite values ({', '.join(bad[:3])}); "
                                  "expected the finite weights of a trained sudoku model")
        return cls(model, dev, info)

    @property
    def trained_iters(self) -> int:
        return trained_iterations(self.model.cfg, self.info)

    @property
    def backend_name(self) -> str:
        return getattr(self.backend, "name", "torch")

    def device_name(self) -> str:
        return getattr(self.backend, "device_name", None) or describe(self.device)

    @property
    def default_batch_size(self) -> int:
        """Boards per forward pass when the caller does not say: small on a CPU, large on a GPU."""
        if self.backend is not None:
            on_gpu = getattr(self.backend, "device", "cpu") == "cuda"
        else:
            on_gpu = self.device.type != "cpu"
        return GPU_BATCH_SIZE if on_gpu else CPU_BATCH_SIZE

    @torch.no_grad()
    def _logits(self, boards: torch.Tensor, iters: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Logits (B, 81, 9) after `iters` iterations and per-iteration energies {name: (T, B)}."""
        if self.backend is not None:
            return self.backend(boards, iters)
        out = self.model.run(boards, iters=iters, trace=True)
        return out.logits.float(), {k[len("energy_"):]: v for k, v in out.trace.stacked().items()}

    @torch.no_grad()
    def iterate(self, boards: torch.Tensor, iters: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor,
                                                                           dict[str, torch.Tensor]]]:
        """Yield (t, digits (B, 81), probabilities of those digits (B, 81), energies {name: (B,)}) per iteration."""
        model = self.model
        x0 = model.stem(boards.to(self.device))
        for layer, t, x in model.core.iterate(x0, iters):
            probs = torch.softmax(model.readout(x).float(), -1)
            conf, digit = probs.max(-1)
            digits = torch.where(boards > 0, boards, digit + 1)
            conf = torch.where(boards > 0, torch.ones_like(conf), conf)
            yield t, digits, conf, {k: v.float() for k, v in layer.energy(x, t).items()}

    def check_iters(self, iters: int | str | None) -> None:
        """Raise ValueError if the backend cannot run `iters` (as passed to `solve`), before any work is done."""
        if self.backend is None:
            return
        if iters == "auto":
            raise ValueError("iterations 'auto' read the prediction after every iteration and run on the torch "
                             "backend only; give a number of iterations for the ONNX backend")
        fixed = getattr(self.backend, "unrolled", None)
        n = self.trained_iters if iters is None else int(iters)
        if fixed is not None and n != fixed:
            raise ValueError(f"{Path(self.backend.path).name} is unrolled for {fixed} iterations and cannot run {n}; "
                             f"use {fixed} iterations or export a Loop graph (hyperset-export --loop)")

    def solve(self, puzzles: Sequence[str], iters: int | str | None = None, strategy: str = DEFAULT_STRATEGY,
              batch_size: int | None = None, solutions: Sequence[str | None] | None = None,
              max_iters: int | None = None, patience: int = 4, passes: int = DEFAULT_PASSES) -> list[SolveResult]:
        """Solve 81-character puzzles. `iters` defaults to the trained depth; "auto" settles per board;
        `passes` is the most passes of the commit strategy; `batch_size` defaults to `default_batch_size`."""
        return list(self.solve_iter(puzzles, iters, strategy, batch_size, solutions, max_iters, patience, passes))

    def solve_iter(self, puzzles: Sequence[str], iters: int | str | None = None, strategy: str = DEFAULT_STRATEGY,
                   batch_size: int | None = None, solutions: Sequence[str | None] | None = None,
                   max_iters: int | None = None, patience: int = 4, passes: int = DEFAULT_PASSES
                   ) -> Iterator[SolveResult]:
        """`solve` one result at a time, in the order of `puzzles`, as each batch of boards is done."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
        self.check_iters("auto" if strategy == "auto" else iters)
        if iters == "auto":
            strategy = "auto"
            iters = None
        n_iters = int(iters) if iters is not None else self.trained_iters
        if n_iters < 1:
            raise ValueError(f"iterations must be >= 1, got {n_iters}")
        if passes < 1:
            raise ValueError(f"passes must be >= 1, got {passes}")
        batch_size = self.default_batch_size if batch_size is None else batch_size
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        for i in range(0, len(puzzles), batch_size):
            chunk = list(puzzles[i: i + batch_size])
            boards = _board_tensor(chunk, self.device)
            if strategy == "single":
                results = self._single(chunk, boards, n_iters)
            elif strategy == "auto":
                results = self._auto(chunk, boards, max_iters or 4 * self.trained_iters, patience)
            else:
                results = self._commit(chunk, boards, n_iters, passes)
            for k, r in enumerate(results, start=i):
                sol = solutions[k] if solutions is not None else None
                if sol:
                    r.solution, r.correct = sol, r.prediction == sol
                yield r

    def _finish(self, puzzle: str, digits: torch.Tensor, conf: torch.Tensor, iterations: int,
                energy: dict[str, list[float]], passes: int = 1) -> SolveResult:
        prediction = "".join(str(int(d)) for d in digits.tolist())
        verdict = validate(prediction, puzzle)
        blank = torch.tensor([c == "0" for c in puzzle])
        confidence = float(conf.cpu()[blank].mean()) if blank.any() else 1.0
        return SolveResult(puzzle, prediction, verdict.valid, verdict.reason, verdict.conflicting_cells, iterations,
                           energy, confidence, passes=passes)

    def _single(self, chunk: list[str], boards: torch.Tensor, iters: int) -> list[SolveResult]:
        logits, energy = self._logits(boards, iters)
        probs = torch.softmax(logits, -1)
        conf, digit = probs.max(-1)
        digits = torch.where(boards > 0, boards, digit + 1)
        return [self._finish(p, digits[b], conf[b], iters, {k: v[:, b].tolist() for k, v in energy.items()})
                for b, p in enumerate(chunk)]

    def _auto(self, chunk: list[str], boards: torch.Tensor, max_iters: int, patience: int) -> list[SolveResult]:
        """Stop each board when its prediction is a valid board or has not changed for `patience` iterations."""
        n = len(chunk)
        done_at = [0] * n
        final: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n
        energies: dict[str, list[torch.Tensor]] = {}
        prev, stable = None, torch.zeros(n, dtype=torch.long)
        for t, digits, conf, energy in self.iterate(boards, max_iters):
            for k, v in energy.items():
                energies.setdefault(k, []).append(v)
            stable = stable + 1 if prev is None else torch.where((digits == prev).all(-1).cpu(), stable + 1, 0)
            prev = digits
            filled_ok = _valid_full(digits.cpu())
            for b in range(n):
                if not done_at[b] and (filled_ok[b] or stable[b] >= patience or t == max_iters):
                    done_at[b], final[b] = t, (digits[b], conf[b])
            if all(done_at):
                break
        return [self._finish(p, final[b][0], final[b][1], done_at[b],
                             {k: [float(e[b]) for e in v[: done_at[b]]] for k, v in energies.items()})
                for b, p in enumerate(chunk)]

    def _commit(self, chunk: list[str], boards: torch.Tensor, iters: int, rounds: int) -> list[SolveResult]:
        """Each pass commits a growing share of the remaining blanks (most confident, clash-free) as givens.

        A board leaves the loop as soon as its prediction (givens + argmax) is a valid full board: that board is
        the solution of a well-posed puzzle, so further passes could not change it. Only unfinished boards are
        run again, so easy boards cost one pass."""
        n = len(chunk)
        current = boards.clone()
        cell_conf = torch.where(boards > 0, 1.0, 0.0).float()  # confidence with which each cell was filled
        final: list[tuple[torch.Tensor, torch.Tensor, dict[str, list[float]], int] | None] = [None] * n
        active = list(range(n))
        for r in range(rounds):
            idx = torch.tensor(active, device=current.device)
            cur = current[idx]
            blanks = cur == 0
            logits, energy = self._logits(cur, iters)
            conf, digit = torch.softmax(logits, -1).max(-1)
            digit = digit + 1
            proposal = torch.where(blanks, digit, cur)
            filled_conf = torch.where(blanks, conf, cell_conf[idx])
            solved = _valid_full(proposal.cpu())
            still = []
            for j, b in enumerate(active):
                if solved[j] or r == rounds - 1 or not bool(blanks[j].any()):
                    final[b] = (proposal[j], filled_conf[j], {k: v[:, j].tolist() for k, v in energy.items()}, r + 1)
                else:
                    still.append(j)
            if not still:
                break
            keep = torch.tensor(still, device=cur.device)
            chosen = commit_cells(cur[keep], digit[keep], conf[keep], r, rounds)
            for j, pick in zip(still, chosen):
                b = active[j]
                current[b, pick] = digit[j, pick]
                cell_conf[b, pick] = conf[j, pick]
            active = [active[j] for j in still]
        out = []
        for b, p in enumerate(chunk):
            digits, conf_b, energy_b, passes = final[b]  # type: ignore[misc]
            out.append(self._finish(p, digits, conf_b, iters * passes, energy_b, passes))
        return out


def commit_cells(board: torch.Tensor, digit: torch.Tensor, conf: torch.Tensor, pass_index: int,
                 passes: int) -> list[torch.Tensor]:
    """The cells the commit strategy fixes after pass `pass_index` (0-based) of at most `passes`: per board, the
    most confident predictions for blank cells whose digit does not already stand in a peer cell, a share of the
    remaining blanks that grows as 1 - cos(pi/2 * (pass + 1) / passes). Returns one index tensor per board."""
    blanks = board == 0
    score = torch.where(blanks & ~_clashes(board, digit), conf, torch.full_like(conf, -1.0))
    share = 1.0 - math.cos(math.pi / 2 * (pass_index + 1) / passes)
    out = []
    for b in range(len(board)):
        k = max(1, int(math.ceil(share * int(blanks[b].sum()))))
        top = score[b].topk(k)
        out.append(top.indices[top.values > 0])
    return out


def _clashes(board: torch.Tensor, digit: torch.Tensor) -> torch.Tensor:
    """(B, 81) bool: the proposed digit already stands in a peer cell of the current board."""
    peers = _PEERS.to(board.device)
    same = (board[:, None, :] == digit[:, :, None]) & peers[None]
    return same.any(-1)


def _valid_full(digits: torch.Tensor) -> list[bool]:
    """Per board: all 27 units hold 1..9 exactly once (no blanks)."""
    units = torch.tensor(UNITS)
    vals = digits[:, units]  # (B, 27, 9)
    ok = (vals > 0).all(-1) & (torch.sort(vals, -1).values == torch.arange(1, 10)).all(-1)
    return ok.all(-1).tolist()


@dataclass
class SolveSummary:
    puzzles: int
    valid: int
    seconds: float
    device: str
    backend: str
    board_accuracy: float | None = None
    cell_accuracy: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {"puzzles": self.puzzles, "valid": self.valid, "device": self.device, "backend": self.backend,
               "seconds": round(self.seconds, 4)}
        if self.board_accuracy is not None:
            out["board_accuracy"], out["cell_accuracy"] = self.board_accuracy, self.cell_accuracy
        return {**out, **self.extra}


def summarize(results: list[SolveResult], seconds: float, solver: Solver) -> SolveSummary:
    summary = SolveSummary(len(results), sum(r.valid for r in results), seconds, solver.device_name(),
                           solver.backend_name)
    known = [r for r in results if r.solution]
    if known:
        summary.board_accuracy = sum(bool(r.correct) for r in known) / len(known)
        blanks = right = 0
        for r in known:
            for p, q, s in zip(r.puzzle, r.prediction, r.solution):
                if p == "0":
                    blanks += 1
                    right += q == s
        summary.cell_accuracy = right / max(blanks, 1)
    return summary


def timed_solve(solver: Solver, puzzles: Sequence[str], **kw: Any) -> tuple[list[SolveResult], float, bool]:
    """`solver.solve` timed; a Ctrl-C stops it and keeps the results of the boards done so far (then the flag
    is True)."""
    t0 = time.perf_counter()
    results: list[SolveResult] = []
    try:
        for r in solver.solve_iter(puzzles, **kw):
            results.append(r)
    except KeyboardInterrupt:
        return results, time.perf_counter() - t0, True
    return results, time.perf_counter() - t0, False
