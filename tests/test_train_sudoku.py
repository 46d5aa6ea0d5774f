"""The shared trainer on Sudoku: the loss falls, a killed run resumes exactly, best-on-validation checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import write_sudoku_csvs

from hyperset.checkpoint import load_checkpoint
from hyperset.config import preset_config
from training.cli import main as train_main
from training.sudoku_task import SudokuData, SudokuTask
from training.trainer import TrainConfig, Trainer, lr_at


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sudoku_csvs(tmp_path_factory.mktemp("sudoku-data"), 90, 30, seed=1)


def tiny_task(data_dir: Path, **data_kw) -> SudokuTask:
    cfg = preset_config("sudoku-cpu", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2)
    data = SudokuData(data_dir=str(data_dir), n_train=0, n_val=15, n_select=15, **data_kw)
    return SudokuTask(model=cfg, data=data)


def train_cfg(steps: int) -> TrainConfig:
    return TrainConfig(steps=steps, batch_size=8, lr=3e-3, min_lr=3e-4, warmup_steps=2, amp="off",
                       eval_every=1000, log_every=1, save_every_seconds=1e9, threads=1)


def test_short_training_lowers_the_loss(data_dir: Path, tmp_path: Path) -> None:
    task = tiny_task(data_dir)
    task.train_puzzles, task.train_solutions = task.train_puzzles[:8], task.train_solutions[:8]  # one batch
    cfg = train_cfg(30)
    cfg.lr, cfg.min_lr = 1e-2, 1e-3
    Trainer(task, cfg, tmp_path / "run", quiet=True).fit()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.05


def test_killed_run_resumes_to_the_same_weights(data_dir: Path, tmp_path: Path) -> None:
    Trainer(tiny_task(data_dir), train_cfg(6), tmp_path / "straight", quiet=True).fit()
    Trainer(tiny_task(data_dir), train_cfg(3), tmp_path / "split", quiet=True).fit()
    Trainer(tiny_task(data_dir), train_cfg(6), tmp_path / "split", resume=True, quiet=True).fit()
    a, _ = load_checkpoint(tmp_path / "straight" / "last")
    b, _ = load_checkpoint(tmp_path / "split" / "last")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    progress = json.loads((tmp_path / "split" / "last" / "trainer.json").read_text())
    assert progress["step"] == 6


def test_resuming_with_another_step_budget_records_the_schedule(data_dir: Path, tmp_path: Path) -> None:
    Trainer(tiny_task(data_dir), train_cfg(4), tmp_path / "run", quiet=True).fit()
    progress = json.loads((tmp_path / "run" / "last" / "trainer.json").read_text())
    assert progress["schedule"] == [{"from_step": 0, "steps": 4}]
    trainer = Trainer(tiny_task(data_dir), train_cfg(7), tmp_path / "run", resume=True, quiet=True)
    said: list[str] = []
    trainer._say = said.append  # type: ignore[method-assign]
    trainer.fit()
    expected = [{"from_step": 0, "steps": 4}, {"from_step": 4, "steps": 7}]
    assert json.loads((tmp_path / "run" / "last" / "trainer.json").read_text())["schedule"] == expected
    assert json.loads((tmp_path / "run" / "last" / "config.json").read_text())["schedule"] == expected
    assert any("schedule changed at step 4: 4 -> 7 steps" in line for line in said)
    # a state written before schedules were recorded: the budget comes from its config.json
    state = json.loads((tmp_path / "run" / "last" / "trainer.json").read_text())
    del state["schedule"]
    (tmp_path / "run" / "last" / "trainer.json").write_text(json.dumps(state))
    Trainer(tiny_task(data_dir), train_cfg(9), tmp_path / "run", resume=True, quiet=True).fit()
    assert json.loads((tmp_path / "run" / "last" / "trainer.json").read_text())["schedule"] == [
        {"from_step": 0, "steps": 7}, {"from_step": 7, "steps": 9}]


def test_a_second_run_into_the_same_folder_needs_resume(data_dir: Path, tmp_path: Path) -> None:
    Trainer(tiny_task(data_dir), train_cfg(2), tmp_path / "run", quiet=True).fit()
    with pytest.raises(SystemExit, match="--resume"):
        Trainer(tiny_task(data_dir), train_cfg(2), tmp_path / "run", quiet=True).fit()


def test_best_checkpoint_is_chosen_on_the_selection_split_and_records_its_metrics(data_dir: Path,
                                                                                  tmp_path: Path) -> None:
    cfg = train_cfg(4)
    cfg.eval_every = 2
    result = Trainer(tiny_task(data_dir), cfg, tmp_path / "run", quiet=True).fit()
    meta = json.loads((tmp_path / "run" / "best" / "config.json").read_text())
    assert meta["metrics"][result["best_metrics"] and "select/board_acc@2"] == result["best"]
    assert {"val/board_acc@2", "val/cell_acc@4", "select/board_acc@2"} <= set(meta["metrics"])
    assert meta["data"]["val_puzzles"] == 15 and meta["trained_iterations"] == 2


def test_schedule_warms_up_then_anneals_to_min_lr() -> None:
    cfg = TrainConfig(steps=100, lr=1e-3, min_lr=1e-5, warmup_steps=10)
    assert lr_at(0, cfg) == pytest.approx(1e-4)
    assert lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg) == pytest.approx(1e-5)
    assert lr_at(55, cfg) == pytest.approx((1e-3 + 1e-5) / 2)


def test_cli_trains_from_a_recipe_with_overrides(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli-run"
    args = ["sudoku", "--recipe", "sudoku-cpu", "--data", str(data_dir), "--out", str(out), "--steps", "3",
            "--set", "model.dim=32", "--set", "model.heads=2", "--set", "model.ff_hidden=64",
            "--set", "model.time_dim=16", "--set", "model.iters=2", "--set", "data.n_val=10",
            "--set", "data.n_select=10", "--set", "train.batch_size=4", "--set", "train.amp='off'", "--json"]
    result = CliRunner().invoke(train_main, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["step"] == 3
    assert (out / "best" / "model.safetensors").is_file()


def test_cli_reports_missing_data_without_a_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(train_main, ["sudoku", "--recipe", "sudoku-cpu", "--data", str(tmp_path / "none"),
                                             "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Traceback" not in result.output
