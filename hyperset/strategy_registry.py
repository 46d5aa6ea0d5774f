"""The strategies by name: each registered with its description (which the CLI help, `hyperset-eval sudoku` and
the app read) and the function that runs it on a batch of boards.

A new strategy is one file (a generator of :class:`~hyperset.strategies.SolveFrame`, written on the parts of
:mod:`hyperset.strategies`, taking ``(backend, boards, settings)``) and one `register_strategy` entry below, naming
its function as ``"module:function"``; the solver, the commands and the app then offer it. Nothing here imports
torch or a strategy until one runs, so the commands' --help lists the strategies without torch. The default is
``hyperset.defaults.DEFAULT_STRATEGY``, the first entry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .defaults import DEFAULT_PASSES, DEFAULT_PATIENCE

if TYPE_CHECKING:
    from torch import Tensor

    from .backends import SolverBackend
    from .strategies import SolveFrame

__all__ = ["REGISTRY", "STRATEGIES", "Strategy", "StrategySettings", "register_strategy", "stream", "strategy_help",
           "strategy_names"]


@dataclass(frozen=True)
class StrategySettings:
    """What a strategy reads: iterations per pass (`iters`; the root pass of ``search``), most passes of
    ``commit``, most iterations and patience of ``auto``, iteration frames, the search's knobs (iterations per
    node, most nodes per board, most seconds, prior, order, first look) and the symmetry views (of the views
    strategy, default 8; of the search's first look, default none)."""

    iters: int
    passes: int = DEFAULT_PASSES
    max_iters: int | None = None
    patience: int = DEFAULT_PATIENCE
    per_iteration: bool = False
    node_iters: int | None = None
    nodes: int = 1000
    seconds: float | None = None
    prior: str = "model"
    order: str = "depth"
    first_look: bool = True
    views: int | None = None


Runner = Callable[["SolverBackend", "Tensor", StrategySettings], Iterator["SolveFrame"]]


@dataclass(frozen=True)
class Strategy:
    """A registered strategy: its name, a one-line description (CLI help and the app read it), and
    ``run(backend, boards, settings)`` giving its frames, or its ``"module:function"`` name (imported on first
    use)."""

    name: str
    description: str
    run: Runner | str

    def runner(self) -> Runner:
        """The function that runs the strategy (imported now where `run` names it)."""
        if callable(self.run):
            return self.run
        module, _, name = self.run.partition(":")
        return getattr(importlib.import_module(module), name)


REGISTRY: dict[str, Strategy] = {}


def register_strategy(strategy: Strategy) -> None:
    """Make `strategy` known by its name to the solver, the commands and the app (the commands read the names
    when they are imported: register before)."""
    if not callable(strategy.run) and not (isinstance(strategy.run, str) and ":" in strategy.run):
        raise TypeError(f"strategy {strategy.name!r}: run must be a function or 'module:function', "
                        f"got {strategy.run!r}")
    REGISTRY[strategy.name] = strategy


def _search(backend: SolverBackend, boards: Tensor, s: StrategySettings) -> Iterator[SolveFrame]:
    from .search import search

    return search(backend, boards, s.iters, node_iters=s.node_iters, nodes=s.nodes, seconds=s.seconds,
                  prior=s.prior, order=s.order, first_look=s.first_look, views=s.views or 0,
                  per_iteration=s.per_iteration)


def _commit(backend: SolverBackend, boards: Tensor, s: StrategySettings) -> Iterator[SolveFrame]:
    from .strategies import commit

    return commit(backend, boards, s.iters, s.passes, s.per_iteration)


def _single(backend: SolverBackend, boards: Tensor, s: StrategySettings) -> Iterator[SolveFrame]:
    from .strategies import single

    return single(backend, boards, s.iters, s.per_iteration)


def _views(backend: SolverBackend, boards: Tensor, s: StrategySettings) -> Iterator[SolveFrame]:
    from .views import DEFAULT_VIEWS, views

    return views(backend, boards, s.iters, DEFAULT_VIEWS if s.views is None else s.views, s.per_iteration)


def _auto(backend: SolverBackend, boards: Tensor, s: StrategySettings) -> Iterator[SolveFrame]:
    from .strategies import auto

    return auto(backend, boards, s.max_iters or s.iters, s.patience, s.per_iteration)


register_strategy(Strategy(
    "search", "one pass, then search on the model's beliefs: every partial board checked exactly, a wrong guess "
    "taken back; answers every valid puzzle within its budget", _search))
register_strategy(Strategy(
    "commit", "run, fix the most confident clash-free cells as givens, run again until the board is valid or "
    "full (never takes a digit back)", _commit))
register_strategy(Strategy("single", "one pass of N iterations", _single))
register_strategy(Strategy(
    "views", "one pass on the puzzle and K symmetry transforms of it in one batch; the exact check picks a valid "
    "answer among them", _views))
register_strategy(Strategy(
    "auto", "iterate until the prediction is valid or settles, at most 4x the trained depth", _auto))


def strategy_names() -> tuple[str, ...]:
    """The registered strategies' names, the default first."""
    return tuple(REGISTRY)


def stream(backend: SolverBackend, boards: Tensor, strategy: str, iters: int, **settings: Any
           ) -> Iterator[SolveFrame]:
    """The frames of `strategy` on `boards` (B, 81) int64; `settings` as :class:`StrategySettings` names them
    (`max_iters` bounds auto, default `iters`)."""
    if strategy not in REGISTRY:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(REGISTRY)}")
    return REGISTRY[strategy].runner()(backend, boards, StrategySettings(iters, **settings))


STRATEGIES = strategy_names()  # the built-in ones; REGISTRY (and strategy_names()) hold any registered later too


def strategy_help() -> str:
    """The registered strategies with their descriptions, for a command's --help."""
    return "; ".join(f"{s.name}: {s.description}" for s in REGISTRY.values())
