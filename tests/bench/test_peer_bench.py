"""bench/peer_bench.py without the authors' code: it names what is missing, and its summary is the medians."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_args  # noqa: E402
import peer_bench  # noqa: E402


def test_a_folder_that_is_not_the_authors_checkout_is_named(tmp_path: Path) -> None:
    with pytest.raises(bench_args.BenchInputError, match="not a checkout of huyunzhe/hyper-set"):
        peer_bench.load_peer(tmp_path, peer_bench.our_config())


def test_a_missing_package_of_the_authors_model_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sudoku").mkdir()
    (tmp_path / "sudoku" / "__init__.py").write_text("")
    (tmp_path / "sudoku" / "models.py").write_text("import a_package_that_is_not_installed\n")
    monkeypatch.setattr(sys, "path", sys.path[:])  # load_peer puts the checkout first
    try:
        with pytest.raises(bench_args.BenchInputError, match="needs 'a_package_that_is_not_installed': pip install"):
            peer_bench.load_peer(tmp_path, peer_bench.our_config())
    finally:
        sys.modules.pop("sudoku", None)


def test_summary_takes_medians_ratios_and_shares_of_the_roofline() -> None:
    times = {"ours_train": [2.0, 4.0, 3.0], "peer_train": [4.0, 4.0, 8.0],
             "ours_inference": [1.0, 1.0, 1.0], "peer_inference": [0.5, 0.5, 2.0]}
    roof = {"training": {"roofline_boards_per_s": 64.0}, "inference": {"roofline_boards_per_s": 128.0}}
    out = peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9})
    train, infer = out["training"], out["inference"]
    assert train["ours_boards_per_s"] == 64 / 3 and train["peer_boards_per_s"] == 16
    assert train["ratio_ours_to_peer"] == pytest.approx(4 / 3)
    assert train["best_ratio_ours_to_peer"] == pytest.approx(2.0)
    assert train["ours_share_of_roofline"] == pytest.approx(1 / 3)
    assert infer["ratio_ours_to_peer"] == pytest.approx(0.5) and infer["peer_gflop_per_s"] == pytest.approx(128)


def test_summary_gives_the_compiled_rows_their_own_ratios() -> None:
    times = {"ours_train": [2.0], "ours_compiled_train": [1.0], "ours_compiled_written_out_train": [8.0],
             "peer_train": [4.0], "ours_inference": [1.0], "ours_compiled_inference": [0.25],
             "ours_compiled_written_out_inference": [0.5], "peer_inference": [1.0]}
    roof = {"training": {"roofline_boards_per_s": 64.0}, "inference": {"roofline_boards_per_s": 128.0}}
    out = peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9})
    train, infer = out["training"], out["inference"]
    assert train["ratio_ours_to_peer"] == pytest.approx(2.0)
    assert train["ratio_ours_compiled_to_peer"] == pytest.approx(4.0)
    assert train["ours_compiled_share_of_roofline"] == pytest.approx(1.0)
    assert train["ratio_ours_compiled_written_out_to_peer"] == pytest.approx(0.5)
    assert infer["best_ratio_ours_compiled_to_peer"] == pytest.approx(4.0) and "ratio_peer_to_peer" not in infer
    assert infer["ours_compiled_written_out_boards_per_s"] == pytest.approx(128.0)


def test_summary_gives_the_written_out_row_and_the_least_work_share() -> None:
    times = {"ours_train": [1.0], "ours_written_out_train": [2.0], "peer_train": [3.0],
             "ours_inference": [1.0], "ours_written_out_inference": [1.0], "peer_inference": [2.0]}
    roof = {"training": {"roofline_boards_per_s": 64.0}, "inference": {"roofline_boards_per_s": 128.0}}
    least = {"training": {"roofline_boards_per_s": 128.0}, "inference": {"roofline_boards_per_s": 256.0}}
    out = peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9}, least)
    train = out["training"]
    assert train["ratio_ours_to_peer"] == pytest.approx(3.0)
    assert train["ratio_ours_written_out_to_peer"] == pytest.approx(1.5)
    assert train["ours_share_of_roofline"] == pytest.approx(1.0)
    assert train["ours_share_of_least_work_roofline"] == pytest.approx(0.5)
    assert train["least_work_roofline_boards_per_s"] == 128.0


def test_summary_without_a_roofline_gives_rates_and_ratios_only() -> None:
    """On a GPU no roofline is measured: the rows have boards/s and ratios, and no shares."""
    times = {"ours_train": [1.0], "peer_train": [2.0], "ours_inference": [1.0], "peer_inference": [1.0]}
    out = peer_bench.summarise(times, None, {"training": 3e9, "inference": 1e9})
    assert out["training"]["ratio_ours_to_peer"] == pytest.approx(2.0)
    assert not [k for row in out.values() for k in row if "roofline" in k]


def test_device_cuda_without_cuda_is_refused_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(bench_args.BenchInputError, match="sees no CUDA device"):
        peer_bench.run(tmp_path, rounds=1, threads=1, bf16=False, device="cuda")


def test_a_step_in_slices_has_the_batch_gradient() -> None:
    """The runners in slices accumulate the slices' losses weighted by their supervised cells: the gradient of the
    whole batch's mean loss (the same update), within float rounding."""
    x, y = peer_bench.batch()
    x, y = x[:8], y[:8]
    grads = []
    for slices in (1, 4):
        runner = peer_bench.Runner("ours", peer_bench.random_model(), False, slices=slices)
        runner.opt.step = lambda: None  # keep the gradients of the step, not its update
        runner.train(x, y)
        grads.append([p.grad.clone() for p in runner.model.parameters()])
    for a, b in zip(*grads):
        assert (a - b).abs().max().item() <= 1e-5 * max(a.abs().max().item(), 1e-3)
    shares = [float(s) for _, _, s in peer_bench.in_slices(x, y, 4)]
    assert sum(shares) == pytest.approx(1.0) and len(set(shares)) > 1  # weighted by cells, not by rows


def test_summary_skips_the_inference_rows_of_runners_in_slices() -> None:
    times = {"ours_compiled_sliced_train": [1.0], "peer_train": [2.0], "peer_sliced_train": [2.5],
             "peer_inference": [1.0]}
    out = peer_bench.summarise(times, None, {"training": 3e9, "inference": 1e9})
    assert out["training"]["ratio_ours_compiled_sliced_to_peer"] == pytest.approx(2.0)
    assert out["training"]["ratio_peer_sliced_to_peer"] == pytest.approx(0.8)
    assert "ours_compiled_sliced_boards_per_s" not in out["inference"]


def test_a_runner_with_another_cpu_matmul_library_steps_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    matmul = peer_bench.fused.matmul
    monkeypatch.setattr(peer_bench.fused, "matmul",
                        lambda a, b: seen.append(peer_bench.fused.cpu_matmul_library()) or matmul(a, b))
    before = peer_bench.fused.cpu_matmul_library()
    x, y = peer_bench.batch()
    runner = peer_bench.Runner("ours", peer_bench.random_model(), False, cpu_matmul="aten")
    runner.train(x[:2], y[:2])
    runner.infer(x[:2])
    assert seen and set(seen) == {"aten"} and peer_bench.fused.cpu_matmul_library() == before
    times = {"ours_train": [2.0], "ours_cpu_matmul_train": [2.5], "peer_train": [4.0],
             "ours_inference": [1.0], "ours_cpu_matmul_inference": [1.0], "peer_inference": [1.0]}
    out = peer_bench.summarise(times, None, {"training": 3e9, "inference": 1e9})
    assert out["training"]["ratio_ours_cpu_matmul_to_peer"] == pytest.approx(1.6)


def test_a_runner_with_the_maps_kernel_switched_steps_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    usable = peer_bench.hyperset_cpu_kernels.usable
    monkeypatch.setattr(peer_bench.hyperset_cpu_kernels, "usable",
                        lambda z: seen.append(peer_bench.hyperset_cpu_kernels._wanted) or usable(z))
    before = peer_bench.hyperset_cpu_kernels._wanted
    x, y = peer_bench.batch()
    runner = peer_bench.Runner("ours", peer_bench.random_model(), False, cpu_kernels="off")
    runner.train(x[:2], y[:2])
    assert seen and set(seen) == {False} and peer_bench.hyperset_cpu_kernels._wanted == before


def test_compiler_settings_reach_torch_compile_and_get_their_own_row(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    def fake_compile(model, **kwargs):
        seen.append(kwargs)
        return model

    monkeypatch.setattr(peer_bench.torch, "compile", fake_compile)
    model = peer_bench.random_model()
    peer_bench.Runner("ours", model, False, compiled=True)
    peer_bench.Runner("ours", model, False, compiled=True, compile_options={"max_autotune": True})
    assert seen == [{"options": None}, {"options": {"max_autotune": True}}]
    times = {"ours_compiled_train": [2.0], "ours_compiled_options_train": [1.0], "peer_train": [4.0],
             "ours_compiled_inference": [1.0], "ours_compiled_options_inference": [1.0], "peer_inference": [1.0]}
    out = peer_bench.summarise(times, None, {"training": 3e9, "inference": 1e9})
    assert out["training"]["ratio_ours_compiled_options_to_peer"] == pytest.approx(4.0)
    assert out["training"]["ratio_ours_compiled_to_peer"] == pytest.approx(2.0)


def test_the_goal_says_which_half_each_training_row_reaches() -> None:
    times = {"ours_train": [2.0], "ours_compiled_train": [1.0], "peer_train": [4.0],
             "ours_inference": [1.0], "peer_inference": [1.0]}
    roof = {"training": {"roofline_boards_per_s": 80.0}, "inference": {"roofline_boards_per_s": 128.0}}
    results = {"float32": peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9})}
    g = peer_bench.goal(results)
    # ours: 32 boards/s, 2x the authors' 16, 40% of the roofline; compiled: 64 boards/s, 4x, 80%
    assert g["ours"]["ratio_reached"] and not g["ours"]["share_reached"]
    assert g["ours"]["share_of_roofline"] == pytest.approx(0.4)
    assert g["ours_compiled"]["ratio_to_authors"] == pytest.approx(4.0) and not g["ours_compiled"]["share_reached"]
    roof["training"]["roofline_boards_per_s"] = 70.0  # 64 / 70 = 91%
    g = peer_bench.goal({"float32": peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9})})
    assert g["ours_compiled"]["share_reached"] and not g["ours"]["share_reached"]
    # another library's matmuls are faster on this CPU: its roofline is the one the share must reach
    other = {"library": "numpy 2, openblas", "float32": {"training": {"roofline_boards_per_s": 100.0}}}
    g = peer_bench.goal({"float32": peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9})}, other)
    assert g["cpu_roofline_boards_per_s"] == 100.0 and g["other_blas_roofline_boards_per_s"] == 100.0
    assert g["ours_compiled"]["share_of_roofline"] == pytest.approx(64 / 70)
    assert g["ours_compiled"]["share_of_cpu_roofline"] == pytest.approx(0.64)
    assert not g["ours_compiled"]["share_reached"]
    # each library faster at some shapes: the roofline at the best rate of either at each shape is higher still
    best = {"training": {"roofline_boards_per_s": 128.0}}
    g = peer_bench.goal({"float32": peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9})}, other,
                        best)
    assert g["cpu_roofline_boards_per_s"] == 128.0 and g["best_of_libraries_roofline_boards_per_s"] == 128.0
    assert g["ours_compiled"]["share_of_cpu_roofline"] == pytest.approx(0.5)
    # and where it is slower, PyTorch's stays the yardstick
    other["float32"]["training"]["roofline_boards_per_s"] = 50.0
    g = peer_bench.goal({"float32": peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9})}, other)
    assert g["cpu_roofline_boards_per_s"] == 70.0 and g["ours_compiled"]["share_reached"]
    # on a GPU (no roofline) there is no goal to hold the rows against
    assert peer_bench.goal({"float32": peer_bench.summarise(times, None, {"training": 3e9, "inference": 1e9})}) is None


def test_the_summary_prints_the_goal(capsys: pytest.CaptureFixture[str]) -> None:
    times = {"ours_train": [2.0], "peer_train": [4.0], "ours_inference": [1.0], "peer_inference": [1.0]}
    roof = {"training": {"roofline_boards_per_s": 80.0}, "inference": {"roofline_boards_per_s": 128.0}}
    results = {"float32": peer_bench.summarise(times, roof, {"training": 3e9, "inference": 1e9}, roof)}
    flop = {"training": 3e9, "inference": 1e9}
    rep = {"machine": {"cpu": "x", "threads": 1, "native_bf16": False, "load_average_1min_at_start": 0.0,
                       "load_average_1min_at_end": 0.0},
           "flops_per_board_model": {"configuration": flop, "least_work": flop}, "results": results,
           "goal": peer_bench.goal(results)}
    peer_bench.print_summary(rep)
    assert "goal, fp32 training: >= 1.3x the authors' and >= 85% of the roofline: ours 2.00x (reached), " \
           "40% (not reached)" in capsys.readouterr().out
    rep["goal"] = peer_bench.goal(results, {"library": "numpy 2, openblas",
                                            "float32": {"training": {"roofline_boards_per_s": 100.0}}})
    peer_bench.print_summary(rep)
    out = capsys.readouterr().out
    assert "float32 training roofline at numpy 2, openblas's rates: 100.0 boards/s (80.0 at PyTorch's); the goal's " \
           "share is of the highest, 100.0" in out
    assert "ours 2.00x (reached), 32% (not reached)" in out


def test_the_other_blas_roofline_is_left_out_where_numpy_cannot_run(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # as where numpy is not installed: the subprocess fails
    monkeypatch.setattr(peer_bench.flops.sys, "executable", "/bin/false")
    assert peer_bench.other_blas(peer_bench.our_config(), 1) is None
    out = capsys.readouterr().out
    assert "numpy's matmuls could not be timed" in out and "judged against PyTorch's roofline alone" in out
