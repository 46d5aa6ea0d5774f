"""The search strategy: exact checks and backtracking on a model's beliefs (tiny models, any weights)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import write_tiny_sudoku_checkpoint

from hyperset.backends import TorchBackend
from hyperset.models import HyperSETModel
from hyperset.search import search
from hyperset.solve import Solver
from hyperset.strategy_registry import REGISTRY
from hyperset.sudoku.board import validate
from hyperset.sudoku.exact import count_solutions, solve

# rated 51+ puzzles of hyperset.sudoku.rated (seed 424242): 64 and 66 dead ends for the plain search
HARD = ["060040200000807000020000000009308060001090004070000000005000009900150008000002100",
        "000000200200000109000050000010400900060080030008000060400300000580040600006002004"]
NO_SOLUTION = "060040200000807000020000000009308060001090004070000000008000009900150008000002100"  # one given changed
TWO_SOLUTIONS = "000000000000000000000000000000000000000000000000000000000000000000000000000000000"


@pytest.fixture(scope="module")
def model() -> HyperSETModel:
    from hyperset.config import ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(task="sudoku", dim=32, heads=2, ff_hidden=48, iters=2, time_dim=16, pos="grid")
    return HyperSETModel(cfg).eval()


def _run(backend, puzzles, **kw):
    boards = torch.tensor([[int(c) for c in p] for p in puzzles])
    done = {}
    for frame in search(backend, boards, kw.pop("iters", 2), **kw):
        assert frame.kind == "node"
        done.update(frame.done)
    return [done[i] for i in range(len(puzzles))]


def _text(result) -> str:
    return "".join(map(str, result.digits.tolist()))


@pytest.mark.parametrize("prior", ["model", "uniform"])
@pytest.mark.parametrize("order", ["depth", "best"])
def test_the_search_finds_the_unique_solution_of_hard_puzzles(model, prior: str, order: str) -> None:
    results = _run(TorchBackend(model, "cpu"), HARD, prior=prior, order=order)
    for p, r in zip(HARD, results):
        assert r.search.status == "solved" and _text(r) == solve(p)
        assert validate(_text(r), p).valid
        assert r.search.nodes >= 1 and r.search.backtracks >= 0


def test_the_uniform_prior_calls_no_model_and_counts_its_expansions() -> None:
    results = _run(None, HARD, prior="uniform")
    assert all(r.iterations == 0 and r.search.nodes > 1 and r.search.backtracks > 0 for r in results)


def test_a_puzzle_without_a_solution_is_proved_so(model) -> None:
    assert count_solutions(NO_SOLUTION) == 0
    for prior in ("model", "uniform"):
        (r,) = _run(TorchBackend(model, "cpu"), [NO_SOLUTION], prior=prior)
        assert r.search.status == "no solution" and not validate(_text(r), NO_SOLUTION).valid


def test_a_puzzle_with_many_solutions_gets_a_valid_one(model) -> None:
    (r,) = _run(TorchBackend(model, "cpu"), [TWO_SOLUTIONS])
    assert r.search.status == "solved" and validate(_text(r), TWO_SOLUTIONS).valid


def test_the_budget_in_nodes_is_respected_and_reported_with_the_board_reached(model) -> None:
    (r,) = _run(TorchBackend(model, "cpu"), HARD[:1], prior="uniform", nodes=3)
    assert r.search.status == "budget" and r.search.nodes == 3
    board = _text(r)
    assert all(g in ("0", b) for g, b in zip(HARD[0], board))  # the givens kept, the board reached


def test_the_budget_in_seconds_is_respected(model) -> None:
    class Slow(TorchBackend):
        def run(self, boards, iters, energies=True):
            time.sleep(0.05)
            return super().run(boards, iters, energies)

        def check(self, iters, per_iteration):
            if per_iteration:
                raise ValueError("whole passes only")

    t0 = time.perf_counter()
    (r,) = _run(Slow(model, "cpu"), HARD[:1], seconds=0.2, nodes=10_000)
    assert time.perf_counter() - t0 < 2.0
    assert r.search.status in ("budget", "solved")
    if r.search.status == "budget":
        assert r.search.nodes < 40


def test_the_search_is_deterministic(model) -> None:
    a = _run(TorchBackend(model, "cpu"), HARD, order="best")
    b = _run(TorchBackend(model, "cpu"), HARD, order="best")
    assert [(_text(x), x.search.nodes, x.search.backtracks) for x in a] == [
        (_text(x), x.search.nodes, x.search.backtracks) for x in b]


def test_a_model_whose_beliefs_are_the_solution_needs_no_backtrack() -> None:
    """An oracle backend (logits = the solution) solves every puzzle at its first node: the model alone."""
    solutions = {p: solve(p) for p in HARD}

    class Oracle:
        name = source = "oracle"
        device = device_name = "cpu"

        def check(self, iters, per_iteration):
            if per_iteration:
                raise ValueError("whole passes only")

        def run(self, boards, iters, energies=True):
            out = torch.zeros(len(boards), 81, 9)
            for i, b in enumerate(boards.tolist()):
                sol = next(s for s in solutions.values() if all(d in (0, int(c)) for d, c in zip(b, s)))
                out[i, torch.arange(81), torch.tensor([int(c) - 1 for c in sol])] = 10.0
            return out, {}

        def iterate(self, boards, iters):
            return iter(())

    results = _run(Oracle(), HARD)
    assert all(r.search.nodes == 1 and r.search.backtracks == 0 and r.search.by_model for r in results)


@pytest.mark.parametrize("first_look", [True, False])
def test_the_nodes_on_the_way_to_the_answer_are_its_decisions_and_the_answering_node(model, first_look) -> None:
    """Depth-first, every node whose board agrees with the unique solution is on the way to the answer: counted by
    recording the boards the model is asked about, they are the answer's `decisions` ancestors plus the node itself
    where the model's prediction answered (`by_model`), and the other nodes went into decisions taken back."""
    seen: list[list[int]] = []

    class Recording(TorchBackend):
        def run(self, boards, iters, energies=True):
            seen.extend(boards.tolist())
            return super().run(boards, iters, energies)

        def iterate(self, boards, iters):
            seen.extend(boards.tolist())
            return super().iterate(boards, iters)

    for p in HARD:
        seen.clear()
        (r,) = _run(Recording(model, "cpu"), [p], first_look=first_look)
        sol = [int(c) for c in solve(p)]
        on_path = sum(all(d in (0, s) for d, s in zip(b, sol)) for b in seen)
        assert r.search.status == "solved" and len(seen) == r.search.nodes and r.search.backtracks > 0
        assert on_path == r.search.decisions + int(r.search.by_model)
        assert r.search.to_json()["by_model"] == r.search.by_model


def test_the_solver_reports_nodes_backtracks_and_how_per_board(tmp_path: Path) -> None:
    solver = Solver.load(write_tiny_sudoku_checkpoint(tmp_path / "m"), "cpu")
    results = solver.solve(HARD + [NO_SOLUTION], iters=2)
    for r in results[:2]:
        j = r.to_json()
        assert r.valid and j["nodes"] >= 1 and j["backtracks"] >= 0
        assert r.how.startswith(("model alone", "model + "))
    assert not results[2].valid and results[2].search["status"] == "no solution"
    uniform = solver.solve(HARD, prior="uniform")
    assert all(r.valid and r.iterations == 0 for r in uniform)
    with pytest.raises(ValueError, match="prior"):
        solver.solve(HARD, prior="oracle")


def test_the_search_is_registered_and_offered_by_the_commands() -> None:
    from hyperset.defaults import DEFAULT_STRATEGY

    assert next(iter(REGISTRY)) == DEFAULT_STRATEGY == "search"
    out = subprocess.run([sys.executable, "-m", "hyperset.cli", "--help"], capture_output=True, text=True).stdout
    assert "search" in out and "--prior" in out and "--nodes" in out


@pytest.mark.slow
def test_the_cli_answers_a_hard_puzzle_and_says_how(tmp_path: Path) -> None:
    ck = write_tiny_sudoku_checkpoint(tmp_path / "m")
    (tmp_path / "p.txt").write_text("\n".join(HARD) + "\n")
    done = subprocess.run([sys.executable, "-m", "hyperset.cli", str(tmp_path / "p.txt"), "--checkpoint", str(ck),
                           "--json", "--threads", "1"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert all(r["valid"] and "nodes" in r and "backtracks" in r for r in data["results"])
    assert data["summary"]["search"]["budget"] == 0
    text = subprocess.run([sys.executable, "-m", "hyperset.cli", str(tmp_path / "p.txt"), "--checkpoint", str(ck),
                           "--threads", "1"], capture_output=True, text=True).stdout
    assert "search: model" in text and "boards valid" in text


def test_torch_and_onnx_backends_give_the_same_boards(model, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from hyperset.exports import export as E
    from hyperset.exports.runtime import OrtSession
    from hyperset.exports.solver_backend import OnnxSolverBackend

    loop = E.export_loop(model, tmp_path / "m.onnx", write_steps=True)
    onnx = OnnxSolverBackend(OrtSession(loop.path, "cpu", intra_op_threads=1), model=model)
    a = _run(TorchBackend(model, "cpu"), HARD)
    b = _run(onnx, HARD)
    assert [(_text(x), x.search.nodes, x.search.backtracks) for x in a] == [
        (_text(x), x.search.nodes, x.search.backtracks) for x in b]


def test_the_first_look_runs_the_model_where_the_checks_alone_would_solve_it(model) -> None:
    easy = "000014200500070300000590004058400001000000006003080090870060000420805017009047000"  # examples/medium
    backend = TorchBackend(model, "cpu")
    (looked,) = _run(backend, [easy])
    (checked,) = _run(backend, [easy], first_look=False)
    (uniform,) = _run(None, [easy], prior="uniform")
    assert looked.search.nodes == 1 and looked.iterations > 0
    assert checked.search.nodes == uniform.search.nodes == 0 and checked.iterations == 0
    assert _text(looked) == _text(checked) == solve(easy)
