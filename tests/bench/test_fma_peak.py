"""bench/fma_peak.py and the ceilings of bench/onnx_bench.py: the CPU's multiply-add peak is measured with the loops
the CPU can run (the others say why not), and the best library's rate at each matmul shape is the best of the
libraries timed there."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import flops  # noqa: E402
import fma_peak  # noqa: E402
import onnx_bench  # noqa: E402

from hyperset.config import preset_config  # noqa: E402


def test_the_peak_runs_what_the_cpu_reports_and_says_why_not_for_the_rest() -> None:
    out = fma_peak.measure(threads=1, seconds=0.02, repeats=1)
    flags = fma_peak.cpu_flags()
    assert set(out["loops"]) == set(fma_peak.LOOPS)
    for name, (_, needs, *_) in fma_peak.LOOPS.items():
        value = out["loops"][name]
        granted = name != "amx_bf16" or "error" in out or fma_peak._library().amx_permitted()
        if all(f in flags for f in needs) and "error" not in out and granted:
            assert isinstance(value, float) and value > 0.5  # GFLOP/s: any vector unit does more
        else:
            assert isinstance(value, str) and value.startswith("not run")
    if "error" not in out and "avx2" in flags:
        assert out["fp32_gflops"] == max(v for n, v in out["loops"].items()
                                         if fma_peak.LOOPS[n][0] == "fp32" and isinstance(v, float))
    bf16 = [v for n, v in out["loops"].items() if fma_peak.LOOPS[n][0] == "bf16" and isinstance(v, float)]
    assert out["bf16_gflops"] == (max(bf16) if bf16 else None)
    if out["bf16_gflops"] is None:
        assert "bf16_note" in out or "error" in out


def test_the_best_library_rate_of_a_shape_is_the_best_of_those_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real timings of ONNX Runtime and numpy on a tiny config's shapes; the best is the maximum at every shape."""
    cfg = preset_config("sudoku-cpu", dim=16, heads=2, ff_hidden=32, time_dim=16, iters=2)
    torch_rates: dict = {}
    best, libs = onnx_bench.best_library_rates(flops, cfg, [2], 1, torch_rates)
    assert set(libs["rates"]) == {"pytorch", "numpy", "onnxruntime"} and set(libs["names"]) == set(libs["rates"])
    for key, rate in best.items():
        assert rate == max(r[key] for r in libs["rates"].values()) and rate > 0
    assert set(best) == {flops._shape_key(mm) for mm in flops.matmuls(cfg, 2, energies=True)}
    # where numpy cannot be timed, the ceiling is the best of the others and the JSON says why
    monkeypatch.setattr(flops, "other_blas_rates", lambda *a, **k: (_ for _ in ()).throw(
        onnx_bench.bench_args.BenchInputError("numpy's matmuls could not be timed: no numpy")))
    best2, libs2 = onnx_bench.best_library_rates(flops, cfg, [2], 1, torch_rates)
    assert "numpy" not in libs2["rates"] and libs2["names"]["numpy"].startswith("not timed: ")
    assert all(best2[k] == max(libs2["rates"]["pytorch"][k], libs2["rates"]["onnxruntime"][k]) for k in best2)


def test_the_flops_per_board_count_the_projections_once_per_iteration_where_shared() -> None:
    """With the energy's X W shared with the next step (as every runner runs it), a pass counts one X W per
    iteration plus the first step's: (iters - 1) products of 2 N d^2 fewer than with both made."""
    cfg = preset_config("sudoku-cpu", dim=16, heads=2, ff_hidden=32, time_dim=16, iters=2)
    N, d = cfg.seq_len, cfg.dim
    for iters in (1, 5):
        least, both = onnx_bench.flops_per_board(cfg, iters), onnx_bench.flops_per_board(cfg, iters,
                                                                                         shared_projections=False)
        assert both["total"] - least["total"] == (iters - 1) * 2 * N * d * d
        assert onnx_bench.flops_per_board(cfg, iters, energies=False)["head"] == least["head"] == 2 * N * d * 9


def test_the_flops_per_board_count_step_sizes_once_where_the_model_makes_them_once() -> None:
    """Conditioned on x0 with a dead time network (time_init "zero", as the shipped Sudoku model), the step sizes
    are made once per pass (RecurrentCore._fixed_steps): counted once, not at every iteration; with a live time
    network at every iteration. The count is bench/flops.py's, the one the ceilings use."""
    live = preset_config("sudoku-cpu", dim=16, heads=2, ff_hidden=32, time_dim=16, iters=2, time_init="live")
    dead = preset_config("sudoku-cpu", dim=16, heads=2, ff_hidden=32, time_dim=16, iters=2, time_init="zero")
    N, d, td = live.seq_len, live.dim, live.time_dim
    per_pass = 2 * N * d * 2 * d + 2 * td * d + 2 * d * d  # L3 per token, the time MLP's L1 and L2
    for iters in (1, 4):
        a, b = onnx_bench.flops_per_board(live, iters), onnx_bench.flops_per_board(dead, iters)
        assert a["per_iteration"]["step_sizes"] == per_pass and "step_sizes" not in b["per_iteration"]
        assert b["once_per_pass"] - a["once_per_pass"] == per_pass
        assert a["total"] - b["total"] == (iters - 1) * per_pass
        total = sum(mm.flops for mm in flops.matmuls(dead, 1, energies=True, shared_projections=True)
                    if not mm.once) * iters + sum(mm.flops for mm in flops.matmuls(dead, 1, energies=True,
                                                                                    shared_projections=True)
                                                  if mm.once)
        assert b["total"] == total


def test_the_ceiling_takes_each_product_at_its_fastest_slicing() -> None:
    """Batch 8 whole or in slices of 2: with the sliced products twice as fast as the whole batch's, the ceiling
    rises above the whole batch's roofline (by at most 2x); with them slower, it is the whole batch's."""
    cfg = preset_config("sudoku-cpu", dim=16, heads=2, ff_hidden=32, time_dim=16, iters=2)
    keys = {s: {flops._shape_key(mm) for mm in flops.matmuls(cfg, s, energies=True, shared_projections=True)}
            for s in (2, 8)}
    assert keys[2] - keys[8]
    for sliced_rate in (2e9, 0.5e9):
        best = {k: 1e9 for k in keys[8]} | {k: sliced_rate for k in keys[2] - keys[8]}
        whole = flops.roofline(flops.matmuls(cfg, 8, energies=True, shared_projections=True), 3, 8,
                               rates=dict(best))["roofline_boards_per_s"]
        got = onnx_bench.sliced_ceiling(flops, cfg, 3, 8, [2, 8], best)
        assert got["rows_per_product_considered"] == [2, 8]
        if sliced_rate > 1e9:
            assert whole * 1.2 < got["roofline_boards_per_s"] <= 2 * whole
        else:
            assert got["roofline_boards_per_s"] == pytest.approx(whole)


@pytest.mark.slow
def test_the_bench_runs_the_kernel_choice_beside_the_default_and_says_what_ran(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--cpu-kernels off adds a PyTorch runner with the attention maps' kernel off in the same rounds; the machine
    record says what the default runners used."""
    from hyperset.accel import cpu_kernels

    chosen: list[str] = []
    real = cpu_kernels.using_cpu_kernels

    def spy(name: str):
        chosen.append(name)
        return real(name)

    monkeypatch.setattr(cpu_kernels, "using_cpu_kernels", spy)
    out = tmp_path / "bench.json"
    onnx_bench.main(["--quick", "--threads", "1", "--iters", "1", "--batches", "2", "--repeats", "1",
                     "--matmul-n", "64", "--cpu-kernels", "off", "--out", str(out)])
    report = json.loads(out.read_text())
    runners = [r["runner"] for r in report["results"]]
    assert runners.count("pytorch_cpu_kernels_off") == 1 and runners.count("pytorch") == 1
    assert chosen == ["off", "off"]  # the warm-up and the timed repeat
    assert report["machine"]["cpu_kernels"] == cpu_kernels.status()
    assert report["machine"]["cpu_kernels_isa"] == cpu_kernels.isa()
    assert report["command"].endswith("--cpu-kernels off --out " + str(out))
    assert out.with_suffix(".png").is_file()
