"""The app in a real browser: headless Debian Chromium driven by Playwright (never `playwright install`).

Opens the page, loads an example, solves it, waits for the verdict, reconstructs an image, and saves a
screenshot of each tab to artifacts/screenshots/ (and to docs/screenshots/ when HYPERSET_UPDATE_DOCS=1).
Uses the shipped models when they load (or the checkpoints named by HYPERSET_APP_CHECKPOINT /
HYPERSET_APP_MIM_CHECKPOINT), else tiny untrained ones.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperset.apps.app import MAX_ITER_FACTOR
from hyperset.sudoku import parse_puzzles

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]

HARD = "000000200200000109000050000010400900060080030008000060400300000580040600006002004"  # rated 51+
TIMEOUT_MS = 180_000  # generous: CI machines and shared 2-core boxes can be slow

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium not installed at /usr/bin/chromium "
                                                     "(apt-get install -y chromium)"),
]


class _CountingBackend:
    """The solver's backend, counting iterations (and pausing in each when asked) so that the Stop button can be
    checked."""

    def __init__(self, backend):
        self._backend, self.pause, self.iterations = backend, 0.0, 0

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def iterate(self, boards, iters):
        for out in self._backend.iterate(boards, iters):
            self.iterations += 1
            if self.pause:
                time.sleep(self.pause)
            yield out


def _models(tmp: Path):
    from test_app import tiny_mim, tiny_solver

    from hyperset.solve import Solver
    from hyperset.vision.reconstruct import load_mim

    try:
        solver = Solver.load(os.environ.get("HYPERSET_APP_CHECKPOINT") or None, device="cpu")
    except Exception:
        solver = tiny_solver(tmp / "sudoku")
    try:
        mim = load_mim(os.environ.get("HYPERSET_APP_MIM_CHECKPOINT") or None, device="cpu")
    except Exception:
        mim = tiny_mim()
    return solver, mim


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory):
    from hyperset.apps.app import build_demo, launch_kwargs

    solver, mim = _models(tmp_path_factory.mktemp("models"))
    solver.backend = counting = _CountingBackend(solver.engine)
    counting.trained_iters = solver.trained_iters
    demo = build_demo(solver, mim)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kw = {**launch_kwargs(), "ssr_mode": False}
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kw)
    try:
        yield demo.local_url, counting
    finally:
        demo.close()


def _save(page, name: str) -> Path:
    out = ROOT / "artifacts" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("HYPERSET_UPDATE_DOCS") == "1":
        docs = ROOT / "docs" / "screenshots"
        docs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, docs / name)
    return path


@contextlib.contextmanager
def _chromium_page(url: str, failure: str = "failure.png") -> Iterator[Any]:
    """A headless Chromium page at `url` (1400x1000, the test timeout); when the test fails, what the page showed
    is saved as `failure` for the test report."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        page = None
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(url)
            yield page
        except Exception:
            if page is not None:
                _save(page, failure)
            raise
        finally:
            browser.close()


def test_solve_stop_and_reconstruct_in_chromium(url):
    url, counting = url
    with _chromium_page(url) as page:
        page.locator("#solve-btn").wait_for()
        # edit a cell of the grid (the easy example is preloaded; r1c3 is blank): the board follows
        cell = page.locator("#sudoku-grid [data-testid=cell-0-2]")
        cell.dblclick()
        editor = cell.locator("input, textarea").first
        editor.wait_for()  # the cell's editor is open before anything is typed into it
        editor.fill("1")
        editor.press("Enter")
        page.locator("#verdict").get_by_text("38 givens").wait_for()
        # load an example through its button, then solve it (the default commit strategy: several passes)
        page.get_by_text("Hard: 23 givens", exact=True).first.click()
        page.locator("#verdict").get_by_text("Loaded a puzzle with 23 givens").wait_for()
        page.locator("#solve-btn").click()
        page.locator("#verdict").get_by_text("Verdict:").wait_for()
        verdict = page.locator("#verdict").inner_text()
        assert "solved" in verdict and "iterations" in verdict
        assert page.locator("#sudoku-board td").count() == 81
        page.locator("#sudoku-energy svg").first.wait_for()
        assert _save(page, "sudoku.png").stat().st_size > 10_000
        # a pasted puzzle, Solve pressed without "Put text in the grid": the pasted one is solved
        medium = (ROOT / "examples" / "medium.txt").read_text()
        n_medium = 81 - parse_puzzles(medium)[0].givens.count("0")
        page.locator("#verdict").get_by_text("Verdict:").wait_for()
        page.locator("#sudoku-text textarea").fill(medium)
        page.locator("#solve-btn").click()
        page.locator("#verdict").get_by_text(f"all {n_medium} givens are kept").wait_for()
        # bad text gives a message, not a stack trace
        page.locator("#sudoku-text textarea").fill("12345")
        page.get_by_role("button", name="Put text in the grid").click()
        page.locator("#verdict").get_by_text("expected 9 cells in a grid row").wait_for()

        # Stop cancels a long solve: commit at the maximum depth runs up to 16 passes of 4T iterations
        counting.pause = 0.05  # 16 x 4T iterations now take far longer than the check below
        page.get_by_label("commit").check()
        number = page.locator("#sudoku-iters input[type=number]")
        number.fill(str(MAX_ITER_FACTOR * counting.trained_iters))
        number.press("Enter")
        page.locator("#solve-btn").click()
        page.locator("#verdict").get_by_text("pass 1").wait_for()
        page.locator("#stop-btn").click()
        time.sleep(1.0)
        stopped_at = counting.iterations
        time.sleep(1.5)
        assert counting.iterations == stopped_at  # the server-side generator is no longer running
        assert "Verdict:" not in page.locator("#verdict").inner_text()

        # and a search mid-way: a puzzle of the 51+ bucket, stopped once the verdict counts its nodes
        page.locator("#sudoku-text textarea").fill(HARD)
        page.get_by_role("button", name="Put text in the grid").click()
        page.locator("#verdict").get_by_text("Loaded a puzzle with").wait_for()
        page.get_by_label("search").check()
        number.fill(str(counting.trained_iters))
        number.press("Enter")
        page.locator("#solve-btn").click()
        page.locator("#verdict").get_by_text("of at most").wait_for()
        assert "backtrack" in page.locator("#verdict").inner_text()
        page.locator("#stop-btn").click()
        time.sleep(1.0)
        stopped_at = counting.iterations
        time.sleep(1.5)
        assert counting.iterations == stopped_at
        assert "Verdict:" not in page.locator("#verdict").inner_text()
        counting.pause = 0.0

        # reconstruction with a painted mask: one stroke across the upper left of the image
        page.get_by_role("tab", name="Reconstruction").click()
        canvas = page.locator("#mim-editor canvas").first
        canvas.wait_for()
        box = canvas.bounding_box()
        x, y = box["x"] + 0.3 * box["width"], box["y"] + 0.3 * box["height"]
        page.mouse.move(x, y)
        page.mouse.down()
        for k in range(1, 21):
            page.mouse.move(x + 6 * k, y + 3 * k)
        page.mouse.up()
        page.get_by_label("drawn").check()
        page.locator("#reconstruct-btn").click()
        page.locator("#mim-metrics").get_by_text("PSNR").first.wait_for()
        masked = int(re.search(r"(\d+)/(\d+) tokens masked", page.locator("#mim-metrics").inner_text()).group(1))
        assert 0 < masked < 32  # the stroke, not the whole image
        page.locator("#mim-recon img").first.wait_for()
        page.locator("#mim-energy svg").first.wait_for()
        assert "SSIM" in page.locator("#mim-metrics").inner_text()
        assert _save(page, "reconstruction.png").stat().st_size > 10_000


def test_reconstruction_default_run_shows_four_columns_in_chromium(url):
    """The reconstruction tab as it opens: press Reconstruct with the defaults (the default sample, a 40% random
    mask, paste-back on) and the four image columns, the metrics, the energy plot and its note all render."""
    url, _ = url
    with _chromium_page(url, "failure_mim.png") as page:
        page.get_by_role("tab", name="Reconstruction").click()
        page.locator("#reconstruct-btn").wait_for()
        assert "Token model" in page.locator("#mim-training").inner_text()
        assert page.locator("#mim-paste-back input[type=checkbox]").is_checked()
        page.locator("#reconstruct-btn").click()
        page.locator("#mim-metrics").get_by_text("tokens masked").first.wait_for()
        columns = ("mim-original", "mim-masked", "mim-tokenizer", "mim-recon")
        for column in columns:
            img = page.locator(f"#{column} img").first
            img.wait_for()
            assert img.evaluate("el => el.complete && el.naturalWidth") >= 32, column
        sources = {page.locator(f"#{c} img").first.get_attribute("src") for c in columns}
        assert len(sources) == 4  # four different pictures
        metrics = page.locator("#mim-metrics").inner_text()
        masked = int(re.search(r"(\d+)/(\d+) tokens masked", metrics).group(1))
        assert masked == round(0.4 * int(re.search(r"\d+/(\d+) tokens masked", metrics).group(1)))
        assert "pasted back" in metrics
        page.locator("#mim-energy svg").first.wait_for()
        assert "What the plot shows" in page.locator("#mim-energy-note").inner_text()
        assert _save(page, "mim_tab.png").stat().st_size > 10_000
