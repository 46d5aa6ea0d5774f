"""Sudoku boards: the grid's cells and units, conversions, formatting, conflict checks and validation.

A *board* is either an 81-character string of digits (``0`` = blank), row-major, or an integer numpy
array of shape ``(81,)`` (``0`` = blank). :func:`to_string` and :func:`to_array` convert between them.
Cells are numbered ``0..80`` row-major; messages name them ``r<row>c<col>`` with 1-based rows/columns.
Reading puzzles from text and files is :mod:`hyperset.sudoku.parse`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Board",
    "PuzzleError",
    "Verdict",
    "BLANK_CHARS",
    "MIN_UNIQUE_GIVENS",
    "UNITS",
    "cell_name",
    "conflicts",
    "format_grid",
    "to_array",
    "to_string",
    "validate",
]

Board = str | np.ndarray | Sequence[int]

#: Characters accepted for a blank cell in text input.
BLANK_CHARS = "0._*xX"
#: No sudoku with fewer givens has a unique solution (McGuire et al., 2012).
MIN_UNIQUE_GIVENS = 17

_ROWS = tuple(tuple(r * 9 + c for c in range(9)) for r in range(9))
_COLS = tuple(tuple(r * 9 + c for r in range(9)) for c in range(9))
_BOXES = tuple(
    tuple((br * 3 + i) * 9 + bc * 3 + j for i in range(3) for j in range(3))
    for br in range(3)
    for bc in range(3)
)
#: The 27 units (9 rows, 9 columns, 9 boxes) as tuples of cell indices.
UNITS: tuple[tuple[int, ...], ...] = _ROWS + _COLS + _BOXES


_GIVEN_STYLE = "\x1b[1m"
_FILLED_STYLE = "\x1b[36m"
_RESET = "\x1b[0m"


class PuzzleError(ValueError):
    """A puzzle input that cannot be used, with where (``source``, ``line``) and why (``reason``)."""

    def __init__(self, source: str, line: int | None, reason: str) -> None:
        self.source = source
        self.line = line
        self.reason = reason
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):  # keep the exception picklable (multiprocessing, pytest-xdist)
        return (type(self), (self.source, self.line, self.reason))


@dataclass
class Verdict:
    """Result of :func:`validate`. ``valid`` means a complete, conflict-free grid that keeps every given."""

    valid: bool
    complete: bool
    conflicting_cells: list[int]
    changed_givens: list[int]
    reason: str

    def __bool__(self) -> bool:
        return self.valid


def cell_name(cell: int) -> str:
    """Human name of cell index ``0..80``, e.g. ``r1c3``."""
    return f"r{cell // 9 + 1}c{cell % 9 + 1}"


# ----------------------------------------------------------------------------------------------------------
# conversions


def to_string(board: Board) -> str:
    """Return ``board`` as an 81-character digit string (``0`` = blank)."""
    if isinstance(board, str):
        if len(board) != 81:
            raise PuzzleError("<board>", None, f"expected 81 cells, found {len(board)}")
        if board.isascii() and board.isdigit():
            return board
        out = []
        for col, ch in enumerate(board, start=1):
            if ch in "123456789":
                out.append(ch)
            elif ch in BLANK_CHARS:
                out.append("0")
            else:
                raise PuzzleError("<board>", None, f"unexpected character {ch!r} at column {col}")
        return "".join(out)
    arr = np.asarray(board)
    if arr.size != 81:
        raise PuzzleError("<board>", None, f"expected 81 cells, found {arr.size}")
    arr = arr.reshape(81)
    if not np.issubdtype(arr.dtype, np.integer):
        raise PuzzleError("<board>", None, f"expected integer cells, got dtype {arr.dtype}")
    bad = np.nonzero((arr < 0) | (arr > 9))[0]
    if bad.size:
        i = int(bad[0])
        raise PuzzleError("<board>", None, f"cell {cell_name(i)} holds {int(arr[i])}, expected 0-9")
    return "".join(chr(48 + int(v)) for v in arr)


def to_array(board: Board) -> np.ndarray:
    """Return ``board`` as a uint8 array of shape ``(81,)`` (``0`` = blank)."""
    if isinstance(board, str):
        return np.frombuffer(to_string(board).encode("ascii"), dtype=np.uint8) - np.uint8(48)
    arr = np.asarray(board)
    if arr.size == 81 and np.issubdtype(arr.dtype, np.integer) and arr.min() >= 0 and arr.max() <= 9:
        return arr.reshape(81).astype(np.uint8)
    return to_array(to_string(arr))  # raises a PuzzleError naming the problem


# ----------------------------------------------------------------------------------------------------------
# conflicts and validation


def _unit_label(u: int) -> str:
    kind = ("row", "column", "box")[u // 9]
    return f"{kind} {u % 9 + 1}"


def _pair_label(u: int, a: int, b: int) -> str:
    if u < 9:
        return f"columns {a % 9 + 1} and {b % 9 + 1}"
    if u < 18:
        return f"rows {a // 9 + 1} and {b // 9 + 1}"
    return f"{cell_name(a)} and {cell_name(b)}"


def _first_duplicate(cells: Sequence[int]) -> tuple[int, int, int, int] | None:
    """First (unit, digit, cell_a, cell_b) with a repeated nonzero digit, or None."""
    for u, unit in enumerate(UNITS):
        seen: dict[int, int] = {}
        for i in unit:
            d = cells[i]
            if d:
                if d in seen:
                    return u, d, seen[d], i
                seen[d] = i
    return None


def conflicts(board: Board) -> list[tuple[int, int]]:
    """Pairs ``(a, b)`` with ``a < b`` of cells holding the same nonzero digit in one row, column or box."""
    cells = to_array(board).tolist()
    pairs: set[tuple[int, int]] = set()
    for unit in UNITS:
        digits = [cells[a] for a in unit if cells[a]]
        if len(digits) == len(set(digits)):  # no digit twice: no pair to look for
            continue
        for x, a in enumerate(unit):
            d = cells[a]
            if d:
                for b in unit[x + 1 :]:
                    if cells[b] == d:
                        pairs.add((min(a, b), max(a, b)))
    return sorted(pairs)


def validate(board: Board, givens: Board) -> Verdict:
    """Check a solver's output: every cell 1-9, every unit a permutation of 1..9, every given kept.

    ``givens`` must be a well-formed board (a :class:`PuzzleError` is raised otherwise); a malformed
    ``board`` (wrong size, values outside 0-9) gives an invalid verdict instead of an exception.
    """
    g = to_array(givens)
    try:
        b = to_array(board)
    except PuzzleError as err:
        return Verdict(False, False, [], [], err.reason)
    blanks = int(np.count_nonzero(b == 0))
    pairs = conflicts(b)
    conflicting = sorted({c for pair in pairs for c in pair})
    changed = [int(i) for i in np.nonzero((g != 0) & (b != g))[0]]
    problems = []
    if blanks:
        problems.append(f"{blanks} blank cell{'s' if blanks != 1 else ''}")
    if pairs:
        a, c = pairs[0]
        more = (
            f" (and {len(pairs) - 1} more conflicting pair{'s' if len(pairs) > 2 else ''})"
            if len(pairs) > 1
            else ""
        )
        problems.append(f"{cell_name(a)} and {cell_name(c)} both hold {int(b[a])}{more}")
    if changed:
        i = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        problems.append(f"given at {cell_name(i)} changed from {int(g[i])} to {int(b[i]) or 'blank'}{more}")
    valid = not problems
    return Verdict(
        valid=valid,
        complete=blanks == 0,
        conflicting_cells=conflicting,
        changed_givens=changed,
        reason="valid solution" if valid else "; ".join(problems),
    )


# ----------------------------------------------------------------------------------------------------------
# formatting


def format_grid(board: Board, givens: Board | None = None, color: bool = False) -> str:
    """Return a readable 9x9 grid with ``|`` and ``------+-------+------`` separators; blanks are ``.``.

    With ``givens`` and ``color=True``, givens are bold and filled-in cells cyan (ANSI escapes). Plain
    text (``color=False``) prints every digit the same way: markers next to digits hurt readability more
    than they help, so print the puzzle grid next to the solution when the distinction matters.
    """
    cells = to_array(board).tolist()
    given_mask = to_array(givens).tolist() if givens is not None else [0] * 81
    lines = []
    for r in range(9):
        if r in (3, 6):
            lines.append("------+-------+------")
        parts = []
        for c in range(9):
            if c in (3, 6):
                parts.append("|")
            i = r * 9 + c
            d = cells[i]
            text = str(d) if d else "."
            if color and d and givens is not None:
                style = _GIVEN_STYLE if given_mask[i] else _FILLED_STYLE
                text = f"{style}{text}{_RESET}"
            parts.append(text)
        lines.append(" ".join(parts))
    return "\n".join(lines)
