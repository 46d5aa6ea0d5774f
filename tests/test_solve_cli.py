"""The solver and `hyperset-solve`: formats, errors and exit codes, strategies, JSON output, validity checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import write_tiny_sudoku_checkpoint

from hyperset.cli import solve_main
from hyperset.models import save_checkpoint
from hyperset.solve import Solver
from hyperset.sudoku.exact import generate

EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
EASY_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_sudoku_checkpoint(tmp_path_factory.mktemp("ckpt") / "sudoku-tiny")


@pytest.fixture(scope="module")
def solver(tiny_checkpoint: Path) -> Solver:
    return Solver.load(tiny_checkpoint, "cpu")


def run(args: list[str], stdin: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(solve_main, args, input=stdin)
    return result.exit_code, result.stdout, result.stderr


def test_single_pass_returns_full_boards_that_keep_the_givens(solver: Solver) -> None:
    (r,) = solver.solve([EASY], iters=5, strategy="single")
    assert len(r.prediction) == 81 and "0" not in r.prediction
    assert all(p == q for p, q in zip(EASY, r.prediction) if p != "0")
    assert r.iterations == 5
    assert len(r.energy["attn"]) == 5 and len(r.energy["ff"]) == 5


def test_batch_size_changes_speed_not_answers(solver: Solver) -> None:
    from hyperset.solve import CPU_BATCH_SIZE

    puzzles = [p for p, _ in generate(7, seed=3)]
    assert solver.default_batch_size == CPU_BATCH_SIZE  # the fixture runs on the CPU
    reference = [(r.prediction, r.passes) for r in solver.solve(puzzles, iters=3)]
    for bs in (1, 3, 64):
        assert [(r.prediction, r.passes) for r in solver.solve(puzzles, iters=3, batch_size=bs)] == reference
    with pytest.raises(ValueError, match="batch size"):
        solver.solve(puzzles, batch_size=0)


def test_untrained_model_output_is_reported_invalid_not_solved(solver: Solver) -> None:
    (r,) = solver.solve([EASY], iters=3, strategy="single")
    assert not r.valid  # a random model does not solve Sudoku; the exact checker must say so
    assert r.conflicting_cells and r.reason != "valid solution"


def test_iterations_past_the_trained_depth_work_and_are_deterministic(solver: Solver) -> None:
    a = solver.solve([EASY], iters=12, strategy="single")[0]
    b = solver.solve([EASY], iters=12, strategy="single")[0]
    assert a.prediction == b.prediction and a.energy == b.energy
    assert len(a.energy["attn"]) == 12


def test_auto_strategy_stops_within_its_bound(solver: Solver) -> None:
    (r,) = solver.solve([EASY], iters="auto", max_iters=10, patience=2)
    assert 1 <= r.iterations <= 10
    assert len(r.energy["attn"]) == r.iterations


def test_commit_strategy_fills_the_board_in_several_passes(solver: Solver) -> None:
    (r,) = solver.solve([EASY], iters=3, strategy="commit", passes=5)
    assert "0" not in r.prediction and 2 <= r.passes <= 5
    assert all(p == q for p, q in zip(EASY, r.prediction) if p != "0")
    assert r.iterations == 3 * r.passes and len(r.energy["attn"]) == r.iterations  # every pass, in order
    assert r.pass_lengths == [3] * r.passes


class OracleBackend:
    """Logits that put all mass on the known solution for the boards it knows, uniform noise otherwise;
    records the batch sizes it was called with."""

    name = "oracle"

    def __init__(self, known: dict[str, str]):
        self.known, self.calls = known, []

    def __call__(self, boards: torch.Tensor, iters: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.calls.append(len(boards))
        logits = torch.randn(len(boards), 81, 9, generator=torch.Generator().manual_seed(len(self.calls)))
        for b, row in enumerate(boards.tolist()):
            for start, solution in self.known.items():
                if all(c == 0 or c == int(start[i]) for i, c in enumerate(row)):
                    logits[b] = -10.0
                    logits[b, torch.arange(81), torch.tensor([int(c) - 1 for c in solution])] = 10.0
        return logits, {"attn": torch.zeros(iters, len(boards)), "ff": torch.zeros(iters, len(boards))}


def test_commit_strategy_stops_each_board_when_it_is_valid(solver: Solver) -> None:
    hard = generate(1, seed=3)[0][0]
    oracle = OracleBackend({EASY: EASY_SOLUTION})
    solver.backend = oracle
    try:
        easy, other = solver.solve([EASY, hard], iters=2, strategy="commit", passes=4)
    finally:
        solver.backend = None
    assert easy.valid and easy.correct is None and easy.prediction == EASY_SOLUTION and easy.passes == 1
    assert other.passes == 4 and other.iterations == 8
    assert oracle.calls == [2, 1, 1, 1]  # only the unfinished board runs again


class SteppingOracle:
    """A backend that runs one iteration at a time: from iteration `at` on, the known puzzles' logits put all
    mass on their solution, the others' are noise. Records the rows each iteration ran and what was sent."""

    name, source, device, device_name = "stepping-oracle", "oracle", "cpu", "cpu"

    def __init__(self, known: dict[str, str], at: int):
        self.known, self.at, self.rows_per_step, self.sent = known, at, [], []

    def check(self, iters: int, per_iteration: bool) -> None:
        return None

    def _logits(self, boards: torch.Tensor, t: int) -> torch.Tensor:
        logits = torch.randn(len(boards), 81, 9, generator=torch.Generator().manual_seed(t))
        for b, row in enumerate(boards.tolist()):
            for start, solution in self.known.items():
                if t >= self.at and all(c == 0 or c == int(start[i]) for i, c in enumerate(row)):
                    logits[b] = -10.0
                    logits[b, torch.arange(81), torch.tensor([int(c) - 1 for c in solution])] = 10.0
        return logits

    def iterate(self, boards: torch.Tensor, iters: int):
        from hyperset.backends import BackendStep

        for t in range(1, iters + 1):
            self.rows_per_step.append(len(boards))
            e = torch.full((len(boards),), float(-t))
            rows = yield BackendStep(t, self._logits(boards, t), {"attn": e, "ff": e})
            self.sent.append(rows)
            if rows is not None:
                boards = boards[rows]

    def run(self, boards: torch.Tensor, iters: int):
        steps = list(self.iterate(boards, iters))
        return steps[-1].logits, {k: torch.stack([s.energies[k] for s in steps]) for k in ("attn", "ff")}


@pytest.mark.parametrize("per_iteration", [False, True])
@pytest.mark.parametrize("at", [3, 8])  # mid-pass, and at the pass's last iteration
def test_commit_strategy_lets_a_board_leave_at_the_iteration_it_is_valid(solver: Solver, per_iteration, at) -> None:
    from hyperset.strategy_registry import stream

    hard = generate(1, seed=3)[0][0]
    oracle = SteppingOracle({EASY: EASY_SOLUTION}, at=at)
    boards = torch.tensor([[int(c) for c in p] for p in (hard, EASY)])
    frames = list(stream(oracle, boards, "commit", 8, passes=2, per_iteration=per_iteration))
    done = {b: r for f in frames for b, r in f.done.items()}
    easy, other = done[1], done[0]
    assert easy.iterations == at and easy.pass_lengths == [at]
    assert easy.energy["attn"] == [-float(t) for t in range(1, at + 1)]
    assert "".join(map(str, easy.digits.tolist())) == EASY_SOLUTION
    assert other.iterations == 16 and other.pass_lengths == [8, 8] and len(other.energy["ff"]) == 16
    assert not bool(torch.equal(other.digits, easy.digits))
    # after iteration `at` only the hard board runs: the backend was told to keep row 0
    assert oracle.rows_per_step == [2] * at + [1] * (16 - at) and torch.equal(oracle.sent[at - 1], torch.tensor([0]))
    if per_iteration:
        its = [f for f in frames if f.kind == "iteration"]
        assert [f.boards for f in its[:at + 1]] == [[0, 1]] * at + [[0]]


def test_commit_cells_picks_confident_clash_free_blanks_only() -> None:
    from hyperset.solve import commit_cells

    board = torch.tensor([[int(c) for c in EASY]])
    digit = torch.tensor([[int(c) for c in EASY_SOLUTION]])
    digit[0, 2] = 5  # r1c3 = 5 clashes with the given 5 at r1c1
    conf = torch.linspace(0.1, 0.9, 81)[None]
    blanks = int((board == 0).sum())
    first = commit_cells(board, digit, conf, 0, 4)[0]
    last = commit_cells(board, digit, conf, 3, 4)[0]
    assert 0 < len(first) < len(last) == blanks - 1  # the share grows; the clash is never chosen
    assert 2 not in last.tolist() and all(EASY[i] == "0" for i in last.tolist())
    assert conf[0, first].min() >= conf[0, [i for i in last.tolist() if i not in first.tolist()]].max()


def test_commit_cells_never_fixes_one_digit_in_two_peer_cells() -> None:
    # every blank proposes a 5: only one per row, column and box may be fixed in a pass (fixing two peers made a
    # board that no later pass could make valid: the empty grid ended INVALID after all 16 passes)
    from hyperset.solve import commit_cells
    from hyperset.sudoku.board import conflicts

    board = torch.zeros(1, 81, dtype=torch.long)
    digit = torch.full((1, 81), 5)
    conf = torch.linspace(0.99, 0.50, 81)[None]
    for pass_index in (0, 4, 15):
        (chosen,) = commit_cells(board, digit, conf, pass_index, 16)
        after = board[0].clone()
        after[chosen] = digit[0, chosen]
        assert 1 <= len(chosen) <= 9 and conflicts(after.numpy()) == []
    (chosen,) = commit_cells(board, digit, conf, 15, 16)
    assert len(chosen) == 9  # the last pass asks for every blank: one 5 per row, column and box


def test_the_shipped_model_fills_an_empty_grid() -> None:
    (result,) = Solver.load(None, "cpu").solve(["0" * 81])
    assert result.valid, result.reason


def test_known_solution_is_compared(solver: Solver) -> None:
    (r,) = solver.solve([EASY], iters=3, solutions=[EASY_SOLUTION])
    assert r.correct is (r.prediction == EASY_SOLUTION)


def test_cli_reads_81_char_lines_grids_and_csv(tiny_checkpoint: Path, tmp_path: Path) -> None:
    grid = "\n".join(" ".join(EASY[r * 9:(r + 1) * 9]).replace("0", ".") for r in range(9))
    (tmp_path / "grid.txt").write_text(grid + "\n")
    (tmp_path / "line.txt").write_text(EASY + "\n" + EASY.replace("0", ".") + "\n")
    (tmp_path / "set.csv").write_text(f"quizzes,solutions\n{EASY},{EASY_SOLUTION}\n")
    code, out, _ = run([str(tmp_path / "grid.txt"), str(tmp_path / "line.txt"), str(tmp_path / "set.csv"),
                        "--checkpoint", str(tiny_checkpoint), "--json", "--iters", "4"])
    data = json.loads(out)
    assert [r["puzzle"] for r in data["results"]] == [EASY] * 4
    assert data["summary"]["puzzles"] == 4
    assert "board_accuracy" in data["summary"] and data["summary"]["backend"] == "torch"
    assert code in (0, 1)


def test_cli_json_has_the_documented_shape(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(EASY + "\n")
    code, out, _ = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--json", "--iters", "6",
                        "--strategy", "commit"])
    data = json.loads(out)
    (r,) = data["results"]
    assert set(r) >= {"puzzle", "prediction", "valid", "iterations", "energy"}
    assert len(r["prediction"]) == 81 and r["iterations"] == 6 * r["passes"]
    # a commit run: the energy covers every reported iteration, pass after pass
    assert len(r["energy"]["attn"]) == len(r["energy"]["ff"]) == r["iterations"]
    assert r["pass_lengths"] == [6] * r["passes"] and r["passes"] > 1
    assert set(data["summary"]) >= {"puzzles", "valid", "device", "backend", "seconds"}
    assert code == (0 if r["valid"] else 1)


def test_cli_threads_option_sets_and_reports_the_cpu_threads(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(EASY + "\n")
    before = torch.get_num_threads()
    try:
        code, out, _ = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--json", "--iters", "2",
                            "--device", "cpu", "--threads", "1"])
        assert json.loads(out)["summary"]["device"] == "cpu (1 thread)" and code in (0, 1)
    finally:
        torch.set_num_threads(before)
    code, _, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--threads", "0"])
    assert code == 2 and "--threads" in err


def test_cpu_threads_leave_busy_cores_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from hyperset.device import cpu_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    for load, expected in ((0.1, 4), (1.6, 2), (3.6, 1), (12.0, 1)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert cpu_threads() == expected, load
    assert cpu_threads(3) == 3
    with pytest.raises(ValueError, match="at least 1"):
        cpu_threads(0)


def test_cli_exit_code_2_names_the_line_of_a_malformed_puzzle(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.txt").write_text(EASY + "\n" + EASY[:80] + "\n")
    code, _, err = run([str(tmp_path / "bad.txt"), "--checkpoint", str(tiny_checkpoint)])
    assert code == 2
    assert "bad.txt:2" in err and "81" in err
    assert "Traceback" not in err


def test_cli_reports_contradictory_givens_instead_of_solving(tiny_checkpoint: Path, tmp_path: Path) -> None:
    bad = "55" + EASY[2:]
    (tmp_path / "contra.txt").write_text(bad + "\n")
    code, _, err = run([str(tmp_path / "contra.txt"), "--checkpoint", str(tiny_checkpoint)])
    assert code == 2 and "contra.txt:1: " in err and "5" in err


def test_cli_rejects_bad_iters_and_missing_checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(EASY + "\n")
    code, _, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--iters", "zero"])
    assert code == 2 and "--iters" in err
    code, _, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tmp_path / "nowhere")])
    assert code == 2 and "nowhere" in err


def test_cli_reads_stdin_and_writes_an_energy_plot(tiny_checkpoint: Path, tmp_path: Path) -> None:
    plot = tmp_path / "energy.png"
    code, out, _ = run(["-", "--checkpoint", str(tiny_checkpoint), "--iters", "6", "--plot", str(plot), "--trace"],
                       stdin=EASY + "\n")
    assert code in (0, 1)
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"
    assert "E_ATTN" in out and "trained depth" in out


def test_the_plot_suffix_picks_its_format_and_an_unknown_one_is_refused(tiny_checkpoint: Path,
                                                                        tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(EASY + "\n")
    base = [str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--iters", "2", "--strategy", "single"]
    for name, head in (("e.svg", b"<?xml"), ("e.PDF", b"%PDF"), ("e.jpg", b"\xff\xd8")):
        code, out, err = run([*base, "--plot", str(tmp_path / name)])
        assert code in (0, 1) and (tmp_path / name).read_bytes().startswith(head), (name, err)
    for name in ("e.xyz", "energy"):
        code, out, err = run([*base, "--plot", str(tmp_path / name)])
        assert code == 2 and out == "" and not (tmp_path / name).exists()
        assert "the file's suffix picks the format, one of .png, .svg, .pdf, .jpg, .jpeg" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.PDF", "e.jpg", "e.svg", "p.txt"]  # no temporary left


def test_solver_solves_when_the_model_predicts_the_solution(tiny_checkpoint: Path) -> None:
    """A stand-in backend that returns the exact solution: the pipeline must report valid and correct boards."""
    from hyperset.sudoku.exact import solve as exact_solve

    solver = Solver.load(tiny_checkpoint, "cpu")
    pairs = generate(3, 30, 34, seed=5)

    def oracle(boards: torch.Tensor, iters: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        sols = [exact_solve("".join(map(str, b.tolist()))) for b in boards]
        digits = torch.tensor([[int(c) for c in s] for s in sols])
        return torch.nn.functional.one_hot(digits - 1, 9).float() * 10, {"attn": torch.zeros(iters, len(sols))}

    solver.backend = oracle
    results = solver.solve([p for p, _ in pairs], iters=2, solutions=[s for _, s in pairs])
    assert all(r.valid and r.correct for r in results)


def test_cli_rejects_a_huge_iteration_count_at_once(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(EASY + "\n")
    code, out, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--iters", str(10**12)])
    assert code == 2 and "--iters" in err and "10,000" in err and out == ""


def test_cli_refuses_onnx_model_without_the_onnx_backend(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(EASY + "\n")
    code, out, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--iters", "2",
                          "--onnx-model", str(tmp_path / "model.onnx")])
    assert code == 2 and "--onnx-model needs --backend onnx" in err and out == ""


def test_cli_plot_to_a_missing_folder_fails_before_solving(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(EASY + "\n")
    plot = tmp_path / "no" / "such" / "energy.png"
    code, out, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--iters", "2",
                          "--plot", str(plot)])
    assert code == 2 and out == ""
    assert err.strip() == f"hyperset-solve: error: --plot: cannot write {plot}: folder {plot.parent} does not exist"


def test_cli_plot_write_failure_keeps_the_results(tiny_checkpoint: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import hyperset.cli

    def disk_full(path: str, results: list, trained: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hyperset.cli, "plot_energy", disk_full)
    (tmp_path / "p.txt").write_text(EASY + "\n")
    code, out, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--iters", "2",
                          "--strategy", "single", "--plot", str(tmp_path / "e.png")])
    assert code == 2 and "boards valid" in out and "energy plot written" not in out
    assert err.strip() == f"hyperset-solve: error: --plot: cannot write {tmp_path / 'e.png'}: No space left on device"


def test_cli_json_keeps_where_each_puzzle_came_from_and_its_warnings(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(f"# two puzzles\n{EASY}\n{'1' + '0' * 80}\n")
    code, out, _ = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--iters", "2",
                        "--strategy", "single", "--json"])
    first, second = json.loads(out)["results"]
    assert (first["source"], first["line"], first["warnings"]) == (str(tmp_path / "p.txt"), 2, [])
    assert second["line"] == 3 and "only 1 given" in second["warnings"][0]


def test_non_finite_weights_are_refused_and_non_finite_values_stay_valid_json(tiny_checkpoint: Path,
                                                                             tmp_path: Path) -> None:
    import math
    import shutil

    from hyperset.checkpoint import CheckpointError, load_tensors, save_tensors
    from hyperset.cli import _sparkline
    from hyperset.models import load_checkpoint
    from hyperset.solve import SolveResult

    model, info = load_checkpoint(tiny_checkpoint)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match="weights not saved: .* hold NaN or infinite values"):
        save_checkpoint(tmp_path / "nan", model, {"trained_iterations": 3})
    assert not (tmp_path / "nan").exists()
    # such files made by other means: the solver refuses them
    shutil.copytree(tiny_checkpoint, tmp_path / "nan")
    weights = load_tensors(tmp_path / "nan" / "model.safetensors")
    next(iter(weights.values())).fill_(float("nan"))
    save_tensors(tmp_path / "nan" / "model.safetensors", weights)
    with pytest.raises(CheckpointError, match="NaN or infinite"):
        Solver.load(tmp_path / "nan", "cpu")
    (tmp_path / "p.txt").write_text(EASY + "\n")
    code, _, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tmp_path / "nan")])
    assert code == 2 and "NaN or infinite" in err
    r = SolveResult(EASY, EASY, False, "blanks", [], 2, {"attn": [1.0, math.nan], "ff": [math.inf, 2.0]}, math.nan)
    assert json.loads(json.dumps(r.to_json(), allow_nan=False))["energy"] == {"attn": [1.0, None], "ff": [None, 2.0]}
    assert _sparkline([1.0, math.nan, 2.0]) == "▁?█" and _sparkline([math.nan]) == "?"


def test_a_long_energy_trace_is_one_short_sparkline() -> None:
    import math

    from hyperset.cli import SPARK_WIDTH, _sparkline

    falling = [1000.0 - i for i in range(1024)]  # 16 passes of 64 iterations
    line = _sparkline(falling)
    assert len(line) == SPARK_WIDTH == 30 and line[0] == "█" and line[-1] == "▁"
    assert list(line) == sorted(line, reverse=True)  # still falling, bucket by bucket
    assert _sparkline(falling[:30]) == _sparkline(falling[:30], width=1000)  # short traces keep a mark each
    holed = falling[:]
    holed[500] = math.nan
    marks = _sparkline(holed)
    assert marks.count("?") == 1 and marks.index("?") == 500 * 30 // 1024


def test_cli_version_quiet_and_trace_of_every_pass(tiny_checkpoint: Path, tmp_path: Path) -> None:
    code, out, _ = run(["--version"])
    assert code == 0 and out.startswith("hyperset-solve ")
    (tmp_path / "p.txt").write_text(EASY + "\n" + EASY + "\n")
    common = [str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--iters", "2", "--passes", "3",
              "--strategy", "commit"]
    code, out, _ = run([*common, "--quiet"])
    assert code in (0, 1) and out.count("\n") == 1 and "boards valid" in out  # the summary only
    code, out, _ = run([*common, "--quiet", "--json"])
    assert set(json.loads(out)) == {"summary"}
    code, out, _ = run([*common, "--trace"])
    assert "pass    t" in out and "     3    2" in out  # the third pass is traced too


def test_solve_iterations_of_a_checkpoint_set_the_default_depth_per_pass(tmp_path):
    """A checkpoint's solve_iterations is the depth the solver, the CLI and the app run per pass when none is given
    (the search: search_iterations per node); an explicit --iters wins; a bad value is a checkpoint error."""
    from hyperset.checkpoint import CheckpointError

    ck = write_tiny_sudoku_checkpoint(tmp_path / "m", iters=3)
    assert Solver.load(ck, "cpu").default_iters == 3
    meta = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**meta, "solve_iterations": 5}))
    solver = Solver.load(ck, "cpu")
    assert (solver.trained_iters, solver.default_iters) == (3, 5)
    puzzle = "000014200500070300000590004058400001000000006003080090870060000420805017009047000"
    assert solver.solve([puzzle], strategy="single")[0].iterations == 5
    assert solver.solve([puzzle], iters=2, strategy="single")[0].iterations == 2
    assert all(n == 5 for n in solver.solve([puzzle], passes=2, strategy="commit")[0].pass_lengths)
    # the search's first pass runs the trained depth, its nodes search_iterations (else the trained depth)
    (ck / "config.json").write_text(json.dumps({**meta, "solve_iterations": 5, "search_iterations": 2}))
    solver = Solver.load(ck, "cpu")
    r = solver.solve([puzzle])[0]
    assert r.pass_lengths[0] <= 3 and all(n == 2 for n in r.pass_lengths[1:])
    (ck / "config.json").write_text(json.dumps({**meta, "solve_iterations": 0}))
    with pytest.raises(CheckpointError, match="solve_iterations"):
        Solver.load(ck, "cpu")


def test_empty_paths_and_unreadable_checkpoint_files_are_one_line(tiny_checkpoint: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    import hyperset.checkpoint as checkpoint

    (tmp_path / "p.txt").write_text(EASY + "\n")
    for args, message in (([""], "'': an empty file name"),
                          ([str(tmp_path / "p.txt"), "--checkpoint", ""], "--checkpoint: an empty path"),
                          ([str(tmp_path / "p.txt"), "--plot", " "], "--plot: an empty path")):
        code, out, err = run(args)
        assert code == 2 and out == "" and err == f"hyperset-solve: error: {message}" + err.split(message)[1]
        assert len(err.strip().splitlines()) == 1
    # a checkpoint whose files exist but cannot be read (permissions): said so, not a traceback or "not found"
    copy = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, copy)
    real_open = open

    def denied(path: object, *args: object, **kw: object) -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(checkpoint, "open", lambda path, *a, **k: denied(path) if str(path).endswith("config.json")
                        else real_open(path, *a, **k), raising=False)
    code, _, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(copy)])
    assert code == 2
    assert err.strip() == f"hyperset-solve: error: {copy / 'config.json'}: cannot be read (Permission denied)"
    monkeypatch.setattr(checkpoint, "open", lambda path, *a, **k: denied(path) if str(path).endswith(".safetensors")
                        else real_open(path, *a, **k), raising=False)
    code, _, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(copy)])
    assert code == 2 and err.strip().endswith(f"{copy / 'model.safetensors'}: cannot be read (Permission denied)")


def test_the_summary_names_the_strategy_that_ran(tiny_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text(EASY + "\n")
    for args, name in (([], "search"), (["--strategy", "commit"], "commit"), (["--strategy", "single"], "single"),
                       (["--iters", "auto"], "auto"), (["--strategy", "auto"], "auto")):
        code, out, _ = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "-q", *args])
        assert f"— strategy {name}," in out, (args, out)


def test_trace_of_a_layer_without_energies_is_the_summary_line_not_an_empty_table(tmp_path: Path) -> None:
    """A Transformer baseline has no energy: --trace printed the table's header over no rows."""
    from hyperset.config import preset_config
    from hyperset.models import HyperSETModel

    torch.manual_seed(0)
    cfg = preset_config("sudoku-cpu", layer="transformer", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2)
    save_checkpoint(tmp_path / "t", HyperSETModel(cfg), {"trained_iterations": 2})
    puzzle = generate(1, seed=3)[0][0]
    code, out, _ = run(["-", "--checkpoint", str(tmp_path / "t"), "--iters", "2", "--trace"], stdin=puzzle + "\n")
    assert code in (0, 1) and "energy: not defined for this layer" in out
    assert "E_ATTN" not in out


def test_givens_that_leave_no_solution_are_named_before_solving(tiny_checkpoint: Path) -> None:
    """The givens clash nowhere, but r1c9 can hold no digit: the warning says so (it was a plain INVALID)."""
    puzzle = "12345678." + "........9" + "." * 63
    code, out, err = run(["-", "--checkpoint", str(tiny_checkpoint), "--iters", "1", "--passes", "1"],
                         stdin=puzzle + "\n")
    assert code == 1
    assert "warning: <stdin>:1: no solution: r1c9 can hold no digit: its row, column and box hold all nine" \
        in err
    code, out, _ = run(["-", "--checkpoint", str(tiny_checkpoint), "--iters", "1", "--passes", "1", "--json"],
                       stdin=puzzle + "\n")
    assert json.loads(out)["results"][0]["warnings"][0].startswith("no solution: r1c9")


def test_givens_without_a_solution_are_answered_at_once_and_several_solutions_are_named(tiny_checkpoint: Path
                                                                                        ) -> None:
    """No pass runs on givens the parser showed to have no solution (their reason is the verdict, in the CLI, its
    JSON and the Python API); a puzzle with two solutions is solved with a warning that says so."""
    from hyperset.solve import Solver

    none = "12345678." + "........9" + "." * 63
    two = "087000200010000080060500100008420700090050800003006000070001400020030917009240650"
    code, out, err = run(["-", "--checkpoint", str(tiny_checkpoint), "--json"], stdin=f"{none}\n{two}\n")
    first, second = json.loads(out)["results"]
    assert code == 1
    assert (first["valid"], first["iterations"], first["passes"], first["energy"]) == (False, 0, 0, {})
    assert first["reason"] == "no solution: r1c9 can hold no digit: its row, column and box hold all nine"
    assert second["iterations"] > 0
    assert second["warnings"] == ["several solutions: a valid board is one of them, not the puzzle's answer"]
    solver = Solver.load(tiny_checkpoint, "cpu")
    r_none, r_two = solver.solve([none, two], iters=2)
    assert r_none.iterations == 0 and r_none.reason == first["reason"] and r_none.warnings == first["warnings"]
    assert r_two.warnings == second["warnings"]
    # the Python API keeps the solution of a "puzzle,solution" string, as the CLI does
    medium = "000014200500070300000590004058400001000000006003080090870060000420805017009047000"
    answer = "987314265514672389362598174658429731291753846743186592875961423426835917139247658"
    (r,) = solver.solve([f"{medium},{answer}"], iters=2)
    assert r.solution == answer and r.correct == (r.prediction == answer)


def test_plot_is_refused_before_solving_for_a_layer_without_energies(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from hyperset.models import build_model, load_checkpoint, save_checkpoint

    model, info = load_checkpoint(tiny_checkpoint)
    transformer = build_model(model.cfg.replace(layer="transformer"))
    save_checkpoint(tmp_path / "t", transformer, {k: v for k, v in info.items()
                                                   if k not in ("format", "format_version", "kind", "model",
                                                                "parameters")})
    medium = "000014200500070300000590004058400001000000006003080090870060000420805017009047000"
    code, _, err = run(["-", "--checkpoint", str(tmp_path / "t"), "--plot", str(tmp_path / "e.png")],
                       stdin=medium + "\n")
    assert code == 2 and "--plot: this model's layer (transformer) defines no energy" in err
    assert not (tmp_path / "e.png").exists()


def test_puzzles_are_searched_once_and_not_at_all_with_their_solutions(tiny_checkpoint: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI hands the solver the puzzles it parsed (one search each), and the solver given the solutions
    (evaluations, benchmarks) runs none: its timing is the model's."""
    import hyperset.sudoku.parse as parse
    from hyperset.solve import Solver
    from hyperset.sudoku.parse import parse_puzzles

    calls = []
    counting = parse.count_solutions_within
    monkeypatch.setattr(parse, "count_solutions_within", lambda *a, **k: calls.append(1) or counting(*a, **k))
    medium = "000014200500070300000590004058400001000000006003080090870060000420805017009047000"
    answer = "987314265514672389362598174658429731291753846743186592875961423426835917139247658"
    solver = Solver.load(tiny_checkpoint, "cpu")
    puzzles = parse_puzzles(f"{medium}\n{medium}\n")
    assert len(calls) == 2
    solver.solve(puzzles, iters=1, strategy="single")
    assert len(calls) == 2
    solver.solve([medium, medium], iters=1, strategy="single", solutions=[answer, answer])
    assert len(calls) == 2
    solver.solve([medium], iters=1, strategy="single")
    assert len(calls) == 3


def test_plot_is_not_written_when_no_board_ran(tiny_checkpoint: Path, tmp_path: Path) -> None:
    none = "12345678." + "........9" + "." * 63
    code, _, err = run(["-", "--checkpoint", str(tiny_checkpoint), "--plot", str(tmp_path / "e.png")],
                       stdin=none + "\n")
    assert code == 1 and "--plot: no board ran an iteration" in err and not (tmp_path / "e.png").exists()


def test_the_energy_lines_end_with_their_sum(tiny_checkpoint: Path, tmp_path: Path) -> None:
    # the sum is what the iterations descend; E_ATTN alone may rise while it falls
    import re

    (tmp_path / "p.txt").write_text(EASY + "\n")
    code, out, _ = run([str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--strategy", "single",
                        "--iters", "4"])
    assert code in (0, 1)
    values = {m[1]: (float(m[2]), float(m[3])) for m in
              re.finditer(r"^  (E_ATTN|E_FF|total) +(-?[\d.]+) -> (-?[\d.]+) \(at t=", out, re.MULTILINE)}
    assert set(values) == {"E_ATTN", "E_FF", "total"}, out
    for k in (0, 1):
        assert abs(values["total"][k] - values["E_ATTN"][k] - values["E_FF"][k]) <= 0.11


def test_iters_auto_with_another_strategy_named_is_refused_not_silently_auto(tiny_checkpoint: Path,
                                                                              tmp_path: Path) -> None:
    puzzle, ck = str(tmp_path / "p.txt"), str(tiny_checkpoint)
    (tmp_path / "p.txt").write_text(EASY + "\n")
    out = CliRunner().invoke(solve_main, [puzzle, "--checkpoint", ck, "--iters", "auto", "--strategy", "single"])
    assert out.exit_code == 2 and "--iters auto runs the auto strategy" in out.output
    for extra in ([], ["--strategy", "auto"]):  # alone, or with the strategy it means
        ok = CliRunner().invoke(solve_main, [puzzle, "--checkpoint", ck, "--iters", "auto", "-q", *extra])
        assert ok.exit_code in (0, 1) and "strategy auto" in ok.output


def test_descent_keeps_every_boards_energy_from_rising_and_says_so(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """--descent: the step-length control from the second iteration on; the reported energies then never rise
    from the first iteration on, where the same boards' plain passes raise them, and the summary says it ran.
    --no-descent is the checkpoint's plain pass; a layer without the control is refused in one line."""
    (tmp_path / "p.txt").write_text("".join(p + "\n" for p, _ in generate(6, seed=5)))
    args = [str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--strategy", "single", "--iters", "12",
            "--json"]

    def energies(extra: list[str]) -> tuple[list[torch.Tensor], dict]:
        code, out, _ = run([*args, *extra])
        doc = json.loads(out)
        assert code in (0, 1)
        return [torch.tensor(r["energy"]["attn"]) + torch.tensor(r["energy"]["ff"]) for r in doc["results"]], \
            doc["summary"]

    plain, summary = energies([])
    assert "step_control" not in summary and any((e.diff() > 0).any() for e in plain)
    assert all(torch.equal(a, b) for a, b in zip(plain, energies(["--no-descent"])[0]))
    held, summary = energies(["--descent"])
    assert summary["step_control"] == {"control": "backtrack", "from_iteration": 2, "halvings": 4}
    assert all(len(e) == 12 and not (e.diff() > 0).any() for e in held)
    code, out, _ = run([*args[:-1], "-q", "--descent"])
    assert "step control: backtrack from iteration 2" in out
    code, _, err = run([*args, "--backend", "onnx", "--onnx-model", str(tmp_path / "m.onnx"), "--no-descent"])
    assert code == 2 and "--no-descent: the graph --onnx-model names runs the step control it was exported" in err
    from hyperset.config import preset_config
    from hyperset.models import HyperSETModel

    cfg = preset_config("sudoku-cpu", layer="transformer", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2)
    save_checkpoint(tmp_path / "t", HyperSETModel(cfg), {"trained_iterations": 2})
    code, out, err = run([str(tmp_path / "p.txt"), "--checkpoint", str(tmp_path / "t"), "--descent"])
    assert code == 2 and "step_control 'backtrack' controls the Hyper-SET layer" in err and "Traceback" not in err
