"""The app's limits: request bodies, image sizes, time per solve, abandoned jobs, temp files, session states,
start-up errors.

Every server here listens on the loopback interface (127.0.0.1 or ::1) and gets a bounded number of requests. The
load test runs the app in its own process so its resident memory can be read from /proc."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import httpx
import pytest
from gradio.components.image_editor import EditorData, EditorDataBlobs
from gradio.data_classes import FileData
from test_app import EASY, TRAINED, tiny_mim, tiny_solver

import hyperset.apps.app as app_module
import hyperset.apps.limits as limits
import hyperset.apps.sudoku_tab as sudoku_tab
from hyperset.apps.app import HyperSETApp, launch_kwargs
from hyperset.apps.inputs import puzzle_to_grid
from hyperset.apps.limits import MAX_BODY_BYTES, MAX_EDITOR_LAYERS, RunGuard, StreamWatch, check_pixels, image_size

HUGE_SIDE = 12_000  # 144 M pixels: 432 MB once decoded as RGB, about 420 KB as a PNG of one colour
MEMORY_CAP_MB = 200  # what the server's resident memory may grow under the load test


def png(width: int, height: int) -> bytes:
    """A valid RGB PNG of one colour, written row by row (the pixels are never held in memory)."""
    deflate = zlib.compressobj(9)
    row = bytes(1 + 3 * width)
    data = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


@pytest.fixture(scope="module")
def huge_png() -> bytes:
    return png(HUGE_SIDE, HUGE_SIDE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _file(path: str) -> dict:
    return {"path": path, "orig_name": "image.png", "meta": {"_type": "gradio.FileData"}}


def _call(client: httpx.Client, api: str, data: list, timeout: float = 120) -> tuple[str, object]:
    """POST an API call and read its event stream to the end: (last event name, its data)."""
    posted = client.post(f"/gradio_api/call/{api}", json={"data": data})
    posted.raise_for_status()
    stream = client.get(f"/gradio_api/call/{api}/{posted.json()['event_id']}", timeout=timeout).text
    events = [line.split(": ", 1)[1] for line in stream.splitlines() if line.startswith("event: ")]
    payloads = [line.split(": ", 1)[1] for line in stream.splitlines() if line.startswith("data: ")]
    return events[-1], json.loads(payloads[-1])


def _upload(client: httpx.Client, content: bytes) -> str:
    answer = client.post("/gradio_api/upload", files={"files": ("image.png", content, "image/png")})
    answer.raise_for_status()
    return answer.json()[0]


# ---- images: the size from the header, before any decoding -----------------------------------------------------


@pytest.mark.slow
def test_image_size_reads_the_header_only(huge_png: bytes):
    tracemalloc.start()
    assert image_size(huge_png) == (HUGE_SIDE, HUGE_SIDE)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 5 * 2**20  # decoding would take 432 MB


def test_every_image_of_an_editor_value_is_checked(tmp_path: Path, huge_png: bytes):
    big, small = tmp_path / "big.png", tmp_path / "small.png"
    big.write_bytes(huge_png)
    small.write_bytes(png(8, 8))
    ok, bad = FileData(path=str(small)), FileData(path=str(big))
    check_pixels(EditorData(background=ok, layers=[ok], composite=ok), {})
    for value in (EditorData(background=bad, layers=[], composite=ok),
                  EditorData(background=ok, layers=[ok, bad], composite=ok),
                  EditorData(background=ok, layers=[], composite=bad), bad):
        with pytest.raises(gr.Error, match=f"{HUGE_SIDE}x{HUGE_SIDE} pixels"):
            check_pixels(value, {})
    blobs = {"b1": EditorDataBlobs(background=png(8, 8), layers=[huge_png], composite=None)}
    with pytest.raises(gr.Error, match="too large"):  # the editor's uploaded blobs, named by id
        check_pixels(EditorData(id="b1"), blobs)
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(gr.Error, match="could not read"):
        check_pixels(FileData(path=str(tmp_path / "text.png")), {})


# ---- time limit and abandoned jobs, without a server ---------------------------------------------------------


def test_solve_stops_at_the_time_limit_with_the_board_so_far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    app = HyperSETApp(tiny_solver(tmp_path))
    monkeypatch.setattr(sudoku_tab, "SOLVE_TIME_LIMIT", 0)
    updates = list(app.sudoku.solve(puzzle_to_grid(EASY), 4 * TRAINED, "commit"))
    board, plot, verdict, details = updates[-1]
    assert len(updates) == 1 and details["iterations"] == 1  # the first iteration's board is the answer
    assert details["stopped"] == "the time limit of 0 s" and "Stopped at the time limit" in verdict
    assert len(details["prediction"]) == 81 and board.count("<td") == 81


def test_api_solve_stops_at_the_time_limit_with_the_board_so_far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """/solve has the streamed solve's time limit: it answers with the board after the last iteration run."""
    app = HyperSETApp(tiny_solver(tmp_path))
    monkeypatch.setattr(sudoku_tab, "SOLVE_TIME_LIMIT", 0)
    board, verdict, energies = app.sudoku.api_solve(EASY, 4 * TRAINED, "commit")
    assert energies["stopped"] == "the time limit of 0 s" and energies["iterations"] == 1
    assert verdict.endswith("(stopped at the time limit of 0 s, after 1 iteration)")
    assert verdict.startswith(("solved", "not solved: "))
    assert len(board) == 81 and len(energies["attn"]) == 1 and energies["pass_lengths"] == [1]


def test_a_job_nobody_listens_to_is_abandoned_after_the_grace(monkeypatch: pytest.MonkeyPatch):
    streams = StreamWatch(capacity=3)
    monkeypatch.setattr(limits, "LISTEN_GRACE", 0.0)
    guard = RunGuard(60, ("event-1", "session-1"), time.perf_counter(), streams)
    assert guard.abandoned()
    streams.opened("session-1")  # the page listens by session
    assert not guard.abandoned()
    for key in ("a", "b", "c"):  # only the newest keys are kept
        streams.opened(key)
    assert guard.abandoned() and not RunGuard(60, (), 0.0, streams).abandoned()  # no request: never abandoned


def test_stop_ends_the_sessions_handlers_started_before_it():
    streams = StreamWatch()
    running = RunGuard(60, ("event-1", "session-1"), time.perf_counter(), streams)
    other = RunGuard(60, ("event-2", "session-2"), time.perf_counter(), streams)
    assert not running.stop_requested()
    streams.stop("session-1")
    assert running.stop_requested() and not other.stop_requested()
    later = RunGuard(60, ("event-3", "session-1"), time.perf_counter(), streams)  # the next solve of that session
    assert not later.stop_requested()


# ---- the launched app, in this process ---------------------------------------------------------------------------


class SlowBackend:
    """A solver backend whose iterations take ``delay`` seconds each and are counted (to see when a job stops)."""

    def __init__(self, backend: object, delay: float) -> None:
        self._backend, self.delay, self.iterations = backend, delay, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._backend, name)

    def iterate(self, boards, iters: int) -> Iterator:
        for frame in self._backend.iterate(boards, iters):
            time.sleep(self.delay)
            self.iterations += 1
            yield frame

    def run(self, boards, iters: int):
        for _ in range(iters):
            time.sleep(self.delay)
            self.iterations += 1
        return self._backend.run(boards, iters)


def SlowSolver(solver, delay: float) -> SlowBackend:  # noqa: N802
    """Make the solver's iterations slow and counted; returns the counting backend."""
    solver.backend = slow = SlowBackend(solver.engine, delay)
    return slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    patch = pytest.MonkeyPatch()
    patch.setattr(limits, "LISTEN_GRACE", 1.0)
    patch.setattr(app_module, "CACHE_CLEANUP", (1, 1), raising=False)
    sudoku = tiny_solver(tmp_path_factory.mktemp("sudoku"))
    solver = SlowSolver(sudoku, delay=0.05)
    demo = HyperSETApp(sudoku, tiny_mim()).build()
    demo.launch(server_name="127.0.0.1", server_port=_free_port(), prevent_thread_lock=True, quiet=True,
                **launch_kwargs())
    try:
        with httpx.Client(base_url=demo.local_url, timeout=60) as client:
            yield SimpleNamespace(demo=demo, solver=solver, client=client)
    finally:
        demo.close()
        patch.undo()


def test_oversized_bodies_are_refused_declared_or_chunked(served):
    client = served.client
    too_long = json.dumps({"data": ["x" * (MAX_BODY_BYTES + 1)]}).encode()
    assert client.post("/gradio_api/call/load_puzzle", content=too_long,
                       headers={"content-type": "application/json"}).status_code == 413
    chunked = client.post("/gradio_api/call/load_puzzle", headers={"content-type": "application/json"},
                          content=(too_long[i:i + 65536] for i in range(0, len(too_long), 65536)))
    assert chunked.status_code == 413 and "too large" in chunked.text
    assert _call(client, "load_puzzle", [EASY])[0] == "complete"  # and the app still serves


def test_values_gradio_cannot_take_are_one_line_errors_naming_the_input(served, huge_png: bytes):
    """A file reference where text or a number is expected, a file the server was never sent, a value of the
    wrong shape for an image input, too few inputs (each was Gradio's {"error": null}), a refused upload and a
    fractional iteration count (which the app rounded): one line each, naming the input."""
    ref = _file("/etc/passwd")
    editor = {"background": ref, "layers": [], "composite": None}
    settings = ["random", 0.5, 0, 2, 4, 1.0, True, "expected"]
    cases = [("solve", [ref, 2, "single"], "puzzle_text: a file reference, where text is expected"),
             ("solve", [EASY, ref, "single"], "iterations: a file reference, where a whole number is expected"),
             ("solve", [EASY, 2, ref], "strategy: a file reference"),
             ("load_puzzle", [ref], "text: a file reference"),
             ("solve_stream", [ref, 2, "single"], "grid: a file reference"),
             ("sample", [ref], "name: a file reference, where one of 'astronaut'"),
             ("upload", [ref], "path: the file /etc/passwd was not uploaded to this server"),
             ("reconstruct", [editor, *settings], "editor: the file /etc/passwd was not uploaded to this server"),
             ("upload", ["not a file"], "path: not a valid Image value"),
             ("reconstruct", ["not an editor", *settings], "editor: not a valid ImageEditor value"),
             ("load_puzzle", [], "didn't receive enough input values"),
             ("upload", [_file(_upload(served.client, huge_png))], f"({HUGE_SIDE}x{HUGE_SIDE} pixels"),
             ("solve", [EASY, 1.5, "single"], "iterations = 1.5: expected an integer number of iterations"),
             ("solve", [EASY, 64.4, "single"], "iterations = 64.4: expected an integer number of iterations")]
    for api, data, words in cases:
        event, answer = _call(served.client, api, data)
        assert event == "error" and words in answer["error"] and "\n" not in answer["error"], (api, answer)


@pytest.mark.slow
def test_abandoned_solve_stops_and_frees_the_slot(served):
    grid = {"headers": [str(i) for i in range(1, 10)], "data": puzzle_to_grid(EASY)}
    posted = served.client.post("/gradio_api/call/solve_stream", json={"data": [grid, 4 * TRAINED, "commit"]})
    assert posted.status_code == 200  # ...and its result is never asked for
    time.sleep(limits.LISTEN_GRACE + 1.5)
    stopped_at = served.solver.iterations
    time.sleep(1.0)
    assert served.solver.iterations == stopped_at < 16 * 4 * TRAINED  # it stopped before its 16 passes
    event, (board, plot, verdict, details) = _call(served.client, "solve_stream", [grid, 2, "single"])
    assert event == "complete" and details["iterations"] == 2


@pytest.mark.slow
def test_abandoned_api_solve_stops_and_frees_the_slot(served, monkeypatch: pytest.MonkeyPatch):
    """/solve stops as the streamed solve does when nobody asks for its result (it held the model slot until
    done)."""
    monkeypatch.setattr(served.solver, "delay", 0.5)  # 12 iterations: 6 s, well past the 1 s grace
    posted = served.client.post("/gradio_api/call/solve", json={"data": [EASY, 4 * TRAINED, "single"]})
    assert posted.status_code == 200  # ...and its result is never asked for
    time.sleep(limits.LISTEN_GRACE + 1.5)
    stopped_at = served.solver.iterations
    time.sleep(1.0)
    assert served.solver.iterations == stopped_at
    monkeypatch.setattr(served.solver, "delay", 0.05)
    event, (board, verdict, energies) = _call(served.client, "solve", [EASY, 2, "single"])
    assert event == "complete" and energies["iterations"] == 2 and "stopped" not in energies


@pytest.mark.slow
def test_solves_that_clients_listen_to_run_past_the_grace(served, monkeypatch: pytest.MonkeyPatch):
    """The page and gradio_client listen by session hash, the API by event id: neither is taken as abandoned."""
    gradio_client = pytest.importorskip("gradio_client")
    monkeypatch.setattr(served.solver, "delay", 0.2)  # 12 iterations: 2.4 s, past the 1 s grace
    grid = {"headers": [str(i) for i in range(1, 10)], "data": puzzle_to_grid(EASY)}
    event, (_, _, _, details) = _call(served.client, "solve_stream", [grid, 4 * TRAINED, "single"])
    assert event == "complete" and details["iterations"] == 4 * TRAINED
    client = gradio_client.Client(served.demo.local_url, verbose=False, analytics_enabled=False)
    *_, details = client.predict(grid, 4 * TRAINED, "single", api_name="/solve_stream")
    assert details["iterations"] == 4 * TRAINED


@pytest.mark.slow
def test_uploaded_files_are_deleted_after_their_age(served):
    path = Path(_upload(served.client, png(8, 8)))
    assert path.exists()
    deadline = time.monotonic() + 10
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not path.exists()


def test_editor_blob_uploads_are_bounded(served):
    editor = next(b for b in served.demo.blocks.values() if getattr(b, "elem_id", None) == "mim-editor")

    def send_blob(blob_id: str, index: int) -> httpx.Response:
        fields = {"session_hash": "s1", "component_id": str(editor._id), "fn_name": "accept_blobs",
                  "id": blob_id, "type": "layer", "index": str(index)}
        return served.client.post("/gradio_api/component_server", data=fields,
                                  files={"blob": ("blob.png", png(8, 8), "image/png")})

    refused = send_blob("far", 10**6)  # Gradio would size a list of layers by this index
    assert refused.status_code >= 400 and "far" not in editor.blob_storage
    for i in range(limits.EDITOR_BLOB_SLOTS + 5):
        assert send_blob(f"id{i}", MAX_EDITOR_LAYERS - 1).status_code == 200
    assert len(editor.blob_storage) == limits.EDITOR_BLOB_SLOTS


@pytest.mark.slow
def test_api_calls_keep_a_bounded_number_of_session_states(served):
    """Gradio keeps a session state for every API call (each call is a session of its own) with the call's inputs
    in it, up to 1 MiB a call: the app keeps the newest SESSION_STATES, where Gradio's default is 10,000."""
    too_long = "1" * (limits.MAX_TEXT_CHARS + 1)  # refused by the handler, held in the session state all the same
    for _ in range(limits.SESSION_STATES + 8):
        assert _call(served.client, "load_puzzle", [too_long])[0] == "complete"
    assert len(served.demo.state_holder.session_data) == limits.SESSION_STATES


# ---- the launched app, in its own process: memory under load -------------------------------------------------

SERVE = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from test_app import tiny_mim, tiny_solver
from hyperset.apps.app import build_demo, launch_kwargs
demo = build_demo(tiny_solver(Path(sys.argv[2])), tiny_mim())
demo.launch(server_name="127.0.0.1", server_port=int(sys.argv[3]), prevent_thread_lock=True, quiet=True,
            **launch_kwargs())
print("serving", flush=True)
demo.block_thread()
"""


def _memory_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


@pytest.fixture
def server_process(tmp_path: Path) -> Iterator[SimpleNamespace]:
    if not Path("/proc/self/status").exists():
        pytest.skip("reads the server's memory from /proc")
    port = _free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(Path(__file__).parent), str(tmp_path), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        ready = threading.Timer(120, proc.kill)
        ready.start()
        lines = []
        for line in proc.stdout:  # until it serves (or dies)
            lines.append(line)
            if line.startswith("serving"):
                break
        ready.cancel()
        assert proc.poll() is None, "".join(lines)
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            yield SimpleNamespace(pid=proc.pid, client=client)
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.slow
def test_load_keeps_memory_bounded_and_the_app_serving(server_process, huge_png: bytes):
    """200 bodies of 5 MB, a 12000x12000 PNG in every image input, then concurrent solves: resident memory stays
    within MEMORY_CAP_MB of its start (its peak too, for the images), every answer is a clean refusal or a result."""
    client, pid = server_process.client, server_process.pid
    assert _call(client, "load_puzzle", [EASY])[0] == "complete"
    start, peak = _memory_mb(pid, "VmRSS"), _memory_mb(pid, "VmHWM")
    body = json.dumps({"data": ["x" * 5_000_000]}).encode()
    codes = [client.post("/gradio_api/call/load_puzzle", content=body,
                         headers={"content-type": "application/json"}).status_code for _ in range(200)]
    assert codes == [413] * 200
    assert _memory_mb(pid, "VmRSS") - start < MEMORY_CAP_MB

    big, small = _upload(client, huge_png), _upload(client, png(32, 32))
    editor_values = [{"background": _file(big), "layers": [], "composite": _file(small)},
                     {"background": _file(small), "layers": [_file(big)], "composite": _file(small)},
                     {"background": _file(small), "layers": [], "composite": _file(big)}]
    answers = [_call(client, "upload", [_file(big)])]
    answers += [_call(client, "reconstruct", [value, "drawn", 0.5, 0, 2, 2, 1.0, True, "maskgit"])
                for value in editor_values]
    assert [event for event, _ in answers] == ["error"] * 4
    assert all("too large" in data["error"] for _, data in answers)
    assert _memory_mb(pid, "VmHWM") - peak < MEMORY_CAP_MB  # the peak: nothing was decoded

    grid = {"headers": [str(i) for i in range(1, 10)], "data": puzzle_to_grid(EASY)}
    results: list = []
    workers = [threading.Thread(target=lambda: results.append(_call(client, "solve_stream", [grid, TRAINED, "single"])))
               for _ in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [event for event, _ in results] == ["complete"] * 6
    assert all(len(data[3]["prediction"]) == 81 for _, data in results)
    assert _memory_mb(pid, "VmRSS") - start < MEMORY_CAP_MB


# ---- command line ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, words", [
    (["--port", "PORT"], "--port PORT is in use on 127.0.0.1"),
    (["--host", "x" * 64 + ".example"], "not an address or a known host name"),  # refused without a name server
    (["--host", "192.0.2.1"], "--host 192.0.2.1: cannot listen there"),  # an address of no machine here
])
def test_cli_port_in_use_and_bad_host_are_one_line_errors(args: list[str], words: str):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args, words = [a.replace("PORT", port) for a in args], words.replace("PORT", port)
        done = subprocess.run([sys.executable, "-m", "hyperset.apps.cli", *args, "--threads", "1", "--device", "cpu"],
                              cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hyperset-app: error: ") and words in lines[0]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture
def quick_serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    """``hyperset-app`` in this process with a tiny solver and no reconstruction model, returning after it
    starts serving; the demos it built, closed afterwards."""
    import hyperset.apps.cli as cli_module

    demos: list = []
    build = app_module.build_demo
    monkeypatch.setattr(app_module, "build_demo", lambda *a: demos.append(build(*a)) or demos[-1])
    monkeypatch.setattr(cli_module, "load_models", lambda args: (tiny_solver(tmp_path), None, "", "not loaded"))
    monkeypatch.setattr(cli_module, "serve_until_stopped", lambda demo: 0)
    yield demos
    for demo in demos:
        demo.close()


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_cli_serves_on_ipv6_addresses(host: str, quick_serve: list, capsys):
    """An IPv6 --host is served (Gradio needs it in brackets; given bare, the launch failed with a traceback)."""
    from hyperset.apps.cli import main

    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    assert main(["--host", host, "--port", str(port), "--threads", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    bare = host.strip("[]")
    assert f"Running on http://[{bare}]:{port}/" in out
    assert httpx.get(f"http://[::1]:{port}/", timeout=30).status_code == 200


def test_cli_launch_failure_is_a_one_line_error(quick_serve: list, monkeypatch: pytest.MonkeyPatch, capsys):
    """Any exception from Gradio's launch is the one-line error (exit 2), not a traceback."""
    from hyperset.apps.cli import main

    def refuse(self, **kw):
        raise ValueError("When localhost is not accessible, a shareable link must be created.\nCheck the proxy.")

    monkeypatch.setattr(gr.Blocks, "launch", refuse)
    assert main(["--port", str(_free_port()), "--threads", "1", "--device", "cpu"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["hyperset-app: error: cannot start the server: ValueError: When localhost is not accessible, "
                     "a shareable link must be created. Check the proxy."]
