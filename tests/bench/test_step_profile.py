"""bench/step_profile.py on the CPU with a small batch: the step splits into matmuls and the rest, and the 85%
budget is stated against a roofline measured in the same run."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import peer_bench  # noqa: E402
import step_profile  # noqa: E402

from hyperset.accel import fused  # noqa: E402


@pytest.fixture(autouse=True)
def few_iterations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer configuration at 4 iterations instead of 24: the same shapes and code paths, a sixth of the work
    (and of the graph torch.compile traces)."""
    config = peer_bench.our_config
    monkeypatch.setattr(peer_bench, "our_config", lambda: config().replace(iters=4))


@pytest.mark.slow
def test_a_cpu_profile_splits_the_step_and_states_the_budget(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    step_profile.main(["--rounds", "1", "--batch", "2", "--out", str(out)])
    rep = json.loads(out.read_text())
    ours = rep["runners"]["ours"]
    assert 0 < ours["matmul_s"] < ours["profiled_step_s"] and ours["other_s"] == ours["step_s"] - ours["matmul_s"]
    assert "aten::mm" in [name for name, _, _ in ours["top_ops"]]
    assert "kernels" not in ours and "peer" not in rep["runners"]
    budget = rep["budget_85"]  # against the CPU's roofline: the best of PyTorch's and numpy's rates at each shape
    assert rep["other_blas_library"].startswith("numpy ")
    assert rep["cpu_roofline_boards_per_s"] >= rep["roofline_boards_per_s"]
    assert budget["step_s"] == 2 / (0.85 * rep["cpu_roofline_boards_per_s"])
    assert ours["share_of_cpu_roofline"] == pytest.approx(ours["share_of_roofline"] * rep["roofline_boards_per_s"]
                                                          / rep["cpu_roofline_boards_per_s"])
    assert budget["left_beside_matmuls_s"] == budget["step_s"] - ours["matmul_s"]
    assert rep["least_work_roofline_boards_per_s"] > rep["roofline_boards_per_s"]  # step sizes once: less work
    assert 0 < ours["share_of_roofline"] < 1
    # the matmuls by shape: their times add up to the matmuls' time, each beside its rate alone
    shapes = ours["matmul_shapes"]
    assert sum(sh["ms"] for sh in shapes) == pytest.approx(1e3 * ours["matmul_s"], rel=1e-6)
    assert all(sh["calls"] > 0 and sh["isolated_gflops"] > 0 for sh in shapes)
    assert ours["matmul_at_isolated_rates_s"] == pytest.approx(sum(sh["isolated_ms"] for sh in shapes) / 1e3)
    assert all(sh["cold_gflops"] > 0 for sh in shapes)
    assert ours["matmul_at_cold_rates_s"] == pytest.approx(sum(sh["cold_ms"] for sh in shapes) / 1e3)
    ff = [sh for sh in shapes if (sh["m"], sh["k"], sh["n"]) == (2 * 81, 128, 512)
          and sh["op"] == ("mkldnn::_linear_pointwise" if fused.cpu_matmul_library() == "onednn" else "aten::mm")]
    assert ff and ff[0]["calls"] >= peer_bench.our_config().iters  # X D at every iteration (and the backward's dY0 D)


def test_matmul_shapes_and_layouts_come_from_the_recorded_strides() -> None:
    a, b, c, d = torch.randn(64, 32), torch.randn(64, 48), torch.randn(8, 5, 6), torch.randn(8, 7, 6)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        a.t() @ b
        torch.bmm(c, d.transpose(1, 2))
        torch.baddbmm(torch.zeros(8, 5, 7), c, d.transpose(1, 2), beta=0.0)
        torch.addmm(torch.zeros(48), b.t(), b)
    got = [step_profile.matmul_shape(e) for e in prof.events() if e.name in step_profile.MATMUL_OPS]
    assert got == [("aten::mm", 32, 64, 48, 1, "tn"), ("aten::bmm", 5, 6, 7, 8, "nt"),
                   ("aten::baddbmm", 5, 6, 7, 8, "nt"), ("aten::addmm", 48, 64, 48, 1, "tn")]


@pytest.mark.skipif(not fused.onednn_here(), reason="PyTorch has no oneDNN here")
def test_the_products_on_onednn_are_counted_with_their_shapes() -> None:
    x, w = torch.randn(4, 9, 32), torch.randn(32, 16)
    with fused.using_cpu_matmul("onednn"), torch.no_grad(), \
            profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fused.matmul(x, w)  # X W: (36 x 32) by (32 x 16)
        fused.matmul(x, w.t().contiguous().t())  # the same with W a transposed view
    got = [step_profile.matmul_shape(e) for e in prof.events() if e.name in step_profile.MATMUL_OPS]
    assert got == [(step_profile.ONEDNN_MM, 36, 32, 16, 1, "nn"), (step_profile.ONEDNN_MM, 36, 32, 16, 1, "nt")]


@pytest.mark.slow
def test_a_profiler_that_records_no_strides_gives_no_shapes_and_still_a_report(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # torch 2.11's FunctionEvent has input_shapes but neither structured_input_shapes nor structured_input_strides
    old_event = SimpleNamespace(name="aten::mm", input_shapes=[[64, 32], [32, 48]])
    assert step_profile.matmul_shape(old_event) is None
    real = step_profile.matmul_shape
    monkeypatch.setattr(step_profile, "matmul_shape",
                        lambda e: real(SimpleNamespace(name=e.name, input_shapes=e.input_shapes)))
    out = tmp_path / "profile.json"
    step_profile.main(["--rounds", "1", "--batch", "2", "--out", str(out)])
    ours = json.loads(out.read_text())["runners"]["ours"]
    assert ours["matmul_shapes"] == [] and 0 < ours["matmul_s"] < ours["profiled_step_s"]


@pytest.mark.slow
def test_where_numpy_cannot_run_the_budget_is_against_pytorchs_roofline(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(step_profile.flops.sys, "executable", "/bin/false")  # as where numpy is not installed
    out = tmp_path / "profile.json"
    step_profile.main(["--rounds", "1", "--batch", "2", "--out", str(out)])
    rep = json.loads(out.read_text())
    assert rep["other_blas_library"] is None and rep["cpu_roofline_boards_per_s"] == rep["roofline_boards_per_s"]
    assert rep["budget_85"]["step_s"] == 2 / (0.85 * rep["roofline_boards_per_s"])
    assert "judged against PyTorch's roofline alone" in capsys.readouterr().out


@pytest.mark.slow
def test_the_compiled_step_gets_its_own_split_and_budget(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    step_profile.main(["--rounds", "1", "--batch", "2", "--compile", "--out", str(out)])
    rep = json.loads(out.read_text())
    comp = rep["runners"]["ours_compiled"]
    # the matmuls' self time lies within the profiled step's wall time (the unprofiled step_s is another run,
    # which a loaded machine can make shorter than the profiled one's matmuls)
    assert 0 < comp["matmul_s"] < comp["profiled_step_s"] and comp["other_s"] == comp["step_s"] - comp["matmul_s"]
    assert "compiled graph" in [name for name, _, _ in comp["top_ops"]]  # the fused elementwise kernels
    assert rep["budget_85"]["compiled"]["left_beside_matmuls_s"] == rep["budget_85"]["step_s"] - comp["matmul_s"]
    assert rep["command"].endswith("--compile --out " + str(out))
    kernels = comp["kernels_of_compiled_graph"]  # the generated kernels one by one, forward and backward
    assert {name.split(": ")[0] for name, _, _ in kernels} == {"forward", "backward"}
    assert any("softmax" in name for name, _, _ in kernels) and all(ms >= 0 and n > 0 for _, ms, n in kernels)
    assert "kernels_of_compiled_graph" not in rep["runners"]["ours"]


def test_gpu_busy_time_counts_kernels_not_the_ranges_of_annotations() -> None:
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(name="triton_poi_fused_relu_0", device_type=cuda, is_user_annotation=False),
              SimpleNamespace(name="## Call CompiledFxGraph f1 ##", device_type=cuda, is_user_annotation=True),
              SimpleNamespace(name="aten::mm", device_type=cpu, is_user_annotation=False),
              SimpleNamespace(name="Memcpy DtoD (Device -> Device)", device_type=cuda)]
    assert [e.name for e in step_profile.gpu_kernels(events)] == ["triton_poi_fused_relu_0",
                                                                  "Memcpy DtoD (Device -> Device)"]
