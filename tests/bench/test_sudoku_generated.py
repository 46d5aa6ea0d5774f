"""bench/sudoku_generated.py: generated puzzles solved, every board checked against the exact solution, and the
results split by difficulty (singles alone or more) and by givens."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import sudoku_generated  # noqa: E402


def test_the_split_by_difficulty_adds_up_and_names_its_command(tmp_path: Path) -> None:
    out = tmp_path / "generated.json"
    assert sudoku_generated.main(["--puzzles", "12", "--givens", "26", "30", "--strategy", "single", "--iters", "4",
                                  "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    easy, hard, every = doc["singles_solve"], doc["needs_more_than_singles"], doc["all"]
    assert every["puzzles"] == 12 == easy["puzzles"] + hard["puzzles"]
    assert every["solved"] == easy["solved"] + hard["solved"]
    assert sum(g["puzzles"] for g in doc["by_givens"].values()) == 12
    assert all(26 <= int(g) <= 30 for g in doc["by_givens"])
    assert doc["generator"] == "hyperset.sudoku.exact.generate(12, 26, 30, seed=5)"
    assert doc["command"].startswith("python bench/sudoku_generated.py --puzzles 12")


@pytest.mark.parametrize("args", [["--givens", "30", "22"], ["--givens", "17", "20"], ["--givens", "22", "81"]])
def test_bad_arguments_stop_before_any_work(args: list[str], capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        sudoku_generated.main(args)
    assert info.value.code == 2 and "expected LOW <= HIGH and 22 <= HIGH <= 80" in capsys.readouterr().err
