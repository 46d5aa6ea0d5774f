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

from hyperset.apps.sudoku_tab import EXAMPLES
from hyperset.config import MAX_ITERS
from hyperset.sudoku import parse_puzzles
from hyperset.sudoku.exact import solve

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]

HARD = "000000200200000109000050000010400900060080030008000060400300000580040600006002004"  # rated 51+
TIMEOUT_MS = 180_000  # generous: CI machines and shared 2-core boxes can be slow
PHONE = (390, 844)  # a phone's viewport, CSS pixels

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
def _chromium_page(url: str, failure: str = "failure.png", viewport: tuple[int, int] = (1400, 1000)) -> Iterator[Any]:
    """A headless Chromium page at `url` (`viewport` wide and high, the test timeout); when the test fails, what the
    page showed is saved as `failure` for the test report."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        page = None
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(url)
            yield page
        except Exception:
            if page is not None:
                _save(page, failure)
            raise
        finally:
            browser.close()


@pytest.mark.slow
def test_solve_stop_and_reconstruct_in_chromium(url):
    url, counting = url
    with _chromium_page(url) as page:
        page.locator("#solve-btn").wait_for()
        # edit a cell of the grid (the easy example is preloaded; r1c3 is blank): the board follows
        page.locator("#sudoku-grid input.cell").nth(2).click()
        page.keyboard.press("1")
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

        # Stop cancels a long solve: commit at 4T iterations per pass, up to 16 passes; a board leaves as soon as it
        # is valid (the medium puzzle, after some 8 iterations), so each iteration is slowed to outlast the Stop
        counting.pause = 0.3
        page.get_by_label("commit").check()
        number = page.locator("#sudoku-iters input[type=number]")
        number.fill(str(4 * counting.trained_iters))
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_grid_is_a_board_that_fits_a_phone_and_solves_what_is_typed_in_chromium(url):
    """At a phone's 390 px: the grid is 81 cells in 9 equal columns, the ninth inside the viewport, with box lines
    thicker than the cell lines. A digit typed into a cell is solved with the board, the arrows move between cells,
    81 characters pasted into a cell fill the grid, and an iteration count out of range gets a note."""
    url, _ = url
    with _chromium_page(url, "failure_phone.png", PHONE) as page:
        cells = page.locator("#sudoku-grid input.cell")
        cells.first.wait_for()
        assert cells.count() == 81
        row = [cells.nth(i).bounding_box() for i in range(9)]
        assert len({round(box["width"], 1) for box in row}) == 1 and row[0]["x"] >= 0
        assert row[8]["x"] + row[8]["width"] <= PHONE[0]
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE[0]  # nothing to scroll sideways

        def line(i: int, side: str) -> float:
            return float(cells.nth(i).evaluate(f"el => getComputedStyle(el).border{side}Width").removesuffix("px"))

        assert line(2, "Right") > line(0, "Right") and line(5, "Right") > line(4, "Right")  # after columns 3, 6
        assert line(18, "Bottom") > line(0, "Bottom") and line(45, "Bottom") > line(36, "Bottom")  # rows 3, 6
        assert page.locator("#sudoku-grid th").count() == 0  # no header row

        # the preloaded easy example: type its solution's digit into the first blank, then Solve
        givens = parse_puzzles(EXAMPLES[1][1])[0].givens
        blank, n = givens.index("0"), 82 - givens.count("0")
        cells.nth(blank).click()
        page.keyboard.press(solve(givens)[blank])
        page.locator("#verdict").get_by_text(f"{n} givens").wait_for()
        page.keyboard.press("ArrowDown")
        assert page.evaluate("document.activeElement.dataset.i") == str(blank + 9)
        page.locator("#solve-btn").click()
        page.locator("#verdict").get_by_text(f"all {n} givens are kept").wait_for()

        # 81 characters pasted into one cell (the middle one) fill the grid
        medium = parse_puzzles((ROOT / "examples" / "medium.txt").read_text())[0].givens
        cells.nth(40).evaluate("(el, text) => { const data = new DataTransfer(); data.setData('text/plain', text); "
                               "el.dispatchEvent(new ClipboardEvent('paste', {clipboardData: data, bubbles: true, "
                               "cancelable: true})); }", medium.replace("0", "."))
        page.locator("#verdict").get_by_text(f"{81 - medium.count('0')} givens").wait_for()
        assert "".join(cells.nth(i).input_value() or "0" for i in range(81)) == medium

        # an iteration count past the CLI's limit: a note beside the field, in the CLI's words, and no clamp
        number = page.locator("#sudoku-iters input[type=number]")
        number.fill(str(MAX_ITERS + 1))
        page.locator("#sudoku-iters-note").get_by_text("must be between 1 and 10,000").wait_for()
        number.blur()
        assert number.input_value() == str(MAX_ITERS + 1)
        _save(page, "sudoku_phone.png")
