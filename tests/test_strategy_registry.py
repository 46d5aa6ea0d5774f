"""The strategy registry: a new strategy is one file and one entry, and the solver, `hyperset-solve --help`,
`hyperset-eval sudoku --help` and the app then offer it (tests/toy_strategy.py is such a file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import write_tiny_sudoku_checkpoint
from toy_strategy import ENTRY

from hyperset.defaults import DEFAULT_STRATEGY
from hyperset.solve import Solver
from hyperset.strategy_registry import REGISTRY, Strategy, register_strategy, strategy_names

HERE = Path(__file__).resolve().parent


@pytest.fixture
def toy() -> Iterator[str]:
    register_strategy(Strategy(*ENTRY))
    try:
        yield ENTRY[0]
    finally:
        REGISTRY.pop(ENTRY[0])


def test_the_default_is_the_first_entry_and_the_registry_imports_no_torch() -> None:
    assert strategy_names()[0] == DEFAULT_STRATEGY and set(strategy_names()) >= {"search", "commit", "single"}
    code = "import sys, hyperset.strategy_registry, hyperset.cli; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert "torch" not in json.loads(out.stdout)


def test_an_entry_must_name_a_function() -> None:
    with pytest.raises(TypeError, match="'module:function'"):
        register_strategy(Strategy("broken", "no function", "toy_strategy"))
    assert "broken" not in REGISTRY


def test_a_registered_strategy_solves_through_the_solver(toy: str, tmp_path: Path) -> None:
    solver = Solver.load(write_tiny_sudoku_checkpoint(tmp_path / "m"), "cpu")
    puzzle = (HERE.parent / "examples" / "medium.txt").read_text().split("\n")[1].strip()
    [res] = solver.solve([puzzle], iters=3, strategy=toy)
    [plain] = solver.solve([puzzle], iters=6, strategy="single")
    assert res.iterations == 6 and res.prediction == plain.prediction and res.valid == plain.valid
    with pytest.raises(ValueError, match="twice"):  # the list of choices in the error names it
        solver.solve([puzzle], strategy="nonesuch")


def test_a_registered_strategy_is_offered_by_both_commands() -> None:
    """Registered before the commands are imported (as a plugin module would be), the strategy is a choice of
    hyperset-solve and of hyperset-eval sudoku, with its description in the solve command's --help."""
    code = (
        "import sys\n"
        "from hyperset.strategy_registry import Strategy, register_strategy\n"
        "from toy_strategy import ENTRY\n"
        "register_strategy(Strategy(*ENTRY))\n"
        "from hyperset.cli import solve_main\n"
        "from hyperset.training.eval_sudoku import sudoku_command\n"
        "for command in (solve_main, sudoku_command):\n"
        "    command.main(['--help'], standalone_mode=False)\n"
        "    print('=====')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               COLUMNS="200")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    solve_help, eval_help, _ = out.split("=====")
    assert "twice" in solve_help and "twice the asked iterations" in " ".join(solve_help.split())
    assert "twice" in eval_help


def test_a_registered_strategy_is_offered_by_the_app(toy: str, tmp_path: Path) -> None:
    pytest.importorskip("gradio")
    from test_app import tiny_mim, tiny_solver

    from hyperset.apps.app import HyperSETApp

    demo = HyperSETApp(tiny_solver(tmp_path / "m"), tiny_mim()).build()
    [radio] = [c for c in demo.blocks.values() if getattr(c, "elem_id", None) == "sudoku-strategy"]
    assert toy in [value for _, value in radio.choices] and ENTRY[1] in radio.info
