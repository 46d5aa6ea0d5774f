"""`hyperset-train average`: the weighted mean of checkpoints of one model as a new checkpoint."""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hyperset.config import preset_config
from hyperset.models import HyperSETModel, load_checkpoint, save_checkpoint
from hyperset.training.cli import main


def _checkpoint(path: Path, seed: int, preset: str = "sudoku-cpu", **overrides) -> Path:
    torch.manual_seed(seed)
    cfg = preset_config(preset, **{"dim": 32, "heads": 2, "ff_hidden": 64, "time_dim": 16, "iters": 3, **overrides})
    save_checkpoint(path, HyperSETModel(cfg), {"trained_iterations": 3, "recipe": f"r{seed}"})
    return path


def _invoke(*args: str):
    return CliRunner().invoke(main, ["average", *args])


def test_the_mean_is_the_weighted_mean_of_every_weight_and_says_what_it_averaged(tmp_path: Path) -> None:
    a = _checkpoint(tmp_path / "a", 0, step_control="backtrack", backtrack_from=2)
    b = _checkpoint(tmp_path / "b", 1)
    out = tmp_path / "mean"
    run = _invoke(str(a), str(b), "--out", str(out), "--weight", "3", "--weight", "1")
    assert run.exit_code == 0, run.output
    mean, _ = load_checkpoint(out)
    wa, wb = (load_checkpoint(p)[0].state_dict() for p in (a, b))
    for k, v in mean.state_dict().items():
        if v.is_floating_point():
            assert torch.allclose(v, 0.75 * wa[k] + 0.25 * wb[k], atol=1e-6), k
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)  # the two differ: the mean is not one of them
    config = json.loads((out / "config.json").read_text())
    assert config["averaged_from"] == [{"checkpoint": str(a), "weight": 0.75, "recipe": "r0", "steps": None},
                                       {"checkpoint": str(b), "weight": 0.25, "recipe": "r1", "steps": None}]
    assert config["recipe"] == "r0" and config["trained_iterations"] == 3
    assert mean.cfg.step_control == "backtrack" and mean.cfg.backtrack_from == 2  # the first one's settings
    puzzles = torch.zeros(2, 81, dtype=torch.long)
    assert mean(puzzles).shape == (2, 81, 9)


def test_equal_weights_by_default(tmp_path: Path) -> None:
    a, b, c = (_checkpoint(tmp_path / n, s) for n, s in (("a", 0), ("b", 1), ("c", 2)))
    assert _invoke(str(a), str(b), str(c), "-o", str(tmp_path / "m")).exit_code == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert [e["weight"] for e in config["averaged_from"]] == pytest.approx([1 / 3] * 3)


@pytest.mark.parametrize("case", ["one", "shapes", "weights", "task", "occupied", "missing"])
def test_what_cannot_be_averaged_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    a = _checkpoint(tmp_path / "a", 0)
    b = tmp_path / "b"
    other = {"one": lambda: None, "shapes": lambda: _checkpoint(b, 1, dim=64), "weights": lambda: _checkpoint(b, 1),
             "occupied": lambda: _checkpoint(b, 1), "missing": lambda: tmp_path / "nothing",
             "task": lambda: _checkpoint(b, 1, "cifar10-cpu")}[case]()
    why = {"one": "at least two", "shapes": "does not have the weights", "weights": "1 weights for 2",
           "occupied": "already holds files", "missing": "nothing", "task": "is a classify model"}[case]
    out = tmp_path / "mean"
    if case == "occupied":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    args = [str(a)] + ([str(other)] if other is not None else []) + ["--out", str(out)]
    if case == "weights":
        args += ["--weight", "1"]
    run = _invoke(*args)
    assert run.exit_code == 2 and run.output.startswith("hyperset-train: error:") and "Traceback" not in run.output
    assert len(run.output.strip().splitlines()) == 1 and why in run.output
    if case == "occupied":
        assert [p.name for p in out.iterdir()] == ["notes.txt"]
    else:
        assert not out.exists()


def test_json_names_the_new_checkpoint_and_what_it_averaged(tmp_path: Path) -> None:
    a, b = _checkpoint(tmp_path / "a", 0), _checkpoint(tmp_path / "b", 1)
    run = _invoke(str(a), str(b), "--out", str(tmp_path / "m"), "--json", "--threads", "1", "--device", "cpu")
    assert run.exit_code == 0, run.output
    doc = json.loads(run.output)
    assert doc["out"] == str(tmp_path / "m")
    assert [(e["checkpoint"], e["weight"]) for e in doc["averaged_from"]] == [(str(a), 0.5), (str(b), 0.5)]


def test_set_changes_a_setting_of_the_mean_never_its_shapes(tmp_path: Path) -> None:
    a, b = _checkpoint(tmp_path / "a", 0), _checkpoint(tmp_path / "b", 1)
    run = _invoke(str(a), str(b), "-o", str(tmp_path / "m"), "--set", "model.step_control=backtrack",
                  "--set", "model.backtrack_from=4")
    assert run.exit_code == 0, run.output
    mean, _ = load_checkpoint(tmp_path / "m")
    assert (mean.cfg.step_control, mean.cfg.backtrack_from) == ("backtrack", 4)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert [(e["recipe"], e["steps"]) for e in config["averaged_from"]] == [("r0", None), ("r1", None)]
    for bad, why in (("model.dim=64", "shapes"), ("model.nope=1", "nope"), ("train.lr=1", "model.KEY=VALUE"),
                     ("model.step_control=sideways", "step_control")):
        run = _invoke(str(a), str(b), "-o", str(tmp_path / "x"), "--set", bad)
        assert run.exit_code == 2 and why in run.output and len(run.output.strip().splitlines()) == 1, run.output
        assert not (tmp_path / "x").exists()
