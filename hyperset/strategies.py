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
    search  one pass, then depth-first search on the model's beliefs with exact checks and backtracking
            (:mod:`hyperset.search`); the default.
    views   one pass on the puzzle and K of its symmetry transforms in one batch, each answer mapped back, the
            exact check picks (:mod:`hyperset.views`).

The strategies are offered by name through :mod:`hyperset.strategy_registry` (name, description, run), which
the solver, the commands and the app read.

A board's energy covers every iteration it reports: for ``commit`` the passes one after the other
(``pass_lengths`` says where each starts).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .backends import SolverBackend
from .defaults import DEFAULT_PATIENCE
from .sudoku.board import UNITS

__all__ = ["BoardResult", "SearchInfo", "SolveFrame", "auto", "commit", "commit_cells", "single"]



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
    search: Any = None  # a SearchInfo (nodes, backtracks, status, ...) where the strategy tells how it went


@dataclass
class SearchInfo:
    """How a board's search went: `status` "solved", "no solution" or "budget"; `nodes` (model calls, or
    expansions with the uniform prior), `backtracks` (decisions taken back), `decisions` (cells fixed by a choice
    on the way to the answer), `propagated` (cells the exact checks placed), `depth` (decisions of the node
    reached), `by_model` (the answer was the model's prediction at a node, not the checks' propagation); with
    views, which view answered. The nodes on the way to the answer are its `decisions` ancestors, and the node
    itself where `by_model`: the rest of `nodes` went into decisions taken back."""

    status: str = "running"
    nodes: int = 0
    backtracks: int = 0
    decisions: int = 0
    propagated: int = 0
    depth: int = 0
    by_model: bool = False  # the answer was the model's own prediction at a node
    views: int = 0  # views of the first look (the puzzle and its transforms; 0: the puzzle alone)
    view: int | None = None  # the view whose answer was taken (0: the puzzle as given)
    model_iterations: int = 0  # iterations the model ran for this board, every view and node counted

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"status": self.status, "nodes": self.nodes, "backtracks": self.backtracks,
                                  "decisions": self.decisions, "propagated": self.propagated,
                                  "by_model": self.by_model, "model_iterations": self.model_iterations}
        if self.views:
            out["views"], out["view"] = self.views, self.view
        return out


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
    info: dict[int, dict[str, Any]] = field(default_factory=dict)  # per board, the search's counters


@dataclass
class _PassEnd:
    """How a pass ended, per board of the pass (b boards): logits (b, 81, 9) at the board's last iteration, the
    iterations it ran (updates of the core, every distinct layer counted), and energies {name: (t, b)}: NaN past
    a board's last iteration."""

    logits: Tensor
    lengths: list[int]
    energies: dict[str, Tensor]

    def energy_of(self, j: int) -> dict[str, list[float]]:
        """Board j's energies over the iterations it ran."""
        return {k: v[: self.lengths[j], j].tolist() for k, v in self.energies.items()}


# leave(t, rows, digits, valid) -> (k,) bool: which of the k boards still running (their positions `rows` in the
# pass) leave the pass after iteration t, given their digits (k, 81) and whether those are a valid full board
_Leave = Callable[[int, Tensor, Tensor, Tensor], Tensor]
_PassGen = Generator[SolveFrame, None, _PassEnd]


def _read(logits: Tensor, board: Tensor, cell_conf: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(digit 1-9 per cell, its probability, board digits = givens + argmax, their confidence)."""
    conf, digit = torch.softmax(logits.float(), -1).max(-1)
    digit = digit + 1
    filled = board > 0
    return digit, conf, torch.where(filled, board, digit), torch.where(filled, cell_conf, conf)


def _pass(backend: SolverBackend, board: Tensor, cell_conf: Tensor, iters: int, pass_index: int, start: int,
          rows: list[int], per_iteration: bool, leave: _Leave | None = None, energies: bool = True) -> _PassGen:
    """One pass of `iters` iterations on `board` (b, 81), iteration frames when `per_iteration`.

    With `leave`, the pass reads the prediction after every iteration and a board leaves the pass at the first
    iteration `leave` names it; the backend then runs the others only (their rows are sent to it). Without it,
    and without iteration frames, the backend runs the pass in one call (without the energies when not
    `energies`)."""
    n = len(board)
    if leave is None and not per_iteration:
        logits, trace = backend.run(board, iters) if energies else backend.run(board, iters, energies=False)
        steps_run = next(iter(trace.values())).shape[0] if trace else iters
        return _PassEnd(logits, [steps_run] * n, trace)
    live = torch.arange(n, device=board.device)  # positions in the pass of the boards still running
    final: Tensor | None = None
    lengths = [iters] * n
    trace: list[tuple[Tensor, dict[str, Tensor]]] = []  # per iteration: the rows that ran it, their energies
    steps = backend.iterate(board, iters)
    keep: Tensor | None = None
    logits, t = None, 0
    while True:
        try:
            out = steps.send(keep)
        except StopIteration:
            break
        keep, t, logits = None, out.t, out.logits
        if final is None:
            final = logits.new_zeros((n, *logits.shape[1:]))
        trace.append((live, out.energies))
        _, _, digits, conf = _read(logits, board[live], cell_conf[live])
        if per_iteration:
            yield SolveFrame("iteration", pass_index, t, start + t, [rows[j] for j in live.tolist()], digits, conf,
                             out.energies, backend.source)
        if leave is None:
            continue
        gone = leave(t, live, digits, _valid_mask(digits))
        if bool(gone.any()):
            final[live[gone]] = logits[gone]
            for j in live[gone].tolist():
                lengths[j] = t
            stay = (~gone).nonzero().flatten()
            live, keep, logits = live[stay], stay, logits[stay]
            if len(live) == 0:
                steps.close()
                break
    if final is None or logits is None:
        raise ValueError(f"iterations must be >= 1, got {iters}")
    if len(live):  # the boards that ran the whole pass: `logits` holds their rows
        final[live] = logits
        for j in live.tolist():
            lengths[j] = t
    energies: dict[str, Tensor] = {}
    for i, (rows_i, e) in enumerate(trace):
        for k, v in e.items():
            energies.setdefault(k, torch.full((len(trace), n), math.nan, dtype=v.dtype, device=v.device))[i, rows_i] = v
    return _PassEnd(final, lengths, energies)


def single(backend: SolverBackend, boards: Tensor, iters: int, per_iteration: bool = False) -> Iterator[SolveFrame]:
    """One pass of `iters` iterations."""
    rows = list(range(len(boards)))
    cell_conf = (boards > 0).float()
    end = yield from _pass(backend, boards, cell_conf, iters, 0, 0, rows, per_iteration)
    _, _, digits, conf = _read(end.logits, boards, cell_conf)
    done = {b: BoardResult(digits[b], conf[b], iters, 1, end.energy_of(b), [iters]) for b in rows}
    yield SolveFrame("pass", 0, iters, iters, rows, digits, conf, end.energies, backend.source, done)


def auto(backend: SolverBackend, boards: Tensor, max_iters: int, patience: int = DEFAULT_PATIENCE,
         per_iteration: bool = True) -> Iterator[SolveFrame]:
    """Stop each board when its prediction is a valid board or has not changed for `patience` iterations; the
    backend runs only the boards that have not stopped."""
    backend.check(max_iters, True)
    n = len(boards)
    rows = list(range(n))
    cell_conf = (boards > 0).float()
    prev = torch.zeros_like(boards)
    stable = torch.zeros(n, dtype=torch.long, device=boards.device)

    def leave(t: int, live: Tensor, digits: Tensor, valid: Tensor) -> Tensor:
        if t == 1:
            stable[live] = 1
        else:
            stable[live] = torch.where((digits == prev[live]).all(-1), stable[live] + 1, 0)
        prev[live] = digits
        return valid | (stable[live] >= patience)

    end = yield from _pass(backend, boards, cell_conf, max_iters, 0, 0, rows, per_iteration, leave)
    _, _, digits, conf = _read(end.logits, boards, cell_conf)
    done = {b: BoardResult(digits[b], conf[b], end.lengths[b], 1, end.energy_of(b), [end.lengths[b]]) for b in rows}
    yield SolveFrame("pass", 0, max_iters, max_iters, rows, digits, conf, end.energies, backend.source, done)


def commit(backend: SolverBackend, boards: Tensor, iters: int, passes: int,
           per_iteration: bool = False) -> Iterator[SolveFrame]:
    """Each pass commits a growing share of the remaining blanks (most confident, clash-free) as givens.

    A board leaves as soon as its prediction (givens + argmax) is a valid full board: that board is the solution
    of a well-posed puzzle, so further iterations could not change it. The prediction is read after every
    iteration (when the backend can run one at a time; else after every pass), a board that is done leaves the
    batch, and only unfinished boards run on, so easy boards cost a few iterations of one pass."""
    n = len(boards)
    current = boards.clone()
    cell_conf = torch.where(boards > 0, 1.0, 0.0).float()  # confidence with which each cell was filled
    energy: list[dict[str, list[float]]] = [{} for _ in range(n)]
    lengths: list[list[int]] = [[] for _ in range(n)]
    leave: _Leave | None = _leave_valid
    try:
        backend.check(iters, True)
    except ValueError:  # a backend that runs whole passes only: boards leave at the end of a pass
        leave = None
    active = list(range(n))
    for r in range(passes):
        idx = torch.tensor(active, device=current.device)
        cur, conf_in = current[idx], cell_conf[idx]
        blanks = cur == 0
        end = yield from _pass(backend, cur, conf_in, iters, r, r * iters, active, per_iteration, leave)
        digit, conf, proposal, filled_conf = _read(end.logits, cur, conf_in)
        solved = _valid_mask(proposal)
        still, done = [], {}
        for j, b in enumerate(active):
            for k, v in end.energy_of(j).items():
                energy[b].setdefault(k, []).extend(v)
            lengths[b].append(end.lengths[j])
            if solved[j] or r == passes - 1 or not bool(blanks[j].any()):
                done[b] = BoardResult(proposal[j], filled_conf[j], sum(lengths[b]), r + 1, energy[b], lengths[b])
            else:
                still.append(j)
        yield SolveFrame("pass", r, iters, iters * (r + 1), active, proposal, filled_conf, end.energies,
                         backend.source, done)
        if not still:
            return
        keep = torch.tensor(still, device=cur.device)
        chosen = commit_cells(cur[keep], digit[keep], conf[keep], r, passes)
        for j, pick in zip(still, chosen):
            b = active[j]
            current[b, pick] = digit[j, pick]
            cell_conf[b, pick] = conf[j, pick]
        active = [active[j] for j in still]


def _leave_valid(t: int, live: Tensor, digits: Tensor, valid: Tensor) -> Tensor:
    return valid


def commit_cells(board: Tensor, digit: Tensor, conf: Tensor, pass_index: int, passes: int) -> list[Tensor]:
    """The cells the commit strategy fixes after pass `pass_index` (0-based) of at most `passes`: per board, the
    most confident predictions for blank cells whose digit does not already stand in a peer cell, nor in a peer
    fixed before it in the same pass (most confident first), a share of the remaining blanks that grows as
    1 - cos(pi/2 * (pass + 1) / passes). Returns one index tensor per board."""
    blanks = board == 0
    score = torch.where(blanks & ~_clashes(board, digit), conf, torch.full_like(conf, -1.0))
    share = 1.0 - math.cos(math.pi / 2 * (pass_index + 1) / passes)
    out = []
    for b in range(len(board)):
        k = max(1, int(math.ceil(share * int(blanks[b].sum()))))
        order = score[b].argsort(descending=True, stable=True)
        digits = digit[b].tolist()
        taken: list[int] = []
        used: set[tuple[int, int]] = set()  # (unit, digit) of the cells taken so far
        for c in order[score[b, order] > 0].tolist():
            if len(taken) == k:
                break
            # two peers proposing one digit: fixing both would leave a board no later pass can make valid
            keys = [(u, digits[c]) for u in _CELL_UNITS[c]]
            if any(key in used for key in keys):
                continue
            taken.append(c)
            used.update(keys)
        out.append(torch.tensor(taken, dtype=torch.long, device=board.device))
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
_CELL_UNITS = [[u for u, unit in enumerate(UNITS) if cell in unit] for cell in range(81)]  # row, column, box


def _clashes(board: Tensor, digit: Tensor) -> Tensor:
    """(B, 81) bool: the proposed digit already stands in a peer cell of the current board."""
    peers = _PEERS.to(board.device)
    same = (board[:, None, :] == digit[:, :, None]) & peers[None]
    return same.any(-1)


_UNITS = torch.tensor(UNITS)  # (27, 9)


def _valid_mask(digits: Tensor) -> Tensor:
    """(B,) bool per board: all 27 units hold 1..9 exactly once (no blanks)."""
    vals = digits[:, _UNITS.to(digits.device)]  # (B, 27, 9)
    digit_range = torch.arange(1, 10, device=digits.device)
    return (torch.sort(vals, -1).values == digit_range).all(-1).all(-1)
