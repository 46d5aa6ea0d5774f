"""Model files received from someone else (a VQ tokenizer, VQGAN weights, an ONNX graph): a config or header
that describes an absurd model is refused before anything is allocated, and a graph that runs but does not give
what a solver's graph gives is a one-line error naming the file, never a traceback."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hyperset
from hyperset.pretrained import PRETRAINED, weights_root

BIN = Path(sys.executable).parent
EXAMPLE = Path(hyperset.__file__).parents[1] / "examples" / "medium.txt"
LIMIT = 4 * 2**30  # a loader that allocates more than this under test has failed to refuse first


def limited(cmd: list[str], timeout: int = 120) -> subprocess.CompletedProcess:
    """Run cmd with its address space capped, so that a loader that allocates before checking fails safely."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=cap, env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess, prog: str, name: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "frame #" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"{prog}: error: ") and name in proc.stderr, proc.stderr[-500:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]


def tokenizer_copy(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    folder = tmp_path / "tokenizer"
    shutil.copytree(weights_root() / "mim" / "tokenizer", folder)
    meta = json.loads((folder / "config.json").read_text())
    edit(meta)
    (folder / "config.json").write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["model"].update(hidden=60000), "model.hidden = 60000"),  # 115 GB if built
    (lambda m: m["model"].update(num_res_blocks=10**7), "model.num_res_blocks"),
    (lambda m: m["model"].update(hidden=-5), "model.hidden = -5"),
    (lambda m: m["model"].update(hidden="128"), "model.hidden"),
    (lambda m: m.update(data=[1]), "data = [1]: expected a table"),
    (lambda m: m["data"].update(image_size=10**9), "data.image_size"),
], ids=["hidden-60000", "res-blocks-1e7", "hidden-negative", "hidden-text", "data-list", "image-size-1e9"])
@pytest.mark.slow
def test_a_tokenizer_config_is_checked_before_the_model_is_built(tmp_path: Path, edit, message: str) -> None:
    folder = tokenizer_copy(tmp_path, edit)
    proc = limited([sys.executable, "-c", "import sys\nfrom hyperset.checkpoint import CheckpointError\n"
                    "from hyperset.vision.reconstruct import load_tokenizer\n"
                    "try:\n load_tokenizer(sys.argv[1])\nexcept CheckpointError as e:\n print(e); sys.exit(2)\n",
                    str(folder)])
    assert proc.returncode == 2 and "config.json" in proc.stdout and message in proc.stdout, proc.stderr[-1500:]


def test_the_shipped_tokenizer_still_loads() -> None:
    from hyperset.vision.reconstruct import load_tokenizer
    assert load_tokenizer(weights_root() / "mim" / "tokenizer").image_size == 32


@pytest.mark.slow
def test_vqgan_weights_are_checked_by_their_header_before_anything_is_read(tmp_path: Path) -> None:
    # a sparse file whose header claims one tensor of 8 GiB: the whole file used to be loaded before any check
    n = 8 * 2**28
    header = json.dumps({"encoder.conv_in.weight": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}})
    data = header.encode() + b" " * (-len(header) % 8)
    path = tmp_path / "vqgan.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(data)) + data)
        f.truncate(8 + len(data) + 4 * n)
    proc = limited([str(BIN / "hyperset-eval"), "mim", "--data", str(tmp_path), "--baseline", "most-frequent",
                    "--tokenizer", str(path), "--threads", "1"])
    assert_one_line_error(proc, "hyperset-eval mim", "vqgan.safetensors")


def _graph(path: Path, logits_nodes: list, meta: dict[str, str] | None = None) -> Path:
    """A Loop-shaped Sudoku graph (inputs tokens and iters, outputs logits and two energies) whose logits come
    from `logits_nodes` (over the tokens cast to float, "tf")."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    nodes = [h.make_node("Cast", ["tokens"], ["tf"], to=T.FLOAT),
             h.make_node("Constant", [], ["es"], value=nh.from_array(np.array([1, 1], np.int64))),
             h.make_node("ConstantOfShape", ["es"], ["energy_attn"], value=nh.from_array(np.zeros(1, np.float32))),
             h.make_node("Identity", ["energy_attn"], ["energy_ff"]), *logits_nodes]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("tokens", T.INT64, ["batch", 81]),
                                      h.make_tensor_value_info("iters", T.INT64, [])],
                         [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("logits", "energy_attn", "energy_ff")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in {"task": "sudoku", "graph": "loop", **(meta or {})}.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    onnx.save(model, str(path))
    return path


def _reshape(shape: list[int]) -> list:
    from onnx import helper as h
    from onnx import numpy_helper as nh
    return [h.make_node("Constant", [], ["rs"], value=nh.from_array(np.array(shape, np.int64))),
            h.make_node("Reshape", ["tf", "rs"], ["logits"])]


@pytest.mark.parametrize("shape, message", [
    ([-1, 81], "output logits is float32 of shape [1, 81]"),  # the solver read 133 cells from it
    ([-1, 7, 9], "ONNX Runtime failed to run the model"),  # 81 cells do not reshape to 7 x 9
], ids=["logits-2d", "reshape-fails"])
@pytest.mark.slow
def test_a_graph_that_runs_but_is_no_solvers_is_a_one_line_error(tmp_path: Path, shape: list[int],
                                                                  message: str) -> None:
    pytest.importorskip("onnxruntime")
    graph = _graph(tmp_path / "g.onnx", _reshape(shape))
    proc = limited([str(BIN / "hyperset-solve"), str(EXAMPLE), "--backend", "onnx", "--onnx-model", str(graph),
                    "--threads", "1", "--iters", "4", "--strategy", "single"])
    assert_one_line_error(proc, "hyperset-solve", "g.onnx")
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("meta, message", [
    ({"n_layers": str(10**9)}, "metadata n_layers"),  # the backend listed a billion step-graph paths
    ({"config": '{"dim": 12'}, "metadata config is not a valid model config"),
    ({"energies": "attn,bogus"}, "metadata energies"),
], ids=["n-layers-1e9", "config-not-json", "energies-unknown"])
@pytest.mark.slow
def test_graph_metadata_is_checked_when_the_graph_is_opened(tmp_path: Path, meta: dict[str, str],
                                                            message: str) -> None:
    pytest.importorskip("onnxruntime")
    graph = _graph(tmp_path / "g.onnx", _reshape([-1, 81, 1]), meta)
    proc = limited([str(BIN / "hyperset-solve"), str(EXAMPLE), "--backend", "onnx", "--onnx-model", str(graph),
                    "--threads", "1", "--iters", "auto"], timeout=60)
    assert_one_line_error(proc, "hyperset-solve", "g.onnx")
    assert message in proc.stderr, proc.stderr


# checkpoints that load (config and weights agree) but whose model is no 9x9 Sudoku model: each front end used to
# start and then fail with a traceback (a shape, a token id or a digit out of range) when it solved
NOT_SUDOKU = {"seq-len-80": ({"seq_len": 80}, "seq_len 80 (expected 81)"),
              "vocab-5": ({"vocab_size": 5}, "vocab_size 5 (expected 10)"),
              "classes-10": ({"num_classes": 10}, "num_classes 10 (expected 9)"),
              "classes-12": ({"num_classes": 12}, "num_classes 12 (expected 9)")}


@pytest.fixture(scope="module")
def not_sudoku(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    from hyperset.config import ModelConfig
    from hyperset.models import HyperSETModel, save_checkpoint

    root, out = tmp_path_factory.mktemp("not-sudoku"), {}
    for name, (sizes, _) in NOT_SUDOKU.items():
        torch.manual_seed(0)
        cfg = ModelConfig(task="sudoku", dim=16, heads=2, ff_hidden=32, iters=2, time_dim=8, **sizes)
        out[name] = save_checkpoint(root / name, HyperSETModel(cfg), {"trained_iterations": 2})
    return out


def _not_sudoku_message(name: str, folder: Path) -> str:
    return f"{folder}: not a 9x9 Sudoku model: {NOT_SUDOKU[name][1]}"


@pytest.mark.parametrize("name", NOT_SUDOKU)
def test_a_checkpoint_of_no_9x9_sudoku_model_is_refused_by_the_solver_api(not_sudoku: dict[str, Path],
                                                                          name: str) -> None:
    from hyperset.checkpoint import CheckpointError
    from hyperset.solve import Solver

    with pytest.raises(CheckpointError) as refused:
        Solver.load(not_sudoku[name], "cpu")
    assert str(refused.value) == _not_sudoku_message(name, not_sudoku[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", NOT_SUDOKU)
def test_a_checkpoint_of_no_9x9_sudoku_model_is_a_one_line_error_of_hyperset_solve(not_sudoku: dict[str, Path],
                                                                                   name: str) -> None:
    proc = limited([str(BIN / "hyperset-solve"), str(EXAMPLE), "--checkpoint", str(not_sudoku[name]),
                    "--threads", "1", "--strategy", "single"])
    assert_one_line_error(proc, "hyperset-solve", _not_sudoku_message(name, not_sudoku[name]))


@pytest.mark.parametrize("name", NOT_SUDOKU)
def test_a_checkpoint_of_no_9x9_sudoku_model_is_a_one_line_error_of_hyperset_eval_sudoku(
        not_sudoku: dict[str, Path], name: str, tmp_path: Path) -> None:
    from click.testing import CliRunner
    from conftest import write_sudoku_csvs

    from hyperset.training.evaluate import main as eval_main

    data = write_sudoku_csvs(tmp_path, 1, 4, seed=0)
    result = CliRunner().invoke(eval_main, ["sudoku", str(not_sudoku[name]), "--data", str(data), "--split",
                                            "valid", "--threads", "1"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert result.stderr == f"hyperset-eval sudoku: error: {_not_sudoku_message(name, not_sudoku[name])}\n"


@pytest.mark.parametrize("name", NOT_SUDOKU)
def test_a_checkpoint_of_no_9x9_sudoku_model_is_not_exported(not_sudoku: dict[str, Path], name: str,
                                                             tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from click.testing import CliRunner

    from hyperset.exports.cli import main as export_main

    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(export_main, [str(not_sudoku[name]), "--out", str(out), "--loop", "--parity",
                                              "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert result.stderr == f"hyperset-export: error: {_not_sudoku_message(name, not_sudoku[name])}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_app_refuses_a_checkpoint_of_no_9x9_sudoku_model_at_start(not_sudoku: dict[str, Path],
                                                                      capsys: pytest.CaptureFixture) -> None:
    from hyperset.apps.cli import load_models, options

    folder = not_sudoku["seq-len-80"]
    with pytest.raises(SystemExit) as stop:
        load_models(options(["--checkpoint", str(folder), "--device", "cpu"]))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("hyperset-app: error: ") and _not_sudoku_message("seq-len-80", folder) in err


def _shipped_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "sudoku"
    shutil.copytree(weights_root() / "sudoku", folder)
    return folder


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS caps the address space on Linux only")
def test_weights_sparse_extended_to_4_gib_are_refused_before_they_are_mapped(tmp_path: Path) -> None:
    # a valid header, its data region extended to 4 GiB without using the disk: safetensors mapped all of it, a
    # MemoryError under the cap
    folder = _shipped_copy(tmp_path)
    os.truncate(folder / "model.safetensors", 4 * 2**30)
    proc = limited([str(BIN / "hyperset-solve"), str(EXAMPLE), "--checkpoint", str(folder), "--threads", "1"])
    assert_one_line_error(proc, "hyperset-solve", "model.safetensors")
    assert "4,294,967,296 bytes, but its header declares" in proc.stderr and "MemoryError" not in proc.stderr


@pytest.mark.parametrize("change", [16, -16], ids=["padded", "truncated"])
def test_weights_whose_size_is_not_what_their_header_declares_are_refused(tmp_path: Path, change: int) -> None:
    from hyperset.checkpoint import CheckpointError, load_tensors
    from hyperset.models import load_checkpoint

    folder = _shipped_copy(tmp_path)
    path = folder / "model.safetensors"
    size = path.stat().st_size
    os.truncate(path, size + change)
    for load in (lambda: load_checkpoint(folder), lambda: load_tensors(path)):
        with pytest.raises(CheckpointError, match=f"{size + change:,} bytes, but its header declares {size:,} "
                                                  r"\(a truncated, padded or extended file\)"):
            load()


def test_weights_that_declare_more_than_the_cap_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    from hyperset.checkpoint import MAX_TENSOR_BYTES, CheckpointError, load_tensors

    n = (MAX_TENSOR_BYTES + 2**30) // 4  # 5 GiB
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}})
    data = header.encode() + b" " * (-len(header) % 8)
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(data)) + data)
        f.truncate(8 + len(data) + 4 * n)  # sparse: the size the header declares, on no disk
    with pytest.raises(CheckpointError, match=r"declares 5\.0 GiB of tensors; at most 4 GiB are read"):
        load_tensors(path)


def test_the_shipped_weights_still_load_as_safetensors_reads_them() -> None:
    import torch
    from safetensors.torch import load_file

    from hyperset.checkpoint import load_tensors
    from hyperset.solve import Solver

    path = weights_root() / "sudoku" / "model.safetensors"
    ours, theirs = load_tensors(path), load_file(str(path))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert Solver.load(None, "cpu").model.cfg.seq_len == 81


def _endless_loop() -> list:
    """Logits nodes behind a Loop with no trip count whose condition stays true: a run that never ends."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    carried = [("cond", T.BOOL, []), ("v", T.FLOAT, None)]
    body = h.make_graph([h.make_node("Identity", [n], [f"{n}_out"]) for n, _, _ in carried], "body",
                        [h.make_tensor_value_info("i", T.INT64, []),
                         *(h.make_tensor_value_info(n, t, shape) for n, t, shape in carried)],
                        [h.make_tensor_value_info(f"{n}_out", t, shape) for n, t, shape in carried])
    return [h.make_node("Constant", [], ["always"], value=nh.from_array(np.array(True))),
            h.make_node("Loop", ["", "always", "tf"], ["tf_end"], body=body),
            h.make_node("Constant", [], ["rs"], value=nh.from_array(np.array([-1, 81, 9], np.int64))),
            h.make_node("Reshape", ["tf_end", "rs"], ["logits"])]


def test_a_graph_run_that_does_not_end_is_stopped_at_its_bound(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import threading
    import time

    from hyperset.exports.runtime import OnnxModelError, OrtSession

    graph = _graph(tmp_path / "endless.onnx", _endless_loop())
    session = OrtSession(graph, "cpu", intra_op_threads=1, graph_seconds=1)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            session.run({"tokens": np.zeros((2, 81), np.int64), "iters": np.asarray(4, np.int64)})
        except OnnxModelError as e:
            outcome["error"] = str(e)

    start = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)  # a watchdog that fails leaves the thread, not the tests
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the run was not stopped"
    assert time.monotonic() - start < 10
    assert outcome["error"] == (f"{graph}: the graph ran longer than 1.0 s (a Loop that does not end?); "
                                "HYPERSET_GRAPH_SECONDS sets the bound")


@pytest.mark.slow
def test_a_graph_that_never_ends_is_a_one_line_error_of_hyperset_solve(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # the graph passes every check of the solver's (inputs, outputs, metadata): it is stopped when it runs
    pytest.importorskip("onnxruntime")
    graph = _graph(tmp_path / "endless.onnx", _endless_loop())
    monkeypatch.setenv("HYPERSET_GRAPH_SECONDS", "2")
    proc = limited([str(BIN / "hyperset-solve"), str(EXAMPLE), "--backend", "onnx", "--onnx-model", str(graph),
                    "--threads", "1", "--iters", "4", "--strategy", "single"], timeout=60)
    assert_one_line_error(proc, "hyperset-solve", "endless.onnx")
    assert "the graph ran longer than 2.0 s (a Loop that does not end?)" in proc.stderr, proc.stderr


def test_the_bound_of_a_graph_run_grows_with_its_rows_and_iterations(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnxruntime")
    from hyperset.exports.runtime import GRAPH_SECONDS, SECONDS_PER_ROW_ITERATION, OrtSession

    graph = _graph(tmp_path / "g.onnx", _reshape([-1, 81, 1]), {"n_layers": "2"})
    monkeypatch.delenv("HYPERSET_GRAPH_SECONDS", raising=False)
    feeds = {"tokens": np.zeros((8, 81), np.int64), "iters": np.asarray(64, np.int64)}
    assert OrtSession(graph, "cpu").run_seconds(feeds) == GRAPH_SECONDS + SECONDS_PER_ROW_ITERATION * 8 * 64 * 2
    monkeypatch.setenv("HYPERSET_GRAPH_SECONDS", "30")
    assert OrtSession(graph, "cpu").run_seconds(feeds) == 30
    assert OrtSession(graph, "cpu", graph_seconds=5).run_seconds(feeds) == 5
    for bad in ("0", "-1", "nan", "soon"):
        monkeypatch.setenv("HYPERSET_GRAPH_SECONDS", bad)
        with pytest.raises(ValueError, match=f"HYPERSET_GRAPH_SECONDS = '{bad}': expected a number of seconds > 0"):
            OrtSession(graph, "cpu")


def test_every_preset_and_shipped_model_fits_its_tasks_contract_and_other_sizes_do_not() -> None:
    from hyperset.checkpoint import CheckpointError, read_config
    from hyperset.config import ModelConfig, list_presets, preset_config
    from hyperset.contracts import check_contract, contract_problems

    assert all(contract_problems(preset_config(name)) == [] for name in list_presets())
    for name in ("sudoku", "classifier", "mim"):
        meta = read_config(weights_root() / PRETRAINED[name])
        assert contract_problems(ModelConfig.from_dict(meta["model"])) == []
    for cfg, message in [
        (preset_config("mim-cpu-small", vocab_size=512), "not a masked token model: vocab_size 512 (expected "
                                                         "num_classes + 1 = 513: the codes and the mask id)"),
        (preset_config("mim-cpu-small", seq_len=80, pos="learned"),
         "not a masked token model: seq_len 80 (expected a square grid of codes)"),
        (preset_config("cifar10-cpu", num_classes=1), "not an image classifier: num_classes 1 (expected at least 2)"),
    ]:
        with pytest.raises(CheckpointError, match=re.escape(f"ckpt: {message}")):
            check_contract(cfg, "ckpt")
