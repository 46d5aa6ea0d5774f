"""A command that needs an extra which is not installed says which one to install (exit 2, one line)."""

from __future__ import annotations

import importlib.util

import pytest
from click.testing import CliRunner

from hyperset.cli import solve_main
from hyperset.extras import MissingExtra, require


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch):
    """Pretend the named top-level modules are not installed."""
    real = importlib.util.find_spec

    def hide(*names: str) -> None:
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, **k: None if name.split(".")[0] in names else real(name, *a, **k))

    return hide


def test_require_names_the_extra_and_the_pip_command(without) -> None:
    without("onnx")
    with pytest.raises(MissingExtra, match=r"pip install 'hyperset\[onnx\]'"):
        require("onnx", "onnx", "json", what="export")
    require("app", "json")  # present: nothing happens


@pytest.mark.parametrize("args, extra", [(["--backend", "onnx"], "onnx"), (["--plot", "e.png"], "app")])
def test_solve_options_that_need_an_extra_fail_before_any_work(without, tmp_path, args, extra) -> None:
    without("onnx", "onnxruntime", "matplotlib")
    puzzle = tmp_path / "p.txt"
    puzzle.write_text("000014200500070300000590004058400001000000006003080090870060000420805017009047000\n")
    result = CliRunner().invoke(solve_main, [str(puzzle), *[a if a != "e.png" else str(tmp_path / a) for a in args]])
    assert result.exit_code == 2
    assert f"hyperset[{extra}]" in result.output and "Traceback" not in result.output
