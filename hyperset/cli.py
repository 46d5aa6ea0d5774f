"""`hyperset-solve`: solve Sudoku puzzles with a Hyper-SET model, offline, on the model shipped in the package."""

from __future__ import annotations

import io
import json
import math
import os
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click

from .cli_options import (
    FiniteFloat,
    OneLineCommand,
    check_output_file,
    error_line,
    one_line,
    output_failed,
    package_version,
)
from .config import check_iterations
from .defaults import CPU_BATCH_SIZE, DEFAULT_NODES, DEFAULT_PASSES, DEFAULT_STRATEGY, DESCENT_FROM, GPU_BATCH_SIZE
from .extras import require
from .stops import Stops as _Stops
from .strategy_registry import strategy_help, strategy_names
from .sudoku.board import PuzzleError, cell_name, format_grid
from .sudoku.parse import Puzzle, iter_file

# exit codes (docs/cli.md); 130 is the shell's code for a process stopped by Ctrl-C (128 + SIGINT)
EXIT_SOLVED, EXIT_UNSOLVED, EXIT_BAD_INPUT = 0, 1, 2
MAX_PUZZLES = 1_000_000


def _iters_option(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise click.BadParameter(f"--iters: expected a positive integer or 'auto', got {value!r}") from None
    try:
        return check_iterations(n, "--iters")
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def _check_options(backend: str, onnx_model: str | None, plot: str | None, checkpoint: str | None = None,
                   descent: bool | None = None) -> None:
    """Usage errors found before any work is done."""
    for name, value in (("--checkpoint", checkpoint), ("--onnx-model", onnx_model), ("--plot", plot)):
        if value is not None and not value.strip():
            raise click.UsageError(f"{name}: an empty path (leave the option out for its default)")
    if onnx_model is not None and backend != "onnx":
        raise click.UsageError("--onnx-model needs --backend onnx")
    if onnx_model is not None and descent is not None:
        raise click.UsageError(f"--{'' if descent else 'no-'}descent: the graph --onnx-model names runs the step "
                               "control it was exported with; without --onnx-model the graph is exported with it")
    if backend == "onnx":
        require("onnx", "onnx", "onnxruntime", what="--backend onnx")
    if plot is not None:
        if plot_format(plot) not in PLOT_FORMATS:
            raise click.UsageError(f"--plot {plot!r}: the file's suffix picks the format, one of "
                                   f"{', '.join('.' + f for f in PLOT_FORMATS)}")
        require("app", "matplotlib", what="--plot")
        check_output_file("--plot", plot)


PLOT_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg")


def plot_format(path: str) -> str:
    return Path(path).suffix.lower().lstrip(".")


def side_by_side(puzzle: str, prediction: str, color: bool) -> str:
    """The puzzle (givens only) next to the answer, so givens and filled cells are told apart without colour."""
    left = format_grid(puzzle).splitlines()
    right = format_grid(prediction, givens=puzzle, color=color).splitlines()
    arrow = ["   "] * len(left)
    arrow[len(left) // 2] = "-> "
    return "\n".join(f"  {a}   {m}{b}" for a, m, b in zip(left, arrow, right))


SPARK_WIDTH = 30


def _sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """One mark per iteration, or, past `width` iterations, one per run of consecutive iterations (their mean; '?'
    where any is not finite), so that a long trace of many passes stays one line on a terminal."""
    if not values:
        return ""
    if len(values) > width:
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [_mean(values[a:b]) for a, b in zip(edges, edges[1:])]
    ticks = TICKS if _encodable(TICKS) else ASCII_TICKS
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "?" * len(values)
    lo, hi = min(finite), max(finite)
    span = (hi - lo) or 1.0
    return "".join(ticks[min(int((v - lo) / span * (len(ticks) - 1) + 0.5), len(ticks) - 1)]
                   if math.isfinite(v) else "?" for v in values)


TICKS, ASCII_TICKS = "▁▂▃▄▅▆▇█", "_.-:=+*#"


def _encodable(text: str) -> bool:
    """Whether standard output's encoding holds `text` (not cp1252, Latin-1 or ASCII for block characters)."""
    try:
        text.encode(getattr(sys.stdout, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _mean(run: list[float]) -> float:
    return sum(run) / len(run) if all(math.isfinite(v) for v in run) else math.nan


def _energy_summary(energy: dict[str, list[float]], trained: int) -> str:
    """A line per energy and one for their sum (first -> last value, the value at the trained depth, a sparkline),
    short enough for an 80-column terminal."""
    if not energy:
        return "energy: not defined for this layer"
    parts = []
    both = [energy.get("attn"), energy.get("ff")]
    # their sum, the energy the iterations descend: E_ATTN alone may rise while the total falls
    total = [a + f for a, f in zip(*both)] if all(both) else None
    for v, label in ((energy.get("attn"), "E_ATTN"), (energy.get("ff"), "E_FF"), (total, "total")):
        if v:
            at = v[min(trained, len(v)) - 1]
            parts.append(f"{label:<6} {v[0]:.1f} -> {v[-1]:.1f} (at t={min(trained, len(v))}: {at:.1f}) "
                         f"{_sparkline(v)}")
    return "\n  ".join(parts)


def pass_starts(results: list[Any]) -> list[int]:
    """The iterations (1-based, in the energy lists) where a pass after the first begins, over all results."""
    starts: set[int] = set()
    for r in results:
        at = 0
        for n in (getattr(r, "pass_lengths", None) or [r.iterations])[:-1]:
            at += n
            starts.add(at + 1)
    return sorted(starts)


def plot_energy(path: str, results: list[Any], trained: int) -> None:
    """E_ATTN and E_FF per iteration (every pass, one after the other) for the boards and their mean, with the
    trained depth and the start of every pass marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, (name, label) in zip(axes, (("attn", "E_ATTN"), ("ff", "E_FF"))):
        curves = [r.energy[name] for r in results if r.energy.get(name)]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        mean = np.mean([c[:length] for c in curves], axis=0)
        t = np.arange(1, length + 1)
        for c in curves[:50]:
            ax.plot(np.arange(1, len(c) + 1), c, color="tab:blue", alpha=0.15, lw=0.8)
        ax.plot(t, mean, color="tab:blue", lw=2, label="mean over boards")
        ax.axvline(trained, color="tab:red", ls="--", lw=1, label=f"trained depth ({trained})")
        starts = pass_starts(results)
        for k, start in enumerate(starts):
            ax.axvline(start - 0.5, color="0.45", ls=":", lw=0.9, label="pass starts" if k == 0 else None)
            if len(starts) <= 24:
                ax.text(start - 0.5, 1.0, f" p{k + 2}", transform=ax.get_xaxis_transform(), fontsize=6,
                        color="0.35", va="top", ha="left")
        ax.set_xlabel("iteration t (all passes, in order)" if starts else "iteration t")
        ax.set_title(label)
        ax.legend(fontsize=8)
    fig.tight_layout()
    image = io.BytesIO()
    try:
        fig.savefig(image, format=plot_format(path), dpi=120)
    finally:
        plt.close(fig)
    from .checkpoint import atomic_write_bytes

    atomic_write_bytes(path, image.getvalue())


def _has_energies(model: Any) -> bool:
    """Whether the model's layers define energies (Hyper-SET, Energy Transformer; not Transformer or CRATE)."""
    import torch

    x = torch.zeros(1, 1, model.cfg.dim, device=next(model.parameters()).device)
    with torch.no_grad():
        return any(bool(layer.energy(x, 1)) for layer in model.core.layers)


def _read_puzzles(files: tuple[str, ...]) -> Iterator[Puzzle]:
    """The puzzles of every file, one after another, each as it is read; every file is opened first (a missing
    one is an error before any work), and the input is refused past MAX_PUZZLES puzzles where it goes past."""
    streams = [iter_file(f) for f in files]
    n = 0
    for stream in streams:
        for p in stream:
            n += 1
            if n > MAX_PUZZLES:
                raise PuzzleError(p.source, p.line, f"more than {MAX_PUZZLES:,} puzzles; split the input")
            yield p


@click.command(cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_version(), "--version", "-V", prog_name="hyperset-solve",
                      message="%(prog)s %(version)s")
@click.argument("files", nargs=-1, required=True, type=str)
@click.option("--iters", default=None,
              help="iterations per pass (may exceed the trained depth) or 'auto' [default: the model's measured "
                   "choice, its config.json solve_iterations, else the trained depth]")
@click.option("--strategy", type=click.Choice(strategy_names()), default=DEFAULT_STRATEGY, show_default=True,
              help=strategy_help())
@click.option("--passes", type=click.IntRange(1, 81), default=DEFAULT_PASSES, show_default=True,
              help="most passes of the commit strategy")
@click.option("--nodes", type=click.IntRange(1, 10_000_000), default=DEFAULT_NODES, show_default=True,
              help="search: most nodes (model calls) per board")
@click.option("--seconds", type=FiniteFloat(0, None, min_open=True), default=None,
              help="search: most seconds per batch of boards [default: no limit]")
@click.option("--node-iters", type=click.IntRange(1, 10_000), default=None,
              help="search: iterations per node after the first pass [default: the model's search_iterations, "
                   "else its trained depth]")
@click.option("--prior", type=click.Choice(["model", "uniform"]), default="model", show_default=True,
              help="search: order the guesses by the model's beliefs, or uniformly (no model call: the reference "
                   "for what the model is worth)")
@click.option("--first-look/--checks-first", default=True, show_default=True,
              help="search: the model's first pass sees the puzzle as given (its own answer where it can), or the "
                   "exact checks run first and the model sees what they leave")
@click.option("--order", "search_order", type=click.Choice(["depth", "best"]), default="depth", show_default=True,
              help="search: take back the latest guess first (depth), or expand the most probable node (best)")
@click.option("--views", type=click.IntRange(0, 63), default=None,
              help="symmetry transforms run beside the puzzle, in one batch: the views strategy's (default 8), or "
                   "the search's first look (default none)")
@click.option("--descent/--no-descent", default=None,
              help="keep E_ATTN + E_FF from rising: from the second iteration on, an update that would raise a "
                   "board's energy is halved (up to 4 times) or not taken; about one energy evaluation more per "
                   "iteration (torch; an exported graph tries every halving) [default: the checkpoint's setting]")
@click.option("--checkpoint", type=click.Path(), default=None, help="checkpoint folder [default: the shipped model]")
@click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda")
@click.option("--backend", type=click.Choice(["torch", "onnx"]), default="torch", show_default=True,
              help="run the model in PyTorch, or as an ONNX graph in ONNX Runtime (the 'onnx' extra)")
@click.option("--onnx-model", type=click.Path(), default=None, help="ONNX Loop graph for --backend onnx")
@click.option("--batch-size", type=click.IntRange(1, 65536), default=None,
              help=f"boards per forward pass [default: {CPU_BATCH_SIZE} on a CPU, {GPU_BATCH_SIZE} on a GPU]")
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="CPU threads [default: the cores that other work leaves idle]")
@click.option("--json", "as_json", is_flag=True,
              help="print one JSON object at the end; each result's energy holds one list per energy covering every "
                   "reported iteration, the passes one after the other (pass_lengths: the iterations of each)")
@click.option("--quiet", "-q", is_flag=True, help="print the summary only (with --json: only the summary object)")
@click.option("--trace", is_flag=True, help="print E_ATTN and E_FF at every iteration (of every pass)")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="write the energy curve, every pass marked (.png, .svg, .pdf or .jpg: the suffix picks the format)")
@click.option("--color/--no-color", default=None, help="colour givens and filled cells [default: on a terminal]")
def solve_main(files: tuple[str, ...], iters: str | None, strategy: str, passes: int, nodes: int,
               seconds: float | None, node_iters: int | None, prior: str, first_look: bool, search_order: str,
               views: int | None, checkpoint: str | None, descent: bool | None,
               device: str, backend: str, onnx_model: str | None, batch_size: int | None, threads: int | None,
               as_json: bool, quiet: bool, trace: bool, plot: str | None, color: bool | None) -> None:
    """Solve the Sudoku puzzles in FILES ('-' reads standard input).

    Formats: 81-character lines ('0', '.', '_', '*' or 'x' for blanks), 9x9 grids (separators allowed), many puzzles per
    file, and the RRN CSV 'puzzle,solution'. Results are printed as their batch finishes, with a progress bar on a
    terminal for several puzzles. Puzzles are read, checked and solved a batch at a time, so a file of a million
    starts at once and memory stays flat; a bad line stops the run where it is, after the boards before it. Exit
    code 0 when every board is solved validly, 1 when some are not, 2 on bad input (or output that cannot be
    written), 130 when interrupted (Ctrl-C; the boards solved so far are printed, and the summary says how many;
    143 for SIGTERM, 129 for SIGHUP, likewise).
    """
    source = click.get_current_context().get_parameter_source("strategy")
    if iters == "auto" and strategy != "auto" and source == click.core.ParameterSource.COMMANDLINE:
        _fail(f"--iters auto runs the auto strategy (each board stops when it settles); with --strategy {strategy} "
              "give a number of iterations, or use --strategy auto")
    if sys.stdout is None:  # `>&-`: the results would go nowhere, and exit 0 would say they went somewhere
        _fail("standard output is closed: nowhere to print the results")
    stops = _Stops.current()
    try:
        search = {"nodes": nodes, "seconds": seconds, "node_iters": node_iters, "prior": prior,
                  "order": search_order, "first_look": first_look, "views": views}
        _solve(files, iters, strategy, passes, search, checkpoint, descent, device, backend, onnx_model, batch_size,
               threads, as_json, quiet, trace, plot, color, stops)
    except KeyboardInterrupt:  # while loading: nothing solved; with --json still one whole document
        sys.exit(stops.interrupted_before_solving(as_json, quiet))
    finally:
        stops.restore()


def _solve(files: tuple[str, ...], iters: str | None, strategy: str, passes: int, search: dict[str, Any],
           checkpoint: str | None, descent: bool | None,
           device: str, backend: str, onnx_model: str | None, batch_size: int | None, threads: int | None,
           as_json: bool, quiet: bool, trace: bool, plot: str | None, color: bool | None, stops: _Stops) -> NoReturn:
    import itertools

    from .checkpoint import CheckpointError
    from .device import check_device_name, set_cpu_threads
    from .solve import Solver

    stops.imported()  # a signal that came while torch and the solver imported stops here

    try:
        n_iters = _iters_option(iters) if iters is not None else None
        _check_options(backend, onnx_model, plot, checkpoint, descent)
        reader = _read_puzzles(files)
        first = next(reader)  # the input's first puzzle before the model: a file that is not a puzzle file is
        puzzles = itertools.chain([first], reader)  # told at once
        n_threads = set_cpu_threads(threads)
        # another backend runs the model itself (and checks --device itself): torch only exports it, on the CPU,
        # so a CPU build of torch beside ONNX Runtime's CUDA provider can still solve on the GPU
        if backend != "torch" and check_device_name(device)[0] == "mps":
            raise ValueError(f"--device {device}: --backend {backend} runs on auto, cpu or cuda")
        solver = Solver.load(checkpoint, device if backend == "torch" else "cpu")
        if descent is not None:
            solver.model.set_step_control(*(("backtrack", DESCENT_FROM) if descent else ("none",)))
        if plot is not None and not _has_energies(solver.model):
            raise ValueError(f"--plot: this model's layer ({solver.model.cfg.layer}) defines no energy; nothing "
                             "to plot (--trace and the JSON report none either)")
        if backend != "torch":
            import warnings

            with warnings.catch_warnings(record=True) as said:  # each a line of its own, not Python's two
                warnings.simplefilter("always")
                solver = solver.with_backend(make_backend(backend, solver, onnx_model, device, n_threads))
            for w in said:
                click.echo(one_line(f"warning: {w.message}"), err=True)
            if getattr(solver.engine, "note", None):
                click.echo(f"note: {solver.engine.note}", err=True)
        solver.check_iters(n_iters)
    except click.UsageError as e:
        _fail(e.message)
    except (PuzzleError, CheckpointError, RuntimeError, ValueError, LookupError) as e:
        _fail(str(e))
    use_color = default_color(sys.stdout) if color is None else color
    out = _Output(solver, as_json, quiet, trace, use_color, stops)
    if strategy == "views":
        search = {"views": search["views"]}
    elif strategy != "search":
        search = {}
    run = _stream(solver, puzzles, out, keep=plot is not None, iters=n_iters, strategy=strategy, passes=passes,
                  batch_size=batch_size, **search)
    summary = run.tally.summary(run.seconds, solver)
    if run.interrupted:
        summary.extra.update(interrupted=True, requested=run.read, **stops.by())
    if run.error is not None:
        summary.extra["error"] = run.error
    plotted, plot_error = False, None
    if plot and not any(r.energy for r in run.results):
        click.echo(f"--plot: no board ran an iteration (givens without a solution): {plot} not written", err=True)
    elif plot and run.error is None:  # written before the summary, which then says when it could not be
        try:
            plot_energy(plot, run.results, solver.trained_iters)
            plotted = True
        except OSError as e:
            plot_error = summary.extra["error"] = f"--plot: cannot write {plot}: {e.strerror or e}"
    try:
        out.end(summary, "auto" if n_iters == "auto" else strategy, run)
    except OSError as e:
        _output_failed(e)
    if run.error is not None or plot_error is not None:
        _fail(run.error or plot_error)
    if plotted and not as_json and not quiet:  # --quiet: the summary only
        click.echo(f"energy plot written to {plot}")
    if run.interrupted:
        sys.exit(stops.exit_code())
    sys.exit(EXIT_SOLVED if summary.valid == summary.puzzles else EXIT_UNSOLVED)


def default_color(stream: Any) -> bool:
    """Colour by default on a terminal, unless NO_COLOR is set (no-color.org) or the terminal is dumb."""
    return (bool(stream is not None and stream.isatty()) and not os.environ.get("NO_COLOR")
            and os.environ.get("TERM") != "dumb")


def make_backend(name: str, solver: Any, path: str | None, device: str, threads: int | None) -> Any:
    """The backend called `name` for the solver's model, from the ``hyperset.backends`` plugins (entry points)."""
    from .backends import backend_factory

    return backend_factory(name)(solver.model, info=solver.info, path=path, device=device, threads=threads)


class _Output:
    """Where the boards go as they come: the text report of each (warnings first, on standard error), or the
    JSON document, written a result at a time (begun with the first result, so an input refused before any board
    prints nothing to standard output), each piece whole even when a signal comes."""

    def __init__(self, solver: Any, as_json: bool, quiet: bool, trace: bool, color: bool, stops: _Stops) -> None:
        self.solver, self.as_json, self.quiet, self.trace, self.color, self.stops = (
            solver, as_json, quiet, trace, color, stops)
        self.started = False

    @property
    def live(self) -> bool:
        """Each board printed as it comes (a terminal's progress bar then goes with it)."""
        return not self.as_json and not self.quiet

    def read(self, p: Puzzle) -> None:
        if self.live:
            for w in p.warnings:
                click.echo(one_line(f"warning: {p.source}:{p.line}: {w}"), err=True)

    def board(self, p: Puzzle, r: Any) -> None:
        with self.stops.hold():
            if self.as_json and not self.quiet:
                text = json.dumps(_result_json(p, r), allow_nan=False)
                click.echo((", " if self.started else '{"results": [') + text, nl=False)
                self.started = True
            elif self.live:
                _print_result(p, r, self.solver.trained_iters, self.color, self.trace)

    def end(self, summary: Any, strategy: str, run: Any) -> None:
        """The end of the output: the JSON document's summary (the results so far when stopped), or the summary
        line."""
        with self.stops.hold():
            if self.as_json:
                tail = json.dumps(summary.to_json(), allow_nan=False)
                if self.quiet:
                    click.echo(f'{{"summary": {tail}}}')
                else:
                    click.echo(("" if self.started else '{"results": [') + f'], "summary": {tail}}}')
                return
            _print_summary(summary, strategy)
            if summary.extra.get("interrupted"):
                click.echo(f"interrupted after {_count(run.tally.puzzles, 'puzzle')} ({run.read} read)")
            elif run.error is not None:
                click.echo(f"stopped after {_count(run.tally.puzzles, 'puzzle')} by bad input (below)")


class _Run:
    """What `_stream` did: the counts (a Tally), the results when kept, the puzzles read, how it ended."""

    def __init__(self) -> None:
        from .solve import Tally

        self.tally = Tally()
        self.results: list[Any] = []
        self.read = 0
        self.seconds = 0.0
        self.interrupted = False
        self.error: str | None = None


def _stream(solver: Any, puzzles: Iterator[Puzzle], out: _Output, keep: bool = False, **kw: Any) -> _Run:
    """Solve as the puzzles are read, handing each board to `out` as its batch finishes, with a progress bar on a
    terminal (each board printed). A Ctrl-C stops and keeps the results so far; bad input further on stops there
    (`error`). Results are counted, not held, unless `keep`."""
    import time

    from tqdm.auto import tqdm

    run = _Run()
    pending: deque[Puzzle] = deque()

    def feed() -> Iterator[Puzzle]:
        for p in puzzles:
            run.read += 1
            pending.append(p)
            out.read(p)
            yield p

    bar = tqdm(unit="board", file=sys.stderr, leave=False, dynamic_ncols=True, delay=0.5,
               disable=not out.live or sys.stderr is None or not sys.stderr.isatty())
    t0 = time.perf_counter()
    try:
        for r in solver.solve_iter(feed(), **kw):
            p = pending.popleft()
            run.tally.add(r)
            if keep:
                run.results.append(r)
            bar.clear()
            try:
                out.board(p, r)
            except OSError as e:
                bar.close()
                _output_failed(e)
            bar.update(1)
    except KeyboardInterrupt:
        run.interrupted = True
    except PuzzleError as e:
        run.error = str(e)
    except getattr(solver.engine, "errors", ()) as e:  # a backend's file that fails only when opened (a step graph)
        bar.close()
        _fail(str(e))
    finally:
        bar.close()
        run.seconds = time.perf_counter() - t0
    if run.error is not None and not run.tally.puzzles:  # refused before any board: nothing printed
        _fail(run.error)
    return run


def _fail(message: str) -> NoReturn:
    click.echo(error_line("hyperset-solve", message), err=True)
    sys.exit(EXIT_BAD_INPUT)


def _output_failed(error: OSError) -> NoReturn:
    output_failed("hyperset-solve", error, "the results")


def _result_json(p: Puzzle, r: Any) -> dict[str, Any]:
    """A result with where its puzzle came from and the parser's warnings (JSON mode prints no other text)."""
    return {**r.to_json(), "source": p.source, "line": p.line, "warnings": list(p.warnings)}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _print_result(p: Puzzle, r: Any, trained: int, color: bool, trace: bool) -> None:
    verdict = "solved" if r.valid else "INVALID"
    if r.correct is not None:
        verdict += " (matches the known solution)" if r.correct else " (differs from the known solution)"
    click.echo(f"{p.source}, puzzle {p.index + 1} (line {p.line}, {_count(p.n_givens, 'given')}):")
    click.echo(side_by_side(r.puzzle, r.prediction, color), color=color)  # --color: also into a pipe or file
    cells = r.conflicting_cells
    more = f" (+{len(cells) - 10} more)" if len(cells) > 10 else ""
    passes = f" in {r.passes} passes" if r.passes > 1 else ""
    click.echo(f"  {verdict}: {_count(r.iterations, 'iteration')}{passes} (trained depth {trained}), "
               f"confidence {r.confidence:.3f}")
    if r.how is not None:
        click.echo(f"  search: {r.how}")
    if not r.valid:
        if cells:
            click.echo(f"  conflicts at {', '.join(cell_name(c) for c in cells[:10])}{more}")
        click.echo(f"  reason: {r.reason}")
    click.echo("  energy: no pass ran" if r.iterations == 0 else f"  {_energy_summary(r.energy, trained)}")
    if trace and r.energy:  # a layer without energies (Transformer, CRATE): the summary line says so, no table
        attn, ff = r.energy.get("attn", []), r.energy.get("ff", [])
        lengths = getattr(r, "pass_lengths", None) or [len(attn)]
        click.echo("  pass    t       E_ATTN         E_FF")
        step = 0
        for k, n in enumerate(lengths, start=1):
            for t in range(1, n + 1):
                if step >= len(attn):
                    break
                a, f = attn[step], ff[step] if step < len(ff) else float("nan")
                step += 1
                mark = "  <- trained depth" if t == trained else ""
                click.echo(f"  {k:4d}  {t:3d}  {a:11.3f}  {f:11.3f}{mark}")
    click.echo("")


def _print_summary(summary: Any, strategy: str) -> None:
    line = f"{summary.valid}/{summary.puzzles} boards valid"
    if summary.board_accuracy is not None:
        line += f"; board accuracy {summary.board_accuracy:.1%}, cell accuracy {summary.cell_accuracy:.1%}"
    click.echo(f"{line} — strategy {strategy}, {summary.seconds:.2f} s on {summary.device} ({summary.backend})")
    control = summary.extra.get("step_control")
    if control:
        click.echo(f"step control: {control['control']} from iteration {control['from_iteration']} (no update from "
                   "it on raised a board's E_ATTN + E_FF)")
    found = summary.extra.get("search")
    if found:
        parts = [f"{found['model_alone']} by the model alone", f"{found['with_backtracks']} with backtracks"]
        parts += [f"{found[k]} {what}" for k, what in (("by_a_view", "by a symmetry view"),
                                                        ("checks_alone", "by the exact checks alone"),
                                                        ("no_solution", "without a solution"),
                                                        ("budget", "out of budget")) if found[k]]
        click.echo(f"search: {', '.join(parts)}; {_count(found['nodes'], 'node')}, "
                   f"{_count(found['backtracks'], 'backtrack')}")


if __name__ == "__main__":
    solve_main()
