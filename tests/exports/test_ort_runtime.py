"""Tests for hyperset.exports.runtime: runtime conflicts, the CUDA pre-check, provider choice and OrtSession."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hyperset.exports import runtime
from hyperset.exports.runtime import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    CudaProbe,
    OnnxModelError,
    OrtSession,
    ProviderError,
    RuntimeConflictError,
    check_single_runtime,
    choose_providers,
    cuda_usable,
    describe_runtime,
    expect_task,
    required_cuda_libraries,
)


def _fake_lookup(installed: dict[str, str]) -> Callable[[str], str]:
    """A stand-in for importlib.metadata.version over a fixed set of distributions."""

    def lookup(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    return lookup


def _probe(
    missing: Collection[str] = (),
    providers: Sequence[str] = (CUDA_PROVIDER, CPU_PROVIDER),
    loaded: list | None = None,
) -> CudaProbe:
    """A CudaProbe for an onnxruntime-gpu CUDA 13 build where the ``missing`` libraries cannot load."""
    loaded = [] if loaded is None else loaded

    def load(name: str) -> object:
        if name in missing:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        loaded.append(name)
        return object()

    return CudaProbe(
        available_providers=lambda: list(providers),
        load_library=load,
        preload=None,
        cuda_version="13.0",
        system="Linux",
    )


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    """Y = X + 1 with a dynamic batch and metadata task=sudoku."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "one"], ["Y"])],
        "tiny",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(np.ones(3, np.float32), "one")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    helper.set_model_props(model, {"task": "sudoku"})
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


# ---------------------------------------------------------------- runtime conflict


def test_both_runtimes_installed_is_a_conflict_with_the_fix() -> None:
    lookup = _fake_lookup({"onnxruntime": "1.31.1", "onnxruntime-gpu": "1.31.1"})
    with pytest.raises(RuntimeConflictError) as info:
        check_single_runtime(lookup)
    msg = str(info.value)
    assert "onnxruntime 1.31.1 and onnxruntime-gpu 1.31.1" in msg
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in msg
    assert "rm -rf" in msg and "onnxruntime" in msg
    assert "exactly one" in msg


@pytest.mark.parametrize("name", ["onnxruntime", "onnxruntime-gpu"])
def test_single_runtime_is_fine(name: str) -> None:
    assert check_single_runtime(_fake_lookup({name: "1.31.1"})) == name
    assert check_single_runtime(_fake_lookup({})) is None


def test_this_environment_has_exactly_one_runtime() -> None:
    assert check_single_runtime() in runtime.ORT_DISTRIBUTIONS


# ---------------------------------------------------------------- CUDA pre-check


def test_cuda_listed_but_driver_missing_is_not_usable() -> None:
    ok, reason = cuda_usable(_probe(missing={"libcuda.so.1", "libcublasLt.so.13"}))
    assert not ok
    assert reason.startswith("libcuda.so.1") and "driver" in reason


def test_first_missing_cuda_library_is_named() -> None:
    ok, reason = cuda_usable(_probe(missing={"libcublasLt.so.13", "libcudnn.so.9"}))
    assert not ok
    assert reason.startswith("libcublasLt.so.13") and "CUDA 13.0" in reason


def test_cuda_usable_when_everything_loads() -> None:
    loaded: list[str] = []
    ok, reason = cuda_usable(_probe(loaded=loaded))
    assert ok, reason
    assert loaded == [
        "libcuda.so.1",
        "libcudart.so.13",
        "libcublasLt.so.13",
        "libcublas.so.13",
        "libcurand.so.10",
        "libcudnn.so.9",
    ]


def test_build_without_cuda_provider_is_not_usable() -> None:
    ok, reason = cuda_usable(_probe(providers=("AzureExecutionProvider", CPU_PROVIDER)))
    assert not ok and "no CUDAExecutionProvider" in reason and "onnxruntime-gpu" in reason


def test_windows_library_names() -> None:
    names = [n for n, _ in required_cuda_libraries("12.4", system="Windows")]
    assert names[0] == "nvcuda.dll" and "cublasLt64_12.dll" in names and names[-1] == "cudnn64_9.dll"


def test_preload_output_is_silenced(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import onnxruntime

    monkeypatch.setattr(
        onnxruntime, "preload_dlls", lambda: print("Failed to load libcublasLt.so.13"), raising=False
    )
    runtime._silent_preload()
    assert capsys.readouterr() == ("", "")
    calls: list[int] = []
    probe = _probe(missing={"libcuda.so.1"})
    probe.preload = lambda: calls.append(1)
    cuda_usable(probe)
    assert calls == [1]  # preload runs before the libraries are probed


def test_real_result_is_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []

    def fake_default() -> CudaProbe:
        made.append(1)
        return _probe(missing={"libcuda.so.1"})

    monkeypatch.setattr(runtime, "_CUDA_CACHE", None)
    monkeypatch.setattr(CudaProbe, "default", staticmethod(fake_default))
    assert cuda_usable() == cuda_usable()
    assert made == [1]
    cuda_usable(refresh=True)
    assert made == [1, 1]


def test_this_machine_without_gpu_reports_why() -> None:
    ok, reason = cuda_usable()
    if ok:
        pytest.skip("this machine can really use CUDA")
    assert reason  # e.g. "libcuda.so.1 (NVIDIA driver) cannot be loaded: no NVIDIA GPU driver ..."


# ---------------------------------------------------------------- provider choice


def _unusable() -> tuple[bool, str]:
    return False, "libcuda.so.1 (NVIDIA driver) cannot be loaded"


def _usable() -> tuple[bool, str]:
    return True, "all CUDA libraries load"


def test_explicit_cuda_when_unusable_raises() -> None:
    with pytest.raises(ProviderError, match="libcuda.so.1"):
        choose_providers("cuda", cuda_check=_unusable)


def test_auto_falls_back_to_cpu_and_says_why() -> None:
    providers, reason = choose_providers("auto", cuda_check=_unusable)
    assert providers == [CPU_PROVIDER]
    assert "CUDA is not usable" in reason and "libcuda.so.1" in reason


def test_auto_and_cuda_pick_cuda_when_usable() -> None:
    assert choose_providers("auto", cuda_check=_usable)[0] == [CUDA_PROVIDER, CPU_PROVIDER]
    assert choose_providers("cuda", cuda_check=_usable)[0] == [CUDA_PROVIDER, CPU_PROVIDER]


def test_cpu_never_probes_cuda() -> None:
    def boom() -> tuple[bool, str]:
        raise AssertionError("CUDA probed for device='cpu'")

    assert choose_providers("cpu", cuda_check=boom) == ([CPU_PROVIDER], "CPU requested")
    with pytest.raises(ValueError, match="device"):
        choose_providers("gpu")  # type: ignore[arg-type]


# ---------------------------------------------------------------- sessions and model files


def test_session_reports_the_cpu_provider(tiny_model: Path) -> None:
    sess = OrtSession(tiny_model, "auto", cuda_check=_unusable, intra_op_threads=1)
    assert sess.provider == CPU_PROVIDER and sess.device == "cpu"
    assert "libcuda.so.1" in sess.reason and sess.fallback_reason is None
    assert sess.input_names == ["X"] and sess.output_names == ["Y"]
    assert sess.metadata == {"task": "sudoku"}
    sess.expect_task("sudoku")
    out = sess.run({"X": np.zeros((2, 3), np.float32)})
    np.testing.assert_array_equal(out["Y"], np.ones((2, 3), np.float32))
    assert sess.describe()["provider"] == CPU_PROVIDER
    with pytest.raises(ValueError, match="missing"):
        sess.run({"Z": np.zeros((2, 3), np.float32)})


def test_session_on_cpu_device(tiny_model: Path) -> None:
    sess = OrtSession(tiny_model, "cpu", graph_optimization_level="basic", intra_op_threads=1)
    assert (sess.provider, sess.device, sess.reason) == (CPU_PROVIDER, "cpu", "CPU requested")


def test_silent_ort_fallback_is_caught(tiny_model: Path) -> None:
    """Pretend the pre-check passed: ORT then really falls back to CPU on this machine, and we notice."""
    import onnxruntime

    if CUDA_PROVIDER not in onnxruntime.get_available_providers() or cuda_usable()[0]:
        pytest.skip("needs onnxruntime-gpu on a machine where CUDA cannot load")
    with pytest.raises(ProviderError, match="created the session on CPUExecutionProvider"):
        OrtSession(tiny_model, "cuda", cuda_check=_usable, intra_op_threads=1, log_severity=4)
    sess = OrtSession(tiny_model, "auto", cuda_check=_usable, intra_op_threads=1, log_severity=4)
    assert sess.provider == CPU_PROVIDER and sess.fallback_reason


def test_truncated_file_is_a_clear_error(tiny_model: Path, tmp_path: Path) -> None:
    data = tiny_model.read_bytes()
    for i, cut in enumerate([len(data) // 2, 0]):
        bad = tmp_path / f"bad{i}.onnx"
        bad.write_bytes(data[:cut])
        with pytest.raises(
            OnnxModelError, match=r"not a valid ONNX model \(truncated or corrupted\?\)"
        ) as info:
            OrtSession(bad, "cpu")
        assert str(bad) in str(info.value)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OnnxModelError, match="not found"):
        OrtSession(tmp_path / "nope.onnx", "cpu")


def test_expect_task() -> None:
    expect_task({"task": "sudoku"}, "sudoku")
    with pytest.raises(OnnxModelError) as info:
        expect_task({"task": "classify"}, "sudoku")
    assert str(info.value) == "model.onnx is a 'classify' model, expected 'sudoku'"
    with pytest.raises(OnnxModelError, match="no 'task' metadata"):
        expect_task({}, "sudoku", name="old.onnx")


def test_describe_runtime() -> None:
    info = describe_runtime()
    assert info["conflict"] is None
    assert CPU_PROVIDER in info["available_providers"]
    assert isinstance(info["cuda_usable"], bool) and info["cuda_reason"]
    assert info["onnxruntime_version"]
    assert "cuda_build_version" in info


@pytest.mark.parametrize("tf32", [False, True])
def test_cuda_is_asked_for_with_tf32_off_unless_wanted(tiny_model: Path, monkeypatch: pytest.MonkeyPatch,
                                                        tf32: bool) -> None:
    """ONNX Runtime's CUDA provider multiplies fp32 matrices in TF32 by default (the shipped model's logits moved
    by 0.1 on an H200); the session asks for full fp32 unless cuda_tf32=True. The CPU provider gets no options."""
    import onnxruntime

    asked = []

    def session(path: str, options: object, providers: list) -> None:
        asked.append(providers)
        raise RuntimeError("stop here")

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    with pytest.raises(OnnxModelError):
        OrtSession(tiny_model, "cuda", cuda_check=_usable, cuda_tf32=tf32)
    assert asked == [[(CUDA_PROVIDER, {"use_tf32": str(int(tf32))}), CPU_PROVIDER]]
    with pytest.raises(OnnxModelError):
        OrtSession(tiny_model, "cpu")
    assert asked[1] == [CPU_PROVIDER]


def test_a_level_this_runtime_lacks_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    import enum

    import onnxruntime

    class Levels(enum.IntEnum):  # onnxruntime 1.20's levels: no ORT_ENABLE_LAYOUT
        ORT_DISABLE_ALL = 0
        ORT_ENABLE_BASIC = 1
        ORT_ENABLE_EXTENDED = 2
        ORT_ENABLE_ALL = 99

    monkeypatch.setattr(onnxruntime, "GraphOptimizationLevel", Levels)
    with pytest.raises(ValueError, match="'layout' needs a newer onnxruntime than"):
        runtime._graph_opt_level("layout")
    with pytest.raises(ValueError, match="must be one of"):
        runtime._graph_opt_level("fastest")
    assert runtime._graph_opt_level("all") == Levels.ORT_ENABLE_ALL


def test_hyperset_solve_says_why_auto_left_the_gpu_of_onnxruntime_gpu_unused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # onnxruntime-gpu without its CUDA libraries: the run goes to the CPU, and the user is told why, once
    import json

    import onnxruntime
    from click.testing import CliRunner

    from hyperset.cli import solve_main
    monkeypatch.setenv("HYPERSET_CACHE_DIR", str(tmp_path / "cache"))
    why = "libcudnn.so.9 (cuDNN 9) cannot be loaded: not found"
    monkeypatch.setattr(runtime, "cuda_usable", lambda *a, **k: (False, why))
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CUDA_PROVIDER, CPU_PROVIDER])
    puzzle = tmp_path / "p.txt"
    puzzle.write_text("000014200500070300000590004058400001000000006003080090870060000420805017009047000\n")
    result = CliRunner().invoke(solve_main, [str(puzzle), "--backend", "onnx", "--iters", "16", "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("libcudnn.so.9") == 1
    json.loads(result.stdout)  # stdout stays one JSON document
