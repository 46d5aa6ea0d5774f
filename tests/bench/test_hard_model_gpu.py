"""bench/hard_model_gpu.py on the CPU (its rehearsal): calibrate, plan the steps that fit, train them, pack the run;
the deadline, the fallbacks on running out of memory and on a failing compile, and unpacking."""

import io
import json
import signal
import sys
import tarfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import hard_model_gpu as hg  # noqa: E402

TINY = ["model.dim=32", "model.heads=2", "model.ff_hidden=64", "model.time_dim=16", "model.iters=3",
        "objective.segments=2", "objective.eval_iters=[3, 6]", "objective.select_iters=6", "train.batch_size=8",
        "train.compile=false", "data.n_val=4", "data.n_select=4"]


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path]:
    from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint

    data = tmp_path / "data"
    data.mkdir()
    write_sudoku_csvs(data, 64, 8, seed=0)
    return data, write_tiny_sudoku_checkpoint(tmp_path / "start")


def _args(data: Path, start: Path, out: Path, minutes: float, *more: str) -> list[str]:
    sets = [a for s in TINY for a in ("--set", s)]
    return ["train", "--data", str(data), "--out", str(out), "--device", "cpu", "--threads", "1", "--minutes",
            str(minutes), "--init-from", str(start), "--calibration-steps", "10", *sets, *more]


def _report(out: Path) -> dict:
    return json.loads((out / hg.REPORT).read_text())


def test_the_rehearsal_trains_the_planned_steps_and_packs_a_run_that_loads(setup, tmp_path, monkeypatch) -> None:
    data, start = setup
    planned = []
    monkeypatch.setattr(hg, "plan_steps", lambda done, left, per_step, overhead: planned.append(
        (done, left, per_step, overhead)) or done + 6)
    out = tmp_path / "out"
    assert hg.main(_args(data, start, out, 5.0)) == 0
    (done, left, per_step, overhead), = planned
    assert done == 10 and 0 < left < 300 and per_step > 0 and overhead > 0
    report = _report(out)
    assert report["planned_steps"] == report["steps_done"] == 16 and report["finished"]
    assert report["stopped_by"] is None and report["calibration"]["batch_size"] == 8
    assert report["calibration"]["failed_tries"] == [] and report["train"]["warmup_steps"] == 10
    assert [e["step"] for e in report["evaluations"]] == [10, 12, 16]  # the warm-up's; every quarter of the run
    assert report["machine"]["device"] == "cpu" and report["command"].startswith("python bench/hard_model_gpu.py")
    from hyperset.training.trainer import TrainConfig, lr_at

    last = report["training_log"][-1]  # the cosine runs over the planned steps, not the recipe's
    assert last["step"] == 16 and last["lr"] == pytest.approx(lr_at(15, TrainConfig.from_dict(report["train"])))
    assert last["lr"] < 0.1 * report["train"]["lr"]

    run = tmp_path / "run"
    assert hg.main(["unpack", str(out / hg.ARCHIVE), "--out", str(run)]) == 0
    assert {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()} >= {
        "best/config.json", "best/model.safetensors", "last/trainer.json", "metrics.jsonl"}
    assert json.loads((run / "last" / "trainer.json").read_text())["step"] == 16
    from hyperset.models import load_checkpoint

    model, _ = load_checkpoint(run / "best")
    assert model.cfg.dim == 32
    assert hg.main(["unpack", str(out / hg.ARCHIVE), "--out", str(run)]) == 2  # never over what is there


def test_a_run_that_would_pass_its_deadline_is_stopped_there_with_its_state_saved(setup, tmp_path,
                                                                                 monkeypatch) -> None:
    data, start = setup
    monkeypatch.setattr(hg, "MARGIN_SECONDS", 0.0)
    monkeypatch.setattr(hg, "plan_steps", lambda done, left, per_step, overhead: 10**6)
    out = tmp_path / "out"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job: no signal stops the run
    try:
        assert hg.main(_args(data, start, out, 0.15)) == 0
    finally:
        signal.signal(signal.SIGINT, before)
    report = _report(out)
    assert report["stopped_by"] == "deadline" and not report["finished"]
    assert 10 < report["steps_done"] < 10**6 and report["wall_seconds"] < 9.0 + 5.0
    with tarfile.open(out / hg.ARCHIVE) as tar:
        saved = json.load(tar.extractfile("last/trainer.json"))
    assert saved["step"] == report["steps_done"]


def test_the_calibration_halves_the_batch_when_memory_runs_out_and_drops_a_failing_compile(setup, tmp_path,
                                                                                          monkeypatch) -> None:
    data, start = setup
    real = hg.Trainer

    class Picky(real):
        def fit(self):
            if self.cfg.batch_size > 4:
                raise torch.OutOfMemoryError("CUDA out of memory (a test)")
            if self.cfg.compile:
                raise RuntimeError("the compiler failed (a test)")
            return super().fit()

    monkeypatch.setattr(hg, "Trainer", Picky)
    monkeypatch.setattr(hg, "MIN_BATCH", 2)
    monkeypatch.setattr(hg, "plan_steps", lambda done, left, per_step, overhead: done)
    out = tmp_path / "out"
    assert hg.main(_args(data, start, out, 5.0, "--set", "train.compile=true")) == 0
    cal = _report(out)["calibration"]
    assert cal["batch_size"] == 4 and cal["compile"] is False
    assert [(t["batch_size"], t["compile"]) for t in cal["failed_tries"]] == [(8, True), (4, True)]
    assert "out of memory" in cal["failed_tries"][0]["error"] and "compiler" in cal["failed_tries"][1]["error"]


def test_unpack_takes_plain_files_only(tmp_path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(buf.getvalue())
    assert hg.main(["unpack", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "outside.txt").exists()


def test_without_a_gpu_auto_refuses_and_says_how_to_rehearse(setup, tmp_path, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    data, start = setup
    argv = [a for a in _args(data, start, tmp_path / "out", 1.0) if a != "cpu"]
    argv.remove("--device")
    assert hg.main(argv) == 2
    assert "no CUDA device here; --device cpu" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_failure_after_the_calibration_still_brings_back_what_was_saved(setup, tmp_path, monkeypatch) -> None:
    data, start = setup

    def broken(*args, **kwargs):
        raise RuntimeError("the device went away (a test)")

    monkeypatch.setattr(hg, "_run_to_deadline", broken)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        hg.main(_args(data, start, out, 5.0))
    report = _report(out)
    assert "the device went away" in report["error"] and report["steps_done"] == 10
    assert [e["step"] for e in report["evaluations"]] == [10]
    with tarfile.open(out / hg.ARCHIVE) as tar:
        assert json.load(tar.extractfile("last/trainer.json"))["step"] == 10


def test_with_no_time_left_after_the_calibration_the_warm_up_is_the_run(setup, tmp_path, monkeypatch) -> None:
    data, start = setup
    monkeypatch.setattr(hg, "plan_steps", lambda done, left, per_step, overhead: done)
    ran, real = [], hg.Trainer

    class Counted(real):
        def fit(self):
            ran.append(self.resume)
            return super().fit()

    monkeypatch.setattr(hg, "Trainer", Counted)
    out = tmp_path / "out"
    assert hg.main(_args(data, start, out, 5.0)) == 0
    report = _report(out)
    assert ran == [False]  # the calibration alone: no resumed run that would only read its state back
    assert report["steps_done"] == report["planned_steps"] == 10 and report["finished"]
    assert report["stopped_by"] is None and report["best"] is not None
