"""The one recurrent core: every task, variant and baseline iterates here, and only here."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from .accel import policy
from .baselines import CRATELayer, EnergyTransformerLayer, TransformerLayer
from .config import MAX_ITERS, ModelConfig
from .energies import average_angle, effective_rank
from .layers import HyperSETLayer, StepSizes

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def relay(source: Generator[_In, Any, Any], fn: Callable[[_In], _Out]) -> Generator[_Out, Any, None]:
    """Yield fn(item) for every item of `source`, handing on to `source` whatever the consumer sends (rows to
    keep, for :meth:`RecurrentCore.iterate`); a plain ``for`` loop sends nothing."""
    sent = None
    while True:
        try:
            item = source.send(sent)
        except StopIteration:
            return
        sent = yield fn(item)


def _whole(name: str, value: Any) -> int:
    """An iteration count given to the core: a whole number (a Python or NumPy integer, or a 0-d integer tensor),
    not a bool, a float or a string, which would be truncated or refused far from the call."""
    if isinstance(value, Tensor) and value.dim() == 0 and not value.is_floating_point() and value.dtype != torch.bool:
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a whole number of iterations, got {value!r}")
    return int(value)


LAYER_TYPES = {
    "hyperset": HyperSETLayer,
    "transformer": TransformerLayer,
    "crate": CRATELayer,
    "crate-t": lambda cfg: CRATELayer(cfg, tied=True),
    "et": EnergyTransformerLayer,
}


@dataclass
class Trace:
    """Per-iteration measurements, recorded after each update (iteration t = 1..T).

    energy[name] is a list of (B,) tensors (name "attn" = E_ATTN, "ff" = E_FF); effective_rank and
    average_angle are lists of (B, H) tensors, present when geometry was requested.
    """

    energy: dict[str, list[Tensor]] = field(default_factory=dict)
    effective_rank: list[Tensor] = field(default_factory=list)
    average_angle: list[Tensor] = field(default_factory=list)

    def record(self, layer: nn.Module, x: Tensor, t: int, geometry: bool, cfg: ModelConfig | None = None) -> None:
        for name, value in traced_energy(layer, x, t, cfg).items():
            self.energy.setdefault(name, []).append(value)
        if geometry:
            Z = layer.projections(x, t).detach()
            self.effective_rank.append(effective_rank(Z))
            self.average_angle.append(average_angle(Z))

    @staticmethod
    def joined(parts: list[Trace]) -> Trace:
        """The trace of a batch from the traces of its slices of rows, in order."""
        def cat(lists: list[list[Tensor]]) -> list[Tensor]:
            return [torch.cat(step) for step in zip(*lists)]

        return Trace({k: cat([p.energy[k] for p in parts]) for k in parts[0].energy},
                     cat([p.effective_rank for p in parts]), cat([p.average_angle for p in parts]))

    def stacked(self) -> dict[str, Tensor]:
        """Everything as tensors with iterations first: energy_attn (T, B), effective_rank (T, B, H), ..."""
        out = {f"energy_{k}": torch.stack(v) for k, v in self.energy.items()}
        if self.effective_rank:
            out["effective_rank"] = torch.stack(self.effective_rank)
            out["average_angle"] = torch.stack(self.average_angle)
        return out


def layer_energy(layer: nn.Module, x: Tensor, t: int | None, cfg: ModelConfig | None) -> dict[str, Tensor]:
    """layer.energy(x, t); with the model's config, by slices of rows at inference on a CPU (``Ops.slice_rows``).
    The energy the step-length control kept for x (`HyperSETLayer.known_energy`) costs nothing."""
    keeps = hasattr(layer, "known_energy")
    known = layer.known_energy(x, t) if keeps else None
    if known is not None:
        return known
    ops = policy(x)
    rows = ops.slice_rows(cfg, len(x), x.device) if cfg is not None else 0
    energy = ops.by_rows(lambda v: layer.energy(v, t), rows, x)
    if keeps and rows:
        layer.remember_energy(x, t, energy)  # the whole batch's, for the control's next iteration
    return energy


def traced_energy(layer: nn.Module, x: Tensor, t: int | None, cfg: ModelConfig | None) -> dict[str, Tensor]:
    """layer_energy detached for a trace: in float32, or in the model's dtype where that is wider (float64)."""
    return {k: v.detach().to(torch.promote_types(v.dtype, torch.float32))
            for k, v in layer_energy(layer, x, t, cfg).items()}


@dataclass
class CoreOutput:
    x: Tensor
    trace: Trace | None = None
    states: list[Tensor] | None = None
    energies: list[Tensor] | None = None  # E_ATTN + E_FF (B,) after every update, with gradient, when asked


class RecurrentCore(nn.Module):
    """for layer in layers: for t in 1..iters: x = step(x, x0, t, layer), the step sizes from (t, cond)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(LAYER_TYPES[cfg.layer](cfg) for _ in range(cfg.n_layers))
        self.step_sizes = StepSizes(cfg) if cfg.layer == "hyperset" else None
        # Under torch.compile a pass is one graph, its updates unrolled, which the compiler specialises on the depth:
        # a new depth compiles the pass again (and after torch._dynamo's recompile limit, 8, runs it eagerly). A
        # training objective that draws the depth at every step sets this: every update is then a graph of its
        # own, compiled once for any depth.
        self.graph_per_update = False

    def steps_at(self, x: Tensor, x0: Tensor, t: int | Tensor) -> tuple[Tensor, Tensor] | None:
        """The step sizes (alpha_t, gamma_t) that `step` uses at iteration t from state x (each (B, N, d), or
        scalars for fixed steps); None for layers without them. They carry no sign constraint unless
        ``step_sign = "positive"``: where an entry is negative, that coordinate of the update moves up its energy's
        gradient instead of down."""
        if self.step_sizes is None:
            return None
        cond = x0 if self.cfg.step_cond == "x0" else x
        t_value = t.to(torch.float32) if isinstance(t, Tensor) else torch.tensor(float(t), device=x.device)
        return self.step_sizes(t_value, cond)

    def _fixed_steps(self, x0: Tensor) -> tuple[Tensor, Tensor] | None:
        """The step sizes, computed once, when they are the same at every iteration: conditioned on x0 and with a
        time network that gives every t the same c_t (a dead one, L2's weight = 0, as the authors' init leaves it,
        or fixed steps). Else None: `step` computes them at every t.

        With gradients too, eager or compiled: every iteration then uses the same (alpha, gamma) tensors, and autograd
        sums their gradients over the iterations before one backward pass through the step-size network, the
        gradient of computing them at every t (the network's per-token L3 is ~15% of a training step's matmuls at
        the authors' configuration). Under torch.compile the weight check runs in eager mode (`constant_in_t` is
        not traced; the compiled code is specialised on its answer). In a trace with gradients, and inside
        `hyperset.accel.written_out()`, they are made at every t."""
        sizes = self.step_sizes
        if sizes is None or self.cfg.step_cond != "x0":
            return None
        if torch.is_grad_enabled() and (torch.jit.is_tracing() or not policy(x0).steps_once):
            return None
        if not sizes.constant_in_t():
            return None
        return self.steps_at(x0, x0, 1)

    def step(self, x: Tensor, x0: Tensor, t: int | Tensor, layer: nn.Module, shared: object = None) -> Tensor:
        """One update of `layer` at iteration t (1-based): the step sizes from t and the condition, then the step
        (`shared`: what the layer's steps share in a pass, its `pass_weights`)."""
        return layer.step(x, t, self.steps_at(x, x0, t), shared)

    def _update(self, x: Tensor, x0: Tensor, t: int, layer: nn.Module,
                fixed: tuple[Tensor, Tensor] | None, shared: object = None) -> Tensor:
        """`step`, or the layer's step with step sizes computed once; by slices of rows at inference on a CPU.
        `shared`: what the layer's steps share in this pass (its `pass_weights`)."""
        ops = policy(x)
        rows = ops.slice_rows(self.cfg, len(x), x.device)
        # with the step-length control the update runs by slices and the control on the whole batch, so the
        # energy it keeps is that of the state the pass goes on with (for the trace and the next iteration)
        control = bool(rows) and self.cfg.step_control == "backtrack"
        one = layer.update if control else layer.step
        if fixed is None:
            y = ops.by_rows(lambda v, v0: one(v, t, self.steps_at(v, v0, t), shared), rows, x, x0)
        else:
            y = ops.by_rows(lambda v, a, g: one(v, t, (a, g), shared), rows, x, *fixed)
        return layer.backtrack(x, y, t) if control else y

    def iterate(self, x0: Tensor, iters: int | None = None, skip: int = 0,
                detach_every: int = 0) -> Generator[tuple[nn.Module, int, Tensor], Tensor | None, None]:
        """Yield (layer, t, x_t) after every update. `iters` (per layer) may exceed the trained depth.

        The consumer may send the batch rows to keep (an index tensor, ``generator.send``): the following updates
        run on those rows only, in that order (a solver drops the boards it has finished). A ``for`` loop sends
        nothing and every row runs every update.

        Training options for depth (both off by default): `skip` iterations first run without gradient and are not
        yielded (t = 1..skip; the yielded ones are t = skip+1..skip+iters), and `detach_every` = k cuts the graph
        after every k yielded iterations, so a long trajectory is trained in segments at constant memory.
        """
        return self._iterate(x0, self._fixed_steps(x0), iters, skip, detach_every)

    def _iterate(self, x0: Tensor, fixed: tuple[Tensor, Tensor] | None, iters: int | None, skip: int,
                 detach_every: int) -> Generator[tuple[nn.Module, int, Tensor], Tensor | None, None]:
        """`iterate` with the step sizes made once (`_fixed_steps`) given. Under torch.compile the weight check in
        `_fixed_steps` runs in eager mode, which breaks the graph; made outside this generator, the break falls
        before it and the compiler traces every update of the pass into one graph (a break inside a generator
        makes the compiler leave the generator's own frame to eager mode, one graph per update)."""
        iters = self.cfg.iters if iters is None else _whole("iters", iters)
        skip, detach_every = _whole("skip", skip), _whole("detach_every", detach_every)
        if iters < 0 or skip < 0 or detach_every < 0:
            raise ValueError(f"iters, skip and detach_every must be >= 0, got {iters}, {skip} and {detach_every}")
        if iters + skip > MAX_ITERS:
            raise ValueError(f"iters = {iters} (+ skip = {skip}): at most {MAX_ITERS:,} iterations per layer")
        x = x0
        for layer in self.layers:
            if skip:  # t restarts for every distinct layer, as in the authors' code
                with torch.no_grad():
                    for t in range(1, skip + 1):
                        x = self.step(x, x0, t, layer)
                x = x.detach()
            shared = layer.pass_weights() if hasattr(layer, "pass_weights") else None
            for t in range(skip + 1, skip + iters + 1):
                x = self._update(x, x0, t, layer, fixed, shared)
                if self.graph_per_update:
                    torch._dynamo.graph_break()  # nothing outside torch.compile
                rows = yield layer, t, x
                if rows is not None:
                    x, x0 = x[rows], x0[rows]
                    if fixed is not None:
                        fixed = tuple(s[rows] if s.dim() else s for s in fixed)
                if detach_every and (t - skip) % detach_every == 0:
                    x = x.detach()

    def run(self, x0: Tensor, iters: int | None = None, trace: bool = False, geometry: bool = False,
            keep_states: bool = False, skip: int = 0, detach_every: int = 0, energies: bool = False) -> CoreOutput:
        """Every update of `iterate`, keeping the last state (and the trace, every state, and every state's
        E_ATTN + E_FF with its gradient for a training objective (``energies``), when asked). At
        inference on a CPU a batch larger than a slice (``Ops.slice_rows``) runs one slice of rows through all the
        iterations at a time: its activations stay in cache from one update to the next, which beats slicing each
        update (measured in docs/onnx.md, "Speed on a CPU")."""
        if torch.compiler.is_compiling():  # a context manager of ours would break the graph
            return self._run_sliced(x0, iters, trace, geometry, keep_states, skip, detach_every, energies)
        with policy(x0).hold(x0):  # at inference the updates' choices are made once for the pass (a no-op with grad)
            return self._run_sliced(x0, iters, trace, geometry, keep_states, skip, detach_every, energies)

    def _run_sliced(self, x0: Tensor, iters: int | None, trace: bool, geometry: bool, keep_states: bool, skip: int,
                    detach_every: int, energies: bool) -> CoreOutput:
        rows = policy(x0).slice_rows(self.cfg, len(x0), x0.device)
        if rows:
            parts = [self._run(x0[i:i + rows], iters, trace, geometry, keep_states, skip, detach_every, energies)
                     for i in range(0, len(x0), rows)]

            def joined(lists: list[list[Tensor] | None]) -> list[Tensor] | None:
                return [torch.cat(s) for s in zip(*lists)] if lists[0] is not None else None

            return CoreOutput(torch.cat([p.x for p in parts]),
                              Trace.joined([p.trace for p in parts]) if parts[0].trace is not None else None,
                              joined([p.states for p in parts]), joined([p.energies for p in parts]))
        return self._run(x0, iters, trace, geometry, keep_states, skip, detach_every, energies)

    def _run(self, x0: Tensor, iters: int | None, trace: bool, geometry: bool, keep_states: bool, skip: int,
             detach_every: int, energies: bool = False) -> CoreOutput:
        if energies and not all(hasattr(layer, "total_energy") for layer in self.layers):
            raise ValueError(f"model.layer = {self.cfg.layer!r} has no energy to record")
        out = CoreOutput(x0, Trace() if (trace or geometry) else None, [] if keep_states else None,
                         [] if energies else None)
        for layer, t, x in self._iterate(x0, self._fixed_steps(x0), iters, skip, detach_every):
            out.x = x
            if out.trace is not None:
                out.trace.record(layer, x, t, geometry, self.cfg)
            if out.states is not None:
                out.states.append(x)
            if out.energies is not None:
                out.energies.append(layer.total_energy(x, t))
        return out
