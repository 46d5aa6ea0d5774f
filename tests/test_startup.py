"""Start-up: --help and --version of every command without torch, and a solve without torch.compile's machinery
(bench/startup.py measures the times; these check what is imported, which does not depend on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hyperset.checkpoint import is_shipped
from hyperset.cli_options import LazyGroup
from hyperset.pretrained import pretrained_dir

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]

# runs a console script's function as the installed script does, then says which heavy modules it imported
PROBE = """
import importlib, json, sys
target, argv = sys.argv[1], sys.argv[2:]
watch = ("torch", "torch._dynamo", "torch.onnx", "gradio", "matplotlib", "onnx")
module, _, name = target.partition(":")
sys.argv = [module, *argv]
try:
    code = getattr(importlib.import_module(module), name)()  # a console script exits with what it returns
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "imported": [m for m in watch if m in sys.modules]}))
"""


def imported_by(target: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, target, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_of_every_command_import_no_torch(script: str, flag: str) -> None:
    seen = imported_by(SCRIPTS[script], flag)
    assert seen["code"] in (0, None) and seen["imported"] == [], seen


@pytest.mark.parametrize("command", ["sudoku", "classify", "mim"])
def test_the_help_of_each_training_command_imports_no_torch(command: str) -> None:
    seen = imported_by(SCRIPTS["hyperset-train"], command, "--help")
    assert seen["code"] in (0, None) and seen["imported"] == [], seen


@pytest.mark.slow
def test_solving_a_puzzle_with_the_shipped_model_imports_no_compiler_machinery() -> None:
    """torch._dynamo (torch.compile's tracer, pulled in by torch.compiler.disable, torch.library.custom_op kernels
    and Python meta kernels) takes about as long to import as torch itself; a solve needs none of it, nor the ONNX
    exporter (asked only whether an export runs)."""
    seen = imported_by(SCRIPTS["hyperset-solve"], "examples/medium.txt", "--device", "cpu", "--threads", "1")
    assert seen["code"] == 0 and seen["imported"] == ["torch"], seen


def test_the_eval_listing_says_what_each_command_says_of_itself() -> None:
    """hyperset-eval --help lists its commands from summaries (the commands import torch): each summary gives the
    line the command's own help would."""
    from hyperset.training.evaluate import SUMMARIES, main

    assert set(SUMMARIES) == set(main.commands)
    fresh = LazyGroup(loaders={}, summaries=SUMMARIES)  # nothing loaded: every line from its summary
    for name in SUMMARIES:
        command = main.commands[name]
        if (command.help or "").startswith("(not installed)"):
            continue
        for limit in (40, 60, 80, 400):
            assert fresh.listed_help(name, limit) == command.get_short_help_str(limit)


def test_only_the_shipped_models_skip_the_shapes_only_build(tmp_path: Path) -> None:
    """A checkpoint of the user's is built on the meta device before its checks (a config that disagrees with its
    weights allocates nothing); the package's own models, tested here, are built once, for real."""
    import shutil

    assert all(is_shipped(pretrained_dir(name)) for name in ("sudoku", "classifier", "mim", "mim-tokenizer"))
    copy = shutil.copytree(pretrained_dir("sudoku"), tmp_path / "sudoku")
    assert not is_shipped(copy)
