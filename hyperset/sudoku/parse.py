"""Reading Sudoku puzzles from the formats people have: one line of 81 cells, a grid of 9 rows, CSV with a
solution column, with headers, separators and box drawing; text, files, gzip and UTF-16, read as a stream with
caps on its size. Each puzzle is checked as it is read (clashing givens, a solution that does not fit) and,
unless told not to, for having no solution (constraint propagation, then a bounded exact search)."""

from __future__ import annotations

import codecs
import gzip
import io
import itertools
import os
import re
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .board import BLANK_CHARS, MIN_UNIQUE_GIVENS, PuzzleError, _first_duplicate, _pair_label, _unit_label, cell_name
from .exact import contradiction
from .rated import count_solutions_within

__all__ = ["Puzzle", "SEARCH_NODES", "iter_file", "iter_lines", "parse_file", "parse_puzzles"]

# Characters ignored inside a row of cells: separators and box-drawing verticals.
_ROW_NOISE = set(" \t|+:;") | {chr(c) for c in range(0x2500, 0x2580)}
# A line made only of these (and at least one of them) is a grid separator line.
_SEPARATOR_CHARS = set(" \t-+|=:") | {chr(c) for c in range(0x2500, 0x2580)}
_GRID_TITLE = re.compile(r"grid\s+\d+", re.IGNORECASE)
_PUZZLE_HEADER_NAMES = {"puzzle", "puzzles", "quiz", "quizzes", "givens", "problem", "problems", "question"}
_SOLUTION_HEADER_NAMES = {"solution", "solutions", "answer", "answers"}


@dataclass(frozen=True)
class Puzzle:
    """One parsed puzzle: ``givens`` is 81 characters with ``0`` for blanks."""

    givens: str
    solution: str | None
    source: str
    line: int
    index: int
    warnings: tuple[str, ...] = field(default=())
    #: why the givens have no solution, when the parser could tell (then also the first of ``warnings``)
    no_solution: str | None = None

    @property
    def n_givens(self) -> int:
        """Number of given (non-blank) cells."""
        return 81 - self.givens.count("0")


# ----------------------------------------------------------------------------------------------------------
# parsing


def _cells_of(text: str, source: str, line_no: int, col_offset: int = 0) -> str:
    """Digits of one puzzle-or-row text (separators dropped, blanks -> '0'); bad characters raise."""
    out = []
    for col, ch in enumerate(text, start=1 + col_offset):
        if ch in "123456789":
            out.append(ch)
        elif ch in BLANK_CHARS:
            out.append("0")
        elif ch in _ROW_NOISE:
            continue
        else:
            raise PuzzleError(source, line_no, f"unexpected character {ch!r} at column {col}")
    return "".join(out)


def _check_givens(givens: str, source: str, line: int, row_lines: Sequence[int] | None) -> None:
    """Raise if a digit repeats in a row, column or box of the givens."""
    dup = _first_duplicate([ord(ch) - 48 for ch in givens])
    if dup is None:
        return
    u, d, a, b = dup
    if row_lines is not None:  # a grid: point at the line of the later of the two cells
        line = row_lines[b // 9]
    raise PuzzleError(source, line, f"digit {d} appears twice in {_unit_label(u)} ({_pair_label(u, a, b)})")


def _check_solution(givens: str, solution: str, source: str, line: int) -> None:
    if len(solution) != 81:
        raise PuzzleError(source, line, f"solution: expected 81 cells, found {len(solution)}")
    for col, ch in enumerate(solution, start=1):
        if ch not in "123456789":
            raise PuzzleError(
                source, line, f"solution: unexpected character {ch!r} at position {col} (expected 1-9)"
            )
    dup = _first_duplicate([ord(ch) - 48 for ch in solution])
    if dup is not None:
        u, d, a, b = dup
        raise PuzzleError(
            source,
            line,
            f"solution is not a valid grid: digit {d} appears twice in {_unit_label(u)} "
            f"({_pair_label(u, a, b)})",
        )
    for i, (g, s) in enumerate(zip(givens, solution)):
        if g != "0" and g != s:
            raise PuzzleError(
                source,
                line,
                f"solution disagrees with the givens at {cell_name(i)} (given {g}, solution {s})",
            )


def _is_separator(stripped: str) -> bool:
    return all(ch in _SEPARATOR_CHARS for ch in stripped) and any(ch not in " \t" for ch in stripped)


def _unquote(field: str) -> str:
    """A CSV field without the double quotes a spreadsheet puts round it."""
    return field[1:-1].strip() if len(field) >= 2 and field[0] == field[-1] == '"' else field


def _is_header(fields: list[str]) -> bool:
    """A CSV header names its columns: every field is a short word, none looks like cells."""
    return all(f and len(f) < 40 and any(ch.isalpha() for ch in f) for f in fields)


class _Parser:
    """Line-by-line state machine behind :func:`parse_puzzles`."""

    def __init__(self, source: str, search: bool = True) -> None:
        self.source = source
        self.search = search
        self.puzzles: list[Puzzle] = []  # parsed and not yet handed out (iter_lines takes them)
        self.count = 0  # puzzles parsed so far
        self.rows: list[str] = []  # pending grid rows
        self.row_lines: list[int] = []
        self.csv_columns: tuple[int, int | None, int] | None = None  # (puzzle, solution, n_fields)
        self.seen_content = False

    def add(
        self, givens: str, solution: str | None, line: int, row_lines: Sequence[int] | None = None
    ) -> None:
        _check_givens(givens, self.source, line, row_lines)
        if solution is not None:
            _check_solution(givens, solution, self.source, line)
        n = 81 - givens.count("0")
        warnings: tuple[str, ...] = ()
        why = None
        several = False
        if solution is None:  # a puzzle that comes with its solution has one; others are checked
            why = contradiction(givens)  # constraint propagation, with the reason in a sentence
            if why is None and self.search:
                # the exact search, bounded (SEARCH_NODES; its cost: docs/sudoku.md, hyperset-solve); None = untold
                found = count_solutions_within(givens, 2, SEARCH_NODES)
                if found == 0:
                    why = "a search finds no way to fill the blanks that keeps every given"
                several = found is not None and found > 1
        if why is not None:
            warnings = (f"no solution: {why}",)
        elif n < MIN_UNIQUE_GIVENS:
            warnings = (f"only {n} given{'s' if n != 1 else ''}: cannot have a unique solution",)
        elif several:
            warnings = ("several solutions: a valid board is one of them, not the puzzle's answer",)
        self.puzzles.append(Puzzle(givens, solution, self.source, line, self.count, warnings,
                                   None if why is None else f"no solution: {why}"))
        self.count += 1

    def end_grid(self, reason_line: int | None = None) -> None:
        if not self.rows:
            return
        if len(self.rows) != 9:
            n = len(self.rows)
            where = "before the end of the input" if reason_line is None else f"before line {reason_line}"
            raise PuzzleError(
                self.source,
                self.row_lines[0],
                f"grid starting here has only {n} row{'s' if n != 1 else ''} {where} "
                "(expected 9 rows of 9 cells)",
            )
        self.add("".join(self.rows), None, self.row_lines[0], self.row_lines)
        self.rows, self.row_lines = [], []

    def csv_line(self, raw: str, line: int) -> None:
        fields = [_unquote(f.strip()) for f in raw.split(",")]
        if not self.seen_content and _is_header(fields):
            names = [f.lower().strip("\"'") for f in fields]
            p = next((i for i, f in enumerate(names) if f in _PUZZLE_HEADER_NAMES), None)
            s = next((i for i, f in enumerate(names) if f in _SOLUTION_HEADER_NAMES), None)
            if p is None:
                if len(fields) > 2:
                    raise PuzzleError(
                        self.source, line, f"CSV header {raw.strip()!r} has no 'puzzle' (or 'quizzes') column"
                    )
                p, s = 0, (1 if len(fields) == 2 else None)
            self.csv_columns = (p, s, len(fields))
            self.seen_content = True
            return
        self.seen_content = True
        if self.csv_columns is None:
            if len(fields) > 2:
                raise PuzzleError(
                    self.source,
                    line,
                    f"expected 'puzzle,solution' (2 comma-separated fields), found {len(fields)}",
                )
            self.csv_columns = (0, 1, 2)
        p, s, n_fields = self.csv_columns
        if len(fields) != n_fields and not (n_fields == 2 and len(fields) == 1):
            raise PuzzleError(
                self.source, line, f"expected {n_fields} comma-separated fields, found {len(fields)}"
            )
        offset = raw.index(fields[p]) if fields[p] else 0
        givens = _cells_of(fields[p], self.source, line, offset)
        if len(givens) != 81:
            raise PuzzleError(self.source, line, f"expected 81 cells, found {len(givens)}")
        solution = fields[s] if s is not None and s < len(fields) and fields[s] else None
        self.add(givens, solution, line)

    def text_line(self, raw: str, line: int) -> None:
        stripped = raw.strip()
        if not stripped:
            # blank lines end a grid, except between bands (after 3 or 6 rows)
            if self.rows and len(self.rows) not in (3, 6):
                self.end_grid(line)
            return
        if stripped.startswith("#"):
            return
        if _GRID_TITLE.fullmatch(stripped):  # Project Euler 96's "Grid 01" before each grid
            self.end_grid(line)
            return
        if _is_separator(stripped):
            self.seen_content = True
            return
        if "," in stripped:
            fields = [_unquote(f.strip()) for f in stripped.split(",")]
            if len(fields) == 10 and not fields[-1]:  # a spreadsheet's row ends with a comma
                fields = fields[:-1]
            if len(fields) == 9 and all(len(f) <= 1 for f in fields):  # a grid row written 5,3,0,... or 5,3,,...
                self.seen_content = True
                self.cells_line(_cells_of(" ".join(f or "0" for f in fields), self.source, line), line)
                return
            self.end_grid(line)
            self.csv_line(raw, line)
            return
        if not self.seen_content and _unquote(stripped).lower() in _PUZZLE_HEADER_NAMES:  # a one-column CSV
            self.seen_content = True
            return
        self.seen_content = True
        unquoted = _unquote(stripped)  # a one-column CSV's quoted rows
        cells = _cells_of(raw if unquoted == stripped else unquoted, self.source, line)
        self.cells_line(cells, line)

    def cells_line(self, cells: str, line: int) -> None:
        if len(cells) == 9:
            self.rows.append(cells)
            self.row_lines.append(line)
            if len(self.rows) == 9:
                self.end_grid()
        elif len(cells) == 81:
            self.end_grid(line)  # raises if a grid was left incomplete
            self.add(cells, None, line)
        elif len(cells) < 20:
            raise PuzzleError(self.source, line, f"expected 9 cells in a grid row, found {len(cells)}")
        else:
            raise PuzzleError(self.source, line, f"expected 81 cells, found {len(cells)}")


#: The most search nodes the parser's check of one puzzle may visit (hyperset.sudoku.rated.count_solutions_within):
#: enough for 999 of the 1,000 17-given puzzles of the RRN validation draw; a puzzle it cannot tell gets no warning.
SEARCH_NODES = 1000


def iter_lines(lines: Iterable[tuple[int, str]], source: str = "<text>", search: bool = True) -> Iterator[Puzzle]:
    """The puzzles of numbered text lines, each as soon as its last line is read (see :func:`parse_puzzles`);
    raises :class:`PuzzleError` where the input stops making sense, after the puzzles before it."""
    parser = _Parser(source, search)
    for line_no, raw in lines:
        parser.text_line(raw, line_no)
        if parser.puzzles:
            yield from parser.puzzles
            parser.puzzles.clear()
    parser.end_grid()
    yield from parser.puzzles
    if not parser.count:
        raise PuzzleError(source, None, "no puzzles found")


def parse_puzzles(text: str, source: str = "<text>", search: bool = True) -> list[Puzzle]:
    """Parse every puzzle in ``text``.

    Accepted: one 81-cell line per puzzle (``0 . _ * x`` for blanks, ``|`` and spaces ignored); 9-line
    grids with optional ``|``/``-``/``+``/box-drawing separators, one after another with or without
    blank lines; ``puzzle,solution`` CSV (RRN format) with or without a header line; ``#`` comments.
    Raises :class:`PuzzleError` naming ``source``, the line and the reason. A puzzle without its solution is
    checked for having none (the reason is a warning and ``Puzzle.no_solution``) and, with ``search``, for
    several, by a bounded exact search.
    """
    if text.startswith("\ufeff"):
        text = text[1:]
    # lines end at \n, \r\n or \r only: str.splitlines would also end them at form feeds and other separators,
    # which split a comment in two and shift every later line number
    lines = re.split(r"\r\n|\r|\n", text.removesuffix("\n"))
    return list(iter_lines(_numbered([lines], source), source, search))


#: The most bytes a puzzle input may hold, read or decompressed (1,000,000 puzzles as RRN CSV lines with their
#: solutions are 164 MB): /dev/zero, an endless pipe or a gzip bomb stop here instead of running for hours.
MAX_INPUT_BYTES = 256 * 2**20
#: The most lines a puzzle input may hold: 1,000,000 puzzles as 9-line grids, each with a title and a blank line,
#: are 11 million; a flood of empty lines stops here, read as it comes, never held.
MAX_INPUT_LINES = 12_000_000
#: The longest line a puzzle input may hold (a CSV row with its puzzle, solution and a few more columns is under
#: 300 bytes): a file without line ends is refused at this length instead of being read whole into one line.
MAX_LINE_BYTES = 64 * 2**10
_CHUNK = 2**20  # bytes read at a time


def _size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def _chunks(stream: BinaryIO, source: str, what: str) -> Iterator[bytes]:
    """The bytes of `stream` as they come (a pipe's first line need not wait for the rest), refused once there
    are more than MAX_INPUT_BYTES of them."""
    total = 0
    read = getattr(stream, "read1", stream.read)
    while True:
        try:
            data = read(_CHUNK)
        except (OSError, EOFError, zlib.error) as err:
            if isinstance(stream, gzip.GzipFile):
                raise PuzzleError(source, None, f"damaged gzip file ({err})") from None
            raise PuzzleError(source, None, f"cannot read ({err.strerror or err})") from None
        if not data:
            return
        total += len(data)
        if total > MAX_INPUT_BYTES:
            raise PuzzleError(source, None, f"{what} {_size(MAX_INPUT_BYTES)} (the most a puzzle input may hold); "
                                            "split it into smaller files")
        yield data


class _Rejoined(io.RawIOBase):
    """A stream whose first bytes were already taken off (to look at them): they come first, then the rest."""

    def __init__(self, head: bytes, rest: Iterator[bytes]) -> None:
        self.pending, self.rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self.pending:
            self.pending = next(self.rest, b"")
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n


def _first_bytes(chunks: Iterator[bytes], n: int) -> bytes:
    """At least `n` bytes from `chunks` (fewer at the end of the input)."""
    head = b""
    for data in chunks:
        head += data
        if len(head) >= n:
            break
    return head


_LINE_ENDS = re.compile(r"\r\n|\r|\n")
_LINE_ENDS_B = re.compile(rb"\r\n|\r|\n")


def _complete_lines(buf: Any, final: bool, source: str, line_no: int) -> tuple[list[Any], Any]:
    """The lines of `buf` (bytes or str) ended by \\n, \\r\\n or \\r, and the start of the next (a \\r at the
    end may be half of a \\r\\n, so it waits); at the end of the input (`final`) the rest is a line too."""
    ends = _LINE_ENDS_B if isinstance(buf, bytes) else _LINE_ENDS
    held = buf[-1:] if not final and buf[-1:] in ("\r", b"\r") else buf[:0]
    lines = ends.split(buf[:len(buf) - len(held)])
    tail = lines.pop() + held if not final else buf[:0]
    if final and lines and not lines[-1]:  # the input's last line end ends the last line, starts no other
        lines.pop()
    if len(tail) > MAX_LINE_BYTES or any(len(x) > MAX_LINE_BYTES for x in lines):
        long = next((k for k, x in enumerate(lines) if len(x) > MAX_LINE_BYTES), len(lines))
        raise PuzzleError(source, line_no + long + 1, f"a line longer than {_size(MAX_LINE_BYTES)}: not a puzzle "
                                                      "file")
    return lines, tail


def _numbered(batches: Iterable[list[Any]], source: str) -> Iterator[tuple[int, Any]]:
    """The lines of `batches` (lists of lines, in order) numbered from 1, a run of empty lines given once (the
    parser reads one as it reads many, and a flood of them costs no parsing), refused past MAX_INPUT_LINES."""
    line_no = 0
    blank = False
    for lines in batches:
        if line_no + len(lines) > MAX_INPUT_LINES:
            lines = lines[:MAX_INPUT_LINES - line_no + 1]
        for line in lines:
            line_no += 1
            if line_no > MAX_INPUT_LINES:
                raise PuzzleError(source, line_no, f"more than {MAX_INPUT_LINES:,} lines (the most a puzzle input "
                                                   "may hold); split it into smaller files")
            if not line:
                if blank:
                    continue
                blank = True
            else:
                blank = False
            yield line_no, line


def _byte_batches(chunks: Iterator[bytes], source: str) -> Iterator[list[bytes]]:
    """The lines of a byte stream, chunk by chunk, each at most MAX_LINE_BYTES."""
    tail = b""
    count = 0
    for data in itertools.chain(chunks, [b""]):
        if b"\x00" in data:
            raise PuzzleError(source, None, "looks like a binary file, not text")
        lines, tail = _complete_lines(tail + data, not data, source, count)
        count += len(lines)
        yield lines


def _utf8_lines(chunks: Iterator[bytes], source: str) -> Iterator[tuple[int, str]]:
    for line_no, data in _numbered(_byte_batches(chunks, source), source):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise PuzzleError(source, line_no, f"not UTF-8 text (byte 0x{data[err.start]:02x})") from None
        yield line_no, text.removeprefix("\ufeff") if line_no == 1 else text


def _utf16_batches(chunks: Iterator[bytes], source: str) -> Iterator[list[str]]:
    decoder = codecs.getincrementaldecoder("utf-16")()
    tail = ""
    count = 0
    for data in itertools.chain(chunks, [b""]):
        try:
            text = decoder.decode(data, final=not data)
        except UnicodeDecodeError:
            reason = "not valid UTF-16 text (the file starts with a UTF-16 byte order mark)"
            raise PuzzleError(source, count + 1, reason) from None
        if "\x00" in text:
            raise PuzzleError(source, None, "looks like a binary file, not text")
        lines, tail = _complete_lines(tail + text, not data, source, count)
        count += len(lines)
        yield lines


def _utf16_lines(chunks: Iterator[bytes], source: str) -> Iterator[tuple[int, str]]:
    """Lines of UTF-16 text with a byte order mark (Windows Notepad, PowerShell redirection)."""
    return _numbered(_utf16_batches(chunks, source), source)


def _open(path: str) -> tuple[BinaryIO, str]:
    """The byte stream of `path` ('-': standard input), with the name errors give it."""
    if path == "-":
        if sys.stdin is None:  # `<&-`, or pythonw on Windows
            raise PuzzleError("<stdin>", None, "standard input is closed")
        if sys.stdin.isatty():  # nothing piped in: say what it waits for instead of hanging silently
            end = "Ctrl-Z then Enter" if os.name == "nt" else "Ctrl-D"
            print(f"reading puzzles from standard input (type or paste them, then {end})", file=sys.stderr)
        return sys.stdin.buffer, "<stdin>"
    if not path.strip():
        raise PuzzleError("''", None, "an empty file name (give a path, or - for standard input)")
    try:
        if os.path.isdir(path):
            raise IsADirectoryError
        return open(path, "rb"), path
    except FileNotFoundError:
        raise PuzzleError(path, None, "file not found") from None
    except IsADirectoryError:
        raise PuzzleError(path, None, "is a directory, not a file") from None
    except PermissionError:
        raise PuzzleError(path, None, "permission denied") from None
    except OSError as err:
        raise PuzzleError(path, None, f"cannot read file ({err.strerror or err})") from None


def iter_file(path: str | os.PathLike, search: bool = True) -> Iterator[Puzzle]:
    """The puzzles of a file (see :func:`parse_puzzles`; ``-`` reads stdin, gzip is decompressed), each as soon as
    it is read: memory stays flat however long the input. The file is opened at the call (a missing file is a
    PuzzleError then); an input larger than MAX_INPUT_BYTES (read or decompressed), with more than
    MAX_INPUT_LINES lines or a line over MAX_LINE_BYTES is refused where it goes past, after the puzzles
    before."""
    stream, source = _open(str(path))
    return _iter_stream(stream, source, str(path).endswith(".gz"), search)


def _iter_stream(stream: BinaryIO, source: str, gz_name: bool, search: bool) -> Iterator[Puzzle]:
    try:
        chunks = _chunks(stream, source, "input larger than")
        head = _first_bytes(chunks, 2)
        if head[:2] == b"\x1f\x8b":
            unzipped = gzip.GzipFile(fileobj=io.BufferedReader(_Rejoined(head, chunks)))
            chunks = _chunks(unzipped, source, "gzip data that expands to more than")
            head = _first_bytes(chunks, 2)
        elif gz_name:
            raise PuzzleError(source, None, "named .gz but is not a gzip file")
        chunks = itertools.chain([head], chunks)
        if head[:2] in (b"\xff\xfe", b"\xfe\xff"):
            lines = _utf16_lines(chunks, source)
        else:
            lines = _utf8_lines(chunks, source)
        yield from iter_lines(lines, source, search)
    finally:
        if stream is not getattr(sys.stdin, "buffer", None):
            stream.close()


def parse_file(path: str | os.PathLike, search: bool = True) -> list[Puzzle]:
    """Every puzzle of a file (:func:`iter_file`) in a list."""
    return list(iter_file(path, search))
