"""Options that mean one thing in every command (`hyperset-train`, `hyperset-eval`, `hyperset-export`), as in
`hyperset-solve`:

    --device      auto | cpu | cuda (auto: CUDA when usable, else Apple MPS, else the CPU; cuda:N names a GPU)
    --threads N   PyTorch CPU threads
    --batch-size  items per forward pass
    --json        exactly one JSON document on standard output (messages go to standard error)
    --version     the installed hyperset version

A renamed option keeps its old name as a hidden alias that still works and says it is deprecated
(`renamed_option`). A usage error is one line, `PROG: error: MESSAGE`, exit 2 (`OneLineCommand`,
`OneLineGroup`), where click prints the usage, a hint and the message.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, NoReturn

import click

from .files import atomic_write_json, folder_problem, json_safe, package_version, replace_problem


class FiniteFloat(click.FloatRange):
    """A float option that is a number: click's FloatRange lets nan through (every comparison with it is false)
    and inf through an open upper bound."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def one_line(text: str) -> str:
    """`text` as one line of plain text: line ends and other control characters (a file name may hold them, a
    terminal would act on them) written as Python escapes."""
    return text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def error_line(prog: str, message: Any) -> str:
    """The one line every command prints for an error: `PROG: error: MESSAGE`."""
    return f"{prog}: error: {one_line(str(message))}"


def usage_error_line(error: click.UsageError, prog_name: str | None) -> str:
    """A click usage error as the one line every command prints: `PROG: error: MESSAGE`."""
    where = error.ctx.command_path if error.ctx is not None else (prog_name or "hyperset")
    return error_line(where, error.format_message())


class Interrupted(Exception):
    """A Ctrl-C (or a SIGTERM or SIGHUP turned into one) that ended a command: `main` prints one line."""


class _OneLineErrors:
    """The standalone `main` of a click command or group, with a usage error (a bad option value, an unknown
    option, a missing argument) printed as one line, exit 2; --help, --version and the command's own exits are
    click's."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)  # type: ignore[misc]
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)  # type: ignore[misc]
        except click.exceptions.NoArgsIsHelpError as e:  # a group called without a command: its help, as click
            e.show()
            sys.exit(e.exit_code)
        except click.UsageError as e:
            click.echo(usage_error_line(e, prog_name), err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except (Interrupted, click.exceptions.Abort) as e:
            if isinstance(e, Interrupted) or isinstance(e.__cause__, KeyboardInterrupt):
                # Ctrl-C (SIGTERM, SIGHUP: see hyperset.stops) in a command that does not handle it itself
                from .stops import interrupt_exit_code

                prog = prog_name or os.path.basename(sys.argv[0]) or getattr(self, "name", None) or "hyperset"
                click.echo(f"{prog}: interrupted", err=True)
                sys.exit(interrupt_exit_code())
            click.echo("Aborted!", err=True)
            sys.exit(1)
        # without standalone mode click returns the command's value, or the code of a ctx.exit (--help: 0)
        sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        """The command, with standard output whose reader closed it (`| head`, `| true`) ending it silently with
        EXIT_CLOSED_PIPE, as Unix tools end, before click's own handler turns it into a silent exit 1 (which means
        "some boards not solved" / "parity mismatch")."""
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except BrokenPipeError:
            closed_pipe_exit()
        except KeyboardInterrupt as e:  # past click's own handler, which prints an empty line first
            raise Interrupted from e


EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: the reader of standard output closed it, as a shell reports a tool it ended


def closed_pipe_exit() -> NoReturn:
    """The reader of standard output is gone (`| head` has what it wanted): no message, exit EXIT_CLOSED_PIPE."""
    stdout_to_devnull()
    sys.exit(EXIT_CLOSED_PIPE)


def output_failed(prog: str, error: OSError, what: str) -> NoReturn:
    """Standard output took no more: its reader closed it (`| head`): a silent exit, as Unix tools end; anything
    else (a full disk, a closed descriptor): "PROG: error: cannot write WHAT: REASON", exit 2. What is still
    buffered goes to /dev/null, or Python would fail again flushing it at exit."""
    if isinstance(error, BrokenPipeError):
        closed_pipe_exit()
    stdout_to_devnull()
    if sys.stderr is not None:
        sys.stderr.write(error_line(prog, f"cannot write {what}: {error.strerror or error}") + "\n")
    sys.exit(2)


def stdout_to_devnull() -> None:
    """After a failed write to standard output: what is still buffered goes to /dev/null, or Python would fail
    again flushing it at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's capture), or no stdout
        pass


class OneLineCommand(_OneLineErrors, click.Command):
    """A click command whose usage errors are one line (`cls=OneLineCommand`)."""


class OneLineGroup(_OneLineErrors, click.Group):
    """A click group whose usage errors, its subcommands' included, are one line (`cls=OneLineGroup`)."""


class LazyCommands(MutableMapping):
    """A group's subcommands by name, each made by its loader (an import) when first looked up."""

    def __init__(self, loaders: dict[str, Callable[[], click.Command]]) -> None:
        self.loaders = dict(loaders)
        self.loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded:
            self.loaded[name] = self.loaders[name]()
        return self.loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self.loaders[name] = lambda: command
        self.loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self.loaders[name]
        self.loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.loaders)

    def __len__(self) -> int:
        return len(self.loaders)


class LazyGroup(OneLineGroup):
    """A OneLineGroup whose subcommands are imported when one is run or looked up (`loaders`: name -> a function
    that imports and returns it), and whose --help lists them from `summaries` (the first paragraph of each one's
    help) without importing them: they import torch, seconds before any help is printed."""

    def __init__(self, *args: Any, loaders: dict[str, Callable[[], click.Command]], summaries: dict[str, str],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = LazyCommands(loaders)
        self.summaries = summaries

    def listed_help(self, name: str, limit: int) -> str:
        """What --help lists for command `name`: its own short help once loaded, else its summary's."""
        if name in self.commands.loaded:
            return self.commands.loaded[name].get_short_help_str(limit)
        return click.Command(name, help=self.summaries[name]).get_short_help_str(limit)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        if names:
            limit = formatter.width - 6 - max(map(len, names))  # as click's own listing
            with formatter.section("Commands"):
                formatter.write_dl([(name, self.listed_help(name, limit)) for name in names])


DEVICE_HELP = "auto | cpu | cuda (or cuda:N) | mps"


def version_option(prog: str) -> Callable[[Any], Any]:
    """--version, -V: prints "PROG VERSION" and exits 0."""
    return click.version_option(package_version(), "--version", "-V", prog_name=prog, message="%(prog)s %(version)s")


def device_option(default: str = "auto", help: str | None = None) -> Callable[[Any], Any]:
    """--device, checked by hyperset.device.pick_device where the command starts its work."""
    return click.option("--device", default=default, show_default=True, help=help or DEVICE_HELP)


def threads_option(help: str | None = None) -> Callable[[Any], Any]:
    """--threads N: PyTorch CPU threads (default: the cores that other work leaves idle, unless `help` says)."""
    return click.option("--threads", type=click.IntRange(1, 1024), default=None,
                        help=help or "CPU threads [default: the cores that other work leaves idle]")


def json_option(help: str = "print one JSON document") -> Callable[[Any], Any]:
    return click.option("--json", "as_json", is_flag=True, help=help)


def out_option() -> Callable[[Any], Any]:
    """--out FILE: the command's JSON document also written to a file, atomically (checked before any work with
    `check_output_file`, written with `write_json_out`)."""
    return click.option("--out", "-o", type=click.Path(dir_okay=False), default=None,
                        help="also write the JSON document to this file (atomically)")


def checkpoint_input(default: str | None, shown_default: str | None = None) -> Callable[[Any], Any]:
    """The model a command reads, as an optional CHECKPOINT argument or as `--checkpoint` (one command of a family
    took one form and its siblings the other): the function gets `checkpoint` (`default` when neither is given);
    both naming different models is a usage error."""

    def decorate(f: Any) -> Any:
        @functools.wraps(f)
        def wrapper(*args: Any, checkpoint: str | None, checkpoint_option: str | None, **kwargs: Any) -> Any:
            if checkpoint is not None and checkpoint_option is not None and checkpoint != checkpoint_option:
                raise click.UsageError(f"CHECKPOINT {checkpoint!r} and --checkpoint {checkpoint_option!r} name "
                                       "different models: give one")
            chosen = checkpoint if checkpoint is not None else checkpoint_option
            if chosen is not None and not chosen.strip():  # not the current folder, as Path("") would make it
                raise click.UsageError("CHECKPOINT: an empty path (leave it out for the default model)")
            return f(*args, checkpoint=chosen if chosen is not None else default, **kwargs)

        option = click.option("--checkpoint", "checkpoint_option", default=None, metavar="NAME|DIR",
                              help="checkpoint folder, or the name of a shipped model; also accepted as the "
                                   f"CHECKPOINT argument [default: {shown_default or default}]")
        return click.argument("checkpoint", required=False)(option(wrapper))

    return decorate


def write_json_out(prog: str, out: str, obj: Any) -> None:
    """The --out file: strict JSON (as `echo_json` prints), written atomically; a failure is one line, exit 2."""
    try:
        atomic_write_json(out, json_safe(obj))
    except OSError as e:
        click.echo(f"{prog}: error: --out: cannot write {out}: {e.strerror or e}", err=True)
        sys.exit(2)


def echo_json(obj: Any) -> None:
    """Print ``obj`` as one line of strict JSON (NaN and infinities become null)."""
    click.echo(json.dumps(json_safe(obj), allow_nan=False))


def renamed_option(*decls: str, old: str, **kw: Any) -> Callable[[Any], Any]:
    """A click option plus a hidden ``old`` name for it: ``old VALUE`` still works, warns on standard error that
    it is deprecated, and gives VALUE to the option (unless the new name is given too, which then wins)."""
    new = next(d for d in decls if d.startswith("--"))
    key = f"renamed:{old}"

    def take_old(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is not None:
            click.echo(f"warning: {old} is deprecated and will be removed; use {new}", err=True)
            ctx.meta[key] = value

    def prefer_old(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if key in ctx.meta and source in (click.core.ParameterSource.DEFAULT, None):
            return ctx.meta[key]
        return value

    def decorator(f: Any) -> Any:
        f = click.option(*decls, callback=prefer_old, **kw)(f)
        return click.option(old, f"renamed_{old.lstrip('-').replace('-', '_')}", type=kw.get("type"),
                            default=None, hidden=True, expose_value=False, callback=take_old)(f)

    return decorator


def check_output_file(option: str, path: str) -> None:
    """A file an option will write: its folder must exist and be writable (no folder is created for it), and what
    stands at the path must be a regular file or nothing (never a link, a FIFO or a device, which the write would
    replace)."""
    if not str(path).strip():
        raise click.UsageError(f"{option}: an empty path")
    why = folder_problem(path) or replace_problem(path)
    if why is not None:
        raise click.UsageError(f"{option}: cannot write {path}: {why}")
