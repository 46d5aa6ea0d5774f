"""Output that cannot be written, through the real console scripts: standard output full (/dev/full) or closed
(`>&-`) is one line and exit 2 for every command that prints results, never a traceback or an exit 0 that printed
nothing; hyperset-generate writes its puzzles as they come, never through a link, with the file mode a plainly
created file gets, and refuses a rating range out of its reach at once."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint

ROOT = Path(__file__).resolve().parents[1]
# as a terminal starts a command: a suite run in the background (`pytest &`, nohup) starts its children with SIGINT
# (and SIGHUP) ignored, which the commands then rightly leave alone
_AS_A_TERMINAL = ("import os, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                  "signal.signal(signal.SIGTERM, signal.SIG_DFL); signal.signal(signal.SIGHUP, signal.SIG_DFL)\n")


def script(name: str, *args: str, stdout: int | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """The console script `name` (hyperset._entry's function) with `args`; stdout None: closed, as `>&-`."""
    cmd = [sys.executable, "-c", f"from hyperset import _entry; _entry.{name}()", *args]
    if stdout is None:  # the child starts with descriptor 1 closed
        cmd = ["sh", "-c", 'exec "$@" >&-', "sh", *cmd]
    return subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=timeout)


def _has_onnx() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


def one_error_line(proc: subprocess.CompletedProcess[str], prog: str, reason: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"{prog}: error: {reason}"], proc.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny checkpoint and a CSV of two puzzles with their solutions."""
    root = tmp_path_factory.mktemp("faults")
    ckpt = write_tiny_sudoku_checkpoint(root / "ckpt")
    write_sudoku_csvs(root, 0, 2, seed=1)
    return ckpt, root / "valid.csv"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["full", "closed"])
def test_results_to_unwritable_standard_output_are_one_line_and_exit_2(tiny: tuple[Path, Path], where: str,
                                                                        tmp_path: Path) -> None:
    ckpt, data = tiny
    runs = [("evaluate", "hyperset-eval", ["sudoku", str(ckpt), "--data", str(data), "--boards", "1"]),
            ("generate", "hyperset-generate", ["-n", "2", "-b", "0", "-q"]),
            ("solve", "hyperset-solve", [str(data), "--checkpoint", str(ckpt)])]
    for name, prog, args in runs:
        if where == "full":
            with open("/dev/full", "w") as full:
                proc = script(name, *args, stdout=full.fileno())
            reason = "No space left on device"
        else:
            proc = script(name, *args)
            reason = "standard output is closed"
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (prog, proc.stderr)
        lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
        assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and (
            reason in lines[0] or "nowhere to print the results" in lines[0]), (prog, proc.stderr)


def test_generate_with_its_output_closed_still_writes_a_file(tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    proc = script("generate", "-n", "2", "-b", "0", "-q", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert len(out.read_text().splitlines()) == 2


def test_generate_never_writes_through_a_link_and_gives_files_the_usual_mode(tmp_path: Path) -> None:
    target = tmp_path / "target.csv"
    target.write_text("keep me\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    proc = script("generate", "-n", "2", "-b", "0", "-q", "-o", str(link), stdout=subprocess.PIPE)
    one_error_line(proc, "hyperset-generate", f"--out {link} is a symbolic link: it would be replaced, not written "
                   "through (give the path it points to); not written")
    assert link.is_symlink() and target.read_text() == "keep me\n"
    fresh = tmp_path / "fresh.csv"
    proc = subprocess.run(["sh", "-c", 'umask 022 && exec "$@"', "sh", sys.executable, "-c",
                           "from hyperset import _entry; _entry.generate()", "-n", "2", "-b", "0", "-q", "-o",
                           str(fresh)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary file left


def test_generate_refuses_a_rating_range_out_of_reach_at_once() -> None:
    from hyperset.sudoku.rated import MAX_LOWEST_RATING

    proc = script("generate", "-n", "1", "-b", f"{MAX_LOWEST_RATING + 1}+", stdout=subprocess.PIPE, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"a lowest rating above {MAX_LOWEST_RATING:,} is out of" in proc.stderr


def test_generate_streams_its_puzzles(tmp_path: Path) -> None:
    """A million puzzles into `head -2`: the first lines come as they are made and the closed pipe ends the
    command at once (nothing held until the end, no cap needed on -n)."""
    code = "from hyperset import _entry; _entry.generate()"
    proc = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{code}" -n 1000000 -b 0 -q | head -2'], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and all(len(ln) == 163 for ln in lines), proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_while_the_solver_imports_still_ends_with_a_whole_json_document(tmp_path: Path, sig: str) -> None:
    """The first second of hyperset-solve is the import of torch and the solver: a signal there (`timeout 0.3
    hyperset-solve ... --json`) waits for the import to end (raised inside it, it could break numpy's import or
    abort in C++), then ends with a whole JSON document saying it was interrupted, and the shell's code."""
    import json
    import signal

    puzzles = tmp_path / "p.txt"
    puzzles.write_text("530070000600195000098000060800060003400803001700020006060000280000419005000080079\n")
    code = (_AS_A_TERMINAL + "import importlib; from hyperset import _entry; real = importlib.import_module\n"
            "def once(*a, **k):\n    importlib.import_module = real\n"
            f"    os.kill(os.getpid(), signal.{sig})\n    return real(*a, **k)\n"
            "importlib.import_module = once\n_entry.solve()")
    proc = subprocess.run([sys.executable, "-c", code, str(puzzles), "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    number = getattr(signal, sig)
    assert proc.returncode == 128 + number, proc.stderr
    by = {} if sig == "SIGINT" else {"stopped_by": sig}
    assert json.loads(proc.stdout) == {"results": [], "summary": {"puzzles": 0, "valid": 0, "interrupted": True,
                                                                  **by}}
    assert proc.stderr == "hyperset-solve: interrupted\n"


@pytest.mark.parametrize("name", ["generate", "train", "app", "evaluate", "export"])
def test_help_and_version_into_closed_or_full_output_are_exit_2(name: str) -> None:
    """--help and --version print their result to standard output like any other: lost, they are exit 2."""
    for flag in ("--help", "-V"):
        closed = script(name, flag)
        assert closed.returncode == 2 and "standard output is closed" in closed.stderr, (flag, closed.stderr)
        with open("/dev/full", "w") as full:
            filled = script(name, flag, stdout=full.fileno())
        assert filled.returncode == 2 and "No space left on device" in filled.stderr, (flag, filled.stderr)
        assert "Traceback" not in closed.stderr + filled.stderr


def _signalled_at(module: str, function: str, sig: str) -> str:
    """Python code that runs a console script with `module.function` sending `sig` to the process first."""
    return (_AS_A_TERMINAL + f"import {module} as m; real = m.{function}\n"
            f"def hit(*a, **k):\n    os.kill(os.getpid(), signal.{sig})\n    return real(*a, **k)\n"
            f"m.{function} = hit\n")


@pytest.mark.slow
@pytest.mark.skipif(not _has_onnx(), reason="the onnx extra")
def test_an_interrupted_export_is_one_line_and_leaves_nothing_under_its_names(tiny: tuple[Path, Path],
                                                                              tmp_path: Path) -> None:
    """Ctrl-C during --parity, after the Loop graph and its step, stem and head graphs were written: one line,
    the shell's 130, and none of the files left."""
    import signal

    sig = "SIGINT"
    ckpt, _ = tiny
    out = tmp_path / "m.onnx"
    code = _signalled_at("hyperset.exports.export", "parity", sig) + (
        "import sys; sys.argv[0] = 'hyperset-export'; from hyperset import _entry; _entry.export()")
    proc = subprocess.run([sys.executable, "-c", code, str(ckpt), "--loop", "--parity", "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr
    assert proc.stderr == "hyperset-export: interrupted\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_an_interrupted_eval_is_one_line_with_the_shells_code(tiny: tuple[Path, Path]) -> None:
    import signal

    sig = "SIGINT"
    ckpt, data = tiny
    code = _signalled_at("hyperset.sudoku.data", "load_csv", sig) + ("import sys; sys.argv[0] = 'hyperset-eval'; "
                                                                     "from hyperset import _entry; _entry.evaluate()")
    proc = subprocess.run([sys.executable, "-c", code, "sudoku", str(ckpt), "--data", str(data), "--boards", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr
    assert proc.stderr == "hyperset-eval: interrupted\n"


@pytest.mark.slow
@pytest.mark.skipif(not _has_onnx(), reason="the onnx extra")
def test_an_export_refused_for_one_of_its_files_writes_none(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, _ = tiny
    os.mkfifo(tmp_path / "m.head.onnx")
    proc = script("export", str(ckpt), "--loop", "-o", str(tmp_path / "m.onnx"), stdout=subprocess.PIPE)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert f"{tmp_path / 'm.head.onnx'} is a FIFO, not a regular file: it would be replaced by one" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.head.onnx"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_an_interrupted_generate_is_one_line_and_leaves_no_file(tmp_path: Path, sig: str) -> None:
    import signal

    out = tmp_path / "g.csv"
    code = _signalled_at("hyperset.sudoku.rated", "iter_rated", sig) + (
        "import sys; sys.argv[0] = 'hyperset-generate'; from hyperset import _entry; _entry.generate()")
    proc = subprocess.run([sys.executable, "-c", code, "-n", "3", "-b", "0", "-q", "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr
    assert proc.stderr == f"hyperset-generate: interrupted after 0 puzzles; {out} not written\n"
    assert list(tmp_path.iterdir()) == []
