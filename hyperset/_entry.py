"""The console scripts. Each imports its command inside a guard: Ctrl-C while torch loads (the first second or two)
ends with one line and the shell's 130, as Ctrl-C does later, not with Python's traceback of the import."""

from __future__ import annotations

import importlib
import sys
from typing import Any


def _tolerant_stdout() -> None:
    """What standard output's encoding cannot hold (a cp1252 file or pipe on Windows, a Latin-1 locale) is printed
    as '?', not a UnicodeEncodeError after the work is done."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(errors="replace")
        except (ValueError, OSError):  # a stream that cannot change now
            pass


def _run(prog: str, target: str) -> Any:
    _tolerant_stdout()
    module, _, name = target.partition(":")
    try:
        command = getattr(importlib.import_module(module), name)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        sys.exit(130)
    return command()


def solve() -> Any:
    return _run("hyperset-solve", "hyperset.cli:solve_main")


def train() -> Any:
    return _run("hyperset-train", "hyperset.training.cli:main")


def evaluate() -> Any:
    return _run("hyperset-eval", "hyperset.training.evaluate:main")


def export() -> Any:
    return _run("hyperset-export", "hyperset.exports.cli:main")


def app() -> Any:
    return _run("hyperset-app", "hyperset.apps.cli:main")


def generate() -> Any:
    return _run("hyperset-generate", "hyperset.sudoku.rated:main")
