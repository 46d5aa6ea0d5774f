"""Model files received from someone else (a VQ tokenizer, VQGAN weights, an ONNX graph): a config or header
that describes an absurd model is refused before anything is allocated, and a graph that runs but does not give
what a solver's graph gives is a one-line error naming the file, never a traceback."""

from __future__ import annotations

import json
import os
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
from hyperset.pretrained import weights_root

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
def test_graph_metadata_is_checked_when_the_graph_is_opened(tmp_path: Path, meta: dict[str, str],
                                                            message: str) -> None:
    pytest.importorskip("onnxruntime")
    graph = _graph(tmp_path / "g.onnx", _reshape([-1, 81, 1]), meta)
    proc = limited([str(BIN / "hyperset-solve"), str(EXAMPLE), "--backend", "onnx", "--onnx-model", str(graph),
                    "--threads", "1", "--iters", "auto"], timeout=60)
    assert_one_line_error(proc, "hyperset-solve", "g.onnx")
    assert message in proc.stderr, proc.stderr
