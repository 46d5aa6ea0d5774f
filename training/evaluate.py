"""`hyperset-eval classify|mim [CHECKPOINT] --data DIR --split test [--iters N] [--json]`."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Evaluate trained (or the shipped) models at any number of iterations."""


def _register() -> None:
    from .eval_classify import classify_command
    from .eval_mim import mim_command

    main.add_command(classify_command, "classify")
    main.add_command(mim_command, "mim")


_register()

if __name__ == "__main__":
    main()
