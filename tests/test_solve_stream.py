"""Puzzles read, checked and solved as they come: the first board before the input ends, bad input further on
stopping the run after the boards before it, caps enforced while reading, and signals that never cut the output."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import write_tiny_sudoku_checkpoint

from hyperset.cli import solve_main
from hyperset.sudoku.board import PuzzleError
from hyperset.sudoku.parse import iter_file, parse_puzzles

ROOT = Path(__file__).resolve().parents[1]
PUZZLE = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_sudoku_checkpoint(tmp_path_factory.mktemp("stream") / "ckpt")


def solve(args: list[str], stdin: str | bytes = "") -> Any:
    return CliRunner().invoke(solve_main, args, input=stdin)


@pytest.mark.slow
def test_the_first_board_comes_before_the_input_ends(ckpt: Path) -> None:
    """A pipe that sends one puzzle and then waits: its board is printed while the pipe is still open."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "hyperset.cli", "-", "--checkpoint", str(ckpt), "--strategy",
                             "single", "--batch-size", "1", "--no-color"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write((PUZZLE + "\n").encode())
        proc.stdin.flush()
        seen = b""
        deadline = time.monotonic() + 120
        while b"puzzle 1 " not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                seen += chunk
        assert b"<stdin>, puzzle 1 " in seen, "the first board waited for the end of the input"
        assert proc.poll() is None  # still reading
        proc.stdin.write((PUZZLE + "\n").encode())
        proc.stdin.close()
        proc.wait(timeout=120)
        rest, err = proc.stdout.read(), proc.stderr.read() if proc.stderr else b""
    finally:
        proc.kill()
    assert proc.returncode in (0, 1), err
    assert b"<stdin>, puzzle 2 " in seen + rest and b"2 boards valid" not in err


def test_bad_input_further_on_stops_after_the_boards_before_it(ckpt: Path, tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text(f"{PUZZLE}\n{PUZZLE}\n{PUZZLE}\n12345\n{PUZZLE}\n")
    args = [str(path), "--checkpoint", str(ckpt), "--strategy", "single", "--batch-size", "2"]
    result = solve(args)
    assert result.exit_code == 2
    assert [f"puzzle {k} " in result.stdout for k in (1, 2, 3, 4)] == [True, True, True, False]
    assert "stopped after 3 puzzles by bad input" in result.stdout
    assert result.stderr.strip().splitlines() == [
        f"hyperset-solve: error: {path}:4: expected 9 cells in a grid row, found 5"]
    result = solve([*args, "--json"])
    payload = json.loads(result.stdout)  # one whole document
    assert result.exit_code == 2 and len(payload["results"]) == 3
    assert payload["summary"]["error"] == f"{path}:4: expected 9 cells in a grid row, found 5"


def test_input_refused_before_any_board_prints_nothing(ckpt: Path, tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text(f"# two puzzles\n12345\n{PUZZLE}\n")
    for extra in ([], ["--json"]):
        result = solve([str(path), "--checkpoint", str(ckpt), *extra])
        assert result.exit_code == 2 and result.stdout == ""
        assert result.stderr.strip() == (f"hyperset-solve: error: {path}:2: expected 9 cells in a grid row, "
                                         "found 5")


def test_the_puzzle_cap_is_enforced_while_reading(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hyperset.cli.MAX_PUZZLES", 2)
    result = solve(["-", "--checkpoint", str(ckpt), "--strategy", "single", "--batch-size", "1"],
                   "\n".join([PUZZLE] * 5))
    assert result.exit_code == 2 and "puzzle 2 " in result.stdout and "puzzle 3 " not in result.stdout
    assert result.stderr.strip() == "hyperset-solve: error: <stdin>:3: more than 2 puzzles; split the input"


def test_line_caps_are_enforced_while_reading(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("hyperset.sudoku.parse.MAX_INPUT_LINES", 1000)
    path = tmp_path / "blank.txt"
    path.write_bytes(b"\n" * 5000)
    stream = iter_file(path)
    with pytest.raises(PuzzleError, match=r":1001: more than 1,000 lines"):
        next(stream)
    path.write_bytes(b"1" * (200 * 1024))  # no line end
    with pytest.raises(PuzzleError, match=r":1: a line longer than 64 KiB"):
        next(iter_file(path))
    with pytest.raises(PuzzleError, match=r":1001: more than 1,000 lines"):
        parse_puzzles("#\n" * 1500)


def test_reading_keeps_every_format_across_chunk_edges(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Line ends, gzip and UTF-16 read a few bytes at a time give what the whole text gives."""
    import gzip

    monkeypatch.setattr("hyperset.sudoku.parse._CHUNK", 7)
    grid = "\r\n".join(PUZZLE[i:i + 9] for i in range(0, 81, 9))
    text = f"# one\r{PUZZLE}\r\n\n{grid}\r\n{PUZZLE},{SOLUTION}\n"
    expected = [(p.givens, p.line) for p in parse_puzzles(text)]
    assert expected == [(PUZZLE, 2), (PUZZLE, 4), (PUZZLE, 13)]
    for name, data in (("a.txt", text.encode()), ("b.txt.gz", gzip.compress(text.encode())),
                       ("c.txt", text.encode("utf-16")), ("d.txt", b"\xef\xbb\xbf" + text.encode())):
        (tmp_path / name).write_bytes(data)
        assert [(p.givens, p.line) for p in iter_file(tmp_path / name)] == expected, name


def test_solve_iter_reads_a_batch_at_a_time(ckpt: Path) -> None:
    from hyperset.solve import Solver

    solver = Solver.load(str(ckpt), "cpu")
    pulled = []

    def puzzles() -> Any:
        for k in range(10):
            pulled.append(k)
            yield PUZZLE if k != 7 else PUZZLE[:-1]

    results = solver.solve_iter(puzzles(), strategy="single", batch_size=3)
    next(results)
    assert len(pulled) == 3  # one batch read, not the whole input
    with pytest.raises(PuzzleError, match=r"puzzles\[7\]:1: expected 81 cells"):
        for _ in results:
            pulled.append("result")
    assert pulled.count("result") == 6  # puzzles 1-6 and 7 (the batch cut short by the bad one) answered first
    with pytest.raises(TypeError, match="solutions go with a list"):
        next(solver.solve_iter(iter([PUZZLE]), solutions=[SOLUTION]))


def test_a_file_name_with_a_line_end_is_still_one_line_of_error(ckpt: Path, tmp_path: Path) -> None:
    path = tmp_path / "two\nlines.txt"
    path.write_text("12345\n")
    result = solve([str(path), "--checkpoint", str(ckpt)])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "two\\nlines.txt:1: expected 9 cells" in result.stderr
    result = solve([str(tmp_path / "gone\x1b[2J.txt"), "--checkpoint", str(ckpt)])
    assert result.exit_code == 2 and "\x1b" not in result.stderr and "gone\\x1b[2J.txt: file not found" in result.stderr


def test_closed_stdout_is_an_error(ckpt: Path) -> None:
    proc = subprocess.run(f"{sys.executable} -m hyperset.cli - --checkpoint {ckpt} --json >&-", shell=True,
                          input=PUZZLE.encode(), capture_output=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.decode().strip() == ("hyperset-solve: error: standard output is closed: nowhere to print "
                                            "the results")


def test_ctrl_c_while_loading_still_prints_one_json_document(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hyperset.solve import Solver

    def interrupted(*args: Any, **kw: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(Solver, "load", interrupted)
    result = solve(["-", "--checkpoint", str(ckpt), "--json"], PUZZLE)
    assert result.exit_code == 130
    assert json.loads(result.stdout) == {"results": [], "summary": {"puzzles": 0, "valid": 0, "interrupted": True}}


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
def test_a_signal_waits_for_the_piece_being_written() -> None:
    from hyperset.stops import Signalled as _Signalled
    from hyperset.stops import Stops as _Stops

    # as a terminal has them: a suite run in the background (`pytest &`, nohup) starts with SIGINT ignored
    before = {sig: signal.signal(sig, handler) for sig, handler in ((signal.SIGINT, signal.default_int_handler),
                                                                     (signal.SIGTERM, signal.SIG_DFL))}
    stops = _Stops()
    try:
        written = []
        with pytest.raises(_Signalled):
            with stops.hold():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                written.append("the whole piece")  # the stop waits for this
        assert written == ["the whole piece"] and stops.exit_code() == 143 and stops.by() == {"stopped_by": "SIGTERM"}
        second = _Stops()
        with pytest.raises(_Signalled):  # a second signal while held stops at once
            with second.hold():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                written.append("never")
        second.restore()
        assert "never" not in written and second.exit_code() == 130 and second.by() == {}
    finally:
        stops.restore()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_graph_of_other_weights_is_one_warning_line(ckpt: Path, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import torch

    from hyperset.exports import export as E
    from hyperset.models import load_checkpoint

    model = load_checkpoint(ckpt)[0]
    with torch.no_grad():
        next(model.parameters()).add_(0.5)  # other weights than the checkpoint's
    graph = E.export_loop(model, tmp_path / "other.onnx").path
    result = solve(["-", "--checkpoint", str(ckpt), "--backend", "onnx", "--onnx-model", str(graph), "--strategy",
                    "single"], PUZZLE)
    assert result.exit_code in (0, 1), result.stderr
    lines = [x for x in result.stderr.splitlines() if "other weights" in x]
    assert lines == ["warning: other.onnx was exported from other weights than the loaded checkpoint; the ONNX "
                     "model's weights are used"]
    assert "UserWarning" not in result.stderr and "warnings.warn" not in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/wchan").exists(), reason="reads /proc/PID/wchan (Linux)")
def test_ctrl_c_while_the_json_waits_on_a_full_pipe_leaves_a_whole_document(ckpt: Path) -> None:
    """The reader stops reading; the solver blocks writing; Ctrl-C then; the reader drains: one whole document."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "hyperset.cli", "-", "--checkpoint", str(ckpt), "--strategy",
                             "single", "--iters", "1", "--batch-size", "400", "--json"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as from a terminal
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(("\n".join([PUZZLE] * 800) + "\n").encode())
        proc.stdin.close()
        deadline = time.monotonic() + 180
        wchan = ""
        while time.monotonic() < deadline and proc.poll() is None:
            wchan = Path(f"/proc/{proc.pid}/wchan").read_text()
            if "pipe_write" in wchan or "pipe_wait" in wchan:
                break
            time.sleep(0.1)
        if "pipe" not in wchan:
            pytest.skip(f"the solver never blocked writing (wchan {wchan!r})")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        out = proc.stdout.read()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    payload = json.loads(out)  # whole: the stop waited for the result being written
    assert proc.returncode == 130
    assert payload["summary"]["interrupted"] is True
    assert 0 < len(payload["results"]) == payload["summary"]["puzzles"] < 800


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
def test_a_signal_inside_the_import_machinery_comes_again_outside_it() -> None:
    """Raised inside importlib's bootstrap (a lock's weakref callback), a stop is printed as "Exception ignored"
    and lost; there it is sent again a moment later, and stops then."""
    from types import SimpleNamespace

    from hyperset.stops import Signalled, Stops

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    stops = Stops()
    try:
        inside = SimpleNamespace(f_code=SimpleNamespace(co_filename="<frozen importlib._bootstrap>"))
        stops._stop(signal.SIGTERM, inside)  # no raise here
        assert stops.signum is None
        with pytest.raises(Signalled):
            time.sleep(2)  # the signal again, from a timer thread, handled in this (safe) frame
        assert stops.exit_code() == 143
    finally:
        stops.restore()
        signal.signal(signal.SIGTERM, before)
