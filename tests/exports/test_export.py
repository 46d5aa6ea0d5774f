"""ONNX export: unrolled, Loop and step graphs of every task model and baseline layer, checked against PyTorch.

Tiny models (d=16..32, 2 iterations) keep the exports under a second each. Parity is checked at the trained
depth and at 2x, at a batch size other than the export's (dynamic batch axis), in ONNX Runtime on the CPU.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import numpy_helper

from hyperset.config import ModelConfig
from hyperset.exports import export as E
from hyperset.exports.runtime import OnnxModelError, OrtSession
from hyperset.exports.solver_backend import OnnxSolverBackend, attach_onnx_backend  # also registers the "onnx" backend
from hyperset.models import HyperSETModel, load_checkpoint, save_checkpoint
from hyperset.solve import Solver

T = 2  # trained depth of every tiny model
TOL = 1e-4


def _cfg(task: str, **kw) -> ModelConfig:
    base = dict(task=task, dim=32, heads=2, ff_hidden=48, iters=T, time_dim=16, step_init=0.1, emb_dropout=0.0)
    if task == "sudoku":
        base.update(pos="grid")
    if task == "classify":
        base.update(img_size=8, patch_grid=2, num_classes=5, pos="sincos1d", step_cond="xt", step_norm="cond",
                    head_norm="layer", head_bias=True)
    if task == "mim":
        base.update(vocab_size=17, num_classes=16, seq_len=16, pos="sincos2d", time_mlp=False, time_dim=32,
                    step_norm="sum", head_bias=True)
    base.update(kw)
    return ModelConfig(**base)


CONFIGS = {
    "sudoku": _cfg("sudoku"),
    "classify": _cfg("classify"),
    "mim": _cfg("mim"),
    "sudoku-lora-2layers": _cfg("sudoku", lora_rank=2, n_layers=2),
    # the authors' dead time network (L2's weight zero): the Loop graph makes the step sizes once
    "sudoku-dead-time": _cfg("sudoku", time_init="zero"),
    "sudoku-dead-time-2layers": _cfg("sudoku", time_init="zero", n_layers=2),
    "sudoku-transformer": _cfg("sudoku", layer="transformer"),
    "classify-crate": _cfg("classify", layer="crate", stem="linear"),
    "classify-crate-t": _cfg("classify", layer="crate-t", stem="linear"),
    "sudoku-et": _cfg("sudoku", layer="et"),
    # the step-length control: every iteration's update halved until the energy does not rise
    "mim-backtrack": _cfg("mim", step_control="backtrack", step_init=0.5),
    # the same from the second iteration on (the Loop's counter decides in the graph)
    "sudoku-backtrack-from-2": _cfg("sudoku", step_control="backtrack", backtrack_from=2, step_init=0.5),
}


def _model(cfg: ModelConfig, seed: int = 0) -> HyperSETModel:
    """A model whose every parameter is perturbed, so the step-size network and t really matter."""
    torch.manual_seed(seed)
    model = HyperSETModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        if cfg.time_init == "zero" and cfg.time_mlp:
            model.core.step_sizes.L2.weight.zero_()  # c_t = L2's bias at every t
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Each model exported unrolled at T and 2T, and as a Loop graph with its stem/step/head files."""
    root = tmp_path_factory.mktemp("onnx")
    out = {}
    for name, cfg in CONFIGS.items():
        model = _model(cfg)
        out[name] = {
            "model": model,
            "unrolled": {k: E.export_unrolled(model, k, root / f"{name}.u{k}.onnx") for k in (T, 2 * T)},
            "loop": E.export_loop(model, root / f"{name}.onnx", write_steps=True),
        }
    return out


def _session(path: str | Path) -> OrtSession:
    return OrtSession(path, "cpu", intra_op_threads=1)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_parity_unrolled_loop_torch(exported: dict, name: str) -> None:
    entry = exported[name]
    model = entry["model"]
    loop = _session(entry["loop"].path)
    inputs = E.example_inputs(model.cfg, batch=3, seed=1)
    for k in (T, 2 * T):
        ref = E.torch_outputs(model, inputs, k)
        unrolled = E.onnx_outputs(_session(entry["unrolled"][k].path), inputs)
        looped = E.onnx_outputs(loop, inputs, k)
        n_steps = k * model.cfg.n_layers
        for got in (unrolled, looped):
            assert got["logits"].shape == ref["logits"].shape
            assert got["energy_attn"].shape == got["energy_ff"].shape == (n_steps, 3)
            numbers = E.compare(ref, got)
            assert numbers["prediction_agreement"] == 1.0, numbers
            assert numbers["max_abs_logits"] < TOL, numbers
            assert numbers["max_rel_energy"] < TOL, numbers
        both = E.compare(unrolled, looped)
        assert both["prediction_agreement"] == 1.0 and both["max_abs_logits"] < TOL, both
    if model.cfg.layer in ("transformer", "crate", "crate-t"):
        assert not looped["energy_attn"].any() and not looped["energy_ff"].any()
    else:
        assert np.abs(looped["energy_attn"]).min() > 0


@pytest.mark.parametrize("name", list(CONFIGS))
def test_loop_body_makes_step_sizes_once_and_carries_projections_where_it_can(exported: dict, name: str) -> None:
    """Step sizes that do not depend on t are made before the Loop (no step-size product in its body); a single
    Hyper-SET layer without LoRA carries its head projections as a second Loop state."""
    model = exported[name]["model"]
    cfg = model.cfg
    hoisted = cfg.layer == "hyperset" and cfg.time_init == "zero" and cfg.time_mlp
    carried = cfg.layer == "hyperset" and cfg.n_layers == 1 and cfg.lora_rank == 0 and cfg.step_control == "none"
    assert (E._hoistable(model), E._carries(model)) == (hoisted, carried)
    graph = onnx.load(exported[name]["loop"].path).graph
    loops = [n for n in graph.node if n.op_type == "Loop"]
    assert len(loops) == cfg.n_layers
    for loop in loops:
        assert len(loop.input) == 2 + 1 + carried  # trip count, condition, x (and zh)
        body = loop.attribute[0].g
        products = [n for n in body.node if n.op_type in ("MatMul", "Gemm")]
        weights = {i for n in products for i in n.input}
        assert any("L3" in w for w in weights) == (not hoisted and cfg.layer == "hyperset" and cfg.step == "adaptive")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_metadata_and_full_check(exported: dict, name: str) -> None:
    entry = exported[name]
    cfg = entry["model"].cfg
    for result in (entry["unrolled"][2 * T], entry["loop"]):
        E.check_model(result.path)
        model = onnx.load(result.path)
        assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
        assert {o.opset_import[0].version for o in [model]} == {E.DEFAULT_OPSET}
        meta = E.read_metadata(result.path)
        assert meta["task"] == cfg.task and meta["graph"] == result.kind
        assert meta["trained_iterations"] == str(T)
        assert meta["unrolled_iterations"] == (str(2 * T) if result.kind == "unrolled" else "loop")
        assert ModelConfig.from_dict(json.loads(meta["config"])) == cfg
        assert meta["hyperset_version"] and meta["exporter"].startswith("torch.onnx legacy")
        assert meta["energies"] == ("" if cfg.layer in ("transformer", "crate", "crate-t") else "attn,ff")
        assert meta["model_sha256"] == E.model_fingerprint(entry["model"])
        inputs = [i.name for i in model.graph.input]
        expected = [E.input_name(cfg.task)] + (["iters"] if result.kind == "loop" else [])
        assert inputs == expected
        assert [o.name for o in model.graph.output] == ["logits", "energy_attn", "energy_ff"]


def test_loop_runs_any_iteration_count_from_one_file(exported: dict) -> None:
    entry = exported["sudoku"]
    model, sess = entry["model"], _session(entry["loop"].path)
    inputs = E.example_inputs(model.cfg, batch=1, seed=2)  # batch 1: the export used 2
    for k in (0, 1, 3, 7, 12):
        got = E.onnx_outputs(sess, inputs, k)
        ref = E.torch_outputs(model, inputs, k)
        assert got["energy_attn"].shape == (k, 1)
        numbers = E.compare(ref, got)
        assert numbers["prediction_agreement"] == 1.0 and numbers["max_abs_logits"] < TOL, (k, numbers)
    report = E.parity(model, entry["loop"].path, 5, batch=4, session=sess)
    assert report.ok and report.provider == "CPUExecutionProvider"


@pytest.mark.parametrize("name", ["sudoku", "sudoku-lora-2layers", "sudoku-et"])
def test_step_graphs_match_torch_iteration_by_iteration(exported: dict, name: str) -> None:
    entry = exported[name]
    model = entry["model"]
    paths = E.step_paths(entry["loop"].path, model.cfg.n_layers)
    assert sorted(entry["loop"].extra_files) == sorted(map(str, [*paths["step"], paths["stem"], paths["head"]]))
    stem, head = _session(paths["stem"]), _session(paths["head"])
    steps = [_session(p) for p in paths["step"]]
    assert E.read_metadata(paths["step"][0])["graph"] == "step"
    assert steps[0].input_names == ["x", "x0", "t"]
    inputs = E.example_inputs(model.cfg, batch=2, seed=3)
    iters = 2 * T + 1  # past the trained depth: the LoRA adapter index is clamped in the graph
    with torch.no_grad():
        x0 = model.stem(inputs)
        ref = [(t, model.readout(x), layer.energy(x, t)) for layer, t, x in model.core.iterate(x0, iters)]
    got = list(E.iterate_steps(stem, steps, head, inputs, iters))
    assert len(got) == len(ref) == iters * model.cfg.n_layers
    for (t, logits, energy), (_, t2, logits2, energy2) in zip(ref, got):
        assert t == t2
        np.testing.assert_allclose(logits2, logits.numpy(), atol=TOL)
        for k in ("attn", "ff"):
            np.testing.assert_allclose(energy2[k], energy[k].numpy(), rtol=TOL, atol=TOL)


def test_onnx_backend_runs_the_rows_sent_to_it_as_the_torch_backend_does(exported: dict) -> None:
    """The solver drops finished boards mid-pass by sending the rows to keep; ONNX Runtime's step graphs then run
    those rows only, with the same numbers as torch."""
    from hyperset.backends import TorchBackend

    entry = exported["sudoku"]
    model = entry["model"]
    onnx_backend = OnnxSolverBackend(_session(entry["loop"].path), model=model)
    boards = E.example_inputs(model.cfg, batch=3, seed=4)
    keep = {2: torch.tensor([2, 0]), 4: torch.tensor([1])}  # after iteration 2 rows 2 and 0; after 4 the old row 0
    runs = []
    for backend in (TorchBackend(model, "cpu"), onnx_backend):
        steps, got, sent = backend.iterate(boards, 6), [], None
        for _ in range(6):
            out = steps.send(sent)
            got.append(out)
            sent = keep.get(out.t)
        runs.append(got)
    assert [len(s.logits) for s in runs[1]] == [3, 3, 2, 2, 1, 1]
    for a, b in zip(*runs):
        assert a.t == b.t
        np.testing.assert_allclose(b.logits.numpy(), a.logits.numpy(), atol=TOL)
        for k in ("attn", "ff"):
            np.testing.assert_allclose(b.energies[k].numpy(), a.energies[k].numpy(), rtol=TOL, atol=TOL)
    with torch.no_grad():  # the last row kept is board 0, run alone
        alone = model(boards[:1], 6)
    np.testing.assert_allclose(runs[1][-1].logits.numpy(), alone.numpy(), atol=TOL)


def test_onnx_backend_runs_a_batch_in_slices_of_rows_with_the_numbers_of_one_call(exported: dict) -> None:
    """On a CPU the backend runs the graphs a few boards at a time (activations in cache); the logits and the
    (T, B) energies of a pass, and every step of a pass read per iteration, are those of the whole batch at once."""
    entry = exported["sudoku"]
    whole = OnnxSolverBackend(_session(entry["loop"].path), model=entry["model"])
    sliced = OnnxSolverBackend(_session(entry["loop"].path), model=entry["model"])
    assert whole.rows >= 1  # a CPU session slices by default
    whole.rows, sliced.rows = 0, 2
    boards = E.example_inputs(entry["model"].cfg, batch=5, seed=7)
    (la, ea), (lb, eb) = whole.run(boards, 4), sliced.run(boards, 4)
    np.testing.assert_allclose(lb.numpy(), la.numpy(), atol=1e-5)
    for k in ("attn", "ff"):
        assert eb[k].shape == ea[k].shape == (4, 5)
        np.testing.assert_allclose(eb[k].numpy(), ea[k].numpy(), rtol=1e-5, atol=1e-5)
    for a, b in zip(whole.iterate(boards, 3), sliced.iterate(boards, 3)):
        np.testing.assert_allclose(b.logits.numpy(), a.logits.numpy(), atol=1e-5)
        np.testing.assert_allclose(b.energies["attn"].numpy(), a.energies["attn"].numpy(), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------------
# Solver backend and CLIs
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ckpt") / "sudoku-tiny"
    save_checkpoint(path, _model(CONFIGS["sudoku"], seed=4), {"trained_iterations": T, "recipe": "test"})
    return path


PUZZLES = [
    "800000001040005020000000090100309000000000500007000306430010000005620000020083005",
    "135980460060000020080400003000003000508004071000010940900620010000000090820150730",
    "000000000000003085001020000000507000004000100090000000500000073002010000000040009",
]


def test_solver_backend_refuses_bad_files(exported: dict, tmp_path: Path, tiny_checkpoint: Path) -> None:
    solver = Solver.load(tiny_checkpoint, "cpu")
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x08\x07garbage, not a protobuf" * 20)
    with pytest.raises(OnnxModelError, match="not a valid ONNX model"):
        attach_onnx_backend(solver, bad, "cpu")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(Path(exported["sudoku"]["loop"].path).read_bytes()[:5000])
    with pytest.raises(OnnxModelError):
        attach_onnx_backend(solver, truncated, "cpu")
    with pytest.raises(OnnxModelError, match="is a 'classify' model, expected 'sudoku'"):
        attach_onnx_backend(solver, exported["classify"]["loop"].path, "cpu")
    with pytest.raises(OnnxModelError, match="'step' graph"):
        attach_onnx_backend(solver, E.step_paths(exported["sudoku"]["loop"].path)["step"][0], "cpu")
    with pytest.raises(OnnxModelError, match="not found"):
        attach_onnx_backend(solver, tmp_path / "missing.onnx", "cpu")
    assert solver.backend is None


def test_solver_backend_unrolled_and_transformer(exported: dict) -> None:
    boards = torch.tensor([[int(c) for c in p] for p in PUZZLES])
    entry = exported["sudoku-transformer"]
    backend = OnnxSolverBackend(_session(entry["loop"].path))
    logits, energy = backend(boards, 3)
    assert logits.shape == (3, 81, 9) and energy == {}  # no energy defined: like the torch path
    assert backend.name == "onnxruntime (CPUExecutionProvider)" and backend.device_name.startswith("cpu")
    unrolled = OnnxSolverBackend(_session(exported["sudoku"]["unrolled"][T].path))
    logits, energy = unrolled(boards, T)
    assert energy["attn"].shape == (T, 3)
    with pytest.raises(OnnxModelError, match="unrolled for 2 iterations"):
        unrolled(boards, 5)


def test_a_graph_unrolled_past_the_trained_depth_runs_at_its_own_count_by_default(exported: dict) -> None:
    # the solver's default was the trained depth, which such a graph refuses: --iters had to repeat the count
    entry = exported["sudoku"]
    model = entry["model"]
    solver = Solver(model, torch.device("cpu"), {"trained_iterations": T})
    solver = solver.with_backend(OnnxSolverBackend(_session(entry["unrolled"][2 * T].path)))
    assert solver.default_iters == 2 * T
    solver.check_iters(None)
    (result,) = solver.solve([PUZZLES[0]], strategy="single")
    assert result.iterations == 2 * T


def _solve(args: list[str]) -> tuple[int, dict]:
    from hyperset.cli import solve_main

    result = CliRunner().invoke(solve_main, args)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def test_hyperset_solve_onnx_backend_matches_torch(tiny_checkpoint: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERSET_CACHE_DIR", str(tmp_path / "cache"))
    puzzles = tmp_path / "puzzles.txt"
    puzzles.write_text("\n".join(PUZZLES) + "\n")
    common = [str(puzzles), "--checkpoint", str(tiny_checkpoint), "--json", "--device", "cpu", "--strategy", "commit"]
    runs = {}
    for iters in ("2", "5"):
        runs["torch", iters] = _solve([*common, "--iters", iters])
        runs["onnx", iters] = _solve([*common, "--iters", iters, "--backend", "onnx"])  # exports to the cache
        assert runs["onnx", iters][1]["summary"]["backend"] == "onnxruntime (CPUExecutionProvider)"
        for a, b in zip(runs["torch", iters][1]["results"], runs["onnx", iters][1]["results"]):
            assert a["prediction"] == b["prediction"]
            assert a["passes"] == b["passes"] and a["iterations"] == b["iterations"] == int(iters) * a["passes"]
            np.testing.assert_allclose(a["energy"]["attn"], b["energy"]["attn"], rtol=1e-5)
            np.testing.assert_allclose(a["energy"]["ff"], b["energy"]["ff"], rtol=1e-5)
        assert runs["torch", iters][0] == runs["onnx", iters][0]
    cached = list((tmp_path / "cache").glob("sudoku-*.onnx"))
    assert len(cached) == 1  # exported once, reused for the second iteration count
    # an explicit file, written by hyperset-export, gives the same boards
    from hyperset.exports.cli import main as export_main

    out = tmp_path / "exp" / "model.onnx"
    out.parent.mkdir()  # hyperset-export creates no folders
    result = CliRunner().invoke(export_main, [str(tiny_checkpoint), "--out", str(out), "--loop", "--json"])
    assert result.exit_code == 0, result.output
    _, explicit = _solve([*common, "--iters", "5", "--backend", "onnx", "--onnx-model", str(out)])
    assert [r["prediction"] for r in explicit["results"]] == [r["prediction"] for r in runs["torch", "5"][1]["results"]]
    # a corrupted ONNX file through the CLI: exit 2, one line
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx file")
    from hyperset.cli import solve_main

    result = CliRunner().invoke(solve_main, [*common, "--backend", "onnx", "--onnx-model", str(bad)])
    assert result.exit_code == 2
    assert "not a valid ONNX model" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_hyperset_export_cli(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from hyperset.exports.cli import main as export_main

    runner = CliRunner()
    out = tmp_path / "m.onnx"
    result = runner.invoke(export_main, [str(tiny_checkpoint), "--iters", "3", "--out", str(out), "--parity",
                                         "--parity-batch", "2", "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["kind"] == "unrolled" and payload["iterations"] == 3 and payload["bytes"] == out.stat().st_size
    assert [p["iters"] for p in payload["parity"]] == [3] and payload["parity"][0]["ok"]
    assert payload["parity"][0]["provider"] == "CPUExecutionProvider"
    result = runner.invoke(export_main, [str(tiny_checkpoint), "--out", str(tmp_path / "l.onnx"), "--loop",
                                         "--parity", "--parity-batch", "2", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "Loop graph" in result.stdout and "l.step.onnx" in result.stdout and "MISMATCH" not in result.stdout
    assert [line.strip().split(":")[0] for line in result.stdout.splitlines() if "-> OK" in line] == [
        "iters   2", "iters   4"]
    assert (tmp_path / "l.step.onnx").is_file() and E.read_metadata(tmp_path / "l.onnx")["default_iterations"] == "2"
    # bad input: exit 2 with a one-line error
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tiny_checkpoint / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    for args in ([str(tmp_path / "nope"), "--out", str(out)], [str(broken), "--out", str(out)]):
        result = runner.invoke(export_main, args)
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("hyperset-export: error: ") and len(result.stderr.strip().splitlines()) == 1


def test_hyperset_solve_onnx_refuses_what_the_graph_cannot_run_before_solving(tiny_checkpoint: Path,
                                                                              tmp_path: Path) -> None:
    """An unrolled graph runs only its own count; 'auto' needs every iteration (torch only): exit 2, no traceback."""
    from hyperset.cli import solve_main

    model, _ = load_checkpoint(tiny_checkpoint)
    unrolled = E.export_unrolled(model, T, tmp_path / "u.onnx").path
    (tmp_path / "p.txt").write_text(PUZZLES[0] + "\n")
    common = [str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--backend", "onnx",
              "--onnx-model", str(unrolled), "--json"]
    for iters, expected in (("5", "unrolled for 2 iterations and cannot run 5"), ("auto", "torch backend only")):
        result = CliRunner().invoke(solve_main, [*common, "--iters", iters])
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert result.stderr.startswith("hyperset-solve: error: ") and expected in result.stderr
    solver = Solver.load(tiny_checkpoint, "cpu")
    attach_onnx_backend(solver, unrolled, "cpu")
    with pytest.raises(ValueError, match="torch backend only"):
        solver.solve(PUZZLES, strategy="auto")
    assert _solve([*common, "--iters", str(T)])[1]["summary"]["puzzles"] == 1


def test_hyperset_export_write_error_names_the_output_file(tiny_checkpoint: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from hyperset.exports.cli import main as export_main

    real = tempfile.mkstemp

    def disk_full(*args: object, **kwargs: object) -> object:
        if str(kwargs.get("prefix", "")).startswith(".hyperset-probe"):  # the check before work: a file may be made
            return real(*args, **kwargs)  # type: ignore[arg-type]
        raise OSError(28, "No space left on device", str(tmp_path / ".m.onnx.abc123.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", disk_full)
    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(export_main, [str(tiny_checkpoint), "--iters", "1", "--out", str(out), "--no-check"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"hyperset-export: error: cannot write {out}: No space left on device"


def test_graph_builders_trace_a_cpu_copy_of_a_model_whose_weights_are_elsewhere(monkeypatch):
    """A model on a GPU is exported from a CPU copy (tracing it in place mixed CUDA weights with CPU example inputs:
    `hyperset-solve --backend onnx --device cuda` failed). Here the model claims to live on CUDA: a builder that
    traced it in place would move the example inputs there and fail on this CPU-only machine; the graphs equal
    those of the model on the CPU."""
    model = _model(CONFIGS["sudoku-dead-time"])
    where = E._model_device
    monkeypatch.setattr(E, "_model_device", lambda m: torch.device("cuda") if m is model else where(m))
    elsewhere = {"unrolled": E.unrolled_proto(model, T), "loop": E.loop_proto(model)}
    monkeypatch.setattr(E, "_model_device", where)
    here = {"unrolled": E.unrolled_proto(model, T), "loop": E.loop_proto(model)}
    for kind in here:
        assert elsewhere[kind].graph == here[kind].graph, kind


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_loop_graph_stores_each_weight_once(exported: dict, name: str) -> None:
    """The stem, the prologue, every layer's body and the head used to keep their own copy of the weights they share
    (the shipped Sudoku graph held its projection twice, a two-layer model its step-size network per layer)."""
    import hashlib

    graph = onnx.load(exported[name]["loop"].path).graph
    tensors = list(graph.initializer) + [t for node in graph.node if node.op_type == "Loop"
                                         for a in node.attribute if a.name == "body" for t in a.g.initializer]
    contents = [hashlib.sha256(numpy_helper.to_array(t).tobytes() + str(tuple(t.dims)).encode()).hexdigest()
                for t in tensors if np.prod(t.dims) >= 64]  # the model's weights (all perturbed: none alike by chance)
    assert contents and len(contents) == len(set(contents))


def test_the_onnx_backend_keeps_the_iteration_limit(exported: dict) -> None:
    from hyperset.config import MAX_ITERS
    from hyperset.exports.solver_backend import create_backend

    entry = exported["sudoku"]
    backend = create_backend(entry["model"], path=entry["loop"].path, device="cpu", threads=1)
    for call in (lambda: backend.check(MAX_ITERS + 1, False),
                 lambda: backend.run(torch.zeros(1, 81, dtype=torch.long), MAX_ITERS + 1)):
        with pytest.raises(ValueError, match="10,000"):
            call()


@pytest.mark.parametrize("n_layers", [1, 2, 3])
def test_untrained_energy_transformers_load_in_onnx_runtime(tmp_path: Path, n_layers: int) -> None:
    """An untrained ET's scalar norm gain is exactly 1; ONNX Runtime 1.31's optimizer fails on the graph unless the
    exporter drops those Mul nodes. With several layers the exporter writes the later layers' gains as Identity of
    the first one's, which must count as the same unit scalar (the unrolled two-layer graph did not load)."""
    torch.manual_seed(0)
    model = HyperSETModel(_cfg("sudoku", layer="et", n_layers=n_layers)).eval()
    assert all(layer.norm.gamma.item() == 1.0 for layer in model.core.layers)
    unrolled = E.export_unrolled(model, T, tmp_path / "u.onnx")
    loop = E.export_loop(model, tmp_path / "l.onnx")
    assert not [n for n in onnx.load(unrolled.path).graph.node
                if n.op_type == "Identity" and "gamma" in n.input[0]]
    for path in (unrolled.path, loop.path):
        report = E.parity(model, path, T, batch=3, session=_session(path))
        assert report.ok, report


def test_hyperset_solve_onnx_leaves_the_device_to_onnx_runtime(tiny_checkpoint: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """With --backend onnx torch only exports the model, so it loads on the CPU whatever --device says and ONNX
    Runtime judges the device: `--device cuda` with a CPU build of torch beside onnxruntime-gpu used to be refused
    by torch's CUDA check. Names no command takes, and mps (no ONNX Runtime provider), are still refused."""
    from hyperset import cli
    from hyperset.exports import solver_backend

    (tmp_path / "p.txt").write_text(PUZZLES[0] + "\n")
    asked: list[str] = []
    monkeypatch.setattr(solver_backend, "_ort_device", lambda d: asked.append(str(d)) or "cpu")
    result = CliRunner().invoke(cli.solve_main, [str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint),
                                                 "--backend", "onnx", "--device", "cuda", "--json"])
    assert asked == ["cuda"] and result.exit_code in (0, 1), result.output
    assert json.loads(result.stdout)["summary"]["puzzles"] == 1
    for device in ("xpu", "mps"):
        result = CliRunner().invoke(cli.solve_main, [str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint),
                                                     "--backend", "onnx", "--device", device])
        assert result.exit_code == 2 and result.stderr.startswith("hyperset-solve: error: --device"), result.output


def test_parity_is_judged_against_torch_fp32s_own_rounding_on_real_puzzles(exported: dict) -> None:
    """Parity feeds a Sudoku model real puzzles (half the rows) besides random tokens, and allows ONNX Runtime
    NOISE_FACTOR times torch fp32's distance from fp64 where that exceeds the tolerance: a deep recurrence moves its
    logits by more than 1e-4 with the order of sums alone (the Sudoku Transformer baseline: 2.5e-4 at 16
    iterations), and its exact export was reported as a MISMATCH."""
    from hyperset.sudoku.exact import count_solutions

    cfg = CONFIGS["sudoku"]
    inputs = E.parity_inputs(cfg, batch=5, seed=2)
    assert inputs.shape == (5, 81) and inputs.dtype == torch.long
    for row in inputs[:3]:
        assert count_solutions("".join(map(str, row.tolist()))) == 1
    assert torch.equal(inputs[3:], E.example_inputs(cfg, batch=5, seed=2)[3:])
    assert torch.equal(E.parity_inputs(CONFIGS["mim"], batch=3), E.example_inputs(CONFIGS["mim"], batch=3))

    entry = exported["sudoku"]
    report = E.parity(entry["model"], entry["loop"].path, 2 * T, batch=4, session=_session(entry["loop"].path))
    assert report.ok and 0 < report.fp32_error < 1e-5 and report.allowed == report.tolerance == 1e-4
    assert {"fp32_error", "allowed", "ok"} <= set(report.to_json())
    noisy = dataclasses.replace(report, max_abs_logits=3e-4, fp32_error=1e-4)
    assert noisy.allowed == E.NOISE_FACTOR * 1e-4 and noisy.ok
    assert not dataclasses.replace(noisy, max_abs_logits=5e-4).ok
    assert not dataclasses.replace(noisy, prediction_agreement=0.99).ok


def test_a_loop_export_that_fails_midway_names_its_file_and_a_mixed_set_is_refused(
        tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--loop` writes four files. A full disk on the second one was reported as OUT (which was in fact written
    in full), and the set left behind mixed two models' graphs, which the solver then ran without a word (wrong
    answers). Now the side files are written before the Loop graph, the error names the file that failed, and the
    solver refuses side files whose model_sha256 is not the Loop graph's; a truncated one is a one-line error."""
    from hyperset import checkpoint
    from hyperset.cli import solve_main
    from hyperset.exports.cli import main as export_main

    first = tmp_path / "m.onnx"
    assert CliRunner().invoke(export_main, [str(tiny_checkpoint), "--loop", "--out", str(first)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in tmp_path.glob("m*.onnx")}
    assert len(before) == 4
    other = tmp_path / "other"
    save_checkpoint(other, _model(CONFIGS["sudoku"], seed=9), {"trained_iterations": T})
    written: list[str] = []
    real = checkpoint.atomic_write_bytes

    def full_on_second(path: str | Path, data: bytes) -> None:
        if written:
            raise OSError(28, "No space left on device", str(Path(path).parent / ".tmp"))
        written.append(Path(path).name)
        real(path, data)

    monkeypatch.setattr(E, "atomic_write_bytes", full_on_second)
    result = CliRunner().invoke(export_main, [str(other), "--loop", "--out", str(first)])
    assert result.exit_code == 2 and written == ["m.step.onnx"], result.output
    assert result.stderr.strip() == f"hyperset-export: error: cannot write {tmp_path / 'm.stem.onnx'}: " \
                                    "No space left on device"
    assert first.read_bytes() == before["m.onnx"]  # the Loop graph goes last: still the first model's
    monkeypatch.setattr(E, "atomic_write_bytes", real)

    (tmp_path / "p.txt").write_text(PUZZLES[0] + "\n")
    args = [str(tmp_path / "p.txt"), "--checkpoint", str(tiny_checkpoint), "--backend", "onnx", "--onnx-model",
            str(first), "--device", "cpu"]
    for strategy in ("commit", "auto"):
        extra = ["--iters", "auto"] if strategy == "auto" else []
        result = CliRunner().invoke(solve_main, [*args, *extra])
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert result.stderr.strip() == (
            "hyperset-solve: error: m.step.onnx was exported from another model than m.onnx (their model_sha256 "
            "differ, e.g. after an export was stopped between files); export the set again with hyperset-export "
            "--loop")
    (tmp_path / "m.step.onnx").write_bytes(before["m.step.onnx"][:1000])
    result = CliRunner().invoke(solve_main, args)
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith("hyperset-solve: error: m.step.onnx: not a valid ONNX model")
    (tmp_path / "m.step.onnx").write_bytes(before["m.step.onnx"])
    assert CliRunner().invoke(solve_main, args).exit_code in (0, 1)


def test_loop_parity_at_twice_the_iterations_stops_at_the_most_a_model_runs(tiny_checkpoint: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`--loop --parity` also checks 2x --iters, which past MAX_ITERS / 2 is more than a model runs: the export was
    written and then refused with exit 2. The second depth is MAX_ITERS at most (here lowered to 3)."""
    from hyperset import config, core
    from hyperset.exports import cli

    for module in (config, core, cli):
        monkeypatch.setattr(module, "MAX_ITERS", 3)
    result = CliRunner().invoke(cli.main, [str(tiny_checkpoint), "--loop", "--iters", "2", "--out",
                                           str(tmp_path / "l.onnx"), "--parity", "--parity-batch", "1",
                                           "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    assert [(p["iters"], p["ok"]) for p in json.loads(result.stdout)["parity"]] == [(2, True), (3, True)]
    assert cli.parity_depths(2, True) == [2, 3] and cli.parity_depths(3, True) == [3]
    assert cli.parity_depths(2, False) == [2]


def test_a_loop_export_checks_every_file_it_writes_before_writing_any(tiny_checkpoint: Path, tmp_path: Path) -> None:
    """A side file that cannot be written (here a folder in its place) was found only after the step and stem
    graphs were written; now it is refused before anything is written."""
    from hyperset.exports.cli import main as export_main

    (tmp_path / "m.head.onnx").mkdir()
    result = CliRunner().invoke(export_main, [str(tiny_checkpoint), "--loop", "--out", str(tmp_path / "m.onnx")])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"hyperset-export: error: cannot write {tmp_path / 'm.head.onnx'}: Is a directory"
    assert [p.name for p in tmp_path.iterdir()] == ["m.head.onnx"]
    model, _ = load_checkpoint(tiny_checkpoint)
    (tmp_path / "m.head.onnx").rmdir()
    with pytest.raises(OSError, match="does not exist"):
        E.export_loop(model, tmp_path / "missing" / "m.onnx")
    (tmp_path / "m.step.onnx").mkdir()
    with pytest.raises(IsADirectoryError):
        E.export_loop(model, tmp_path / "m.onnx", write_steps=True)
    assert [p.name for p in tmp_path.iterdir()] == ["m.step.onnx"]
    assert E.export_loop(model, tmp_path / "m.onnx").path == str(tmp_path / "m.onnx")  # no side files asked for


def test_metadata_preset_is_the_one_the_model_was_built_from(tmp_path: Path) -> None:
    """The shipped Sudoku and MIM models are their recipes' presets with overrides (time_init="zero", ...): only
    an exact match was recorded, so their graphs had no `preset`. It is the recipe's preset now; a model whose
    checkpoint, recipe and config name none has no `preset` prop."""
    from hyperset.config import get_preset
    from hyperset.exports.cli import resolve_checkpoint

    for name, preset in (("sudoku", "sudoku-cpu"), ("mim", "mim-cpu")):
        model, info = load_checkpoint(resolve_checkpoint(name), map_location="cpu")
        assert model.cfg != get_preset(preset).config
        proto = E.stem_proto(model, info=info)
        assert {p.key: p.value for p in proto.metadata_props}["preset"] == preset, name
    model = _model(CONFIGS["sudoku"])
    for info, expected in (({"recipe": "sudoku-cpu-deep"}, "sudoku-cpu"), ({"recipe": "mim-cpu"}, None),
                           ({"recipe": "test"}, None), ({"recipe": "test", "preset": "mine"}, "mine"), (None, None)):
        proto = E.head_proto(model, info=info)
        assert {p.key: p.value for p in proto.metadata_props}.get("preset") == expected, info


@pytest.mark.parametrize("name", ["sudoku", "classify", "sudoku-lora-2layers"])
def test_side_graphs_describe_their_own_inputs(exported: dict, name: str) -> None:
    """The stem, step and head graphs carried the Loop graph's `input` / `input_format` (tokens, int64 [batch, 81])
    whatever their inputs were; each now names and describes its own declared inputs."""
    entry = exported[name]
    cfg = entry["model"].cfg
    main = E.read_metadata(entry["loop"].path)
    assert main["input"] == E.input_name(cfg.task) and main["input_format"].startswith(("int64", "float32"))
    state = f"float32 [batch, {cfg.seq_len if cfg.task != 'classify' else cfg.patch_grid ** 2 + 1}, {cfg.dim}]"
    for path in entry["loop"].extra_files:
        meta = E.read_metadata(path)
        inputs = [i.name for i in onnx.load(path).graph.input]
        assert meta["input"] == ",".join(inputs), path
        parts = meta["input_format"].split("; ")
        assert [p.split(": ")[0] for p in parts] == inputs, path
        if meta["graph"] == "stem":
            assert parts == [f"{main['input']}: {main['input_format']}"]
        else:
            assert parts[0].startswith(f"x: {state}"), parts
        if meta["graph"] == "step":
            assert parts[1].startswith(f"x0: {state}") and parts[2].startswith("t: int64 scalar"), parts


@pytest.mark.parametrize("name", ["sudoku", "classify", "mim", "sudoku-transformer"])
def test_graphs_say_what_their_outputs_hold(exported: dict, name: str) -> None:
    """Whoever runs a graph without this package reads from its metadata how to decode the logits."""
    entry = exported[name]
    model = entry["model"]
    inputs = E.example_inputs(model.cfg, batch=2, seed=1)
    for path in (entry["loop"].path, entry["unrolled"][T].path):
        meta = E.read_metadata(path)
        logits = E.onnx_outputs(_session(path), inputs, T if path == entry["loop"].path else None)["logits"]
        shape = "[batch, " + ", ".join(map(str, logits.shape[1:])) + "]"
        assert meta["output_format"].startswith(f"logits: float32 {shape}"), meta["output_format"]
        assert ("argmax + 1" in meta["output_format"]) == (model.cfg.task == "sudoku")
        assert ("zeros" in meta["output_format"]) == (meta["energies"] == "")
    heads = [E.read_metadata(p) for p in entry["loop"].extra_files if E.read_metadata(p)["graph"] == "head"]
    assert heads and all(h["output_format"].startswith("logits: float32") and "energy" not in h["output_format"]
                         for h in heads)


def test_a_sudoku_graph_keeps_the_depth_its_solver_runs() -> None:
    from hyperset.models import load_checkpoint
    from hyperset.pretrained import pretrained_dir
    model, info = load_checkpoint(pretrained_dir("sudoku"))
    meta = {p.key: p.value for p in E.head_proto(model, info=info).metadata_props}
    assert meta["solve_iterations"] == str(info["solve_iterations"]) == "64"
    assert "solve_iterations" not in {p.key for p in E.head_proto(model).metadata_props}
