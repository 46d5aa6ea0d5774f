"""Exact sudoku solving in pure Python: bitmask candidates, naked + hidden singles, fewest-candidates search.

Candidates of a cell are a 9-bit mask (bit ``d - 1`` set when digit ``d`` is still possible). Also here:
:func:`propagate_singles` (the classical no-search baseline) and a seeded puzzle generator, :func:`generate`.
"""

from __future__ import annotations

import random

from .board import MIN_UNIQUE_GIVENS, UNITS, Board, _unit_label, cell_name, to_string

__all__ = ["count_solutions", "generate", "propagate_singles", "solve"]

_ALL = 0x1FF
_UNIT_CELLS: tuple[tuple[int, ...], ...] = UNITS
_PEERS: tuple[tuple[int, ...], ...] = tuple(
    tuple(sorted({j for unit in UNITS if i in unit for j in unit} - {i})) for i in range(81)
)
_POP = tuple(bin(m).count("1") for m in range(512))
_DIGIT = {1 << d: str(d + 1) for d in range(9)}
# Generator: fresh grids tried to hit the drawn givens count before settling for the lowest one reached.
_PATIENCE = 20
# Random removal seldom reaches 22 givens and practically never fewer.
_LOWEST_REACHABLE = 22


def _initial(givens: str) -> tuple[list[int], list[int]]:
    cands = [_ALL] * 81
    queue = []
    for i, ch in enumerate(givens):
        if ch != "0":
            cands[i] = 1 << (ord(ch) - 49)
            queue.append(i)
    return cands, queue


def _propagate(cands: list[int], queue: list[int], hidden: bool = True) -> bool:
    """Apply naked singles (eliminate placed digits from peers) and hidden singles until a fixed point.

    Modifies ``cands`` in place; returns False on a contradiction (a cell or a digit with no place left).
    """
    peers = _PEERS
    while True:
        while queue:
            i = queue.pop()
            b = cands[i]
            for p in peers[i]:
                m = cands[p]
                if m & b:
                    m ^= b
                    if not m:
                        return False
                    cands[p] = m
                    if not m & (m - 1):
                        queue.append(p)
        if not hidden:
            return True
        for unit in _UNIT_CELLS:
            once = twice = 0
            for i in unit:
                m = cands[i]
                twice |= once & m
                once |= m
            if once != _ALL:
                return False
            only = once & ~twice
            if only:
                for i in unit:
                    m = cands[i]
                    h = m & only
                    if h and m != h:
                        if h & (h - 1):  # two digits that can only go in this one cell
                            return False
                        cands[i] = h
                        queue.append(i)
        if not queue:
            return True


class _OutOfNodes(Exception):
    """The search visited the number of nodes it was allowed."""


def _search(cands: list[int], queue: list[int], limit: int, found: list[list[int]], rng=None,
            nodes: list[int] | None = None) -> None:
    """Depth-first search on the cell with the fewest candidates; appends solved masks to ``found``. ``nodes``
    (one count, decremented at every node) bounds the search: _OutOfNodes when it reaches 0."""
    if nodes is not None:
        nodes[0] -= 1
        if nodes[0] < 0:
            raise _OutOfNodes
    if not _propagate(cands, queue):
        return
    best, best_n = -1, 10
    pop = _POP
    for i in range(81):
        n = pop[cands[i]]
        if 1 < n < best_n:
            best, best_n = i, n
            if n == 2:
                break
    if best < 0:
        found.append(cands)
        return
    m = cands[best]
    bits = []
    while m:
        b = m & -m
        bits.append(b)
        m ^= b
    if rng is not None:
        rng.shuffle(bits)
    for b in bits:
        child = cands[:]
        child[best] = b
        _search(child, [best], limit, found, rng, nodes)
        if len(found) >= limit:
            return


def contradiction(givens: Board) -> str | None:
    """Why the givens have no solution, when constraint propagation alone shows it (naked and hidden singles to a
    fixed point, no search): "r1c9 can hold no digit: ...", "row 3 has no place for 7", "r4c5 and r4c8 would both have
    to hold 2". None otherwise: the puzzle may still have no solution, which only a search would tell. Clashing
    givens are the parser's to report."""
    text = to_string(givens)
    cands, queue = _initial(text)
    for i in queue:  # first what the givens alone rule out: the plainest reason
        for p in _PEERS[i]:
            if text[p] == "0":
                cands[p] &= ~cands[i]
    empty = next((p for p in range(81) if not cands[p]), None)
    if empty is not None:
        return f"{cell_name(empty)} can hold no digit: its row, column and box hold all nine"
    queue = [i for i in range(81) if not cands[i] & (cands[i] - 1)]
    while True:
        while queue:
            i = queue.pop()
            b = cands[i]
            for p in _PEERS[i]:
                if cands[p] == b:
                    return f"{cell_name(i)} and {cell_name(p)} would both have to hold {b.bit_length()}"
                if cands[p] & b:
                    cands[p] ^= b
                    if not cands[p] & (cands[p] - 1):
                        queue.append(p)
        for u, unit in enumerate(_UNIT_CELLS):
            once = twice = 0
            for i in unit:
                twice |= once & cands[i]
                once |= cands[i]
            if once != _ALL:
                digit = next(d for d in range(9) if not once >> d & 1) + 1
                return f"{_unit_label(u)} has no place for {digit}"
            only = once & ~twice
            for i in unit:
                h = cands[i] & only
                if h and cands[i] != h:
                    if h & (h - 1):
                        digits = " and ".join(str(d + 1) for d in range(9) if h >> d & 1)
                        return f"{_unit_label(u)} has only {cell_name(i)} for {digits}"
                    cands[i] = h
                    queue.append(i)
        if not queue:
            return None


def _to_text(cands: list[int]) -> str:
    return "".join(_DIGIT.get(m, "0") for m in cands)


def solve(givens: Board) -> str | None:
    """Return the (first found) solution of ``givens`` as an 81-digit string, or None if there is none."""
    cands, queue = _initial(to_string(givens))
    found: list[list[int]] = []
    _search(cands, queue, 1, found)
    return _to_text(found[0]) if found else None


def _count(givens: Board, limit: int, nodes: int | None) -> int:
    """Solutions of ``givens`` up to ``limit``; _OutOfNodes after ``nodes`` search nodes (None: no bound)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    cands, queue = _initial(to_string(givens))
    found: list[list[int]] = []
    _search(cands, queue, limit, found, nodes=None if nodes is None else [nodes])
    return len(found)


def count_solutions(givens: Board, limit: int = 2) -> int:
    """Number of solutions of ``givens``, counting stops at ``limit`` (``limit=2`` tests uniqueness)."""
    return _count(givens, limit, None)


def count_solutions_within(givens: Board, limit: int = 2, nodes: int = 2000) -> int | None:
    """`count_solutions` with at most ``nodes`` search nodes (each one constraint propagation): None when that was
    not enough to tell. The parser's check of every puzzle uses it, so that no puzzle holds it for long."""
    try:
        return _count(givens, limit, nodes)
    except _OutOfNodes:
        return None


def propagate_singles(givens: Board) -> str:
    """Fill what naked + hidden singles alone can fill (no search); blanks stay ``0``.

    This is the classical no-search baseline. If the givens contradict themselves (propagation reaches
    a dead end), the givens are returned unchanged.
    """
    text = to_string(givens)
    cands, queue = _initial(text)
    if not _propagate(cands, queue):
        return text
    return _to_text(cands)


# ----------------------------------------------------------------------------------------------------------
# generator


def _random_grid(rng: random.Random) -> list[int]:
    """A random complete grid (randomised backtracking from an empty board), as candidate masks."""
    cands = [_ALL] * 81
    digits = [1 << d for d in range(9)]
    rng.shuffle(digits)
    cands[:9] = digits  # a random first row, then randomised search fills the rest
    found: list[list[int]] = []
    _search(cands, list(range(9)), 1, found, rng)
    return found[0]


def _unique_without(cands_givens: list[int], cell: int, digit_mask: int) -> bool:
    """True when the puzzle stays unique after blanking ``cell`` (no solution puts another digit there)."""
    cands = cands_givens[:]
    cands[cell] = _ALL ^ digit_mask
    queue = [i for i, m in enumerate(cands) if m != _ALL and not m & (m - 1)]
    found: list[list[int]] = []
    _search(cands, queue, 1, found)
    return not found


def generate(
    n: int, min_givens: int = 22, max_givens: int = 34, seed: int = 0, max_attempts: int = 1000
) -> list[tuple[str, str]]:
    """Return ``n`` reproducible ``(puzzle, solution)`` pairs with a unique solution and givens in range.

    For each puzzle: draw a target givens count uniformly in ``[min_givens, max_givens]``, make a random
    full grid, blank cells in random order whenever the puzzle stays unique, stop at the target. When
    removal gets stuck above the target a new grid is tried; after 20 tries the lowest count reached is
    kept if it is at most ``max_givens``, otherwise tries go on (up to ``max_attempts``, then RuntimeError).
    Random removal rarely gets below ~22 givens: targets of 17-21 (allowed when ``max_givens >= 22``)
    end up at the lowest count reached, 22 or more; ``max_givens < 22`` raises a ValueError, and so does
    ``min_givens < 17`` (no such sudoku has a unique solution).
    The same ``seed`` always gives the same puzzles.
    """
    if n < 0 or max_attempts < 1:
        raise ValueError(f"n must be >= 0 and max_attempts >= 1, got n={n}, max_attempts={max_attempts}")
    if min_givens < MIN_UNIQUE_GIVENS:
        raise ValueError(
            f"min_givens={min_givens}: no sudoku with fewer than {MIN_UNIQUE_GIVENS} givens "
            "has a unique solution"
        )
    if max_givens < _LOWEST_REACHABLE:
        raise ValueError(
            f"max_givens={max_givens}: removing cells at random practically never leaves fewer than "
            f"{_LOWEST_REACHABLE} givens; use max_givens >= {_LOWEST_REACHABLE} (for 17-21 givens use a "
            "17-clue collection, e.g. the RRN data)"
        )
    if max_givens > 81 or min_givens > max_givens:
        raise ValueError(
            f"need {MIN_UNIQUE_GIVENS} <= min_givens <= max_givens <= 81, got {min_givens}, {max_givens}"
        )
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    order = list(range(81))
    for _ in range(n):
        target = rng.randint(min_givens, max_givens)
        best: tuple[int, list[int], list[int]] | None = None
        for attempt in range(1, max_attempts + 1):
            grid = _random_grid(rng)
            puzzle = grid[:]
            count = 81
            rng.shuffle(order)
            for cell in order:
                if count <= target:
                    break
                keep = puzzle[cell]
                puzzle[cell] = _ALL
                if _unique_without(puzzle, cell, keep):
                    count -= 1
                else:
                    puzzle[cell] = keep
            if best is None or count < best[0]:
                best = (count, puzzle, grid)
            if count <= target or (attempt >= _PATIENCE and best[0] <= max_givens):
                break
        if best is None or best[0] > max_givens:
            raise RuntimeError(
                f"could not reach at most {max_givens} givens in {max_attempts} attempts; "
                f"use a larger max_givens (random removal rarely goes below ~22 givens)"
            )
        _, puzzle, grid = best
        out.append((_to_text(puzzle), _to_text(grid)))
    return out
