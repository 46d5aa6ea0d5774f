"""The commands in terminals and pipelines: closed pipes and streams, legacy code pages, colour, signals (Ctrl-C,
a closed ssh connection), progress output in log files, and a --help that does not wait for torch."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint

BIN = Path(sys.executable).parent
EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_sudoku_checkpoint(tmp_path_factory.mktemp("ckpt") / "sudoku-tiny")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sudoku_csvs(tmp_path_factory.mktemp("sudoku-data"), 90, 30, seed=1)


class _ClosedPipe(io.StringIO):
    def isatty(self) -> bool:
        return False

    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("closed", [["stdout"], ["stdout", "stderr"]], ids=["stdout", "stdout-and-stderr"])
def test_output_that_closes_mid_run_does_not_lose_the_trainers_state(data_dir: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     closed: list[str]) -> None:
    """`hyperset-train ... | tee log` (or `2>&1 | tee log`, where the progress bar writes too) and Ctrl-C: tee
    dies first; the run must still save best/ and last/."""
    from hyperset.config import preset_config
    from hyperset.training.sudoku_task import SudokuData, SudokuTask
    from hyperset.training.trainer import TrainConfig, Trainer

    cfg = preset_config("sudoku-cpu", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2)
    task = SudokuTask(model=cfg, data=SudokuData(data_dir=str(data_dir), n_train=0, n_val=15, n_select=15))
    train = TrainConfig(steps=4, batch_size=8, lr=3e-3, min_lr=3e-4, warmup_steps=2, amp="off", eval_every=2,
                        log_every=1, save_every_seconds=1e9, threads=1)
    for name in closed:
        monkeypatch.setattr(sys, name, _ClosedPipe())
    Trainer(task, train, tmp_path / "run", quiet=False).fit()
    assert json.loads((tmp_path / "run" / "last" / "trainer.json").read_text())["step"] == 4
    assert (tmp_path / "run" / "best" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["cp1252", "latin-1"])
@pytest.mark.parametrize("quiet", [[], ["-q"]])
def test_solve_prints_to_a_legacy_code_page_without_crashing(tiny_checkpoint: Path, tmp_path: Path, encoding: str,
                                                             quiet: list[str]) -> None:
    """Windows: stdout redirected to a file or pipe is cp1252; a Latin-1 locale on Linux."""
    (tmp_path / "p.txt").write_text(EASY + "\n")
    run = subprocess.run([str(BIN / "hyperset-solve"), str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint),
                          "--strategy", "single", "--threads", "1", *quiet], capture_output=True,
                         env={**ENV, "PYTHONIOENCODING": encoding})
    assert run.returncode in (0, 1), run.stderr.decode(errors="replace")[-400:]
    assert b"Traceback" not in run.stderr and b"boards valid" in run.stdout


def _closed_pipe_run(args: list[str]) -> subprocess.CompletedProcess:
    r, w = os.pipe()
    os.close(r)  # the reader is gone before anything is written (`| head` that already exited, `| true`)
    try:
        return subprocess.run(args, stdout=w, stderr=subprocess.PIPE, env=ENV)
    finally:
        os.close(w)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval", "solve", "generate"])
def test_a_closed_pipe_ends_the_command_silently_with_141_not_1(tiny_checkpoint: Path, tmp_path: Path,
                                                                 command: str) -> None:
    """`hyperset-solve many.csv | head -3`: the reader has what it wanted; no message, 128 + SIGPIPE as Unix tools
    end (README), never 1, which means 'some boards not solved' / 'parity mismatch'."""
    write_sudoku_csvs(tmp_path, 0, 8, seed=3)
    args = {"eval": [str(BIN / "hyperset-eval"), "sudoku", str(tiny_checkpoint), "--data", str(tmp_path / "valid.csv"),
                     "--threads", "1"],
            "solve": [str(BIN / "hyperset-solve"), str(tmp_path / "valid.csv"), "--checkpoint", str(tiny_checkpoint),
                      "--strategy", "single", "--threads", "1"],
            "generate": [str(BIN / "hyperset-generate"), "-n", "2", "-b", "0", "-q"]}[command]
    run = _closed_pipe_run(args)
    assert run.returncode == 141 and run.stderr == b"", (run.returncode, run.stderr[-300:])


def test_color_flag_keeps_colours_when_stdout_is_not_a_terminal(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from hyperset.cli import solve_main

    (tmp_path / "p.txt").write_text(EASY + "\n")
    result = CliRunner().invoke(solve_main, [str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint),
                                             "--strategy", "single", "--color"])
    assert "\x1b[" in result.stdout


def test_ctrl_c_in_a_bench_script_is_one_line_and_130(capsys: pytest.CaptureFixture) -> None:
    import hyperset

    sys.path.insert(0, str(Path(hyperset.__file__).parents[1] / "bench"))
    import bench_args

    @bench_args.input_errors_exit
    def main() -> None:
        raise KeyboardInterrupt

    try:
        main()
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped: Python prints its traceback")
    except SystemExit as stop:
        code = stop.code
    assert code == 130 and capsys.readouterr().err.strip().endswith(": interrupted")


@pytest.mark.slow
@pytest.mark.parametrize("closed, args", [(1, []), (2, []), (0, ["-"])])
def test_solve_with_a_closed_standard_stream_has_no_traceback(tiny_checkpoint: Path, tmp_path: Path, closed: int,
                                                              args: list[str]) -> None:
    """`>&-`, `2>&-`, `<&-` (and pythonw on Windows, where the streams are None)."""
    (tmp_path / "p.txt").write_text(EASY + "\n" + EASY + "\n")
    files = args or [str(tmp_path / "p.txt")]
    log = tmp_path / "log"
    code = (f"import sys, traceback\nsys.argv = ['hyperset-solve', *{files!r}, '--checkpoint', "
            f"{str(tiny_checkpoint)!r}, '--strategy', 'single', '--threads', '1']\n"
            "try:\n    from hyperset._entry import solve; solve()\n"
            f"except SystemExit as e:\n    open({str(log)!r}, 'w').write(f'exit {{e.code}}')\n"
            f"except BaseException:\n    open({str(log)!r}, 'w').write(traceback.format_exc())\n")
    subprocess.run([sys.executable, "-c", code], env=ENV, preexec_fn=lambda: os.close(closed),
                   stdout=subprocess.DEVNULL if closed != 1 else None,
                   stderr=subprocess.DEVNULL if closed != 2 else None)
    assert log.read_text().startswith("exit "), log.read_text()[-300:]


def test_the_trainers_bar_off_a_terminal_is_throttled(data_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """mininterval=60 off a terminal; set_postfix(refresh=True) redraws it at every log line anyway."""
    from hyperset.config import preset_config
    from hyperset.training.sudoku_task import SudokuData, SudokuTask
    from hyperset.training.trainer import TrainConfig, Trainer

    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    cfg = preset_config("sudoku-cpu", dim=16, heads=2, ff_hidden=16, time_dim=16, iters=1)
    task = SudokuTask(model=cfg, data=SudokuData(data_dir=str(data_dir), n_train=0, n_val=4, n_select=4))
    train = TrainConfig(steps=40, batch_size=4, lr=3e-3, min_lr=3e-4, warmup_steps=2, amp="off", eval_every=1000,
                        log_every=1, save_every_seconds=1e9, threads=1)
    Trainer(task, train, tmp_path / "run", quiet=False).fit()
    assert err.getvalue().count("\r") <= 6, err.getvalue().count("\r")


@pytest.mark.parametrize("entry", ["solve", "export", "app"])
def test_help_imports_no_torch(entry: str) -> None:
    code = (f"import sys\nsys.argv = ['x', '--help']\nfrom hyperset import _entry\n"
            f"try:\n    _entry.{entry}()\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('TORCH' if 'torch' in sys.modules else 'LIGHT')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert run.stderr.endswith("LIGHT"), run.stderr[-200:]


def _training_in_the_background(data_dir: Path, run: Path, before: Any) -> subprocess.Popen:
    """hyperset-train on a tiny model for many steps, started with `before` run in the child (the signal settings
    a shell or nohup leaves), returned once it trains."""
    args = [str(BIN / "hyperset-train"), "sudoku", "--recipe", "sudoku-cpu", "--data", str(data_dir), "--out",
            str(run), "--threads", "1", "--steps", "100000", "--quiet", "--set", "model.dim=16",
            "--set", "model.heads=2", "--set", "model.ff_hidden=16", "--set", "model.time_dim=16", "--set",
            "model.iters=1", "--set", "train.batch_size=4", "--set", "train.amp='off'"]
    p = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=before)
    deadline = time.time() + 60
    while time.time() < deadline and not (run / "metrics.jsonl").exists():
        time.sleep(0.2)
    return p


@pytest.mark.slow
def test_a_hangup_stops_the_trainer_with_its_state_saved(data_dir: Path, tmp_path: Path) -> None:
    """An ssh connection that drops sends SIGHUP: save last/ as for SIGTERM, exit 128 + 1."""

    def as_a_shell_starts_it() -> None:  # the default actions, also where the tests run under nohup (SIGHUP ignored)
        for s in (signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)

    p = _training_in_the_background(data_dir, tmp_path / "run", as_a_shell_starts_it)
    p.send_signal(signal.SIGHUP)
    p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGHUP
    assert (tmp_path / "run" / "last" / "trainer.json").is_file()


@pytest.mark.slow
def test_a_hangup_under_nohup_is_still_ignored(data_dir: Path, tmp_path: Path) -> None:
    """`nohup hyperset-train ... &` ignores SIGHUP before the trainer starts: the run must outlive the session."""
    p = _training_in_the_background(data_dir, tmp_path / "run", lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    p.send_signal(signal.SIGHUP)
    time.sleep(3)
    still = p.poll() is None
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=120)
    assert still and p.returncode == 128 + signal.SIGTERM
    assert (tmp_path / "run" / "last" / "trainer.json").is_file()


def test_a_signal_during_a_blocked_write_to_stderr_does_not_break_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # the handler ran while the interrupted write held sys.stderr's lock: its own write raised "reentrant call"
    from hyperset.training.trainer import Trainer

    trainer = Trainer.__new__(Trainer)
    trainer._stop, trainer._stop_signal, trainer._main = False, None, True

    class Reentrant(io.StringIO):
        def write(self, s: str) -> int:
            raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    monkeypatch.setattr(sys, "stderr", Reentrant())
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    try:
        trainer._handle_signal(signal.SIGINT, None)
        trainer._handle_signal(signal.SIGINT, None)
    finally:
        os.dup2(saved, 2)
        os.close(w)
    said = os.read(r, 4096).decode()
    os.close(r)
    assert trainer._stop and "SIGINT: stopping after the current step" in said and "already stopping" in said


def test_ctrl_c_stops_the_app_with_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from types import SimpleNamespace

    from hyperset.apps import app as app_module
    from hyperset.apps import cli

    class Demo:
        local_url, share_url = "http://127.0.0.1:1/", None

        def launch(self, **kw: object) -> None:
            pass

        def block_thread(self) -> None:  # gradio's: catches the KeyboardInterrupt and returns
            print("Keyboard interruption in main thread... closing server.")

        @property
        def is_running(self) -> bool:
            raise KeyboardInterrupt

        def close(self) -> None:
            pass

    solver = SimpleNamespace(backend_name="torch", device_name=lambda: "cpu", trained_iters=16, backend=None)
    monkeypatch.setattr(cli, "load_models", lambda args: (solver, None, "", "mim off"))
    monkeypatch.setattr(app_module, "build_demo", lambda *a: Demo())
    monkeypatch.setattr(app_module, "launch_kwargs", lambda: {})
    assert cli.serve(cli.options(["--threads", "1"])) == 130


def test_stdin_on_a_terminal_says_what_it_waits_for(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture) -> None:
    from hyperset.sudoku.parse import parse_file

    class Tty(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty(io.BytesIO((EASY + "\n").encode())))
    assert len(parse_file("-")) == 1
    assert "standard input" in capsys.readouterr().err


def test_every_command_takes_the_short_forms_of_its_long_options() -> None:
    """-V for --version, -q for --quiet, -o for --out, on every command and subcommand that has the long form."""
    import click

    from hyperset.apps.cli import cli as app_main
    from hyperset.cli import solve_main
    from hyperset.exports.cli import main as export_main
    from hyperset.training.cli import main as train_main
    from hyperset.training.evaluate import main as eval_main

    short = {"--version": "-V", "--quiet": "-q", "--out": "-o"}
    seen = set()

    def walk(cmd: click.Command, path: str) -> None:
        for p in cmd.params:
            for long, s in short.items():
                if long in p.opts:
                    seen.add(long)
                    assert s in p.opts + p.secondary_opts, f"{path}: {long} without {s}"
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    for cmd, prog in ((solve_main, "hyperset-solve"), (train_main, "hyperset-train"), (eval_main, "hyperset-eval"),
                      (export_main, "hyperset-export"), (app_main, "hyperset-app")):
        walk(cmd, prog)
    assert seen == set(short)
    done = subprocess.run([str(BIN / "hyperset-generate"), "-V"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("hyperset-generate ")


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_signal_during_a_solve_prints_the_boards_so_far_and_a_complete_summary(tiny_checkpoint: Path,
                                                                                 tmp_path: Path, sig: str) -> None:
    """`timeout 60 hyperset-solve ...` (SIGTERM) or a closed ssh session (SIGHUP) left an empty stdout: it ends
    as Ctrl-C does, the boards so far and the summary printed, exit 128 + the signal's number."""
    from hyperset.sudoku.exact import generate

    puzzles = [p for p, _ in generate(20, 30, 36, seed=5)] * 20  # many boards: the solve outlasts the signal
    (tmp_path / "p.txt").write_text("\n".join(puzzles) + "\n")

    def as_a_shell_starts_it() -> None:
        for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)

    p = subprocess.Popen([str(BIN / "hyperset-solve"), str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint),
                          "--strategy", "single", "--iters", "400", "--batch-size", "1", "--threads", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, preexec_fn=as_a_shell_starts_it)
    assert p.stdout is not None
    first = p.stdout.readline()  # the first board is on its way: the solve is running
    assert b"puzzle 1" in first
    p.send_signal(getattr(signal, sig))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + getattr(signal, sig), err[-300:]
    assert b"interrupted after" in out and b"boards valid" in out and b"Traceback" not in err
