"""Rated hard puzzles: minimal Sudoku puzzles, rated by how often a backtracking solver has to take a guess back.

**The rating** of a puzzle is the number of dead ends in the whole search tree of a backtracking solver that
places naked and hidden singles between nodes (the exact checks of the solver's search strategy) and branches on
the first cell with the fewest candidates, every branch followed to its end. 0 means singles alone solve it.
Searching the whole tree, not stopping at the solution, makes the count a property of the puzzle: it does not
depend on the names of the digits. ``propagation="naked"`` rates a plainer solver (naked singles alone), for
which most minimal puzzles need dozens of guesses.

**The buckets** follow Sudoku-Extreme's: ``0``, ``1-2``, ``3-10``, ``11-50``, ``51+``.

**The generator** makes a random full grid and blanks its cells in a random order wherever the solution stays
unique (a minimal puzzle). While the rating lies outside the wanted range, a move swaps a given for another cell
of the solution and makes the puzzle minimal again, kept when the rating comes no further from the range. In the
range a puzzle is written out; the climb then goes on (every kept move staying in the range) and writes the next
puzzle after SPACING more kept moves, CHUNK puzzles per climb, unless reaching the range took no more moves than
that (then each puzzle gets a grid of its own). A new grid also after PATIENCE moves without progress. Puzzles
of one climb share their solution grid and differ in a few givens each; chunk ``k`` of a collection depends on
``(seed, range, propagation, k)`` alone, so any slice can be made again. It runs in C (``sudoku/rated.c``,
compiled on first use as :mod:`hyperset.cbuild` says); without a compiler the same algorithm runs in Python with
the same puzzles, tens of times slower.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from .. import cbuild
from . import exact
from .exact import _propagate

__all__ = ["BUCKETS", "RatedPuzzle", "bucket_of", "bucket_range", "generate_rated", "iter_rated", "rate"]

BUCKETS = ("0", "1-2", "3-10", "11-50", "51+")
PROPAGATIONS = ("naked", "singles")
SOURCE = Path(__file__).resolve().parent / "rated.c"
FLAGS = ("-O2", "-std=c11", "-shared", "-fPIC")
RATE_NODES = 10_000_000  # a rating's search is bounded; no minimal puzzle seen came near it
# the lowest rating hyperset-generate takes: reaching a range gets steeply slower with its lowest rating (measured
# in docs/cli.md, "Errors and limits")
MAX_LOWEST_RATING = 250
PATIENCE = 3000  # moves without progress before a new grid
MAX_MOVES = 100_000_000
CHUNK = 16  # puzzles per climb
SPACING = 4  # kept moves between two puzzles of one climb

_ALL = 0x1FF
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class RatedPuzzle:
    """A minimal puzzle (81 digits, 0 = blank), its unique solution and its rating."""

    puzzle: str
    solution: str
    rating: int

    @property
    def bucket(self) -> str:
        return bucket_of(self.rating)


def bucket_range(bucket: str) -> tuple[int, int | None]:
    """(lowest, highest or None) rating of a bucket name, or of a range written ``"A-B"`` or ``"A+"``."""
    text = bucket.strip()
    try:
        if text.endswith("+"):
            lo, hi = int(text[:-1]), None
        elif "-" in text:
            a, b = text.split("-", 1)
            lo, hi = int(a), int(b)
        else:
            lo = hi = int(text)
    except ValueError:
        raise ValueError(f"bucket {bucket!r}: expected one of {', '.join(BUCKETS)}, or a range like 5-20 or 100+"
                         ) from None
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"bucket {bucket!r}: the range must be 0 <= lowest <= highest")
    return lo, hi


def bucket_of(rating: int) -> str:
    """The name of the bucket a rating falls in."""
    for name in BUCKETS:
        lo, hi = bucket_range(name)
        if rating >= lo and (hi is None or rating <= hi):
            return name
    raise ValueError(f"rating must be >= 0, got {rating}")


# ---------------------------------------------------------------------------------------------------------------
# the C library, else the same algorithm in Python

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_why_not: str | None = None


def _library() -> ctypes.CDLL | None:
    global _lib, _why_not
    with _lock:
        if _lib is None and _why_not is None:
            try:
                lib = cbuild.load(SOURCE, FLAGS)
            except cbuild.BuildError as e:
                _why_not = str(e)
            else:
                i64, p = ctypes.c_int64, ctypes.c_char_p
                lib.hs_generate.argtypes = [ctypes.c_uint64, i64, i64, ctypes.c_int, i64, i64, i64, i64, i64, p, p,
                                            ctypes.POINTER(i64)]
                lib.hs_generate.restype = i64
                lib.hs_rate.argtypes = [p, ctypes.c_int, i64]
                lib.hs_rate.restype = i64
                lib.hs_count.argtypes = [p, ctypes.c_int, ctypes.c_int, i64, p, ctypes.POINTER(i64)]
                lib.hs_count.restype = ctypes.c_int
                _lib = lib
    return _lib


def engine() -> str:
    """"c", or "python (why)" where the C library cannot be had."""
    return "c" if _library() is not None else f"python ({_why_not})"


class _Random:
    """splitmix64, as the C library draws it."""

    def __init__(self, state: int):
        self.state = state & _MASK

    def below(self, n: int) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return ((z ^ (z >> 31)) >> 11) % n

    def shuffle(self, a: list) -> None:
        for i in range(len(a) - 1, 0, -1):
            j = self.below(i + 1)
            a[i], a[j] = a[j], a[i]


class _OutOfNodes(Exception):
    pass


class _PySearch:
    """The C library's search: dead ends counted, the first solution kept, at most `limit` solutions (0: all)."""

    def __init__(self, limit: int, hidden: bool, nodes: int, rng: _Random | None = None):
        self.limit, self.hidden, self.nodes, self.rng = limit, hidden, nodes, rng
        self.dead = self.found = 0
        self.first: list[int] | None = None

    def run(self, c: list[int], queue: list[int]) -> None:
        self.nodes -= 1
        if self.nodes < 0:
            raise _OutOfNodes
        if not _propagate(c, queue, self.hidden):
            self.dead += 1
            return
        best, best_n = -1, 10
        for i in range(81):
            n = bin(c[i]).count("1")
            if 1 < n < best_n:
                best, best_n = i, n
                if n == 2:
                    break
        if best < 0:
            if self.found == 0:
                self.first = c
            self.found += 1
            return
        m, bits = c[best], []
        while m:
            bits.append(m & -m)
            m &= m - 1
        if self.rng is not None:
            self.rng.shuffle(bits)
        for b in bits:
            child = c[:]
            child[best] = b
            self.run(child, [best])
            if self.limit and self.found >= self.limit:
                return


def _start(board: list[int]) -> tuple[list[int], list[int]]:
    return [1 << (d - 1) if d else _ALL for d in board], [i for i, d in enumerate(board) if d]


def _digits(c: list[int]) -> list[int]:
    return [m.bit_length() for m in c]


def _py_count(board: list[int], limit: int, hidden: bool, nodes: int = 1 << 62) -> _PySearch:
    s = _PySearch(limit, hidden, nodes)
    s.run(*_start(board))
    return s


def _py_rate(board: list[int], hidden: bool, nodes: int = RATE_NODES) -> int:
    try:
        s = _py_count(board, 0, hidden, nodes)
    except _OutOfNodes:
        return -2
    return s.dead if s.found == 1 else -1


def _py_forced(puzzle: list[int], cell: int, digit: int) -> bool:
    c, queue = _start(puzzle)
    c[cell] = _ALL ^ (1 << (digit - 1))
    if not c[cell] & (c[cell] - 1):
        queue.append(cell)
    s = _PySearch(1, True, 1 << 62)
    s.run(c, queue)
    return s.found == 0


def _py_minimize(rng: _Random, puzzle: list[int], grid: list[int]) -> None:
    order = [i for i in range(81) if puzzle[i]]
    rng.shuffle(order)
    for i in order:
        puzzle[i] = 0
        if not _py_forced(puzzle, i, grid[i]):
            puzzle[i] = grid[i]


def _distance(r: int, lo: int, hi: int) -> int:
    return lo - r if r < lo else r - hi if r > hi else 0


def _py_generate(seed: int, lo: int, hi: int, hidden: bool, patience: int, max_moves: int, count: int,
                 spacing: int) -> list[tuple[list[int], list[int], int]] | None:
    """hs_generate of the C library, step for step."""
    rng = _Random(seed)
    hi = (1 << 63) - 1 if hi < 0 else hi
    moves, out = 0, []
    while len(out) < count:
        if moves > max_moves:
            return None
        s = _PySearch(1, True, 1 << 62, rng)
        s.run([_ALL] * 81, [])
        assert s.first is not None
        grid = _digits(s.first)
        cur = grid[:]
        _py_minimize(rng, cur, grid)
        r = _py_rate(cur, hidden)
        d = (1 << 63) if r < 0 else _distance(r, lo, hi)
        stall, since, climb = 0, spacing, 0
        while len(out) < count and stall < patience and moves < max_moves:
            if d == 0 and since >= spacing and all(cur != p for p, _, _ in out):
                out.append((cur, grid, r))
                since = stall = 0
                if climb <= spacing:
                    break
                continue
            climb, moves, stall = climb + 1, moves + 1, stall + 1
            given = [i for i in range(81) if cur[i]]
            blank = [i for i in range(81) if not cur[i]]
            nxt = cur[:]
            nxt[given[rng.below(len(given))]] = 0
            add = blank[rng.below(len(blank))]
            nxt[add] = grid[add]
            if _py_count(nxt, 2, True).found != 1:
                continue
            _py_minimize(rng, nxt, grid)
            r2 = _py_rate(nxt, hidden)
            if r2 < 0:
                continue
            d2 = _distance(r2, lo, hi)
            if d2 <= d and nxt != cur:
                if d2 < d:
                    stall = 0
                cur, r, d, since = nxt, r2, d2, since + 1
        moves += 1
    return out


# ---------------------------------------------------------------------------------------------------------------
# the public functions


def _board(puzzle: str) -> list[int]:
    from .board import to_string

    return [int(ch) for ch in to_string(puzzle)]


def count_solutions_within(givens: Any, limit: int = 2, nodes: int = 2000) -> int | None:
    """`hyperset.sudoku.exact.count_solutions_within` (solutions up to `limit`, None past `nodes` search nodes) in
    the C library where it can be had: the same search, node for node (naked and hidden singles between nodes, the
    cell with the fewest candidates, its digits in increasing order), so the same answers, about a hundred times
    sooner on the hardest puzzles. The parser's check of every puzzle runs it."""
    lib = _library()
    if lib is None:
        return exact.count_solutions_within(givens, limit, nodes)
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    found = lib.hs_count(bytes(_board(givens)), int(limit), 1, int(nodes), None, None)
    return None if found < 0 else found


def _hidden(propagation: str) -> bool:
    if propagation not in PROPAGATIONS:
        raise ValueError(f"propagation {propagation!r}: expected one of {', '.join(PROPAGATIONS)}")
    return propagation == "singles"


def rate(puzzle: str, propagation: str = "singles") -> int:
    """The rating of a puzzle with a unique solution (see the module's docstring); ValueError for a puzzle with
    no solution or several."""
    board, hidden = _board(puzzle), _hidden(propagation)
    lib = _library()
    if lib is not None:
        r = lib.hs_rate(bytes(board), int(hidden), RATE_NODES)
    else:
        r = _py_rate(board, hidden)
    if r == -1:
        raise ValueError("the puzzle has no unique solution: only such puzzles are rated")
    if r == -2:
        raise ValueError(f"rating the puzzle took more than {RATE_NODES:,} search nodes")
    return int(r)


def _chunk_seed(seed: int, lo: int, hi: int | None, hidden: bool, chunk: int) -> int:
    key = f"hyperset-rated:{seed}:{lo}:{'' if hi is None else hi}:{int(hidden)}:{chunk}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "little")


def _chunk(seed: int, lo: int, hi: int | None, hidden: bool, chunk: int) -> list[RatedPuzzle]:
    """The CHUNK puzzles of one climb (see the module's docstring)."""
    state = _chunk_seed(seed, lo, hi, hidden, chunk)
    h = -1 if hi is None else hi
    lib = _library()
    if lib is not None:
        p, s = ctypes.create_string_buffer(81 * CHUNK), ctypes.create_string_buffer(81 * CHUNK)
        r = (ctypes.c_int64 * CHUNK)()
        moves = lib.hs_generate(state, lo, h, int(hidden), PATIENCE, MAX_MOVES, RATE_NODES, CHUNK, SPACING, p, s, r)
        out = None if moves < 0 else [(list(p.raw[81 * k: 81 * k + 81]), list(s.raw[81 * k: 81 * k + 81]), r[k])
                                      for k in range(CHUNK)]
    else:
        out = _py_generate(state, lo, h, hidden, PATIENCE, MAX_MOVES, CHUNK, SPACING)
    if out is None:
        raise RuntimeError(f"no puzzles rated {lo}{'+' if hi is None else f'-{hi}'} found in {MAX_MOVES:,} moves "
                           f"(chunk {chunk} of seed {seed})")
    return [RatedPuzzle("".join(map(str, pz)), "".join(map(str, sol)), int(rating)) for pz, sol, rating in out]


def iter_rated(n: int, bucket: str = "51+", seed: int = 0, propagation: str = "singles", start: int = 0
               ) -> Iterator[RatedPuzzle]:
    """Puzzles ``start`` .. ``start + n - 1`` of the collection (`bucket`, `seed`, `propagation`), one at a time."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a whole number >= 0, got {n!r}")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be a whole number >= 0, got {start!r}")
    lo, hi = bucket_range(bucket)
    hidden = _hidden(propagation)
    i, end = start, start + n
    while i < end:
        chunk = _chunk(seed, lo, hi, hidden, i // CHUNK)
        for p in chunk[i % CHUNK: min(CHUNK, i % CHUNK + end - i)]:
            yield p
            i += 1


def generate_rated(n: int, bucket: str = "51+", seed: int = 0, propagation: str = "singles", start: int = 0
                   ) -> list[RatedPuzzle]:
    """`n` minimal puzzles whose rating lies in `bucket` (a name of BUCKETS, or a range like ``"5-20"`` or
    ``"100+"``), the same for the same arguments."""
    return list(iter_rated(n, bucket, seed, propagation, start))


def main(argv: list[str] | None = None) -> None:
    """``hyperset-generate``: rated minimal puzzles as ``puzzle,solution`` lines (what ``hyperset-solve`` and
    ``hyperset-train`` read), with ``--ratings`` a third column."""
    import argparse
    import contextlib
    import os
    import sys

    from ..files import package_version

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:  # one line, as every hyperset command's usage errors
            from ..cli_options import error_line

            sys.stderr.write(error_line(self.prog, message) + "\n")
            sys.exit(2)

        def _print_message(self, message: str, file: Any = None) -> None:
            if message:  # argparse drops a failed write (--help into /dev/full: exit 0); here it is an error
                (file or sys.stderr).write(message)

    ap = Parser(prog="hyperset-generate", description="Generate rated minimal Sudoku puzzles as "
                                 "'puzzle,solution' lines (0 = blank), the same for the same seed.")
    ap.add_argument("-n", "--count", type=int, default=100, help="how many puzzles (default 100)")
    ap.add_argument("-b", "--bucket", default="51+",
                    help=f"rating range: {', '.join(BUCKETS)}, or A-B, or A+ (default 51+; A at most "
                         f"{MAX_LOWEST_RATING:,}). The time grows steeply with the lowest rating: 51+ takes a fraction "
                         "of a second per puzzle, 200+ and above minutes per 16")
    ap.add_argument("-s", "--seed", type=int, default=0, help="the collection's seed (default 0)")
    ap.add_argument("--start", type=int, default=0, help="the index of the first puzzle (default 0)")
    ap.add_argument("--propagation", choices=PROPAGATIONS, default="singles",
                    help="what the rating solver places between guesses (default singles: naked and hidden)")
    ap.add_argument("--ratings", action="store_true", help="add the rating as a third column")
    ap.add_argument("-o", "--out", default=None, help="write to this file (default, or -: standard output)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    ap.add_argument("-V", "--version", action="version", version=f"hyperset-generate {package_version()}")
    args = ap.parse_args(argv)
    if args.count < 0 or args.start < 0:
        ap.error("--count and --start must be >= 0")
    try:
        lowest = bucket_range(args.bucket)[0]
    except ValueError as e:
        ap.error(str(e))
    if lowest > MAX_LOWEST_RATING:
        ap.error(f"--bucket {args.bucket}: a lowest rating above {MAX_LOWEST_RATING:,} is out of the generator's "
                 "reach (the time to reach a range grows steeply with its lowest rating: see --help)")
    from ..files import atomic_writer, replace_problem

    if args.out == "-":  # as for every reader and writer of files: standard output
        args.out = None
    if args.out is not None and not args.out.strip():
        ap.error("--out: an empty path (leave it out, or give -, for standard output)")
    if args.out is not None:
        why = replace_problem(args.out) or (None if os.path.isdir(os.path.dirname(os.path.abspath(args.out)))
                                            else "is in a folder that does not exist")
        if why is not None:
            ap.error(f"--out {args.out} {why}; not written")
    from tqdm.auto import tqdm

    bar = tqdm(total=args.count, unit="puzzle", file=sys.stderr, leave=False,
               disable=args.quiet or sys.stderr is None or not sys.stderr.isatty())
    try:
        from ..stops import imports_done

        imports_done()  # a signal held while the command started stops it here
        with contextlib.ExitStack() as stack:
            # puzzles go out as they come: to standard output line by line, or into a file that replaces --out
            # when the last is written (interrupted: nothing written there)
            f = sys.stdout if args.out is None else stack.enter_context(atomic_writer(args.out, "w"))
            for p in iter_rated(args.count, args.bucket, args.seed, args.propagation, args.start):
                f.write(f"{p.puzzle},{p.solution}" + (f",{p.rating}\n" if args.ratings else "\n"))
                if args.out is None:
                    f.flush()
                bar.update(1)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM / SIGHUP (hyperset.stops)
        from ..stops import interrupt_exit_code

        bar.close()
        sys.stderr.write(f"hyperset-generate: interrupted after {bar.n} puzzles"
                         + ("" if args.out is None else f"; {args.out} not written") + "\n")
        sys.exit(interrupt_exit_code())
    except BrokenPipeError:
        from ..cli_options import closed_pipe_exit

        closed_pipe_exit()
    except OSError as e:  # a full disk; a link put at --out meanwhile (NotReplacedError)
        bar.close()
        sys.stderr.write(f"hyperset-generate: error: cannot write the puzzles: {e.strerror or e}\n")
        sys.exit(2)
    finally:
        bar.close()


if __name__ == "__main__":
    main()
