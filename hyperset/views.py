"""Symmetry views: a puzzle and K of its validity-preserving transforms in one batch, each answer mapped back.

A Sudoku stays a Sudoku (with its solution transformed alike) under a relabelling of the digits, a permutation of
the rows within a band, of the bands, of the columns within a stack, of the stacks, and the transpose. The model
is not invariant to them: each view of a puzzle is a different input, and where the model errs on the puzzle as
given it may be right on a view. The ``views`` strategy runs the puzzle (view 0) and `views` transforms of it
(drawn from a fixed seed, the same for every board, so runs are deterministic) as one batch, maps every view's
beliefs back onto the puzzle's cells and digits, and takes the first view whose answer passes the exact check
(every unit holds 1-9 once); where none does, the board it reports is the argmax of the views' mean belief. The
search strategy can take the same look as its first step (``views=K``): the root then ends at a valid view, and
otherwise branches on the mean belief.

Per board the result says which view answered (0: the puzzle as given, the model alone; k > 0: a transform,
chosen by the exact check) and how many model iterations all views cost (``model_iterations``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .backends import SolverBackend
from .strategies import BoardResult, SearchInfo, SolveFrame, _leave_valid, _pass, _PassEnd, _valid_mask

__all__ = ["DEFAULT_VIEWS", "MAX_VIEWS", "Look", "check_views", "look", "view_maps", "views"]

DEFAULT_VIEWS = 8  # transforms beside the puzzle when the views strategy is not told
MAX_VIEWS = 63  # a batch of B boards runs as B * (views + 1): bounded, as the batch size is
_SEED = 20260  # the transforms' seed: fixed, so that a run is the same every time


def check_views(views: object) -> int:
    """`views` as a count of transforms: a whole number from 0 to MAX_VIEWS, else a ValueError naming it."""
    if isinstance(views, bool) or not isinstance(views, int) or not 0 <= views <= MAX_VIEWS:
        raise ValueError(f"views must be a whole number from 0 to {MAX_VIEWS}, got {views!r}")
    return views


def view_maps(views: int, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """The maps of view 0 (the identity) and `views` random symmetries: ``src`` (V, 81) and ``relabel`` (V, 10),
    V = views + 1, as :func:`hyperset.sudoku.data.random_symmetries` defines them."""
    from .sudoku.data import random_symmetries

    check_views(views)
    src, relabel = random_symmetries(np.random.default_rng(_SEED), views)
    src = np.concatenate([np.arange(81)[None], src]).astype(np.int64)
    relabel = np.concatenate([np.arange(10)[None], relabel]).astype(np.int64)
    return torch.from_numpy(src).to(device), torch.from_numpy(relabel).to(device)


def to_views(boards: Tensor, src: Tensor, relabel: Tensor) -> Tensor:
    """(V * B, 81): view v of board b in row v * B + b (view 0, the boards as given, first)."""
    gathered = boards[None, :, :].expand(len(src), -1, -1).gather(2, src[:, None, :].expand(-1, len(boards), -1))
    return relabel[:, None, :].expand(-1, len(boards), -1).gather(2, gathered)


def beliefs_back(probs: Tensor, src: Tensor, relabel: Tensor) -> Tensor:
    """Each view's beliefs (V, B, 81, 9) on the puzzle's own cells and digits."""
    v, b = probs.shape[:2]
    digits = (relabel[:, 1:] - 1)[:, None, None, :].expand(-1, b, 81, -1)  # the view's name of digit d
    named = probs.gather(3, digits)  # (V, B, 81 view cells, 9 puzzle digits)
    inverse = src.argsort(-1)  # the view's cell that holds each puzzle cell
    return named.gather(2, inverse[:, None, :, None].expand(-1, b, -1, 9))


@dataclass
class Look:
    """The views' answer per board (B boards): `mean` belief (B, 81, 9), `proposal` (B, 81) (the first valid view's
    board, else the mean belief's argmax; givens kept), `valid` (B,) bool, `view` (the view that answered, -1:
    none), `end` (view 0's pass: its logits, lengths and energies) and `iterations` (every view's, per board)."""

    mean: Tensor
    proposal: Tensor
    valid: Tensor
    view: list[int]
    end: _PassEnd
    iterations: list[int]


def _first_rows(gen: Generator[SolveFrame, None, _PassEnd], rows: list[int]) -> Generator[SolveFrame, None, _PassEnd]:
    """The iteration frames of a pass over views (row v * B + j), kept to view 0's rows (the boards as given),
    named by `rows` (B)."""
    n = len(rows)
    while True:
        try:
            frame = next(gen)
        except StopIteration as stop:
            return stop.value
        keep = [j for j, r in enumerate(frame.boards) if r < n]
        if keep:
            idx = torch.tensor(keep, device=frame.digits.device)
            yield SolveFrame(frame.kind, frame.pass_index, frame.t, frame.step, [rows[frame.boards[j]] for j in keep],
                             frame.digits[idx], frame.confidence[idx], {k: v[idx] for k, v in frame.energies.items()},
                             frame.source)


def look(backend: SolverBackend, boards: Tensor, iters: int, views: int, pass_index: int = 0, start: int = 0,
         rows: list[int] | None = None, per_iteration: bool = False, energies: bool = True
         ) -> Generator[SolveFrame, None, Look]:
    """One pass of `iters` iterations on every view of `boards` (B, 81) in one batch; a view leaves the pass at
    its first valid iteration where the backend can run one iteration at a time. Iteration frames show view 0.
    `rows`: the boards' indices in the caller's batch (default 0..B-1)."""
    n = len(boards)
    src, relabel = view_maps(views, boards.device)
    expanded = to_views(boards, src, relabel).reshape(-1, 81)
    leave = None
    try:
        backend.check(iters, True)
        leave = _leave_valid
    except ValueError:
        backend.check(iters, False)
    rows = list(range(n)) if rows is None else rows
    all_rows = [v * n + j for v in range(views + 1) for j in range(n)]
    end = yield from _first_rows(_pass(backend, expanded, (expanded > 0).float(), iters, pass_index, start,
                                       all_rows, per_iteration, leave, energies), rows)
    probs = torch.softmax(end.logits.float(), -1).reshape(views + 1, n, 81, 9)
    back = beliefs_back(probs, src, relabel)
    each = torch.where(boards[None] > 0, boards[None], back.argmax(-1) + 1)  # (V, B, 81)
    ok = _valid_mask(each.reshape(-1, 81)).reshape(views + 1, n)
    mean = back.mean(0)
    first = torch.where(ok.any(0), ok.float().argmax(0), -1)  # the first valid view per board
    proposal = torch.where(boards > 0, boards, mean.argmax(-1) + 1)
    for j in (first >= 0).nonzero().flatten().tolist():
        proposal[j] = each[first[j], j]
    lengths = torch.tensor(end.lengths).reshape(views + 1, n)
    zero = _PassEnd(end.logits[:n], end.lengths[:n], {k: v[:, :n] for k, v in end.energies.items()})
    return Look(mean, proposal, ok.any(0), first.tolist(), zero, lengths.sum(0).tolist())


def views(backend: SolverBackend, boards: Tensor, iters: int, n_views: int = DEFAULT_VIEWS,
          per_iteration: bool = False) -> Iterator[SolveFrame]:
    """The views strategy: one pass on the puzzle and `n_views` transforms, the exact check picks the answer."""
    n = len(boards)
    rows = list(range(n))
    got = yield from look(backend, boards, iters, n_views, per_iteration=per_iteration)
    conf = torch.where(boards > 0, 1.0, got.mean.gather(-1, (got.proposal - 1).clamp(min=0)[..., None])[..., 0])
    done = {}
    for b in rows:
        info = SearchInfo(status="solved" if bool(got.valid[b]) else "budget", nodes=n_views + 1, views=n_views + 1,
                          view=got.view[b] if got.view[b] >= 0 else None, model_iterations=got.iterations[b],
                          by_model=bool(got.valid[b]))
        done[b] = BoardResult(got.proposal[b], conf[b], got.end.lengths[b], 1, got.end.energy_of(b),
                              [got.end.lengths[b]], info)
    yield SolveFrame("pass", 0, iters, iters, rows, got.proposal, conf, got.end.energies, backend.source, done,
                     {b: done[b].search.to_json() for b in rows})
