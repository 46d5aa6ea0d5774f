"""The rated puzzle generator: minimal puzzles with a unique solution, rated as documented, reproducible."""

from __future__ import annotations

import pytest

from hyperset.sudoku import rated
from hyperset.sudoku.exact import count_solutions

HARD = "060040200000807000020000000009308060001090004070000000005000009900150008000002100"  # made with seed 424242
# HARD with one given changed: no solution, though no two givens clash
NO_SOLUTION = "060040200000807000020000000009308060001090004070000000008000009900150008000002100"


def _minimal(puzzle: str, solution: str) -> bool:
    for i, ch in enumerate(puzzle):
        if ch != "0" and count_solutions(puzzle[:i] + "0" + puzzle[i + 1:]) == 1:
            return False
    return True


@pytest.mark.parametrize("bucket", ["0", "1-2", "3-10", "11-50"])
def test_generated_puzzles_are_minimal_unique_and_in_their_bucket(bucket: str) -> None:
    puzzles = rated.generate_rated(3, bucket, seed=5)
    assert len({p.puzzle for p in puzzles}) == 3
    lo, hi = rated.bucket_range(bucket)
    for p in puzzles:
        assert count_solutions(p.puzzle) == 1
        assert all(a in ("0", b) for a, b in zip(p.puzzle, p.solution))
        assert _minimal(p.puzzle, p.solution)
        assert p.rating == rated.rate(p.puzzle) and lo <= p.rating <= hi and p.bucket == bucket


@pytest.mark.slow
def test_the_same_seed_gives_the_same_puzzles_and_a_slice_is_made_again() -> None:
    whole = rated.generate_rated(5, "3-10", seed=11)
    assert rated.generate_rated(5, "3-10", seed=11) == whole
    assert rated.generate_rated(2, "3-10", seed=11, start=3) == whole[3:]
    assert rated.generate_rated(5, "3-10", seed=12) != whole


def test_the_rating_does_not_depend_on_the_names_of_the_digits() -> None:
    relabel = str.maketrans("123456789", "931567248")
    assert rated.rate(HARD) == rated.rate(HARD.translate(relabel)) == 64
    assert rated.rate(HARD, "naked") >= rated.rate(HARD)  # fewer deductions, more guesses


def test_a_puzzle_singles_solve_is_rated_0_and_one_without_a_unique_solution_is_refused() -> None:
    (easy,) = rated.generate_rated(1, "0", seed=0)
    assert rated.rate(easy.puzzle) == 0
    with pytest.raises(ValueError, match="no unique solution"):
        rated.rate(NO_SOLUTION)


def test_bucket_names_and_ranges() -> None:
    assert [rated.bucket_of(r) for r in (0, 1, 2, 3, 10, 11, 50, 51, 10**6)] == [
        "0", "1-2", "1-2", "3-10", "3-10", "11-50", "11-50", "51+", "51+"]
    assert rated.bucket_range("51+") == (51, None) and rated.bucket_range("5-20") == (5, 20)
    for bad in ("hard", "5-2", "-3"):
        with pytest.raises(ValueError):
            rated.bucket_range(bad)


@pytest.mark.slow
def test_the_python_fallback_makes_the_same_puzzles_as_the_c_library(monkeypatch: pytest.MonkeyPatch) -> None:
    if rated._library() is None:
        pytest.skip(f"no C library here: {rated.engine()}")
    monkeypatch.setattr(rated, "CHUNK", 2)
    monkeypatch.setattr(rated, "SPACING", 1)
    c = rated.generate_rated(2, "1-2", seed=3) + rated.generate_rated(1, "11-50", seed=3)
    monkeypatch.setattr(rated, "_lib", None)
    monkeypatch.setattr(rated, "_why_not", "switched off by the test")
    assert rated.engine().startswith("python")
    py = rated.generate_rated(2, "1-2", seed=3) + rated.generate_rated(1, "11-50", seed=3)
    assert py == c
    assert rated.rate(HARD) == 64  # the Python rating agrees too


def test_the_command_writes_lines_the_solver_and_trainer_read(tmp_path, capsys) -> None:
    from hyperset.sudoku.data import load_csv
    from hyperset.sudoku.parse import parse_file

    out = tmp_path / "hard.csv"
    rated.main(["-n", "3", "-b", "3-10", "-s", "2", "-o", str(out), "-q"])
    puzzles, solutions = load_csv(out)
    assert len(puzzles) == 3 and [p.givens for p in parse_file(str(out))] == [
        p.puzzle for p in rated.generate_rated(3, "3-10", seed=2)]
    rated.main(["-n", "2", "-b", "3-10", "-s", "2", "--ratings", "-q"])
    rows = capsys.readouterr().out.splitlines()
    assert [int(r.split(",")[2]) for r in rows] == [p.rating for p in rated.generate_rated(2, "3-10", seed=2)]
    for bad in (["-b", "hard"], ["-n", "-1"], ["-o", str(tmp_path)]):
        with pytest.raises(SystemExit) as e:
            rated.main(bad)
        assert e.value.code == 2


def test_the_c_count_answers_as_the_python_search_node_for_node() -> None:
    """The parser's bounded count in C gives what hyperset.sudoku.exact's search gives, at every node budget: the
    same search, so the same number of solutions or the same None past the budget."""
    from hyperset.sudoku import exact

    if rated._library() is None:
        pytest.skip(f"no C library here: {rated.engine()}")
    several = HARD[:1] + "0" + HARD[2:]  # HARD less its given at r1c2 (it is minimal: several solutions)
    norvig = ".....5.8....6.1.43..........1.5........1.6...3.......553.....61........4........."
    boards = [HARD, NO_SOLUTION, several, "0" * 81, norvig.replace(".", "0"),
              *(p.puzzle for p in rated.generate_rated(2, "51+", seed=5))]
    for board in boards:
        for nodes in (1, 2, 5, 20, 100, 1000):
            for limit in (1, 2):
                assert (rated.count_solutions_within(board, limit, nodes)
                        == exact.count_solutions_within(board, limit, nodes)), (board, nodes, limit)
    assert rated.count_solutions_within(several, 2, 1000) == 2 and rated.count_solutions_within(HARD, 2, 1000) == 1
    assert rated.count_solutions_within(NO_SOLUTION, 2, 1000) == 0
    with pytest.raises(ValueError, match="at least 1"):
        rated.count_solutions_within(HARD, 0, 10)
