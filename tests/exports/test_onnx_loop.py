"""Tests for hyperset.exports.loop: a one-step torch export wrapped in an ONNX Loop, checked against torch."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hyperset.exports.loop import wrap_in_loop

torch = pytest.importorskip("torch")

D = 8


class TinyStep(torch.nn.Module):
    """x <- x - 0.1 * t * tanh(x @ A) + 0.05 * x0, energy = 0.5 * |x|^2 per batch row."""

    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.A = torch.nn.Parameter(torch.randn(d, d) * 0.5)

    def forward(
        self, x: torch.Tensor, t: torch.Tensor, x0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x_next = x - 0.1 * t * torch.tanh(x @ self.A) + 0.05 * x0
        return x_next, 0.5 * (x_next * x_next).sum(-1)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A single-threaded CPU session (the test machine is shared)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def step_and_model() -> tuple[TinyStep, onnx.ModelProto]:
    """Export ONE step (legacy exporter: ~0.3 s here vs ~4 s for dynamo) with a dynamic batch."""
    torch.manual_seed(0)
    step = TinyStep().eval()
    args = (torch.randn(2, D), torch.tensor(1.0), torch.randn(2, D))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            step,
            args,
            buf,
            input_names=["x", "t", "x0"],
            output_names=["x_next", "energy"],
            dynamic_axes={
                "x": {0: "batch"},
                "x0": {0: "batch"},
                "x_next": {0: "batch"},
                "energy": {0: "batch"},
            },
            opset_version=17,
            dynamo=False,
        )
    return step, onnx.load_from_string(buf.getvalue())


@pytest.fixture(scope="module")
def loop_model(step_and_model: tuple[TinyStep, onnx.ModelProto]) -> onnx.ModelProto:
    """The step wrapped in a Loop, with a float iteration index t."""
    return wrap_in_loop(step_and_model[1], ["x"], ["x0"], ["energy"], iter_input="t")


def _torch_loop(step: TinyStep, x: np.ndarray, x0: np.ndarray, iters: int) -> tuple[np.ndarray, np.ndarray]:
    """The same iteration in torch: t = 1..iters."""
    xt, x0t = torch.from_numpy(x), torch.from_numpy(x0)
    energies = []
    with torch.no_grad():
        for t in range(1, iters + 1):
            xt, e = step(xt, torch.tensor(float(t)), x0t)
            energies.append(e)
    return xt.numpy(), torch.stack(energies).numpy()


def test_loop_graph_is_valid_and_has_runtime_trip_count(loop_model: onnx.ModelProto) -> None:
    onnx.checker.check_model(loop_model, full_check=True)
    g = loop_model.graph
    assert [n.op_type for n in g.node] == ["Constant", "Loop"]
    assert [i.name for i in g.input] == ["iters", "x", "x0"]
    iters = g.input[0].type.tensor_type
    assert iters.elem_type == TensorProto.INT64 and len(iters.shape.dim) == 0
    assert [o.name for o in g.output] == ["x_next", "energy"]
    assert [i.name for i in g.initializer] == ["A"]  # weights stay in the outer graph
    body = g.node[1].attribute[0].g
    assert not body.initializer
    assert all(n.op_type != "Loop" for n in body.node)


@pytest.mark.parametrize(("iters", "batch"), [(1, 3), (5, 1), (12, 4)])
def test_loop_matches_torch(
    step_and_model: tuple[TinyStep, onnx.ModelProto], loop_model: onnx.ModelProto, iters: int, batch: int
) -> None:
    step, _ = step_and_model
    rng = np.random.default_rng(iters)
    x = rng.standard_normal((batch, D)).astype(np.float32)
    x0 = rng.standard_normal((batch, D)).astype(np.float32)
    y, energy = _session(loop_model).run(None, {"iters": np.array(iters, np.int64), "x": x, "x0": x0})
    ref_y, ref_e = _torch_loop(step, x, x0, iters)
    assert y.shape == (batch, D)
    assert energy.shape == (iters, batch)
    np.testing.assert_allclose(y, ref_y, atol=1e-5, rtol=0)
    np.testing.assert_allclose(energy, ref_e, atol=1e-5, rtol=1e-5)


def test_zero_iterations_return_initial_state(loop_model: onnx.ModelProto) -> None:
    x = np.ones((3, D), np.float32)
    y, energy = _session(loop_model).run(None, {"iters": np.array(0, np.int64), "x": x, "x0": x})
    np.testing.assert_array_equal(y, x)
    assert energy.shape[0] == 0 and energy.size == 0  # ORT reports [0, 0]: the batch size is unknown


def _hand_step(t_type: int, t_shape: list[int]) -> onnx.ModelProto:
    """x_next = 0.5 * x + t (t cast to float inside the step), e = sum(x_next)."""
    nodes = [
        helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["x", "half"], ["xh"]),
        helper.make_node("Add", ["xh", "tf"], ["x_next"]),
        helper.make_node("ReduceSum", ["x_next"], ["e"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "hand",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4]),
            helper.make_tensor_value_info("t", t_type, t_shape),
        ],
        [
            helper.make_tensor_value_info("e", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("x_next", TensorProto.FLOAT, ["b", 4]),
        ],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"task": "toy"})
    return model


@pytest.mark.parametrize(("t_type", "t_shape"), [(TensorProto.INT64, [1]), (TensorProto.INT32, [])])
def test_integer_iteration_index_and_offset(t_type: int, t_shape: list[int]) -> None:
    model = wrap_in_loop(
        _hand_step(t_type, t_shape),
        ["x"],
        [],
        ["e"],
        state_outputs=["x_next"],
        iter_input="t",
        iter_offset=0,
        output_names={"x_next": "x_final", "e": "energies"},
    )
    onnx.checker.check_model(model, full_check=True)
    assert [o.name for o in model.graph.output] == ["x_final", "energies"]
    assert {p.key: p.value for p in model.metadata_props} == {"task": "toy"}
    x = np.ones((2, 4), np.float32)
    final, energies = _session(model).run(None, {"iters": np.array(4, np.int64), "x": x})
    ref, ref_e = x.copy(), []
    for t in range(4):  # iter_offset=0: t = 0, 1, 2, 3
        ref = 0.5 * ref + t
        ref_e.append(ref.sum())
    np.testing.assert_allclose(final, ref, rtol=1e-6)
    np.testing.assert_allclose(energies, np.array(ref_e), rtol=1e-6)


def test_bad_arguments_are_reported() -> None:
    step = _hand_step(TensorProto.INT64, [])
    with pytest.raises(ValueError, match="not listed"):
        wrap_in_loop(step, ["x"], [], ["e"])  # t has no role
    with pytest.raises(ValueError, match="not found"):
        wrap_in_loop(step, ["x"], ["nope"], ["e"], iter_input="t")
    with pytest.raises(ValueError, match="differs"):
        wrap_in_loop(step, ["x"], [], ["e"], iter_input="t", iter_dtype="float32")
    with pytest.raises(ValueError, match="state outputs"):
        wrap_in_loop(step, ["x"], [], [], iter_input="t")  # two candidate state outputs for one state
