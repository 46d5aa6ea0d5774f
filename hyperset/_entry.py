"""The console scripts. Each imports its command inside a guard: Ctrl-C while torch loads (the first second or two)
ends with one line and the shell's 130, as Ctrl-C does later, not with Python's traceback of the import."""

from __future__ import annotations

import errno
import importlib
import io
import sys
from collections.abc import Callable
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


# errors of a write to standard output that mean it cannot take the results (a full disk, /dev/full, a lost device)
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT, errno.EBADF, errno.EINVAL})


class _ClosedStdout(io.TextIOBase):
    """Standard output when the shell closed it: Python leaves `sys.stdout` None, and a print to None is silently
    lost; a write here fails as a write to a closed descriptor does."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not text:
            return 0
        raise OSError(errno.EBADF, "standard output is closed")

    def isatty(self) -> bool:
        return False


def _say(line: str) -> None:
    if sys.stderr is not None:
        sys.stderr.write(line + "\n")


def _run(prog: str, target: str, prints_results: bool = True, interrupted: Callable[[], int] | None = None) -> Any:
    """Run a command: with standard output closed (`>&-`), the first result a command prints there fails (exit 2,
    not an exit 0 that printed nothing; one that writes only files runs as usual); a write to standard output
    that fails, while the command runs or when its output is flushed at the end, is one line and exit 2, not a
    traceback."""
    _tolerant_stdout()
    asks = {"-h", "--help", "-V", "--version"} & set(sys.argv[1:])  # what they print is the result
    if sys.stdout is None and (prints_results or asks):
        sys.stdout = _ClosedStdout()
    module, _, name = target.partition(":")
    try:
        result = getattr(importlib.import_module(module), name)()
    except KeyboardInterrupt:  # in the import, or in a command's own start before it handles Ctrl-C itself
        if interrupted is not None:
            sys.exit(interrupted())
        from .stops import interrupt_exit_code

        _say(f"{prog}: interrupted")
        sys.exit(interrupt_exit_code())
    except SystemExit:
        _flush_stdout(prog)
        raise
    except OSError as e:
        if e.filename is None and e.errno in _OUTPUT_ERRNOS:
            _output_failed(prog, e)
        raise
    _flush_stdout(prog)
    return result


def _output_failed(prog: str, error: OSError) -> None:
    from .cli_options import output_failed

    output_failed(prog, error, "the results to standard output")


def _flush_stdout(prog: str) -> None:
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except OSError as e:
        _output_failed(prog, e)


def _early_stops(prog: str) -> Any:
    """The Stops of a command installed before its imports (hyperset.stops), or an exit on a Ctrl-C that came
    even before."""
    try:
        from .stops import Stops

        return Stops.early()
    except KeyboardInterrupt:
        _say(f"{prog}: interrupted")
        sys.exit(130)


def solve() -> Any:
    # a signal while the solver imports waits for the import to end, then ends with a whole JSON document
    stops = _early_stops("hyperset-solve")
    args = sys.argv[1:]
    as_json, quiet = "--json" in args, "--quiet" in args or "-q" in args
    return _run("hyperset-solve", "hyperset.cli:solve_main",
                interrupted=lambda: stops.interrupted_before_solving(as_json, quiet))


def train() -> Any:
    return _run("hyperset-train", "hyperset.training.cli:main", prints_results=False)


def evaluate() -> Any:
    return _run("hyperset-eval", "hyperset.training.evaluate:main")


def export() -> Any:
    return _run("hyperset-export", "hyperset.exports.cli:main")


def app() -> Any:
    return _run("hyperset-app", "hyperset.apps.cli:main", prints_results=False)


def generate() -> Any:
    _early_stops("hyperset-generate")  # SIGTERM and SIGHUP too end it as Ctrl-C does, its temporary file removed
    return _run("hyperset-generate", "hyperset.sudoku.rated:main")
