"""bench/parse_check.py: the parser's bounded count in C and in Python, timed, the same answers."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import parse_check  # noqa: E402

from hyperset.sudoku import rated  # noqa: E402


def test_each_set_is_timed_both_ways_with_the_same_answers(tmp_path: Path) -> None:
    out = tmp_path / "parse_check.json"
    parse_check.main(["--n", "6", "--buckets", "0", "3-10", "--out", str(out)])
    report = json.loads(out.read_text())
    assert list(report["sets"]) == ["rated 0", "rated 3-10"] and report["command"].startswith("python bench/")
    for row in report["sets"].values():
        assert row["puzzles"] == 6 and row["python"]["told"] == 1.0 and row["python"]["ms_mean"] > 0
        if rated._library() is not None:
            assert row["same_answers"] and row["c"]["told"] == 1.0
