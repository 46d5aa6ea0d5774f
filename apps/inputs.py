"""What the app accepts from the page and from API clients: a puzzle grid or pasted text, whole numbers, numbers
in a range and iteration counts, each checked once and refused with :class:`InputError` (a message worded for the
page, never a stack trace)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hyperset.config import MAX_ITERS, check_iterations
from hyperset.sudoku.board import PuzzleError, cell_name
from hyperset.sudoku.parse import Puzzle, parse_puzzles

__all__ = ["EMPTY_PUZZLE", "InputError", "clipped", "float_in", "grid_to_puzzle", "int_in", "iterations_in",
           "iterations_note", "puzzle_to_grid", "read_grid", "read_puzzles"]

class InputError(ValueError):
    """A problem with the user's input, worded for the page (never a stack trace)."""


_BLANK_CELLS = {"", "0", ".", "_", "*", "-"}
EMPTY_PUZZLE = "the puzzle is empty: enter some givens or load an example"


def puzzle_to_grid(puzzle: str) -> list[list[str]]:
    """81-character puzzle (0 = blank) -> 9 rows of 9 strings ("" = blank), a grid value API clients may send."""
    return [["" if ch == "0" else ch for ch in puzzle[r * 9:(r + 1) * 9]] for r in range(9)]


def _cell_text(value: Any, index: int) -> str:
    if value is None:
        return "0"
    if isinstance(value, bool):
        raise InputError(f"cell {cell_name(index)} holds {value!r}: enter one digit 1-9, or leave it empty")
    if isinstance(value, float):
        if math.isnan(value):
            return "0"
        if value.is_integer():
            value = int(value)
    text = str(value).strip()
    if text in _BLANK_CELLS:
        return "0"
    if len(text) == 1 and text in "123456789":
        return text
    shown = text if len(text) <= 12 else text[:12] + "..."
    raise InputError(f"cell {cell_name(index)} holds {shown!r}: enter one digit 1-9, or leave it empty")


def grid_to_puzzle(grid: Any) -> str:
    """The puzzle grid's value (as :func:`read_grid` reads it) -> an 81-character puzzle. Raises
    :class:`InputError` for a wrong shape, a bad cell or contradictory givens."""
    return read_grid(grid).givens


def read_grid(grid: Any) -> Puzzle:
    """The puzzle grid's value -> the parsed puzzle, with the parser's warnings (givens that leave a cell no digit,
    too few givens for a unique solution). The page's grid sends 81 characters (0 = blank); API clients may also
    send 9 rows of 9 cells (strings or numbers) or ``{"data": rows}``."""
    if grid is None:
        raise InputError("enter a puzzle in the grid (or paste one and press 'Put text in the grid')")
    if isinstance(grid, str):
        if len(grid) != 81:
            raise InputError(f"the grid must be 81 cells (0 or . for blanks); got {len(grid):,} characters")
        grid = [list(grid[r * 9:(r + 1) * 9]) for r in range(9)]
    if isinstance(grid, dict):
        grid = grid.get("data")
    if isinstance(grid, np.ndarray):
        grid = grid.tolist()
    if not isinstance(grid, (list, tuple)) or not all(isinstance(row, (list, tuple)) for row in grid):
        raise InputError("the grid must be 9 rows of 9 cells")
    if len(grid) != 9 or any(len(row) != 9 for row in grid):
        widths = sorted({len(row) for row in grid})
        raise InputError(f"the grid must be 9 rows of 9 cells; found {len(grid)} rows of "
                         f"{'/'.join(map(str, widths)) or 0} cells")
    puzzle = "".join(_cell_text(v, r * 9 + c) for r, row in enumerate(grid) for c, v in enumerate(row))
    if puzzle == "0" * 81:
        raise InputError(EMPTY_PUZZLE)
    try:
        return parse_puzzles(puzzle, "grid")[0]
    except PuzzleError as err:  # contradictory givens, with the unit and the cells
        raise InputError(f"the givens contradict each other: {err.reason}") from None


def read_puzzles(text: str, source: str) -> list[Any]:
    """The puzzles of pasted text, at least the first: a mistake after the first puzzle ends the list there
    instead of refusing the text (the app uses the first; the rest are counted for a note)."""
    try:
        return parse_puzzles(text, source)
    except PuzzleError as err:
        if err.line is None or err.line <= 1:
            raise
        try:  # the puzzles before the line at fault, if those lines hold any whole puzzle
            before = parse_puzzles("\n".join(text.splitlines()[: err.line - 1]), source)
        except PuzzleError:
            raise err from None
        return before


def int_in(value: Any, low: int, high: int, name: str) -> int:
    """A whole number from ``low`` to ``high`` (4.0 is 4; 1.5 is refused, never rounded)."""
    try:
        if isinstance(value, bool):
            raise TypeError(name)
        f = float(value)
        if not f.is_integer():  # also inf and nan
            raise ValueError(name)
        v = int(f)
    except (TypeError, ValueError):  # "abc", 1.5, inf, nan
        raise InputError(f"{name} must be a whole number from {low} to {high}") from None
    if not low <= v <= high:
        raise InputError(f"{name} must be from {low} to {high} (got {v})")
    return v


def float_in(value: Any, low: float, high: float, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number from {low} to {high}") from None
    if not (low <= v <= high):  # also rejects NaN
        raise InputError(f"{name} must be from {low} to {high} (got {v})")
    return v


def clipped(text: str, limit: int = 200) -> str:
    """``text`` cut in the middle to at most about ``limit`` characters (a message quoting a client's value)."""
    return text if len(text) <= limit else f"{text[:limit // 2]} ... {text[-limit // 3:]}"


def iterations_in(value: Any, limit: int = MAX_ITERS, cli: str = "hyperset-solve --iters") -> int:
    """An iteration count from the page or an API client, checked as the CLI checks one
    (``hyperset.config.check_iterations``: a whole number from 1 to ``MAX_ITERS``; an integral float such as JSON's
    16.0 counts, 1.5 does not), and at most ``limit`` where a control runs fewer (the message names ``cli``).
    Raises :class:`InputError`."""
    try:
        n = check_iterations(int(value) if isinstance(value, float) and value.is_integer() else value, "iterations")
    except ValueError as err:
        raise InputError(clipped(str(err))) from None
    if n > limit:
        raise InputError(f"iterations = {n}: the app runs at most {limit:,} here ({cli} takes up to {MAX_ITERS:,})")
    return n


def iterations_note(value: Any, limit: int = MAX_ITERS, cli: str = "hyperset-solve --iters") -> str:
    """The note beside an iterations control as a value is typed: why it will not run, or "" when it will (or the
    field is empty: the default runs)."""
    if value is None or value == "":
        return ""
    try:
        iterations_in(value, limit, cli)
    except InputError as err:
        return f"**Out of range:** {err}."
    return ""
