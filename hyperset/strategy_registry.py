"""The strategies by name: each registered with its description (which the CLI help, `hyperset-eval sudoku` and
the app read) and the function that runs it on a batch of boards.

A new strategy is one file (a generator of :class:`~hyperset.strategies.SolveFrame`, written on the parts of
:mod:`hyperset.strategies`) and one `register_strategy` entry below; the solver, the commands and the app then
offer it. The default is the first entry (``hyperset.defaults.STRATEGY_NAMES`` repeats the names for --help
without torch; a test keeps the two the same).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from .backends import SolverBackend
from .search import search
from .strategies import SolveFrame, auto, commit, single
from .views import DEFAULT_VIEWS, views

__all__ = ["REGISTRY", "STRATEGIES", "Strategy", "StrategySettings", "register_strategy", "stream", "strategy_names"]


@dataclass(frozen=True)
class StrategySettings:
    """What a strategy reads: iterations per pass (`iters`; the root pass of ``search``), most passes of
    ``commit``, most iterations and patience of ``auto``, iteration frames, the search's knobs (iterations per
    node, most nodes per board, most seconds, prior, order, first look) and the symmetry views (of the views
    strategy, default 8; of the search's first look, default none)."""

    iters: int
    passes: int = 16
    max_iters: int | None = None
    patience: int = 4
    per_iteration: bool = False
    node_iters: int | None = None
    nodes: int = 1000
    seconds: float | None = None
    prior: str = "model"
    order: str = "depth"
    first_look: bool = True
    views: int | None = None


@dataclass(frozen=True)
class Strategy:
    """A registered strategy: its name, a one-line description (CLI help and the app read it), and
    ``run(backend, boards, settings)`` giving its frames."""

    name: str
    description: str
    run: Callable[[SolverBackend, Tensor, StrategySettings], Iterator[SolveFrame]]


REGISTRY: dict[str, Strategy] = {}


def register_strategy(strategy: Strategy) -> None:
    """Make `strategy` known by its name to the solver, the commands and the app."""
    REGISTRY[strategy.name] = strategy


def _search(backend: SolverBackend, boards: Tensor, s: StrategySettings) -> Iterator[SolveFrame]:
    return search(backend, boards, s.iters, node_iters=s.node_iters, nodes=s.nodes, seconds=s.seconds,
                  prior=s.prior, order=s.order, first_look=s.first_look, views=s.views or 0,
                  per_iteration=s.per_iteration)


def _views(backend: SolverBackend, boards: Tensor, s: StrategySettings) -> Iterator[SolveFrame]:
    return views(backend, boards, s.iters, DEFAULT_VIEWS if s.views is None else s.views, s.per_iteration)


register_strategy(Strategy(
    "search", "one pass, then search on the model's beliefs: every partial board checked exactly, a wrong guess "
    "taken back; answers every valid puzzle within its budget", _search))
register_strategy(Strategy(
    "commit", "run, fix the most confident clash-free cells as givens, run again until the board is valid or "
    "full (never takes a digit back)", lambda be, b, s: commit(be, b, s.iters, s.passes, s.per_iteration)))
register_strategy(Strategy(
    "single", "one pass of N iterations", lambda be, b, s: single(be, b, s.iters, s.per_iteration)))
register_strategy(Strategy(
    "views", "one pass on the puzzle and K symmetry transforms of it in one batch; the exact check picks a valid "
    "answer among them", _views))
register_strategy(Strategy(
    "auto", "iterate until the prediction is valid or settles, at most 4x the trained depth",
    lambda be, b, s: auto(be, b, s.max_iters or s.iters, s.patience, s.per_iteration)))


def strategy_names() -> tuple[str, ...]:
    """The registered strategies' names, the default first."""
    return tuple(REGISTRY)


def stream(backend: SolverBackend, boards: Tensor, strategy: str, iters: int, **settings: Any
           ) -> Iterator[SolveFrame]:
    """The frames of `strategy` on `boards` (B, 81) int64; `settings` as :class:`StrategySettings` names them
    (`max_iters` bounds auto, default `iters`)."""
    if strategy not in REGISTRY:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[strategy].run(backend, boards, StrategySettings(iters, **settings))


STRATEGIES = strategy_names()  # the built-in ones; REGISTRY holds any registered later too
