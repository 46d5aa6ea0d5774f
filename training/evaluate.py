"""`hyperset-eval sudoku|classify|mim ...`: evaluate trained (or the shipped) models."""

from __future__ import annotations

import sys

import click

from hyperset.cli_options import OneLineGroup, error_line, version_option
from hyperset.extras import MissingExtra, require

from .eval_sudoku import sudoku_command


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    main.add_command(sudoku_command, "sudoku")
    try:
        require("train", "PIL", what="hyperset-eval classify and mim")
    except MissingExtra as e:
        for name in ("classify", "mim"):
            main.add_command(_needs_extra(name, e))
        return
    from .eval_classify import classify_command
    from .eval_mim import mim_command

    main.add_command(classify_command, "classify")
    main.add_command(mim_command, "mim")


_register()

if __name__ == "__main__":
    main()
