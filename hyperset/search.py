"""The search strategy: depth-first search on the model's beliefs, every partial board checked exactly.

A board's search is a tree of partial boards (nodes). At each node:

1. **Exact checks.** The digits of the node are placed and naked and hidden singles propagated to a fixed point
   (the same for every prior, counted apart from the model's choices as ``propagated``). A cell left with no
   candidate, or a unit with no place for a digit, is a dead end: the decision that led there is taken back
   (a *backtrack*) and the next alternative tried. A board with every cell placed is a solution.
2. **The model** runs one pass on the node's board (givens + every digit placed so far). If its prediction for
   the remaining blanks completes a valid board, that is the answer. Otherwise its beliefs, renormalised over each
   cell's remaining candidates, choose the next decision: among the cells with the fewest candidates, the one
   where the model is least sure (with a uniform prior: the first of them), and the order of its digits (most
   likely first).
3. **Frontier.** The children are pushed on the board's frontier: a stack (``order="depth"``: the most recent
   decision is the first taken back) or a heap on the decisions' joint probability (``order="best"``).

Nodes of many boards go through the model in one batch. A board ends solved (a valid board, and only then),
with a proof that it has no solution (the frontier ran empty), or at its budget (``nodes`` model calls per board,
``seconds`` for the batch), reported with the most complete board it reached. ``prior="uniform"`` runs the same
search with the model's beliefs replaced by a uniform prior and no model call (the reference for what the model
is worth: ``nodes`` then counts the expansions).

Everything is deterministic: no random numbers are drawn.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .backends import SolverBackend
from .strategies import BoardResult, SearchInfo, SolveFrame, _leave_valid, _pass, _valid_mask
from .sudoku.exact import _ALL, _propagate

__all__ = ["ORDERS", "PRIORS", "SearchInfo", "search"]

PRIORS = ("model", "uniform")
ORDERS = ("depth", "best")

_BIT_DIGIT = {1 << d: d + 1 for d in range(9)}
_DIGIT_BITS = np.array([1 << d for d in range(9)], dtype=np.int64)


@dataclass(order=True)
class _Entry:
    key: tuple[float, int]
    cands: list[int] = field(compare=False)
    cell: int = field(compare=False)
    bit: int = field(compare=False)
    depth: int = field(compare=False)
    logp: float = field(compare=False)


class _Tree:
    """One board's search."""

    def __init__(self, givens: list[int], order: str):
        self.order, self.info = order, SearchInfo()
        self.frontier: list[_Entry] = []
        self.pushed = 0
        self.given = sum(1 for d in givens if d)
        self.best_board = list(givens)  # the most complete board reached
        self.answer: list[int] | None = None
        self.proposal: list[int] | None = None  # the model's last full prediction
        cands = [1 << (d - 1) if d else _ALL for d in givens]
        self.root: list[int] | None = cands if _propagate(cands, [i for i, d in enumerate(givens) if d]) else None
        if self.root is None:
            self.info.status = "no solution"

    def push(self, entries: list[_Entry]) -> None:
        if self.order == "depth":
            self.frontier.extend(reversed(entries))  # the most likely child on top
        else:
            for e in entries:
                heapq.heappush(self.frontier, e)

    def pop(self) -> _Entry:
        return self.frontier.pop() if self.order == "depth" else heapq.heappop(self.frontier)

    def key(self, logp: float) -> tuple[float, int]:
        self.pushed += 1
        return (-logp, self.pushed) if self.order == "best" else (0.0, self.pushed)

    def note(self, cands: list[int], depth: int) -> None:
        board = _digits(cands)
        if sum(1 for d in board if d) > sum(1 for d in self.best_board if d):
            self.best_board = board
        self.info.depth = depth

    def finish(self, board: list[int], depth: int, placed: int, by_model: bool = False) -> None:
        """Solved: `board` the answer, `placed` the cells filled before the last step (givens, decisions and
        propagation), the rest by propagation or, `by_model`, by the model's prediction."""
        self.answer = board
        self.info.status, self.info.decisions, self.info.by_model = "solved", depth, by_model
        self.info.propagated = (placed if by_model else 81) - self.given - depth


def _digits(cands: list[int]) -> list[int]:
    return [_BIT_DIGIT.get(m, 0) for m in cands]


def _solved(cands: list[int]) -> bool:
    return all(not m & (m - 1) for m in cands)


def _next_node(tree: _Tree, max_nodes: int, model_root: bool) -> tuple[list[int], int, float] | None:
    """Pop the frontier until a node to expand: (candidates, depth, log-probability); None when the board ended
    (solved, no solution) or its budget ran out. The root goes to the model even when the checks alone solve it
    (`model_root`): the model has the first look at every puzzle."""
    if tree.info.status != "running":
        return None
    if tree.root is not None:  # the root: no decision yet
        cands, tree.root = tree.root, None
        if _solved(cands) and not model_root:
            tree.finish(_digits(cands), 0, 81)
            return None
        return cands, 0, 0.0
    while tree.frontier:
        if tree.info.nodes >= max_nodes:
            tree.info.status = "budget"
            return None
        e = tree.pop()
        cands = e.cands[:]
        cands[e.cell] = e.bit
        if not _propagate(cands, [e.cell]):
            tree.info.backtracks += 1
            continue
        if _solved(cands):
            tree.finish(_digits(cands), e.depth, 81)
            return None
        return cands, e.depth, e.logp
    tree.info.status = "no solution"
    return None


def _expand(tree: _Tree, cands: list[int], depth: int, logp: float, probs: np.ndarray | None) -> None:
    """Push the children of a node: of the cells with the fewest candidates, the one where `probs` (81, 9) is
    least sure (the lowest top probability; None: uniform, the first such cell), its candidates most likely
    first. Branching where the model is unsure, among the cells the checks leave most constrained, needed the
    fewest nodes of the rules measured (docs/search.md)."""
    masks = np.asarray(cands, dtype=np.int64)
    legal = (masks[:, None] & _DIGIT_BITS[None, :]) != 0  # (81, 9)
    count = legal.sum(1)
    open_ = count > 1
    fewest = open_ & (count == count[open_].min())
    p = np.where(legal, 1.0 if probs is None else np.maximum(probs, 1e-12), 0.0)
    q = p / np.maximum(p.sum(1, keepdims=True), 1e-30)
    score = np.where(fewest, 2.0 - q.max(1), -1.0)
    cell = int(np.argmax(score))  # ties: the first cell
    digits = np.nonzero(legal[cell])[0]
    ranked = digits[np.argsort(-q[cell, digits], kind="stable")]
    child_logp = [logp + math.log(q[cell, d]) for d in ranked]
    tree.push([_Entry(tree.key(lp), cands, cell, 1 << int(d), depth + 1, lp) for d, lp in zip(ranked, child_logp)])


def search(backend: SolverBackend | None, boards: Tensor, iters: int, *, node_iters: int | None = None,
           nodes: int = 1000, seconds: float | None = None, prior: str = "model", order: str = "depth",
           width: int = 1, first_look: bool = True, views: int = 0, per_iteration: bool = False
           ) -> Iterator[SolveFrame]:
    """The search's frames on `boards` (B, 81): one ``"node"`` frame per batch of nodes (the boards of the batch,
    the model's prediction on each node's board, the counters in `info`), the finished boards in `done` with
    their :class:`SearchInfo` in ``BoardResult.search``.

    With `first_look`, the root pass runs `iters` iterations on the puzzle as given (the model's own first look,
    even where the exact checks alone would solve it), a board leaving
    it at the first iteration its prediction is valid where the backend can run one iteration at a time; every
    later node runs `node_iters` (default `iters`) on the node's board in one call. Without it the root is a node
    like the others: the checks first, then the model on the board they leave (the same checks as the uniform
    prior's, so their node counts compare the priors alone). `views` > 0: the first look runs the puzzle and
    that many of its transforms (:mod:`hyperset.views`; each a model call counted in the board's nodes), the root
    ending at the first valid view and otherwise branching on the views' mean belief. `nodes`: most nodes per
    board; `seconds`: most seconds for the batch; `width`: nodes of one board per batch."""
    if prior not in PRIORS:
        raise ValueError(f"prior {prior!r}: expected one of {', '.join(PRIORS)}")
    if order not in ORDERS:
        raise ValueError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
    for name, v in (("nodes", nodes), ("width", width)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")
    if views:
        from .views import check_views

        check_views(views)
    if seconds is not None and not (isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    node_iters = iters if node_iters is None else node_iters
    use_model = prior == "model"
    if use_model and backend is None:
        raise ValueError("the model prior needs a backend")
    leave = None
    if use_model:
        try:
            backend.check(max(iters, node_iters), True)
            leave = _leave_valid
        except ValueError:
            backend.check(iters, False)
            backend.check(node_iters, False)
    start = time.perf_counter()
    givens = boards.tolist()
    trees = [_Tree(g, order) for g in givens]
    energy: list[dict[str, list[float]]] = [{} for _ in trees]
    lengths: list[list[int]] = [[] for _ in trees]
    finished: set[int] = set()
    step = ran = 0
    while len(finished) < len(trees):
        out_of_time = seconds is not None and time.perf_counter() - start > seconds
        batch: list[tuple[int, list[int], int, float]] = []
        for b, tree in enumerate(trees):
            if b in finished:
                continue
            if out_of_time and tree.info.status == "running":
                tree.info.status = "budget"
            for _ in range(width):
                node = _next_node(tree, nodes, use_model and first_look)
                if node is None:
                    break
                tree.info.nodes += 1
                tree.note(node[0], node[1])
                if use_model:
                    batch.append((b, *node))
                else:
                    _expand(tree, node[0], node[1], node[2], None)
        done: dict[int, BoardResult] = {}
        frame = None
        if batch:
            # the first pass stops a board at its first valid iteration; a node's short pass runs whole, in one call
            frame = yield from _model_step(backend, trees, batch, givens if first_look else None, boards.device, step,
                                           ran,
                                           iters if step == 0 else node_iters, per_iteration,
                                           leave if step == 0 else None, energy, lengths,
                                           views if step == 0 and first_look else 0)
            ran += iters if step == 0 else node_iters
        for b, tree in enumerate(trees):
            if b not in finished and tree.info.status != "running":
                finished.add(b)
                done[b] = _result(tree, givens[b], energy[b], lengths[b])
        step += 1
        if frame is not None:
            frame.done = done
            yield frame
        elif done:
            rows = sorted(done)
            yield SolveFrame("node", step, 0, ran, rows, torch.stack([done[b].digits for b in rows]),
                             torch.stack([done[b].confidence for b in rows]), {},
                             "search" if backend is None else backend.source, done,
                             {b: trees[b].info.to_json() for b in rows})


def _model_step(backend: SolverBackend, trees: list[_Tree], batch: list[tuple[int, list[int], int, float]],
                givens: list[list[int]] | None, device: torch.device, step: int, ran: int, iters: int,
                per_iteration: bool, leave: object, energy: list[dict[str, list[float]]], lengths: list[list[int]],
                views: int = 0):
    """One pass of the model on the batch's nodes (roots see the puzzle as given): a node whose prediction is
    a valid board ends its board; the others are expanded on the model's beliefs. Returns the node frame.
    `givens`: the puzzles as given, which the roots see (None: the roots see the board the checks left);
    `views` > 0: the batch is the roots, seen with that many transforms (:func:`hyperset.views.look`)."""
    rows = [b for b, *_ in batch]
    seen = [givens[b] if depth == 0 and givens is not None else _digits(cands) for b, cands, depth, _ in batch]
    node_boards = torch.tensor(seen, dtype=torch.long, device=device)
    cell_conf = (node_boards > 0).float()
    view: list[int] = []
    if views:
        from .views import look

        got = yield from look(backend, node_boards, iters, views, step, ran, rows, per_iteration)
        end, probs, proposal, valid, view = got.end, got.mean, got.proposal, got.valid.tolist(), got.view
        work = got.iterations
    else:  # the energies of the first pass are traced; a node's pass runs without them
        end = yield from _pass(backend, node_boards, cell_conf, iters, step, ran, rows, per_iteration, leave,
                               energies=step == 0)
        probs = torch.softmax(end.logits.float(), -1)
        proposal = torch.where(node_boards > 0, node_boards, probs.argmax(-1) + 1)
        valid, work = _valid_mask(proposal).tolist(), end.lengths
    conf = probs.max(-1).values
    probs_np = probs.cpu().numpy()
    for j, (b, cands, depth, logp) in enumerate(batch):
        tree = trees[b]
        for k, v in end.energy_of(j).items():
            energy[b].setdefault(k, []).extend(v)
        lengths[b].append(end.lengths[j])
        tree.info.model_iterations += work[j]
        if views:
            tree.info.nodes += views
            tree.info.views = views + 1
        if tree.info.status != "running":
            continue  # ended by another node of the same batch
        if valid[j]:
            if views:
                tree.info.view = view[j]
            tree.finish(proposal[j].tolist(), depth, sum(1 for d in seen[j] if d), by_model=True)
        elif _solved(cands):
            tree.finish(_digits(cands), depth, 81)
        else:
            tree.proposal = proposal[j].tolist()
            _expand(tree, cands, depth, logp, probs_np[j])
    info = {b: trees[b].info.to_json() for b in dict.fromkeys(rows)}
    return SolveFrame("node", step, max(end.lengths), ran + max(end.lengths), rows, proposal,
                      torch.where(node_boards > 0, cell_conf, conf), end.energies, backend.source, {}, info)


def _result(tree: _Tree, givens: list[int], energy: dict[str, list[float]], lengths: list[int]) -> BoardResult:
    """The board a finished search reports: the answer, else the model's last prediction where the budget ran
    out, else the most complete board reached (blanks 0 where nothing was predicted)."""
    if tree.answer is not None:
        digits = tree.answer
    elif tree.info.status == "budget" and tree.proposal is not None:
        digits = tree.proposal
    else:
        digits = tree.best_board
    d = torch.tensor(digits, dtype=torch.long)
    conf = torch.tensor([1.0 if g else (1.0 if tree.answer is not None else 0.0) for g in givens])
    return BoardResult(d, conf, sum(lengths), len(lengths), energy, lengths, tree.info)
