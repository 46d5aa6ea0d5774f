"""The Sudoku tab.

Type digits into the 9x9 grid (``hyperset.apps.board_input``: box lines, arrows move, 81 characters pasted
into a cell fill it) or paste text (an 81-character line, a 9-line grid or ``puzzle,solution`` CSV) into the
box; Solve takes whichever was edited last. The iterations per pass go from 1 to ``hyperset.config.MAX_ITERS``
as ``hyperset-solve --iters`` (a value out of range gets a note, never a clamp); the strategies are those of
``hyperset.strategy_registry.REGISTRY`` (``commit``, MaskGIT-style: N iterations, commit the most confident
clash-free digits as new givens and run again until the board is valid, up to 16 passes; ``single``, one pass
of N iterations; ``auto``, stop when the board is valid or has not changed for 4 iterations, N the maximum).
Solve streams the board after every iteration: givens bold, predicted digits shaded by the model's confidence,
conflicting cells red, and the energies E_ATTN and E_FF per iteration with a dashed line at the trained depth.
Stop cancels it and says so in the verdict; givens with no solution are noted with the parser's warning, as
``hyperset-solve`` prints it.

ONNX backend (``hyperset-app --backend onnx``): every frame comes from ONNX Runtime, the per-iteration
boards and energies from the exported step graphs (stem -> step x N -> head; exported into the cache with the
Loop graph, or read next to an ``--onnx-model`` file), so the board, the verdict and the energy plot are all
ONNX Runtime's; the details say so (``backend.frames``). A graph without step graphs is refused at start-up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import numpy as np

from hyperset.config import MAX_ITERS
from hyperset.defaults import DEFAULT_NODES, DEFAULT_PATIENCE
from hyperset.solve import DEFAULT_PASSES, DEFAULT_STRATEGY, json_number, result_of
from hyperset.strategies import BoardResult
from hyperset.strategy_registry import REGISTRY
from hyperset.sudoku.board import PuzzleError, cell_name, conflicts, validate
from hyperset.sudoku.parse import parse_puzzles

from .board_input import board_input
from .energy_plot import energy_svg
from .gradio_adapter import lenient, toast
from .inputs import EMPTY_PUZZLE, InputError, iterations_in, iterations_note, read_grid, read_puzzles
from .limits import MAX_TEXT_CHARS, MODEL_QUEUE, RunGuard
from .rendering import cells_list, error_md, render_board

__all__ = ["BLANK_BOARD", "EXAMPLES", "SOLVE_TIME_LIMIT", "STOPPED", "SOLVING", "SudokuTab"]

SOLVE_TIME_LIMIT = 120  # seconds per solve: then it stops with the board so far
PLOT_SHARE = 0.15  # while streaming, redraw the energy plot while drawing takes at most this share of the time
PLOT_COST_GUESS = 0.002  # seconds a plot is taken to cost before the first one is drawn (then: measured)
SEND_SHARE = 0.25  # ...and send an update while the consumer (Gradio) takes at most this share to pass them on

# example puzzles (kept here so the app works from an installed package)
EXAMPLES: list[tuple[str, str]] = [
    ("Warm-up: 16 blanks",
     "063092051749160820510738694106309207384276019097051346430510962975624108601983475"),
    ("Easy: 37 givens (grid)",
     "3 7 . | . . . | 4 8 .\n"
     ". . 6 | 4 9 7 | 2 3 1\n"
     ". 9 . | . 1 . | 7 6 5\n"
     "------+-------+------\n"
     ". . . | . 4 . | . . .\n"
     "1 4 8 | 9 . 3 | . . .\n"
     ". . . | . 5 . | 3 . 4\n"
     "------+-------+------\n"
     ". 2 . | 5 . 4 | 1 . 8\n"
     ". . 4 | . . . | . 5 3\n"
     ". 3 . | . 8 1 | . 4 ."),
    ("Medium: 29 givens",
     "000014200500070300000590004058400001000000006003080090870060000420805017009047000"),
    ("Hard: 23 givens",
     "000004000008760100050030090804100007027900000000600830000300050000050008900000000"),
    ("Hard: 22 givens (CSV with solution)",
     "puzzle,solution\n"
     "018000000000000200050003010607902000004000000290700400000000900000305000400071080,"
     "718259364346187295952463817637942158184536729295718436563824971871395642429671583"),
]

BLANK_BOARD = "0" * 81  # the puzzle grid's value with every cell empty
_PASTE_BOX_JS = "(document.querySelector('#sudoku-text textarea')?.value ?? '')"  # the paste box's text, in the page
SOLVING = "**Solving...**"  # how the verdict starts while a streamed solve runs
STOPPED = "**Stopped.** The board shows the last iteration drawn; press **Solve** to run again."


@dataclass
class _Frame:
    """One iteration of a streamed solve, as drawn."""

    step: int  # iterations run so far, over all passes
    pass_index: int  # 0-based
    t: int  # iteration within the pass
    digits: str  # 81 characters
    confidence: list[float]
    passes: list[dict[str, list[float]]] = field(default_factory=list)  # the energies so far, one dict per pass
    source: str = "torch"  # where the numbers came from: the backend's source ("torch", "onnxruntime")
    result: BoardResult | None = None  # the finished board, on the last frame
    search: dict[str, Any] | None = None  # the search's counters so far (nodes, backtracks, status)
    taken_back: int = 0  # cells of the previous node's board the search took back at this node


def _search_progress(frame: _Frame, budget: int) -> str:
    """"node 5 of at most 2000, 2 backtracks, 3 digits taken back, " for the live view of a search."""
    info = frame.search or {}
    nodes, back = info.get("nodes", frame.pass_index + 1), info.get("backtracks", 0)
    text = f"node {nodes} of at most {budget:,}, {back} backtrack{'s' if back != 1 else ''}, "
    if frame.taken_back:
        text += f"{frame.taken_back} digit{'s' if frame.taken_back != 1 else ''} taken back, "
    return text


class SudokuTab:
    """The Sudoku tab's handlers and layout around one shared solver (None: the tab says what is missing,
    ``note``)."""

    def __init__(self, solver: Any = None, note: str = "") -> None:
        self.solver = solver
        self.note = note

    @property
    def trained_iters(self) -> int:
        return int(self.solver.trained_iters) if self.solver is not None else 16

    @property
    def default_iters(self) -> int:
        """The iterations the field starts at: the solver's default depth per pass."""
        return int(self.solver.default_iters) if self.solver is not None else self.trained_iters

    def load_text(self, text: str | None) -> tuple[Any, Any, str]:
        """Pasted text -> (grid value, board preview, message). Errors leave the grid alone."""
        text = text or ""
        try:
            if len(text) > MAX_TEXT_CHARS:
                raise InputError(f"the text is too long ({len(text):,} characters; at most {MAX_TEXT_CHARS:,})")
            if not text.strip():
                raise InputError("paste a puzzle first: 81 characters (0 or . for blanks), a 9-line grid, "
                                 "or puzzle,solution CSV")
            try:
                puzzles = read_puzzles(text, "pasted text")
            except PuzzleError as err:
                where = f"line {err.line}: " if err.line is not None else ""
                raise InputError(f"could not read the puzzle ({where}{err.reason})") from None
            if puzzles[0].givens == "0" * 81:
                raise InputError(EMPTY_PUZZLE)
        except InputError as err:
            toast(str(err))
            return gr.skip(), gr.skip(), error_md(str(err))
        p = puzzles[0]
        notes = [f"Loaded a puzzle with {p.n_givens} givens. Press **Solve**."]
        if len(puzzles) > 1:
            notes.append(f"The text holds {len(puzzles)} puzzles; the first one is in the grid.")
        notes += [f"Note: {w}." for w in p.warnings]
        return p.givens, render_board(p.givens, p.givens), " ".join(notes)

    def preview(self, grid: Any) -> tuple[Any, str]:
        """The grid was edited: show its givens on the board (or what is wrong with it, and the parser's
        warnings: givens with no solution)."""
        try:
            p = read_grid(grid)
        except InputError as err:
            return gr.skip(), error_md(str(err))
        notes = [f"{p.n_givens} givens. Press **Solve**.", *(f"Note: {w}." for w in p.warnings)]
        return render_board(p.givens, p.givens), " ".join(notes)

    def solve_edited(self, grid: Any, text: Any, last: Any, iterations: Any = None,
                     strategy: Any = DEFAULT_STRATEGY) -> Iterator[tuple[Any, ...]]:
        """The Solve button: the puzzle edited last, the grid's or the paste box's (`last`: "grid" or "text"). A
        pasted puzzle is put in the grid first, and the verdict says which puzzle is solved. Yields (grid, board,
        energy plot, verdict, details)."""
        if last == "text" and isinstance(text, str) and text.strip():
            new_grid, _, message = self.load_text(text)
            if not isinstance(new_grid, str):  # gr.skip(): the text was refused
                yield gr.skip(), gr.skip(), gr.skip(), message, {"error": message}
                return
            grid, where = new_grid, "the pasted puzzle (now in the grid)"
        else:
            new_grid, where = gr.skip(), "the puzzle in the grid"
        first = True
        for update in self.solve(grid, iterations, strategy):
            board, plot, verdict, details = update
            if first and isinstance(verdict, str) and verdict.startswith(SOLVING):
                verdict = f"{verdict} Solving {where}."
            yield (new_grid if first else gr.skip()), board, plot, verdict, details
            first = False

    def stopped(self, verdict: Any) -> Any:
        """The Stop button: the session's running solve ends at its next iteration, and a verdict that says a solve
        was running becomes a stopped message (else unchanged)."""
        RunGuard.note_stop()
        if isinstance(verdict, str) and verdict.startswith(SOLVING):
            return STOPPED
        return gr.skip()

    def clear(self) -> tuple[str, str, str, str, None, None]:
        return BLANK_BOARD, render_board(BLANK_BOARD, BLANK_BOARD), "", "", None, None

    def _frames(self, puzzle: str, iters: int, strategy: str, per_iteration: bool = True) -> Iterator[_Frame]:
        """One frame per iteration of the solver's own strategy stream (hyperset.strategies, as the CLI runs it):
        the backend's numbers, nothing run twice; with ``per_iteration`` False, one frame per pass. The last frame
        carries the finished board in ``result``."""
        passes: list[dict[str, list[float]]] = []
        stream = self.solver.frames([puzzle], iters, strategy, max_iters=iters, patience=DEFAULT_PATIENCE,
                                    passes=DEFAULT_PASSES, per_iteration=per_iteration)
        last: _Frame | None = None
        search: dict[str, Any] | None = None
        node_board, taken_back = puzzle, 0  # the board the search's last node ran on, cells it took back
        for f in stream:
            if f.kind in ("pass", "node") and per_iteration:  # the end of a pass or node: counters, finished board
                search = f.info.get(0, search)
                if last is not None:
                    last.search = search
                    if 0 in f.done:
                        last.result = f.done[0]
                if last is None and 0 in f.done:  # ended by the exact checks after the last model call
                    last = _Frame(f.step, f.pass_index, f.t, "".join(map(str, f.digits[0].tolist())),
                                  f.confidence[0].tolist(), passes, f.source, f.done[0], search)
                continue
            if last is not None:
                yield last
                last = None
            if f.pass_index >= len(passes):
                passes.extend({} for _ in range(f.pass_index + 1 - len(passes)))
            trace = passes[f.pass_index]
            for k, v in f.energies.items():  # one board: (1,) after an iteration, (t, 1) after a pass
                trace.setdefault(k, []).extend(float(e) for e in v.reshape(-1).tolist())
            digits = "".join(map(str, f.digits[0].tolist()))
            if f.kind == "iteration" and f.t == 1 and strategy == "search":
                held = "".join(d if c > 0.999 else "0" for d, c in zip(digits, f.confidence[0].tolist()))
                taken_back = sum(a != "0" and b == "0" for a, b in zip(node_board, held))
                node_board = held
            last = _Frame(f.step, f.pass_index, f.t, digits, f.confidence[0].tolist(), passes, f.source,
                          f.done.get(0), f.info.get(0, search), taken_back)
        if last is not None:
            yield last

    def solve(self, grid: Any, iterations: Any = None, strategy: Any = DEFAULT_STRATEGY) -> Iterator[tuple[Any, ...]]:
        """Generator: one (board HTML, energy plot, verdict, details) per iteration; the last one has the verdict.

        Bad input yields a single update with the message (and no exception). A solve stops with the board so far
        after ``SOLVE_TIME_LIMIT`` seconds, and without a word when no client has asked for its result. The
        energy plot is redrawn while the share of time spent drawing stays under ``PLOT_SHARE``, and an update is
        sent while the share of time the consumer takes to pass updates on stays under ``SEND_SHARE`` (called
        directly, every iteration is an update)."""
        guard = RunGuard.for_request(SOLVE_TIME_LIMIT)
        t0 = guard.started
        try:
            if self.solver is None:
                raise InputError(f"no Sudoku model is loaded. {self.note}".strip())
            given = read_grid(grid)
            puzzle = given.givens
            iters, strategy = self._settings(iterations, strategy)
            self._check_backend(iters, strategy, per_iteration=True)
        except InputError as err:
            toast(str(err))
            yield gr.skip(), gr.skip(), error_md(str(err)), {"error": str(err)}
            return
        label = {"single": f"{iters}", "auto": f"at most {iters}", "commit": f"{iters} per pass",
                 "search": f"{iters} first, then {self.solver.search_iters} per node",
                 "views": f"{iters} on the puzzle and each view"}.get(strategy, f"{iters}")
        pending: _Frame | None = None
        stopped = ""
        # seconds spent drawing plots and that the consumer (Gradio: postprocessing, sending) held the generator
        # between updates, and the cost of the last plot and the last update (the next ones are predicted by them)
        drawing = sending = 0.0
        plot_cost, send_cost = PLOT_COST_GUESS, 0.0
        for frame in self._frames(puzzle, iters, strategy):
            if pending is not None:
                now = time.perf_counter()
                if pending.step == 1 or sending + send_cost <= SEND_SHARE * (now - t0):
                    plot: Any = gr.skip()
                    if drawing + plot_cost <= PLOT_SHARE * (now - t0):
                        plot = self._plot(pending.passes, iters)
                        plot_cost = time.perf_counter() - now
                        drawing += plot_cost
                    where = f"pass {pending.pass_index + 1}, " if strategy == "commit" else ""
                    if strategy == "search":
                        where = _search_progress(pending, DEFAULT_NODES)
                    verdict = f"{SOLVING} {where}iteration {pending.t} ({label}; {strategy}). Stop cancels."
                    update = self._board(pending, puzzle), plot, verdict, gr.skip()
                    sent = time.perf_counter()
                    yield update
                    send_cost = time.perf_counter() - sent
                    sending += send_cost
            pending = frame
            if guard.abandoned() or guard.stop_requested():
                return
            if guard.over_time():
                stopped = f"the time limit of {SOLVE_TIME_LIMIT} s"
                break
        if pending is None:
            pending = _Frame(0, 0, 0, puzzle, [1.0] * 81, [], self.solver.engine.source)
        yield self._final(puzzle, pending, iters, strategy, t0, stopped, given.warnings)

    def _settings(self, iterations: Any, strategy: Any) -> tuple[int, str]:
        iters = iterations_in(self.default_iters if iterations is None else iterations)
        strategy = str(strategy or DEFAULT_STRATEGY).lower()
        if strategy not in REGISTRY:
            raise InputError(f"strategy must be one of {', '.join(REGISTRY)} (got {strategy!r})")
        return iters, strategy

    def _check_backend(self, iters: int, strategy: str, per_iteration: bool) -> None:
        """Raise :class:`InputError` when the solver's backend cannot run these settings (an ONNX graph unrolled
        for another depth, or without the step graphs that read the board after every iteration)."""
        try:
            self.solver.check_iters("auto" if strategy == "auto" else iters, per_iteration=per_iteration)
        except ValueError as err:
            raise InputError(f"the {self.solver.backend_name} backend cannot run this: {err}") from None

    def api_solve(self, puzzle_text: str, iterations: Any = None,
                  strategy: Any = DEFAULT_STRATEGY) -> tuple[str, str, dict[str, Any]]:
        """The ``/solve`` API: puzzle text (81 characters, a 9-line grid or ``puzzle,solution`` CSV: the first
        puzzle) -> (board: 81 digits, verdict: "solved" or "not solved: <reason>", energies: {"attn": [...],
        "ff": [...] over every iteration, "pass_lengths": [...], "iterations": n, "passes": k, "warnings": [...]}).
        The same solve as ``hyperset-solve`` (no frames drawn); the parser's warnings (givens with no solution)
        are in ``warnings`` and follow a "not solved" verdict. Bad input raises ``gr.Error`` with the reason.

        As the streamed solve, it stops after ``SOLVE_TIME_LIMIT`` seconds, or when no client has asked for its
        result, with the board so far: the verdict then ends with "(stopped at ...)" and ``stopped`` says why."""
        guard = RunGuard.for_request(SOLVE_TIME_LIMIT)
        try:
            if self.solver is None:
                raise InputError(f"no Sudoku model is loaded. {self.note}".strip())
            text = str(puzzle_text or "")
            if len(text) > MAX_TEXT_CHARS:
                raise InputError(f"the text is too long ({len(text):,} characters; at most {MAX_TEXT_CHARS:,})")
            try:
                given = read_puzzles(text, "puzzle_text")[0]
            except PuzzleError as err:
                where = f"line {err.line}: " if err.line is not None else ""
                raise InputError(f"could not read the puzzle ({where}{err.reason})") from None
            except IndexError:
                raise InputError("no puzzle in the text") from None
            puzzle = given.givens
            if puzzle == "0" * 81:
                raise InputError(EMPTY_PUZZLE)
            iters, strategy = self._settings(iterations, strategy)
            try:  # per iteration where the backend can, so that the limits are checked between iterations
                self._check_backend(iters, strategy, per_iteration=True)
                per_iteration = True
            except InputError:
                self._check_backend(iters, strategy, per_iteration=False)
                per_iteration = False
        except InputError as err:
            raise gr.Error(str(err), print_exception=False) from None
        last: _Frame | None = None
        stopped = ""
        for frame in self._frames(puzzle, iters, strategy, per_iteration):
            last = frame
            if guard.abandoned():
                stopped = "no client listening for the result"
                break
            if guard.over_time():
                stopped = f"the time limit of {SOLVE_TIME_LIMIT} s"
                break
        warnings = list(given.warnings)
        if last is not None and last.result is not None and not stopped:
            r = result_of(puzzle, last.result)
            prediction, valid, reason = r.prediction, r.valid, r.reason
            energy, pass_lengths, n_iters, n_passes = r.to_json()["energy"], r.pass_lengths, r.iterations, r.passes
        else:
            passes = last.passes if last is not None else []
            prediction = last.digits if last is not None else puzzle
            check = validate(prediction, puzzle)
            valid, reason = check.valid, check.reason
            energy = {k: [json_number(e) for p in passes for e in p.get(k, [])] for k in (passes[0] if passes else {})}
            pass_lengths = [len(next(iter(p.values()), [])) for p in passes]
            n_iters, n_passes = (last.step if last is not None else 0), len(passes)
        verdict = "solved" if valid else "; ".join([f"not solved: {reason}", *warnings])
        energies: dict[str, Any] = {**energy, "pass_lengths": pass_lengths, "iterations": n_iters,
                                    "passes": n_passes, "warnings": warnings}
        if stopped:
            verdict += f" (stopped at {stopped}, after {n_iters} iteration{'s' if n_iters != 1 else ''})"
            energies["stopped"] = stopped
        return prediction, verdict, energies

    def _board(self, frame: _Frame, puzzle: str, caption: str = "") -> str:
        bad = sorted({c for pair in conflicts(frame.digits) for c in pair})
        return render_board(frame.digits, puzzle, frame.confidence, bad, caption)

    def _plot(self, passes: list[dict[str, list[float]]], iters: int) -> str:
        return energy_svg(passes, self.trained_iters, x_max=iters)

    def _final(self, puzzle: str, frame: _Frame, iters: int, strategy: str, t0: float,
               stopped: str = "", warnings: Sequence[str] = ()) -> tuple[Any, ...]:
        """The last update of a solve: the finished board of the strategy stream, or when ``stopped`` names what
        cut it short, the last frame's board; ``warnings`` are the parser's about the givens (no solution)."""
        solver = self.solver
        passes = frame.passes
        if frame.result is not None and not stopped:
            r = result_of(puzzle, frame.result)
            prediction, confidence, n_iters, n_passes = r.prediction, frame.result.confidence.tolist(), r.iterations, \
                r.passes
        else:
            prediction, confidence, n_iters, n_passes = frame.digits, frame.confidence, frame.step, len(passes) or 1
        if strategy not in ("commit", "search"):
            n_passes = 1
        backend: dict[str, Any] = {"frames": frame.source, "final": frame.source, "name": solver.backend_name,
                                   "device": solver.device_name()}
        verdict = validate(prediction, puzzle)
        blanks = [i for i, ch in enumerate(puzzle) if ch == "0"]
        mean_conf = float(np.mean([confidence[i] for i in blanks])) if blanks else 1.0
        seconds = time.perf_counter() - t0
        how = f"{n_iters} iteration{'s' if n_iters != 1 else ''}"
        if strategy == "commit":
            how += f" ({n_passes} pass{'es' if n_passes != 1 else ''} of {iters})"
        elif strategy == "auto":
            how += f" (auto, at most {iters})"
        searched = result_of(puzzle, frame.result) if frame.result is not None and frame.result.search else None
        if searched is not None and not stopped and strategy == "views":
            how += f" per view ({searched.search['views']} views): {searched.how}"
        elif searched is not None and not stopped:
            how += f" in {n_passes} node{'s' if n_passes != 1 else ''}: {searched.how}"
        depth = f"trained depth {self.trained_iters}"
        tail = (f"{how}, {depth} · {seconds:.2f} s · mean confidence on blanks {mean_conf:.2f} · "
                f"{backend['name']} on {backend['device']}")
        if verdict.valid:
            text = (f"### ✓ Verdict: solved\nA valid board: every row, column and box holds 1-9 once and all "
                    f"{81 - len(blanks)} givens are kept.\n\n{tail}")
        else:
            cells = (f"\n\nConflicting cells: {cells_list(verdict.conflicting_cells)}"
                     if verdict.conflicting_cells else "")
            text = f"### ✗ Verdict: not solved\n{verdict.reason}.{cells}\n\n{tail}"
        if warnings:
            text += "\n\n" + " ".join(f"**Note:** {w}." for w in warnings)
        if stopped:
            text += f"\n\nStopped at {stopped}: this is the board after the last iteration run."
        if frame.source != "torch":
            text += f"\n\nEvery frame above came from {frame.source} ({backend['name']})."
        final_frame = _Frame(frame.step, frame.pass_index, frame.t, prediction, confidence, passes, frame.source)
        caption = "solved" if verdict.valid else f"{len(verdict.conflicting_cells)} conflicting cells"
        energy = {k: [e for p in passes for e in p.get(k, [])] for k in (passes[0] if passes else {})}
        details: dict[str, Any] = {
            "puzzle": puzzle, "prediction": prediction, "valid": verdict.valid, "reason": verdict.reason,
            "conflicting_cells": [cell_name(i) for i in verdict.conflicting_cells], "strategy": strategy,
            "iterations": n_iters, "iterations_per_pass": iters, "passes": n_passes,
            "trained_depth": self.trained_iters, "confidence": round(mean_conf, 4), "seconds": round(seconds, 3),
            "energy": energy, "pass_lengths": [len(next(iter(p.values()), [])) for p in passes] if energy else [],
            "backend": backend, "warnings": list(warnings),
        }
        if stopped:
            details["stopped"] = stopped
        if strategy == "commit":
            details["energy_per_pass"] = passes
        if searched is not None and not stopped:
            details.update(nodes=searched.search["nodes"], backtracks=searched.search["backtracks"],
                           search=dict(searched.search), how=searched.how)
        elif frame.search is not None:
            details.update(nodes=frame.search["nodes"], backtracks=frame.search["backtracks"],
                           search=dict(frame.search))
        return (self._board(final_frame, puzzle, caption), self._plot(passes, iters), text, details)

    def layout(self) -> None:
        if self.solver is None:
            gr.Markdown(f"**No Sudoku model is loaded.** {self.note}")
            return
        start = parse_puzzles(EXAMPLES[1][1])[0].givens
        trained = self.trained_iters
        with gr.Row(equal_height=False):
            with gr.Column(scale=5):
                gr.Markdown("**Puzzle:** click a cell and type 1-9 (Backspace empties it, the arrows and Tab move; "
                            "81 characters pasted into a cell fill the grid), or paste a puzzle in the box below. "
                            "**Solve** takes whichever you edited last: the grid or the box.",
                            elem_id="sudoku-grid-help")
                grid = board_input(start, label="grid", elem_id="sudoku-grid")
                text = gr.Textbox(label="...or paste a puzzle (81 characters with 0 or . for blanks, a 9-line grid, "
                                        "or puzzle,solution CSV)", lines=3, max_lines=12, max_length=MAX_TEXT_CHARS,
                                  placeholder="000014200500070300000590004058400001000000006003080090870060000...",
                                  elem_id="sudoku-text")
                with gr.Row():
                    load_btn = gr.Button("Put text in the grid", size="sm")
                    clear_btn = gr.Button("Clear", size="sm")
                # a number field, not a slider: 1 to MAX_ITERS as the CLI takes, and nothing clamps a typed value
                iters = gr.Number(self.default_iters, elem_id="sudoku-iters",
                                  label=f"Iterations per pass (trained depth {trained})",
                                  info=f"1 to {MAX_ITERS:,}, as hyperset-solve --iters takes. Far past the trained "
                                       f"depth a solve takes long: it stops after {SOLVE_TIME_LIMIT} s with the board "
                                       "so far. 'auto' stops earlier when the board is valid or settled.")
                iters_note = gr.Markdown("", elem_id="sudoku-iters-note")
                strategy = gr.Radio(list(REGISTRY), value=DEFAULT_STRATEGY, label="Strategy",
                                    elem_id="sudoku-strategy",
                                    info=" · ".join(f"{k}: {v.description}" for k, v in REGISTRY.items()))
                for component in (iters, strategy):
                    lenient(component)
                with gr.Row():
                    solve_btn = gr.Button("Solve", variant="primary", elem_id="solve-btn")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
            with gr.Column(scale=6):
                board = gr.HTML(render_board(start, start), elem_id="sudoku-board", label="board_html")
                verdict = gr.Markdown("Load an example or type a puzzle, then press **Solve**.", elem_id="verdict",
                                      label="verdict")
                plot = gr.HTML(label="energy_plot", elem_id="sudoku-energy")
                with gr.Accordion("Details (JSON)", open=False):
                    details = gr.JSON(label="details", show_label=False)
        gr.Examples(examples=[[t] for _, t in EXAMPLES], inputs=[text], outputs=[grid, board, verdict],
                    fn=self.load_text, run_on_click=True, cache_examples=False,
                    example_labels=[name for name, _ in EXAMPLES], label="Example puzzles (easy to hard)")
        load_btn.click(self.load_text, [text], [grid, board, verdict], api_name="load_puzzle",
                       concurrency_limit=None)
        text.submit(self.load_text, [text], [grid, board, verdict], api_visibility="private",
                    concurrency_limit=None)
        grid.input(self.preview, [grid], [board, verdict], api_visibility="private", concurrency_limit=None,
                   show_progress="hidden")
        clear_btn.click(self.clear, None, [grid, board, verdict, text, plot, details], api_visibility="private",
                        concurrency_limit=None)
        # Solve reads the puzzle edited last, the grid's or the paste box's (put in the grid as it starts). The
        # browser decides at the click: the paste box's text now against its text at the last edit of the grid
        # (typing, "Put text in the grid", an example, Clear), so a click right after a paste cannot overtake it
        last = gr.Textbox("grid", visible=False)  # a component, not a State: the click's script sets its value
        for event in (grid.input, load_btn.click, text.submit, clear_btn.click):
            event(None, None, None, js=f"() => {{ window.hypersetTextSeen = {_PASTE_BOX_JS}; }}")
        solve_ev = solve_btn.click(self.solve_edited, [grid, text, last, iters, strategy],
                                   [grid, board, plot, verdict, details], api_visibility="private",
                                   show_progress="minimal", concurrency_id=MODEL_QUEUE,
                                   js=f"(g, t, l, i, s) => {{ const now = {_PASTE_BOX_JS}; "
                                      "const seen = window.hypersetTextSeen ?? ''; "
                                      "return [g, now, now !== seen && now.trim() ? 'text' : 'grid', i, s]; }")
        # the streamed solve for API clients: (grid, iterations, strategy) -> board, plot, verdict, details
        stream_api = gr.Button("solve_stream", visible=False)
        stream_api.click(self.solve, [grid, iters, strategy], [board, plot, verdict, details],
                         api_name="solve_stream", concurrency_id=MODEL_QUEUE)
        stop_btn.click(self.stopped, [verdict], [verdict], cancels=[solve_ev], api_visibility="private",
                       concurrency_limit=None, show_progress="hidden")
        iters.input(iterations_note, [iters], [iters_note], api_visibility="private", concurrency_limit=None,
                    show_progress="hidden")
        self._solve_api()

    def _solve_api(self) -> None:
        """``/solve(puzzle_text, iterations, strategy) -> board, verdict, energies``: plain values for API clients
        (gradio_client), on components that are not shown."""
        with gr.Column(visible=False):
            inputs = [gr.Textbox(label="puzzle_text"), gr.Number(label="iterations", precision=0),
                      gr.Textbox(label="strategy", value=DEFAULT_STRATEGY)]
            outputs = [gr.Textbox(label="board"), gr.Textbox(label="verdict"), gr.JSON(label="energies")]
            api = gr.Button("solve", visible=False)
        # preprocess=False: the client's values reach api_solve as sent, which checks them (Gradio's own
        # conversion of the number raised before it on inf, nan or text, and the client got an empty error)
        api.click(self.api_solve, inputs, outputs, api_name="solve", concurrency_id=MODEL_QUEUE, preprocess=False,
                  api_description="Solve one puzzle (81 characters, a 9-line grid or puzzle,solution CSV): the board "
                                  "(81 digits), the verdict ('solved' or 'not solved: reason') and the energies "
                                  "(E_ATTN and E_FF at every iteration of every pass)")
