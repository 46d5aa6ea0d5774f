"""Wrap a single-step ONNX graph in an ONNX ``Loop`` with a runtime trip count.

Export ONE step of a weight-shared iteration with either torch exporter, then build by hand a graph whose only
compute node is ``Loop(iters, true, *state)``. The body is the step graph (its values renamed with a prefix); the
weights stay initializers of the outer graph and the body reads them from the outer scope, as it reads the constant
inputs (e.g. ``x0``). No maximum iteration count is baked into the graph.

Resulting model::

    inputs : iters (int64 scalar), <state inputs> (initial values), <constant inputs>
    outputs: <state outputs> (final values), <scan outputs> (stacked: [iters, *step shape])

``iters = 0`` works with ONNX Runtime 1.31: the final states equal the initial states and every scan output
is empty with a leading dimension of 0. ORT cannot know the size of dynamic dimensions without running the
body, so those come out as 0 too (a ``[batch]`` energy gives shape ``[0, 0]``, a ``[batch, 4]`` trace gives
``[0, 0, 4]``); reshape to ``[0, batch]`` on the caller's side if needed. Negative ``iters`` is meaningless.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = ["wrap_in_loop", "LOOP_PRODUCER"]

LOOP_PRODUCER = "hyperset.exports.loop"


def _elem_type(dtype: Any) -> int:
    """ONNX element type from an ONNX enum value, a numpy dtype or a name like ``"float32"``."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype not in TensorProto.DataType.values():
            raise ValueError(f"unknown ONNX element type {dtype}")
        return dtype
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _rank(vi: onnx.ValueInfoProto) -> int | None:
    """Declared rank of a tensor value, or None when unknown."""
    tt = vi.type.tensor_type
    return len(tt.shape.dim) if tt.HasField("shape") else None


def _renamed(vi: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    """Copy of ``vi`` with another name."""
    out = onnx.ValueInfoProto()
    out.CopyFrom(vi)
    out.name = name
    return out


def _stacked(vi: onnx.ValueInfoProto, name: str, lead: str) -> onnx.ValueInfoProto:
    """Type of a Loop scan output: ``vi``'s tensor type with a leading dimension ``lead``."""
    out = _renamed(vi, name)
    tt = out.type.tensor_type
    if tt.HasField("shape"):
        dims = [onnx.TensorShapeProto.Dimension()]
        dims[0].dim_param = lead
        for d in tt.shape.dim:
            nd = onnx.TensorShapeProto.Dimension()
            nd.CopyFrom(d)
            dims.append(nd)
        tt.shape.ClearField("dim")
        tt.shape.dim.extend(dims)
    return out


def _rename_subgraph(graph: onnx.GraphProto, mapping: Mapping[str, str]) -> None:
    """Rename references to outer-scope values inside a (nested) subgraph, in place."""
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        _rename_attr_graphs(node, mapping)
    for vi in graph.output:
        vi.name = mapping.get(vi.name, vi.name)


def _rename_attr_graphs(node: onnx.NodeProto, mapping: Mapping[str, str]) -> None:
    """Apply :func:`_rename_subgraph` to every graph attribute of ``node``."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            _rename_subgraph(attr.g, mapping)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for g in attr.graphs:
                _rename_subgraph(g, mapping)


def _check_names(kind: str, names: Iterable[str], known: Iterable[str]) -> list[str]:
    """Return ``names`` as a list after checking they are unique and all in ``known``."""
    names = list(names)
    known = set(known)
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"{kind}: duplicate names {sorted(dup)}")
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(f"{kind}: {bad} not found in the step graph (have {sorted(known)})")
    return names


def wrap_in_loop(
    step_model: onnx.ModelProto,
    state_inputs: Sequence[str],
    const_inputs: Sequence[str],
    scan_outputs: Sequence[str],
    *,
    state_outputs: Sequence[str] | None = None,
    iter_input: str | None = None,
    iter_dtype: Any = None,
    iter_offset: int = 1,
    iters_name: str = "iters",
    output_names: Mapping[str, str] | None = None,
    prefix: str = "step/",
    graph_name: str | None = None,
    check: bool = True,
) -> onnx.ModelProto:
    """Build ``Loop(iters)`` around the single-step graph of ``step_model``.

    Args:
        step_model: one step; every graph input (other than initializers) must be named in exactly one of
            ``state_inputs``, ``const_inputs`` or ``iter_input``.
        state_inputs: step inputs carried across iterations (their initial values are model inputs).
        const_inputs: step inputs that are the same in every iteration (read from the outer scope).
        scan_outputs: step outputs collected per iteration and stacked to ``[iters, *shape]``.
        state_outputs: step outputs giving the next value of each state, in the order of ``state_inputs``;
            default: the step outputs that are not scan outputs, in graph order.
        iter_input: step input that receives the iteration index ``t = i + iter_offset`` (``i`` is the
            0-based Loop counter, so ``t`` is 1-based by default). Its rank may be 0 or 1 (shape ``[1]``).
        iter_dtype: element type of ``iter_input`` (ONNX enum, numpy dtype or name such as ``"float32"``);
            default: the type declared by the step graph. The int64 counter is cast to it.
        iters_name: name of the int64 scalar trip-count input of the new model.
        output_names: optional renaming ``{step output name: model output name}``.
        prefix: prefix for all values of the step graph inside the Loop body.
        graph_name: name of the new graph (default: ``"<step graph name>_loop"``).
        check: run ``onnx.checker.check_model`` on the result.

    Returns:
        A model with inputs ``[iters_name, *state_inputs, *const_inputs]`` and outputs
        ``[*final states, *stacked scan outputs]`` (named like the step outputs unless renamed).
    """
    step = onnx.ModelProto()
    step.CopyFrom(step_model)
    g = step.graph
    init_names = {t.name for t in g.initializer} | {s.values.name for s in g.sparse_initializer}
    inputs = {vi.name: vi for vi in g.input if vi.name not in init_names}
    outputs = {vi.name: vi for vi in g.output}

    state_inputs = _check_names("state_inputs", state_inputs, inputs)
    const_inputs = _check_names("const_inputs", const_inputs, inputs)
    scan_outputs = _check_names("scan_outputs", scan_outputs, outputs)
    listed = state_inputs + const_inputs + ([iter_input] if iter_input is not None else [])
    if iter_input is not None and iter_input not in inputs:
        raise ValueError(
            f"iter_input {iter_input!r} is not an input of the step graph (have {sorted(inputs)})"
        )
    twice = {n for n in listed if listed.count(n) > 1}
    if twice:
        raise ValueError(f"step inputs listed in more than one role: {sorted(twice)}")
    unlisted = [n for n in inputs if n not in listed]
    if unlisted:
        raise ValueError(f"step inputs {unlisted} are not listed as state, constant or iteration inputs")
    if state_outputs is None:
        state_outputs = [n for n in outputs if n not in scan_outputs]
    state_outputs = _check_names("state_outputs", state_outputs, outputs)
    if len(state_outputs) != len(state_inputs):
        raise ValueError(
            f"{len(state_inputs)} state inputs {state_inputs} but {len(state_outputs)} state outputs "
            f"{state_outputs}; pass state_outputs= explicitly"
        )
    both = set(state_outputs) & set(scan_outputs)
    if both:
        raise ValueError(f"outputs {sorted(both)} are listed both as state and scan outputs")

    # Body-local names: step inputs carried or computed per iteration, and all node outputs.
    local = list(state_inputs) + ([iter_input] if iter_input is not None else [])
    local += [o for node in g.node for o in node.output if o]
    rename = {n: prefix + n for n in local}
    counter, cond_in, cond_out = prefix + "__iter", prefix + "__cond_in", prefix + "__cond_out"

    body_nodes: list[onnx.NodeProto] = []
    if iter_input is not None:
        declared = inputs[iter_input].type.tensor_type.elem_type
        dtype = _elem_type(iter_dtype) if iter_dtype is not None else declared
        if dtype == TensorProto.UNDEFINED:
            raise ValueError(f"iter_input {iter_input!r} has no declared type; pass iter_dtype=")
        if iter_dtype is not None and declared not in (TensorProto.UNDEFINED, dtype):
            raise ValueError(
                f"iter_dtype {TensorProto.DataType.Name(dtype)} differs from the step graph's declared type "
                f"{TensorProto.DataType.Name(declared)} for {iter_input!r}"
            )
        rank = _rank(inputs[iter_input]) or 0
        if rank > 1:
            raise ValueError(f"iter_input {iter_input!r} must be a scalar or have shape [1], not rank {rank}")
        # t = Cast(Add(i, offset)) [-> Reshape to [1]]; the last node writes the renamed step input.
        target = rename[iter_input]
        steps: list[tuple[str, list[str], dict[str, Any]]] = [("Add", [counter, prefix + "__offset"], {})]
        if dtype != TensorProto.INT64:
            steps.append(("Cast", [], {"to": dtype}))
        if rank == 1:
            steps.append(("Reshape", [prefix + "__t_shape"], {}))
            body_nodes.append(
                helper.make_node(
                    "Constant",
                    [],
                    [prefix + "__t_shape"],
                    name=prefix + "__t_shape",
                    value=helper.make_tensor("shape", TensorProto.INT64, [1], [1]),
                )
            )
        body_nodes.append(
            helper.make_node(
                "Constant",
                [],
                [prefix + "__offset"],
                name=prefix + "__offset",
                value=helper.make_tensor("offset", TensorProto.INT64, [], [int(iter_offset)]),
            )
        )
        prev = None
        for k, (op, extra, attrs) in enumerate(steps):
            out = target if k == len(steps) - 1 else f"{prefix}__t_{op.lower()}"
            ins = extra if prev is None else [prev, *extra]
            body_nodes.append(helper.make_node(op, ins, [out], name=f"{prefix}__t_{op.lower()}", **attrs))
            prev = out

    for i, node in enumerate(g.node):
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.input[:] = [rename.get(n, n) for n in node.input]
        new.output[:] = [rename.get(n, n) for n in node.output]
        new.name = prefix + (node.name or f"{node.op_type}_{i}")
        _rename_attr_graphs(new, rename)
        body_nodes.append(new)

    body_nodes.append(helper.make_node("Identity", [cond_in], [cond_out], name=cond_out))

    # Body outputs: cond, next states, scan values. Values not produced by a body node (pass-through inputs,
    # outer-scope constants) or used twice get an Identity so each body output is a distinct local value.
    produced = {o for n in body_nodes for o in n.output if o}
    used: set[str] = set()
    body_outputs = [helper.make_tensor_value_info(cond_out, TensorProto.BOOL, [])]
    for kind, names in (("state", state_outputs), ("scan", scan_outputs)):
        for name in names:
            src = rename.get(name, name)
            if src not in produced or src in used:
                dst = f"{prefix}__out_{kind}/{name}"
                body_nodes.append(helper.make_node("Identity", [src], [dst], name=dst))
                src = dst
            used.add(src)
            body_outputs.append(_renamed(outputs[name], src))

    body_inputs = [
        helper.make_tensor_value_info(counter, TensorProto.INT64, []),
        helper.make_tensor_value_info(cond_in, TensorProto.BOOL, []),
    ] + [_renamed(inputs[n], rename[n]) for n in state_inputs]
    body_value_info = [_renamed(vi, rename[vi.name]) for vi in g.value_info if vi.name in rename]
    body = helper.make_graph(
        body_nodes, f"{g.name or 'step'}_body", body_inputs, body_outputs, value_info=body_value_info
    )

    rename_out = dict(output_names or {})
    final_names = [rename_out.get(n, n) for n in state_outputs]
    stacked_names = [rename_out.get(n, n) for n in scan_outputs]
    outer_inputs = [helper.make_tensor_value_info(iters_name, TensorProto.INT64, [])]
    outer_inputs += [inputs[n] for n in state_inputs] + [inputs[n] for n in const_inputs]
    # Keep initializer-backed inputs (IR < 4 style) so the model stays valid for any IR version.
    outer_inputs += [vi for vi in g.input if vi.name in init_names]
    outer_outputs = [_renamed(outputs[n], f) for n, f in zip(state_outputs, final_names)]
    outer_outputs += [_stacked(outputs[n], s, iters_name) for n, s in zip(scan_outputs, stacked_names)]

    true_name = prefix + "__true"
    outer_nodes = [
        helper.make_node(
            "Constant",
            [],
            [true_name],
            name=true_name,
            value=helper.make_tensor("true", TensorProto.BOOL, [], [1]),
        ),
        helper.make_node(
            "Loop",
            [iters_name, true_name, *state_inputs],
            [*final_names, *stacked_names],
            name=prefix + "__loop",
            body=body,
        ),
    ]
    outer_names = [vi.name for vi in outer_inputs] + [true_name, *final_names, *stacked_names]
    outer_names += [n for n in init_names if n not in {vi.name for vi in outer_inputs}]
    clash = {n for n in outer_names if outer_names.count(n) > 1}
    body_names = [vi.name for vi in body_inputs] + [o for n in body_nodes for o in n.output if o]
    clash |= {n for n in body_names if body_names.count(n) > 1} | (set(body_names) & set(outer_names))
    if clash:
        raise ValueError(
            f"name clash while building the Loop graph: {sorted(clash)}; change prefix/output_names"
        )

    graph = helper.make_graph(
        outer_nodes,
        graph_name or f"{g.name or 'step'}_loop",
        outer_inputs,
        outer_outputs,
        initializer=list(g.initializer),
        sparse_initializer=list(g.sparse_initializer),
        doc_string=g.doc_string,
    )
    model = helper.make_model(
        graph,
        opset_imports=list(step.opset_import),
        producer_name=LOOP_PRODUCER,
        doc_string=step.doc_string,
        functions=list(step.functions),
    )
    if step.ir_version:
        model.ir_version = step.ir_version
    model.metadata_props.extend(step.metadata_props)
    if not any(op.domain in ("", "ai.onnx") for op in model.opset_import):
        model.opset_import.append(helper.make_opsetid("", 17))
    if check:
        onnx.checker.check_model(model)
    return model
