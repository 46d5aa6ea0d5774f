"""Sudoku-Extreme (``sapientinc/sudoku-extreme`` on the Hugging Face Hub), the benchmark of HRM, TRM and
chenglou/sudoku-solver: fetched by name into the cache, checked, and read with its ratings.

    from hyperset.sudoku import extreme

    path = extreme.cached_split("test", download=True)   # fetched once (a progress bar), then found in the cache
    data = extreme.load(path)                           # puzzles, solutions (n, 81) uint8, ratings (n,)

Its two files, ``train.csv`` (3.8 M puzzles) and ``test.csv`` (423 k), begin with the header
``source,question,answer,rating``; each line then holds where the puzzle came from, the puzzle (81 cells, ``.`` for
a blank), its solution (81 digits) and its rating: how many times the dataset's reference solver backtracked (0:
no guess needed). Reports group the ratings in :data:`hyperset.sudoku.rated.BUCKETS`.

``$HYPERSET_SUDOKU_EXTREME_URL`` replaces the Hub's folder URL (a mirror, or a ``file://`` folder); the files are
kept in :func:`hyperset.download.cache_dir` ``/sudoku-extreme`` with a record of their sha256
(:func:`hyperset.download.cached`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..download import cache_dir, cached
from .board import PuzzleError, validate
from .data import _invalid_rows, _read_lines

__all__ = ["HEADER", "NAME", "SPLITS", "URL", "URL_ENV", "RatedBoards", "cached_split", "load", "problem",
           "split_path", "split_url"]

NAME = "sudoku-extreme"  # what --data takes
URL = "https://huggingface.co/datasets/sapientinc/sudoku-extreme/resolve/main"
URL_ENV = "HYPERSET_SUDOKU_EXTREME_URL"
SPLITS = ("train", "test")
HEADER = "source,question,answer,rating"
_MAX_RATING_DIGITS = 18  # fits int64
_ROW = 164  # question, ",", answer, "," after the source
_DIGITS = np.arange(256, dtype=np.uint8) - np.uint8(ord("0"))  # byte -> digit; "." -> 0 (blank); else above 9
_DIGITS[ord(".")] = 0


@dataclass
class RatedBoards:
    """Puzzles and solutions, (n, 81) uint8 each (0 = blank), and each puzzle's rating, (n,) int64."""

    puzzles: np.ndarray
    solutions: np.ndarray
    ratings: np.ndarray

    def __len__(self) -> int:
        return len(self.puzzles)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"Sudoku-Extreme has the splits {', '.join(SPLITS)}, not {split!r}")


def split_url(split: str) -> str:
    """Where the split's file is fetched from (``$HYPERSET_SUDOKU_EXTREME_URL``, else the Hub)."""
    _check_split(split)
    return f"{(os.environ.get(URL_ENV) or URL).rstrip('/')}/{split}.csv"


def split_path(split: str) -> Path:
    """Where the split's file is kept in the cache."""
    _check_split(split)
    return cache_dir() / NAME / f"{split}.csv"


def cached_split(split: str, download: bool = False, progress: bool | None = None) -> Path:
    """The split's file in the cache, fetched first (`download`) when it is not there; see
    :func:`hyperset.download.cached` for the checks and the errors."""
    return cached(split_url(split), split_path(split), f"Sudoku-Extreme {split}.csv", problem, download=download,
                  progress=progress)


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _row_problem(fields: list[bytes]) -> str:
    """Why the fields of one line are not ``source,question,answer,rating``."""
    if len(fields) != 4:
        return f"expected 4 comma-separated fields ({HEADER}), found {len(fields)}"
    for name, cells, allowed in (("question", fields[1], "0123456789."), ("answer", fields[2], "123456789")):
        if len(cells) != 81:
            return f"{name}: expected 81 cells, found {len(cells)}"
        for i, ch in enumerate(_text(cells), start=1):
            if ch not in allowed:
                expected = "1-9, or 0 or . for a blank" if name == "question" else "1-9"
                return f"{name}: unexpected character {ch!r} at position {i} (expected {expected})"
    return f"rating: expected a whole number >= 0, found {_text(fields[3])[:40]!r}"


def load(path: str | os.PathLike) -> RatedBoards:
    """Every puzzle of a Sudoku-Extreme CSV (plain or gzipped), checked: the header, four fields a line, 81 cells
    each, every answer a solution of its question (a valid grid keeping every given), a rating >= 0. Raises
    :class:`PuzzleError` (file, line, why) for the first line that is not."""
    path = Path(path)
    source = str(path)
    data = _read_lines(path, None)
    if b"\r" in data:
        data = data.replace(b"\r", b"")
    header, _, body = data.partition(b"\n")
    if _text(header).strip() != HEADER:
        raise PuzzleError(source, 1, f"expected the header {HEADER!r}, found {_text(header)[:60]!r}")
    body = body.rstrip(b"\n")
    if not body:
        raise PuzzleError(source, None, "holds no puzzles (only the header)")
    return _parse(body, source)


def _parse(body: bytes, source: str) -> RatedBoards:
    """The rows of `body` (the lines after the header), parsed with array operations: no Python object per line
    for the 3.8 M lines of train.csv."""
    buf = np.frombuffer(body + b"\n" + bytes(_ROW), dtype=np.uint8)  # padded: a row's window fits after any comma
    ends = np.flatnonzero(buf == ord("\n"))  # (n,): row k is buf[starts[k]:ends[k]], line k + 2 of the file
    starts = np.concatenate(([0], ends[:-1] + 1))
    commas = np.flatnonzero(buf == ord(","))
    first = np.searchsorted(commas, starts)
    ok = np.searchsorted(commas, ends) - first == 3
    after_source = np.append(commas, 0)[first]  # the first comma of each row (0 where it has none)
    rows = sliding_window_view(buf, _ROW)[after_source + 1]  # (n, 164): question, ",", answer, ","
    ok &= (rows[:, 81] == ord(",")) & (rows[:, 163] == ord(","))
    q, a = _DIGITS[rows[:, :81]], _DIGITS[rows[:, 82:163]]
    ok &= (q.max(1) <= 9) & (a.min(1) >= 1) & (a.max(1) <= 9)
    rating_at = after_source + 1 + _ROW
    digits = ends - rating_at
    ok &= (digits >= 1) & (digits <= _MAX_RATING_DIGITS)
    ratings = np.zeros(len(ends), dtype=np.int64)
    for i in range(int(digits[ok].max(initial=0))):
        has = ok & (i < digits)
        d = buf[np.where(has, rating_at + i, 0)].astype(np.int64) - ord("0")
        ok &= ~has | ((d >= 0) & (d <= 9))
        ratings = np.where(has, 10 * ratings + d, ratings)
    if not ok.all():
        k = int(np.argmin(ok))
        raise PuzzleError(source, k + 2, _row_problem(body[starts[k]:ends[k]].split(b",")))
    invalid = _invalid_rows(q, a)
    if invalid.size:
        k = int(invalid[0])
        verdict = validate("".join(map(str, a[k])), "".join(map(str, q[k])))
        raise PuzzleError(source, k + 2, f"answer is not a solution of the question: {verdict.reason}")
    return RatedBoards(q, a, ratings)


def problem(path: str | os.PathLike) -> str | None:
    """Why `path` is not a Sudoku-Extreme CSV (the first bad line and why), or None when it is one."""
    try:
        load(path)
    except PuzzleError as e:
        return e.reason if e.line is None else f"line {e.line}: {e.reason}"
    return None
