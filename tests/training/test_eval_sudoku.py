"""`hyperset-eval sudoku` and hyperset.sudoku.evaluate on a tiny model and generated puzzles."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint

from hyperset.solve import Solver
from hyperset.sudoku.evaluate import evaluate, iteration_curve, load_boards, run_strategy, to_strings
from hyperset.training.evaluate import main as eval_main


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_sudoku_checkpoint(tmp_path_factory.mktemp("ckpt") / "sudoku-tiny", dim=16, ff_hidden=32,
                                        time_dim=8, iters=2)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sudoku_csvs(tmp_path_factory.mktemp("sudoku"), 2, 12, seed=3)


@pytest.fixture(scope="module")
def solver(tiny_checkpoint: Path) -> Solver:
    return Solver.load(tiny_checkpoint, "cpu")


def invoke(args: list[str]):
    return CliRunner().invoke(eval_main, ["sudoku", *args])


def test_load_boards_reads_a_file_or_a_folder_and_draws_by_the_protocol(data_dir: Path) -> None:
    from_dir = load_boards(data_dir, "valid", boards=5, seed=1)
    from_file = load_boards(data_dir / "valid.csv", boards=5, seed=1)
    assert len(from_dir) == 5 and from_dir.available == 12 and from_dir.split == "valid"
    assert from_file.split is None and np.array_equal(from_dir.puzzles, from_file.puzzles)
    rows = (data_dir / "valid.csv").read_text().split()
    idx = np.random.RandomState(1).permutation(12)[:5]
    assert to_strings(from_dir.puzzles) == [rows[i].split(",")[0] for i in idx]
    assert len(load_boards(data_dir, "valid")) == 12  # default: 1000, or all when the file holds fewer
    with pytest.raises(ValueError, match="asked for 13 boards but the file holds 12"):
        load_boards(data_dir, "valid", boards=13)


def test_single_pass_readout_agrees_with_the_solver_at_every_depth(solver: Solver, data_dir: Path) -> None:
    boards = load_boards(data_dir, "valid")
    curve = iteration_curve(solver, boards, 4, batch_size=5)
    assert curve.board_right.shape == (4, 12) and set(curve.energy) == {"attn", "ff"}
    for depth in (1, 2, 4):
        row = run_strategy(solver, boards, "single", depth, batch_size=5)
        assert row["strategy"] == f"single@{depth}"
        assert row["board_acc"] == pytest.approx(curve.board_acc(depth))
        assert row["cell_acc"] == pytest.approx(curve.cell_acc(depth))


def test_full_boards_count_as_right(solver: Solver, data_dir: Path) -> None:
    boards = load_boards(data_dir, "valid", boards=3)
    boards.puzzles = boards.solutions.copy()  # every cell given: the readout keeps the givens
    curve = iteration_curve(solver, boards, 2)
    assert curve.board_acc(1) == curve.board_acc(2) == 1.0


def test_report_has_the_tables_of_every_depth_and_strategy(solver: Solver, data_dir: Path) -> None:
    boards = load_boards(data_dir, "valid", boards=8)
    report = evaluate(solver, boards, iters=[3, 2, 3], strategies=["single", "auto", "commit"], passes=2,
                      batch_size=4, geometry_boards=2)
    assert report["iters"] == [2, 3] and report["trained_iterations"] == 2 and report["boards"] == 8
    assert report["precision"] == "fp32"  # the solver runs the model in its weights' dtype, never autocast
    assert [r["strategy"] for r in report["strategies"]] == ["single@2", "single@3", "auto", "commit@2x2",
                                                             "commit@3x2"]
    assert len(report["per_iteration"]["board_acc"]) == 3 and len(report["per_iteration"]["effective_rank"]) == 3
    for d in ("2", "3"):
        assert sum(v["boards"] for v in report["per_givens"][d].values()) == 8
    assert report["depths"][0] == {"iters": 2, "board_acc": report["per_iteration"]["board_acc"][1],
                                   "cell_acc": report["per_iteration"]["cell_acc"][1]}
    assert all(r["mean_passes"] <= 2 for r in report["strategies"])
    json.dumps(report, allow_nan=False)


def test_cli_json_is_one_document_and_out_writes_the_same(tiny_checkpoint: Path, data_dir: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    run = invoke(["--checkpoint", str(tiny_checkpoint), "--data", str(data_dir), "--boards", "6", "--iters", "2",
                  "--iters", "3", "--strategy", "commit", "--passes", "2", "--batch-size", "4", "--threads", "1",
                  "--device", "cpu", "--json", "--out", str(out)])
    assert run.exit_code == 0, run.output
    report = json.loads(run.stdout)
    assert report == json.loads(out.read_text())
    assert report["checkpoint"] == str(tiny_checkpoint) and report["batch_size"] == 4
    assert [r["strategy"] for r in report["strategies"]] == ["commit@2x2", "commit@3x2"]
    assert [d["iters"] for d in report["depths"]] == [2, 3]


def test_cli_text_tables(tiny_checkpoint: Path, data_dir: Path) -> None:
    run = invoke(["--checkpoint", str(tiny_checkpoint), "--data", str(data_dir / "valid.csv"), "--boards", "4"])
    assert run.exit_code == 0, run.output
    for text in ("single pass, read out at each depth", "(trained depth)", "single@2", "per givens count"):
        assert text in run.stdout


def test_cli_help_and_version() -> None:
    assert invoke(["--help"]).exit_code == 0 and "--strategy" in invoke(["--help"]).output
    version = CliRunner().invoke(eval_main, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("hyperset-eval ")


@pytest.mark.parametrize("setup, args, message", [
    ("bad-line", [], "bad.csv:2: "),
    ("none", ["--split", "test"], "no test split found"),
    ("none", ["--boards", "50"], "asked for 50 boards"),
    ("none", ["--checkpoint", "nowhere/at/all"], "nowhere/at/all"),
    ("none", ["--iters", "0"], "0 is not in the range"),
    ("none", ["--strategy", "magic"], "'magic' is not one of"),
    ("none", ["--device", "quantum"], "--device"),
    ("none", ["--out", "no/such/folder/r.json"], "folder no/such/folder does not exist"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tiny_checkpoint: Path, data_dir: Path, tmp_path: Path, setup: str,
                                              args: list[str], message: str) -> None:
    data = data_dir
    if setup == "bad-line":
        rows = (data_dir / "valid.csv").read_text().splitlines()
        data = tmp_path / "bad.csv"
        data.write_text(rows[0] + "\n" + rows[1][:70] + "\n")
    run = invoke(["--checkpoint", str(tiny_checkpoint), "--data", str(data), *args])
    assert run.exit_code == 2, run.output
    assert message in run.stderr and "Traceback" not in run.stderr
