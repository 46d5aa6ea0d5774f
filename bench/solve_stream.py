"""hyperset-solve on a million puzzles: the first board's delay, peak memory, and the whole run's throughput against
the rate of its batches.

    python bench/solve_stream.py --puzzles 1000000 --out bench/results/solve_stream.json

Writes an input of --puzzles distinct puzzles (symmetry transforms of a few generated ones, as `puzzle,solution`
CSV rows, or puzzles alone with --no-solutions, which the parser then checks for several solutions one by one),
runs the real command on it (`hyperset-solve FILE --strategy single --iters N --threads T`, every board printed
into a pipe this script reads), and reports:

  * `first_board_seconds`: from the command's start to the first board on its standard output, beside the same
    command's on a file of one puzzle (`one_puzzle`: its start-up), and their difference;
  * `peak_rss_mb`: the command's peak resident memory (VmHWM in /proc/PID/status, read every second);
  * `rss_mb`: the resident memory sampled every second, against the boards printed so far;
  * `batch_rate` (boards/s): the median rate of the batches (--batch-size boards over the time from the previous
    batch's last board on standard output to its own), `run_rate`: all boards over the time from the first board
    to the last, and
    `run_rate_from_start`: over the whole command, start-up included; `run_over_batch`: their ratio.

The command's work per board is set by --iters (one pass of that many iterations): the point is the pipeline
(reading, checking, solving a batch at a time, printing), not the model's depth. Writes the JSON and a PNG beside
it (boards and memory against time).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import bench_args
import numpy as np
from flops import machine

from hyperset.checkpoint import atomic_write_json
from hyperset.sudoku.data import random_symmetries
from hyperset.sudoku.exact import generate

ROOT = Path(__file__).resolve().parents[1]
BASE_PUZZLES = 32  # generated puzzles the input's transforms start from


def write_input(path: Path, n: int, solutions: bool, seed: int = 0) -> None:
    """`n` distinct puzzles (random symmetries of BASE_PUZZLES generated ones), one CSV row each."""
    rng = np.random.default_rng(seed)
    base = generate(BASE_PUZZLES, seed=seed)
    p0 = np.array([[int(c) for c in p] for p, _ in base])
    s0 = np.array([[int(c) for c in s] for _, s in base])
    digits = np.frombuffer(b"0123456789", dtype=np.uint8)
    with open(path, "wb") as f:
        f.write(b"puzzle,solution\n" if solutions else b"puzzle\n")
        for start in range(0, n, 100_000):
            m = min(100_000, n - start)
            which = rng.integers(0, BASE_PUZZLES, m)
            src, relabel = random_symmetries(rng, m)
            p = np.take_along_axis(relabel, np.take_along_axis(p0[which], src, axis=1), axis=1)
            s = np.take_along_axis(relabel, np.take_along_axis(s0[which], src, axis=1), axis=1)
            rows = np.full((m, 164 if solutions else 82), ord(","), dtype=np.uint8)
            rows[:, :81] = digits[p]
            if solutions:
                rows[:, 82:163] = digits[s]
            rows[:, -1] = ord("\n")
            f.write(rows.tobytes())


def status_mb(pid: int, field: str = "VmRSS") -> float | None:
    """A memory field of /proc/PID/status in MB (VmRSS: resident now; VmHWM: the peak since the command started,
    where getrusage of the child would also count the copy of this script that fork made before exec)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def run(path: Path, iters: int, threads: int, batch_size: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "hyperset.cli", str(path), "--strategy", "single", "--iters", str(iters),
           "--threads", str(threads), "--no-color", "--batch-size", str(batch_size)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    boards = [0]
    first: list[float] = []
    stderr: list[bytes] = []
    drain = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    drain.start()
    samples: list[tuple[float, int, float | None]] = []
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            samples.append((time.perf_counter() - t0, boards[0], status_mb(proc.pid)))
            peak[0] = max(peak[0], status_mb(proc.pid, "VmHWM") or 0.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    marker, carry, tail = b", puzzle ", b"", b""
    batch_ends: list[float] = []
    fd = proc.stdout.fileno()
    while chunk := os.read(fd, 1 << 20):
        text = carry + chunk
        n = text.count(marker)
        if n and not first:
            first.append(time.perf_counter() - t0)
        if (boards[0] + n) // batch_size > boards[0] // batch_size:  # a batch is done when its last board is out
            batch_ends.append(time.perf_counter() - t0)
        boards[0] += n
        carry = text[-(len(marker) - 1):]
        tail = (tail + chunk)[-4096:]
    last = time.perf_counter() - t0
    _, status, _ = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    drain.join(timeout=10)
    err = b"".join(stderr).decode(errors="replace").strip().splitlines()
    # a batch's rate: its boards over the time from the previous batch's last board to its own
    rates = [batch_size / (b - a) for a, b in zip(batch_ends, batch_ends[1:]) if b > a]
    batch_rate = statistics.median(rates) if rates else None
    n = boards[0]
    run_rate = (n - 1) / (last - first[0]) if first and last > first[0] and n > 1 else None
    return {"command": " ".join(["hyperset-solve", *cmd[3:]]), "exit_code": proc.returncode, "boards": n,
            "summary_line": next((x for x in reversed(tail.decode(errors="replace").splitlines())
                                  if "boards valid" in x), None),
            "stderr_tail": err[-3:], "first_board_seconds": first[0] if first else None,
            "wall_seconds": wall, "peak_rss_mb": peak[0] or None, "batches_timed": len(rates),
            "batch_rate_quartiles": statistics.quantiles(rates, n=4) if len(rates) > 1 else None,
            "batch_rate": batch_rate, "run_rate": run_rate, "run_rate_from_start": n / wall,
            "run_over_batch": run_rate / batch_rate if run_rate and batch_rate else None,
            "samples": [{"seconds": round(t, 2), "boards": b, "rss_mb": r} for t, b, r in samples]}


def plot(report: dict[str, Any], path: Path) -> None:

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["run"]["samples"]
    t = [x["seconds"] for x in s]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(t, [x["boards"] for x in s], color="tab:blue")
    a.set_xlabel("seconds since start")
    a.set_ylabel("boards printed")
    a.set_title(f"{report['puzzles']:,} puzzles: first board at {report['run']['first_board_seconds']:.2f} s")
    b.plot(t, [x["rss_mb"] for x in s], color="tab:red")
    b.axhline(1024, color="0.5", ls=":", lw=1, label="1 GiB")
    b.set_xlabel("seconds since start")
    b.set_ylabel("resident memory (MB)")
    b.set_title(f"peak {report['run']['peak_rss_mb']:.0f} MB")
    b.legend(fontsize=8)
    fig.tight_layout()
    bench_args.save_figure(fig, path)


@bench_args.input_errors_exit
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--puzzles", type=bench_args.count, default=1_000_000)
    ap.add_argument("--iters", type=bench_args.iterations, default=1, help="iterations of the one pass per board")
    ap.add_argument("--threads", type=bench_args.count, default=1, help="the command's CPU threads")
    ap.add_argument("--batch-size", type=bench_args.count, default=512)
    ap.add_argument("--no-solutions", action="store_true",
                    help="puzzles without their solutions: the parser checks each for several solutions")
    ap.add_argument("--input", type=Path, default=None, help="keep the generated input here [default: a temp file]")
    ap.add_argument("--out", type=bench_args.output_file, default=ROOT / "bench/results/solve_stream.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.input or Path(tmp) / "puzzles.csv"
        t = time.perf_counter()
        write_input(path, args.puzzles, not args.no_solutions)
        print(f"input: {args.puzzles:,} puzzles, {path.stat().st_size / 2**20:.0f} MiB in "
              f"{time.perf_counter() - t:.1f} s", file=sys.stderr)
        one = Path(tmp) / "one.csv"
        with open(path, "rb") as f:
            one.write_bytes(f.readline() + f.readline())
        single = run(one, args.iters, args.threads, args.batch_size)  # start-up alone: the same command on 1
        result = run(path, args.iters, args.threads, args.batch_size)
        size = path.stat().st_size
    report = {"puzzles": args.puzzles, "solutions_given": not args.no_solutions, "input_mib": size / 2**20,
              "iters": args.iters, "run": result,
              "one_puzzle": {k: v for k, v in single.items() if k != "samples"},
              "first_board_after_one_puzzle_run": (result["first_board_seconds"] - single["first_board_seconds"]
                                                   if result["first_board_seconds"] and single["first_board_seconds"]
                                                   else None), "machine": machine(args.threads)}
    atomic_write_json(args.out, report)
    plot(report, args.out.with_suffix(".png"))
    r = result
    print(f"{r['boards']:,} boards, exit {r['exit_code']}; first board {r['first_board_seconds']:.2f} s; peak RSS "
          f"{r['peak_rss_mb']:.0f} MB; batches {r['batch_rate']:.0f}/s, whole run {r['run_rate']:.0f}/s "
          f"({r['run_over_batch']:.3f})", file=sys.stderr)


if __name__ == "__main__":
    main()
