"""What runs the Sudoku model for the solver: the :class:`SolverBackend` protocol, its torch implementation, and
the lookup of the others by name.

A backend runs a batch of boards for a number of iterations, either in one call (:meth:`SolverBackend.run`, the
fast path of ``hyperset-solve``) or one iteration at a time (:meth:`SolverBackend.iterate`, for the strategies
that look at every iteration and for the app's frames). Both give the same numbers. The strategies
(``hyperset.strategies``) are written once against this protocol.

Other backends live outside this package (the ONNX Runtime one is ``hyperset.exports.solver_backend``) and are found by
name through the ``hyperset.backends`` entry-point group, or registered at run time with
:func:`register_backend`. A backend factory is called as ``factory(model, info=..., path=..., device=...,
threads=...)`` and returns a :class:`SolverBackend`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from .core import relay
from .device import describe

__all__ = ["BACKEND_GROUP", "BackendStep", "CallableBackend", "SolverBackend", "TorchBackend", "backend_factory",
           "register_backend"]

BACKEND_GROUP = "hyperset.backends"


@dataclass
class BackendStep:
    """One iteration of a backend: `t` counts the updates so far (1-based, over all distinct layers), `logits`
    (B, 81, 9) float, `energies` {"attn": (B,), "ff": (B,)} float ({} for layers without an energy)."""

    t: int
    logits: Tensor
    energies: dict[str, Tensor]


@runtime_checkable
class SolverBackend(Protocol):
    """The interface the solver, the CLI and the app use to run a model.

    Attributes: ``name`` (shown in summaries, e.g. ``"torch"``, ``"onnxruntime (CPUExecutionProvider)"``),
    ``source`` (where the numbers come from: ``"torch"`` or ``"onnxruntime"``; every frame carries it),
    ``device`` (``"cpu"``, ``"cuda"``, ...: the solver sizes its batches by it) and ``device_name`` (for people).
    A backend may also have ``errors``: a tuple of the exception types a run raises when one of its files or its
    runtime cannot serve it (e.g. a graph opened on first use); the commands report those in one line.
    """

    name: str
    source: str
    device: str
    device_name: str

    def check(self, iters: int, per_iteration: bool) -> None:
        """Raise ValueError, before any work, if this backend cannot run `iters` iterations (one call, or one
        iteration at a time when `per_iteration`)."""

    def run(self, boards: Tensor, iters: int, energies: bool = True) -> tuple[Tensor, dict[str, Tensor]]:
        """(B, 81) boards -> logits (B, 81, 9) after `iters` iterations and energies {name: (T, B)}; with
        `energies` False the backend may leave them out ({}), where that saves work."""

    def iterate(self, boards: Tensor, iters: int) -> Generator[BackendStep, Tensor | None, None]:
        """The same computation one iteration at a time. The consumer may send the rows of the batch to keep (an
        index tensor, ``generator.send``): the following steps run and report those rows only, in that order."""


class TorchBackend:
    """The model itself: :meth:`HyperSETModel.run` with the trace for whole passes, :meth:`HyperSETModel.frames` per
    iteration."""

    source = "torch"

    def __init__(self, model: Any, device: torch.device | str):
        self.model, self.torch_device = model, torch.device(device)
        self.name = "torch"
        self.device = self.torch_device.type
        self.device_name = describe(self.torch_device)

    def check(self, iters: int, per_iteration: bool) -> None:
        return None

    @torch.no_grad()
    def run(self, boards: Tensor, iters: int, energies: bool = True) -> tuple[Tensor, dict[str, Tensor]]:
        """The logits after `iters` iterations and the energies (T, B) of every iteration: ``model.run`` with the
        trace (on a CPU one slice of boards at a time through all the iterations, see `RecurrentCore.run`);
        without `energies`, no trace."""
        if int(iters) < 1:
            raise ValueError(f"iterations must be >= 1, got {iters}")
        out = self.model.run(boards.to(self.torch_device), int(iters), trace=energies)
        if not energies:
            return out.logits.float(), {}
        return out.logits.float(), {k: torch.stack(v) for k, v in out.trace.energy.items()}

    @torch.no_grad()  # on a generator: every resume runs without gradient, and sends pass through
    def iterate(self, boards: Tensor, iters: int) -> Generator[BackendStep, Tensor | None, None]:
        frames = self.model.frames(boards.to(self.torch_device), iters, energies=True)
        yield from relay(frames, lambda f: BackendStep(f.step, f.logits.float(), f.energies))

    def __repr__(self) -> str:
        return f"TorchBackend({self.device_name!r})"


class CallableBackend:
    """A plain function ``(boards, iters) -> (logits, energies {name: (T, B)})`` as a backend (one call per pass;
    strategies that need every iteration are refused)."""

    source = "callable"

    def __init__(self, fn: Callable[[Tensor, int], tuple[Tensor, dict[str, Tensor]]], device: str = "cpu"):
        self.fn = fn
        self.name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__
        self.device = getattr(fn, "device", device)
        self.device_name = getattr(fn, "device_name", None) or self.device

    def check(self, iters: int, per_iteration: bool) -> None:
        if per_iteration:
            raise ValueError(f"the {self.name} backend runs whole passes only; iterations 'auto' and per-iteration "
                             "frames need the torch backend only")

    def run(self, boards: Tensor, iters: int, energies: bool = True) -> tuple[Tensor, dict[str, Tensor]]:
        return self.fn(boards, iters)

    def iterate(self, boards: Tensor, iters: int) -> Iterator[BackendStep]:
        self.check(iters, True)
        return iter(())


_REGISTRY: dict[str, Callable[..., SolverBackend]] = {}


def register_backend(name: str, factory: Callable[..., SolverBackend]) -> None:
    """Make `factory` the backend called `name` (over an entry point of the same name)."""
    _REGISTRY[name] = factory


def backend_factory(name: str) -> Callable[..., SolverBackend]:
    """The factory of the backend called `name`: registered, else from the ``hyperset.backends`` entry points.
    Raises LookupError naming the installed ones when there is none."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=BACKEND_GROUP)}
    if name in found:
        factory = found[name].load()
        _REGISTRY[name] = factory
        return factory
    known = sorted({"torch", *_REGISTRY, *found})
    raise LookupError(f"no solver backend named {name!r} is installed (have: {', '.join(known)}); the ONNX "
                      "backend comes with the package's 'onnx' extra: pip install 'hyperset[onnx]'")


def _torch_factory(model: Any, *, device: Any = "cpu", **_: Any) -> TorchBackend:
    from .device import pick_device

    return TorchBackend(model, pick_device(str(device)) if str(device) == "auto" else device)


register_backend("torch", _torch_factory)
