"""Specification of hyperset.sudoku.exact: exact solver, solution counting, singles propagation, generator."""

from __future__ import annotations

import time

import numpy as np
import pytest

from hyperset.sudoku import count_solutions, generate, propagate_singles, solve, to_array, validate

# The Wikipedia example puzzle (easy: singles alone solve it).
EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
EASY_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"
# First puzzle of Gordon Royle's 17-clue collection.
ROYLE_17 = "000000010400000000020000000000050407008000300001090000300400200050100000000806000"
# "Easter Monster" (J. Mayer, 2007): one of the hardest known puzzles for human techniques.
EASTER_MONSTER = "1.......2.9.4...5...6...7...5.9.3.......7.......85..4.7.....6...3...9.8...2.....1"
EASTER_MONSTER_SOLUTION = "174385962293467158586192734451923876928674315367851249719548623635219487842736591"


@pytest.mark.parametrize(
    "puzzle",
    [EASY, ROYLE_17, EASTER_MONSTER],
    ids=["easy", "royle-17-clue", "easter-monster"],
)
def test_solve_returns_a_valid_solution_keeping_the_givens(puzzle: str) -> None:
    solution = solve(puzzle)
    assert solution is not None
    assert validate(solution, puzzle).valid


def test_solve_finds_the_known_solutions() -> None:
    assert solve(EASY) == EASY_SOLUTION
    assert solve(EASTER_MONSTER) == EASTER_MONSTER_SOLUTION
    assert solve(to_array(EASY)) == EASY_SOLUTION


def test_solve_is_fast_on_a_hard_puzzle() -> None:
    start = time.perf_counter()
    solve(EASTER_MONSTER)
    assert time.perf_counter() - start < 1.0  # typically ~10 ms; generous for a loaded machine


def test_solve_returns_none_without_solution() -> None:
    # r1c1 can hold nothing: row 1 has 1-8, column 1 has 9
    no_room = "012345678" + "900000000" + "0" * 63
    assert solve(no_room) is None
    assert count_solutions(no_room) == 0
    clashing = "55" + "0" * 79
    assert solve(clashing) is None


def test_solve_of_a_full_valid_grid_is_the_grid() -> None:
    assert solve(EASY_SOLUTION) == EASY_SOLUTION
    assert count_solutions(EASY_SOLUTION) == 1


def test_count_solutions_unique_puzzles() -> None:
    assert count_solutions(EASY) == 1
    assert count_solutions(ROYLE_17) == 1
    assert count_solutions(EASTER_MONSTER, limit=5) == 1


def test_count_solutions_multiple_and_limit() -> None:
    # an empty board has billions of solutions: counting stops at the limit
    assert count_solutions("0" * 81) == 2
    assert count_solutions("0" * 81, limit=7) == 7
    assert count_solutions(EASY_SOLUTION[:27] + "0" * 54, limit=3) == 3
    with pytest.raises(ValueError):
        count_solutions(EASY, limit=0)


def test_count_solutions_detects_two_solutions_from_a_swappable_rectangle() -> None:
    # a "deadly rectangle": digits a b / b a in two rows of different bands and two columns of one stack;
    # blanking its four cells leaves exactly two solutions (the rectangle and its swap)
    grid = EASY_SOLUTION
    for r1 in range(9):
        for r2 in range(r1 + 1, 9):
            if r1 // 3 == r2 // 3:
                continue
            for c1 in range(9):
                for c2 in range(c1 + 1, 9):
                    if c1 // 3 != c2 // 3:
                        continue
                    a, b = grid[r1 * 9 + c1], grid[r1 * 9 + c2]
                    if grid[r2 * 9 + c1] == b and grid[r2 * 9 + c2] == a:
                        cells = {r1 * 9 + c1, r1 * 9 + c2, r2 * 9 + c1, r2 * 9 + c2}
                        puzzle = "".join("0" if i in cells else ch for i, ch in enumerate(grid))
                        assert count_solutions(puzzle) == 2
                        return
    pytest.skip("no deadly rectangle in this grid")


def test_propagate_singles_solves_an_easy_puzzle_without_search() -> None:
    assert propagate_singles(EASY) == EASY_SOLUTION
    assert propagate_singles(ROYLE_17) == solve(ROYLE_17)


def test_propagate_singles_stops_where_search_is_needed_and_never_guesses() -> None:
    partial = propagate_singles(EASTER_MONSTER)
    assert "0" in partial
    for ch, given, truth in zip(partial, EASTER_MONSTER.replace(".", "0"), EASTER_MONSTER_SOLUTION):
        assert ch in ("0", truth)
        if given != "0":
            assert ch == given


def test_propagate_singles_returns_contradictory_givens_unchanged() -> None:
    clashing = "55" + "0" * 79
    assert propagate_singles(clashing) == clashing


# ----------------------------------------------------------------------------------------------------------
# generator


def test_generate_makes_unique_puzzles_with_givens_in_range() -> None:
    pairs = generate(6, min_givens=24, max_givens=30, seed=3)
    assert len(pairs) == 6
    for puzzle, solution in pairs:
        assert len(puzzle) == len(solution) == 81
        assert 24 <= 81 - puzzle.count("0") <= 30
        assert validate(solution, puzzle).valid
        assert count_solutions(puzzle) == 1


def test_generate_spreads_givens_over_the_range() -> None:
    counts = {81 - p.count("0") for p, _ in generate(12, min_givens=28, max_givens=34, seed=5)}
    assert len(counts) >= 3 and min(counts) >= 28 and max(counts) <= 34


def test_generate_is_reproducible_with_the_same_seed_and_differs_with_another() -> None:
    a = generate(3, min_givens=26, max_givens=32, seed=11)
    b = generate(3, min_givens=26, max_givens=32, seed=11)
    c = generate(3, min_givens=26, max_givens=32, seed=12)
    assert a == b
    assert a != c


def test_generate_exact_count() -> None:
    for puzzle, _ in generate(3, min_givens=30, max_givens=30, seed=0):
        assert 81 - puzzle.count("0") == 30


def test_generate_rejects_impossible_or_impractical_ranges() -> None:
    with pytest.raises(ValueError, match="fewer than 17 givens"):
        generate(1, min_givens=16, max_givens=30)
    with pytest.raises(ValueError, match="max_givens >= 22"):
        generate(1, min_givens=17, max_givens=20)
    with pytest.raises(ValueError):
        generate(1, min_givens=30, max_givens=25)
    with pytest.raises(ValueError):
        generate(-1)
    assert generate(0) == []


def test_generated_puzzles_round_trip_through_numpy() -> None:
    [(puzzle, solution)] = generate(1, min_givens=25, max_givens=35, seed=1)
    arr = to_array(puzzle)
    assert np.count_nonzero(arr) == 81 - puzzle.count("0")
    assert solve(arr) == solution


def test_contradiction_names_why_givens_without_a_clash_have_no_solution() -> None:
    """Givens that clash nowhere can still leave a cell or a digit no place; the parser warns with the reason
    (the solver used to report only its own conflicting output). Never for a puzzle that has a solution."""
    import random

    from hyperset.sudoku.board import conflicts
    from hyperset.sudoku.exact import contradiction
    from hyperset.sudoku.parse import parse_puzzles

    row1_needs_9 = "12345678." + "........9" + "." * 63
    assert contradiction(row1_needs_9.replace(".", "0")) == (
        "r1c9 can hold no digit: its row, column and box hold all nine")
    puzzle = parse_puzzles(row1_needs_9)[0]
    assert puzzle.warnings == ("no solution: r1c9 can hold no digit: its row, column and box hold all nine",)
    rng, flagged = random.Random(0), 0
    for givens, _ in generate(30, seed=4):
        assert contradiction(givens) is None
        for _ in range(10):  # one more given: a contradiction only when no solution is left
            cell = rng.randrange(81)
            if givens[cell] != "0":
                continue
            changed = givens[:cell] + str(rng.randint(1, 9)) + givens[cell + 1:]
            if conflicts(changed):
                continue
            why = contradiction(changed)
            assert why is None or count_solutions(changed, 1) == 0, changed
            flagged += why is not None
    assert flagged > 20
