"""The app in a real browser: headless Debian Chromium driven by Playwright (never `playwright install`).

Opens the page, loads an example, solves it, waits for the verdict, reconstructs an image, and saves a
screenshot of each tab to artifacts/screenshots/ (and to docs/screenshots/ when HYPERSET_UPDATE_DOCS=1).
Uses the shipped models when they load (or the checkpoints named by HYPERSET_APP_CHECKPOINT /
HYPERSET_APP_MIM_CHECKPOINT), else tiny untrained ones.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"]

TIMEOUT_MS = 180_000  # generous: CI machines and shared 2-core boxes can be slow

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="headless Chromium not installed at /usr/bin/chromium "
                                                     "(apt-get install -y chromium)"),
]


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
    from apps.app import build_demo, launch_kwargs

    solver, mim = _models(tmp_path_factory.mktemp("models"))
    demo = build_demo(solver, mim)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kw = {**launch_kwargs(), "ssr_mode": False}
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, **kw)
    try:
        yield demo.local_url
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


def test_solve_and_reconstruct_in_chromium(url: str):
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        page = None
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(TIMEOUT_MS)
            page.goto(url)
            page.locator("#solve-btn").wait_for()
            # load an example through its button, then solve it
            page.get_by_text("Warm-up: 16 blanks", exact=True).first.click()
            page.locator("#verdict").get_by_text("Loaded a puzzle with 65 givens").wait_for()
            page.locator("#solve-btn").click()
            page.locator("#verdict").get_by_text("Verdict:").wait_for()
            verdict = page.locator("#verdict").inner_text()
            assert "solved" in verdict and "iterations" in verdict
            assert page.locator("#sudoku-board td").count() == 81
            page.locator("#sudoku-energy img").first.wait_for()
            assert _save(page, "sudoku.png").stat().st_size > 10_000

            page.get_by_role("tab", name="Reconstruction").click()
            page.locator("#reconstruct-btn").click()
            page.locator("#mim-metrics").get_by_text("PSNR").wait_for()
            page.locator("#mim-recon img").first.wait_for()
            page.locator("#mim-energy img").first.wait_for()
            assert "SSIM" in page.locator("#mim-metrics").inner_text()
            assert _save(page, "reconstruction.png").stat().st_size > 10_000
        except Exception:
            if page is not None:  # keep what the page showed for the test report
                _save(page, "failure.png")
            raise
        finally:
            browser.close()
