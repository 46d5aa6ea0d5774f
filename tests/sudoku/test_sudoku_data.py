"""Specification of hyperset.sudoku.data: RRN CSV loading, locating, offline download, split, augmentation."""

from __future__ import annotations

import gzip
import hashlib
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hyperset.sudoku import (
    DataNotFoundError,
    DownloadError,
    PuzzleError,
    augment,
    download_rrn,
    find_split,
    generate,
    givens_count,
    load_csv,
    protocol_split,
    validate,
)

EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
EASY_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, str]]:
    return [(EASY, EASY_SOLUTION)] + generate(7, min_givens=24, max_givens=34, seed=2)


def csv_text(pairs: list[tuple[str, str]], header: str | None = None) -> str:
    lines = ([header] if header else []) + [f"{p},{s}" for p, s in pairs]
    return "\n".join(lines) + "\n"


def as_array(boards: list[str]) -> np.ndarray:
    return np.array([[int(ch) for ch in b] for b in boards], dtype=np.uint8)


def build_zip(path: Path, pairs: list[tuple[str, str]], members: tuple[str, ...] | None = None) -> Path:
    names = members or tuple(f"sudoku-hard/{s}.csv" for s in ("train", "valid", "test"))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in names:
            zf.writestr(name, csv_text(pairs))
    return path


# ----------------------------------------------------------------------------------------------------------
# load_csv


def test_load_csv_returns_uint8_arrays(tmp_path, pairs) -> None:
    path = tmp_path / "train.csv"
    path.write_text(csv_text(pairs))
    puzzles, solutions = load_csv(path)
    assert puzzles.dtype == solutions.dtype == np.uint8
    assert puzzles.shape == solutions.shape == (len(pairs), 81)
    np.testing.assert_array_equal(puzzles, as_array([p for p, _ in pairs]))
    np.testing.assert_array_equal(solutions, as_array([s for _, s in pairs]))


@pytest.mark.parametrize("header", ["quizzes,solutions", "puzzle,solution"])
def test_load_csv_accepts_a_header(tmp_path, pairs, header) -> None:
    path = tmp_path / "with_header.csv"
    path.write_text(csv_text(pairs, header))
    puzzles, _ = load_csv(path)
    assert len(puzzles) == len(pairs)


def test_load_csv_reads_gzip_crlf_and_trailing_blank_lines(tmp_path, pairs) -> None:
    path = tmp_path / "valid.csv.gz"
    path.write_bytes(gzip.compress((csv_text(pairs).replace("\n", "\r\n") + "\r\n\r\n").encode()))
    puzzles, solutions = load_csv(str(path))
    np.testing.assert_array_equal(solutions, as_array([s for _, s in pairs]))
    assert len(puzzles) == len(pairs)


def test_load_csv_reads_a_zip_member_path(tmp_path, pairs) -> None:
    zpath = build_zip(tmp_path / "sudoku-hard.zip", pairs)
    puzzles, _ = load_csv(zpath / "sudoku-hard" / "test.csv")
    assert len(puzzles) == len(pairs)
    with pytest.raises(PuzzleError, match="has no member"):
        load_csv(zpath / "sudoku-hard" / "nope.csv")
    with pytest.raises(PuzzleError, match="name a member"):
        load_csv(zpath)


def test_load_csv_limit_keeps_the_first_rows(tmp_path, pairs) -> None:
    path = tmp_path / "train.csv.gz"
    path.write_bytes(gzip.compress(csv_text(pairs, "quizzes,solutions").encode()))
    puzzles, _ = load_csv(path, limit=3)
    np.testing.assert_array_equal(puzzles, as_array([p for p, _ in pairs[:3]]))
    assert load_csv(path, limit=0)[0].shape == (0, 81)


def test_load_csv_accepts_dots_for_blanks(tmp_path) -> None:
    path = tmp_path / "dots.csv"
    path.write_text(f"{EASY.replace('0', '.')},{EASY_SOLUTION}\n")
    puzzles, _ = load_csv(path)
    np.testing.assert_array_equal(puzzles[0], as_array([EASY])[0])


def test_load_csv_rejects_a_short_line_with_its_line_number(tmp_path, pairs) -> None:
    lines = csv_text(pairs, "quizzes,solutions").splitlines()
    lines[3] = lines[3][1:]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines))
    with pytest.raises(PuzzleError) as info:
        load_csv(path)
    assert info.value.line == 4
    assert info.value.reason == "puzzle: expected 81 cells, found 80"
    assert str(info.value).startswith(f"{path}:4: ")


def test_load_csv_rejects_a_bad_character_naming_its_column(tmp_path, pairs) -> None:
    lines = csv_text(pairs).splitlines()
    lines[1] = lines[1][:90] + "x" + lines[1][91:]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines))
    with pytest.raises(PuzzleError) as info:
        load_csv(path)
    assert (info.value.line, info.value.reason) == (2, "unexpected character 'x' at column 91 (solution)")


def test_load_csv_rejects_a_line_without_solution(tmp_path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(f"{EASY},{EASY_SOLUTION}\n{EASY}\n")
    with pytest.raises(PuzzleError, match=r":2: expected 'puzzle,solution'"):
        load_csv(path)


def test_load_csv_rejects_a_solution_that_breaks_the_rules(tmp_path) -> None:
    relabelled = EASY_SOLUTION.translate(str.maketrans("12", "21"))
    path = tmp_path / "bad.csv"
    path.write_text(f"{EASY},{EASY_SOLUTION}\n\n{EASY},{relabelled}\n")
    with pytest.raises(PuzzleError) as info:
        load_csv(path)
    assert info.value.line == 3 and "disagrees with the givens" in info.value.reason
    assert len(load_csv(path, check=False)[0]) == 2


def test_load_csv_reports_a_missing_file(tmp_path) -> None:
    with pytest.raises(PuzzleError, match="file not found"):
        load_csv(tmp_path / "missing.csv")


def test_givens_count(pairs) -> None:
    puzzles = as_array([p for p, _ in pairs])
    np.testing.assert_array_equal(givens_count(puzzles), [81 - p.count("0") for p, _ in pairs])
    assert givens_count(puzzles[0]).tolist() == [30]


# ----------------------------------------------------------------------------------------------------------
# protocol split


def test_protocol_split_keeps_the_first_n_of_a_seeded_randomstate_permutation() -> None:
    puzzles = np.arange(50 * 81, dtype=np.int64).reshape(50, 81) % 10
    solutions = np.arange(50)[:, None].repeat(81, axis=1)
    p, s = protocol_split(puzzles, solutions, 9, seed=0)
    expected = np.random.RandomState(0).permutation(50)[:9]
    np.testing.assert_array_equal(s[:, 0], expected)
    np.testing.assert_array_equal(p, puzzles[expected])


def test_protocol_split_is_deterministic_and_depends_on_seed() -> None:
    solutions = np.arange(100)[:, None].repeat(81, axis=1)
    a = protocol_split(solutions, solutions, 10, seed=0)[1][:, 0]
    b = protocol_split(solutions, solutions, 10, seed=0)[1][:, 0]
    c = protocol_split(solutions, solutions, 10, seed=1)[1][:, 0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(set(a.tolist())) == 10


def test_protocol_split_rejects_too_many_rows() -> None:
    x = np.zeros((5, 81), np.uint8)
    with pytest.raises(ValueError, match="cannot take 6 samples from 5"):
        protocol_split(x, x, 6)


# ----------------------------------------------------------------------------------------------------------
# find_split


@pytest.mark.parametrize(
    "relative", ["test.csv", "test.csv.gz", "rrnstyle_test.csv.gz", "sudoku-hard/test.csv"]
)
def test_find_split_finds_each_layout(tmp_path, pairs, relative) -> None:
    target = tmp_path / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    data = csv_text(pairs).encode()
    target.write_bytes(gzip.compress(data) if relative.endswith(".gz") else data)
    found = find_split(tmp_path, "test")
    assert found == target
    assert len(load_csv(found)[0]) == len(pairs)


def test_find_split_finds_the_member_of_sudoku_hard_zip(tmp_path, pairs) -> None:
    build_zip(tmp_path / "sudoku-hard.zip", pairs)
    found = find_split(tmp_path, "valid")
    assert found == tmp_path / "sudoku-hard.zip" / "sudoku-hard" / "valid.csv"
    assert len(load_csv(found)[0]) == len(pairs)


def test_find_split_error_lists_what_was_looked_for(tmp_path) -> None:
    with pytest.raises(DataNotFoundError) as info:
        find_split(tmp_path, "train")
    message = str(info.value)
    for name in [
        "train.csv",
        "train.csv.gz",
        "rrnstyle_train.csv.gz",
        "sudoku-hard/train.csv",
        "sudoku-hard.zip",
    ]:
        assert name in message
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(ValueError, match="unknown split"):
        find_split(tmp_path, "dev")


# ----------------------------------------------------------------------------------------------------------
# download (offline: file:// URLs only)


def test_download_rrn_from_a_local_url_verifies_and_extracts(tmp_path, pairs) -> None:
    source = build_zip(tmp_path / "source.zip", pairs)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    dest = tmp_path / "data" / "rrn"
    out = download_rrn(dest, url=source.as_uri(), sha256=digest)
    assert out == dest / "sudoku-hard"
    assert sorted(p.name for p in out.iterdir()) == ["test.csv", "train.csv", "valid.csv"]
    assert (dest / "sudoku-hard.zip").read_bytes() == source.read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == ["sudoku-hard", "sudoku-hard.zip"]  # no leftovers
    assert len(load_csv(find_split(dest, "train"))[0]) == len(pairs)


def test_download_rrn_skips_the_download_when_data_is_present(tmp_path, pairs) -> None:
    source = build_zip(tmp_path / "source.zip", pairs)
    dest = tmp_path / "rrn"
    download_rrn(dest, url=source.as_uri())
    again = download_rrn(dest, url=(tmp_path / "gone.zip").as_uri())  # would fail if it downloaded
    assert again == dest / "sudoku-hard"


def test_download_rrn_extracts_a_zip_placed_by_hand(tmp_path, pairs) -> None:
    dest = tmp_path / "rrn"
    dest.mkdir()
    build_zip(dest / "sudoku-hard.zip", pairs)
    out = download_rrn(dest, url=(tmp_path / "unreachable.zip").as_uri())
    assert (out / "test.csv").is_file()


def test_download_rrn_unreachable_url_raises_and_leaves_nothing(tmp_path) -> None:
    dest = tmp_path / "new" / "rrn"
    with pytest.raises(DownloadError) as info:
        download_rrn(dest, url=(tmp_path / "does-not-exist.zip").as_uri(), timeout=2)
    message = str(info.value)
    assert "failed" in message
    assert str(dest / "sudoku-hard.zip") in message  # says where to put the file by hand
    assert isinstance(info.value, RuntimeError)
    assert not (tmp_path / "new").exists()


def test_download_rrn_failure_keeps_an_existing_directory_unchanged(tmp_path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(DownloadError):
        download_rrn(tmp_path, url=(tmp_path / "missing.zip").as_uri())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_download_rrn_rejects_a_file_that_is_not_the_archive(tmp_path, pairs) -> None:
    page = tmp_path / "login.html"
    page.write_text("<html>please log in</html>")
    dest = tmp_path / "rrn"
    with pytest.raises(DownloadError, match="not a zip archive"):
        download_rrn(dest, url=page.as_uri())
    assert not dest.exists()
    incomplete = build_zip(tmp_path / "partial.zip", pairs, members=("sudoku-hard/train.csv",))
    with pytest.raises(DownloadError, match="lacks valid.csv, test.csv"):
        download_rrn(dest, url=incomplete.as_uri())
    assert not dest.exists()


def test_download_rrn_rejects_a_checksum_mismatch(tmp_path, pairs) -> None:
    source = build_zip(tmp_path / "source.zip", pairs)
    dest = tmp_path / "rrn"
    with pytest.raises(DownloadError, match="checksum mismatch"):
        download_rrn(dest, url=source.as_uri(), sha256="0" * 64)
    assert not dest.exists()


# ----------------------------------------------------------------------------------------------------------
# augmentation


def test_augment_keeps_solutions_valid_and_consistent_with_givens(pairs) -> None:
    puzzles = as_array([p for p, _ in pairs] * 8)
    solutions = as_array([s for _, s in pairs] * 8)
    new_p, new_s = augment(puzzles, solutions, np.random.default_rng(0))
    assert new_p.shape == puzzles.shape and new_p.dtype == puzzles.dtype
    for p, s in zip(new_p, new_s):
        assert validate(s, p).valid
    np.testing.assert_array_equal(givens_count(new_p), givens_count(puzzles))  # blanks stay blank
    assert not np.array_equal(new_s, solutions)


def test_augment_draws_per_sample_transforms_including_transposes() -> None:
    solution = as_array([EASY_SOLUTION] * 64)
    _, out = augment(solution, solution, np.random.default_rng(1))
    assert len({row.tobytes() for row in out}) == 64
    # two givens in one row stay in one row under row/column permutations, and land in one column
    # when the sample is transposed: both must happen, about half of the time each
    marker = np.zeros((400, 81), np.uint8)
    marker[:, 0], marker[:, 1] = 5, 3
    moved, _ = augment(marker, as_array([EASY_SOLUTION] * 400), np.random.default_rng(2))
    cells = np.array([np.nonzero(row)[0] for row in moved])  # (400, 2)
    same_row = cells[:, 0] // 9 == cells[:, 1] // 9
    same_col = cells[:, 0] % 9 == cells[:, 1] % 9
    assert (same_row ^ same_col).all()
    assert 0.4 < same_col.mean() < 0.6


def test_augment_is_reproducible_with_the_same_generator_seed(pairs) -> None:
    puzzles = as_array([p for p, _ in pairs])
    solutions = as_array([s for _, s in pairs])
    a = augment(puzzles, solutions, np.random.default_rng(5))
    b = augment(puzzles, solutions, np.random.default_rng(5))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_augment_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match=r"\(n, 81\)"):
        augment(np.zeros((2, 81), np.uint8), np.zeros((3, 81), np.uint8), np.random.default_rng(0))


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_csv_files_from_spreadsheets_are_read(tmp_path, encoding: str) -> None:
    # Excel's "CSV UTF-8" starts with a byte order mark, "Unicode text" is UTF-16: hyperset-solve read both, the
    # data loader refused them
    from hyperset.sudoku.data import load_csv
    from hyperset.sudoku.exact import generate

    rows = [f"{p},{s}" for p, s in generate(5, seed=0)]
    (tmp_path / "boards.csv").write_text("\n".join(rows) + "\n", encoding=encoding)
    puzzles, solutions = load_csv(tmp_path / "boards.csv")
    assert len(puzzles) == 5 and len(load_csv(tmp_path / "boards.csv", limit=2)[0]) == 2
    plain = tmp_path / "plain.csv"
    plain.write_text("\n".join(rows) + "\n")
    assert (puzzles == load_csv(plain)[0]).all() and (solutions == load_csv(plain)[1]).all()


def test_csv_from_a_pipe_is_read(tmp_path) -> None:
    # `--data <(zcat big.csv.gz | head -2000)`: a pipe was "file not found", and a gzip check opened it twice
    import gzip
    import os
    import threading

    from hyperset.sudoku.data import load_csv
    from hyperset.sudoku.exact import generate

    text = "".join(f"{p},{s}\n" for p, s in generate(4, seed=1))
    for name, data in (("plain", text.encode()), ("gzip", gzip.compress(text.encode()))):
        fifo = tmp_path / f"{name}.fifo"
        os.mkfifo(fifo)
        writer = threading.Thread(target=lambda f=fifo, d=data: f.write_bytes(d))
        writer.start()
        assert len(load_csv(fifo)[0]) == 4, name
        writer.join()
