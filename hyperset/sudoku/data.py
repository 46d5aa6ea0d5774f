"""The RRN "sudoku-hard" data (Palm et al., 2018): loading, locating, downloading, splitting, augmenting.

Files hold one ``puzzle,solution`` line per sample (81 digits each, ``0`` = blank, row-major), without a
header in the RRN release (a header line is accepted). They may be plain, gzipped (``.gz``) or inside
``sudoku-hard.zip`` (members ``sudoku-hard/{train,valid,test}.csv``): a path such as
``data/sudoku-hard.zip/sudoku-hard/test.csv`` names a zip member and is read without extracting.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from ..download import DownloadError, failure_reason, fetch, file_digest
from .board import UNITS, PuzzleError
from .parse import _check_solution

__all__ = [
    "RRN_URL",
    "SPLITS",
    "DataNotFoundError",
    "DownloadError",
    "augment",
    "download_rrn",
    "find_split",
    "givens_count",
    "load_csv",
    "protocol_indices",
    "protocol_split",
]

RRN_URL = "https://www.dropbox.com/s/rp3hbjs91xiqdgc/sudoku-hard.zip?dl=1"
SPLITS = ("train", "valid", "test")
_ZIP_NAME = "sudoku-hard.zip"
_DIR_NAME = "sudoku-hard"
_LINE_LEN = 163  # 81 + ',' + 81
_UNITS = np.array(UNITS, dtype=np.intp)  # (27, 9)
_FULL_UNIT = 0b1111111110  # bits 1..9
#: what a CSV may hold, so that a gzip or zip member that expands without end (a decompression bomb) or a flood of
#: blank lines is refused before it fills the memory: at least MAX_CSV_BYTES (the RRN train.csv is 29.5 MB), and for
#: a file of known size its own size (plain) or CSV_EXPANSION times it (compressed: text of digits compresses
#: 3-5x), so that large collections (Kaggle's 9 M puzzles, 1.5 GB) load; a pipe, of unknown size, MAX_STREAM_BYTES
MAX_CSV_BYTES = 2**30
MAX_STREAM_BYTES = 2**32
CSV_EXPANSION = 64
#: lines: at least MAX_CSV_LINES, else one per 64 bytes of the cap (load_csv keeps ~16 bytes per line)
MAX_CSV_LINES = 8_000_000


def _csv_caps(size: int | None, compressed: bool) -> tuple[int, int]:
    """(bytes, lines) a CSV may hold: `size` is the file's (compressed: the archive member's) size, None for a
    pipe. For a plain file of known size its size bounds both."""
    if size is None:
        return MAX_STREAM_BYTES, max(MAX_CSV_LINES, MAX_STREAM_BYTES // 64)
    if compressed:
        cap = max(MAX_CSV_BYTES, CSV_EXPANSION * size)
        return cap, max(MAX_CSV_LINES, cap // 64)
    return max(MAX_CSV_BYTES, size), max(MAX_CSV_LINES, size // 64)


class DataNotFoundError(FileNotFoundError):
    """A data split is not where it was looked for."""


# ----------------------------------------------------------------------------------------------------------
# reading


def _zip_member_path(path: Path) -> tuple[Path, str] | None:
    """Split ``x.zip/inner/file.csv`` into the zip file and the member name, if ``x.zip`` is a file."""
    for parent in path.parents:
        if parent.suffix.lower() == ".zip" and parent.is_file():
            return parent, path.relative_to(parent).as_posix()
    return None


def _read_lines(path: Path, limit: int | None) -> bytes:
    """Raw bytes of the CSV at ``path`` (plain, gzip or zip member); with ``limit`` only the first lines."""
    source = str(path)

    def take(f: io.BufferedIOBase, unpacked: bool, size: int | None) -> bytes:
        # every read is bounded: one byte past the cap tells an oversized file from one at the cap
        max_bytes, max_lines = _csv_caps(size, unpacked)
        if limit is None:
            data = f.read(max_bytes + 1)
        else:
            # read up to ``limit`` + 1 non-blank lines (one may be a header); the caller trims to ``limit``
            out, count, total = [], 0, 0
            while count <= limit and total <= max_bytes and len(out) <= max_lines:
                line = f.readline(max_bytes + 1 - total)
                if not line:
                    break
                out.append(line)
                total += len(line)
                count += bool(line.strip(b" \t\r\n\x00"))  # NULs: a blank line in UTF-16
            data = b"".join(out)
        if len(data) > max_bytes:
            grows = "expands to" if unpacked else "holds"
            raise PuzzleError(source, None, f"{grows} more than {max_bytes:,} bytes, far more than a Sudoku "
                                            "dataset (the RRN train.csv is 29.5 MB); refusing to read it")
        if data.count(b"\n") > max_lines:
            raise PuzzleError(source, None, f"more than {max_lines:,} lines, far more than a Sudoku dataset "
                                            "(the RRN train.csv has 180,000); refusing to read it")
        # what spreadsheets write: UTF-16 with its byte order mark, or UTF-8 behind one ("CSV UTF-8"), as
        # hyperset-solve reads them
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            try:
                data = data[:len(data) // 2 * 2].decode("utf-16").encode("utf-8")
            except UnicodeDecodeError:
                raise PuzzleError(source, None, "not valid UTF-16 text after its byte order mark") from None
        return data.removeprefix(b"\xef\xbb\xbf")

    if path.exists() and not path.is_dir():  # a file, or a pipe (`--data <(zcat big.csv.gz | head -2000)`)
        if path.suffix.lower() == ".zip":
            raise PuzzleError(
                source, None, f"is a zip archive: name a member, e.g. {path}/{_DIR_NAME}/test.csv"
            )
        try:
            size = path.stat().st_size if path.is_file() else None  # None: a pipe
            with open(path, "rb") as raw:  # opened once: a pipe cannot be read twice
                if raw.peek(2)[:2] == b"\x1f\x8b":
                    with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                        return take(f, True, size)
                return take(raw, False, size)
        except (OSError, EOFError) as err:
            raise PuzzleError(source, None, f"cannot read file ({err})") from None
    member = _zip_member_path(path)
    if member is not None:
        zpath, name = member
        try:
            with zipfile.ZipFile(zpath) as zf, zf.open(name) as f:
                return take(f, True, zf.getinfo(name).compress_size)
        except KeyError:
            raise PuzzleError(source, None, f"{zpath.name} has no member {name!r}") from None
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise PuzzleError(source, None, f"cannot read zip member ({err})") from None
    if path.is_dir():
        raise PuzzleError(source, None, "is a directory, not a CSV file")
    raise PuzzleError(source, None, "file not found")


def _line_problem(line: bytes) -> str:
    """Why one CSV line is not ``puzzle,solution`` (81 digits each)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    fields = text.split(",")
    if len(fields) != 2:
        return f"expected 'puzzle,solution' (2 comma-separated fields), found {len(fields)} field(s)"
    offset = 0
    for name, f, allowed in (("puzzle", fields[0], "0123456789."), ("solution", fields[1], "123456789")):
        for col, ch in enumerate(f, start=offset + 1):
            if ch not in allowed:
                return f"unexpected character {ch!r} at column {col} ({name})"
        if len(f) != 81:
            return f"{name}: expected 81 cells, found {len(f)}"
        offset += len(f) + 1
    return "malformed line"


def _invalid_rows(puzzles: np.ndarray, solutions: np.ndarray, chunk: int = 16384) -> np.ndarray:
    """Indices of rows whose solution is not a valid grid or disagrees with the puzzle's givens."""
    bad = []
    for start in range(0, len(puzzles), chunk):
        p = puzzles[start : start + chunk]
        s = solutions[start : start + chunk]
        bits = np.left_shift(np.uint16(1), s.astype(np.uint16))
        unit_ok = np.bitwise_or.reduce(bits[:, _UNITS], axis=2) == _FULL_UNIT
        ok = unit_ok.all(axis=1) & ((p == 0) | (p == s)).all(axis=1)
        bad.append(np.nonzero(~ok)[0] + start)
    return np.concatenate(bad) if bad else np.zeros(0, dtype=np.intp)


def load_csv(
    path: str | os.PathLike, limit: int | None = None, check: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Load ``puzzle,solution`` lines as two uint8 arrays of shape ``(n, 81)`` (``0`` = blank).

    Accepts plain, ``.gz`` and zip-member paths, an optional header line, ``.`` for blanks in puzzles,
    CRLF line ends and blank lines. ``limit`` keeps the first rows only. With ``check`` (default) every
    solution must be a valid grid agreeing with its givens. Malformed lines raise :class:`PuzzleError`
    with the line number.
    """
    path = Path(path)
    source = str(path)
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be non-negative, got {limit}")
    data = _read_lines(path, limit).replace(b"\r", b"")
    lines = data.split(b"\n")
    lens = np.fromiter(map(len, lines), dtype=np.int64, count=len(lines))
    keep = lens > 0
    nonblank = np.nonzero(keep)[0]
    first = lines[nonblank[0]] if nonblank.size else b""
    puzzle_first = len(first) > 81 and first[81:82] == b"," and all(c in b"0123456789." for c in first[:81])
    if len(first) != _LINE_LEN and not puzzle_first and any(65 <= c <= 90 or 97 <= c <= 122 for c in first):
        keep[nonblank[0]] = False  # a header line such as "quizzes,solutions" (a data line with a letter is an error)
    rows = np.nonzero(keep)[0]
    if limit is not None:
        rows = rows[:limit]
    line_numbers = rows + 1
    bad_len = np.nonzero(lens[rows] != _LINE_LEN)[0]
    if bad_len.size:
        i = int(rows[bad_len[0]])
        raise PuzzleError(source, i + 1, _line_problem(lines[i]))
    if rows.size == 0:
        return np.zeros((0, 81), np.uint8), np.zeros((0, 81), np.uint8)
    buf = np.frombuffer(b"".join([lines[i] for i in rows.tolist()]), dtype=np.uint8).reshape(-1, _LINE_LEN)
    puzzles = buf[:, :81]
    solutions = buf[:, 82:]
    puzzles = np.where(puzzles == ord("."), np.uint8(ord("0")), puzzles)
    ok = (
        (buf[:, 81] == ord(","))
        & ((puzzles >= ord("0")) & (puzzles <= ord("9"))).all(axis=1)
        & ((solutions >= ord("1")) & (solutions <= ord("9"))).all(axis=1)
    )
    if not ok.all():
        k = int(np.argmin(ok))
        raise PuzzleError(source, int(line_numbers[k]), _line_problem(lines[rows[k]]))
    puzzles = puzzles - np.uint8(48)
    solutions = solutions - np.uint8(48)
    if check:
        invalid = _invalid_rows(puzzles, solutions)
        if invalid.size:
            k = int(invalid[0])
            givens = "".join(map(str, puzzles[k].tolist()))
            sol = "".join(map(str, solutions[k].tolist()))
            _check_solution(givens, sol, source, int(line_numbers[k]))  # raises with the exact reason
            raise PuzzleError(
                source, int(line_numbers[k]), "solution is not a valid grid"
            )  # pragma: no cover
    return np.ascontiguousarray(puzzles), np.ascontiguousarray(solutions)


def givens_count(puzzles: np.ndarray) -> np.ndarray:
    """Number of givens (nonzero cells) of each puzzle, shape ``(n,)``."""
    return np.count_nonzero(np.asarray(puzzles).reshape(-1, 81), axis=1)


def protocol_split(
    puzzles: np.ndarray, solutions: np.ndarray, n: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's sampling: rows ``np.random.RandomState(seed).permutation(len)[:n]``.

    Hyper-SET (after the Recurrent Transformer) takes 9,000 puzzles of ``train.csv`` and 1,000 of
    ``test.csv`` this way with ``seed=0``.
    """
    if len(puzzles) != len(solutions):
        raise ValueError(f"puzzles and solutions differ in length ({len(puzzles)} vs {len(solutions)})")
    idx = protocol_indices(len(puzzles), n, seed)
    return puzzles[idx], solutions[idx]


def protocol_indices(available: int, n: int, seed: int = 0) -> np.ndarray:
    """The rows :func:`protocol_split` takes: ``np.random.RandomState(seed).permutation(available)[:n]``."""
    if not 0 <= n <= available:
        raise ValueError(f"cannot take {n} samples from {available}")
    return np.random.RandomState(seed).permutation(available)[:n]


# ----------------------------------------------------------------------------------------------------------
# locating and downloading


def _zip_members(zf: zipfile.ZipFile) -> dict[str, str]:
    """Map each split to its CSV member: ``sudoku-hard/{split}.csv``, else any ``{split}.csv``."""
    names = [n for n in zf.namelist() if not n.startswith("__MACOSX/") and not n.endswith("/")]
    found = {}
    for split in SPLITS:
        preferred = f"{_DIR_NAME}/{split}.csv"
        if preferred in names:
            found[split] = preferred
            continue
        matches = [n for n in names if n == f"{split}.csv" or n.endswith(f"/{split}.csv")]
        if matches:
            found[split] = min(matches, key=len)
    return found


def find_split(data_dir: str | os.PathLike, split: str) -> Path:
    """Path of the ``split`` ("train", "valid" or "test") CSV under ``data_dir``.

    Looked for in order: ``{split}.csv``, ``{split}.csv.gz``, ``rrnstyle_{split}.csv.gz``,
    ``sudoku-hard/{split}.csv``, then the member of ``sudoku-hard.zip`` (returned as the virtual path
    ``sudoku-hard.zip/sudoku-hard/{split}.csv`` that :func:`load_csv` reads). Raises
    :class:`DataNotFoundError` listing what was looked for.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: expected one of {', '.join(SPLITS)}")
    root = Path(data_dir)
    candidates = [
        root / f"{split}.csv",
        root / f"{split}.csv.gz",
        root / f"rrnstyle_{split}.csv.gz",
        root / _DIR_NAME / f"{split}.csv",
    ]
    for c in candidates:
        if c.is_file():
            return c
    zpath = root / _ZIP_NAME
    note = ""
    if zpath.is_file():
        try:
            with zipfile.ZipFile(zpath) as zf:
                member = _zip_members(zf).get(split)
        except (zipfile.BadZipFile, OSError) as err:
            member, note = None, f" ({zpath.name} is not a readable zip: {err})"
        if member is not None:
            return zpath / member
        note = note or f" ({zpath.name} has no {split}.csv member)"
    looked = ", ".join(str(c.relative_to(root)) for c in candidates) + f", {_ZIP_NAME}"
    where = (f"{root}" if root.is_dir() else f"{root} (a file: --data names the folder that holds the splits)"
             if root.exists() else f"{root} (the directory does not exist)")
    raise DataNotFoundError(
        f"no {split} split found in {where}: looked for {looked}{note}. "
        f"Fetch the RRN data with --download (hyperset-train, hyperset-eval sudoku) or "
        f"download_rrn({str(root)!r}), or place the files there by hand."
    )


def _zip_problem(path: Path) -> str | None:
    """Why ``path`` is not a usable sudoku-hard archive, or None when it is."""
    if not zipfile.is_zipfile(path):
        return "the file is not a zip archive"
    try:
        with zipfile.ZipFile(path) as zf:
            members = _zip_members(zf)
            missing = [f"{s}.csv" for s in SPLITS if s not in members]
            if missing:
                return f"the archive lacks {', '.join(missing)}"
            # a member's declared size bounds what zipfile unpacks of it: refuse a bomb before testzip unpacks it
            for info in zf.infolist():
                cap = _csv_caps(info.compress_size, True)[0]
                if info.file_size > cap:
                    return f"the archive member {info.filename} expands to more than {cap:,} bytes"
            damaged = zf.testzip()
            if damaged is not None:
                return f"the archive member {damaged} is damaged (CRC mismatch)"
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"the archive is damaged ({err})"
    return None


def _extract(zpath: Path, target: Path) -> None:
    """Extract the three CSVs of ``zpath`` into ``target`` via a temporary directory renamed into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with zipfile.ZipFile(zpath) as zf:
            for split, member in _zip_members(zf).items():
                cap = _csv_caps(zf.getinfo(member).compress_size, True)[0]
                with zf.open(member) as src, open(tmp / f"{split}.csv", "wb") as dst:
                    size = 0
                    while chunk := src.read(1 << 20):
                        size += len(chunk)
                        if size > cap:  # counted, not trusted from the header: extraction fills the disk
                            raise PuzzleError(f"{zpath}/{member}", None, f"expands to more than {cap:,} "
                                              "bytes, far more than a sudoku-hard split; not extracted")
                        dst.write(chunk)
        if target.exists():  # a partial earlier extraction: replace file by file
            for split in SPLITS:
                os.replace(tmp / f"{split}.csv", target / f"{split}.csv")
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download_rrn(
    dest_dir: str | os.PathLike, url: str = RRN_URL, sha256: str | None = None, timeout: float = 30
) -> Path:
    """Download and extract the RRN ``sudoku-hard.zip`` into ``dest_dir``; return ``dest_dir/sudoku-hard``.

    Does nothing when the three CSVs are already there, and only extracts when a valid
    ``dest_dir/sudoku-hard.zip`` is already present (e.g. placed by hand). The download goes to a
    temporary file that is checked (a zip with train/valid/test CSVs, ``sha256`` when given) before it
    is renamed into place, so a failure leaves nothing that looks like data. Raises :class:`DownloadError`.
    """
    root = Path(dest_dir)
    target = root / _DIR_NAME
    zpath = root / _ZIP_NAME
    if all((target / f"{s}.csv").is_file() for s in SPLITS):
        return target
    created = []
    for d in reversed([root, *root.parents]):
        if not d.exists():
            created.append(d)
    manual = (
        f"You can download {_ZIP_NAME} elsewhere and place it at {zpath} (it is extracted on the next run), "
        f"or put train.csv, valid.csv and test.csv in {target}."
    )
    try:
        root.mkdir(parents=True, exist_ok=True)
        have_zip = zpath.is_file() and _zip_problem(zpath) is None
        if have_zip and sha256 is not None and file_digest(zpath) != sha256.lower():
            have_zip = False
        if not have_zip:
            fetch(url, zpath, expected=sha256, timeout=timeout, validate=_zip_problem)
        _extract(zpath, target)
    except DownloadError as err:
        _remove_empty(created)
        raise DownloadError(f"Downloading the RRN sudoku data from {url} failed: {err}. {manual}") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        _remove_empty(created)
        raise DownloadError(
            f"Downloading the RRN sudoku data from {url} failed: {failure_reason(err)}. {manual}"
        ) from None
    except BaseException:
        _remove_empty(created)
        raise
    return target


def _remove_empty(dirs: list[Path]) -> None:
    """Remove directories this call created, deepest first, if they are (still) empty."""
    for d in reversed(dirs):
        try:
            d.rmdir()
        except OSError:
            return


# ----------------------------------------------------------------------------------------------------------
# augmentation


def _batched_permutations(rng: np.random.Generator, shape: tuple[int, ...], k: int) -> np.ndarray:
    """Independent random permutations of ``range(k)`` along the last axis, shape ``(*shape, k)``."""
    return np.argsort(rng.random((*shape, k)), axis=-1)


def random_symmetries(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` random validity-preserving symmetries of the Sudoku grid: ``src`` (n, 81), the cell each new cell takes
    its digit from, and ``relabel`` (n, 10), the new name of each digit (0, the blank, stays 0). Each is a random
    relabelling of digits 1-9, a transpose with probability 0.5, a band permutation with rows permuted inside
    bands, and a stack permutation with columns permuted inside stacks: ``new[i] = relabel[old[src[i]]]``."""
    relabel = np.zeros((n, 10), dtype=np.int64)
    relabel[:, 1:] = _batched_permutations(rng, (n,), 9) + 1
    transpose = rng.random(n) < 0.5

    def lines_map() -> np.ndarray:  # (n, 9): new row/column -> source row/column
        groups = _batched_permutations(rng, (n,), 3)
        inner = _batched_permutations(rng, (n, 3), 3)
        return (3 * groups[:, :, None] + inner).reshape(n, 9)

    rows = lines_map()[:, :, None]  # (n, 9, 1)
    cols = lines_map()[:, None, :]  # (n, 1, 9)
    src = np.where(transpose[:, None, None], cols * 9 + rows, rows * 9 + cols).reshape(n, 81)
    return src, relabel


def augment(
    puzzles: np.ndarray, solutions: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Validity-preserving random symmetries (:func:`random_symmetries`), independently per sample of a
    ``(n, 81)`` batch; puzzle and solution get the same map."""
    p = np.asarray(puzzles)
    s = np.asarray(solutions)
    if p.shape != s.shape or p.ndim != 2 or p.shape[1] != 81:
        raise ValueError(f"expected two (n, 81) arrays, got shapes {p.shape} and {s.shape}")
    src, relabel = random_symmetries(rng, p.shape[0])
    relabel = relabel.astype(p.dtype)
    new_p = np.take_along_axis(relabel, np.take_along_axis(p, src, axis=1).astype(np.intp), axis=1)
    new_s = np.take_along_axis(relabel, np.take_along_axis(s, src, axis=1).astype(np.intp), axis=1)
    return new_p.astype(p.dtype, copy=False), new_s.astype(s.dtype, copy=False)
