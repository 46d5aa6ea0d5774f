"""`hyperset-eval sudoku|classify|mim ...`: evaluate trained (or the shipped) models."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

import click

from hyperset.cli_options import LazyGroup, error_line, version_option
from hyperset.extras import MissingExtra, require


def _loader(name: str) -> Callable[[], click.Command]:
    """What imports the `name` command (it imports torch), when it is run or looked up."""
    return lambda: getattr(importlib.import_module(f".eval_{name}", __package__), f"{name}_command")


# what `hyperset-eval --help` lists, without importing the commands: the first paragraph of each one's help
# (tests/test_startup.py checks them against the commands)
SUMMARIES = {
    "sudoku": "Board and cell accuracy of a Sudoku model (default: the shipped one) on puzzles with known solutions; "
              "on sudoku-extreme also per rating bucket.",
    "classify": "Top-1 accuracy of a classifier (default: the one shipped in the package) at N iterations.",
    "mim": "Masked image reconstruction of a token model (default: the shipped CIFAR-10 models).",
}


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             loaders={name: _loader(name) for name in SUMMARIES}, summaries=SUMMARIES)
@version_option("hyperset-eval")
def main() -> None:
    """Evaluate trained (or the shipped) models at any number of iterations."""


def _needs_extra(name: str, error: MissingExtra) -> click.Command:
    """A stand-in for a command whose extra is not installed: it says what to install (exit 2)."""

    @click.command(name, context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   add_help_option=False, help=f"(not installed) {error}")
    def command() -> None:
        click.echo(error_line(f"hyperset-eval {name}", error), err=True)
        sys.exit(2)

    return command


def _register() -> None:
    """classify and mim are stand-ins that name the extra to install where it is missing."""
    try:
        require("train", "PIL", what="hyperset-eval classify and mim")
    except MissingExtra as e:
        for name in ("classify", "mim"):
            main.add_command(_needs_extra(name, e))


_register()

if __name__ == "__main__":
    main()
