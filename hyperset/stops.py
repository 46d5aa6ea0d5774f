"""How hyperset-solve stops on Ctrl-C, SIGTERM and SIGHUP: the boards so far printed and the JSON document whole.
Importable at once (no torch): the console script installs the handlers before it imports the solver, so a signal
in the first second still ends with a whole document."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

EXIT_INTERRUPTED = 130

# the Stops the console script installed before the solver's import, which the command then takes over
_early: Stops | None = None


REDELIVER_SECONDS = 0.005


def _in_import_machinery(frame: Any) -> bool:
    """Whether the signal came while Python's own import code ran (importlib's bootstrap, as frozen)."""
    return frame is not None and str(frame.f_code.co_filename).startswith("<frozen importlib")


def imports_done() -> None:
    """A command's imports are done: the early Stops, if any, stop it now for a signal they held."""
    if _early is not None:
        _early.imported()


def interrupt_exit_code() -> int:
    """The exit code of a command stopped by an interrupt: 130 for Ctrl-C, 128 + the signal's number for a SIGTERM
    (143) or SIGHUP (129) that the early Stops turned into one."""
    return _early.exit_code() if _early is not None else EXIT_INTERRUPTED


class Signalled(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP (`timeout 60 hyperset-solve ...`, a closed ssh session): the solve stops, the
    boards so far printed, the JSON complete with "interrupted": true."""


class Stops:
    """SIGINT, SIGTERM and SIGHUP stop the solve (unless they are ignored, as under nohup), each as a
    `Signalled`; while output is written (`hold`) the stop waits until the piece is whole, so a document blocked
    on a slow pipe is never cut in two; a second signal during that wait stops at once."""

    @classmethod
    def early(cls) -> Stops:
        """Install the handlers now, for the command to take over (`current`), holding what they catch until
        `imported`: raised inside an import of numpy or torch (or C++ code calling back into Python), a stop can
        be swallowed, break the half-imported module, or abort the process."""
        global _early
        _early = cls()
        _early.holding += 1
        _early.import_hold = True
        return _early

    def imported(self) -> None:
        """The command's imports are done: a signal held since `early` stops it now (`Signalled`)."""
        if self.import_hold:
            self.import_hold = False
            self.holding -= 1
            if not self.holding and self.pending:
                self.pending = False
                raise Signalled

    @classmethod
    def current(cls) -> Stops:
        """The Stops installed early, if any, else new ones."""
        global _early
        stops, _early = _early, None
        return stops if stops is not None else cls()

    def interrupted_before_solving(self, as_json: bool, quiet: bool) -> int:
        """Stopped while loading, before any board: with --json still one whole document (nothing solved), a line
        on standard error; the exit code."""
        if as_json and sys.stdout is not None:
            with contextlib.suppress(OSError), self.hold():
                summary = {"puzzles": 0, "valid": 0, "interrupted": True, **self.by()}
                sys.stdout.write(json.dumps({"summary": summary} if quiet else {"results": [], "summary": summary})
                                 + "\n")
                sys.stdout.flush()
        if sys.stderr is not None:
            sys.stderr.write("hyperset-solve: interrupted\n")
        return self.exit_code()

    def __init__(self) -> None:
        import signal
        import threading

        self.signum: int | None = None
        self.import_hold = False
        self.holding = 0
        self.pending = False
        self.before: dict[Any, Any] = {}
        if threading.current_thread() is not threading.main_thread():  # handlers belong to the main thread
            return
        for sig, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                             (getattr(signal, "SIGHUP", None), signal.SIG_DFL)):
            if sig is not None and signal.getsignal(sig) is default:
                self.before[sig] = signal.signal(sig, self._stop)

    def _stop(self, signum: int, frame: Any) -> None:
        if _in_import_machinery(frame):
            # raised here, the stop would land in one of the import system's callbacks, which Python reports as
            # "Exception ignored" and drops (the command then ran on to the end): the signal comes again shortly
            import os
            import threading

            threading.Timer(REDELIVER_SECONDS, os.kill, (os.getpid(), signum)).start()
            return
        first = self.signum is None
        if first:
            self.signum = signum
        if self.holding and first:
            self.pending = True
            return
        raise Signalled

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """A context in which a signal waits for the end (the piece of output being written)."""
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
            if not self.holding and self.pending:
                self.pending = False
                raise Signalled

    def by(self) -> dict[str, str]:
        """{"stopped_by": "SIGTERM"} for a signal other than Ctrl-C's."""
        import signal

        return {"stopped_by": signal.Signals(self.signum).name} if self.signum not in (None, signal.SIGINT) else {}

    def exit_code(self) -> int:
        """130 for Ctrl-C; 128 + the signal's number for SIGTERM (143) and SIGHUP (129), as the shell reports them."""
        return EXIT_INTERRUPTED if self.signum is None else 128 + self.signum

    def restore(self) -> None:
        import signal

        for sig, handler in self.before.items():
            signal.signal(sig, handler)
