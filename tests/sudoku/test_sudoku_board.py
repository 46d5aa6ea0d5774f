"""Specification of hyperset.sudoku.board: parsing every input format, errors, formatting, validation."""

from __future__ import annotations

import gzip
import io
import sys

import numpy as np
import pytest

from hyperset.sudoku import (
    Puzzle,
    PuzzleError,
    conflicts,
    format_grid,
    parse_file,
    parse_puzzles,
    to_array,
    to_string,
    validate,
)

# The Wikipedia example puzzle and its solution.
EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
EASY_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


def rows_of(board: str) -> list[str]:
    return [board[r * 9 : r * 9 + 9] for r in range(9)]


def spaced_grid(board: str) -> str:
    return "\n".join(" ".join(row) for row in rows_of(board))


def boxed_grid(board: str) -> str:
    """The `+-------+` style with `|` between boxes."""
    sep = "+-------+-------+-------+"
    lines = [sep]
    for r, row in enumerate(rows_of(board)):
        cells = row.replace("0", ".")
        lines.append(f"| {' '.join(cells[:3])} | {' '.join(cells[3:6])} | {' '.join(cells[6:])} |")
        if r % 3 == 2:
            lines.append(sep)
    return "\n".join(lines)


def with_cell(board: str, cell: int, digit: str) -> str:
    return board[:cell] + digit + board[cell + 1 :]


# ----------------------------------------------------------------------------------------------------------
# accepted formats


def test_parse_one_line_puzzle_with_zeros() -> None:
    [p] = parse_puzzles(EASY)
    assert p == Puzzle(givens=EASY, solution=None, source="<text>", line=1, index=0)
    assert p.n_givens == 30


def test_parse_one_line_puzzles_accept_dot_underscore_and_star_blanks() -> None:
    text = "\n".join([EASY.replace("0", "."), EASY.replace("0", "_"), EASY.replace("0", "*")])
    puzzles = parse_puzzles(text)
    assert [p.givens for p in puzzles] == [EASY] * 3
    assert [p.line for p in puzzles] == [1, 2, 3]
    assert [p.index for p in puzzles] == [0, 1, 2]


def test_parse_ignores_comments_blank_lines_and_crlf() -> None:
    text = f"# my puzzles\r\n\r\n{EASY}\r\n   # indented comment\r\n{EASY_SOLUTION}\r\n"
    puzzles = parse_puzzles(text)
    assert [(p.givens, p.line) for p in puzzles] == [(EASY, 3), (EASY_SOLUTION, 5)]


def test_parse_plain_9_line_grid() -> None:
    [p] = parse_puzzles(spaced_grid(EASY))
    assert p.givens == EASY and p.line == 1


def test_parse_grid_printed_by_format_grid_round_trips() -> None:
    [p] = parse_puzzles(format_grid(EASY))
    assert p.givens == EASY


def test_parse_boxed_grid_with_plus_separators() -> None:
    [p] = parse_puzzles(boxed_grid(EASY))
    assert p.givens == EASY
    assert p.line == 2  # the first row of cells, after the top border


def test_parse_grid_with_box_drawing_characters() -> None:
    lines = []
    for r, row in enumerate(rows_of(EASY)):
        lines.append(f"║ {row[:3]} │ {row[3:6]} │ {row[6:]} ║")
        if r in (2, 5):
            lines.append("╟─────┼─────┼─────╢")
    text = "╔═════╤═════╤═════╗\n" + "\n".join(lines) + "\n╚═════╧═════╧═════╝"
    [p] = parse_puzzles(text)
    assert p.givens == EASY


def test_parse_grid_with_comma_separated_cells() -> None:
    [p] = parse_puzzles("\n".join(",".join(row) for row in rows_of(EASY)))
    assert p.givens == EASY


def test_parse_consecutive_grids_with_and_without_blank_lines() -> None:
    other = EASY_SOLUTION
    separated = parse_puzzles(spaced_grid(EASY) + "\n\n" + spaced_grid(other))
    back_to_back = parse_puzzles(spaced_grid(EASY) + "\n" + spaced_grid(other))
    assert [p.givens for p in separated] == [EASY, other]
    assert [p.givens for p in back_to_back] == [EASY, other]
    assert [p.line for p in separated] == [1, 11]
    assert [p.line for p in back_to_back] == [1, 10]


def test_parse_grid_with_blank_lines_between_bands() -> None:
    rows = rows_of(EASY)
    text = "\n".join(rows[:3]) + "\n\n" + "\n".join(rows[3:6]) + "\n\n" + "\n".join(rows[6:])
    [p] = parse_puzzles(text)
    assert p.givens == EASY


def test_parse_mixed_one_line_puzzles_and_grids() -> None:
    text = f"{EASY}\n\n{boxed_grid(EASY_SOLUTION)}\n{EASY.replace('0', '.')}\n"
    assert [p.givens for p in parse_puzzles(text)] == [EASY, EASY_SOLUTION, EASY]


def test_parse_rrn_csv_without_header() -> None:
    [p, q] = parse_puzzles(f"{EASY},{EASY_SOLUTION}\n{EASY},{EASY_SOLUTION}\n")
    assert (p.givens, p.solution, p.line) == (EASY, EASY_SOLUTION, 1)
    assert q.line == 2


@pytest.mark.parametrize("header", ["quizzes,solutions", "puzzle,solution"])
def test_parse_rrn_csv_with_header(header: str) -> None:
    [p] = parse_puzzles(f"{header}\n{EASY},{EASY_SOLUTION}\n")
    assert (p.givens, p.solution, p.line) == (EASY, EASY_SOLUTION, 2)


def test_parse_csv_with_named_columns_picks_puzzle_and_solution() -> None:
    [p] = parse_puzzles(f"id,puzzle,solution,clues\n7,{EASY},{EASY_SOLUTION},30\n")
    assert (p.givens, p.solution) == (EASY, EASY_SOLUTION)


def test_parse_csv_puzzle_without_solution() -> None:
    [p] = parse_puzzles(f"{EASY},\n")
    assert p.givens == EASY and p.solution is None


def test_parse_warns_about_fewer_than_17_givens() -> None:
    sparse = "1" + "0" * 79 + "2"
    [p] = parse_puzzles(sparse)
    assert p.warnings == ("only 2 givens: cannot have a unique solution",)
    [q] = parse_puzzles(EASY)
    assert q.warnings == ()


# ----------------------------------------------------------------------------------------------------------
# errors name source, line and reason


def test_error_message_reads_source_line_reason() -> None:
    err = PuzzleError("puzzles.txt", 3, "expected 81 cells, found 80")
    assert str(err) == "puzzles.txt:3: expected 81 cells, found 80"
    assert (err.source, err.line, err.reason) == ("puzzles.txt", 3, "expected 81 cells, found 80")
    assert isinstance(err, ValueError)
    assert str(PuzzleError("a.txt", None, "no puzzles found")) == "a.txt: no puzzles found"


def test_parse_rejects_short_line_with_line_number() -> None:
    with pytest.raises(PuzzleError) as info:
        parse_puzzles(f"# comment\n{EASY}\n{EASY[:-1]}\n", "puzzles.txt")
    assert str(info.value) == "puzzles.txt:3: expected 81 cells, found 80"


def test_parse_rejects_long_line_with_line_number() -> None:
    with pytest.raises(PuzzleError, match=r":1: expected 81 cells, found 82"):
        parse_puzzles(EASY + "1")


def test_parse_rejects_bad_character_naming_it_and_its_column() -> None:
    with pytest.raises(PuzzleError) as info:
        parse_puzzles("\n" + with_cell(EASY, 4, "y"))
    assert info.value.line == 2
    assert info.value.reason == "unexpected character 'y' at column 5"


def test_parse_rejects_grid_row_of_wrong_length() -> None:
    rows = rows_of(EASY)
    rows[4] = rows[4][:8]
    with pytest.raises(PuzzleError) as info:
        parse_puzzles("\n".join(rows))
    assert info.value.line == 5
    assert info.value.reason == "expected 9 cells in a grid row, found 8"


def test_parse_rejects_incomplete_grid_at_end_of_input() -> None:
    with pytest.raises(PuzzleError) as info:
        parse_puzzles(EASY + "\n" + "\n".join(rows_of(EASY)[:5]))
    assert info.value.line == 2
    assert "only 5 rows" in info.value.reason and "expected 9 rows" in info.value.reason


def test_parse_rejects_grid_cut_short_by_blank_line() -> None:
    text = "\n".join(rows_of(EASY)[:4]) + "\n\n" + spaced_grid(EASY)
    with pytest.raises(PuzzleError, match=r":1: grid starting here has only 4 rows before line 5"):
        parse_puzzles(text)


def test_parse_rejects_duplicate_digit_in_row_with_line_number() -> None:
    bad = with_cell(EASY, 2 * 9 + 0, "6")  # row 3 already has a 6 in column 8
    with pytest.raises(PuzzleError) as info:
        parse_puzzles(f"{EASY}\n{EASY}\n{bad}\n", "puzzles.txt")
    assert str(info.value) == "puzzles.txt:3: digit 6 appears twice in row 3 (columns 1 and 8)"


def test_parse_rejects_duplicate_digit_in_column() -> None:
    bad = with_cell(EASY, 8 * 9 + 0, "5")  # column 1 already has 5 in row 1
    with pytest.raises(PuzzleError, match=r":1: digit 5 appears twice in column 1 \(rows 1 and 9\)"):
        parse_puzzles(bad)


def test_parse_rejects_duplicate_digit_in_box() -> None:
    bad = with_cell(EASY, 1 * 9 + 2, "3")  # box 1 already has 3 at r1c2
    with pytest.raises(PuzzleError, match=r"digit 3 appears twice in box 1 \(r1c2 and r2c3\)"):
        parse_puzzles(bad)


def test_parse_grid_duplicate_points_at_the_offending_row() -> None:
    bad = with_cell(EASY, 5 * 9 + 1, "7")  # row 6 already has 7 in column 1
    with pytest.raises(PuzzleError) as info:
        parse_puzzles("# header\n" + boxed_grid(bad))
    assert info.value.line == 9  # comment, border, 3 rows, separator, then rows 4..6 on lines 7..9
    assert info.value.reason == "digit 7 appears twice in row 6 (columns 1 and 2)"


def test_parse_rejects_csv_solution_that_is_not_a_valid_grid() -> None:
    swapped = EASY_SOLUTION[1] + EASY_SOLUTION[0] + EASY_SOLUTION[2:]  # breaks columns 1 and 2
    with pytest.raises(PuzzleError) as info:
        parse_puzzles(f"puzzle,solution\n{'0' * 81},{swapped}\n")
    assert info.value.line == 2
    assert info.value.reason.startswith("solution is not a valid grid: digit")


def test_parse_rejects_csv_solution_disagreeing_with_givens() -> None:
    other = EASY_SOLUTION.translate(str.maketrans("12", "21"))  # a valid grid, but not EASY's solution
    with pytest.raises(PuzzleError) as info:
        parse_puzzles(f"{EASY},{EASY_SOLUTION}\n{EASY},{other}\n")
    assert info.value.line == 2
    assert "solution disagrees with the givens" in info.value.reason


def test_parse_rejects_csv_solution_with_blanks_or_wrong_length() -> None:
    with pytest.raises(PuzzleError, match=r":1: solution: unexpected character '0'"):
        parse_puzzles(f"{EASY},{EASY}")
    with pytest.raises(PuzzleError, match=r":1: solution: expected 81 cells, found 80"):
        parse_puzzles(f"{EASY},{EASY_SOLUTION[:-1]}")


def test_parse_rejects_csv_with_too_many_fields() -> None:
    with pytest.raises(
        PuzzleError, match=r":1: expected 'puzzle,solution' \(2 comma-separated fields\), found 3"
    ):
        parse_puzzles(f"{EASY},{EASY_SOLUTION},x")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "+-------+-------+\n"])
def test_parse_rejects_input_without_puzzles(text: str) -> None:
    with pytest.raises(PuzzleError) as info:
        parse_puzzles(text, "empty.txt")
    assert str(info.value) == "empty.txt: no puzzles found"


# ----------------------------------------------------------------------------------------------------------
# files


def test_parse_file_reads_text_and_names_the_file_in_errors(tmp_path) -> None:
    good = tmp_path / "puzzles.txt"
    good.write_text(f"{EASY}\n{boxed_grid(EASY)}\n", encoding="utf-8")
    assert [p.givens for p in parse_file(str(good))] == [EASY, EASY]
    assert parse_file(str(good))[0].source == str(good)
    bad = tmp_path / "bad.txt"
    bad.write_text(f"{EASY}\n\n{EASY[:80]}\n", encoding="utf-8")
    with pytest.raises(PuzzleError, match=r"bad\.txt:3: expected 81 cells, found 80"):
        parse_file(str(bad))


def test_parse_file_reads_gzip(tmp_path) -> None:
    path = tmp_path / "puzzles.csv.gz"
    path.write_bytes(gzip.compress(f"quizzes,solutions\n{EASY},{EASY_SOLUTION}\n".encode()))
    [p] = parse_file(str(path))
    assert p.solution == EASY_SOLUTION


def test_parse_file_reads_stdin_for_dash(monkeypatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(f"{EASY}\n{EASY[:9]}\n".encode())))
    with pytest.raises(PuzzleError) as info:
        parse_file("-")
    assert info.value.source == "<stdin>" and info.value.line == 2
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(EASY.encode())))
    assert parse_file("-")[0].givens == EASY


def test_parse_file_reports_missing_file(tmp_path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(PuzzleError) as info:
        parse_file(str(missing))
    assert str(info.value) == f"{missing}: file not found"


def test_parse_file_reports_directory(tmp_path) -> None:
    with pytest.raises(PuzzleError, match="is a directory"):
        parse_file(str(tmp_path))


def test_parse_file_rejects_binary_and_non_utf8(tmp_path) -> None:
    binary = tmp_path / "image.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(PuzzleError, match="binary file"):
        parse_file(str(binary))
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(f"{EASY}\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(PuzzleError) as info:
        parse_file(str(latin))
    assert info.value.line == 2 and "not UTF-8" in info.value.reason


def test_parse_file_reads_utf16_with_a_byte_order_mark(tmp_path) -> None:
    """What Windows Notepad ("Unicode") and PowerShell's `>` write: not a binary file."""
    path = tmp_path / "windows.txt"
    path.write_bytes(f"{EASY}\r\n{EASY[:80]}\r\n".encode("utf-16"))
    with pytest.raises(PuzzleError) as info:
        parse_file(str(path))
    assert info.value.line == 2 and "expected 81 cells" in info.value.reason
    path.write_bytes(b"\xfe\xff" + f"{EASY}\r\n".encode("utf-16-be"))  # big-endian
    assert [p.givens for p in parse_file(str(path))] == [EASY]


def test_parse_file_rejects_fake_gzip(tmp_path) -> None:
    fake = tmp_path / "puzzles.txt.gz"
    fake.write_text(EASY)
    with pytest.raises(PuzzleError, match="not a gzip file"):
        parse_file(str(fake))


# ----------------------------------------------------------------------------------------------------------
# conversion and formatting


def test_board_converts_between_string_and_array() -> None:
    arr = to_array(EASY)
    assert arr.dtype == np.uint8 and arr.shape == (81,)
    assert arr[0] == 5 and arr[2] == 0
    assert to_string(arr) == EASY
    assert to_string(EASY.replace("0", ".")) == EASY
    assert to_string(list(arr)) == EASY
    with pytest.raises(PuzzleError, match="expected 81 cells, found 80"):
        to_array(EASY[:80])
    with pytest.raises(PuzzleError, match="holds 10"):
        to_string(np.full(81, 10))


def test_format_grid_draws_separators_and_dots() -> None:
    text = format_grid(EASY)
    lines = text.splitlines()
    assert len(lines) == 11
    assert lines[0] == "5 3 . | . 7 . | . . ."
    assert lines[3] == lines[7] == "------+-------+------"
    assert format_grid(to_array(EASY)) == text


def test_format_grid_colors_givens_bold_and_filled_cells_cyan() -> None:
    text = format_grid(EASY_SOLUTION, givens=EASY, color=True)
    first = text.splitlines()[0]
    assert first.startswith("\x1b[1m5\x1b[0m \x1b[1m3\x1b[0m \x1b[36m4\x1b[0m")
    plain = format_grid(EASY_SOLUTION, givens=EASY)
    assert "\x1b" not in plain and plain == format_grid(EASY_SOLUTION)


# ----------------------------------------------------------------------------------------------------------
# conflicts and validation


def test_conflicts_lists_pairs_of_cells_with_equal_digits() -> None:
    assert conflicts(EASY) == []
    assert conflicts(EASY_SOLUTION) == []
    bad = with_cell(EASY, 1 * 9 + 2, "3")  # r2c3=3 clashes with r1c2 (box) only
    assert conflicts(bad) == [(1, 11)]
    twice = with_cell(EASY, 8, "5")  # r1c9=5 clashes with r1c1 (row 1) and r8c9 (column 9)
    assert conflicts(twice) == [(0, 8), (8, 71)]


def test_validate_accepts_the_solution() -> None:
    v = validate(EASY_SOLUTION, EASY)
    assert v.valid and v.complete and bool(v)
    assert v.conflicting_cells == [] and v.changed_givens == []
    assert validate(to_array(EASY_SOLUTION), to_array(EASY)).valid


def test_validate_reports_incomplete_board() -> None:
    v = validate(with_cell(EASY_SOLUTION, 40, "0"), EASY)
    assert not v.valid and not v.complete
    assert v.reason == "1 blank cell"


def test_validate_reports_conflicting_cells_sorted() -> None:
    # swap two cells of row 1 that are not givens: rows stay fine, columns 3 and 4 break
    bad = EASY_SOLUTION[:2] + EASY_SOLUTION[3] + EASY_SOLUTION[2] + EASY_SOLUTION[4:]
    v = validate(bad, EASY)
    assert not v.valid and v.complete
    assert v.changed_givens == []
    assert v.conflicting_cells == sorted(v.conflicting_cells) and {2, 3} <= set(v.conflicting_cells)
    assert "both hold" in v.reason


def test_validate_reports_changed_givens() -> None:
    relabelled = EASY_SOLUTION.translate(str.maketrans("12", "21"))  # valid grid, different digits
    v = validate(relabelled, EASY)
    assert not v.valid and v.complete and v.conflicting_cells == []
    assert v.changed_givens == [i for i, ch in enumerate(EASY) if ch in "12"]
    assert "given at" in v.reason


def test_validate_treats_malformed_output_as_invalid_not_as_crash() -> None:
    v = validate("123", EASY)
    assert not v.valid and v.reason == "expected 81 cells, found 3"
    assert not validate(np.full(81, 11), EASY).valid


def test_what_spreadsheets_write_is_read() -> None:
    """Quoted CSV fields, grid rows with empty cells (and a trailing comma), a one-column CSV's header."""
    rows = [EASY[9 * i: 9 * i + 9] for i in range(9)]
    for text in (f'"puzzle","solution"\n"{EASY}","{EASY_SOLUTION}"\n', f'"{EASY}","{EASY_SOLUTION}"\n'):
        (p,) = parse_puzzles(text)
        assert (p.givens, p.solution) == (EASY, EASY_SOLUTION)
    empty_cells = "\n".join(",".join("" if c == "0" else c for c in row) for row in rows)
    trailing = "\n".join(",".join(row) + "," for row in rows)
    for text in (empty_cells, trailing, f"puzzle\n{EASY}\n", f'"quizzes"\n{EASY}\n'):
        assert [p.givens for p in parse_puzzles(text)] == [EASY], text
    with pytest.raises(PuzzleError, match=":1: grid starting here has only 1 row before line 2"):
        parse_puzzles(empty_cells.replace("6,,,1,9,5,,,", "6,,,1,9,5,,", 1))


def test_lines_end_only_at_newlines_so_line_numbers_hold() -> None:
    """A form feed or another Unicode line separator inside a line neither splits it nor shifts later lines."""
    for odd in ("\x0c", "\x0b", "\x1c", "\x85", "\u2028"):
        with pytest.raises(PuzzleError, match=r"^f\.txt:3: unexpected character 'y' at column 82$"):
            parse_puzzles(f"# page{odd}break\n{EASY}\n{EASY}y\n", "f.txt")
    assert len(parse_puzzles(f"{EASY}\r\n{EASY}\r{EASY}\n")) == 3


def test_formats_from_the_wild_read_x_blanks_euler_titles_and_a_quoted_one_column_csv() -> None:
    xs = EASY.replace("0", "x")
    assert [p.givens for p in parse_puzzles(f"{xs}\n{xs.upper()}\n")] == [EASY, EASY]
    euler = "Grid 01\n" + "\n".join(rows_of(EASY)) + "\nGrid 02\n" + "\n".join(rows_of(EASY)) + "\n"
    assert [p.givens for p in parse_puzzles(euler)] == [EASY, EASY]
    assert [p.givens for p in parse_puzzles(f'"quizzes"\n"{EASY}"\n')] == [EASY]


def test_several_solutions_and_no_solution_found_only_by_search_are_warnings() -> None:
    two = "087000200010000080060500100008420700090050800003006000070001400020030917009240650"
    (p,) = parse_puzzles(two)
    assert p.no_solution is None
    assert p.warnings == ("several solutions: a valid board is one of them, not the puzzle's answer",)
    (p,) = parse_puzzles(f"{EASY},{EASY_SOLUTION}")
    assert p.warnings == () and p.no_solution is None  # a puzzle given with its solution is not searched
    none = "12345678." + "........9" + "." * 63
    (p,) = parse_puzzles(none)
    why = "no solution: r1c9 can hold no digit: its row, column and box hold all nine"
    assert p.no_solution == p.warnings[0] == why
    # a wrong given that constraint propagation does not catch: the exact search does
    hidden = "000009084073000029000000000002500600086007000400002800900230000000000047000060005"
    (p,) = parse_puzzles(hidden)
    assert p.no_solution == "no solution: a search finds no way to fill the blanks that keeps every given"


def test_the_parsers_search_is_bounded_and_an_untold_puzzle_gets_no_warning() -> None:
    """Norvig's 17-given puzzle with no solution takes a plain search minutes; the parser's search stops after
    SEARCH_NODES nodes and says nothing rather than hold the caller (the app parses on every edit)."""
    from hyperset.sudoku.exact import count_solutions_within
    from hyperset.sudoku.parse import SEARCH_NODES

    norvig = ".....5.8....6.1.43..........1.5........1.6...3.......553.....61........4........."
    assert count_solutions_within(norvig.replace(".", "0"), 2, SEARCH_NODES) is None
    (p,) = parse_puzzles(norvig)
    assert p.warnings == () and p.no_solution is None
    assert count_solutions_within(EASY, 2, 10) == 1 and count_solutions_within("0" * 81, 2, 100) == 2
