"""Checkpoints: bit-identical round trips, never unpickling, one-line errors naming the file, atomic saves."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch

import hyperset.checkpoint as checkpoint
from hyperset.checkpoint import CheckpointError, read_config
from hyperset.config import ModelConfig
from hyperset.models import HyperSETModel, build_model, load_checkpoint, save_checkpoint


def _cfg(task: str = "sudoku", **kw) -> ModelConfig:
    base = dict(task=task, dim=16, heads=4, ff_hidden=32, iters=2, time_dim=16, step_init=0.1)
    if task == "classify":
        base.update(img_size=8, patch_grid=2, num_classes=4, pos="sincos1d", step_cond="xt", step_norm="cond",
                    head_norm="layer", head_bias=True)
    if task == "mim":
        base.update(vocab_size=17, num_classes=16, seq_len=16, pos="sincos2d", time_mlp=False,
                    step_norm="sum", head_bias=True)
    base.update(kw)
    return ModelConfig(**base)


def _inputs(cfg: ModelConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if cfg.task == "classify":
        return torch.randn(2, cfg.channels, cfg.img_size, cfg.img_size, generator=g)
    return torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=g)


def _saved(tmp_path: Path, cfg: ModelConfig | None = None, name: str = "ckpt") -> tuple[Path, HyperSETModel]:
    torch.manual_seed(0)
    model = build_model(cfg or _cfg())
    folder = tmp_path / name
    save_checkpoint(folder, model, {"recipe": "test"})
    return folder, model


def _error(folder: Path | str, **kw) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder, **kw)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("cfg", [
    _cfg(), _cfg(pos="grid"), _cfg("classify"), _cfg("mim"), _cfg(lora_rank=2), _cfg(n_layers=2),
    _cfg(layer="et"), _cfg(layer="crate-t"), _cfg("classify", layer="transformer", stem="linear"),
], ids=["sudoku", "sudoku-grid", "classify", "mim", "lora", "two-layers", "et", "crate-t", "transformer"])
def test_save_then_load_gives_bit_identical_logits(tmp_path, cfg):
    folder, model = _saved(tmp_path, cfg)
    loaded, info = load_checkpoint(folder)
    assert not loaded.training
    assert loaded.cfg == model.cfg
    assert info["recipe"] == "test" and info["parameters"] == model.num_parameters()
    for (k, a), (k2, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    x = _inputs(cfg)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
        assert torch.equal(model(x, iters=5), loaded(x, iters=5))


def test_load_accepts_the_folder_or_either_file_and_checks_the_task(tmp_path):
    folder, _ = _saved(tmp_path)
    for path in (folder, folder / "config.json", folder / "model.safetensors", str(folder)):
        model, _ = load_checkpoint(path, task="sudoku")
        assert model.cfg.task == "sudoku"


# ---------------------------------------------------------------------------------------- never unpickle


class _Exploit:
    """Unpickling this calls open(marker, "w"): it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_disguised_as_safetensors_is_rejected_without_running_code(tmp_path):
    probe = tmp_path / "probe-marker"
    pickle.loads(pickle.dumps(_Exploit(probe))).close()
    assert probe.exists()  # the payload is live: unpickling it does create its marker

    folder, _ = _saved(tmp_path)
    marker = tmp_path / "marker"
    (folder / "model.safetensors").write_bytes(pickle.dumps({"state_dict": _Exploit(marker)}))
    message = _error(folder)
    assert not marker.exists()
    assert "model.safetensors" in message and "safetensors" in message

    torch.save({"weights": torch.zeros(3)}, folder / "model.safetensors")  # a zip-pickle .pt file, too
    assert "model.safetensors" in _error(folder)


def test_loading_never_calls_the_unpickler(tmp_path, monkeypatch):
    folder, model = _saved(tmp_path)

    def forbidden(*args, **kwargs):
        raise AssertionError("checkpoint loading must not unpickle")

    for module, name in ((pickle, "load"), (pickle, "loads"), (torch, "load")):
        monkeypatch.setattr(module, name, forbidden)
    loaded, _ = load_checkpoint(folder)
    x = _inputs(model.cfg)
    with torch.no_grad():
        assert torch.equal(model.eval()(x), loaded(x))


# ------------------------------------------------------------------------------------------ clear errors


def test_missing_folder(tmp_path):
    message = _error(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in message and "model.safetensors + config.json" in message


def test_missing_config_json(tmp_path):
    folder, _ = _saved(tmp_path)
    (folder / "config.json").unlink()
    message = _error(folder)
    assert str(folder) in message and "config.json" in message and "missing" in message


def test_a_file_that_is_not_a_checkpoint_is_named_not_its_folder(tmp_path):
    folder, _ = _saved(tmp_path)
    other = folder / "weights.pkl"
    other.write_bytes(pickle.dumps({"a": 1}))
    message = _error(other)
    assert str(other) in message and "is a file, not a checkpoint" in message


def test_a_training_run_folder_points_to_its_checkpoints(tmp_path):
    _saved(tmp_path, name="run/best")
    message = _error(tmp_path / "run")
    assert "config.json is missing" in message and str(tmp_path / "run" / "best") in message


def test_a_config_without_a_model_key_says_which_key_is_missing(tmp_path):
    folder, _ = _saved(tmp_path)
    meta = json.loads((folder / "config.json").read_text())
    del meta["model"]["dim"]
    (folder / "config.json").write_text(json.dumps(meta))
    assert "config.json lacks the model keys dim" in _error(folder)


def test_invalid_json(tmp_path):
    folder, _ = _saved(tmp_path)
    (folder / "config.json").write_text('{"format": "hyperset-checkpoint", "model": {')
    message = _error(folder)
    assert str(folder / "config.json") in message and "JSON" in message


def test_a_json_file_that_is_not_a_hyperset_config(tmp_path):
    folder, _ = _saved(tmp_path)
    (folder / "config.json").write_text('{"architectures": ["BertModel"]}')
    message = _error(folder)
    assert str(folder / "config.json") in message and "hyperset-checkpoint" in message


def test_missing_weights(tmp_path):
    folder, _ = _saved(tmp_path)
    (folder / "model.safetensors").unlink()
    message = _error(folder)
    assert str(folder / "model.safetensors") in message and "not found" in message


def test_truncated_safetensors(tmp_path):
    folder, _ = _saved(tmp_path)
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    message = _error(folder)
    assert str(path) in message and "safetensors" in message and "expected the weights" in message


def test_empty_safetensors(tmp_path):
    folder, _ = _saved(tmp_path)
    (folder / "model.safetensors").write_bytes(b"")
    assert str(folder / "model.safetensors") in _error(folder)


def test_weights_that_do_not_match_the_config(tmp_path):
    """config.json says dim 32, the weights have dim 16."""
    folder, _ = _saved(tmp_path)
    meta = json.loads((folder / "config.json").read_text())
    meta["model"].update(dim=32, time_dim=32)
    (folder / "config.json").write_text(json.dumps(meta))
    message = _error(folder)
    assert str(folder / "model.safetensors") in message and "config.json expects" in message
    assert "16" in message and "32" in message


def test_weights_of_another_architecture(tmp_path):
    folder, _ = _saved(tmp_path)
    other, _ = _saved(tmp_path, _cfg(layer="transformer"), name="other")
    os.replace(other / "model.safetensors", folder / "model.safetensors")
    message = _error(folder)
    assert str(folder / "model.safetensors") in message and "missing" in message and "unexpected" in message


def test_wrong_task(tmp_path):
    folder, _ = _saved(tmp_path)
    message = _error(folder, task="classify")
    assert str(folder) in message and "'sudoku'" in message and "expected a 'classify' model" in message


@pytest.mark.parametrize("change, named", [({"heads": 5}, "divisible"), ({"colour": "red"}, "colour"),
                                            ({"task": "chess"}, "chess"),
                                            ({"dim": "x"}, "model.dim = 'x': expected int"),
                                            ({"iters": None}, "model.iters = None: expected int"),
                                            ({"time_mlp": "yes"}, "model.time_mlp = 'yes': expected bool"),
                                            ({"step_init": True}, "model.step_init = True: expected float")])
def test_invalid_model_config_values(tmp_path, change, named):
    folder, _ = _saved(tmp_path)
    meta = json.loads((folder / "config.json").read_text())
    meta["model"].update(change)
    (folder / "config.json").write_text(json.dumps(meta))
    message = _error(folder)
    assert str(folder / "config.json") in message and named in message


def test_config_that_cannot_build_a_model_gives_a_checkpoint_error(tmp_path):
    folder, _ = _saved(tmp_path)
    meta = json.loads((folder / "config.json").read_text())
    meta["model"]["pos"] = "spiral"  # not a position code: TokenStem raises ValueError
    (folder / "config.json").write_text(json.dumps(meta))
    message = _error(folder)
    assert str(folder / "config.json") in message and "spiral" in message


def test_info_cannot_clobber_the_reserved_config_keys(tmp_path):
    torch.manual_seed(0)
    model = build_model(_cfg())
    folder = tmp_path / "ckpt"
    try:
        save_checkpoint(folder, model, {"model": "sudoku-cpu", "format": "mine"})
    except ValueError:
        return  # refusing reserved keys is fine too
    loaded, _ = load_checkpoint(folder)
    assert loaded.cfg == model.cfg


def test_read_config_returns_the_metadata(tmp_path):
    folder, model = _saved(tmp_path)
    meta = read_config(folder)
    assert meta["format"] == "hyperset-checkpoint" and meta["format_version"] == 1
    assert ModelConfig.from_dict(meta["model"]) == model.cfg


# ------------------------------------------------------------------------------------------ atomic saves


def test_a_successful_save_leaves_exactly_the_two_files(tmp_path):
    folder, model = _saved(tmp_path)
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
    save_checkpoint(folder, model)  # overwriting in place
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]


def test_a_failed_save_leaves_no_temporary_file_and_the_old_checkpoint_intact(tmp_path, monkeypatch):
    folder, model = _saved(tmp_path)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def crash(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", crash)
    with torch.no_grad():
        model.head.weight.add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(folder, model)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    load_checkpoint(folder)


def test_resume_config_check_reads_missing_fields_as_defaults():
    """A run saved before a config field existed resumes; a real difference, or a new field set away from its
    default, is named."""
    from hyperset.training.state import model_config_diff

    cfg = ModelConfig(task="sudoku", dim=32, heads=2, ff_hidden=64, iters=4)
    saved = cfg.to_dict()
    assert model_config_diff(saved, cfg) == []
    older = {k: v for k, v in saved.items() if k not in ("time_init", "time_max")}
    assert model_config_diff(older, cfg) == []
    assert model_config_diff(older, cfg.replace(time_max=8)) == ["time_max"]
    assert model_config_diff({**saved, "dim": 64}, cfg) == ["dim"]
    assert model_config_diff({**saved, "retired_field": 1}, cfg) == ["retired_field"]


def test_an_atomic_write_removes_the_temporary_files_of_killed_writers(tmp_path: Path) -> None:
    """A writer killed between its write and its rename left `.NAME.XXXX.tmp` for good (an ONNX graph's worth per
    kill). Temporary files now carry the writer's pid, and the next write of the same file removes those of
    processes that no longer run; a live writer's file and other files are left alone."""
    import subprocess
    import sys

    from hyperset.checkpoint import atomic_write_bytes

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    target = tmp_path / "m.onnx"
    stale = tmp_path / f".m.onnx.{dead}.ab12cd34.tmp"
    live = tmp_path / f".m.onnx.{os.getppid()}.ef56gh78.tmp"
    other = tmp_path / f".x.onnx.{dead}.ab12cd34.tmp"
    for f in (stale, live, other):
        f.write_bytes(b"half")
    atomic_write_bytes(target, b"whole")
    assert target.read_bytes() == b"whole"
    assert not stale.exists() and live.exists() and other.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name, other.name])


# ------------------------------------------------------------------------------------------- versions, dtypes, wrappers


def test_a_newer_or_malformed_format_version_is_refused_in_one_line(tmp_path):
    folder, _ = _saved(tmp_path)
    config = folder / "config.json"
    meta = json.loads(config.read_text())
    assert meta["format_version"] == checkpoint.FORMAT_VERSION
    for version, reason in [(checkpoint.FORMAT_VERSION + 1, "newer than this version"), ("banana", "whole number"),
                            (0, "whole number"), (True, "whole number")]:
        config.write_text(json.dumps({**meta, "format_version": version}))
        assert reason in _error(folder)
    config.write_text(json.dumps({k: v for k, v in meta.items() if k != "format_version"}))
    load_checkpoint(folder)  # written before the field existed: version 1


@pytest.mark.slow
def test_a_compiled_model_saves_under_its_own_weight_names(tmp_path):
    torch.manual_seed(0)
    model = build_model(_cfg())
    save_checkpoint(tmp_path / "c", torch.compile(model))
    loaded, _ = load_checkpoint(tmp_path / "c")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_model_loads_in_float32_or_in_the_dtype_it_was_saved_in(tmp_path, dtype):
    """float32 by default (what the commands and exports run); dtype="saved" gives back the model as saved."""
    torch.manual_seed(0)
    model = build_model(_cfg()).to(dtype).eval()
    save_checkpoint(tmp_path / "c", model)
    assert {p.dtype for p in load_checkpoint(tmp_path / "c")[0].parameters()} == {torch.float32}
    loaded, _ = load_checkpoint(tmp_path / "c", dtype="saved")
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    x = _inputs(model.cfg)
    with torch.no_grad():
        assert torch.equal(model(x), loaded(x))
    assert {p.dtype for p in HyperSETModel.from_pretrained(str(tmp_path / "c"), dtype="saved").parameters()} == {dtype}
    with pytest.raises(ValueError, match="expected None"):
        load_checkpoint(tmp_path / "c", dtype="float16")


def test_integer_weights_where_floats_belong_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = _saved(tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name].round().to(torch.int32)
    save_file(weights, str(folder / "model.safetensors"))
    message = _error(folder)
    assert name in message and "I32" in message and "floating-point" in message
