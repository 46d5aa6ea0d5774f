"""bench/gpu_check.py without a GPU: it says so, exits 0 and leaves the committed results alone."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
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


def test_the_fused_check_passes_on_the_cpu_and_names_a_difference() -> None:
    """The check the GPU run makes of hyperset.fused, run here on the CPU: the two paths agree."""
    out = gpu_check.fused_check(torch.device("cpu"), batch=2)
    assert out["max_relative_difference"] <= 1e-4 and out["fused_s"] > 0


def test_the_fused_check_fails_when_the_paths_disagree(monkeypatch: pytest.MonkeyPatch) -> None:
    from hyperset import fused

    relu_descent = fused.relu_descent
    monkeypatch.setattr(fused, "relu_descent", lambda *a: relu_descent(*a) * 1.001)
    with pytest.raises(RuntimeError, match="differ on cpu"):
        gpu_check.fused_check(torch.device("cpu"), batch=2)
