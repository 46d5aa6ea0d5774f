"""Robustness through the real command lines: bad files, options and checkpoint configs end in exit code 2 and one
line (never a traceback); a kill at any write or rename of a save leaves a run that resumes to the same weights;
a diverged run stops before saving and keeps its last good state; one run folder, one trainer."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint
from PIL import Image

from hyperset.cli import solve_main
from hyperset.config import preset_config
from hyperset.exports.cli import main as export_main
from hyperset.models import load_checkpoint
from hyperset.training.cli import main as train_main
from hyperset.training.evaluate import main as eval_main

ROOT = Path(__file__).resolve().parents[1]
CLIS = {"solve": solve_main, "export": export_main, "train": train_main, "eval": eval_main}
PUZZLE = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
# a run small enough to train in a second: 2 steps of a 16-dim model, evaluated at step 2
TINY_TRAIN = ["sudoku", "--recipe", "sudoku-cpu", "--steps", "2", "--set", "model.dim=16", "--set", "model.heads=2",
              "--set", "model.ff_hidden=16", "--set", "model.time_dim=16", "--set", "model.iters=1",
              "--set", "data.n_val=4", "--set", "data.n_select=4", "--set", "train.batch_size=4",
              "--set", "train.amp='off'", "--set", "train.eval_every=2", "--set", "train.threads=1"]


def write_tiny_checkpoint(path: Path, model: dict[str, Any] | None = None, info: dict[str, Any] | None = None
                          ) -> Path:
    """A 3-iteration Sudoku checkpoint whose config.json then gets `model` and `info` written over it."""
    write_tiny_sudoku_checkpoint(path)
    meta = json.loads((path / "config.json").read_text())
    meta["model"].update(model or {})
    meta.update(info or {})
    (path / "config.json").write_text(json.dumps(meta))
    return path


def write_images(root: Path) -> Path:
    """An ImageFolder tree with two 32 px images per split."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        (root / split / "a").mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / split / "a" / f"{i}.png")
    return root


def edit_trainer_json(run: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Pass trainer.json through `edit` (which returns the new object, or text)."""
    path = run / "last" / "trainer.json"
    new = edit(json.loads(path.read_text()))
    path.write_text(new if isinstance(new, str) else json.dumps(new))


@dataclass
class Case:
    """One bad input: `args` may name {ckpt} (a tiny checkpoint with `model`/`info` written into its config.json),
    {run} (a copy of a finished tiny training run, its trainer.json passed through `trainer`), {data} (Sudoku CSVs),
    {images} (an ImageFolder tree) and {tmp}; `patch` sets module attributes (smaller limits) for the run."""

    id: str
    cli: str
    args: list[str]
    message: str
    model: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    trainer: Callable[[dict[str, Any]], Any] | None = None
    stdin: bytes | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    patch: dict[str, Any] = field(default_factory=dict)


def _drop(*keys: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda d: {k: v for k, v in d.items() if k not in keys}


CASES = [
    # puzzle input: bounded reads
    Case("solve-dev-zero", "solve", ["/dev/zero", "--checkpoint", "{ckpt}"], "looks like a binary file"),
    Case("solve-stdin-over-limit", "solve", ["-", "--checkpoint", "{ckpt}"], "larger than 1 KiB",
         stdin=(PUZZLE + "\n").encode() * 30, patch={"hyperset.sudoku.parse.MAX_INPUT_BYTES": 1024}),
    Case("solve-gzip-bomb", "solve", ["{tmp}/bomb.txt.gz", "--checkpoint", "{ckpt}"], "expands to more than 64 KiB",
         files={"bomb.txt.gz": gzip.compress(b"# a comment\n" * 100_000)},  # 1.2 MB in 4 KB
         patch={"hyperset.sudoku.parse.MAX_INPUT_BYTES": 64 * 1024}),
    Case("solve-missing-file", "solve", ["{tmp}/nope.txt", "--checkpoint", "{ckpt}"], "file not found"),
    Case("solve-iters-0", "solve", ["-", "--checkpoint", "{ckpt}", "--iters", "0"], "between 1 and 10,000",
         stdin=PUZZLE.encode()),
    # checkpoint configs: one validator behind every loader
    *[Case(f"solve-trained-iterations-{name}", "solve", ["-", "--checkpoint", "{ckpt}"], "trained_iterations",
           info={"trained_iterations": value}, stdin=PUZZLE.encode())
      for name, value in (("abc", "abc"), ("0", 0), ("-3", -3), ("1e9", 1e9), ("10**9", 10**9), ("true", True))],
    *[Case(f"solve-search-iterations-{name}", "solve", ["-", "--checkpoint", "{ckpt}"], "search_iterations",
           info={"search_iterations": value}, stdin=PUZZLE.encode())
      for name, value in (("abc", "abc"), ("0", 0), ("-3", -3), ("1e9", 1e9), ("10**9", 10**9), ("true", True))],
    *[Case(f"solve-seconds-{value}", "solve", ["-", "--checkpoint", "{ckpt}", "--seconds", value],
           f"'{value}' is not a finite number", stdin=PUZZLE.encode()) for value in ("nan", "inf", "-inf")],
    Case("solve-heads-0", "solve", ["-", "--checkpoint", "{ckpt}"], "model.heads", model={"heads": 0},
         stdin=PUZZLE.encode()),
    Case("solve-dim-negative", "solve", ["-", "--checkpoint", "{ckpt}"], "model.dim", model={"dim": -32},
         stdin=PUZZLE.encode()),
    Case("solve-ff-hidden-0", "solve", ["-", "--checkpoint", "{ckpt}"], "model.ff_hidden", model={"ff_hidden": 0},
         stdin=PUZZLE.encode()),
    Case("solve-model-iters-1e9", "solve", ["-", "--checkpoint", "{ckpt}"], "model.iters",
         model={"iters": 10**9}, info={"trained_iterations": None}, stdin=PUZZLE.encode()),
    Case("solve-config-not-json", "solve", ["-", "--checkpoint", "{ckpt}"], "not valid JSON",
         files={"ckpt/config.json": b"{"}, stdin=PUZZLE.encode()),
    # a config received from someone else: sizes and floats bounded before anything is built or allocated
    *[Case(f"solve-{key}-{name}", "solve", ["-", "--checkpoint", "{ckpt}"], message, model=model,
           stdin=PUZZLE.encode())
      for key, name, model, message in (
          ("patch-grid", "6000", {"patch_grid": 6000}, "model.patch_grid = 6000: must be at most"),
          ("dim", "2**40", {"dim": 2**40, "heads": 1}, "model.dim = 1099511627776: must be at most"),
          ("dim", "2**70", {"dim": 2**70, "heads": 1}, "model.dim"),
          ("n-layers", "10**5", {"n_layers": 10**5}, "model.n_layers = 100000: must be at most 64"),
          ("time-max", "10**20", {"time_max": 10**20}, "time_max must be between 0 (no limit) and 10,000"),
          ("lora-rank", "10**6", {"lora_rank": 10**6}, "model.lora_rank"),
          ("norm-eps", "inf", {"norm_eps": float("inf")}, "model.norm_eps = inf: must be a finite number"),
          ("step-init", "nan", {"step_init": float("nan")}, "model.step_init = nan: must be a finite number"),
          ("step-init", "1e39", {"step_init": 1e39}, "model.step_init = 1e+39: must be a finite number"),
          ("norm-eps", "10**400", {"norm_eps": 10**400}, "model.norm_eps = inf: must be a finite number"))],
    Case("export-step-init-1e39", "export", ["{ckpt}", "-o", "{tmp}/x.onnx"], "model.step_init = 1e+39",
         model={"step_init": 1e39}),
    Case("eval-norm-eps-10**400", "eval", ["sudoku", "{ckpt}", "--data", "{data}/valid.csv"], "model.norm_eps",
         model={"norm_eps": 10**400}),
    Case("solve-model-over-the-size-budget", "solve", ["-", "--checkpoint", "{ckpt}"], "describes a model of",
         stdin=PUZZLE.encode(), patch={"hyperset.models.MAX_MODEL_BYTES": 1000}),
    Case("solve-config-nested-deeply", "solve", ["-", "--checkpoint", "{ckpt}"], "config.json: not valid JSON",
         files={"ckpt/config.json": b"[" * 100_000}, stdin=PUZZLE.encode()),
    Case("solve-config-5000-digit-integer", "solve", ["-", "--checkpoint", "{ckpt}"], "config.json: not valid JSON",
         files={"ckpt/config.json": b'{"format": ' + b"7" * 5000 + b"}"}, stdin=PUZZLE.encode()),
    Case("solve-config-over-the-size-limit", "solve", ["-", "--checkpoint", "{ckpt}"], "config.json is at most",
         stdin=PUZZLE.encode(), patch={"hyperset.checkpoint.MAX_JSON_BYTES": 100}),
    Case("solve-weights-empty", "solve", ["-", "--checkpoint", "{ckpt}"], "0 bytes: shorter than a safetensors header",
         files={"ckpt/model.safetensors": b""}, stdin=PUZZLE.encode()),
    Case("export-config-nested-deeply", "export", ["{ckpt}", "-o", "{tmp}/x.onnx"], "config.json: not valid JSON",
         files={"ckpt/config.json": b"[" * 100_000}),
    # export
    Case("export-parity-batch-10**20", "export", ["{ckpt}", "--parity", "--parity-batch", str(10**20), "-o",
                                                  "{tmp}/x.onnx"], "is not in the range 1<=x<=64"),
    Case("export-iters-1e8", "export", ["{ckpt}", "--iters", "100000000", "-o", "{tmp}/x.onnx"],
         "100000000 is not in the range 1<=x<=10000"),
    Case("export-out-folder-missing", "export", ["{ckpt}", "-o", "{tmp}/missing/x.onnx"],
         "folder {tmp}/missing does not exist"),
    Case("export-heads-0", "export", ["{ckpt}", "-o", "{tmp}/x.onnx"], "model.heads", model={"heads": 0}),
    Case("export-trained-iterations-1e9", "export", ["{ckpt}", "-o", "{tmp}/x.onnx"], "trained_iterations",
         info={"trained_iterations": 10**9}),
    Case("export-missing-checkpoint", "export", ["{tmp}/nope", "-o", "{tmp}/x.onnx"], "no such checkpoint"),
    # evaluation
    Case("eval-mim-temperature-nan", "eval", ["mim", "--data", "{images}", "--images", "2", "--decode-steps", "2",
                                              "--temperature", "nan"], "temperature"),
    Case("eval-mim-temperature-inf", "eval", ["mim", "--data", "{images}", "--images", "2", "--decode-steps", "2",
                                              "--temperature", "inf"], "temperature"),
    Case("eval-mim-randomize-temp-nan", "eval", ["mim", "--data", "{images}", "--images", "2", "--decode-steps", "2",
                                                 "--randomize-temp", "nan"], "randomize-temp"),
    Case("eval-first-line-three-fields", "eval", ["sudoku", "{ckpt}", "--data", "{tmp}/mix.csv"],
         "mix.csv:1: expected 'puzzle,solution' (2 comma-separated fields), found 3",
         files={"mix.csv": f"{PUZZLE},{PUZZLE},extra\n{PUZZLE},{PUZZLE}\n".encode()}),
    Case("eval-checkpoint-empty", "eval", ["sudoku", "--checkpoint", "", "--data", "{data}/valid.csv"],
         "an empty path"),
    Case("export-checkpoint-empty", "export", ["", "-o", "{tmp}/x.onnx"], "an empty path"),
    # training
    Case("train-batch-1e7", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{tmp}/o",
                                      "--set", "train.batch_size=10000000"], "train.batch_size"),
    Case("train-steps-0", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{tmp}/o", "--steps", "0"],
         "0 is not in the range x>=1"),
    Case("train-resume-trainer-json-missing-keys", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{run}",
                                                             "--resume", "--steps", "3"],
         "trainer.json: missing step, optimizer", trainer=_drop("step", "optimizer")),
    Case("train-resume-trainer-json-bad-optimizer", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{run}",
                                                              "--resume", "--steps", "3"],
         "trainer.json: optimizer", trainer=lambda d: {**d, "optimizer": {"param_groups": 3}}),
    Case("train-resume-trainer-json-not-json", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{run}",
                                                         "--resume", "--steps", "3"],
         "trainer.json: not valid JSON", trainer=lambda d: "{not json"),
    Case("train-resume-trainer-json-nested-deeply", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{run}",
                                                              "--resume", "--steps", "3"],
         "trainer.json: not valid JSON", trainer=lambda d: "[" * 100_000),
    Case("train-resume-betas-not-numbers", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{run}",
                                                     "--resume", "--steps", "3"],
         "param_groups: betas = 'xy' is not a value of its kind",
         trainer=lambda d: {**d, "optimizer": {**d["optimizer"], "param_groups": [
             {**g, "betas": "xy"} for g in d["optimizer"]["param_groups"]]}}),
    Case("train-resume-lr-infinite", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{run}",
                                               "--resume", "--steps", "3"],
         "param_groups: lr = inf", trainer=lambda d: {**d, "optimizer": {**d["optimizer"], "param_groups": [
             {**g, "lr": float("inf")} for g in d["optimizer"]["param_groups"]]}}),
    Case("train-threads-1e5", "train", [*TINY_TRAIN, "--data", "{data}", "--out", "{tmp}/o",
                                        "--set", "train.threads=100000"], "train.threads = 100000: must be between"),
    Case("train-recipe-nested-deeply", "train", ["sudoku", "--recipe", "{tmp}/deep.toml", "--data", "{data}",
                                                 "--out", "{tmp}/o"], "deep.toml: invalid TOML: nested too deeply",
         files={"deep.toml": b"[model]\nx = " + b"[" * 50_000 + b"]" * 50_000 + b"\n"}),
]


@pytest.fixture(scope="module")
def sudoku_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sudoku_csvs(tmp_path_factory.mktemp("sudoku-data"), 40, 10, seed=3)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, sudoku_data: Path) -> Path:
    out = tmp_path_factory.mktemp("run") / "o"
    result = CliRunner().invoke(train_main, [*TINY_TRAIN, "--data", str(sudoku_data), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    return out


def prepare(case: Case, tmp: Path, sudoku_data: Path, finished_run: Path | None) -> list[str]:
    """Write the case's files and return its arguments with the placeholders filled in."""
    names = {"tmp": str(tmp), "data": str(sudoku_data), "ckpt": str(tmp / "ckpt"), "images": str(tmp / "images"),
             "run": str(tmp / "run")}
    text = " ".join(case.args)
    if "{ckpt}" in text:
        write_tiny_checkpoint(tmp / "ckpt", case.model, case.info)
    if "{images}" in text:
        write_images(tmp / "images")
    if "{run}" in text:
        shutil.copytree(finished_run, tmp / "run")
        edit_trainer_json(tmp / "run", case.trainer)
    for name, data in case.files.items():
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    return [a.format(**names) for a in case.args]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_exits_2_with_one_line(case: Case, tmp_path: Path, sudoku_data: Path, request: pytest.FixtureRequest,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    run = request.getfixturevalue("finished_run") if "{run}" in " ".join(case.args) else None
    args = prepare(case, tmp_path, sudoku_data, run)
    for target, value in case.patch.items():
        monkeypatch.setattr(target, value)
    result = CliRunner().invoke(CLIS[case.cli], args, input=case.stdin)
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output and not isinstance(result.exception, Exception)
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and case.message.format(tmp=tmp_path) in lines[0], result.stderr


def test_export_to_a_missing_folder_creates_nothing(tmp_path: Path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt")
    result = CliRunner().invoke(export_main, [str(ckpt), "-o", str(tmp_path / "a" / "b" / "x.onnx")])
    assert result.exit_code == 2 and not (tmp_path / "a").exists()


# ----------------------------------------------------------------------------------------------------------------
# hyperset-solve: output errors and Ctrl-C


@pytest.mark.slow
def test_solve_to_a_full_disk_is_one_line(tmp_path: Path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt")
    (tmp_path / "p.txt").write_text(PUZZLE + "\n")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "hyperset.cli", str(tmp_path / "p.txt"), "--checkpoint",
                               str(ckpt)], stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "hyperset-solve: error: cannot write the results: No space left on device"


def test_ctrl_c_while_solving_exits_130_and_keeps_the_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    from hyperset.solve import Solver

    ckpt = write_tiny_checkpoint(tmp_path / "ckpt")
    stream = Solver._stream  # each batch's frames
    calls = []

    def interrupted_on_the_second_batch(self: Solver, *args: Any, **kw: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return stream(self, *args, **kw)

    monkeypatch.setattr(Solver, "_stream", interrupted_on_the_second_batch)
    stdin = "\n".join([PUZZLE] * 3)
    args = ["-", "--checkpoint", str(ckpt), "--strategy", "single", "--batch-size", "1"]
    result = CliRunner().invoke(solve_main, args, input=stdin)
    assert result.exit_code == 130, result.output
    assert "<stdin>, puzzle 1 " in result.stdout and "puzzle 2 " not in result.stdout
    assert "interrupted after 1 puzzle (2 read)" in result.stdout
    calls.clear()
    result = CliRunner().invoke(solve_main, [*args, "--json"], input=stdin)
    payload = json.loads(result.stdout)
    assert result.exit_code == 130 and len(payload["results"]) == 1
    assert payload["summary"]["interrupted"] is True and payload["summary"]["puzzles"] == 1


# ----------------------------------------------------------------------------------------------------------------
# the trainer: divergence, atomic folders, the run lock


def test_a_diverged_run_stops_before_saving_and_resumes_with_a_sane_lr(sudoku_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    base = [*TINY_TRAIN, "--data", str(sudoku_data), "--out", str(out), "--quiet", "--steps", "4",
            "--set", "train.eval_every=100"]
    assert CliRunner().invoke(train_main, [*base, "--steps", "1"]).exit_code == 0  # a good state at step 1
    good = load_checkpoint(out / "last")[0].state_dict()
    diverge = ["--set", "train.lr=1e30", "--set", "train.warmup_steps=0", "--set", "train.save_every_seconds=0"]
    result = CliRunner().invoke(train_main, [*base, "--resume", *diverge])
    assert result.exit_code == 2, result.output
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "diverged" in lines[0] and f"last good state (step 1) in {out / 'last'}" in lines[0]
    kept = load_checkpoint(out / "last")[0].state_dict()
    assert all(torch.equal(good[k], kept[k]) for k in good)
    assert json.loads((out / "last" / "trainer.json").read_text())["step"] == 1
    result = CliRunner().invoke(train_main, [*base, "--resume", "--set", "train.lr=1e-3"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "last" / "trainer.json").read_text())["step"] == 4


def test_a_run_diverging_before_its_first_save_leaves_nothing_behind(sudoku_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = CliRunner().invoke(train_main, [*TINY_TRAIN, "--data", str(sudoku_data), "--out", str(out), "--quiet",
                                             "--set", "train.lr=1e30", "--set", "train.warmup_steps=0",
                                             "--set", "train.save_every_seconds=0"])
    assert result.exit_code == 2 and "no state was saved yet" in result.stderr, result.output
    assert not (out / "last").exists() and not (out / "best").exists()


class Killed(BaseException):
    """Stands for the process dying (not an Exception: nothing in the trainer may catch it)."""


def tiny_trainer(data: Path, out: Path, steps: int, resume: bool = False) -> Any:
    from hyperset.training.sudoku_task import SudokuData, SudokuTask
    from hyperset.training.trainer import TrainConfig, Trainer

    cfg = preset_config("sudoku-cpu", dim=16, heads=2, ff_hidden=16, time_dim=16, iters=1)
    task = SudokuTask(model=cfg, data=SudokuData(data_dir=str(data), n_train=0, n_val=4, n_select=4))
    train = TrainConfig(steps=steps, batch_size=4, lr=3e-3, min_lr=3e-4, warmup_steps=1, amp="off", eval_every=2,
                        log_every=1, save_every_seconds=1e9, threads=1)
    return Trainer(task, train, out, resume=resume, quiet=True)


def weights_and_meta(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    model, meta = load_checkpoint(folder)
    return model.state_dict(), {k: meta[k] for k in ("steps", "metrics")}


def save_points(monkeypatch: pytest.MonkeyPatch, kill_at: int | None) -> list[str]:
    """Count every file or folder rename and every folder removal (the moments a save changes what is on disk);
    with `kill_at`, the process dies just before that one."""
    seen: list[str] = []

    def wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def point(*args: Any, **kwargs: Any) -> Any:
            seen.append(f"{name} {Path(args[0]).parent.name}/{Path(args[0]).name}")
            if kill_at is not None and len(seen) == kill_at:
                raise Killed
            return real(*args, **kwargs)
        return point

    monkeypatch.setattr(os, "replace", wrap("replace", os.replace))
    monkeypatch.setattr(shutil, "rmtree", wrap("rmtree", shutil.rmtree))
    return seen


def saved_weights(monkeypatch: pytest.MonkeyPatch) -> dict[int, dict[str, torch.Tensor]]:
    """The weights the trainer hands to each save (best/ and last/), by step."""
    from hyperset.training.trainer import Trainer

    states: dict[int, dict[str, torch.Tensor]] = {}
    save = Trainer._save

    def recording(self: Trainer, directory: Path, model: torch.nn.Module, info: dict[str, Any]) -> None:
        states[info["steps"]] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        save(self, directory, model, info)

    monkeypatch.setattr(Trainer, "_save", recording)
    return states


@pytest.mark.slow
def test_a_kill_at_any_point_of_a_save_leaves_whole_folders_and_resumes_to_the_same_weights(
        sudoku_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        points, states = save_points(m, None), saved_weights(m)
        tiny_trainer(sudoku_data, tmp_path / "straight", 4).fit()  # saves best/ and last/ at step 2 and 4
    want = {name: weights_and_meta(tmp_path / "straight" / name) for name in ("best", "last")}
    assert len(points) >= 20 and sorted(states) == [2, 4], points
    for k, point in enumerate(points, start=1):
        out = tmp_path / f"kill{k}"
        with monkeypatch.context() as m:
            save_points(m, k)
            with pytest.raises(Killed):
                tiny_trainer(sudoku_data, out, 4).fit()
        for name in ("best", "last"):  # whatever is there is one whole save: its weights are those of its step
            if (out / name).exists():
                weights, meta = weights_and_meta(out / name)
                assert all(torch.equal(weights[p], states[meta["steps"]][p]) for p in weights), (point, name)
        tiny_trainer(sudoku_data, out, 4, resume=True).fit()
        for name in ("best", "last"):
            weights, meta = weights_and_meta(out / name)
            assert meta == want[name][1], (point, name)
            assert all(torch.equal(weights[p], want[name][0][p]) for p in weights), (point, name)
        assert sorted(p.name for p in out.iterdir()) == [".lock", "best", "last", "metrics.jsonl"], point


def test_a_second_trainer_on_the_same_folder_gets_one_line(sudoku_data: Path, tmp_path: Path) -> None:
    from hyperset.training.state import run_lock

    out = tmp_path / "o"
    out.mkdir()
    with run_lock(out):  # a live trainer holds the folder
        result = CliRunner().invoke(train_main, [*TINY_TRAIN, "--data", str(sudoku_data), "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and f"{out} is in use by another trainer (pid {os.getpid()})" in lines[0]
    assert not (out / "last").exists()


def test_a_lock_left_by_a_dead_trainer_does_not_block(sudoku_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / ".lock").write_text(dead.stdout)
    result = CliRunner().invoke(train_main, [*TINY_TRAIN, "--data", str(sudoku_data), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert (out / "last" / "trainer.json").is_file()


def _not_regular(tmp_path: Path, kind: str) -> tuple[Path, Callable[[], object]]:
    """A path that holds something other than a regular file, and a function that reads back what it holds."""
    import stat

    target = tmp_path / "target.txt"
    target.write_text("keep me\n")
    path = tmp_path / f"out-{kind}.png"
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    return path, lambda: (stat.S_IFMT(path.lstat().st_mode), target.read_text())


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_outputs_never_replace_a_link_a_fifo_or_a_folder(tmp_path: Path, kind: str) -> None:
    """`hyperset-export --out`, `hyperset-solve --plot` and `hyperset-eval --out` turned a FIFO, a symlink (its
    target unchanged) or a device node into a regular file, exit 0. Each is refused with one line, exit 2, and
    what was there is as it was."""
    from hyperset.checkpoint import NotReplacedError, atomic_write_bytes

    ckpt = write_tiny_sudoku_checkpoint(tmp_path / "m")
    path, look = _not_regular(tmp_path, kind)
    before = look()
    with pytest.raises(NotReplacedError):
        atomic_write_bytes(path, b"x")
    puzzles = tmp_path / "p.txt"
    puzzles.write_text("530070000600195000098000060800060003400803001700020006060000280000419005000080079\n")
    (tmp_path / "d").mkdir()
    write_sudoku_csvs(tmp_path / "d", 0, 4, seed=1)
    runs = [CliRunner().invoke(solve_main, [str(puzzles), "--checkpoint", str(ckpt), "--strategy", "single",
                                            "--plot", str(path)]),
            CliRunner().invoke(eval_main, ["sudoku", str(ckpt), "--data", str(tmp_path / "d" / "valid.csv"),
                                           "--out", str(path)])]
    if _has_onnx():
        runs.append(CliRunner().invoke(export_main, [str(ckpt), "--out", str(path)]))
    for run in runs:
        assert run.exit_code == 2 and "Traceback" not in run.output, run.output
        assert len([ln for ln in run.output.splitlines() if "error" in ln]) == 1, run.output
    assert look() == before


def _has_onnx() -> bool:
    import importlib.util

    return importlib.util.find_spec("onnx") is not None and importlib.util.find_spec("onnxruntime") is not None


def test_a_checkpoint_with_non_finite_weights_is_refused_by_export_and_init_from(tmp_path: Path, sudoku_data: Path,
                                                                                  finished_run: Path) -> None:
    """hyperset-export of a NaN checkpoint exited 0 (only --parity noticed); --init-from ran, then blamed the lr."""
    from safetensors.torch import load_file, save_file

    ckpt = tmp_path / "m"
    shutil.copytree(finished_run / "best", ckpt)
    weights = load_file(ckpt / "model.safetensors")
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name] = weights[name].clone().fill_(float("nan"))
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "hyperset", "kind": "hyperset"})
    runs = []
    if _has_onnx():
        runs.append(CliRunner().invoke(export_main, [str(ckpt), "--out", str(tmp_path / "m.onnx")]))
    runs.append(CliRunner().invoke(train_main, [*TINY_TRAIN, "--data", str(sudoku_data), "--out", str(tmp_path / "o"),
                                                "--init-from", str(ckpt), "--quiet"]))
    for run in runs:
        assert run.exit_code == 2 and "NaN or infinite" in run.output and "Traceback" not in run.output, run.output
    assert not (tmp_path / "m.onnx").exists() and not (tmp_path / "o" / "last").exists()


@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_checkpoint_file_that_is_not_a_regular_file_is_named_as_such(tmp_path: Path, name: str, kind: str) -> None:
    """A config.json or model.safetensors that is a FIFO (reading it would hang) or a folder is refused as what it
    is, not as "missing"."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt")
    (ckpt / name).unlink()
    os.mkfifo(ckpt / name) if kind == "fifo" else (ckpt / name).mkdir()
    result = CliRunner().invoke(solve_main, ["-", "--checkpoint", str(ckpt)], input=PUZZLE)
    what = "a FIFO" if kind == "fifo" else "a folder"
    assert result.exit_code == 2 and f"{ckpt / name} is {what}, not a regular file" in result.stderr, result.stderr
    assert len(error_lines(result.stderr)) == 1


def test_a_plot_that_cannot_be_written_after_solving_is_in_the_json_summary(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """--plot into a folder that refuses new files is refused before any work; one that fails when written, after
    the solve, is exit 2 with the reason in the JSON summary (not a summary without it and a bare exit 2)."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt")
    early = CliRunner().invoke(solve_main, ["-", "--checkpoint", str(ckpt), "--plot", "/proc/x.png"], input=PUZZLE)
    assert early.exit_code == 2 and "folder /proc takes no new files" in early.stderr and not early.stdout

    def full_disk(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("hyperset.cli.plot_energy", full_disk)
    late = CliRunner().invoke(solve_main, ["-", "--checkpoint", str(ckpt), "--strategy", "single", "--json",
                                           "--plot", str(tmp_path / "e.png")], input=PUZZLE)
    assert late.exit_code == 2, late.output
    doc = json.loads(late.stdout)
    assert len(doc["results"]) == 1 and "No space left on device" in doc["summary"]["error"]
    assert error_lines(late.stderr) == [f"hyperset-solve: error: {doc['summary']['error']}"]
