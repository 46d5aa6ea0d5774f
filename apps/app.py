"""The Hyper-SET web app: a Sudoku solver that streams every iteration, and masked image reconstruction.

Build it with :func:`build_demo` (one model instance shared by every visitor, requests queued one at a time)
and launch it with ``demo.launch(**launch_kwargs())`` or the ``hyperset-app`` command (``hyperset.apps.cli``).

:class:`HyperSETApp` puts the page together: the header, the Sudoku tab (:mod:`hyperset.apps.sudoku_tab`) and the
reconstruction tab (:mod:`hyperset.apps.reconstruction_tab`), the queue, and the Gradio adapter
(:mod:`hyperset.apps.gradio_adapter`). The tabs' handlers are plain Python (a generator for the Sudoku solve) and
can be called without a server, which is how the tests exercise them; what they accept is checked in
:mod:`hyperset.apps.inputs`, what they draw in :mod:`hyperset.apps.rendering` and
:mod:`hyperset.apps.energy_plot`, and the request limits in :mod:`hyperset.apps.limits`.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from .gradio_adapter import default_missing_inputs, input_errors_as_messages
from .limits import MAX_UPLOAD_BYTES, QUEUE_SIZE, SESSION_STATES, RequestLimits
from .reconstruction_tab import ReconstructionTab
from .sudoku_tab import SudokuTab

__all__ = ["HyperSETApp", "build_demo", "launch_kwargs"]

CACHE_CLEANUP = (600, 3600)  # every 10 minutes, delete uploaded and generated files older than an hour


class HyperSETApp:
    """The page around one shared Sudoku solver and one shared MIM pipeline (either may be None: its tab then
    explains what is missing, with ``sudoku_note`` or ``mim_note``)."""

    def __init__(self, solver: Any = None, mim: Any = None, sudoku_note: str = "", mim_note: str = "") -> None:
        self.solver = solver
        self.mim = mim
        self.sudoku = SudokuTab(solver, sudoku_note)
        self.reconstruction = ReconstructionTab(mim, mim_note)

    def header(self) -> str:
        parts = ["# Hyper-SET\nTransformers designed as **hyperspherical energy minimization** (ICLR 2026): every "
                 "iteration of the shared layer is a gradient step on an attention energy E_ATTN, then one on a "
                 "feed-forward energy E_FF, with learned step sizes. The step sizes have no sign constraint: "
                 "where one is negative, its step climbs the energy, so a trained model's energies need not fall "
                 "at every iteration. Run it for more iterations than it was trained with and watch the energies "
                 "and the answer."]
        if self.solver is not None:
            n = sum(p.numel() for p in self.solver.model.parameters())
            parts.append(f"Sudoku model: {n / 1e3:.0f}k parameters, trained depth {self.sudoku.trained_iters}, "
                         f"{self.solver.backend_name} on {self.solver.device_name()}.")
        if self.mim is not None:
            n = sum(p.numel() for p in self.mim.model.parameters())
            parts.append(f"Reconstruction: {self.mim.image_size}x{self.mim.image_size} images, "
                         f"{self.mim.grid}x{self.mim.grid} tokens, token model {n / 1e6:.2f} M parameters, "
                         f"trained depth {self.reconstruction.trained_iters}.")
        return "\n\n".join(parts[:1]) + ("\n\n" + " ".join(parts[1:]) if len(parts) > 1 else "")

    def build(self) -> gr.Blocks:
        with gr.Blocks(title="Hyper-SET", fill_height=False, delete_cache=CACHE_CLEANUP) as demo:
            gr.Markdown(self.header())
            with gr.Tabs():
                with gr.Tab("Sudoku", id="sudoku", elem_id="tab-sudoku"):
                    self.sudoku.layout()
                with gr.Tab("Reconstruction", id="reconstruction", elem_id="tab-reconstruction"):
                    self.reconstruction.layout()
        demo.queue(default_concurrency_limit=1, max_size=QUEUE_SIZE)
        default_missing_inputs(demo, {"solve": 0})  # /solve(puzzle_text): every argument may be left out
        input_errors_as_messages(demo)
        return demo


def build_demo(solver: Any = None, mim: Any = None, sudoku_note: str = "", mim_note: str = "") -> gr.Blocks:
    """The Gradio Blocks app around a loaded ``hyperset.solve.Solver`` and ``MIMPipeline`` (either may be None).
    Requests are queued and run one at a time; launch it with ``launch_kwargs()`` for the request limits."""
    return HyperSETApp(solver, mim, sudoku_note, mim_note).build()


def launch_kwargs() -> dict[str, Any]:
    """Options for ``demo.launch`` that belong to the app: the upload and request size limits (the middleware
    refuses an oversized body before Gradio reads it), the number of session states kept (Gradio makes one per API
    call, with its inputs) and no server-side rendering."""
    from starlette.middleware import Middleware

    return {"max_file_size": MAX_UPLOAD_BYTES, "ssr_mode": False, "state_session_capacity": SESSION_STATES,
            "app_kwargs": {"middleware": [Middleware(RequestLimits)]}}
