"""bench/gpu_check.py without a GPU: it says so, exits 0 and leaves the committed results alone."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_check  # noqa: E402


def test_without_cuda_it_says_so_exits_0_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    assert "sees no CUDA device" in capsys.readouterr().out
    assert not out.exists()


def test_a_failing_check_is_recorded_and_named_not_raised() -> None:
    def broken() -> dict:
        raise RuntimeError("provider came up on the CPU")

    report = {"training_amp": {"sudoku-cpu": gpu_check._guarded(lambda: {"losses": [2.0, 1.0]})},
              "fused_fp32": gpu_check._guarded(lambda: {}),
              "trainer_amp": gpu_check._guarded(lambda: {}), "nccl": gpu_check._guarded(lambda: {"skipped": "1 GPU"}),
              "solver": gpu_check._guarded(lambda: {}), "onnx_cuda": gpu_check._guarded(broken)}
    assert report["onnx_cuda"]["error"] == "RuntimeError: provider came up on the CPU"
    assert gpu_check.failed(report) == ["onnx_cuda"]


@pytest.mark.slow
def test_the_fused_check_passes_on_the_cpu_and_names_a_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check the GPU run makes of hyperset.accel.fused, eager and compiled, run here on the CPU: the paths agree
    (the peer configuration at 4 iterations: the same code paths, a sixth of the graph to compile)."""
    import peer_bench

    config = peer_bench.our_config
    monkeypatch.setattr(peer_bench, "our_config", lambda: config().replace(iters=4))
    out = gpu_check.fused_check(torch.device("cpu"), batch=2, speed_batch=2, rounds=1)
    assert out["max_relative_difference"] <= 1e-4 and out["compiled_max_relative_difference"] <= 1e-4
    assert min(out[f"{k}_boards_per_s"] for k in ("fused", "written_out", "autocast", "compiled")) > 0


def test_the_fused_check_fails_when_the_paths_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyperset.accel import fused

    relu_descent = fused.relu_descent
    monkeypatch.setattr(fused, "relu_descent", lambda *a: relu_descent(*a) * 1.001)
    with pytest.raises(RuntimeError, match="differ on cpu"):
        gpu_check.fused_check(torch.device("cpu"), batch=2)


def test_only_replaces_the_named_checks_and_keeps_the_others(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`--only onnx_cuda` after a full run: the other results and the first run's record stay, the new run is added."""
    import json

    out = tmp_path / "gpu_check.json"
    first = {"solver": {"ok": True, "puzzles": 3}, "onnx_cuda": {"ok": False, "error": "came up on the CPU"},
             "runs": [{"command": "python bench/gpu_check.py", "checks": ["solver", "onnx_cuda"], "gpu": "X"}]}
    out.write_text(json.dumps(first))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "machine", lambda: {"gpu": "Y", "onnxruntime": "1.31.1"})
    monkeypatch.setattr(gpu_check, "run", lambda checks: {c: {"ok": True, "boards_per_s": 1.0} for c in checks})
    assert gpu_check.main(["--out", str(out), "--only", "onnx_cuda"]) == 0
    report = json.loads(out.read_text())
    assert report["solver"] == first["solver"] and report["onnx_cuda"]["ok"]
    assert [r["gpu"] for r in report["runs"]] == ["X", "Y"] and report["runs"][1]["checks"] == ["onnx_cuda"]
    monkeypatch.setattr(gpu_check, "run", lambda checks: {c: {"ok": False, "error": "e"} for c in checks})
    assert gpu_check.main(["--out", str(out), "--only", "solver", "onnx_cuda"]) == 1
    assert [r["gpu"] for r in json.loads(out.read_text())["runs"]] == ["Y"]  # every check of run X was replaced


@pytest.mark.slow
def test_the_solver_and_onnx_checks_run_with_the_cpu_in_both_places(tmp_path: Path) -> None:
    """The solver and ONNX checks, with the CPU standing in for CUDA: same boards, parity, a speed each."""
    solver = gpu_check.solver_check(("cpu", "cpu"))
    assert solver["same_boards_as_cpu"] and solver["cpu_valid"] == solver["puzzles"] > 0
    onnx = gpu_check.onnx_check(tmp_path, batch=4, devices=("cpu", "cpu"), loop_iters=20)
    depth = onnx["trained_iters"]
    for row in (f"unrolled_{depth}", f"loop_{depth}", "loop_20"):
        assert onnx[row]["cpu"]["provider"] == "CPUExecutionProvider" and onnx[row]["cpu"]["boards_per_s"] > 0
        assert onnx[row]["cpu"]["parity"]["prediction_agreement"] == 1.0
        assert onnx[row]["cpu"]["parity"]["max_abs_logits"] < 1e-3


@pytest.mark.slow
def test_the_solve_cli_check_compares_backends_and_names_the_provider() -> None:
    out = gpu_check.solve_cli_check(iters=20, runs=(("torch", "cpu"), ("onnx", "cpu")))
    assert out["torch_cpu"]["valid"] == out["torch_cpu"]["puzzles"] > 0
    assert out["onnx_cpu"]["backend"] == "onnxruntime (CPUExecutionProvider)"


@pytest.mark.slow
def test_the_compile_check_runs_the_trainer_both_ways_and_fails_when_losses_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled-trainer check on the CPU with a small model: both runs log, their losses agree; a compiled run
    whose losses drift from eager's fails the check."""
    data = gpu_check.sudoku_data(tmp_path)
    small = ("--set", "model.dim=32", "--set", "model.heads=2", "--set", "model.ff_hidden=64", "--set", "model.iters=2")
    out = gpu_check.compile_check(data, tmp_path / "a", device="cpu", steps=4, log_every=2, extra=small)
    assert len(out["eager"]["losses"]) == len(out["compiled"]["losses"]) == 2
    assert out["loss_max_abs_difference"] < 0.01 and out["compiled_over_eager"] > 0
    assert "--recipe sudoku-paper" in out["command"]
    run = gpu_check.trainer_run

    def drifting(data: Path, out: Path, **kw: object) -> dict:
        result = run(data, out, **kw)
        if "train.compile=true" in kw["args"]:
            result["log"] = [{**m, "loss": m["loss"] + 0.5} for m in result["log"]]
        return result

    monkeypatch.setattr(gpu_check, "trainer_run", drifting)
    failed = gpu_check._guarded(lambda: gpu_check.compile_check(data, tmp_path / "b", device="cpu", steps=4,
                                                                log_every=2, extra=(*small, "--set", "model.iters=1")))
    assert not failed["ok"] and failed["error"].startswith("CheckFailed: compiled losses differ from eager by 0.5")
    # the measurements that failed it stay in the report
    assert len(failed["eager"]["losses"]) == 2 and 0.49 < failed["loss_max_abs_difference"] < 0.51


@pytest.mark.slow
def test_the_cuda_graphs_depth_check_trains_a_drawn_depth_in_both_modes(tmp_path: Path) -> None:
    """On the CPU reduce-overhead compiles as the default mode does, so the two runs log the same losses; a graph
    per update is what the check's objective makes the trainer compile."""
    data = gpu_check.sudoku_data(tmp_path)
    small = ("--set", "model.dim=32", "--set", "model.heads=2", "--set", "model.ff_hidden=64", "--set", "model.iters=2",
             "--set", "objective.train_iters=[1,2]", "--set", "train.batch_size=8")
    out = gpu_check.cuda_graphs_depth_check(data, tmp_path / "d", device="cpu", steps=4, log_every=2, extra=small)
    assert len(out["compiled"]["losses"]) == len(out["compiled_cuda_graphs"]["losses"]) == 2
    assert out["loss_max_abs_difference"] < 1e-5 and out["cuda_graphs_over_compiled"] > 0
    assert "objective.train_iters=[4,8]" in out["command"] and "--recipe sudoku-cpu" in out["command"]


@pytest.mark.slow
def test_the_search_check_runs_with_the_cpu_standing_in_for_cuda() -> None:
    """The search check on the CPU with a small bucket: every batch and backend timed, every board checked, the
    model's FLOP/s against the measured matrix-product rates."""
    out = gpu_check.search_check("cpu", puzzles=8, batches=(4, 8), peak_n=256, bucket="3-10")
    assert [(r["backend"], r["batch_size"]) for r in out["runs"]] == [
        ("torch", 4), ("torch", 8), ("onnx", 4), ("onnx", 8)]
    assert all(r["solve_rate"] == 1.0 and r["reported_valid_but_invalid"] == 0 for r in out["runs"])
    assert set(out["matmul_flops_per_s"]) == {"float32", "bfloat16"}
    assert all(0 < r["share_of_matmul_rate"]["float32"] for r in out["runs"])
    assert out["best_puzzles_per_s"] == max(r["puzzles_per_s"] for r in out["runs"])
