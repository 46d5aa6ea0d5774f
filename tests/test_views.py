"""Symmetry views: transforms that keep a Sudoku a Sudoku, answers mapped back, the exact check picks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_tiny_sudoku_checkpoint

from hyperset.backends import TorchBackend
from hyperset.models import HyperSETModel
from hyperset.search import search
from hyperset.solve import Solver
from hyperset.strategy_registry import REGISTRY, stream
from hyperset.sudoku.board import validate
from hyperset.sudoku.exact import solve
from hyperset.views import beliefs_back, to_views, view_maps

HARD = ["060040200000807000020000000009308060001090004070000000005000009900150008000002100",
        "000000200200000109000050000010400900060080030008000060400300000580040600006002004"]


def _boards(puzzles: list[str]) -> torch.Tensor:
    return torch.tensor([[int(c) for c in p] for p in puzzles])


def _text(t: torch.Tensor) -> str:
    return "".join(map(str, t.tolist()))


@pytest.fixture(scope="module")
def model() -> HyperSETModel:
    from hyperset.config import ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(task="sudoku", dim=32, heads=2, ff_hidden=48, iters=2, time_dim=16, pos="grid")
    return HyperSETModel(cfg).eval()


def test_every_view_of_a_solution_is_a_solution_and_of_a_puzzle_its_puzzle() -> None:
    src, relabel = view_maps(16)
    assert src.shape == (17, 81) and relabel.shape == (17, 10)
    assert (src[0] == torch.arange(81)).all() and (relabel[0] == torch.arange(10)).all()
    assert len({tuple(s) for s in src.tolist()}) == 17  # distinct transforms
    solutions = [solve(p) for p in HARD]
    views_p = to_views(_boards(HARD), src, relabel)
    views_s = to_views(_boards(solutions), src, relabel)
    for v in range(17):
        for j in range(len(HARD)):
            puzzle, sol = _text(views_p[v, j]), _text(views_s[v, j])
            assert validate(sol, puzzle).valid  # the transformed solution solves the transformed puzzle
            assert solve(puzzle) == sol  # and it is that puzzle's only solution
    assert view_maps(16)[0].equal(src)  # the same transforms every time


def test_beliefs_mapped_back_put_each_views_answer_on_the_puzzles_cells_and_digits() -> None:
    src, relabel = view_maps(5)
    solutions = _boards([solve(p) for p in HARD])
    views_s = to_views(solutions, src, relabel)  # (V, B, 81)
    one_hot = torch.nn.functional.one_hot(views_s - 1, 9).float()
    back = beliefs_back(one_hot, src, relabel)
    assert (back.argmax(-1) + 1 == solutions[None]).all()


class _OneViewOracle:
    """Answers with the solution only where the board is view `k` of a puzzle; elsewhere flat beliefs."""

    name = source = "oracle"
    device = device_name = "cpu"

    def __init__(self, puzzles: list[str], k: int, views: int):
        src, relabel = view_maps(views)
        self.answers = {}
        sol_views = to_views(_boards([solve(p) for p in puzzles]), src, relabel)
        for j, row in enumerate(to_views(_boards(puzzles), src, relabel)[k]):
            self.answers[tuple(row.tolist())] = sol_views[k, j]
        self.calls = 0

    def check(self, iters, per_iteration):
        if per_iteration:
            raise ValueError("whole passes only")

    def run(self, boards, iters, energies=True):
        self.calls += len(boards)
        out = torch.zeros(len(boards), 81, 9)
        for i, b in enumerate(boards.tolist()):
            sol = self.answers.get(tuple(b))
            if sol is not None:
                out[i, torch.arange(81), sol - 1] = 10.0
        return out, {}

    def iterate(self, boards, iters):
        return iter(())


def _done(frames) -> dict:
    done = {}
    for f in frames:
        done.update(f.done)
    return done


def test_the_views_strategy_takes_the_view_the_exact_check_passes_and_maps_it_back() -> None:
    oracle = _OneViewOracle(HARD, 3, 6)
    done = _done(stream(oracle, _boards(HARD), "views", 2, views=6))
    for j, p in enumerate(HARD):
        info = done[j].search
        assert _text(done[j].digits) == solve(p) and info.status == "solved"
        assert info.view == 3 and info.views == 7 and info.nodes == 7
    assert oracle.calls == 7 * len(HARD)


def test_no_valid_view_is_reported_as_such_not_as_solved() -> None:
    oracle = _OneViewOracle(HARD, 5, 6)
    done = _done(stream(oracle, _boards(HARD), "views", 2, views=3))  # view 5 is not among 3
    assert all(d.search.status == "budget" and d.search.view is None for d in done.values())
    assert not any(validate(_text(d.digits), p).valid for d, p in zip(done.values(), HARD))


def test_the_search_can_take_the_views_as_its_first_look() -> None:
    oracle = _OneViewOracle(HARD, 2, 4)
    frames = list(search(oracle, _boards(HARD), 2, views=4))
    done = _done(frames)
    assert all(d.search.view == 2 and d.search.nodes == 5 and d.search.backtracks == 0 for d in done.values())
    # without views the same beliefs give nothing at the root: the search branches and still answers
    plain = _done(search(_OneViewOracle(HARD, 2, 4), _boards(HARD), 2, nodes=5000))
    assert all(_text(plain[j].digits) == solve(p) and plain[j].search.view is None for j, p in enumerate(HARD))


def test_views_are_deterministic_and_their_iteration_frames_show_the_puzzle_as_given(model) -> None:
    backend = TorchBackend(model, "cpu")
    a = _done(stream(backend, _boards(HARD), "views", 3, views=4))
    b = _done(stream(backend, _boards(HARD), "views", 3, views=4))
    assert all(a[j].digits.equal(b[j].digits) and a[j].search.model_iterations == b[j].search.model_iterations
               for j in a)
    frames = list(stream(backend, _boards(HARD), "views", 3, views=4, per_iteration=True))
    steps = [f for f in frames if f.kind == "iteration"]
    assert steps and all(set(f.boards) <= {0, 1} for f in steps)
    for f in steps:
        for j, row in zip(f.boards, f.digits):
            given = _boards([HARD[j]])[0]
            assert (row[given > 0] == given[given > 0]).all()  # the puzzle's own cells, not a transform's


def test_the_search_with_views_answers_hard_puzzles_and_counts_every_view(model) -> None:
    backend = TorchBackend(model, "cpu")
    done = _done(search(backend, _boards(HARD), 2, views=3))
    for j, p in enumerate(HARD):
        assert _text(done[j].digits) == solve(p) and done[j].search.nodes >= 4


def test_torch_and_onnx_backends_give_the_same_views(model, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from hyperset.exports import export as E
    from hyperset.exports.runtime import OrtSession
    from hyperset.exports.solver_backend import OnnxSolverBackend

    loop = E.export_loop(model, tmp_path / "m.onnx", write_steps=True)
    onnx = OnnxSolverBackend(OrtSession(loop.path, "cpu", intra_op_threads=1), model=model)
    a = _done(stream(TorchBackend(model, "cpu"), _boards(HARD), "views", 2, views=4))
    b = _done(stream(onnx, _boards(HARD), "views", 2, views=4))
    assert [_text(a[j].digits) for j in a] == [_text(b[j].digits) for j in b]


@pytest.mark.slow
def test_the_views_strategy_is_registered_and_the_cli_reports_the_view(tmp_path: Path) -> None:
    assert "views" in REGISTRY
    ck = write_tiny_sudoku_checkpoint(tmp_path / "m")
    solver = Solver.load(ck, "cpu")
    (r,) = solver.solve(HARD[:1], strategy="views", views=2)
    assert r.search["views"] == 3 and r.how is not None and r.search["model_iterations"] > 0
    for bad in (-1, 64, 1.5):
        with pytest.raises(ValueError, match="views"):
            solver.solve(HARD[:1], strategy="views", views=bad)
    (tmp_path / "p.txt").write_text(HARD[0] + "\n")
    done = subprocess.run([sys.executable, "-m", "hyperset.cli", str(tmp_path / "p.txt"), "--checkpoint", str(ck),
                           "--strategy", "views", "--views", "2", "--threads", "1"], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    assert "view" in done.stdout and "strategy views" in done.stdout
