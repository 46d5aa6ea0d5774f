"""The trainer's contract with a task (hyperset.training.task.Task) and its logging: values stay on the device
between log lines and are averaged there; a loss that stops being finite ends the run before anything of it is
saved."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from hyperset.training.task import Task
from hyperset.training.trainer import DivergedError, TrainConfig, Trainer


@dataclass
class Line:
    """A one-parameter regression: y = 3x, examples drawn with the shared epoch order."""

    name: str = "line"
    select_metric: str = "neg_err"
    n: int = 40
    poison_at: int = -1  # from this step on the loss is NaN
    nan_once_at: int = -1  # this step's loss alone is NaN, its gradient finite (as a step fp16 loss scaling skips)
    losses: list = field(default_factory=list)


class LineTask(Line, Task):
    def model_config(self):
        return {"dim": 1}

    def build_model(self):
        return torch.nn.Linear(1, 1, bias=False)

    def train_size(self):
        return self.n

    def batch(self, step, batch_size, seed, device):
        x = torch.from_numpy(self.batch_indices(step, batch_size, seed).astype(np.float32))[:, None] / self.n
        return {"x": x.to(device), "y": (3 * x).to(device), "step": torch.full((batch_size,), step)}

    def loss(self, model, batch):
        loss = (model(batch["x"]) - batch["y"]).pow(2).mean()
        if 0 <= self.poison_at <= int(batch["step"][0]):
            loss = loss * float("nan")
        if int(batch["step"][0]) == self.nan_once_at:
            loss = loss + float("nan")
        self.losses.append(loss.detach())
        assert not isinstance(loss, float)
        return loss, {"twice": 2 * loss.detach()}

    def evaluate(self, model, device, autocast):
        return {"neg_err": -abs(float(model.weight.detach()) - 3.0)}

    def save(self, directory, model, info):
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), directory / "w.pt")
        (directory / "config.json").write_text(json.dumps({"model": {}, **info}))


def _cfg(**kw):
    base = dict(steps=7, batch_size=4, lr=0.1, warmup_steps=0, amp="off", eval_every=100, log_every=3,
                save_every_seconds=1e9, threads=1)
    return TrainConfig(**{**base, **kw})


def test_a_task_must_give_every_required_hook_and_gets_the_optional_ones():
    class Partial(Task):
        name, select_metric = "p", "m"

        def model_config(self):
            return None

    with pytest.raises(TypeError, match="abstract"):
        Partial()
    task = LineTask()
    assert task.loss_weight({"x": torch.zeros(5, 1)}) == 5.0 and task.describe() == {}
    assert task.batch_indices(3, 4, 0).tolist() == task.batch_indices(3, 4, 0).tolist()


def test_log_lines_are_means_over_their_interval(tmp_path: Path):
    task = LineTask()
    result = Trainer(task, _cfg(), tmp_path, device="cpu", quiet=True).fit()
    assert result["finished"] and result["step"] == 7
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if "loss" in x]
    assert [x["step"] for x in train] == [3, 6, 7]
    # the losses of the training steps (the last one is _check_finite's look at the next batch before a save)
    steps = [float(v) for v in task.losses[:7]]
    for line, (a, b) in zip(train, [(0, 3), (3, 6), (6, 7)]):
        assert line["loss"] == pytest.approx(np.mean(steps[a:b]), rel=1e-6)
        assert line["twice"] == pytest.approx(2 * line["loss"], rel=1e-6)
        assert set(line) == {"step", "time", "lr", "loss", "twice", "grad_norm"}


def test_a_nan_loss_ends_the_run_at_the_next_log_line_before_any_save(tmp_path: Path):
    with pytest.raises(DivergedError, match=r"diverged at step 3: the loss became nan; .*no state was saved yet"):
        Trainer(LineTask(poison_at=1), _cfg(), tmp_path, device="cpu", quiet=True).fit()
    assert not (tmp_path / "last").exists() and not (tmp_path / "best").exists()


def test_a_nan_loss_between_log_lines_ends_the_run_at_a_save_even_if_the_weights_stayed_finite(tmp_path: Path):
    # the evaluation at step 2 comes before the log line at step 3; the weights and the next batch's loss are
    # finite, but step 2's loss was not: nothing is saved
    with pytest.raises(DivergedError, match=r"diverged at step 2: the loss became nan; .*no state was saved yet"):
        Trainer(LineTask(nan_once_at=1), _cfg(eval_every=2), tmp_path, device="cpu", quiet=True).fit()
    assert not (tmp_path / "last").exists() and not (tmp_path / "best").exists()


def test_compile_where_torch_compile_cannot_run_trains_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """train.compile = true on a machine where torch.compile fails (a CPU without a C++ compiler): the run says why
    and trains eagerly instead of stopping at its first step with the compiler's traceback."""
    from hyperset.training import trainer

    assert trainer.compile_problem(torch.device("cpu")) is None  # this machine has a working compiler

    def no_compiler(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\n(the compiler's details)")

    monkeypatch.setattr(torch, "compile", no_compiler)
    assert trainer.compile_problem(torch.device("cpu")) == \
        "RuntimeError: InvalidCxxCompiler: No working C++ compiler found"
    result = Trainer(LineTask(), _cfg(compile=True), tmp_path, device="cpu", quiet=True).fit()
    assert result["finished"] and result["step"] == 7
    # a warning: on standard error, also from a quiet run
    assert "warning: train.compile = true, but torch.compile does not work on cpu here (RuntimeError: " \
           "InvalidCxxCompiler" in capsys.readouterr().err


def test_compile_mode_reaches_torch_compile_and_cuda_graphs_are_said_to_need_cuda(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """train.compile_mode is torch.compile's mode; reduce-overhead (CUDA graphs) on a CPU compiles as the default
    mode does, and the run says so. A mode without train.compile, or one torch.compile lacks, is refused."""
    modes, real = [], torch.compile

    def spy(model, **kwargs):
        if isinstance(model, torch.nn.Module):
            modes.append(kwargs.get("mode"))
        return real(model, **kwargs)

    monkeypatch.setattr(torch, "compile", spy)
    result = Trainer(LineTask(), _cfg(compile=True, compile_mode="reduce-overhead"), tmp_path, device="cpu").fit()
    assert result["finished"] and result["step"] == 7 and modes == ["reduce-overhead"]
    assert "reduce-overhead: CUDA graphs need a CUDA device; on cpu it compiles as the default mode does" \
        in capsys.readouterr().err
    Trainer(LineTask(), _cfg(compile=True), tmp_path / "default", device="cpu", quiet=True).fit()
    assert modes == ["reduce-overhead", None]
    with pytest.raises(ValueError, match="compile_mode = 'reduce-overhead' is torch.compile's mode: it needs "
                                         "train.compile = true"):
        TrainConfig(compile_mode="reduce-overhead")
    with pytest.raises(ValueError, match="train.compile_mode must be one of default, reduce-overhead"):
        TrainConfig(compile=True, compile_mode="fast")



def test_an_evaluation_that_fails_keeps_the_steps_trained_before_it_and_resume_goes_on(tmp_path: Path):
    """An unreadable validation file (a ValueError or OSError in evaluate) ends the run in one message, with the
    state of that step in last/; once the cause is fixed, --resume ends where an unbroken run ends."""
    from conftest import write_sudoku_csvs

    from hyperset.config import preset_config
    from hyperset.models import load_checkpoint
    from hyperset.training.sudoku_task import SudokuData, SudokuTask

    (tmp_path / "data").mkdir()
    data = write_sudoku_csvs(tmp_path / "data", 32, 10, seed=3)
    model = preset_config("sudoku-cpu", dim=16, heads=2, ff_hidden=32, time_dim=16, iters=2)

    def task():
        return SudokuTask(model=model, data=SudokuData(data_dir=str(data), n_train=0, n_val=5, n_select=5))

    class BadValidation(SudokuTask):
        def evaluate(self, model, device, autocast):
            raise OSError("val/cat/7.png: not a readable image (truncated)")

    cfg = TrainConfig(steps=6, batch_size=4, lr=3e-3, warmup_steps=0, amp="off", eval_every=3, log_every=2,
                      save_every_seconds=1e9, threads=1)
    bad = BadValidation(model=model, data=SudokuData(data_dir=str(data), n_train=0, n_val=5, n_select=5))
    with pytest.raises(ValueError, match=r"evaluation at step 3 failed: val/cat/7\.png: not a readable image "
                                         r"\(truncated\); the state at step 3 is in .*last: fix the cause and "
                                         r"continue with --resume"):
        Trainer(bad, cfg, tmp_path / "run", device="cpu", quiet=True).fit()
    assert json.loads((tmp_path / "run" / "last" / "trainer.json").read_text())["step"] == 3
    resumed = Trainer(task(), cfg, tmp_path / "run", device="cpu", quiet=True, resume=True).fit()
    unbroken = Trainer(task(), cfg, tmp_path / "ref", device="cpu", quiet=True).fit()
    assert resumed["finished"] and resumed["step"] == unbroken["step"] == 6
    assert resumed["best"] == unbroken["best"]  # the failed evaluation of step 3 ran first on resuming
    evals = lambda run: [x["step"] for x in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text()  # noqa: E731
                                                .splitlines()) if "eval" in x]
    assert evals("run") == evals("ref") == [3, 6]
    for folder in ("last", "best"):
        a, _ = load_checkpoint(tmp_path / "run" / folder)
        b, _ = load_checkpoint(tmp_path / "ref" / folder)
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    # the same at the last step: the resumed run only evaluates, and writes best/
    final = TrainConfig(**{**cfg.__dict__, "steps": 3})
    with pytest.raises(ValueError, match="evaluation at step 3 failed"):
        Trainer(bad, final, tmp_path / "end", device="cpu", quiet=True).fit()
    done = Trainer(task(), final, tmp_path / "end", device="cpu", quiet=True, resume=True).fit()
    assert done["finished"] and done["best"] is not None and (tmp_path / "end" / "best").is_dir()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_a_resumed_run_with_dropout_equals_an_unbroken_one_on_each_device(tmp_path: Path, device: str):
    # dropout on a GPU draws from the device's generator, which last/ must hold beside the CPU's
    import gzip

    from hyperset.config import preset_config
    from hyperset.models import load_checkpoint
    from hyperset.sudoku.exact import generate
    from hyperset.training.sudoku_task import SudokuData, SudokuTask

    rows = [f"{p},{s}\n" for p, s in generate(120, 30, 36, seed=1)]
    with gzip.open(tmp_path / "train.csv.gz", "wt") as f:
        f.writelines(rows[:90])
    (tmp_path / "valid.csv").write_text("".join(rows[90:]))

    def task() -> SudokuTask:
        model = preset_config("sudoku", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2, emb_dropout=0.1)
        return SudokuTask(model=model, data=SudokuData(data_dir=str(tmp_path), n_train=0, n_val=15, n_select=15))

    def cfg(steps: int) -> TrainConfig:
        return TrainConfig(steps=steps, batch_size=8, lr=1e-3, schedule="constant", amp="off", eval_every=1000,
                           log_every=1, save_every_seconds=1e9)

    Trainer(task(), cfg(20), tmp_path / "a", device=device, quiet=True).fit()
    Trainer(task(), cfg(8), tmp_path / "b", device=device, quiet=True).fit()
    Trainer(task(), cfg(20), tmp_path / "b", device=device, resume=True, quiet=True).fit()
    a, info = load_checkpoint(tmp_path / "a" / "last")
    b, _ = load_checkpoint(tmp_path / "b" / "last")
    assert info["metrics_precision"] == "fp32"  # what the recorded metrics were measured in (amp off)
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), k
