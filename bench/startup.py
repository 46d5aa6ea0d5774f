"""Start-up time of every command: what a user waits for before any work is done (issue #51, item 4).

Each measurement is the wall time of a fresh process, started as a user starts it (the console scripts of this
environment's bin folder), the median of `--rounds`:

    import_torch   python -c "import torch": the floor of any command that runs a model
    help, version  --help and --version of every console script in pyproject.toml (no model, no torch needed)
    solve_one      hyperset-solve examples/medium.txt --json: one puzzle, with the solve's own seconds beside it
    app_ready      hyperset-app on a free 127.0.0.1 port, from the start of the process to the first HTTP 200
    import_gradio  python -c "import gradio", and import_gradio_torch both: the floor of a Gradio app that runs a
                   torch model in one process (with the app)

The goals of the issue are printed against the measurements: --help under 1 s, one puzzle within the torch import
+ 0.5 s, the app within twice the torch import. Timings on a shared machine are noisy: the load average is recorded
before and after.

    python bench/startup.py                        # writes bench/results/startup.json
    python bench/startup.py --rounds 3 --out /tmp/startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_args  # noqa: E402
from flops import load_average, machine  # noqa: E402

from hyperset.checkpoint import atomic_write_json  # noqa: E402

OUT = ROOT / "bench" / "results" / "startup.json"
PUZZLE = "examples/medium.txt"
APP_TIMEOUT = 180.0  # seconds for the app to load its models and answer
POLL = 0.05  # seconds between two requests to an app that does not answer yet


def scripts() -> list[str]:
    """The console scripts pyproject.toml declares."""
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def script_path(name: str) -> str:
    """The installed console script beside this interpreter (the venv's bin folder)."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        raise bench_args.BenchInputError(f"{name} is not installed beside {sys.executable} (pip install -e .)")
    return str(path)


def timed(argv: list[str]) -> tuple[float, str]:
    """Wall seconds of one process run to its end, and its standard output; a failure stops the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise bench_args.BenchInputError(f"{' '.join(argv)} exited {done.returncode}: "
                                         + " ".join(done.stderr.split()[-40:]))
    return seconds, done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_ready(threads: int) -> float:
    """Seconds from starting hyperset-app to its first HTTP 200 on /."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    start = time.perf_counter()
    proc = subprocess.Popen([script_path("hyperset-app"), "--port", str(port), "--device", "cpu", "--threads",
                             str(threads)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while time.perf_counter() - start < APP_TIMEOUT:
            if proc.poll() is not None:
                raise bench_args.BenchInputError(f"hyperset-app exited {proc.returncode}: "
                                                 + " ".join(proc.stderr.read().decode().split()[-40:]))
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    if reply.status == 200:
                        return time.perf_counter() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(POLL)
        raise bench_args.BenchInputError(f"hyperset-app did not answer within {APP_TIMEOUT:.0f} s")
    finally:
        bench_args.stop_process(proc)


def median(samples: list[float]) -> dict[str, Any]:
    return {"median_s": round(statistics.median(samples), 3), "samples_s": [round(s, 3) for s in samples]}


def measure(rounds: int, threads: int, app: bool) -> dict[str, Any]:
    """Every measurement, the rounds interleaved (a burst of load on the machine spreads over all of them)."""
    samples: dict[str, list[float]] = {"import_torch": [], "solve_one": [], "solve_one_own_seconds": []}
    if app:
        samples["app_ready"], samples["import_gradio"], samples["import_gradio_torch"] = [], [], []
    for name in scripts():
        samples[f"{name} --help"], samples[f"{name} --version"] = [], []
    for _ in range(rounds):
        samples["import_torch"].append(timed([sys.executable, "-c", "import torch"])[0])
        for name in scripts():
            for flag in ("--help", "--version"):
                samples[f"{name} {flag}"].append(timed([script_path(name), flag])[0])
        seconds, out = timed([script_path("hyperset-solve"), PUZZLE, "--json", "--device", "cpu", "--threads",
                              str(threads)])
        samples["solve_one"].append(seconds)
        samples["solve_one_own_seconds"].append(json.loads(out)["summary"]["seconds"])
        if app:
            samples["import_gradio"].append(timed([sys.executable, "-c", "import gradio"])[0])
            samples["import_gradio_torch"].append(timed([sys.executable, "-c", "import gradio, torch"])[0])
            samples["app_ready"].append(app_ready(threads))
    return {k: median(v) for k, v in samples.items()}


def goals(times: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals against the medians: each with its limit and whether it is met."""
    torch_s = times["import_torch"]["median_s"]
    helps = {k: v["median_s"] for k, v in times.items() if k.endswith(("--help", "--version"))}
    out = {"help_and_version_under_1s": {"limit_s": 1.0, "slowest_s": max(helps.values()),
                                         "met": max(helps.values()) < 1.0},
           "solve_one_within_torch_import_plus_0.5s": {"limit_s": round(torch_s + 0.5, 3),
                                                       "measured_s": times["solve_one"]["median_s"],
                                                       "met": times["solve_one"]["median_s"] <= torch_s + 0.5}}
    if "app_ready" in times:
        out["app_ready_within_2x_torch_import"] = {"limit_s": round(2 * torch_s, 3),
                                                   "measured_s": times["app_ready"]["median_s"],
                                                   "met": times["app_ready"]["median_s"] <= 2 * torch_s,
                                                   "import_gradio_s": times["import_gradio"]["median_s"],
                                                   "import_gradio_torch_s": times["import_gradio_torch"]["median_s"],
                                                   "floor_met": times["import_gradio_torch"]["median_s"] <= 2 * torch_s}
    return out


@bench_args.input_errors_exit
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=bench_args.count, default=5, help="runs of each command; the median is kept")
    ap.add_argument("--threads", type=bench_args.count, default=1, help="CPU threads of the solve and the app")
    ap.add_argument("--no-app", action="store_true", help="leave out the app (it needs the [app] extra)")
    ap.add_argument("--out", type=bench_args.output_file, default=OUT)
    args = ap.parse_args()
    before = load_average()
    times = measure(args.rounds, args.threads, not args.no_app)
    result = {"machine": machine(args.threads), "load_average_1min": {"before": before, "after": load_average()},
              "rounds": args.rounds, "puzzle": PUZZLE, "times": times, "goals": goals(times)}
    atomic_write_json(args.out, result)
    width = max(map(len, times))
    for name, value in times.items():
        print(f"{name:<{width}}  {value['median_s']:7.3f} s")
    for name, goal in result["goals"].items():
        floor = (f"; importing gradio and torch alone takes {goal['import_gradio_torch_s']} s"
                 if "import_gradio_torch_s" in goal else "")
        print(f"{name}: {'met' if goal['met'] else 'NOT met'} (limit {goal['limit_s']} s{floor})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
