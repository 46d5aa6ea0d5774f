"""The Hyper-SET web app: a Sudoku solver that streams every iteration, and masked image reconstruction.

Build it with :func:`build_demo` (one model instance shared by every visitor, requests queued one at a time)
and launch it with ``demo.launch(...)`` or the ``hyperset-app`` command (``hyperset.apps.cli``). The handlers are the
methods of :class:`HyperSETApp`; they are plain Python (a generator for the Sudoku solve) and can be called
without a server, which is how the tests exercise them.

Sudoku tab
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

Reconstruction tab
    A sample image (the default: the cat, the sample closest to the CIFAR-10 images the shipped models were
    trained on; or an upload, resized to the tokenizer's input size) is tokenized; a share of the tokens is
    masked at random (seeded; 40% by default) or where the user paints; the token model fills them in, by
    default in one forward pass with the expected code embedding (the mean code vector under its predicted
    distribution), or by the "Decoding" choice with MaskGIT sampling (the paper's protocol), and the tokenizer
    decodes the result.
    Four columns (upscaled with nearest-neighbour): original, masked input, the tokenizer alone (the image
    encoded and decoded with no mask: the ceiling of any token model) and the model's output, by default with
    the unmasked pixels pasted back from the original; PSNR and SSIM of each. Above them, the token model's
    training budget and measured PSNR as its config.json records them; below, the energies of the token model's
    last forward pass per iteration and what they show (the step sizes' signs of that pass).
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
import numpy as np
import torch
import torch.nn.functional as F
from gradio.exceptions import InvalidPathError
from gradio_client.utils import is_file_obj_with_meta, json_schema_to_python_type, value_is_file
from PIL import Image

from hyperset.config import MAX_ITERS, check_iterations
from hyperset.defaults import DEFAULT_NODES, DEFAULT_PATIENCE
from hyperset.solve import DEFAULT_PASSES, DEFAULT_STRATEGY, json_number, result_of
from hyperset.strategies import BoardResult
from hyperset.strategy_registry import REGISTRY
from hyperset.sudoku.board import PuzzleError, cell_name, conflicts, validate
from hyperset.sudoku.parse import Puzzle, parse_puzzles

from .board_input import board_input
from .energy_plot import energy_svg
from .limits import (
    MAX_IMAGE_PIXELS,
    MAX_UPLOAD_BYTES,
    SESSION_STATES,
    RequestLimits,
    RunGuard,
    limit_pixels,
    pixel_problem,
)

__all__ = [
    "EXAMPLES",
    "HyperSETApp",
    "InputError",
    "build_demo",
    "energy_svg",
    "energy_note",
    "grid_to_puzzle",
    "mim_training_note",
    "puzzle_to_grid",
    "read_grid",
    "render_board",
]

# ----------------------------------------------------------------------------------------------------------
# limits

MAX_TEXT_CHARS = 20_000  # pasted puzzle text (request and image limits: hyperset.apps.limits)
# Sudoku iterations go to MAX_ITERS, as hyperset-solve's (a solve stops at SOLVE_TIME_LIMIT); the token model's
# to 4x its trained depth (at most MAX_ITERS): a reconstruction has no time limit, and 24 decoding steps of
# 10,000 iterations would hold the one model slot for minutes
MAX_ITER_FACTOR = 4
MIM_CLI = "hyperset-eval mim --iters"  # the command that runs the token model at any depth
MAX_DECODE_STEPS = 64
QUEUE_SIZE = 16  # requests waiting in the queue beyond the one running
MODEL_QUEUE = "models"  # solve and reconstruct share one slot: one model computation at a time
SOLVE_TIME_LIMIT = 120  # seconds per solve: then it stops with the board so far
CACHE_CLEANUP = (600, 3600)  # every 10 minutes, delete uploaded and generated files older than an hour
PLOT_SHARE = 0.15  # while streaming, redraw the energy plot while drawing takes at most this share of the time
PLOT_COST_GUESS = 0.002  # seconds a plot is taken to cost before the first one is drawn (then: measured)
SEND_SHARE = 0.25  # ...and send an update while the consumer (Gradio) takes at most this share to pass them on
DISPLAY_SIDE = 256  # images are shown upscaled to about this many pixels
DRAW_THRESHOLD = 0.25  # a token is masked when this share of its pixels is painted
DEFAULT_SAMPLE = "chelsea"  # the cat: of the shipped samples, the closest to CIFAR-10 (a CIFAR class, close-up)
DEFAULT_MASK_RATIO = 0.4  # the share of tokens the random mask hides by default (the training maximum)
DECODING_CHOICES = [("MaskGIT sampling", "maskgit"), ("expected embedding", "expected")]  # (label, value)
# The expected embedding by default: on 1,000 CIFAR-10 test images at 40% masking it is 1.5 dB PSNR and 0.05 SSIM
# closer to the originals than MaskGIT sampling (docs/mim.md), without the speckle of sampled codes; MaskGIT
# sampling, the paper's protocol, is one click away (and hyperset-eval's default).
DEFAULT_DECODING = "expected"

# ----------------------------------------------------------------------------------------------------------
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

_BLANK_CELLS = {"", "0", ".", "_", "*", "-"}


class InputError(ValueError):
    """A problem with the user's input, worded for the page (never a stack trace)."""


# ----------------------------------------------------------------------------------------------------------
# Sudoku: grid <-> puzzle string, board rendering


BLANK_BOARD = "0" * 81  # the puzzle grid's value with every cell empty

_PASTE_BOX_JS = "(document.querySelector('#sudoku-text textarea')?.value ?? '')"  # the paste box's text, in the page


def puzzle_to_grid(puzzle: str) -> list[list[str]]:
    """81-character puzzle (0 = blank) -> 9 rows of 9 strings ("" = blank), a grid value API clients may send."""
    return [["" if ch == "0" else ch for ch in puzzle[r * 9:(r + 1) * 9]] for r in range(9)]


def _cell_text(value: Any, index: int) -> str:
    if value is None:
        return "0"
    if isinstance(value, bool):
        raise InputError(f"cell {cell_name(index)} holds {value!r}: enter one digit 1-9, or leave it empty")
    if isinstance(value, float):
        if math.isnan(value):
            return "0"
        if value.is_integer():
            value = int(value)
    text = str(value).strip()
    if text in _BLANK_CELLS:
        return "0"
    if len(text) == 1 and text in "123456789":
        return text
    shown = text if len(text) <= 12 else text[:12] + "..."
    raise InputError(f"cell {cell_name(index)} holds {shown!r}: enter one digit 1-9, or leave it empty")


def grid_to_puzzle(grid: Any) -> str:
    """The puzzle grid's value (as :func:`read_grid` reads it) -> an 81-character puzzle. Raises
    :class:`InputError` for a wrong shape, a bad cell or contradictory givens."""
    return read_grid(grid).givens


def read_grid(grid: Any) -> Puzzle:
    """The puzzle grid's value -> the parsed puzzle, with the parser's warnings (givens that leave a cell no digit,
    too few givens for a unique solution). The page's grid sends 81 characters (0 = blank); API clients may also
    send 9 rows of 9 cells (strings or numbers) or ``{"data": rows}``."""
    if grid is None:
        raise InputError("enter a puzzle in the grid (or paste one and press 'Put text in the grid')")
    if isinstance(grid, str):
        if len(grid) != 81:
            raise InputError(f"the grid must be 81 cells (0 or . for blanks); got {len(grid):,} characters")
        grid = [list(grid[r * 9:(r + 1) * 9]) for r in range(9)]
    if isinstance(grid, dict):
        grid = grid.get("data")
    if isinstance(grid, np.ndarray):
        grid = grid.tolist()
    if not isinstance(grid, (list, tuple)) or not all(isinstance(row, (list, tuple)) for row in grid):
        raise InputError("the grid must be 9 rows of 9 cells")
    if len(grid) != 9 or any(len(row) != 9 for row in grid):
        widths = sorted({len(row) for row in grid})
        raise InputError(f"the grid must be 9 rows of 9 cells; found {len(grid)} rows of "
                         f"{'/'.join(map(str, widths)) or 0} cells")
    puzzle = "".join(_cell_text(v, r * 9 + c) for r, row in enumerate(grid) for c, v in enumerate(row))
    if puzzle == "0" * 81:
        raise InputError(EMPTY_PUZZLE)
    try:
        return parse_puzzles(puzzle, "grid")[0]
    except PuzzleError as err:  # contradictory givens, with the unit and the cells
        raise InputError(f"the givens contradict each other: {err.reason}") from None


def render_board(board: str, givens: str, confidence: Sequence[float] | None = None,
                 conflicting: Iterable[int] = (), caption: str = "") -> str:
    """A 9x9 board as HTML with inline styles: givens bold on grey, predicted digits on blue whose strength is
    the model's confidence, conflicting cells red. ``board`` and ``givens`` are 81 characters, 0 = blank."""
    bad = set(conflicting)
    rows = []
    for r in range(9):
        cells = []
        for c in range(9):
            i = r * 9 + c
            d, given = board[i], givens[i] != "0"
            border = ("border-top:{};border-left:{};border-right:{};border-bottom:{};".format(
                "3px solid #111827" if r % 3 == 0 else "1px solid #9ca3af",
                "3px solid #111827" if c % 3 == 0 else "1px solid #9ca3af",
                "3px solid #111827" if c == 8 else "1px solid #9ca3af",
                "3px solid #111827" if r == 8 else "1px solid #9ca3af"))
            if d == "0":
                text, bg, fg, weight, title = "", "#ffffff", "#111827", 400, f"{cell_name(i)}: blank"
            elif given:
                text, bg, fg, weight, title = d, "#e5e7eb", "#111827", 800, f"{cell_name(i)}: given {d}"
            else:
                p = float(confidence[i]) if confidence is not None else 1.0
                bg = f"rgba(37,99,235,{0.06 + 0.5 * max(0.0, min(1.0, p)):.3f})"
                text, fg, weight = d, "#1e3a8a", 500
                title = f"{cell_name(i)}: {d} (confidence {p:.2f})"
            if i in bad:
                bg, fg = ("#fca5a5" if given else "#fee2e2"), "#b91c1c"
                title += " - conflict"
            cells.append(f'<td title="{title}" style="{border}width:2.1em;height:2.1em;padding:0;margin:0;'
                         f'text-align:center;vertical-align:middle;background:{bg};color:{fg};'
                         f'font-weight:{weight};">{text}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    legend = ('<span style="font-weight:800">bold</span> = given &nbsp;·&nbsp; '
              '<span style="background:rgba(37,99,235,0.5);padding:0 4px">blue</span> = predicted, darker = more '
              'confident &nbsp;·&nbsp; <span style="color:#b91c1c;background:#fee2e2;padding:0 4px">red</span> = '
              'conflict')
    note = f'<div style="margin-top:4px;font-weight:600">{caption}</div>' if caption else ""
    return ('<div class="hyperset-board" style="display:flex;flex-direction:column;align-items:center;'
            'background:#ffffff;color:#111827;color-scheme:light;padding:10px;border-radius:8px;">'
            '<table style="border-collapse:collapse;font-family:ui-monospace,Menlo,Consolas,monospace;'
            'font-size:22px;line-height:1;margin:0;">' + "".join(rows) + "</table>" + note +
            f'<div style="margin-top:6px;font-size:12px;color:#4b5563">{legend}</div></div>')


# ----------------------------------------------------------------------------------------------------------
# reconstruction: what the token model's config.json records, and what the energy plot shows


def _count(value: Any) -> int | None:
    """A positive whole number from a config value, else None (missing, null, a string, a bool, zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return int(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def mim_training_note(info: dict[str, Any] | None, parameters: int | None = None,
                      trained_iters: int | None = None) -> str:
    """The token model's training budget and measured PSNR, as its checkpoint's config.json records them (``info``:
    the dict ``load_mim`` keeps as ``MIMPipeline.info``), in one Markdown paragraph. Every fact is read at run
    time and is optional: a field the file lacks is left out, never guessed; with none, the note says so."""
    info = info if isinstance(info, dict) else {}
    section = lambda key: info.get(key) if isinstance(info.get(key), dict) else {}  # noqa: E731
    train, data = section("train"), section("data")
    model = [f"{parameters / 1e6:.2f} M parameters" if parameters else "",
             f"trained depth {trained_iters}" if trained_iters else ""]
    facts = []
    steps, planned, batch = _count(info.get("steps")), _count(train.get("steps")), _count(train.get("batch_size"))
    train_images = _count(data.get("train_images"))
    source = str(data.get("source") or "").split(" (")[0]
    if isinstance(info.get("budget"), str) and info["budget"]:
        facts.append(info["budget"])  # the whole budget, as recorded, when it spans several runs
    elif steps:
        budget = f"trained for {steps:,} steps"
        if batch:
            budget += f" of {batch} images ({steps * batch:,} images seen"
            if train_images:
                budget += f": {steps * batch / train_images:.1f} epochs of {train_images:,}"
                budget += f" {source} images)" if source else " training images)"
            else:
                budget += ")"
        if planned and planned > steps:
            budget += f", step {steps:,} of the {planned:,} its recipe plans (an early snapshot)"
        facts.append(budget)
    elif train_images:
        facts.append(f"trained on {train_images:,} {source or 'training'} images")
    if info.get("device"):
        facts.append(f"on {info['device']}")
    metrics = section("metrics")
    evaluation = data.get("eval") if isinstance(data.get("eval"), dict) else {}
    measured = []
    for key in sorted(metrics):
        value = _number(metrics[key])
        name = str(key).split("/")[-1]
        if value is None or not name.startswith("psnr"):
            continue
        pct, _, depth = name.split("@", 1)[1].partition("_iters") if "@" in name else ("", "", "")
        where = (f" with {pct}% of the tokens masked" if pct else "") + (f" at {depth} iterations" if depth else "")
        measured.append(f"PSNR **{value:.2f} dB**{where}")
    ceiling = _number(metrics.get("val/tokenizer_psnr"))
    if measured and ceiling is not None:
        measured.append(f"tokenizer alone {ceiling:.2f} dB")
    text = "**Token model** (from its config.json): " + ", ".join(m for m in model if m)
    text += ("; " if any(model) else "") + (", ".join(facts) if facts else "no training budget recorded") + "."
    if measured:
        n_eval, n_steps = _count(evaluation.get("images")), _count(evaluation.get("steps"))
        decoding = ("expected code embedding" if evaluation.get("decode") == "expected"
                    else f"{n_steps} decoding steps" if n_steps else "")
        on = [f"{n_eval:,} validation images" if n_eval else "validation images", decoding]
        text += (f" Validation metrics it records ({', '.join(o for o in on if o)}): " + ", ".join(measured) +
                 " (the model's raw output, nothing pasted back).")
    else:
        text += " No measured PSNR recorded."
    test = section("evaluation")

    def psnr_by_depth(key: str) -> list[tuple[str, float]]:
        """(iterations, PSNR) of the evaluation's `key` table, its malformed rows left out."""
        table = test.get(key) if isinstance(test.get(key), dict) else {}
        rows = [(k, _number(v.get("psnr"))) for k, v in table.items() if isinstance(v, dict)]
        return [(k, v) for k, v in rows if v is not None]

    scores = psnr_by_depth("by_iterations")
    if scores:
        n_test, pct = _count(test.get("images")), _number(test.get("mask_ratio"))
        where = ", ".join(x for x in (f"{n_test:,} {test.get('split') or 'test'} images" if n_test else "",
                                      f"{100 * pct:.0f}% of the tokens masked" if pct is not None else "") if x)
        text += (f" Measured ({where}; nothing pasted back): PSNR " +
                 " / ".join(f"{v:.2f}" for _, v in scores) + " dB at " + " / ".join(k for k, _ in scores) +
                 " iterations")
        other = psnr_by_depth("expected_by_iterations")
        if other:
            text += (" with MaskGIT sampling, " + " / ".join(f"{v:.2f}" for _, v in other) + " dB at " +
                     " / ".join(k for k, _ in other) + " with the expected embedding")
        text += "."
    return text


def energy_note(energy: dict[str, Sequence[float]], step_sizes: dict[str, Sequence[float]] | None = None,
                decoding: str = "maskgit") -> str:
    """What the reconstruction tab's energy plot shows, with this run's numbers: which energies, which forward
    pass (``decoding``: "maskgit", the pass at the last decoding step; "expected", the one pass), the signs of the
    step sizes and whether E_ATTN and E_ATTN + E_FF fell (from the values, never assumed)."""
    attn, ff = list(energy.get("attn") or []), list(energy.get("ff") or [])
    if not attn:
        return "This model defines no energy."
    n = len(attn)
    which = ("the token model's only forward pass (expected embedding: every masked token at once)"
             if decoding == "expected" else "the token model's forward pass at the last decoding step")
    text = (f"**What the plot shows:** E_ATTN + E_FF, and E_ATTN and E_FF apart, as the paper defines them "
            f"(normalization first, without the learned gains) after each of the {n} iterations of {which}. Each "
            "iteration is an attention step x − α ∇E_ATTN, then a feedforward step x − γ ∇E_FF (eq. 9 and 11); α "
            "and γ are learned per token and channel with no sign constraint.")
    alpha_neg = list((step_sizes or {}).get("alpha_negative") or [])
    gamma_neg = list((step_sizes or {}).get("gamma_negative") or [])
    if alpha_neg:
        text += (f" In this pass {float(np.mean(alpha_neg)):.0%} of the α entries" +
                 (f" and {float(np.mean(gamma_neg)):.0%} of the γ entries" if gamma_neg else "") +
                 " are negative; where α < 0 the attention step climbs E_ATTN instead of descending it.")
    if n > 1:
        went = "rose" if attn[-1] > attn[0] else "fell"
        text += f" Here E_ATTN {went} from {attn[0]:,.0f} (iteration 1) to {attn[-1]:,.0f} (iteration {n})"
        if ff:
            total = np.asarray(attn[:len(ff)], dtype=np.float64) + np.asarray(ff[:len(attn)], dtype=np.float64)
            ups = int((np.diff(total) > 1e-5 * np.abs(total[:-1]).clip(min=1.0)).sum())
            text += (", and E_ATTN + E_FF never rose" if not ups else
                     f", and E_ATTN + E_FF rose at {ups} of {len(total) - 1} iterations")
        text += "."
    signed = list((step_sizes or {}).get("attn_step") or [])
    unsigned = list((step_sizes or {}).get("attn_step_abs") or [])
    if signed and unsigned:
        up, up_abs = float(np.sum(signed)), float(np.sum(unsigned))
        text += (f" The attention steps of this pass changed E_ATTN by {up:+,.0f} in all; each of them with |α| in "
                 f"place of α (the same magnitudes) would have changed it by {up_abs:+,.0f} in all")
        text += (": the rise comes from the negative α, a property of the trained step sizes." if up > 0 > up_abs
                 else ".")
    return text


# ----------------------------------------------------------------------------------------------------------
# messages


def _toast(message: str) -> None:
    """gr.Warning inside a request (a pop-up in the page); nothing when a handler is called directly."""
    from gradio.context import LocalContext

    if LocalContext.blocks.get(None) is not None and LocalContext.event_id.get(None) is not None:
        gr.Warning(message)


def _error_md(message: str) -> str:
    return f"**Input problem:** {message}"


SOLVING = "**Solving...**"  # how the verdict starts while a streamed solve runs
STOPPED = "**Stopped.** The board shows the last iteration drawn; press **Solve** to run again."


EMPTY_PUZZLE = "the puzzle is empty: enter some givens or load an example"


def read_puzzles(text: str, source: str) -> list[Any]:
    """The puzzles of pasted text, at least the first: a mistake after the first puzzle ends the list there
    instead of refusing the text (the app uses the first; the rest are counted for a note)."""
    try:
        return parse_puzzles(text, source)
    except PuzzleError as err:
        if err.line is None or err.line <= 1:
            raise
        try:  # the puzzles before the line at fault, if those lines hold any whole puzzle
            before = parse_puzzles("\n".join(text.splitlines()[: err.line - 1]), source)
        except PuzzleError:
            raise err from None
        return before


def _lenient(component: Any) -> Any:
    """Hand the event's function the client's raw value when Gradio's own conversion fails on it (an infinite or
    text iteration count, a text mask ratio): the function's checks then say what is wrong, where Gradio's
    exception reached the client as an empty error."""
    convert = component.preprocess

    def preprocess(payload: Any) -> Any:
        try:
            return convert(payload)
        except (AttributeError, TypeError, ValueError, KeyError, OverflowError):
            return payload

    component.preprocess = preprocess
    return component


def _default_missing_inputs(demo: gr.Blocks, required: dict[str, int]) -> None:
    """Let an API call to an endpoint of ``required`` (api name -> inputs it needs) leave out its optional
    trailing inputs: they reach the function as None, which it reads as its default (Gradio refused the call
    with an empty error)."""
    validate = getattr(demo, "validate_inputs", None)
    if validate is None:  # a Gradio 6 release without this hook: the arguments stay required
        return

    def validate_inputs(block_fn: Any, inputs: list[Any]) -> None:
        need = required.get(getattr(block_fn, "api_name", None) or "")
        if need is not None and need <= len(inputs) < len(block_fn.inputs):
            inputs.extend([None] * (len(block_fn.inputs) - len(inputs)))
        validate(block_fn, inputs)

    demo.validate_inputs = validate_inputs


def _file_paths(value: Any) -> list[str]:
    """The paths of the Gradio file references (``{"path": ..., "meta": {"_type": "gradio.FileData"}}``) in a
    client's value, at any depth (walked with a stack: a deeply nested value cannot exhaust the recursion)."""
    paths, stack = [], [value]
    while stack:
        item = stack.pop()
        if is_file_obj_with_meta(item):
            paths.append(item["path"])
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return paths


_PLAIN_KINDS = {"str": "text", "float": "a number", "int": "a whole number", "bool": "true or false"}


def _named_inputs(block_fn: Any, inputs: Sequence[Any]) -> list[tuple[str, Any, Any]]:
    """(name, component, value) of each input of an event: the name is the function's parameter, as the API
    info names it."""
    try:
        params = list(inspect.signature(block_fn.fn).parameters)
    except (TypeError, ValueError):  # no function, or one without a signature
        params = []
    return [(params[i] if i < len(params) else f"input {i + 1}", block, value)
            for i, (block, value) in enumerate(zip(block_fn.inputs, inputs))]


def _input_problem(named: list[tuple[str, Any, Any]], err: Exception) -> str:
    """One line on why Gradio could not take an event's inputs (``err``, raised before the function ran)."""
    for name, block, value in named:  # a value of the wrong shape for an image input's data model
        model = getattr(block, "data_model", None)
        if model is not None and value is not None:
            try:
                model.model_validate(value, context={"validate_meta": True})
            except ValueError as bad:  # pydantic's ValidationError
                errors = bad.errors() if hasattr(bad, "errors") else []
                why = errors[0]["msg"] if errors else str(bad).splitlines()[0]
                return _clipped(f"{name}: not a valid {type(block).__name__} value ({why})")
    files = [(name, path) for name, _, value in named for path in _file_paths(value)]
    if isinstance(err, InvalidPathError) and files:
        name, path = next(((n, p) for n, p in files if os.path.abspath(p) in str(err)), files[0])
        return (f"{name}: the file {_clipped(path, 80)} was not uploaded to this server (upload it to "
                "/gradio_api/upload first, then send the path it answers)")
    first = next(iter(str(err).strip().splitlines()), "") or type(err).__name__
    return _clipped(f"{files[0][0]}: {first}" if files else first)


def _input_errors_as_messages(demo: gr.Blocks) -> None:
    """Make inputs Gradio cannot take one-line errors that name the input: a file reference where text or a
    number is expected, a file the server was not sent, a value of the wrong shape for an image input, too few
    inputs. Gradio raised these before any handler ran, and the client got ``{"error": null}``."""
    preprocess = demo.preprocess_data

    async def preprocess_data(block_fn: Any, inputs: list[Any], state: Any, explicit_call: bool = False) -> Any:
        named = _named_inputs(block_fn, inputs)
        for name, block, value in named:
            if not value_is_file(block.api_info()) and _file_paths(value):
                kind = json_schema_to_python_type(block.api_info())
                kind = f"one of {kind[8:-1]}" if kind.startswith("Literal[") else _PLAIN_KINDS.get(kind, kind)
                raise gr.Error(f"{name}: a file reference, where {kind} is expected", print_exception=False)
        try:
            return await preprocess(block_fn, inputs, state, explicit_call)
        except gr.Error:
            raise
        except Exception as err:  # every failure here is the client's value: no traceback in the log
            raise gr.Error(_input_problem(named, err), print_exception=False) from None

    demo.preprocess_data = preprocess_data


def _int_in(value: Any, low: int, high: int, name: str) -> int:
    """A whole number from ``low`` to ``high`` (4.0 is 4; 1.5 is refused, never rounded)."""
    try:
        if isinstance(value, bool):
            raise TypeError(name)
        f = float(value)
        if not f.is_integer():  # also inf and nan
            raise ValueError(name)
        v = int(f)
    except (TypeError, ValueError):  # "abc", 1.5, inf, nan
        raise InputError(f"{name} must be a whole number from {low} to {high}") from None
    if not low <= v <= high:
        raise InputError(f"{name} must be from {low} to {high} (got {v})")
    return v


def _clipped(text: str, limit: int = 200) -> str:
    """``text`` cut in the middle to at most about ``limit`` characters (a message quoting a client's value)."""
    return text if len(text) <= limit else f"{text[:limit // 2]} ... {text[-limit // 3:]}"


def _iterations(value: Any, limit: int = MAX_ITERS, cli: str = "hyperset-solve --iters") -> int:
    """An iteration count from the page or an API client, checked as the CLI checks one
    (``hyperset.config.check_iterations``: a whole number from 1 to ``MAX_ITERS``; an integral float such as JSON's
    16.0 counts, 1.5 does not), and at most ``limit`` where a control runs fewer (the message names ``cli``).
    Raises :class:`InputError`."""
    try:
        n = check_iterations(int(value) if isinstance(value, float) and value.is_integer() else value, "iterations")
    except ValueError as err:
        raise InputError(_clipped(str(err))) from None
    if n > limit:
        raise InputError(f"iterations = {n}: the app runs at most {limit:,} here ({cli} takes up to {MAX_ITERS:,})")
    return n


def iterations_note(value: Any, limit: int = MAX_ITERS, cli: str = "hyperset-solve --iters") -> str:
    """The note beside an iterations control as a value is typed: why it will not run, or "" when it will (or the
    field is empty: the default runs)."""
    if value is None or value == "":
        return ""
    try:
        _iterations(value, limit, cli)
    except InputError as err:
        return f"**Out of range:** {err}."
    return ""


def _float_in(value: Any, low: float, high: float, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number from {low} to {high}") from None
    if not (low <= v <= high):  # also rejects NaN
        raise InputError(f"{name} must be from {low} to {high} (got {v})")
    return v


def _cells_list(cells: Iterable[int], limit: int = 24) -> str:
    names = [cell_name(i) for i in cells]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


# ----------------------------------------------------------------------------------------------------------
# images


def _to_display(images: torch.Tensor) -> np.ndarray:
    """(1, 3, s, s) in [0, 1] -> (S, S, 3) uint8, upscaled by an integer factor with nearest-neighbour."""
    img = images[0].clamp(0, 1)
    scale = max(1, DISPLAY_SIDE // img.shape[-1])
    if scale > 1:
        img = img.repeat_interleave(scale, 1).repeat_interleave(scale, 2)
    return (img.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)


def _rgb(array: np.ndarray) -> np.ndarray:
    """Any image array (H, W), (H, W, 3) or (H, W, 4) -> (H, W, 3) float in [0, 255]; transparency on white."""
    a = np.asarray(array)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise InputError(f"unexpected image shape {tuple(a.shape)}")
    a = a.astype(np.float32)
    if a.shape[2] == 4:
        alpha = a[..., 3:] / 255.0
        a = a[..., :3] * alpha + 255.0 * (1 - alpha)
    return a


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


class HyperSETApp:
    """The handlers of the app around one shared Sudoku solver and one shared MIM pipeline (either may be None:
    its tab then explains what is missing)."""

    def __init__(self, solver: Any = None, mim: Any = None, sudoku_note: str = "", mim_note: str = "") -> None:
        self.solver = solver
        self.mim = mim
        self.sudoku_note = sudoku_note
        self.mim_note = mim_note
        self.samples: dict[str, torch.Tensor] = {}
        if mim is not None:
            from hyperset.vision.reconstruct import sample_images

            try:
                self.samples = sample_images(mim.image_size)
            except FileNotFoundError:
                self.samples = {}

    # ---- Sudoku -------------------------------------------------------------------------------------------

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
            _toast(str(err))
            return gr.skip(), gr.skip(), _error_md(str(err))
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
            return gr.skip(), _error_md(str(err))
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
                raise InputError(f"no Sudoku model is loaded. {self.sudoku_note}".strip())
            given = read_grid(grid)
            puzzle = given.givens
            iters, strategy = self._settings(iterations, strategy)
            self._check_backend(iters, strategy, per_iteration=True)
        except InputError as err:
            _toast(str(err))
            yield gr.skip(), gr.skip(), _error_md(str(err)), {"error": str(err)}
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
                        plot = self._sudoku_plot(pending.passes, iters)
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
        iters = _iterations(self.default_iters if iterations is None else iterations)
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
                raise InputError(f"no Sudoku model is loaded. {self.sudoku_note}".strip())
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

    def _sudoku_plot(self, passes: list[dict[str, list[float]]], iters: int) -> str:
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
            cells = (f"\n\nConflicting cells: {_cells_list(verdict.conflicting_cells)}"
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
        return (self._board(final_frame, puzzle, caption), self._sudoku_plot(passes, iters), text, details)

    # ---- reconstruction -----------------------------------------------------------------------------------

    @property
    def mim_trained_iters(self) -> int:
        return int(self.mim.trained_iters) if self.mim is not None else 12

    @property
    def mim_max_iters(self) -> int:
        """The most token-model iterations: 4x its trained depth, at most ``MAX_ITERS``."""
        return min(MAX_ITER_FACTOR * self.mim_trained_iters, MAX_ITERS)

    def editor_value(self, image: torch.Tensor) -> dict[str, Any]:
        """(3, s, s) in [0, 1] -> an ImageEditor value with the upscaled image as background and no paint."""
        arr = _to_display(image[None])
        return {"background": arr, "layers": [], "composite": arr}

    def sample_editor(self, name: str | None) -> Any:
        if not name or name not in self.samples:
            return gr.skip()
        return self.editor_value(self.samples[name])

    def upload_image(self, path: str | None) -> tuple[Any, str]:
        """An uploaded file -> the editor (resized to the tokenizer's input size), or a message."""
        if not path:
            return gr.skip(), ""
        try:
            if self.mim is None:
                raise InputError("no reconstruction model is loaded")
            size = os.path.getsize(path)
            if size > MAX_UPLOAD_BYTES:
                raise InputError(f"the file is too large ({size / 2**20:.1f} MB; at most "
                                 f"{MAX_UPLOAD_BYTES // 2**20} MB)")
            try:
                with Image.open(path) as img:
                    w, h = img.size
                    if problem := pixel_problem(w, h):
                        raise InputError(problem)
                    rgb = img.convert("RGB")
            except InputError:
                raise
            except Exception:
                raise InputError("could not read the file as an image (PNG, JPEG, WebP, ...)") from None
        except InputError as err:
            _toast(str(err))
            return gr.skip(), _error_md(str(err))
        from hyperset.vision.reconstruct import prepare_images

        s = self.mim.image_size
        image = prepare_images(rgb, s)[0]
        return self.editor_value(image), (f"Uploaded {w}x{h} image: centre square, resized to {s}x{s} (the "
                                          "tokenizer's input size).")

    def _editor_image(self, editor: Any) -> tuple[torch.Tensor, np.ndarray]:
        """Editor value -> (image (1, 3, s, s) in [0, 1], background as (H, W, 3) float 0-255)."""
        from hyperset.vision.reconstruct import prepare_images

        if not isinstance(editor, dict):
            raise InputError("choose a sample image or upload one")
        background = editor.get("background")
        if background is None:
            background = editor.get("composite")
        if background is None:
            raise InputError("choose a sample image or upload one")
        if isinstance(background, Image.Image):
            background = np.asarray(background)
        background = np.asarray(background)
        if background.ndim < 2 or background.shape[0] * background.shape[1] > MAX_IMAGE_PIXELS:
            raise InputError("the image is too large")
        rgb = _rgb(background)
        s = self.mim.image_size
        x = torch.from_numpy(rgb / 255.0).permute(2, 0, 1)[None].float()
        h, w = rgb.shape[:2]
        if h == w and h % s == 0:
            x = F.avg_pool2d(x, h // s) if h != s else x  # exact for the nearest-neighbour previews shown here
        else:
            x = prepare_images(x, s)
        return x.clamp(0, 1), rgb

    def _drawn_mask(self, editor: dict[str, Any], background: np.ndarray) -> torch.Tensor:
        """The painted pixels (alpha of the editor's layers, or where the composite differs from the background)
        -> token mask (grid, grid)."""
        from hyperset.vision.reconstruct import pixel_to_token_mask

        h, w = background.shape[:2]
        painted = np.zeros((h, w), dtype=bool)
        for layer in editor.get("layers") or []:
            if layer is None:
                continue
            a = np.asarray(layer)
            if a.ndim != 3 or a.shape[2] != 4:
                continue
            alpha = a[..., 3] > 0
            if alpha.shape != (h, w):
                alpha = np.asarray(Image.fromarray(alpha.astype(np.uint8) * 255).resize((w, h), Image.NEAREST)) > 0
            painted |= alpha
        composite = editor.get("composite")
        if not painted.any() and composite is not None:
            comp = _rgb(np.asarray(composite))
            if comp.shape[:2] == (h, w):
                painted = np.abs(comp - background).max(-1) > 8
        if not painted.any():
            raise InputError("paint over the part of the image to hide (or choose the random mask)")
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        m = torch.from_numpy(painted[top:top + side, left:left + side])
        g, s = self.mim.grid, self.mim.image_size
        if side % g:
            m = F.interpolate(m[None, None].float(), size=(s, s), mode="nearest")[0, 0] > 0.5
        return pixel_to_token_mask(m, g, threshold=DRAW_THRESHOLD)

    def reconstruct(self, editor: Any, mask_mode: Any = "random", ratio: Any = DEFAULT_MASK_RATIO, seed: Any = 0,
                    iterations: Any = None, steps: Any = 24, temperature: Any = 1.0,
                    paste_back: Any = True, decoding: Any = DEFAULT_DECODING) -> tuple[Any, ...]:
        """-> (original, masked input, tokenizer only, model output) images, metrics text, energy plot, what the
        plot shows, details. The tokenizer-only image is the original encoded and decoded with no mask (the
        ceiling of any token model); with ``paste_back`` the model output's unmasked pixels are the original's.
        ``decoding``: "maskgit" (MaskGIT sampling over ``steps`` steps) or "expected" (one forward pass, the
        expected code embedding at the masked tokens; ``temperature`` is its softmax's, ``steps`` is unused)."""
        from hyperset.vision.maskgit import mask_by_ratio
        from hyperset.vision.metrics import psnr, ssim
        from hyperset.vision.reconstruct import paste_unmasked

        t0 = time.perf_counter()
        try:
            if self.mim is None:
                raise InputError(f"no reconstruction model is loaded. {self.mim_note}".strip())
            trained = self.mim_trained_iters
            iters = _iterations(trained if iterations is None else iterations, self.mim_max_iters, MIM_CLI)
            n_steps = _int_in(steps, 1, MAX_DECODE_STEPS, "decoding steps")
            temp = _float_in(temperature, 0.0, 5.0, "temperature")
            decode = DEFAULT_DECODING if decoding is None else str(decoding).lower()
            if decode not in {value for _, value in DECODING_CHOICES}:
                raise InputError(f"decoding must be 'maskgit' or 'expected' (got {decoding!r})")
            seed_v = _int_in(seed if seed is not None else 0, 0, 2**31 - 1, "seed")
            image, background = self._editor_image(editor)
            g = self.mim.grid
            if str(mask_mode).lower() == "drawn":
                mask = self._drawn_mask(editor, background)
            elif str(mask_mode).lower() == "random":
                r = _float_in(ratio, 0.0, 1.0, "mask ratio")
                mask = mask_by_ratio((1, g, g), r, generator=torch.Generator().manual_seed(seed_v))[0]
            else:
                raise InputError(f"mask must be 'random' or 'drawn' (got {mask_mode!r})")
            if not mask.any():
                raise InputError("the mask covers no token: raise the ratio or paint a larger area")
        except InputError as err:
            _toast(str(err))
            return (*(gr.skip(),) * 4, _error_md(str(err)), gr.skip(), gr.skip(), {"error": str(err)})
        paste = paste_back is None or bool(paste_back)
        result = self.mim.reconstruct(image, mask[None], iters=iters, steps=n_steps, temperature=temp,
                                      generator=torch.Generator().manual_seed(seed_v), decode=decode)
        raw = result.images.float().clamp(0, 1)
        shown = paste_unmasked(raw, image, result.mask) if paste else raw
        tokenizer_only = result.tokenizer_images.float().clamp(0, 1)
        s = self.mim.image_size
        hidden = F.interpolate(result.mask[:, None].float(), size=(s, s), mode="nearest").bool().expand_as(image)

        def masked_psnr(x: torch.Tensor) -> float:
            mse = float((x - image).pow(2)[hidden].mean())
            return min(100.0, 10 * math.log10(1.0 / mse)) if mse > 0 else 100.0

        p_shown, q_shown = float(psnr(shown, image, max_db=100.0)[0]), float(ssim(shown, image)[0])
        p_raw = float(psnr(raw, image, max_db=100.0)[0])
        p_tok, q_tok = float(psnr(tokenizer_only, image, max_db=100.0)[0]), float(ssim(tokenizer_only, image)[0])
        p_hidden, p_tok_hidden = masked_psnr(raw), masked_psnr(tokenizer_only)
        n_masked, n_tokens = int(mask.sum()), mask.numel()
        seconds = time.perf_counter() - t0
        how = "unmasked pixels pasted back from the original" if paste else "the raw output, nothing pasted back"
        decoded = (f"expected code embedding (one forward pass), softmax temperature {temp:g}" if decode == "expected"
                   else f"MaskGIT sampling, {n_steps} decoding steps, temperature {temp:g}")
        metrics = (f"**Model: PSNR {p_shown:.2f} dB · SSIM {q_shown:.3f}** ({how}; raw output {p_raw:.2f} dB) · "
                   f"**tokenizer only: PSNR {p_tok:.2f} dB · SSIM {q_tok:.3f}** (no mask: the ceiling of the raw "
                   f"output) · on the masked pixels alone: model {p_hidden:.2f} dB, tokenizer only "
                   f"{p_tok_hidden:.2f} dB · {n_masked}/{n_tokens} tokens masked · {iters} iterations (trained "
                   f"{trained}), {decoded} · {s}x{s} px · {seconds:.2f} s")
        details = {"psnr": round(p_shown, 4), "ssim": round(q_shown, 5), "paste_back": paste,
                   "raw_psnr": round(p_raw, 4), "masked_pixels_psnr": round(p_hidden, 4),
                   "tokenizer_psnr": round(p_tok, 4), "tokenizer_ssim": round(q_tok, 5),
                   "tokenizer_masked_pixels_psnr": round(p_tok_hidden, 4), "masked_tokens": n_masked,
                   "tokens": n_tokens, "iterations": iters, "trained_depth": trained, "decoding": result.decode,
                   "steps": result.steps, "temperature": temp, "seed": seed_v, "image_size": s,
                   "energy": result.energy, "step_sizes": result.step_sizes, "seconds": round(seconds, 3)}
        plot = energy_svg([result.energy], trained, x_max=iters,
                             title="Token model's last forward pass: energies after each iteration")
        return (_to_display(image), _to_display(result.masked_images.float()), _to_display(tokenizer_only),
                _to_display(shown), metrics, plot, energy_note(result.energy, result.step_sizes, result.decode),
                details)

    # ---- layout -------------------------------------------------------------------------------------------

    def header(self) -> str:
        parts = ["# Hyper-SET\nTransformers designed as **hyperspherical energy minimization** (ICLR 2026): every "
                 "iteration of the shared layer is a gradient step on an attention energy E_ATTN, then one on a "
                 "feed-forward energy E_FF, with learned step sizes. The step sizes have no sign constraint: "
                 "where one is negative, its step climbs the energy, so a trained model's energies need not fall "
                 "at every iteration. Run it for more iterations than it was trained with and watch the energies "
                 "and the answer."]
        if self.solver is not None:
            n = sum(p.numel() for p in self.solver.model.parameters())
            parts.append(f"Sudoku model: {n / 1e3:.0f}k parameters, trained depth {self.trained_iters}, "
                         f"{self.solver.backend_name} on {self.solver.device_name()}.")
        if self.mim is not None:
            n = sum(p.numel() for p in self.mim.model.parameters())
            parts.append(f"Reconstruction: {self.mim.image_size}x{self.mim.image_size} images, "
                         f"{self.mim.grid}x{self.mim.grid} tokens, token model {n / 1e6:.2f} M parameters, "
                         f"trained depth {self.mim_trained_iters}.")
        return "\n\n".join(parts[:1]) + ("\n\n" + " ".join(parts[1:]) if len(parts) > 1 else "")

    def build(self) -> gr.Blocks:
        with gr.Blocks(title="Hyper-SET", fill_height=False, delete_cache=CACHE_CLEANUP) as demo:
            gr.Markdown(self.header())
            with gr.Tabs():
                with gr.Tab("Sudoku", id="sudoku", elem_id="tab-sudoku"):
                    self._sudoku_tab()
                with gr.Tab("Reconstruction", id="reconstruction", elem_id="tab-reconstruction"):
                    self._reconstruction_tab()
        demo.queue(default_concurrency_limit=1, max_size=QUEUE_SIZE)
        _default_missing_inputs(demo, {"solve": 0})  # /solve(puzzle_text): every argument may be left out
        _input_errors_as_messages(demo)
        return demo

    def _sudoku_tab(self) -> None:
        if self.solver is None:
            gr.Markdown(f"**No Sudoku model is loaded.** {self.sudoku_note}")
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
                    _lenient(component)
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

    def _reconstruction_tab(self) -> None:
        if self.mim is None:
            gr.Markdown(f"**No reconstruction model is loaded.** {self.mim_note}")
            return
        trained, s = self.mim_trained_iters, self.mim.image_size
        names = list(self.samples)
        default = DEFAULT_SAMPLE if DEFAULT_SAMPLE in self.samples else (names[0] if names else None)
        first = self.editor_value(self.samples[default]) if default else None
        n_params = sum(p.numel() for p in self.mim.model.parameters())
        gr.Markdown(mim_training_note(getattr(self.mim, "info", None), n_params, trained), elem_id="mim-training")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                sample = gr.Dropdown(names, value=default, elem_id="mim-sample",
                                     label=f"Sample image ({s}x{s}; the default, a cat, is the closest to the CIFAR-10 "
                                           "images the models were trained on)")
                upload = gr.Image(type="filepath", sources=["upload", "clipboard"], height=120,
                                  label=f"...or upload an image (centre square resized to {s}x{s})",
                                  elem_id="mim-upload")
                editor = gr.ImageEditor(value=first, type="numpy", image_mode="RGBA", sources=[], layers=False,
                                        transforms=[], canvas_size=(DISPLAY_SIDE, DISPLAY_SIDE), fixed_canvas=True,
                                        brush=gr.Brush(colors=["#ff00ff"], default_size=24, color_mode="fixed"),
                                        format="png", label="Image (paint here for the 'drawn' mask)",
                                        elem_id="mim-editor")
                for image_input in (upload, editor):
                    limit_pixels(image_input)  # a picture too large is refused from its header, before decoding
                mask_mode = gr.Radio(["random", "drawn"], value="random", label="Mask", elem_id="mim-mask-mode",
                                     info="random: a share of the tokens (seeded) · drawn: the tokens you paint")
                ratio = gr.Slider(0.05, 1.0, value=DEFAULT_MASK_RATIO, step=0.05,
                                  label="Masked share of tokens (random mask)")
                seed = gr.Number(value=0, precision=0, minimum=0, label="Seed (mask and sampling)")
                paste_back = gr.Checkbox(value=True, elem_id="mim-paste-back",
                                         label="Paste the unmasked pixels back into the model's output (then only "
                                               "the masked tokens' pixels are the model's)")
                iters = gr.Slider(1, self.mim_max_iters, value=trained, step=1, elem_id="mim-iters",
                                  label=f"Token-model iterations (trained depth {trained})",
                                  info=f"the app runs 1 to {self.mim_max_iters:,} ({MIM_CLI} takes up to "
                                       f"{MAX_ITERS:,}); a value typed past them moves back into range")
                iters_note = gr.Markdown("", elem_id="mim-iters-note")
                decoding = gr.Radio(DECODING_CHOICES, value=DEFAULT_DECODING, label="Decoding",
                                    elem_id="mim-decoding",
                                    info="MaskGIT sampling: the paper's, one code drawn per token over the decoding "
                                         "steps · expected embedding: one forward pass, each masked token decoded "
                                         "from the mean code vector under the model's distribution (higher PSNR, "
                                         "less sharp)")
                steps = gr.Slider(1, MAX_DECODE_STEPS, value=24, step=1, label="Decoding steps (MaskGIT; paper: 24)")
                temperature = gr.Slider(0.0, 2.0, value=1.0, step=0.1,
                                        label="Temperature (of the sampling, or of the expected embedding's softmax; "
                                              "0 = argmax)")
                recon_btn = gr.Button("Reconstruct", variant="primary", elem_id="reconstruct-btn")
            with gr.Column(scale=7):
                with gr.Row():
                    original = gr.Image(label="Original", format="png", interactive=False, elem_id="mim-original")
                    masked = gr.Image(label="Masked input", format="png", interactive=False, elem_id="mim-masked")
                    tokenizer = gr.Image(label="Tokenizer only", format="png", interactive=False,
                                         elem_id="mim-tokenizer")
                    recon = gr.Image(label="Model output", format="png", interactive=False, elem_id="mim-recon")
                gr.Markdown("Tokenizer only: the original encoded and decoded with no mask, the best any token model "
                            "can do. Model output: the masked tokens filled in by the token model (MaskGIT sampling, "
                            "or the expected code embedding: see Decoding), decoded by the same tokenizer.",
                            elem_id="mim-columns")
                metrics = gr.Markdown("Choose an image and a mask, then press **Reconstruct**.",
                                      elem_id="mim-metrics", label="metrics")
                plot = gr.HTML(label="energy_plot", elem_id="mim-energy")
                note = gr.Markdown("", elem_id="mim-energy-note", label="energy_note")
                with gr.Accordion("Details (JSON)", open=False):
                    details = gr.JSON(label="details", show_label=False)
        sample.change(self.sample_editor, [sample], [editor], api_name="sample", concurrency_limit=None)
        upload.upload(self.upload_image, [upload], [editor, metrics], api_name="upload", concurrency_limit=None)
        for component in (mask_mode, ratio, seed, iters, steps, temperature, paste_back, decoding):
            _lenient(component)
        recon_btn.click(self.reconstruct,
                        [editor, mask_mode, ratio, seed, iters, steps, temperature, paste_back, decoding],
                        [original, masked, tokenizer, recon, metrics, plot, note, details], api_name="reconstruct",
                        concurrency_id=MODEL_QUEUE)
        iters.input(lambda value: iterations_note(value, self.mim_max_iters, MIM_CLI), [iters], [iters_note],
                    api_visibility="private", concurrency_limit=None, show_progress="hidden")


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
