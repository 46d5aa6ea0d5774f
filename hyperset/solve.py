"""The Sudoku solver: boards in, boards out, with the energy trace; every answer goes through the exact checker.

Strategies (written once, as streams of frames, in :mod:`hyperset.strategies`):
    single  one pass of N iterations, argmax per blank cell.
    auto    iterate until the prediction settles (a valid board, or unchanged for `patience` iterations),
            at most `max_iters`; each board reports the iteration where it settled.
    commit  MaskGIT-style decoding for Sudoku: run N iterations, commit the most confident predictions that
            do not clash with the board as new givens, run again, until the board is full.

A result's energy covers every iteration it reports (for commit, its passes one after the other;
`pass_lengths` gives the iterations of each).
"""

from __future__ import annotations

import itertools
import math
import numbers
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .backends import CallableBackend, SolverBackend, TorchBackend
from .checkpoint import check_finite, solve_iterations, trained_iterations
from .config import check_iterations, whole_number
from .contracts import check_contract
from .defaults import (
    CPU_BATCH_SIZE,
    DEFAULT_NODES,
    DEFAULT_PASSES,
    DEFAULT_PATIENCE,
    DEFAULT_STRATEGY,
    FIRST_STREAM_BATCH,
    GPU_BATCH_SIZE,
)
from .device import pick_device
from .models import HyperSETModel, load_checkpoint
from .pretrained import PRETRAINED, weights_root
from .strategies import BoardResult, SolveFrame, commit_cells, single
from .strategy_registry import REGISTRY, STRATEGIES, stream
from .sudoku.board import PuzzleError, validate
from .sudoku.parse import Puzzle, parse_puzzles

__all__ = ["DEFAULT_PASSES", "DEFAULT_STRATEGY", "STRATEGIES", "SolveResult", "SolveSummary", "Solver",
           "commit_cells", "json_number", "result_of", "summarize", "timed_solve"]


def bundled_checkpoint() -> Path:
    """The small Sudoku model shipped inside the package."""
    return weights_root() / PRETRAINED["sudoku"]


@dataclass
class SolveResult:
    puzzle: str
    prediction: str
    valid: bool
    reason: str
    conflicting_cells: list[int]
    iterations: int
    energy: dict[str, list[float]]  # per iteration reported, every pass (one list covering all `iterations`)
    confidence: float  # mean probability of the predicted digits over blank cells
    solution: str | None = None
    correct: bool | None = None
    passes: int = 1
    pass_lengths: list[int] = field(default_factory=list)  # iterations of each pass, in the order of `energy`
    warnings: list[str] = field(default_factory=list)  # the parser's (no solution, several, too few givens)
    search: dict[str, Any] | None = None  # the search strategy's counters: status, nodes, backtracks, ...

    @property
    def how(self) -> str | None:
        """How the search reached its answer, for people: "model alone", "model + N backtracks", ..."""
        if self.search is None:
            return None
        s = self.search
        views = s.get("views")
        if views and s["status"] != "no solution" and s.get("view") is not None and s["nodes"] == views:
            if s["view"] == 0:
                return f"model alone (the puzzle as given, first of {views} views)"
            return f"view {s['view']} of {views} (a symmetry transform of the puzzle; picked by the exact check)"
        if views and s["status"] == "budget" and s["nodes"] == views and s["backtracks"] == 0:
            return f"no view of {views} valid"
        if s["status"] == "no solution":
            return f"no solution: every candidate ruled out ({s['nodes']} nodes, {s['backtracks']} backtracks)"
        if s["status"] == "budget":
            return f"not solved within budget ({s['nodes']} nodes, {s['backtracks']} backtracks)"
        if s["nodes"] == 0:
            return "exact checks alone (no model call)"
        if s["backtracks"] == 0:
            return "model alone" if s["decisions"] == 0 else f"model alone ({s['decisions']} decisions)"
        return f"model + {s['backtracks']} backtrack{'' if s['backtracks'] == 1 else 's'}"

    def to_json(self) -> dict[str, Any]:
        out = {"puzzle": self.puzzle, "prediction": self.prediction, "valid": self.valid, "reason": self.reason,
               "conflicting_cells": self.conflicting_cells, "iterations": self.iterations, "passes": self.passes,
               "pass_lengths": self.pass_lengths or [self.iterations],
               "confidence": json_number(round(self.confidence, 6)),
               "energy": {k: [json_number(e) for e in v] for k, v in self.energy.items()},
               "warnings": list(self.warnings)}
        if self.solution is not None:
            out["solution"], out["correct"] = self.solution, self.correct
        if self.search is not None:
            out["nodes"], out["backtracks"] = self.search["nodes"], self.search["backtracks"]
            out["search"], out["how"] = dict(self.search), self.how
        return out


def json_number(x: float) -> float | None:
    """JSON has no NaN or infinity: a diverged value becomes null."""
    return x if math.isfinite(x) else None


def _board_tensor(puzzles: Sequence[str], device: torch.device | str) -> torch.Tensor:
    return torch.tensor([[int(c) for c in p] for p in puzzles], dtype=torch.long, device=device)


def checked_puzzles(puzzles: Sequence[str]) -> list[str]:
    """The puzzles as 81 digits (0 = blank), read as a puzzle file's lines are (``.``, ``_``, ``*`` or ``x`` for
    blanks, spaces and ``|`` ignored): a puzzle that is not 81 cells, or whose givens clash, is a PuzzleError (a
    ValueError) that names it, ``puzzles[i]``."""
    return [p.givens for p in parsed_puzzles(puzzles)]


def parsed_puzzles(puzzles: Sequence[str | Puzzle], search: bool = True, first: int = 0) -> list[Puzzle]:
    """`checked_puzzles` as :class:`~hyperset.sudoku.parse.Puzzle` objects: with the parser's warnings, and the
    solution of a ``puzzle,solution`` line. Puzzles already parsed are taken as they are; ``search``: see
    ``parse_puzzles``; errors name ``puzzles[first + i]``."""
    if isinstance(puzzles, str):
        raise TypeError("puzzles must be a list of puzzle strings, got one string (wrap it: [puzzle])")
    out = []
    for i, p in enumerate(puzzles, start=first):
        if isinstance(p, Puzzle):
            out.append(p)
            continue
        if not isinstance(p, str):
            raise TypeError(f"puzzles[{i}] must be a string of 81 cells, got {type(p).__name__}")
        parsed = parse_puzzles(p, f"puzzles[{i}]", search)
        if len(parsed) != 1:
            raise PuzzleError(f"puzzles[{i}]", None, f"holds {len(parsed)} puzzles, not one")
        out.append(parsed[0])
    return out


def unsolvable_result(puzzle: Puzzle) -> SolveResult:
    """The answer for givens the parser showed to have no solution: no pass runs, the board is the givens."""
    return SolveResult(puzzle.givens, puzzle.givens, False, str(puzzle.no_solution), [], 0, {}, 0.0, passes=0,
                       pass_lengths=[], warnings=list(puzzle.warnings))


class Solver:
    """Runs a Sudoku model on batches of boards through a :class:`~hyperset.backends.SolverBackend` (the model
    itself by default; ONNX Runtime with the backend of ``hyperset.exports.solver_backend``), with the strategies of
    :mod:`hyperset.strategies`."""

    def __init__(self, model: HyperSETModel, device: torch.device, info: dict[str, Any] | None = None,
                 backend: SolverBackend | Any = None):
        if model.cfg.task != "sudoku":
            raise ValueError(f"this is a {model.cfg.task!r} model; the solver needs a 'sudoku' model")
        self.model, self.device, self.info = model.eval(), device, info or {}
        self.torch_backend = TorchBackend(self.model, device)
        self.backend = backend  # None: the model itself (torch); else a SolverBackend (or a plain callable)

    @property
    def backend(self) -> SolverBackend | None:
        """The backend given to the solver, None for the torch model itself."""
        return self._backend

    @backend.setter
    def backend(self, value: Any) -> None:
        if value is not None and not isinstance(value, SolverBackend):
            value = CallableBackend(value)  # (boards, iters) -> (logits, energies): whole passes only
        self._backend = value

    @property
    def engine(self) -> SolverBackend:
        """The backend that runs: the given one, else the torch model."""
        return self._backend if self._backend is not None else self.torch_backend

    def with_backend(self, backend: SolverBackend | None) -> Solver:
        """A solver on the same model and checkpoint information that runs through `backend`."""
        return type(self)(self.model, self.device, self.info, backend)

    @classmethod
    def load(cls, checkpoint: str | Path | None = None, device: str = "auto") -> Solver:
        dev = pick_device(device)
        path = checkpoint or bundled_checkpoint()
        model, info = load_checkpoint(path, task="sudoku", map_location=dev)
        check_contract(model.cfg, path)
        check_finite(model, path, "the finite weights of a trained sudoku model")
        return cls(model, dev, info)

    @property
    def trained_iters(self) -> int:
        return trained_iterations(self.model.cfg, self.info)

    @property
    def default_iters(self) -> int:
        """Iterations per pass when the caller does not say: the model's measured choice (its config.json
        `solve_iterations`), else the trained depth; where the backend cannot run that (an ONNX graph unrolled at
        another count), the trained depth or the count the graph was unrolled at, the first it can run."""
        wanted = solve_iterations(self.model.cfg, self.info)
        for n in dict.fromkeys((wanted, self.trained_iters, getattr(self.engine, "unrolled", None))):
            if n is None:
                continue
            try:
                self.engine.check(n, False)
            except ValueError:
                continue
            return n
        return wanted

    @property
    def backend_name(self) -> str:
        return self.engine.name

    def device_name(self) -> str:
        return self.engine.device_name

    @property
    def default_batch_size(self) -> int:
        """Boards per forward pass when the caller does not say: small on a CPU, large on a GPU."""
        return CPU_BATCH_SIZE if self.engine.device == "cpu" else GPU_BATCH_SIZE

    @torch.no_grad()
    def iterate(self, boards: torch.Tensor, iters: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor,
                                                                           dict[str, torch.Tensor]]]:
        """Yield (t, digits (B, 81), probabilities of those digits (B, 81), energies {name: (B,)}) per iteration
        (one pass of the `single` strategy, frame by frame)."""
        for f in single(self.engine, boards.to(self.device), iters, per_iteration=True):
            if f.kind == "iteration":
                yield f.t, f.digits, f.confidence, f.energies

    def check_iters(self, iters: int | str | None, per_iteration: bool = False) -> None:
        """Raise ValueError if the backend cannot run `iters` (as passed to `solve`; "auto" reads every
        iteration), before any work is done."""
        n = self.default_iters if iters is None else self.trained_iters if iters == "auto" else int(iters)
        self.engine.check(n, per_iteration or iters == "auto")

    def _settings(self, iters: int | str | None, strategy: str, passes: int) -> tuple[str, int]:
        if strategy not in REGISTRY:
            raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(REGISTRY)}")
        if iters == "auto":
            strategy, iters = "auto", None
        if iters is not None and (isinstance(iters, bool) or not isinstance(iters, numbers.Integral)):
            raise ValueError(f"iterations must be a whole number or 'auto', got {iters!r}")
        if iters is not None:
            n_iters = check_iterations(int(iters), "iterations")  # the one check of a count, as the CLI's and the app's
        else:  # the search's first pass: the trained depth (its nodes and backtracking do the rest)
            n_iters = self.trained_iters if strategy == "search" else self.default_iters
        whole_number("passes", passes, 1)
        return strategy, n_iters

    @torch.no_grad()
    def frames(self, puzzles: Sequence[str], iters: int | str | None = None, strategy: str = DEFAULT_STRATEGY,
               max_iters: int | None = None, patience: int = DEFAULT_PATIENCE, passes: int = DEFAULT_PASSES,
               per_iteration: bool = True, **search: Any) -> Iterator[SolveFrame]:
        """The strategy's frames on one batch of puzzles (what the app draws; `solve` consumes the same)."""
        strategy, n_iters, max_iters = self._run_settings(iters, strategy, passes, max_iters, patience, per_iteration)
        search = self._search_settings(search)
        puzzles = checked_puzzles(puzzles)
        if not puzzles:
            raise ValueError("puzzles: none given")
        return self._stream(puzzles, strategy, n_iters, passes, max_iters, patience, per_iteration, search)

    def _run_settings(self, iters: int | str | None, strategy: str, passes: int, max_iters: int | None,
                      patience: int, per_iteration: bool) -> tuple[str, int, int]:
        """(strategy, iterations per pass, most iterations of `auto`) of a run, its counts checked."""
        strategy, n_iters = self._settings(iters, strategy, passes)
        self.check_iters("auto" if strategy == "auto" else n_iters, per_iteration)
        whole_number("patience", patience, 1)
        max_iters = 4 * self.trained_iters if max_iters is None else whole_number("max_iters", max_iters, 1)
        return strategy, n_iters, max_iters

    @property
    def search_iters(self) -> int:
        """Iterations per search node when the caller does not say: the model's measured choice (its config.json
        `search_iterations`, checked at load), else the trained depth."""
        n = self.info.get("search_iterations")
        return self.trained_iters if n is None else int(n)

    def _search_settings(self, search: dict[str, Any]) -> dict[str, Any]:
        """The search's knobs (`node_iters`, `nodes`, `seconds`, `prior`, `order`, `first_look`) and `views` (of the
        views strategy, or the search's first look), checked, defaults filled."""
        from .search import ORDERS, PRIORS

        unknown = set(search) - {"node_iters", "nodes", "seconds", "prior", "order", "first_look", "views"}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        out = {"node_iters": self.search_iters, "nodes": DEFAULT_NODES, "seconds": None, "prior": "model",
               "order": "depth", "first_look": True, "views": None,
               **{k: v for k, v in search.items() if v is not None}}
        if out["views"] is not None:
            from .views import check_views

            check_views(out["views"])
        if not isinstance(out["first_look"], bool):
            raise ValueError(f"first_look must be True or False, got {out['first_look']!r}")
        whole_number("node_iters", out["node_iters"], 1)
        whole_number("nodes", out["nodes"], 1)
        sec = out["seconds"]
        if sec is not None and (isinstance(sec, bool) or not isinstance(sec, numbers.Real) or not sec > 0
                                or not math.isfinite(sec)):
            raise ValueError(f"seconds must be a positive number, got {sec!r}")
        for name, choices in (("prior", PRIORS), ("order", ORDERS)):
            if out[name] not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {out[name]!r}")
        return out

    def _stream(self, puzzles: list[str], strategy: str, n_iters: int, passes: int, max_iters: int, patience: int,
                per_iteration: bool, search: dict[str, Any]) -> Iterator[SolveFrame]:
        """The frames of puzzles already read by `checked_puzzles`, with settings from `_run_settings` and
        `_search_settings`."""
        return stream(self.engine, _board_tensor(puzzles, self.device), strategy, n_iters, passes=passes,
                      max_iters=max_iters, patience=patience, per_iteration=per_iteration, **search)

    def solve(self, puzzles: Sequence[str | Puzzle], iters: int | str | None = None, strategy: str = DEFAULT_STRATEGY,
              batch_size: int | None = None, solutions: Sequence[str | None] | None = None,
              max_iters: int | None = None, patience: int = DEFAULT_PATIENCE, passes: int = DEFAULT_PASSES,
              **search: Any) -> list[SolveResult]:
        """Solve 81-character puzzles. `iters` defaults to `default_iters` (for the search: its first pass);
        "auto" settles per board; `passes` is the most passes of the commit strategy; `batch_size` defaults to
        `default_batch_size`. The search's knobs: `node_iters` (iterations per node, default `search_iters`),
        `nodes` (most per board), `seconds` (most per batch), `prior` ("model" or "uniform"), `order` ("depth"
        or "best"), `first_look`; `views`: symmetry transforms beside the puzzle (the views strategy's, default
        8; the search's first look, default none)."""
        return list(self.solve_iter(puzzles, iters, strategy, batch_size, solutions, max_iters, patience, passes,
                                    **search))

    def solve_iter(self, puzzles: Iterable[str | Puzzle], iters: int | str | None = None,
                   strategy: str = DEFAULT_STRATEGY, batch_size: int | None = None,
                   solutions: Sequence[str | None] | None = None,
                   max_iters: int | None = None, patience: int = DEFAULT_PATIENCE, passes: int = DEFAULT_PASSES,
                   **search: Any) -> Iterator[SolveResult]:
        """`solve` one result at a time, in the order of `puzzles`, as each batch of boards is done. A list is
        checked whole before the first batch; any other iterable (``hyperset.sudoku.parse.iter_file``) is read a
        batch at a time, so memory stays flat however many puzzles it yields, and a bad puzzle stops it after
        the results before it. A stream's batches start at `FIRST_STREAM_BATCH` boards and double up to
        `batch_size`, so its first results come after a small batch, not a whole one."""
        strategy, n_iters, max_iters = self._run_settings(iters, strategy, passes, max_iters, patience, False)
        search = self._search_settings(search)
        batch_size = self.default_batch_size if batch_size is None else batch_size
        batch_size = whole_number("batch size", batch_size, 1)
        if isinstance(puzzles, str):
            raise TypeError("puzzles must be a list of puzzle strings, got one string (wrap it: [puzzle])")
        if isinstance(puzzles, Sequence):
            # with the solutions given, the puzzles need no search for how many they have
            parsed: Iterable[Puzzle] = parsed_puzzles(puzzles, search=solutions is None)
            if solutions is not None:
                _check_solutions(solutions, len(puzzles))
        elif solutions is not None:
            raise TypeError("solutions go with a list of puzzles; puzzles read as they come carry their own")
        else:
            parsed = puzzles
        stream = iter(parsed)
        start = 0
        size = batch_size if isinstance(puzzles, Sequence) else min(batch_size, FIRST_STREAM_BATCH)
        refused: PuzzleError | None = None
        while refused is None:
            chunk, refused = _take(stream, size, start)
            size = min(batch_size, 2 * size)
            if not chunk:
                break
            run = [k for k, p in enumerate(chunk) if p.no_solution is None]  # the others are answered at once
            done: dict[int, BoardResult] = {}
            if run:
                boards = [chunk[k].givens for k in run]
                for frame in self._stream(boards, strategy, n_iters, passes, max_iters, patience, False, search):
                    done.update({run[j]: board for j, board in frame.done.items()})
            for k, p in enumerate(chunk):
                r = result_of(p.givens, done[k]) if k in done else unsolvable_result(p)
                if k not in done and strategy == "search":  # the parser's proof: no node needed
                    r.search = {"status": "no solution", "nodes": 0, "backtracks": 0, "decisions": 0,
                                "propagated": 0, "model_iterations": 0}
                r.warnings = list(p.warnings)
                sol = solutions[start + k] if solutions is not None else p.solution
                if sol:
                    r.solution, r.correct = sol, r.prediction == sol
                yield r
            start += len(chunk)
        if refused is not None:  # the puzzles read before it are answered first
            raise refused


def _take(stream: Iterator[str | Puzzle], n: int, first: int) -> tuple[list[Puzzle], PuzzleError | None]:
    """The next `n` puzzles of `stream` (fewer at its end; `first`: the index of the first, for errors), and the
    error that cut them short, if one did."""
    out: list[Puzzle] = []
    try:
        for p in itertools.islice(stream, n):
            out.extend(parsed_puzzles([p], first=first + len(out)))
    except PuzzleError as e:
        return out, e
    return out, None


def _check_solutions(solutions: Sequence[str | None], n: int) -> None:
    if len(solutions) != n:
        raise ValueError(f"solutions: {len(solutions)} given for {n} puzzles")
    for k, sol in enumerate(solutions):
        if sol is not None and (not isinstance(sol, str) or len(sol) != 81 or not sol.isdigit() or "0" in sol):
            raise ValueError(f"solutions[{k}]: expected 81 digits 1-9 (or None), got {sol!r}")


def result_of(puzzle: str, board: BoardResult) -> SolveResult:
    """The checked :class:`SolveResult` of a finished board."""
    prediction = "".join(str(int(d)) for d in board.digits.tolist())
    verdict = validate(prediction, puzzle)
    blank = torch.tensor([c == "0" for c in puzzle])
    confidence = float(board.confidence.cpu()[blank].mean()) if blank.any() else 1.0
    reason = verdict.reason
    info = None if board.search is None else board.search.to_json()
    if info is not None and info["status"] == "no solution":
        reason = "no solution: the search ruled out every candidate of some cell"
    elif info is not None and info["status"] == "budget" and info.get("views") == info["nodes"]:
        reason = f"no view of {info['nodes']} valid: {reason}"
    elif info is not None and info["status"] == "budget":
        reason = f"not solved within the search's budget ({info['nodes']} nodes): {reason}"
    return SolveResult(puzzle, prediction, verdict.valid, reason, verdict.conflicting_cells, board.iterations,
                       board.energy, confidence, passes=board.passes, pass_lengths=list(board.pass_lengths),
                       search=info)


@dataclass
class SolveSummary:
    puzzles: int
    valid: int
    seconds: float
    device: str
    backend: str
    board_accuracy: float | None = None
    cell_accuracy: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = {"puzzles": self.puzzles, "valid": self.valid, "device": self.device, "backend": self.backend,
               "seconds": round(self.seconds, 4)}
        if self.board_accuracy is not None:
            out["board_accuracy"], out["cell_accuracy"] = self.board_accuracy, self.cell_accuracy
        return {**out, **self.extra}


class Tally:
    """The counts a :class:`SolveSummary` reports, kept as results come (`add`), none of them held."""

    def __init__(self) -> None:
        self.puzzles = self.valid = self.known = self.correct = self.blanks = self.right = 0
        self.searched = False
        self.search = dict.fromkeys(("model_alone", "by_a_view", "with_backtracks", "checks_alone", "no_solution",
                                     "budget", "nodes", "backtracks"), 0)

    def add(self, r: SolveResult) -> None:
        self.puzzles += 1
        self.valid += bool(r.valid)
        x = r.search
        if x is not None:
            self.searched = True
            solved = x["status"] == "solved"
            counts = self.search
            counts["model_alone"] += solved and x["backtracks"] == 0 and x["nodes"] > 0 and not x.get("view")
            counts["by_a_view"] += solved and bool(x.get("view"))
            counts["with_backtracks"] += solved and x["backtracks"] > 0
            counts["checks_alone"] += solved and x["nodes"] == 0
            counts["no_solution"] += x["status"] == "no solution"
            counts["budget"] += x["status"] == "budget"
            counts["nodes"] += x["nodes"]
            counts["backtracks"] += x["backtracks"]
        if r.solution:
            self.known += 1
            self.correct += bool(r.correct)
            for p, q, s in zip(r.puzzle, r.prediction, r.solution):
                if p == "0":
                    self.blanks += 1
                    self.right += q == s

    def summary(self, seconds: float, solver: Solver) -> SolveSummary:
        out = SolveSummary(self.puzzles, self.valid, seconds, solver.device_name(), solver.backend_name)
        # the model that ran: an ONNX graph's own config (its metadata), else the checkpoint's
        cfg = getattr(solver.engine, "config", None) or getattr(solver.model, "cfg", None)
        if cfg is not None and cfg.step_control != "none":
            out.extra["step_control"] = {"control": cfg.step_control, "from_iteration": cfg.backtrack_from,
                                         "halvings": cfg.backtracks}
        if self.searched:
            out.extra["search"] = {k: int(v) for k, v in self.search.items()}
        if self.known:
            out.board_accuracy = self.correct / self.known
            out.cell_accuracy = self.right / max(self.blanks, 1)
        return out


def summarize(results: Iterable[SolveResult], seconds: float, solver: Solver) -> SolveSummary:
    """The summary of `results` (a :class:`Tally` of them)."""
    tally = Tally()
    for r in results:
        tally.add(r)
    return tally.summary(seconds, solver)


def timed_solve(solver: Solver, puzzles: Sequence[str], **kw: Any) -> tuple[list[SolveResult], float, bool]:
    """`solver.solve` timed; a Ctrl-C stops it and keeps the results of the boards done so far (then the flag
    is True)."""
    t0 = time.perf_counter()
    results: list[SolveResult] = []
    try:
        for r in solver.solve_iter(puzzles, **kw):
            results.append(r)
    except KeyboardInterrupt:
        return results, time.perf_counter() - t0, True
    return results, time.perf_counter() - t0, False
