"""Argument types shared by the benchmark scripts, so that bad input stops a benchmark before any work with one
line, "SCRIPT: error: REASON" after the usage, and exit status 2 (argparse's convention), never a traceback.

    ap.add_argument("--rounds", type=bench_args.count, default=7)      # an integer >= 1
    ap.add_argument("--images", type=bench_args.at_least(0), ...)      # 0 allowed
    ap.add_argument("--iters", type=bench_args.iterations, ...)        # an iteration count, 1..MAX_ITERS
    ap.add_argument("--out", type=bench_args.output_file, ...)         # a JSON file that can be written
    ap.add_argument("--preset", type=bench_args.preset, ...)           # a known model preset
    ap.add_argument("--device", type=bench_args.device, ...)           # cpu, or cuda[:N] where PyTorch sees one
    ap.add_argument("--peer", type=bench_args.peer_checkout, ...)      # a checkout of huyunzhe/hyper-set
    ap.add_argument("--compile-options", type=bench_args.compile_options)  # a JSON object of Inductor settings

Errors a script can only find once it runs (an override of an unknown config field, a package the authors' model
imports, a GPU without bf16, a missing data folder or checkpoint, an --out that cannot be written after all) end it
the same way, without the usage, where its main is decorated with `input_errors_exit`.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hyperset.checkpoint import CheckpointError
from hyperset.config import MAX_ITERS, ModelConfig, check_table, list_presets, preset_config
from hyperset.sudoku.board import PuzzleError
from hyperset.training.recipes import parse_value


class BenchInputError(Exception):
    """Bad input found after the arguments parsed; the message is the reason, for the user."""


def _number(kind: Callable[[str], Any], what: str, ok: Callable[[Any], bool]) -> Callable[[str], Any]:
    """An argparse type: `kind(text)` where `ok` holds for it, else an error saying `what` was expected."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text}")
        return value

    parse.__name__ = what
    return parse


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`."""
    return _number(int, f"an integer >= {minimum}", lambda v: v >= minimum)


count = at_least(1)
seconds = _number(float, "a positive number of seconds", lambda v: 0 < v < math.inf)
ratio = _number(float, "a fraction in [0, 1]", lambda v: 0 <= v <= 1)


def counts(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1 ("1,16,128")."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 1, got {text!r}")
    return [count(p) for p in parts]


def _can_make_files_in(folder: Path) -> bool:
    """Whether a file can be made in `folder`: write and search permission, and a file system that takes new files
    (root passes the permission test even on /proc or /sys, so an unnamed file is made and dropped to be sure)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def _nearest_folder_takes_files(text: str, folders: Any) -> None:
    """The first of `folders` that exists is a folder where files can be made, else an ArgumentTypeError."""
    for folder in folders:
        if folder.exists():
            if not folder.is_dir():
                raise argparse.ArgumentTypeError(f"cannot write {text}: {folder} is a file, not a folder")
            if not _can_make_files_in(folder):
                raise argparse.ArgumentTypeError(f"cannot write {text}: no files can be made in {folder}")
            return


def output_file(text: str) -> Path:
    """An argparse type: a file a script will write at its end, checked before it measures: a path, in a folder
    that exists or can be made (no part of it a file) and where files can be made, where the file is not a
    folder, and not a .png (the scripts write their plot beside the JSON, as the same name with .png)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    path = Path(text)
    if path.suffix.lower() == ".png":
        raise argparse.ArgumentTypeError(f"{text}: expected the JSON file to write, not a .png (the plot is "
                                         "written beside the JSON, as its name with .png)")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if path.exists() and not path.is_file():  # a device or a pipe: the write would replace it
        raise argparse.ArgumentTypeError(f"{text} is not a regular file")
    _nearest_folder_takes_files(text, path.parents)
    return path


def output_folder(text: str) -> Path:
    """An argparse type: a folder a script will write its files into at its end, checked before it measures: a
    folder that exists or can be made (no part of it a file) and where files can be made."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path")
    path = Path(text)
    _nearest_folder_takes_files(text, (path, *path.parents))
    return path


def iterations(text: str) -> int:
    """An argparse type: an iteration count, 1..MAX_ITERS."""
    value = count(text)
    if value > MAX_ITERS:
        raise argparse.ArgumentTypeError(f"iterations are at most {MAX_ITERS:,}, got {value}")
    return value


def iteration_counts(text: str) -> list[int]:
    """An argparse type: comma-separated iteration counts, each 1..MAX_ITERS ("16,64")."""
    values = counts(text)
    if max(values) > MAX_ITERS:
        raise argparse.ArgumentTypeError(f"iterations are at most {MAX_ITERS:,}, got {max(values)}")
    return values


def preset(text: str) -> str:
    """An argparse type: the name of a model preset."""
    if text not in list_presets():
        raise argparse.ArgumentTypeError(f"unknown preset {text!r}; choose from: {', '.join(list_presets())}")
    return text


def device_problem(text: str) -> str | None:
    """Why `text` names no device these benchmarks can run on, or None: "cpu", or "cuda" / "cuda:N" where PyTorch
    sees that GPU."""
    try:
        dev = torch.device(text)
    except RuntimeError:
        return f"expected cpu, cuda or cuda:N, got {text!r}"
    if dev.type not in ("cpu", "cuda"):
        return f"expected cpu, cuda or cuda:N, got {text!r}"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return f"{text}: PyTorch sees no CUDA device (torch {torch.__version__})"
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            return f"{text}: PyTorch sees {torch.cuda.device_count()} CUDA device(s)"
    return None


def device(text: str) -> str:
    """An argparse type: a device `device_problem` finds nothing wrong with."""
    problem = device_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def peer_checkout(text: str) -> Path:
    """An argparse type: a checkout of huyunzhe/hyper-set (a folder with sudoku/models.py), made absolute."""
    path = Path(text).expanduser()
    if not (path / "sudoku" / "models.py").is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a checkout of huyunzhe/hyper-set (no sudoku/models.py)")
    return path.resolve()


def compile_options(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object of torch.compile's Inductor settings (`torch.compile(..., options=...)`),
    '{"max_autotune": true, "cpp.simdlen": 256}': each key a setting of `torch._inductor.config` (dotted for the
    nested ones), each value of its default's type where the default is not None, or null."""
    from torch._inductor import config as inductor

    try:
        options = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({e.msg})") from None
    if not isinstance(options, dict) or not options:
        raise argparse.ArgumentTypeError(f"expected a non-empty JSON object of Inductor settings, got {text!r}")
    known = inductor.get_config_copy()
    for key, value in options.items():
        if key not in known:
            raise argparse.ArgumentTypeError(f"{key!r} is not a setting of torch._inductor.config "
                                             f"(torch {torch.__version__})")
        default = known[key]
        kinds = (int, float) if type(default) is float else (type(default),)
        if default is not None and value is not None and type(value) not in kinds:
            raise argparse.ArgumentTypeError(f"{key}: expected a {type(default).__name__} like its default "
                                             f"{default!r}, got {value!r}")
    return options


def model_config(name: str, sets: list[str]) -> ModelConfig:
    """Preset `name` with `KEY=VALUE` overrides (values read as hyperset-train's --set reads them: TOML syntax, else
    a bare string); a malformed override, an unknown key or a value the config refuses is a `BenchInputError`
    naming it."""
    overrides: dict[str, Any] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise BenchInputError(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = parse_value(value)
    try:
        check_table(ModelConfig, overrides, "model")
        return preset_config(name, **overrides)
    except (KeyError, ValueError) as e:
        raise BenchInputError(e.args[0] if e.args else str(e)) from None


# the environment that changes what the library runs, and so what a benchmark measures
CHOICE_VARIABLES = ("HYPERSET_CPU_MATMUL", "HYPERSET_CPU_PRECISION", "HYPERSET_CPU_KERNELS", "HYPERSET_CPU_GEMM")


def command_line(script: str, argv: list[str] | None) -> str:
    """The command a benchmark ran, as a shell would take it back: "python bench/SCRIPT.py ARGS", each argument
    quoted where it needs to be (a JSON value of --compile-options, a path with spaces), after the settings of
    `CHOICE_VARIABLES` the process had (``HYPERSET_CPU_MATMUL=onednn python ...``)."""
    settings = [f"{k}={shlex.quote(os.environ[k])}" for k in CHOICE_VARIABLES if os.environ.get(k)]
    return " ".join([*settings, shlex.join(["python", f"bench/{script}.py",
                                            *(argv if argv is not None else sys.argv[1:])])])


INPUT_ERRORS = (BenchInputError, OSError, CheckpointError, PuzzleError)

_TEMP_BESIDE = re.compile(r"\.(?P<name>.+)\.\d+\.[^.]+\.tmp")


def reason(e: BaseException) -> str:
    """The one-line reason of an input error: a file that cannot be read or written as "PATH: STRERROR", where
    PATH is the file a script writes rather than the temporary file beside it that the write starts with."""
    if isinstance(e, OSError) and e.filename is not None:
        path = Path(os.fsdecode(e.filename))
        temp = _TEMP_BESIDE.fullmatch(path.name)
        if temp:
            path = path.with_name(temp["name"])
        return f"{path}: {e.strerror or e}"
    return str(e)


def input_errors_exit(main: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates a script's main: an input error (`INPUT_ERRORS`: a `BenchInputError`, a file or folder that
    cannot be read or written, a checkpoint or puzzle file that does not load) ends the script with
    "SCRIPT: error: REASON" on standard error and status 2, as argparse ends it for a bad argument, instead of a
    traceback."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except INPUT_ERRORS as e:
            print(f"{Path(sys.argv[0]).name}: error: {reason(e)}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:  # Ctrl-C: one line and the shell's 130, as the hyperset-* commands
            print(f"{Path(sys.argv[0]).name}: interrupted", file=sys.stderr)
            sys.exit(130)

    return run



def save_figure(fig: Any, path: Path, dpi: int = 110) -> None:
    """A matplotlib figure written to `path` (its suffix picks the format) atomically, then closed."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    try:
        fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    tmp.replace(path)


def stop_process(proc: Any, seconds: float = 15) -> None:
    """SIGTERM, then SIGKILL if `proc` (a subprocess.Popen) has not ended within `seconds`."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(seconds)
