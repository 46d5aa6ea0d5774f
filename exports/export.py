"""Export Hyper-SET models (every task, every layer type) to ONNX: unrolled, as a Loop graph, and step by step.

Graphs (all self-contained single files, dynamic batch, opset 17 by default):

* unrolled   ``<input> -> logits, energy_attn [T, batch], energy_ff [T, batch]``; the recurrent core is unrolled
  ``iters`` times per distinct layer (T = n_layers x iters), which may exceed the trained depth.
* loop       ``<input>, iters (int64 scalar) -> logits, energy_attn, energy_ff``: stem -> ONNX ``Loop``
  around the single-step graph (one Loop per distinct layer) -> head. ``iters`` is a run-time input, no
  maximum is baked in. Same outputs as the unrolled graph for the same ``iters``. Step sizes that do not depend
  on t (the shipped Sudoku model's) are made once before the Loop, as the torch path makes them, and a single
  Hyper-SET layer's body carries its head projections on their spheres from the energy of one iteration to the
  attention step of the next (`_loop_io`).
* step       ``x [batch, N, d], x0 [batch, N, d], t (int64 scalar, 1-based) -> x_next, energy_attn [batch],
  energy_ff [batch]``: one iteration of the core, for calling the model iteration by iteration.
* stem       ``<input> -> x0``; head ``x -> logits`` (complete the step graph for step-by-step use).

``<input>`` is ``tokens`` (int64 ``[batch, N]``) for the Sudoku and MIM models and ``images`` (float32
``[batch, C, H, W]``) for the classifier. Energies are evaluated after every update, exactly as
``RecurrentCore.run(trace=True)`` records them. Layers without an energy (Transformer, CRATE, CRATE-T) output
zeros; their metadata says ``energies = ""`` (the ET layer exports its closed-form gradient and its energies).

Exporter choice: the legacy TorchScript exporter (``dynamo=False``) at opset 17. The model's RMSNorm is written out
by hand, so nothing needs opset 23; the legacy exporter exports much faster than dynamo (which matters for
unrolled graphs, whose export time grows with ``iters``), writes no per-node stack traces (the dynamo files are
2-3x larger unless those are cleared) and never splits weights into a ``.data`` file. Its graphs match PyTorch
within docs/onnx.md's parity rule (logits within 1e-4, or 4x torch fp32's own rounding error over many iterations).
It is deprecated upstream and prints a ``DeprecationWarning`` that we silence. Constant folding is off: with it on,
the exporter writes a transposed copy of W and D (and, with depth-wise LoRA, one folded W_t per unrolled iteration)
into the file; ONNX Runtime folds these itself when it loads the model. Traced graphs also lose every ``Mul`` by a
scalar constant 1 (see ``_drop_unit_scalar_muls``: an ONNX Runtime 1.31 optimizer bug otherwise breaks untrained ET
models).
"""

from __future__ import annotations

import copy
import errno
import functools
import hashlib
import io
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import Tensor, nn

import hyperset
from hyperset.checkpoint import atomic_write_bytes
from hyperset.config import check_iterations
from hyperset.energies import attn_energy_heads, ff_energy
from hyperset.models import HyperSETModel

from . import MAX_OPSET, MIN_OPSET
from .loop import wrap_in_loop

__all__ = [
    "DEFAULT_OPSET", "EXPORTER", "ExportResult", "NOISE_FACTOR", "ParityReport", "check_model", "check_output_paths",
    "compare", "energy_names", "example_inputs", "export_head", "export_loop", "export_stem", "export_step",
    "export_unrolled", "human_size", "input_name", "iterate_steps", "loop_proto", "model_fingerprint", "onnx_outputs",
    "parity", "parity_inputs", "read_metadata", "step_paths", "step_proto", "torch_outputs", "trained_iterations",
    "unrolled_proto",
]

DEFAULT_OPSET = 17
EXPORTER = "torch.onnx legacy TorchScript exporter (dynamo=False)"
OUTPUT_NAMES = ("logits", "energy_attn", "energy_ff")
STEP_INPUTS = ("x", "x0", "t")
STEP_OUTPUTS = ("x_next", "energy_attn", "energy_ff")
GRAPH_KINDS = ("unrolled", "loop", "step", "stem", "head")


# ----------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------


def input_name(task: str) -> str:
    """Name of the model input: ``images`` for the classifier, ``tokens`` otherwise."""
    return "images" if task == "classify" else "tokens"


def example_inputs(cfg: Any, batch: int = 2, seed: int = 0) -> Tensor:
    """Random valid inputs for a config: token ids in [0, vocab) or standard-normal images."""
    g = torch.Generator().manual_seed(seed)
    if cfg.task == "classify":
        return torch.randn(batch, cfg.channels, cfg.img_size, cfg.img_size, generator=g)
    return torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g, dtype=torch.long)


def energy_names(model: HyperSETModel) -> list[str]:
    """Energies the model's layers define (``["attn", "ff"]`` or ``[]`` for Transformer/CRATE)."""
    with torch.no_grad():
        x = model.stem(example_inputs(model.cfg, batch=1))
        return list(model.core.layers[0].energy(x, 1))


def model_fingerprint(model: HyperSETModel) -> str:
    """SHA-256 of the config and every tensor of the state dict (names, shapes, dtypes and bytes)."""
    h = hashlib.sha256(json.dumps(model.cfg.to_dict(), sort_keys=True).encode())
    for name, value in sorted(model.state_dict().items()):
        t = value.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def trained_iterations(model: HyperSETModel, info: Mapping[str, Any] | None) -> int:
    return hyperset.checkpoint.trained_iterations(model.cfg, dict(info or {}))


def _zeros_b(x: Tensor) -> Tensor:
    """A (batch,) float zero vector whose batch size stays dynamic in the traced graph."""
    return torch.zeros_like(x.reshape(x.shape[0], -1)[:, 0])


def check_model(path: str | Path | onnx.ModelProto, runtime: bool = False) -> None:
    """``onnx.checker.check_model(full_check=True)`` (strict shape inference) on a file or a model; with `runtime`
    also a session of ONNX Runtime's CPU provider with its default graph optimizations (where onnxruntime is
    installed), which the checker does not replace: a graph can pass it and still not load (ValueError)."""
    onnx.checker.check_model(str(path) if isinstance(path, (str, Path)) else path, full_check=True)
    if not runtime:
        return
    try:
        import onnxruntime as ort
    except ImportError:
        return
    data = Path(path).read_bytes() if isinstance(path, (str, Path)) else path.SerializeToString()
    try:
        ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types (Fail, InvalidGraph, ...) share no useful base
        raise ValueError(f"ONNX Runtime {ort.__version__} cannot load the graph: {str(e).strip()}") from None


def read_metadata(path: str | Path) -> dict[str, str]:
    """The ``metadata_props`` of an ONNX file, without loading its weights into ONNX Runtime."""
    model = onnx.load(str(path), load_external_data=False)
    return {p.key: p.value for p in model.metadata_props}


# ----------------------------------------------------------------------------------------------------
# Torch modules that are traced
# ----------------------------------------------------------------------------------------------------


class _Unrolled(nn.Module):
    """inputs -> logits, energies (T, B): the core unrolled by Python iteration (trace-time constant iters)."""

    def __init__(self, model: HyperSETModel, iters: int):
        super().__init__()
        self.model, self.iters = model, int(iters)

    def forward(self, inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = self.model.run(inputs, iters=self.iters, trace=True)
        stacked = out.trace.stacked() if out.trace is not None else {}
        zeros = _zeros_b(out.logits).unsqueeze(0).expand(self.iters * self.model.cfg.n_layers, -1)
        return out.logits, stacked.get("energy_attn", zeros), stacked.get("energy_ff", zeros)


class _Stem(nn.Module):
    def __init__(self, model: HyperSETModel):
        super().__init__()
        self.model = model

    def forward(self, inputs: Tensor) -> Tensor:
        return self.model.stem(inputs)


class _Head(nn.Module):
    def __init__(self, model: HyperSETModel):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> Tensor:
        return self.model.readout(x)


class _Step(nn.Module):
    """(x, x0, t) -> (x_next, energy_attn, energy_ff): one update of one distinct layer, t an int64 tensor."""

    def __init__(self, model: HyperSETModel, layer: int = 0):
        super().__init__()
        self.model, self.index = model, int(layer)

    def forward(self, x: Tensor, x0: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        layer = self.model.core.layers[self.index]
        return _with_energies(layer, self.model.core.step(x, x0, t, layer), t)


def _with_energies(layer: nn.Module, x: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(x, E_ATTN(x), E_FF(x)) after an update of `layer` at t; zeros for an energy the layer does not have."""
    energy = layer.energy(x, t)
    zeros = _zeros_b(x)
    return x, energy.get("attn", zeros), energy.get("ff", zeros)


def _hoistable(model: HyperSETModel) -> bool:
    """Whether the Loop graph makes the step sizes once before its Loop instead of at every iteration: the adaptive
    step sizes of a Hyper-SET layer, conditioned on x0, with a time network that gives every t the same output
    (RecurrentCore._fixed_steps; the shipped Sudoku model's), as the torch path and the unrolled graph make them."""
    sizes = model.core.step_sizes
    return (model.cfg.layer == "hyperset" and model.cfg.step == "adaptive" and model.cfg.step_cond == "x0"
            and sizes is not None and sizes.constant_in_t())


def _carries(model: HyperSETModel) -> bool:
    """Whether the Loop body carries the head projections on their spheres, split(x W) normalised, from one
    iteration to the next: the energy E_ATTN of x_t and the attention step at x_t use the same ones (one Hyper-SET
    layer with one W, no depth-wise LoRA, no step control), so each iteration makes them once instead of twice."""
    cfg = model.cfg  # a controlled step evaluates the energy of its own trial states: nothing to carry
    return cfg.layer == "hyperset" and cfg.n_layers == 1 and cfg.lora_rank == 0 and cfg.step_control == "none"


def _loop_io(model: HyperSETModel) -> tuple[list[str], list[str], list[str]]:
    """(what the prologue makes from x0, the body's inputs, the body's outputs) of the Loop graph."""
    sizes, carried = (["alpha", "gamma"] if _hoistable(model) else []), (["zh"] if _carries(model) else [])
    inputs = ["x", *carried, *(sizes or ["x0"]), "t"]
    outputs = ["x_next"] + ["zh_next"] * bool(carried) + ["energy_attn", "energy_ff"]
    return sizes + carried, inputs, outputs


class _Prologue(nn.Module):
    """x0 -> `made`, what the Loop body reads besides its state (see `_loop_io`): the step sizes when they are
    made once, the first head projections when the body carries them."""

    def __init__(self, model: HyperSETModel, made: list[str]):
        super().__init__()
        self.model, self.made = model, made

    def forward(self, x0: Tensor) -> tuple[Tensor, ...]:
        out = list(self.model.core.steps_at(x0, x0, 1)) if "alpha" in self.made else []
        if "zh" in self.made:
            out.append(self.model.core.layers[0].projections(x0))
        return tuple(out)


class _Body(nn.Module):
    """One iteration inside the Loop, named as `_loop_io` says: (x, [zh], alpha, gamma | x0, t) -> (x_next,
    [zh_next], energy_attn, energy_ff). The same arithmetic as `_Step`; with carried projections zh the step
    starts from them and the energy of x_next makes the next ones."""

    def __init__(self, model: HyperSETModel, names: list[str], layer: int = 0):
        super().__init__()
        self.model, self.names, self.index = model, names, int(layer)

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        v = dict(zip(self.names, args))
        core, layer, cfg = self.model.core, self.model.core.layers[self.index], self.model.cfg
        x, t = v["x"], v["t"]
        steps = (v["alpha"], v["gamma"]) if "alpha" in v else core.steps_at(x, v["x0"], t)
        if "zh" not in v:
            return _with_energies(layer, layer.step(x, t, steps), t)
        alpha, gamma = steps
        x = x - alpha * layer.attn_grad_from_projections(v["zh"], layer.W)
        x = x + gamma * layer.ff_descent(x, layer.D)
        zh = layer.projections(x)
        e_attn = attn_energy_heads(zh, cfg.attention, cfg.phi, normalized=True)
        e_ff = ff_energy(x, layer.D, cfg.feedforward, phi=cfg.phi, eps=cfg.norm_eps)
        return x, zh, e_attn, e_ff


# ----------------------------------------------------------------------------------------------------
# Tracing and metadata
# ----------------------------------------------------------------------------------------------------


def _trace(module: nn.Module, args: tuple[Tensor, ...], input_names: Sequence[str], output_names: Sequence[str],
           dynamic_axes: Mapping[str, Mapping[int, str]], opset: int) -> onnx.ModelProto:
    """Legacy TorchScript export into memory; returns the ModelProto (weights inside, no external data)."""
    if isinstance(opset, bool) or not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be a whole number from {MIN_OPSET} to {MAX_OPSET} (the legacy exporter's range "
                         f"that covers every op of the models), got {opset!r}")
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # legacy-exporter deprecation, tracer warnings about Python ints
        torch.onnx.export(module, args, buf, input_names=list(input_names), output_names=list(output_names),
                          dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()}, opset_version=int(opset),
                          dynamo=False, do_constant_folding=False)
    proto = onnx.load_from_string(buf.getvalue())
    _ensure_inputs(proto, module, args, input_names, dynamic_axes)
    _fix_output_sizes(proto, module, args, output_names, dynamic_axes)
    _drop_unit_scalar_muls(proto.graph)
    return proto


def _fix_output_sizes(proto: onnx.ModelProto, module: nn.Module, args: tuple[Tensor, ...],
                      names: Sequence[str], dynamic_axes: Mapping[str, Mapping[int, str]]) -> None:
    """Declare the outputs' fixed sizes: the tracer names some it could not prove fixed ('MatMullogits_dim_1'
    for the 81 positions), which tells whoever runs the graph less than the Loop graph's declaration does. Every
    axis not in `dynamic_axes` gets the size of the traced output."""
    with torch.no_grad():
        outs = module(*args)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    shapes = {name: tuple(o.shape) for name, o in zip(names, outs) if isinstance(o, Tensor)}
    for vi in proto.graph.output:
        shape, axes = shapes.get(vi.name), dynamic_axes.get(vi.name, {})
        dims = vi.type.tensor_type.shape.dim
        if shape is None or len(dims) != len(shape):
            continue
        for i, dim in enumerate(dims):
            if i not in axes and dim.dim_param:
                dim.ClearField("dim_param")
                dim.dim_value = int(shape[i])


def _drop_unit_scalar_muls(graph: onnx.GraphProto) -> int:
    """Remove ``Mul(x, c)`` nodes whose ``c`` is a rank-0 initializer equal to 1 (x passes through unchanged).

    Works around an ONNX Runtime 1.31 optimizer bug: when ORT's NoopElimination removes such a Mul and
    DivMulFusion rewrites its consumer in the same pass, the session fails with "Node input ... is not a graph
    input, initializer, or output of a previous node" (or a "Missing Input" at run time inside a Loop). The
    Energy Transformer's scalar LayerNorm gain starts at exactly 1, so every untrained ET model hit it. With
    several layers the exporter shares equal weights: a later layer's gain is ``Identity`` of the first one's, so
    the outputs of Identity nodes of such a scalar count as unit scalars too (and the Identities go with their
    last use). Returns the number of Mul nodes removed. Expects the topologically sorted flat graph the exporter
    writes.
    """
    scalars = {init.name for init in graph.initializer
               if not init.dims and numpy_helper.to_array(init).dtype.kind == "f"
               and float(numpy_helper.to_array(init)) == 1.0}
    outputs = {o.name for o in graph.output}
    replace: dict[str, str] = {}
    kept = []
    for node in graph.node:
        node.input[:] = [replace.get(i, i) for i in node.input]
        if node.op_type == "Identity" and len(node.input) == 1 and node.input[0] in scalars:
            scalars.add(node.output[0])
        elif node.op_type == "Mul" and len(node.input) == 2 and node.output[0] not in outputs:
            a, b = node.input
            if b in scalars or a in scalars:
                replace[node.output[0]] = a if b in scalars else b
                continue
        kept.append(node)
    if not replace:
        return 0
    used = {i for n in kept for i in n.input} | outputs
    kept = [n for n in kept if not (n.op_type == "Identity" and n.output[0] in scalars and n.output[0] not in used)]
    del graph.node[:]
    graph.node.extend(kept)
    used = {i for n in graph.node for i in n.input} | outputs
    unused = [init for init in graph.initializer if init.name in scalars and init.name not in used]
    for init in unused:
        graph.initializer.remove(init)
    return len(replace)


def _ensure_inputs(proto: onnx.ModelProto, module: nn.Module, args: tuple[Tensor, ...], names: Sequence[str],
                   dynamic_axes: Mapping[str, Mapping[int, str]]) -> None:
    """Re-declare inputs the tracer dropped because the graph does not use them (e.g. t for a Transformer).

    The interface then stays the same for every layer type; an unused graph input is valid ONNX.
    """
    present = [vi.name for vi in proto.graph.input]
    if all(n in present for n in names):
        return
    decl = []
    for name, arg in zip(names, args):
        if name in present:
            decl.append(next(vi for vi in proto.graph.input if vi.name == name))
            continue
        axes = dynamic_axes.get(name, {})
        shape = [axes.get(i, int(s)) for i, s in enumerate(arg.shape)]
        elem = helper.np_dtype_to_tensor_dtype(np.dtype(str(arg.dtype).replace("torch.", "")))
        decl.append(helper.make_tensor_value_info(name, elem, shape))
    others = [vi for vi in proto.graph.input if vi.name not in names]
    del proto.graph.input[:]
    proto.graph.input.extend(decl + others)


def _metadata(model: HyperSETModel, kind: str, opset: int, info: Mapping[str, Any] | None,
              graph_inputs: Sequence[onnx.ValueInfoProto] | None = None, **extra: Any) -> dict[str, str]:
    """The metadata props of a graph. `graph_inputs` (a stem, step or head graph's declared inputs): ``input``
    and ``input_format`` describe those inputs instead of the model input of the unrolled and Loop graphs."""
    cfg = model.cfg
    meta = {
        "task": cfg.task,
        "graph": kind,
        "layer": cfg.layer,
        "trained_iterations": str(trained_iterations(model, info)),
        "n_layers": str(cfg.n_layers),
        "input": input_name(cfg.task),
        "energies": ",".join(energy_names(model)),
        "config": json.dumps(cfg.to_dict(), sort_keys=True),
        "hyperset_version": hyperset.__version__,
        "torch_version": torch.__version__,
        "exporter": EXPORTER,
        "opset": str(opset),
        "model_sha256": model_fingerprint(model),
    }
    recipe = (info or {}).get("recipe")
    if recipe:
        meta["recipe"] = str(recipe)
    preset = _built_from_preset(cfg, info)
    if preset:
        meta["preset"] = preset
    if "solve_iterations" in (info or {}):  # the depth per pass the solver runs this model at by default
        meta["solve_iterations"] = str(hyperset.checkpoint.solve_iterations(cfg, dict(info or {})))
    contract = _input_contract(cfg, info)
    if graph_inputs is not None:
        if meta["input"] not in [vi.name for vi in graph_inputs]:  # the model input's details do not apply
            contract = {}
        contract.update(_graph_input_contract(graph_inputs, cfg, info))
    if kind in ("unrolled", "loop", "head"):
        contract["output_format"] = _output_contract(model, energies=kind != "head")
    meta.update(contract)
    meta.update({k: str(v) for k, v in extra.items()})
    return meta


SIDE_INPUT_MEANINGS = {"x": "the state: the stem's x0 or a step's x_next",
                       "x0": "the stem output (what the step sizes are conditioned on)",
                       "t": "the iteration, 1-based (it may exceed the trained depth)"}


def _graph_input_contract(graph_inputs: Sequence[onnx.ValueInfoProto], cfg: Any,
                          info: Mapping[str, Any] | None) -> dict[str, str]:
    """``input`` (the graph's input names, comma-separated) and ``input_format`` (``name: type [shape] meaning``
    per input, separated by ``; ``) of a stem, step or head graph, read from its declared inputs."""
    model_input = input_name(cfg.task)
    parts = []
    for vi in graph_inputs:
        if vi.name == model_input:
            parts.append(f"{vi.name}: {_input_contract(cfg, info)['input_format']}")
            continue
        tensor = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name
        dims = [d.dim_param or str(d.dim_value) for d in tensor.shape.dim]
        shape = f"[{', '.join(dims)}]" if dims else "scalar"
        meaning = SIDE_INPUT_MEANINGS.get(vi.name)
        parts.append(f"{vi.name}: {dtype} {shape}" + (f", {meaning}" if meaning else ""))
    return {"input": ",".join(vi.name for vi in graph_inputs), "input_format": "; ".join(parts)}


def _output_contract(model: HyperSETModel, energies: bool) -> str:
    """What the graph's outputs hold, for whoever reads them without this package."""
    cfg = model.cfg
    if cfg.task == "sudoku":
        logits = (f"logits: float32 [batch, {cfg.seq_len}, {cfg.num_classes}] per cell, the predicted digit is "
                  "argmax + 1 (keep the givens)")
    elif cfg.task == "mim":
        logits = (f"logits: float32 [batch, {cfg.seq_len}, {cfg.num_classes}] per position, the predicted code is "
                  "argmax")
    else:
        logits = f"logits: float32 [batch, {cfg.num_classes}], the predicted class is argmax"
    if not energies:
        return logits
    if not energy_names(model):
        return logits + "; energy_attn, energy_ff: zeros (this layer has no energy)"
    rows = "iterations" if model.cfg.n_layers == 1 else f"{model.cfg.n_layers} x iterations"
    return logits + (f"; energy_attn, energy_ff: float32 [{rows}, batch], the attention and feedforward energies "
                     "after every update")


def _input_contract(cfg: Any, info: Mapping[str, Any] | None) -> dict[str, str]:
    """What the graph's input must hold, for whoever runs it without this package: for images, the dataset and
    the per-channel mean/std the training normalized with (the checkpoint's data.normalization)."""
    if cfg.task == "sudoku":
        return {"input_format": f"int64 [batch, {cfg.seq_len}] cells row by row: 0 blank, 1-9 a given digit"}
    if cfg.task == "mim":
        return {"input_format": f"int64 [batch, {cfg.seq_len}] the tokenizer's codes in [0, {cfg.vocab_size - 1}), "
                                f"{cfg.vocab_size - 1} at masked positions"}
    out = {"input_format": f"float32 [batch, {cfg.channels}, {cfg.img_size}, {cfg.img_size}] RGB in [0, 1], then "
                           "(x - mean) / std per channel"}
    data = (info or {}).get("data")
    norm = data.get("normalization") if isinstance(data, Mapping) else None
    if isinstance(norm, Mapping) and {"mean", "std"} <= set(norm):
        out["normalization"] = json.dumps({"mean": list(norm["mean"]), "std": list(norm["std"])})
    if isinstance(data, Mapping) and data.get("dataset"):
        out["dataset"] = str(data["dataset"])
    return out


def _matching_preset(cfg: Any) -> str | None:
    """Name of the preset whose config equals ``cfg`` exactly, if any (the config JSON is always recorded)."""
    from hyperset.config import get_preset, list_presets

    return next((name for name in list_presets() if get_preset(name).config == cfg), None)


def _recipe_preset(recipe: Any, task: str) -> str | None:
    """The preset a shipped recipe (by name) builds its model from, where it is a preset of `task`'s recipe."""
    from hyperset.config import list_presets
    from hyperset.training.recipes import load_recipe, recipe_names

    if not isinstance(recipe, str) or recipe not in recipe_names():
        return None
    try:
        _, data = load_recipe(recipe)
    except ValueError:
        return None
    preset = data.get("preset")
    if not isinstance(preset, str) or preset not in list_presets() or data.get("task", task) != task:
        return None
    return preset


def _built_from_preset(cfg: Any, info: Mapping[str, Any] | None) -> str | None:
    """The preset the model was built from: the checkpoint's ``preset``, else the one its recorded recipe names
    (a shipped recipe; its model overrides may make the config differ from the preset's), else the preset whose
    config equals the model's; None where nothing names one."""
    info = info or {}
    if info.get("preset"):
        return str(info["preset"])
    return _recipe_preset(info.get("recipe"), cfg.task) or _matching_preset(cfg)


def check_output_paths(paths: Sequence[str | Path]) -> None:
    """Refuse (OSError naming the file) any path that cannot be written: a folder, what is not a regular file
    (a link, a FIFO, a device: NotReplacedError), or a file whose folder is missing or not writable. Run on every
    file of an export before anything is traced or written."""
    from hyperset.files import NotReplacedError, folder_problem, replace_problem

    for p in map(Path, paths):
        if p.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(p))
        why = replace_problem(p)
        if why is not None:
            raise NotReplacedError(f"{p} {why}; not written")
        why = folder_problem(p)
        if why is not None:
            code = errno.EACCES if p.parent.is_dir() else errno.ENOENT  # not writable, or no folder
            raise OSError(code, why, str(p))  # PermissionError / FileNotFoundError, by the code


def _finish(proto: onnx.ModelProto, meta: Mapping[str, str], doc: str) -> onnx.ModelProto:
    del proto.metadata_props[:]
    helper.set_model_props(proto, dict(meta))
    proto.producer_name = "hyperset.exports"
    proto.producer_version = hyperset.__version__
    proto.doc_string = doc
    return proto


@dataclass
class ExportResult:
    """What was written: path, graph kind, size, opset, node count, export seconds, iterations."""

    path: str
    kind: str
    bytes: int
    opset: int
    nodes: int
    seconds: float
    iterations: int | str
    metadata: dict[str, str] = field(default_factory=dict)
    extra_files: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["metadata"] = {k: v for k, v in self.metadata.items() if k != "config"}
        return out


def _count_nodes(graph: onnx.GraphProto) -> int:
    n = 0
    for node in graph.node:
        n += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                n += _count_nodes(attr.g)
    return n


def _write(proto: onnx.ModelProto, path: str | Path, kind: str, opset: int, seconds: float, iterations: int | str,
           check: bool) -> ExportResult:
    if check:
        check_model(proto, runtime=True)
    data = proto.SerializeToString()
    try:
        atomic_write_bytes(path, data)
    except OSError as e:  # name the file that failed, not a temporary one or another of a Loop graph's files
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None
    meta = {p.key: p.value for p in proto.metadata_props}
    return ExportResult(str(path), kind, len(data), opset, _count_nodes(proto.graph), round(seconds, 3), iterations,
                        meta)


@contextmanager
def _eval_mode(model: HyperSETModel) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _traced_on_cpu(build: Callable[..., onnx.ModelProto]) -> Callable[..., onnx.ModelProto]:
    """A graph builder that traces a CPU copy of a model whose weights are elsewhere (a GPU): the graph does not
    depend on where the weights were, and on the CPU every example input and constant is on the weights' device."""

    @functools.wraps(build)
    def wrapper(model: HyperSETModel, *args: Any, **kwargs: Any) -> onnx.ModelProto:
        if not isinstance(model, HyperSETModel):
            raise TypeError(f"model must be a HyperSETModel (hyperset.load_pretrained, create_model), got "
                            f"{type(model).__name__}")
        if _model_device(model).type != "cpu":
            model = copy.deepcopy(model).cpu()
        return build(model, *args, **kwargs)

    return wrapper


# ----------------------------------------------------------------------------------------------------
# Graph builders (in memory)
# ----------------------------------------------------------------------------------------------------


@_traced_on_cpu
def unrolled_proto(model: HyperSETModel, iters: int, opset: int = DEFAULT_OPSET,
                   info: Mapping[str, Any] | None = None) -> onnx.ModelProto:
    """The unrolled graph as a ModelProto (see :func:`export_unrolled`)."""
    iters = check_iterations(iters, "iters")  # an unrolled graph has at least one iteration
    name = input_name(model.cfg.task)
    with _eval_mode(model):
        x = example_inputs(model.cfg, batch=2).to(_model_device(model))
        proto = _trace(_Unrolled(model, iters), (x,), [name], OUTPUT_NAMES,
                       {name: {0: "batch"}, "logits": {0: "batch"}, "energy_attn": {1: "batch"},
                        "energy_ff": {1: "batch"}}, opset)
    meta = _metadata(model, "unrolled", opset, info, unrolled_iterations=iters)
    return _finish(proto, meta, f"Hyper-SET {model.cfg.task} model, core unrolled {iters} times per layer")


@_traced_on_cpu
def stem_proto(model: HyperSETModel, opset: int = DEFAULT_OPSET,
               info: Mapping[str, Any] | None = None) -> onnx.ModelProto:
    """``<input> -> x0`` (B, N, d)."""
    name = input_name(model.cfg.task)
    with _eval_mode(model):
        x = example_inputs(model.cfg, batch=2).to(_model_device(model))
        proto = _trace(_Stem(model), (x,), [name], ["x0"], {name: {0: "batch"}, "x0": {0: "batch"}}, opset)
    meta = _metadata(model, "stem", opset, info, graph_inputs=proto.graph.input)
    return _finish(proto, meta, "Hyper-SET stem: input -> x0")


@_traced_on_cpu
def head_proto(model: HyperSETModel, opset: int = DEFAULT_OPSET,
               info: Mapping[str, Any] | None = None) -> onnx.ModelProto:
    """``x`` (B, N, d) -> ``logits``."""
    with _eval_mode(model):
        dev = _model_device(model)
        x = model.stem(example_inputs(model.cfg, batch=2).to(dev))
        proto = _trace(_Head(model), (x,), ["x"], ["logits"], {"x": {0: "batch"}, "logits": {0: "batch"}}, opset)
    meta = _metadata(model, "head", opset, info, graph_inputs=proto.graph.input)
    return _finish(proto, meta, "Hyper-SET head: x -> logits")


@_traced_on_cpu
def step_proto(model: HyperSETModel, layer: int = 0, opset: int = DEFAULT_OPSET,
               info: Mapping[str, Any] | None = None) -> onnx.ModelProto:
    """One iteration of distinct layer ``layer``: ``(x, x0, t) -> (x_next, energy_attn, energy_ff)``."""
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer must be in [0, {model.cfg.n_layers}), got {layer}")
    with _eval_mode(model):
        dev = _model_device(model)
        x0 = model.stem(example_inputs(model.cfg, batch=2).to(dev))
        x = x0 + 0.01 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(1)).to(dev)
        t = torch.tensor(1, dtype=torch.long, device=dev)
        axes = {"x": {0: "batch"}, "x0": {0: "batch"}, "x_next": {0: "batch"}, "energy_attn": {0: "batch"},
                "energy_ff": {0: "batch"}}
        proto = _trace(_Step(model, layer), (x, x0, t), STEP_INPUTS, STEP_OUTPUTS, axes, opset)
    meta = _metadata(model, "step", opset, info, graph_inputs=proto.graph.input, layer_index=layer)
    return _finish(proto, meta, "Hyper-SET core, one iteration: (x, x0, t) -> x_next and the energies of x_next")


@_traced_on_cpu
def prologue_proto(model: HyperSETModel, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """``x0 -> [alpha, gamma], [zh]``: what the Loop graph makes before its Loop (see `_loop_io`)."""
    made, _, _ = _loop_io(model)
    with _eval_mode(model):
        x0 = model.stem(example_inputs(model.cfg, batch=2).to(_model_device(model)))
        axes = {n: {0: "batch"} for n in ("x0", *made)}
        return _trace(_Prologue(model, made), (x0,), ("x0",), made, axes, opset)


@_traced_on_cpu
def body_proto(model: HyperSETModel, layer: int = 0, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
    """The Loop body of distinct layer ``layer`` when the graph makes the step sizes once or carries the head
    projections (see `_loop_io`)."""
    made, inputs, outputs = _loop_io(model)
    with _eval_mode(model):
        dev = _model_device(model)
        x0 = model.stem(example_inputs(model.cfg, batch=2).to(dev))
        x = x0 + 0.01 * torch.randn(x0.shape, generator=torch.Generator().manual_seed(1)).to(dev)
        values = {"x": x, "x0": x0, "t": torch.tensor(1, dtype=torch.long, device=dev)}
        values.update(zip(made, _Prologue(model, made)(x0)))
        values["zh"] = model.core.layers[layer].projections(x)
        axes = {n: {0: "batch"} for n in (*inputs, *outputs) if n != "t"}
        return _trace(_Body(model, inputs, layer), tuple(values[n] for n in inputs), inputs, outputs, axes, opset)


def _prefix_flat(graph: onnx.GraphProto, prefix: str, keep: Mapping[str, str]) -> onnx.GraphProto:
    """Copy of a flat graph with every value/initializer/node name prefixed, except ``keep`` (old -> new)."""
    out = onnx.GraphProto()
    out.CopyFrom(graph)
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in out.node for a in n.attribute):
        raise ValueError("expected a graph without subgraphs")

    def ren(name: str) -> str:
        if not name:
            return name
        return keep[name] if name in keep else prefix + name

    for node in out.node:
        node.input[:] = [ren(n) for n in node.input]
        node.output[:] = [ren(n) for n in node.output]
        node.name = prefix + (node.name or node.op_type)
    for coll in (out.input, out.output, out.value_info):
        for vi in coll:
            vi.name = ren(vi.name)
    for init in out.initializer:
        init.name = ren(init.name)
    for sp in out.sparse_initializer:
        sp.values.name = ren(sp.values.name)
    return out


@_traced_on_cpu
def loop_proto(model: HyperSETModel, default_iters: int | None = None, opset: int = DEFAULT_OPSET,
               info: Mapping[str, Any] | None = None,
               steps: Sequence[onnx.ModelProto] | None = None) -> onnx.ModelProto:
    """stem -> Loop(step) per distinct layer -> head, with ``iters`` as an int64 scalar input.

    ``steps`` may pass already exported step graphs (one per distinct layer) to avoid tracing them twice.
    """
    cfg = model.cfg
    default_iters = (trained_iterations(model, info) if default_iters is None
                     else check_iterations(default_iters, "default_iters"))
    name = input_name(cfg.task)
    stem = stem_proto(model, opset, info)
    head = head_proto(model, opset, info)
    steps = list(steps) if steps is not None else [step_proto(model, k, opset, info) for k in range(cfg.n_layers)]
    if len(steps) != cfg.n_layers:
        raise ValueError(f"expected {cfg.n_layers} step graphs, got {len(steps)}")

    params = {"model." + k for k in model.state_dict()}  # the traced wrappers hold the model as `self.model`

    def shared(g: onnx.GraphProto) -> dict[str, str]:
        """A weight keeps its state-dict name in every part, so the file holds one copy of it."""
        return {i.name: i.name for i in g.initializer if i.name in params}

    def add_inits(new: Sequence[onnx.TensorProto]) -> None:
        have = {i.name for i in inits}
        inits.extend(i for i in new if i.name not in have)

    sg = _prefix_flat(stem.graph, "stem/", {name: name, "x0": "x0", **shared(stem.graph)})
    nodes = list(sg.node)
    inits = list(sg.initializer)
    made, body_inputs, body_outputs = _loop_io(model)
    states, consts = ["x"], ["x0"]
    if made:  # step sizes made once and/or carried projections: a prologue before the Loop, its own body
        states = ["x"] + (["zh"] if "zh" in made else [])
        consts = [n for n in body_inputs if n not in (*states, "t")]
        prologue = prologue_proto(model, opset).graph
        pg = _prefix_flat(prologue, "prologue/", {**{n: n for n in ("x0", *made)}, **shared(prologue)})
        nodes.extend(pg.node)
        add_inits(pg.initializer)
        steps = [body_proto(model, k, opset) for k in range(cfg.n_layers)]
    x_name = "x0"
    energies: dict[str, list[str]] = {"energy_attn": [], "energy_ff": []}
    loop_outputs: dict[str, onnx.ValueInfoProto] = {}
    for k, step in enumerate(steps):
        p = f"core{k}/"
        single = cfg.n_layers == 1
        flat = onnx.ModelProto()
        flat.CopyFrom(step)
        io_names = {n: n for n in (*STEP_INPUTS, *STEP_OUTPUTS, *body_inputs, *body_outputs)}
        flat.graph.CopyFrom(_prefix_flat(step.graph, p + "w/", {**io_names, **shared(step.graph)}))
        out_names = {"x_next": p + "x_out", "zh_next": p + "zh_out"}
        for e in energies:
            out_names[e] = e if single else p + e
        lp = wrap_in_loop(flat, states, consts, ["energy_attn", "energy_ff"],
                          state_outputs=["x_next", "zh_next"][:len(states)], iter_input="t", iters_name="iters",
                          output_names=out_names, prefix=p + "body/", graph_name=f"core{k}", check=False)
        for node in lp.graph.node:
            if node.op_type == "Loop":
                node.input[:] = [x_name if n == "x" else n for n in node.input]
            nodes.append(node)
        add_inits(lp.graph.initializer)
        for vi in lp.graph.output:
            loop_outputs[vi.name] = vi
        x_name = p + "x_out"
        for e in energies:
            energies[e].append(out_names[e])

    outputs = []
    hg = _prefix_flat(head.graph, "head/", {"x": x_name, "logits": "logits", **shared(head.graph)})
    nodes.extend(hg.node)
    add_inits(hg.initializer)
    outputs.append(next(vi for vi in hg.output if vi.name == "logits"))
    for e, parts in energies.items():
        if len(parts) == 1:
            outputs.append(loop_outputs[e])
        else:
            nodes.append(helper.make_node("Concat", parts, [e], name=f"concat/{e}", axis=0))
            outputs.append(helper.make_tensor_value_info(e, TensorProto.FLOAT, ["iterations", "batch"]))

    inputs = [next(vi for vi in sg.input if vi.name == name),
              helper.make_tensor_value_info("iters", TensorProto.INT64, [])]
    graph = helper.make_graph(nodes, f"hyperset_{cfg.task}_loop", inputs, outputs, initializer=inits)
    proto = helper.make_model(graph, opset_imports=list(steps[0].opset_import))
    proto.ir_version = max(p.ir_version for p in (stem, head, *steps))
    meta = _metadata(model, "loop", opset, info, unrolled_iterations="loop", default_iterations=default_iters)
    return _finish(proto, meta, f"Hyper-SET {cfg.task} model: stem -> Loop(iters) over the core step -> head")


# ----------------------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------------------


def export_unrolled(model: HyperSETModel, iters: int, path: str | Path, opset: int = DEFAULT_OPSET, *,
                    info: Mapping[str, Any] | None = None, check: bool = True) -> ExportResult:
    """Write the graph with the recurrent core unrolled ``iters`` times (per distinct layer).

    Inputs: ``tokens`` int64 (batch, N) or ``images`` float32 (batch, C, H, W). Outputs: ``logits``,
    ``energy_attn`` and ``energy_ff`` of shape [n_layers * iters, batch] (zeros for layers without energies).
    ``info`` is the checkpoint's info dict (``trained_iterations``, ``recipe``), recorded in the metadata.
    """
    t0 = time.perf_counter()
    proto = unrolled_proto(model, iters, opset, info)
    return _write(proto, path, "unrolled", opset, time.perf_counter() - t0, int(iters), check)


def export_stem(model: HyperSETModel, path: str | Path, opset: int = DEFAULT_OPSET, *,
                info: Mapping[str, Any] | None = None, check: bool = True) -> ExportResult:
    t0 = time.perf_counter()
    proto = stem_proto(model, opset, info)
    return _write(proto, path, "stem", opset, time.perf_counter() - t0, "-", check)


def export_head(model: HyperSETModel, path: str | Path, opset: int = DEFAULT_OPSET, *,
                info: Mapping[str, Any] | None = None, check: bool = True) -> ExportResult:
    t0 = time.perf_counter()
    proto = head_proto(model, opset, info)
    return _write(proto, path, "head", opset, time.perf_counter() - t0, "-", check)


def export_step(model: HyperSETModel, path: str | Path, opset: int = DEFAULT_OPSET, *, layer: int = 0,
                info: Mapping[str, Any] | None = None, check: bool = True) -> ExportResult:
    """Write the single-iteration graph of distinct layer ``layer``.

    Inputs ``x`` (batch, N, d), ``x0`` (batch, N, d) (the stem output, the step-size condition), ``t`` (int64
    scalar, the 1-based iteration; it may exceed the trained depth). Outputs ``x_next``, ``energy_attn`` and
    ``energy_ff`` (batch,), the energies of ``x_next``. Use :func:`iterate_steps` with the stem and head graphs.
    """
    t0 = time.perf_counter()
    proto = step_proto(model, layer, opset, info)
    return _write(proto, path, "step", opset, time.perf_counter() - t0, 1, check)


def step_paths(path: str | Path, n_layers: int = 1) -> dict[str, list[Path] | Path]:
    """File names written next to a Loop graph ``model.onnx``: ``model.stem.onnx``, ``model.step.onnx``
    (``model.step0.onnx``, ``model.step1.onnx``, ... with several distinct layers) and ``model.head.onnx``."""
    path = Path(path)
    stem = path.name[: -len(".onnx")] if path.name.endswith(".onnx") else path.name
    steps = [path.with_name(f"{stem}.step.onnx")] if n_layers == 1 else [
        path.with_name(f"{stem}.step{k}.onnx") for k in range(n_layers)]
    return {"stem": path.with_name(f"{stem}.stem.onnx"), "step": steps, "head": path.with_name(f"{stem}.head.onnx")}


def export_loop(model: HyperSETModel, path: str | Path, default_iters: int | None = None,
                opset: int = DEFAULT_OPSET, *, info: Mapping[str, Any] | None = None, check: bool = True,
                write_steps: bool = False) -> ExportResult:
    """Write the Loop graph (``iters`` is an int64 scalar input; ``default_iters`` only goes into the metadata).

    With ``write_steps`` the stem, step and head graphs are written next to it as well (see :func:`step_paths`):
    all are built and checked first, then written, the Loop graph last. Each file is replaced atomically, and a
    set left mixed by a crash between two of them is refused by the solver (their ``model_sha256`` differ).
    """
    names = step_paths(path, model.cfg.n_layers)
    check_output_paths([path, *(names["step"] + [names["stem"], names["head"]] if write_steps else [])])
    t0 = time.perf_counter()
    steps = [step_proto(model, k, opset, info) for k in range(model.cfg.n_layers)]
    proto = loop_proto(model, default_iters, opset, info, steps=steps)
    side: list[tuple[onnx.ModelProto, Path, str, int | str]] = []
    if write_steps:
        side = [(step, Path(p), "step", 1) for step, p in zip(steps, names["step"])]
        side += [(builder(model, opset, info), Path(names[kind]), kind, "-")
                 for kind, builder in (("stem", stem_proto), ("head", head_proto))]
        if check:
            for graph, *_ in side:
                check_model(graph, runtime=True)
    seconds = time.perf_counter() - t0
    for graph, p, kind, iterations in side:
        _write(graph, p, kind, opset, 0.0, iterations, False)
    result = _write(proto, path, "loop", opset, seconds, "loop", check)
    result.extra_files.extend(str(p) for _, p, _, _ in side)
    return result


# ----------------------------------------------------------------------------------------------------
# Running and parity
# ----------------------------------------------------------------------------------------------------


def torch_outputs(model: HyperSETModel, inputs: Tensor, iters: int) -> dict[str, np.ndarray]:
    """The reference: ``model.run(inputs, iters, trace=True)`` as numpy (``energy_*`` zeros when undefined)."""
    with torch.no_grad(), _eval_mode(model):
        out = model.run(inputs.to(_model_device(model)), iters=int(iters), trace=True)
    stacked = out.trace.stacked() if out.trace is not None else {}
    T, B = int(iters) * model.cfg.n_layers, inputs.shape[0]
    result = {"logits": out.logits.float().cpu().numpy()}
    for name in ("energy_attn", "energy_ff"):
        value = stacked.get(name)
        result[name] = value.float().cpu().numpy() if value is not None else np.zeros((T, B), np.float32)
    return result


def onnx_outputs(session: Any, inputs: Tensor | np.ndarray, iters: int | None = None) -> dict[str, np.ndarray]:
    """Run an unrolled or Loop graph through an ``OrtSession`` (``iters`` is fed only to Loop graphs)."""
    array = inputs.cpu().numpy() if isinstance(inputs, Tensor) else np.asarray(inputs)
    feeds: dict[str, Any] = {}
    for name in session.input_names:
        if name == "iters":
            if iters is None:
                raise ValueError("this is a Loop graph: pass iters")
            feeds[name] = np.asarray(int(iters), dtype=np.int64)
        else:
            feeds[name] = array
    out = session.run(feeds)
    if iters is not None and "energy_attn" in out and out["energy_attn"].shape[0] == 0:
        b = array.shape[0]
        out = {**out, **{k: out[k].reshape(0, b) for k in ("energy_attn", "energy_ff") if k in out}}
    return out


def iterate_steps(stem: Any, step: Sequence[Any] | Any, head: Any, inputs: Tensor | np.ndarray,
                  iters: int) -> Iterator[tuple[int, int, np.ndarray, dict[str, np.ndarray]]]:
    """Run the stem/step/head graphs iteration by iteration (``OrtSession`` objects; one step per layer).

    Yields ``(layer, t, logits, {"attn": (B,), "ff": (B,)})`` after every update, like ``RecurrentCore.iterate``.
    """
    steps = list(step) if isinstance(step, (list, tuple)) else [step]
    array = inputs.cpu().numpy() if isinstance(inputs, Tensor) else np.asarray(inputs)
    x0 = stem.run({stem.input_names[0]: array})["x0"]
    x = x0
    for k, s in enumerate(steps):
        for t in range(1, int(iters) + 1):
            out = s.run({"x": x, "x0": x0, "t": np.asarray(t, dtype=np.int64)})
            x = out["x_next"]
            logits = head.run({"x": x})["logits"]
            yield k, t, logits, {"attn": out["energy_attn"], "ff": out["energy_ff"]}


@dataclass
class ParityReport:
    """Torch vs ONNX Runtime on the same inputs."""

    path: str
    graph: str
    iters: int
    batch: int
    provider: str
    max_abs_logits: float
    max_abs_energy: float
    max_rel_energy: float
    prediction_agreement: float  # fraction of positions whose argmax agrees
    tolerance: float  # the least max |dlogits| allowed
    fp32_error: float = 0.0  # max |dlogits| of torch fp32 from torch fp64 on the same inputs (its own rounding)

    @property
    def same_predictions(self) -> bool:
        return self.prediction_agreement == 1.0

    @property
    def allowed(self) -> float:
        """The largest max |dlogits| that passes: `tolerance`, or NOISE_FACTOR times torch fp32's own rounding
        error where that is larger (a deep recurrence's logits move by more than 1e-4 with the order of sums)."""
        return max(self.tolerance, NOISE_FACTOR * self.fp32_error)

    @property
    def ok(self) -> bool:
        return self.same_predictions and self.max_abs_logits <= self.allowed

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(allowed=self.allowed, same_predictions=self.same_predictions, ok=self.ok)
        return out


def compare(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> dict[str, float]:
    """max |diff| of logits and energies, relative energy error and argmax agreement."""
    a, b = reference["logits"], candidate["logits"]
    if a.shape != b.shape:
        raise ValueError(f"logits shapes differ: {a.shape} vs {b.shape}")
    e_abs, e_rel = 0.0, 0.0
    for name in ("energy_attn", "energy_ff"):
        ra, ca = reference[name], candidate[name]
        if ra.shape != ca.shape:
            raise ValueError(f"{name} shapes differ: {ra.shape} vs {ca.shape}")
        if ra.size:
            d = np.abs(ra - ca)
            e_abs = max(e_abs, float(d.max()))
            e_rel = max(e_rel, float((d / np.maximum(np.abs(ra), 1.0)).max()))
    return {"max_abs_logits": float(np.abs(a - b).max()) if a.size else 0.0, "max_abs_energy": e_abs,
            "max_rel_energy": e_rel, "prediction_agreement": float((a.argmax(-1) == b.argmax(-1)).mean())}


NOISE_FACTOR = 4  # parity allows ONNX Runtime this many times torch fp32's own distance from fp64 (see parity)


def parity_inputs(cfg: Any, batch: int = 3, seed: int = 0) -> Tensor:
    """Inputs for a parity check: :func:`example_inputs`, except that for a 9x9 Sudoku model the first half of the
    rows (rounded up) are real puzzles (``hyperset.sudoku.exact.generate``, 22-34 givens): their logits are far
    larger than those of random tokens, and so are the differences a graph can make."""
    inputs = example_inputs(cfg, batch=batch, seed=seed)
    if cfg.task == "sudoku" and cfg.seq_len == 81 and cfg.vocab_size == 10:
        from hyperset.sudoku.board import to_array
        from hyperset.sudoku.exact import generate

        real = [to_array(p) for p, _ in generate((batch + 1) // 2, seed=seed)]
        inputs[:len(real)] = torch.from_numpy(np.stack(real)).long()
    return inputs


def _fp64_logits(model: HyperSETModel, inputs: Tensor, iters: int) -> np.ndarray:
    """Logits of a float64 copy of the model (on the CPU) on the same inputs."""
    twin = copy.deepcopy(model).cpu().double()
    x = inputs.cpu()
    with torch.no_grad(), _eval_mode(twin):
        out = twin.run(x.double() if x.is_floating_point() else x, iters=int(iters))
    return out.logits.cpu().numpy()


def parity(model: HyperSETModel, onnx_path: str | Path, iters: int, *, inputs: Tensor | None = None, batch: int = 3,
           seed: int = 0, device: str = "cpu", threads: int | None = None, tolerance: float = 1e-4,
           session: Any = None) -> ParityReport:
    """Compare ``model.run(iters)`` with the ONNX graph at ``onnx_path`` (unrolled or Loop) on the same inputs.

    Inputs default to :func:`parity_inputs` with ``batch`` rows (a batch size other than the export's 2 also
    checks the dynamic batch axis). The check passes when the predictions agree everywhere and the largest logit
    difference is at most `tolerance` or, where larger, ``NOISE_FACTOR`` times torch fp32's own rounding error:
    its largest difference from a float64 copy of the model on the same inputs (the report's ``fp32_error``).
    The two fp32 runs sum in different orders, so over many iterations their logits part by about as much as
    either does from fp64 (2.5e-4 for the Sudoku Transformer baseline at 16 iterations).
    """
    from .runtime import OrtSession

    sess = session or OrtSession(onnx_path, device, intra_op_threads=threads)
    if "task" in sess.metadata:  # a graph of another task cannot be compared (its inputs differ)
        sess.expect_task(model.cfg.task)
    if inputs is None:
        inputs = parity_inputs(model.cfg, batch=batch, seed=seed)
    graph = sess.metadata.get("graph", "unrolled" if "iters" not in sess.input_names else "loop")
    if graph == "unrolled":
        n = int(sess.metadata.get("unrolled_iterations", iters))
        if n != int(iters):
            raise ValueError(f"{Path(onnx_path).name} is unrolled for {n} iterations, not {iters}")
    ref = torch_outputs(model, inputs, iters)
    got = onnx_outputs(sess, inputs, iters if "iters" in sess.input_names else None)
    numbers = compare(ref, got)
    fp32_error = float(np.abs(ref["logits"] - _fp64_logits(model, inputs, iters)).max()) if inputs.shape[0] else 0.0
    return ParityReport(str(onnx_path), graph, int(iters), int(inputs.shape[0]), sess.provider, tolerance=tolerance,
                        fp32_error=fp32_error, **numbers)


def human_size(nbytes: int) -> str:
    """Human-readable size (kB / MB)."""
    if nbytes < 1024 * 1024:
        return f"{nbytes / 1024:.1f} kB"
    return f"{nbytes / (1024 * 1024):.2f} MB"
