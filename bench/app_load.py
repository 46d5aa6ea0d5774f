"""The app's resident memory under a sustained flood of /solve API calls: whether it stays bounded.

Starts `hyperset-app` (the shipped models, on the CPU) on a free port of 127.0.0.1 in its own process and sends it
`--requests` calls of the /solve endpoint, `--parallel` at a time, in rounds of 100. The calls cycle through

    valid      an example puzzle (examples/*.txt) with the default settings: the app solves it
    too_long   a body of about 1 MB, under the request cap but over the app's text limit: the app refuses it
    over_cap   a body over the request cap (1 MiB): the middleware refuses it with 413 before Gradio reads it

and the result stream of one call in three is read to its end, the others' never (the app stops those jobs); a call
the full queue refuses (503) is sent again a moment later. After every round the server's resident memory (VmRSS
in /proc) is read, and once more after IDLE_SECONDS without requests; issue #52 asks for the RSS after 1,200
requests within 100 MB of the RSS after the first 100. Every request has a timeout and the server is stopped at the
end, also on an error or Ctrl-C.

    python bench/app_load.py                                  # writes bench/results/app_load.json and .png
    python bench/app_load.py --requests 400 --parallel 8 --out /tmp/app_load.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bench_args  # noqa: E402
import httpx  # noqa: E402

from hyperset.apps.limits import MAX_BODY_BYTES  # noqa: E402
from hyperset.checkpoint import atomic_write_json  # noqa: E402
from hyperset.device import cpu_model  # noqa: E402
from hyperset.sudoku.parse import parse_file  # noqa: E402

OUT = ROOT / "bench" / "results" / "app_load.json"
ROUND = 100  # requests between two readings of the server's memory
KINDS = ["valid", "too_long", "valid", "too_long", "valid", "too_long", "valid", "too_long", "valid", "over_cap"]
READ_EVERY = 3  # the result stream of one call in this many is read
TOO_LONG_CHARS = 1_000_000  # the too_long body: under MAX_BODY_BYTES, far over the app's 20,000 characters
START_TIMEOUT = 180.0  # seconds for the server to load its models and listen
REQUEST_TIMEOUT = 120.0  # seconds for any one request (a post, or reading a result stream to its end)
QUEUE_FULL_TRIES = 200  # a post the full queue refuses (503) is sent again, after QUEUE_FULL_WAIT, this many times
QUEUE_FULL_WAIT = 0.1
IDLE_SECONDS = 10.0  # after the last round, the server is left alone this long before its memory is read again


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    """The resident memory of process `pid` in MB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise bench_args.BenchInputError(f"/proc/{pid}/status has no VmRSS line")


def start_server(threads: int) -> tuple[subprocess.Popen, str]:
    """`hyperset-app` on a free loopback port, once it serves: (the process, its URL)."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen([sys.executable, "-m", "hyperset.apps.cli", "--port", str(port), "--threads",
                             str(threads), "--device", "cpu"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    killer = threading.Timer(START_TIMEOUT, proc.kill)  # a server that never says it serves is stopped
    killer.start()
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("Running on"):
            break
    killer.cancel()
    if proc.poll() is not None:
        raise bench_args.BenchInputError("hyperset-app did not start: " + " ".join("".join(lines[-5:]).split()))
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep reading, so that it never blocks
    return proc, f"http://127.0.0.1:{port}"


def bodies(puzzles: list[str]) -> dict[str, list[bytes]]:
    """The JSON bodies of each kind of call, made once."""
    over = MAX_BODY_BYTES + 64 * 1024
    return {"valid": [json.dumps({"data": [p, None, None]}).encode() for p in puzzles],
            "too_long": [json.dumps({"data": ["1" * TOO_LONG_CHARS, None, None]}).encode()],
            "over_cap": [json.dumps({"data": ["1" * over, None, None]}).encode()]}


def call(client: httpx.Client, body: bytes, kind: str, read: bool) -> str:
    """One /solve call: its outcome, "<kind>: <what happened>"; what the kind should get is "ok"."""
    try:
        for _ in range(QUEUE_FULL_TRIES):
            posted = client.post("/gradio_api/call/solve", content=body,
                                 headers={"content-type": "application/json"})
            if posted.status_code != 503:
                break
            time.sleep(QUEUE_FULL_WAIT)
        if kind == "over_cap":
            return f"{kind}: {'ok' if posted.status_code == 413 else f'status {posted.status_code}'}"
        if posted.status_code != 200:
            return f"{kind}: status {posted.status_code}"
        if not read:
            return f"{kind}: ok"
        stream = client.get(f"/gradio_api/call/solve/{posted.json()['event_id']}").text
    except httpx.HTTPError as err:
        return f"{kind}: {type(err).__name__}"
    events = [line.split(": ", 1)[1] for line in stream.splitlines() if line.startswith("event: ")]
    data = [line.split(": ", 1)[1] for line in stream.splitlines() if line.startswith("data: ")]
    last = (events or ["none"])[-1]
    if kind == "valid":
        good = last == "complete" and len(json.loads(data[-1])[0]) == 81
    else:
        good = last == "error" and "too long" in (data[-1] if data else "")
    return f"{kind}: {'ok' if good else f'event {last}'}"


def flood(url: str, pid: int, requests: int, parallel: int, puzzles: list[str]) -> dict[str, Any]:
    """Send the calls in rounds of ROUND; the server's RSS after each round and after the idle time."""
    made = bodies(puzzles)
    plan = [(KINDS[i % len(KINDS)], i) for i in range(requests)]
    outcomes: Counter[str] = Counter()
    series = [{"requests": 0, "rss_mb": round(rss_mb(pid), 1), "seconds": 0.0}]
    t0 = time.perf_counter()
    limits = httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)
    with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT, limits=limits) as client, \
            ThreadPoolExecutor(parallel) as pool:
        for start in range(0, requests, ROUND):
            batch = plan[start:start + ROUND]
            work = [(kind, made[kind][i % len(made[kind])], i % READ_EVERY == 0) for kind, i in batch]
            outcomes.update(pool.map(lambda w: call(client, w[1], w[0], w[2]), work))
            done = start + len(batch)
            series.append({"requests": done, "rss_mb": round(rss_mb(pid), 1),
                           "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{done:>6} requests  RSS {series[-1]['rss_mb']:7.1f} MB  {series[-1]['seconds']:6.1f} s",
                  flush=True)
    wall = time.perf_counter() - t0
    time.sleep(IDLE_SECONDS)
    first, last = series[1]["rss_mb"], series[-1]["rss_mb"]
    return {"rss": series, "rss_after_first_100_mb": first, "rss_at_end_mb": last,
            "growth_after_first_100_mb": round(last - first, 1), "rss_idle_mb": round(rss_mb(pid), 1),
            "outcomes": dict(sorted(outcomes.items())),
            "errors": sum(n for k, n in outcomes.items() if not k.endswith(": ok")),
            "wall_s": round(wall, 1), "requests_per_s": round(requests / wall, 1)}


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rss = report["rss"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([r["requests"] for r in rss], [r["rss_mb"] for r in rss], "o-", label="server RSS")
    first = report["rss_after_first_100_mb"]
    ax.axhspan(first, first + 100, color="C2", alpha=0.15, label="within 100 MB of the RSS after 100 requests")
    ax.set_xlabel("/solve requests sent")
    ax.set_ylabel("resident memory (MB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")
    s = report["settings"]
    ax.set_title(f"hyperset-app under load: {s['parallel']} in parallel, {report['errors']} unexpected outcomes "
                 f"({report['machine']['cpu']})", fontsize=8)
    fig.tight_layout()
    bench_args.save_figure(fig, path)


@bench_args.input_errors_exit
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=bench_args.at_least(ROUND), default=1200,
                        help=f"/solve calls to send, at least {ROUND} (default: %(default)s)")
    parser.add_argument("--parallel", type=bench_args.count, default=8,
                        help="calls in flight at once (default: %(default)s)")
    parser.add_argument("--threads", type=bench_args.count, default=1,
                        help="the server's CPU threads (default: %(default)s)")
    parser.add_argument("--out", type=bench_args.output_file, default=OUT,
                        help="JSON file to write; the plot goes beside it as .png (default: %(default)s)")
    args = parser.parse_args(argv)
    if not Path("/proc/self/status").exists():
        raise bench_args.BenchInputError("reads the server's memory from /proc, which this system does not have")
    puzzles = [parse_file(str(p))[0].givens for p in sorted((ROOT / "examples").glob("*.txt"))]
    proc, url = start_server(args.threads)
    try:
        result = flood(url, proc.pid, args.requests, args.parallel, puzzles)
    finally:
        bench_args.stop_process(proc)
    import gradio

    report = {"settings": {"requests": args.requests, "parallel": args.parallel, "threads": args.threads,
                           "round": ROUND, "kinds": KINDS, "read_every": READ_EVERY,
                           "too_long_chars": TOO_LONG_CHARS, "over_cap_bytes": MAX_BODY_BYTES + 64 * 1024},
              "command": bench_args.command_line("app_load", argv),
              "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                          "gradio": gradio.__version__},
              **result}
    report["within_100_mb"] = report["growth_after_first_100_mb"] <= 100
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, report)
    png = args.out.with_suffix(".png")
    plot(report, png)
    print(f"RSS after {ROUND}: {report['rss_after_first_100_mb']} MB, after {args.requests}: "
          f"{report['rss_at_end_mb']} MB ({report['growth_after_first_100_mb']:+} MB), {report['errors']} "
          f"unexpected outcomes; wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
