"""bench/pass_profile.py: the C kernels' calls of an inference pass timed one by one, their sum and the rest making
up the pass, and the products' rates counted from the calls' shapes."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import pass_profile  # noqa: E402

from hyperset.accel import cpu_gemm, cpu_kernels  # noqa: E402

with cpu_kernels.using_cpu_kernels("on"), cpu_gemm.using_cpu_gemm("on"):
    HERE = cpu_gemm.status() if cpu_kernels.status() == "on" else cpu_kernels.status()


@pytest.mark.skipif(HERE != "on", reason=f"the kernels cannot run here: {HERE}")
def test_the_kernels_calls_and_the_rest_make_up_the_pass(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    with cpu_kernels.using_cpu_kernels("on"), cpu_gemm.using_cpu_gemm("on"):
        pass_profile.main(["--batch", "4", "--iters", "3", "--repeats", "1", "--out", str(out)])
    doc = json.loads(out.read_text())
    names = {row["op"] for row in doc["ops"]}
    # every iteration: the feedforward step, the attention step's product, the trace's two energies
    assert {"ff_update", "step_product", "relu_energy", "maps:bisoftmax_energy"} <= names
    assert all(row["calls"] >= 3 for row in doc["ops"] if row["op"] in ("ff_update", "step_product"))
    timed = sum(row["seconds"] for row in doc["ops"])
    assert doc["other"]["seconds"] == pytest.approx(doc["pass_seconds"] - timed)
    assert 0 < timed < doc["pass_seconds"] and 0 <= doc["other"]["share_of_pass"] < 1
    for row in doc["ops"]:
        if row["op"] in pass_profile.PRODUCT_FLOPS:
            assert row["gflops_in_pass"] > 0 and row["alone_gflops"] > 0
        else:
            assert "gflops_in_pass" not in row
    assert doc["command"].startswith("python bench/pass_profile.py --batch 4") and doc["machine"]["cpu_gemm"] == "on"
    # the originals are back: a later pass is not timed
    assert not hasattr(cpu_gemm.ff_update, "__wrapped__")


def test_the_flops_of_a_product_call_come_from_its_shapes() -> None:
    import torch
    y, Ds = torch.zeros(2, 81, 128), torch.zeros(128, 512)
    assert pass_profile.PRODUCT_FLOPS["ff_update"](y, None, Ds, Ds, 1e-6) == 4 * 2 * 81 * 128 * 512
    a, w = torch.zeros(3, 5, 16), torch.zeros(16, 32)
    assert pass_profile.PRODUCT_FLOPS["step_product"](None, None, -1.0, a, w) == 2 * 15 * 16 * 32
    assert pass_profile.PRODUCT_FLOPS["project_heads"](a, w, 2, 1e-6) == 2 * 15 * 16 * 32
