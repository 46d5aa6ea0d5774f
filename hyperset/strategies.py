"""The Sudoku strategies, written once, as streams of frames.

Each strategy is a generator over a :class:`~hyperset.backends.SolverBackend` and a batch of boards that yields
:class:`SolveFrame` objects: one per iteration (``kind="iteration"``, when asked for with ``per_iteration`` or
when the strategy needs them) and one per pass (``kind="pass"``). A frame names the boards it is about and
hands over, in ``done``, the boards that finished with it (their :class:`BoardResult`). ``Solver.solve``,
``hyperset-solve``, the app and the ONNX backend all consume these generators; with or without iteration frames
the boards, iteration counts and energies are the same.

    single  one pass of N iterations, argmax per blank cell.
    auto    iterate until the prediction settles (a valid board, or unchanged for `patience` iterations), at most
            `max_iters`; each board reports the iteration where it settled.
    commit  MaskGIT-style decoding for Sudoku: run N iterations, commit the most confident predictions that do
            not clash with the board as new givens, run again, until the board is valid or full. A board leaves
            as soon as its prediction is a valid full board; only unfinished boards run again.

A board's energy covers every iteration it reports: for ``commit`` the passes one after the other
(``pass_lengths`` says where each starts).
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .backends import SolverBackend
from .sudoku.board import UNITS

__all__ = ["STRATEGIES", "BoardResult", "SolveFrame", "auto", "commit", "commit_cells", "single", "stream"]

STRATEGIES = ("single", "auto", "commit")


@dataclass
class BoardResult:
    """A finished board: digits (81,) (givens + predictions), confidence (81,) (1 for givens, the probability
    with which each other cell was filled), iterations and passes run, and its energies {name: [float, ...]}
    over every iteration it reports, passes in order (`pass_lengths` iterations each)."""

    digits: Tensor
    confidence: Tensor
    iterations: int
    passes: int
    energy: dict[str, list[float]]
    pass_lengths: list[int]


@dataclass
class SolveFrame:
    """A step of a strategy.

    kind "iteration": after iteration `t` of pass `pass_index` (0-based); energies {name: (b,)}.
    kind "pass": after pass `pass_index` (its `t` iterations); energies {name: (t, b)}.
    `boards` are the indices (in the batch given to the strategy) of the b rows of digits (b, 81), confidence
    (b, 81) and energies; `step` counts the iterations run so far by these boards over all passes; `source` is
    the backend's (``"torch"``, ``"onnxruntime"``); `done` holds the boards that finished with this frame.
    """

    kind: str
    pass_index: int
    t: int
    step: int
    boards: list[int]
    digits: Tensor
    confidence: Tensor
    energies: dict[str, Tensor]
    source: str
    done: dict[int, BoardResult] = field(default_factory=dict)


_PassGen = Generator[SolveFrame, None, tuple[Tensor, dict[str, Tensor]]]


def _read(logits: Tensor, board: Tensor, cell_conf: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(digit 1-9 per cell, its probability, board digits = givens + argmax, their confidence)."""
    conf, digit = torch.softmax(logits.float(), -1).max(-1)
    digit = digit + 1
    filled = board > 0
    return digit, conf, torch.where(filled, board, digit), torch.where(filled, cell_conf, conf)


def _pass(backend: SolverBackend, board: Tensor, cell_conf: Tensor, iters: int, pass_index: int, start: int,
          rows: list[int], per_iteration: bool) -> _PassGen:
    """One pass of `iters` iterations on `board` (b, 81): iteration frames when asked; returns (logits, energies
    {name: (T, b)})."""
    if not per_iteration:
        logits, energies = backend.run(board, iters)
        return logits, energies
    logits, trace = None, {}
    for out in backend.iterate(board, iters):
        logits = out.logits
        for k, v in out.energies.items():
            trace.setdefault(k, []).append(v)
        _, _, digits, conf = _read(logits, board, cell_conf)
        yield SolveFrame("iteration", pass_index, out.t, start + out.t, rows, digits, conf, out.energies,
                         backend.source)
    if logits is None:
        raise ValueError(f"iterations must be >= 1, got {iters}")
    return logits, {k: torch.stack(v) for k, v in trace.items()}


def single(backend: SolverBackend, boards: Tensor, iters: int, per_iteration: bool = False) -> Iterator[SolveFrame]:
    """One pass of `iters` iterations."""
    rows = list(range(len(boards)))
    cell_conf = (boards > 0).float()
    logits, energies = yield from _pass(backend, boards, cell_conf, iters, 0, 0, rows, per_iteration)
    _, _, digits, conf = _read(logits, boards, cell_conf)
    done = {b: BoardResult(digits[b], conf[b], iters, 1, {k: v[:, b].tolist() for k, v in energies.items()}, [iters])
            for b in rows}
    yield SolveFrame("pass", 0, iters, iters, rows, digits, conf, energies, backend.source, done)


def auto(backend: SolverBackend, boards: Tensor, max_iters: int, patience: int = 4) -> Iterator[SolveFrame]:
    """Stop each board when its prediction is a valid board or has not changed for `patience` iterations."""
    backend.check(max_iters, True)
    n = len(boards)
    rows = list(range(n))
    cell_conf = (boards > 0).float()
    done_at = [0] * n
    trace: dict[str, list[Tensor]] = {}
    prev, stable = None, torch.zeros(n, dtype=torch.long)
    for out in backend.iterate(boards, max_iters):
        t = out.t
        for k, v in out.energies.items():
            trace.setdefault(k, []).append(v)
        _, _, digits, conf = _read(out.logits, boards, cell_conf)
        stable = stable + 1 if prev is None else torch.where((digits == prev).all(-1).cpu(), stable + 1, 0)
        prev = digits
        filled_ok = _valid_full(digits.cpu())
        done = {}
        for b in rows:
            if not done_at[b] and (filled_ok[b] or stable[b] >= patience or t == max_iters):
                done_at[b] = t
                done[b] = BoardResult(digits[b], conf[b], t, 1, {k: [float(e[b]) for e in v] for k, v in trace.items()},
                                      [t])
        yield SolveFrame("iteration", 0, t, t, rows, digits, conf, out.energies, backend.source, done)
        if all(done_at):
            return


def commit(backend: SolverBackend, boards: Tensor, iters: int, passes: int,
           per_iteration: bool = False) -> Iterator[SolveFrame]:
    """Each pass commits a growing share of the remaining blanks (most confident, clash-free) as givens.

    A board leaves as soon as its prediction (givens + argmax) is a valid full board: that board is the solution
    of a well-posed puzzle, so further passes could not change it. Only unfinished boards run again, so easy
    boards cost one pass."""
    n = len(boards)
    current = boards.clone()
    cell_conf = torch.where(boards > 0, 1.0, 0.0).float()  # confidence with which each cell was filled
    energy: list[dict[str, list[float]]] = [{} for _ in range(n)]
    active = list(range(n))
    for r in range(passes):
        idx = torch.tensor(active, device=current.device)
        cur, conf_in = current[idx], cell_conf[idx]
        blanks = cur == 0
        logits, energies = yield from _pass(backend, cur, conf_in, iters, r, r * iters, active, per_iteration)
        digit, conf, proposal, filled_conf = _read(logits, cur, conf_in)
        solved = _valid_full(proposal.cpu())
        still, done = [], {}
        for j, b in enumerate(active):
            for k, v in energies.items():
                energy[b].setdefault(k, []).extend(v[:, j].tolist())
            if solved[j] or r == passes - 1 or not bool(blanks[j].any()):
                done[b] = BoardResult(proposal[j], filled_conf[j], iters * (r + 1), r + 1, energy[b], [iters] * (r + 1))
            else:
                still.append(j)
        yield SolveFrame("pass", r, iters, iters * (r + 1), active, proposal, filled_conf, energies, backend.source,
                         done)
        if not still:
            return
        keep = torch.tensor(still, device=cur.device)
        chosen = commit_cells(cur[keep], digit[keep], conf[keep], r, passes)
        for j, pick in zip(still, chosen):
            b = active[j]
            current[b, pick] = digit[j, pick]
            cell_conf[b, pick] = conf[j, pick]
        active = [active[j] for j in still]


def stream(backend: SolverBackend, boards: Tensor, strategy: str, iters: int, *, passes: int = 16,
           max_iters: int | None = None, patience: int = 4, per_iteration: bool = False) -> Iterator[SolveFrame]:
    """The frames of `strategy` on `boards` (B, 81) int64 (`max_iters` bounds auto, default `iters`)."""
    if strategy == "single":
        return single(backend, boards, iters, per_iteration)
    if strategy == "commit":
        return commit(backend, boards, iters, passes, per_iteration)
    if strategy == "auto":
        return auto(backend, boards, max_iters or iters, patience)
    raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")


def commit_cells(board: Tensor, digit: Tensor, conf: Tensor, pass_index: int, passes: int) -> list[Tensor]:
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


def _peer_mask() -> Tensor:
    """(81, 81) bool: cells that share a row, column or box (not the cell itself)."""
    peers = torch.zeros(81, 81, dtype=torch.bool)
    for unit in UNITS:
        idx = torch.tensor(unit)
        peers[idx[:, None], idx[None, :]] = True
    peers.fill_diagonal_(False)
    return peers


_PEERS = _peer_mask()


def _clashes(board: Tensor, digit: Tensor) -> Tensor:
    """(B, 81) bool: the proposed digit already stands in a peer cell of the current board."""
    peers = _PEERS.to(board.device)
    same = (board[:, None, :] == digit[:, :, None]) & peers[None]
    return same.any(-1)


def _valid_full(digits: Tensor) -> list[bool]:
    """Per board: all 27 units hold 1..9 exactly once (no blanks)."""
    units = torch.tensor(UNITS)
    vals = digits[:, units]  # (B, 27, 9)
    ok = (vals > 0).all(-1) & (torch.sort(vals, -1).values == torch.arange(1, 10)).all(-1)
    return ok.all(-1).tolist()
