"""The shared trainer on Sudoku: the loss falls, a killed run resumes exactly, best-on-validation checkpoints."""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from conftest import write_sudoku_csvs

from hyperset.checkpoint import CheckpointError
from hyperset.config import preset_config
from hyperset.models import load_checkpoint
from hyperset.training import state
from hyperset.training.cli import main as train_main
from hyperset.training.sudoku_task import SudokuData, SudokuTask
from hyperset.training.trainer import TrainConfig, Trainer, lr_at, parse_schedule


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


def test_a_planned_schedule_replays_another_runs_budget(data_dir: Path, tmp_path: Path) -> None:
    # run A: a 4-step cosine, then resumed with a 7-step budget
    Trainer(tiny_task(data_dir), train_cfg(4), tmp_path / "a", quiet=True).fit()
    Trainer(tiny_task(data_dir), train_cfg(7), tmp_path / "a", resume=True, quiet=True).fit()
    # run B replays A's recorded schedule in one go (and in two pieces, stopped at step 3): the same weights
    plan = parse_schedule(str(tmp_path / "a"))
    assert plan == [{"from_step": 0, "steps": 4}, {"from_step": 4, "steps": 7}]
    Trainer(tiny_task(data_dir), train_cfg(99), tmp_path / "b", quiet=True, plan=plan).fit()
    task = tiny_task(data_dir)
    first = Trainer(task, train_cfg(3), tmp_path / "c", quiet=True, plan=plan)
    batch = task.batch

    def stop_after_step_2(step: int, *args):  # as a SIGTERM during step 2 would
        first._stop = first._stop or step == 2
        return batch(step, *args)

    task.batch = stop_after_step_2  # type: ignore[method-assign]
    assert first.fit()["step"] == 3
    Trainer(tiny_task(data_dir), train_cfg(3), tmp_path / "c", resume=True, quiet=True, plan=plan).fit()
    a, _ = load_checkpoint(tmp_path / "a" / "last")
    for run in ("b", "c"):
        other, _ = load_checkpoint(tmp_path / run / "last")
        for (name, x), (_, y) in zip(a.state_dict().items(), other.state_dict().items()):
            assert torch.equal(x, y), (run, name)
        assert json.loads((tmp_path / run / "last" / "trainer.json").read_text())["schedule"] == plan
    # a run that followed another budget before its resume step cannot claim the plan
    with pytest.raises(ValueError, match="followed a cosine over 4 steps at step 0"):
        Trainer(tiny_task(data_dir), train_cfg(4), tmp_path / "a", resume=True, quiet=True,
                plan=parse_schedule("0:5,6:8")).fit()


@pytest.mark.parametrize("spec, message", [
    ("0:10,x", "expected FROM:STEPS"), ("5:10", "must start at step 0"), ("0:10,4:12,3:20", "must increase"),
    ("0:10,12:11", "cannot end at step 11")])
def test_bad_schedules_are_named(spec: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=message):
        parse_schedule(spec)
    (tmp_path / "config.json").write_text(json.dumps({"steps": 3}))
    with pytest.raises(ValueError, match="no recorded 'schedule'"):
        parse_schedule(str(tmp_path))


def test_cli_schedule_and_steps_must_agree(data_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(train_main, ["sudoku", "--recipe", "sudoku-cpu", "--data", str(data_dir),
                                             "--out", str(tmp_path / "run"), "--schedule", "0:4,2:6", "--steps", "5"])
    assert result.exit_code == 2 and "contradicts --schedule" in result.output


def test_a_second_run_into_the_same_folder_needs_resume(data_dir: Path, tmp_path: Path) -> None:
    Trainer(tiny_task(data_dir), train_cfg(2), tmp_path / "run", quiet=True).fit()
    with pytest.raises(ValueError, match="--resume"):
        Trainer(tiny_task(data_dir), train_cfg(2), tmp_path / "run", quiet=True).fit()
    again = CliRunner().invoke(train_main, [*TINY_CLI, "--data", str(data_dir), "--out", str(tmp_path / "run")])
    assert again.exit_code == 2 and "already holds a training run" in again.stderr
    assert again.stderr.count("\n") == 1 and "Traceback" not in again.output


def test_resume_refuses_a_run_of_another_task_or_recipe(data_dir: Path, tmp_path: Path) -> None:
    Trainer(tiny_task(data_dir), train_cfg(2), tmp_path / "run", recipe_name="sudoku-a", quiet=True).fit()
    with pytest.raises(CheckpointError, match="'sudoku' run of recipe 'sudoku-a', not a 'sudoku' run of recipe "
                                              "'sudoku-b'"):
        Trainer(tiny_task(data_dir), train_cfg(4), tmp_path / "run", resume=True, recipe_name="sudoku-b").fit()
    other = tiny_task(data_dir)
    other.name = "classify"
    with pytest.raises(CheckpointError, match="not a 'classify' run"):
        Trainer(other, train_cfg(4), tmp_path / "run", resume=True, recipe_name="sudoku-a", quiet=True).fit()
    with pytest.raises(ValueError, match="is at step 2; --steps 1 would end it"):
        Trainer(tiny_task(data_dir), train_cfg(1), tmp_path / "run", resume=True, recipe_name="sudoku-a").fit()


def test_a_kill_while_saving_leaves_the_previous_state_whole(data_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    Trainer(tiny_task(data_dir), train_cfg(2), tmp_path / "run", quiet=True).fit()
    before = load_checkpoint(tmp_path / "run" / "last")[0].state_dict()

    def killed(*args, **kwargs):  # the process dies after the model file, before the optimizer file
        raise KeyboardInterrupt

    monkeypatch.setattr(state, "save_tensors", killed)
    with pytest.raises(KeyboardInterrupt):
        Trainer(tiny_task(data_dir), train_cfg(4), tmp_path / "run", resume=True, quiet=True).fit()
    monkeypatch.undo()
    after = load_checkpoint(tmp_path / "run" / "last")[0].state_dict()
    assert json.loads((tmp_path / "run" / "last" / "trainer.json").read_text())["step"] == 2
    assert all(torch.equal(before[k], after[k]) for k in before)  # the model of step 2, not of step 4
    # killed between the two renames: the previous state is put back
    (tmp_path / "run" / "last").rename(tmp_path / "run" / "last.old")
    assert Trainer(tiny_task(data_dir), train_cfg(3), tmp_path / "run", resume=True, quiet=True).fit()["step"] == 3
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".lock", "best", "last", "metrics.jsonl"]


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


TINY_CLI = ["sudoku", "--recipe", "sudoku-cpu", "--steps", "2", "--set", "model.dim=16", "--set", "model.heads=2",
            "--set", "model.ff_hidden=16", "--set", "model.time_dim=16", "--set", "model.iters=1",
            "--set", "data.n_val=4", "--set", "data.n_select=4", "--set", "train.batch_size=4",
            "--set", "train.amp='off'", "--set", "train.eval_every=2"]


@pytest.mark.parametrize("args, message", [
    (["--set", "model.foo=1"], "unknown [model] keys: foo"),
    (["--set", "data.foo=1"], "unknown [data] keys: foo"),
    (["--set", "objective.foo=1"], "unknown [objective] keys: foo"),
    (["--set", "fo.bar=1"], "unknown section 'fo'"),
    (["--set", "model.dim=abc"], "model.dim = 'abc': expected int"),
    (["--set", "data.n_train=abc"], "data.n_train = 'abc': expected int"),
    (["--set", "train.lr=abc"], "train.lr = 'abc': expected float"),
    (["--set", "train.betas=0.9"], "train.betas = 0.9: expected tuple"),
    (["--set", "train.amp=banana"], "train.amp must be one of auto, off, bf16, fp16"),
    (["--set", "train.batch_size=0"], "batch_size and accum_steps must be >= 1"),
    (["--set", "train.eval_every=0"], "eval_every and log_every must be >= 1"),
    (["--preset", "nope"], "unknown preset 'nope'"),
    (["--preset", "cifar10-cpu"], "'classify' model, not a sudoku model"),
    (["--device", "banana"], "banana"),
    (["--steps", "0"], "0 is not in the range x>=1"),
    (["--accum-steps", "0"], "0 is not in the range x>=1"),
    (["--set", "train.lr=0"], "train.lr = 0: must be a positive finite number"),
    (["--set", "train.lr=inf"], "train.lr = inf: must be a positive finite number"),
    (["--set", "train.min_lr=1"], "train.min_lr = 1: must be between 0 and train.lr = 0.001"),
    (["--set", "train.betas=[0.9, 2.0]"], "train.betas = [0.9, 2.0]: must be two numbers in [0, 1)"),
    (["--set", "train.weight_decay=-1"], "train.weight_decay = -1: must be >= 0"),
    (["--set", "data.n_train=-1"], "data.n_train = -1: must be >= 0"),
    (["--set", "data.n_train=100000"], "data.n_train = 100000, but"),
    (["--set", "tokenizer.codebook_size=8"], "a [tokenizer] table is for mim recipes"),
    (["--set", "train.=5"], "expected section.key=value"),
    (["--preset", ""], "--preset: an empty value"),
    (["--schedule", " "], "--schedule: an empty value"),
])
def test_cli_user_mistakes_exit_2_with_one_line(data_dir: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(train_main, [*TINY_CLI, "--data", str(data_dir), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "o" / "last").exists()


RECIPE = """task = "sudoku"
preset = "sudoku-cpu"

[model]
dim = 16
heads = 2
ff_hidden = 16
time_dim = 16
iters = 1

[data]
n_train = 0
n_val = 4
n_select = 4

[train]
steps = 2
batch_size = 4
amp = "off"
eval_every = 2
"""


@pytest.mark.parametrize("edit, message", [
    (lambda r: r.replace("steps = 2", 'steps = "two"'), ":17: train.steps = 'two': expected int"),
    (lambda r: r.replace("batch_size = 4", "batch_size = 4\nlr = -1"), ":19: train.lr = -1: must be"),
    (lambda r: r.replace("[data]", "[dat]"), ":11: unknown recipe key 'dat'"),
    (lambda r: "colour = 1\n" + r, ":1: unknown recipe key 'colour'"),
    (lambda r: "train = 5\n" + r.replace("[train]", "[training]"), ":1: train = 5: [train] must be a table"),
    (lambda r: r.replace("dim = 16", "dim = 16\nwidth = 3", 1), ":6: unknown [model] keys: width"),
    (lambda r: r.replace("n_val = 4", "n_val = = 4"), ":13:9: invalid TOML: Invalid value"),
    (lambda r: r.replace('preset = "sudoku-cpu"', "preset = 3"), ":2: preset = 3: expected a string"),
])
def test_a_recipe_file_mistake_is_reported_at_its_line(data_dir: Path, tmp_path: Path, edit, message: str) -> None:
    recipe = tmp_path / "mine.toml"
    recipe.write_text(edit(RECIPE))
    result = CliRunner().invoke(train_main, ["sudoku", "--recipe", str(recipe), "--data", str(data_dir),
                                             "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.stderr.startswith(f"hyperset-train: error: {recipe}") and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    # the same mistake made by --set names the --set, not a line of the file
    recipe.write_text(RECIPE)
    result = CliRunner().invoke(train_main, ["sudoku", "--recipe", str(recipe), "--data", str(data_dir),
                                             "--out", str(tmp_path / "o"), "--set", "train.steps=two"])
    assert result.exit_code == 2 and "error: train.steps = 'two': expected int" in result.stderr


def test_a_recipe_file_that_is_missing_or_not_text_is_named(data_dir: Path, tmp_path: Path) -> None:
    def train(recipe: str) -> str:
        result = CliRunner().invoke(train_main, ["sudoku", "--recipe", recipe, "--data", str(data_dir),
                                                 "--out", str(tmp_path / "o")])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        return result.stderr

    assert "no such file" in train(str(tmp_path / "gone.toml"))
    assert "is a folder" in train(str(tmp_path))
    (tmp_path / "latin1.toml").write_bytes(b'task = "sudoku"\n# \xe9t\xe9\n')
    assert "latin1.toml: not UTF-8 text (byte 0xe9 at offset 18)" in train(str(tmp_path / "latin1.toml"))
    assert "unknown recipe 'sudoku-cpuu'" in train("sudoku-cpuu")
    (tmp_path / "plain.txt").write_text(RECIPE)  # a path with another suffix is read as TOML all the same
    result = CliRunner().invoke(train_main, ["sudoku", "--recipe", str(tmp_path / "plain.txt"), "--data",
                                             str(data_dir), "--out", str(tmp_path / "o"), "--quiet"])
    assert result.exit_code == 0 and result.stdout.startswith("done: step 2, best "), result.output


CtrlC = Callable[[int], object]  # the ctrl_c_at_batch fixture: at which batch, and it returns build_task


@pytest.fixture
def ctrl_c_at_batch(monkeypatch: pytest.MonkeyPatch) -> Iterator[CtrlC]:
    """`ctrl_c_at_batch(at)` makes hyperset-train's task send this process a SIGINT when it draws batch `at` (a
    real Ctrl-C at a known step) and returns the original build_task, to put back for a later command. SIGINT has
    Python's default handler meanwhile, as in a terminal, also where the suite runs as a background job
    (`pytest &`), which starts with SIGINT ignored: the trainer rightly leaves an ignored signal ignored."""
    import os

    from hyperset.training import cli

    def at_batch(at: int) -> object:
        build = cli.build_task

        def interrupted(*args: object) -> object:
            task = build(*args)
            batch = task.batch

            def batch_then_ctrl_c(step: int, *rest: object) -> object:
                if step == at:
                    os.kill(os.getpid(), signal.SIGINT)
                return batch(step, *rest)

            task.batch = batch_then_ctrl_c
            return task

        monkeypatch.setattr(cli, "build_task", interrupted)
        return build

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield at_batch
    signal.signal(signal.SIGINT, before)


def test_a_stopped_run_exits_with_the_signal_and_claims_no_best_it_lacks(data_dir: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        ctrl_c_at_batch: CtrlC) -> None:
    """Ctrl-C (SIGINT) stops a run at the next step with its state saved: the command says so and exits 130, and
    before the first evaluation it names no best checkpoint (--json: best is null)."""

    from hyperset.training import cli

    build = ctrl_c_at_batch(0)
    for extra in (["--quiet"], ["--json"]):
        out = tmp_path / extra[0].strip("-")
        result = CliRunner().invoke(train_main, [*TINY_CLI, "--steps", "4", "--data", str(data_dir), "--out",
                                                 str(out), *extra])
        assert result.exit_code == 130, result.output
        if extra == ["--json"]:
            report = json.loads(result.stdout)
            assert report["best"] is None and not report["finished"] and report["stopped_by"] == "SIGINT"
        else:
            assert result.stdout == (f"stopped (SIGINT) at step 1 of 4: the state is in {out}/last, continue with "
                                     "--resume\n")
        assert (out / "last").is_dir() and not (out / "best").exists()
    monkeypatch.setattr(cli, "build_task", build)
    result = CliRunner().invoke(train_main, [*TINY_CLI, "--steps", "4", "--data", str(data_dir), "--out",
                                             str(tmp_path / "quiet"), "--resume", "--quiet"])
    assert result.exit_code == 0 and result.stdout.startswith("done: step 4, best "), result.output


def test_a_resumed_run_logs_each_step_once(data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Lines logged after the saved state (by a run killed before its next save, or one that never saved) are
    dropped when a run starts from that state, a line cut short by the kill included."""
    out = tmp_path / "run"
    Trainer(tiny_task(data_dir), train_cfg(4), out, quiet=True).fit()
    log = out / "metrics.jsonl"
    lines = log.read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines if "loss" in line] == [1, 2, 3, 4]
    killed = [json.dumps({"step": 5, "loss": 1.0}), json.dumps({"step": 6, "loss": 1.0}), '{"step": 7, "lo']
    log.write_text("\n".join(lines + killed) + "\n")  # steps 5-7 were logged, then the run was killed
    stale = out / ".metrics.jsonl.k78vmaom.tmp"  # and a kill during a rewrite of the log leaves its temporary file
    stale.write_text(lines[0])
    Trainer(tiny_task(data_dir), train_cfg(6), out, resume=True, quiet=True).fit()
    assert not stale.exists()
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines() if "loss" in line]
    assert steps == [1, 2, 3, 4, 5, 6]
    # a run that never saved (it diverged at once): a new run in its folder starts a new log
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "metrics.jsonl").write_text(json.dumps({"step": 1, "lr": math.inf, "loss": math.nan}) + "\n")
    Trainer(tiny_task(data_dir), train_cfg(2), fresh, resume=True, quiet=True).fit()
    assert f"warning: nothing to resume in {fresh}" in capsys.readouterr().err  # said even when quiet
    records = [json.loads(line) for line in (fresh / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2] and all(math.isfinite(r.get("lr", 0)) for r in records)


def test_cli_json_prints_only_json_on_stdout(data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = CliRunner().invoke(train_main, [*TINY_CLI, "--data", str(data_dir), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["step"] == 2  # the evaluation line is not on stdout


@pytest.mark.parametrize("rank, prints", [(0, True), (1, False)])
def test_only_the_main_process_reports_the_run(data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               rank: int, prints: bool) -> None:
    """Under torchrun every process runs the CLI; one report (one JSON line with --json) comes from rank 0, the
    process that tracks the best checkpoint."""
    from hyperset.training import trainer

    def fit(self: trainer.Trainer) -> dict:
        return {"step": 2, "steps": 2, "best": 0.5 if rank == 0 else None, "finished": True, "stopped_by": None,
                "rank": rank}

    monkeypatch.setattr(trainer.Trainer, "fit", fit)
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(train_main, [*TINY_CLI, "--data", str(data_dir), "--out", str(tmp_path / "o"),
                                                 *extra])
        assert result.exit_code == 0, result.output
        assert (result.stdout != "") is prints, result.stdout


def test_empty_or_missing_puzzle_files_are_named(tmp_path: Path, data_dir: Path) -> None:
    (tmp_path / "train.csv").write_text("")
    (tmp_path / "valid.csv").write_text((data_dir / "valid.csv").read_text())
    with pytest.raises(ValueError, match="train.csv: no training puzzles"):
        tiny_task(tmp_path)
    with pytest.raises(ValueError, match="no validation puzzles"):
        SudokuTask(model=preset_config("sudoku-cpu", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2),
                   data=SudokuData(data_dir=str(data_dir), n_train=0, n_val=0, n_select=0))


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


def test_cli_download_fetches_the_rrn_data_into_data_then_trains(data_dir: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import functools
    import gzip
    import zipfile

    from hyperset.sudoku import data as sudoku_data

    mirror = tmp_path / "mirror.zip"
    with zipfile.ZipFile(mirror, "w") as zf:
        zf.writestr("sudoku-hard/train.csv", gzip.decompress((data_dir / "train.csv.gz").read_bytes()))
        for split in ("valid", "test"):
            zf.writestr(f"sudoku-hard/{split}.csv", (data_dir / "valid.csv").read_text())
    monkeypatch.setattr(sudoku_data, "download_rrn", functools.partial(sudoku_data.download_rrn, url=mirror.as_uri()))
    args = ["sudoku", "--recipe", "sudoku-cpu", "--data", str(tmp_path / "data"), "--download", "--steps", "2",
            "--set", "model.dim=32", "--set", "model.heads=2", "--set", "model.ff_hidden=64",
            "--set", "model.time_dim=16", "--set", "model.iters=2", "--set", "data.n_val=10",
            "--set", "data.n_select=10", "--set", "train.batch_size=4", "--quiet"]
    result = CliRunner().invoke(train_main, args + ["--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "data" / "sudoku-hard" / "train.csv").is_file() and (tmp_path / "run" / "best").is_dir()
    no_data = CliRunner().invoke(train_main, args[:4] + ["", *args[5:], "--out", str(tmp_path / "run2")])
    assert no_data.exit_code == 2 and "--download needs --data DIR" in no_data.stderr


def test_cli_reports_missing_data_without_a_traceback(tmp_path: Path) -> None:
    result = CliRunner().invoke(train_main, ["sudoku", "--recipe", "sudoku-cpu", "--data", str(tmp_path / "none"),
                                             "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_a_save_that_fails_names_the_folder_and_keeps_the_last_good_state(data_dir: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while the state is saved was a safetensors traceback (exit 1), and the half-written last.tmp
    stayed on the full disk. Now it is one line that names the folder, the step and the state kept, exit 2, and
    the previous last/ is whole."""
    import safetensors.torch

    from hyperset import checkpoint
    from hyperset.models import load_checkpoint

    out = tmp_path / "run"
    assert CliRunner().invoke(train_main, [*TINY_CLI, "--data", str(data_dir), "--out", str(out),
                                           "--quiet"]).exit_code == 0

    def disk_full(*args: object, **kwargs: object) -> None:
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_file", disk_full)
    result = CliRunner().invoke(train_main, [*TINY_CLI, "--steps", "4", "--data", str(data_dir), "--out", str(out),
                                             "--resume", "--quiet"])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.strip() == (f"hyperset-train: error: cannot save {out}/last at step 4: No space left on "
                                     f"device; the last good state (step 2) is still in {out}/last")
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("last")) == ["last"]
    assert not [p for p in (out / "last").iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(checkpoint, "save_file", safetensors.torch.save_file)
    assert json.loads((out / "last" / "trainer.json").read_text())["step"] == 2
    load_checkpoint(out / "last")


def test_a_second_ctrl_c_during_the_final_save_does_not_cut_it_short(data_dir: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     ctrl_c_at_batch: CtrlC) -> None:
    """The default handlers came back before the final save, so a second Ctrl-C (or SIGTERM) while it wrote
    stopped it half-way: exit 1, last.tmp left, the steps since the previous save lost. The final save now runs
    under the trainer's handlers."""
    import os

    from hyperset.training import trainer

    save = trainer.save_training_state
    calls: list[int] = []
    def ctrl_c_again(*args: object, **kwargs: object) -> None:
        calls.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        save(*args, **kwargs)

    ctrl_c_at_batch(2)
    monkeypatch.setattr(trainer, "save_training_state", ctrl_c_again)
    out = tmp_path / "run"
    result = CliRunner().invoke(train_main, [*TINY_CLI, "--steps", "6", "--set", "train.eval_every=100", "--data",
                                             str(data_dir), "--out", str(out), "--quiet"])
    assert result.exit_code == 130 and calls == [1], result.output
    assert result.stdout == f"stopped (SIGINT) at step 3 of 6: the state is in {out}/last, continue with --resume\n"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("last")) == ["last"]
    assert json.loads((out / "last" / "trainer.json").read_text())["step"] == 3


def test_a_run_folder_whose_state_lost_its_progress_is_not_overwritten(data_dir: Path, tmp_path: Path) -> None:
    """last/ without trainer.json used to count as an empty folder: with or without --resume a new run replaced
    best/, last/ and the log. It is refused now, naming the folder, exit 2. So is a new run (no --resume) in the
    folder of a finished run whose last/ was removed (best/ and the log kept), as the docs' commands for the
    shipped runs would have been."""
    out = tmp_path / "run"
    args = [*TINY_CLI, "--data", str(data_dir), "--out", str(out), "--quiet"]
    assert CliRunner().invoke(train_main, args).exit_code == 0
    (out / "last" / "trainer.json").unlink()
    kept = {p: p.read_bytes() for p in [out / "metrics.jsonl", *sorted((out / "best").iterdir())]}
    for extra in ([], ["--resume"]):
        result = CliRunner().invoke(train_main, [*args, *extra])
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert result.stderr.strip() == (f"hyperset-train: error: {out}/last has no trainer.json: not a training "
                                         "state this command can resume, and a new run would overwrite it; move it "
                                         "away or choose another --out")
    assert all(p.read_bytes() == data for p, data in kept.items())
    import shutil

    shutil.rmtree(out / "last")
    result = CliRunner().invoke(train_main, args)
    assert result.exit_code == 2 and result.stderr.strip() == (
        f"hyperset-train: error: {out} holds an earlier run's best and metrics.jsonl but no last/ to resume from; a "
        "new run would replace them: choose another --out (or remove them to start over there)"), result.output
    assert all(p.read_bytes() == data for p, data in kept.items())


@pytest.mark.parametrize("damage, message", [
    ("rng", "optimizer.safetensors: rng.torch is float32 (5,), a random state is uint8"),
    ("shape", "the optimizer state does not fit this run's optimizer (tensor 'state.0.exp_avg' is float32 (3,), "
              "its parameter"),
    ("0-d", "the optimizer state does not fit this run's optimizer (tensor 'state.0.exp_avg' is float32 (), its "
            "parameter"),
    ("step", "the optimizer state does not fit this run's optimizer (tensor 'state.0.step' is float32 (3,), expected "
             "a float scalar"),
    ("name", "the optimizer state does not fit this run's optimizer (tensor 'moments.0' is not an optimizer state"),
    ("index", "the optimizer state does not fit this run's optimizer (tensor 'state.999.exp_avg': this run's "
              "optimizer has"),
    ("betas", "the optimizer state does not fit this run's optimizer (param_groups: a group lacks betas)"),
    ("dropped", "the optimizer state does not fit this run's optimizer (the states of parameters [0] are missing"),
])
def test_an_optimizer_state_that_does_not_fit_is_refused_before_training(data_dir: Path, tmp_path: Path,
                                                                         damage: str, message: str) -> None:
    """A readable but wrong optimizer.safetensors / trainer.json gave torch's TypeError, RuntimeError or KeyError
    (a moment of the wrong shape only at the next step), exit 1 with a traceback, or (a parameter's state gone)
    resumed with that state reset: now one line, exit 2."""
    import safetensors.torch
    import torch

    out = tmp_path / "run"
    args = [*TINY_CLI, "--data", str(data_dir), "--out", str(out), "--quiet"]
    assert CliRunner().invoke(train_main, args).exit_code == 0
    path = out / "last" / "optimizer.safetensors"
    tensors = safetensors.torch.load_file(path)
    if damage == "rng":
        tensors["rng.torch"] = torch.zeros(5)
    elif damage in ("shape", "0-d", "step"):  # a 0-d moment passed the check and failed at the first step
        tensors[f"state.0.{'step' if damage == 'step' else 'exp_avg'}"] = torch.zeros(() if damage == "0-d" else 3)
    elif damage in ("name", "index"):
        tensors["moments.0" if damage == "name" else "state.999.exp_avg"] = torch.zeros(1)
    elif damage == "dropped":  # one parameter's moments gone: its Adam state would silently restart from zero
        tensors = {k: v for k, v in tensors.items() if not k.startswith("state.0.")}
    else:
        progress = json.loads((out / "last" / "trainer.json").read_text())
        del progress["optimizer"]["param_groups"][0]["betas"]
        (out / "last" / "trainer.json").write_text(json.dumps(progress))
    safetensors.torch.save_file(tensors, path)
    result = CliRunner().invoke(train_main, [*args, "--steps", "3", "--resume"])
    assert result.exit_code == 2 and result.stdout == "", result.output
    assert result.stderr.startswith("hyperset-train: error: ") and message in result.stderr, result.stderr


def test_resume_alone_continues_the_run_with_the_settings_it_was_started_with(data_dir: Path, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch,
                                                                               ctrl_c_at_batch: CtrlC) -> None:
    """The stop message says "continue with --resume", but --resume alone went on with the recipe's own --steps
    and values (a run started with --steps 6 resumed towards the recipe's 30,000 steps, and its --set model sizes
    no longer fitted). The settings given at the start are kept in last/trainer.json and reused; what the resuming
    command gives goes on top of them."""

    from hyperset.training import cli

    build = ctrl_c_at_batch(1)
    out = tmp_path / "run"
    started = [*TINY_CLI, "--steps", "6", "--set", "train.eval_every=3", "--data", str(data_dir), "--out", str(out)]
    result = CliRunner().invoke(train_main, [*started, "--quiet"])
    assert result.exit_code == 130 and "at step 2 of 6" in result.stdout, result.output
    command = json.loads((out / "last" / "trainer.json").read_text())["command"]
    assert command["steps"] == 6 and command["set"][-1] == "train.eval_every=3" and "model.dim=16" in command["set"]
    monkeypatch.setattr(cli, "build_task", build)
    resumed = ["sudoku", "--recipe", "sudoku-cpu", "--data", str(data_dir), "--out", str(out), "--resume"]
    result = CliRunner().invoke(train_main, resumed)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("resuming with the run's own settings: --set model.dim=16 ")
    assert "--steps 6" in result.stdout.splitlines()[0] and "done: step 6" in result.stdout
    schedule = json.loads((out / "last" / "trainer.json").read_text())["schedule"]
    assert schedule == [{"from_step": 0, "steps": 6}]
    # what the resuming command gives goes on top: a longer run; a --set given again is kept once, last
    result = CliRunner().invoke(train_main, [*resumed, "--steps", "8", "--set", "model.dim=16", "--quiet"])
    assert result.exit_code == 0 and result.stdout.startswith("done: step 8"), result.output
    kept = json.loads((out / "last" / "trainer.json").read_text())["command"]
    assert kept["steps"] == 8 and kept["set"].count("model.dim=16") == 1 and kept["set"][-1] == "model.dim=16"
    # --out and --resume alone: the recipe and the data folder are the run's own too
    result = CliRunner().invoke(train_main, ["sudoku", "--out", str(out), "--resume", "--steps", "9"])
    assert result.exit_code == 0 and "done: step 9" in result.stdout, result.output
    assert "--recipe sudoku-cpu" in result.stdout.splitlines()[0] and f"--data {data_dir}" in result.stdout
    missing = CliRunner().invoke(train_main, ["sudoku", "--out", str(tmp_path / "new")])
    assert missing.exit_code == 2 and "--recipe" in missing.output


def test_a_stopped_and_resumed_run_logs_what_an_uninterrupted_one_does(data_dir: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       ctrl_c_at_batch: CtrlC) -> None:
    """The losses of the steps between the last log line and a stop were never logged: the resumed run's next
    line averaged only the steps after the resume. last/ now keeps their sums, and the log of a stopped and
    resumed run has the lines of an uninterrupted one."""
    from hyperset.training import cli

    args = [*TINY_CLI, "--steps", "6", "--set", "train.log_every=3", "--set", "train.eval_every=100", "--data",
            str(data_dir), "--quiet"]
    assert CliRunner().invoke(train_main, [*args, "--out", str(tmp_path / "straight")]).exit_code == 0
    build = ctrl_c_at_batch(3)  # stops after step 4, between the log lines of steps 3 and 6
    out = tmp_path / "stopped"
    result = CliRunner().invoke(train_main, [*args, "--out", str(out)])
    assert result.exit_code == 130 and "at step 4 of 6" in result.stdout, result.output
    assert json.loads((out / "last" / "trainer.json").read_text())["pending"]["count"] == 1
    monkeypatch.setattr(cli, "build_task", build)
    assert CliRunner().invoke(train_main, [*args, "--out", str(out), "--resume"]).exit_code == 0

    def losses(run: Path) -> list[tuple[int, float, float]]:
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        return [(r["step"], r["loss"], r["grad_norm"]) for r in records if "loss" in r]

    straight, resumed = losses(tmp_path / "straight"), losses(out)
    assert [s for s, _, _ in resumed] == [s for s, _, _ in straight] == [3, 6]
    for (_, a, g), (_, b, h) in zip(straight, resumed):
        assert a == pytest.approx(b, rel=1e-12, abs=0) and g == pytest.approx(h, rel=1e-12, abs=0)
