"""One meaning per option across hyperset-train, hyperset-eval and hyperset-export; --version; renamed options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from conftest import write_sudoku_csvs

from hyperset.cli_options import echo_json, package_version, renamed_option
from hyperset.exports.cli import main as export_main
from hyperset.training import cli as train_cli
from hyperset.training.evaluate import main as eval_main


def _commands() -> dict[str, click.Command]:
    out = {f"hyperset-eval {n}": c for n, c in eval_main.commands.items()
           if not (c.help or "").startswith("(not installed)")}
    out.update({f"hyperset-train {n}": c for n, c in train_cli.main.commands.items()})
    out["hyperset-export"] = export_main
    return out


@pytest.mark.parametrize("main, prog", [(eval_main, "hyperset-eval"), (train_cli.main, "hyperset-train"),
                                        (export_main, "hyperset-export")])
def test_version(main: click.Command, prog: str) -> None:
    run = CliRunner().invoke(main, ["--version"])
    assert run.exit_code == 0 and run.output.strip() == f"{prog} {package_version()}"


@pytest.mark.parametrize("name", [*sorted(_commands()), "hyperset-solve"])
def test_every_option_says_what_it_does(name: str) -> None:
    from hyperset.cli import solve_main
    command = solve_main if name == "hyperset-solve" else _commands()[name]
    bare = [p.opts[0] for p in command.params if isinstance(p, click.Option) and not p.hidden and not p.help]
    assert not bare, f"{name}: {', '.join(bare)} without help"


def test_package_version_falls_back_to_the_source_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    import hyperset

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert package_version() == hyperset.__version__


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_computing_command_has_device_threads_and_json(name: str) -> None:
    command = _commands()[name]
    options = {opt: p for p in command.params if isinstance(p, click.Option) for opt in p.opts}
    for opt in ("--device", "--threads", "--json"):
        assert opt in options, f"{name} lacks {opt}"
    assert options["--device"].default == "auto"
    assert "auto | cpu | cuda" in options["--device"].help
    assert options["--threads"].type.min == 1
    if name.startswith("hyperset-eval"):
        assert "--batch-size" in options and "--batch" not in [o for o, p in options.items() if not p.hidden]


def test_steps_means_optimizer_steps_only() -> None:
    for name, command in _commands().items():
        visible = {o for p in command.params if isinstance(p, click.Option) and not p.hidden for o in p.opts}
        if "--steps" in visible:
            assert name.startswith("hyperset-train"), name
    mim_help = CliRunner().invoke(eval_main, ["mim", "--help"]).output
    assert "--decode-steps" in mim_help and "--steps " not in mim_help and "--batch " not in mim_help


def _toy() -> click.Command:
    @click.command()
    @renamed_option("--batch-size", "batch", old="--batch", type=click.IntRange(min=1), default=7)
    def toy(batch: int) -> None:
        echo_json({"batch": batch, "nan": float("nan")})

    return toy


@pytest.mark.parametrize("args, value, warned", [
    ([], 7, False), (["--batch-size", "3"], 3, False), (["--batch", "4"], 4, True),
    (["--batch", "4", "--batch-size", "5"], 5, True), (["--batch-size", "5", "--batch", "4"], 5, True)])
def test_renamed_option_keeps_the_old_name_as_a_deprecated_alias(args: list[str], value: int, warned: bool) -> None:
    run = CliRunner().invoke(_toy(), args)
    assert run.exit_code == 0, run.output
    assert run.stdout == f'{{"batch": {value}, "nan": null}}\n'
    assert ("--batch is deprecated" in run.stderr) == warned
    assert "--batch " not in CliRunner().invoke(_toy(), ["--help"]).output


def test_train_threads_is_the_recipe_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class FakeTrainer:
        def __init__(self, task: Any, train: Any, out: Path, **kw: Any) -> None:
            seen["threads"] = train.threads

        def fit(self) -> dict[str, Any]:
            return {"step": 1, "steps": 1, "best": 0.0, "finished": True, "stopped_by": None}

    from hyperset.training import trainer

    monkeypatch.setattr(trainer, "Trainer", FakeTrainer)  # hyperset-train imports it when it runs
    data = write_sudoku_csvs(tmp_path, 4, 4, seed=0)
    base = ["sudoku", "--recipe", "sudoku-cpu", "--data", str(data), "--out", str(tmp_path / "run"), "--json"]
    for extra, threads in (([], 1), (["--threads", "2"], 2), (["--threads", "2", "--set", "train.threads=3"], 3)):
        run = CliRunner().invoke(train_cli.main, [*base, *extra])
        assert run.exit_code == 0, run.output
        assert seen["threads"] == threads


@pytest.mark.parametrize("name", ["xpu", "lazy", "meta", "hpu", "cpu:1", "cuda:x", "gpu"])
def test_a_device_outside_the_listed_names_is_one_line_that_names_the_option(name: str) -> None:
    """--device takes what its help lists; torch's other device types (which this package does not run on) are
    refused up front, not met later as an assertion or a dispatcher dump."""
    from hyperset.device import pick_device

    with pytest.raises(ValueError, match=r"^--device '.+': expected auto, cpu, cuda, cuda:N or mps$"):
        pick_device(name)
    assert str(pick_device("CPU")) == "cpu" and str(pick_device("auto")) in ("cpu", "cuda", "mps")


def test_a_wrong_kind_of_path_is_named_for_what_it_is(tmp_path) -> None:
    """A file where a folder is expected (and the reverse), a missing run folder given to --schedule, a shipped
    model that a command does not handle: each error says which of these it is."""
    import click

    from hyperset.checkpoint import CheckpointError
    from hyperset.cli_options import check_output_file
    from hyperset.exports.cli import resolve_checkpoint
    from hyperset.sudoku.data import find_split
    from hyperset.training.trainer import parse_schedule

    (tmp_path / "afile").write_text("x")
    with pytest.raises(click.UsageError, match=r"--out: cannot write .*afile/r\.json: .*afile is a file, not a folder"):
        check_output_file("--out", str(tmp_path / "afile" / "r.json"))
    with pytest.raises(FileNotFoundError, match=r"afile \(a file: --data names the folder that holds the splits\)"):
        find_split(tmp_path / "afile", "train")
    with pytest.raises(ValueError, match=r"or a run folder or JSON file that records one \(runs/zzz does not exist\)"):
        parse_schedule("runs/zzz")
    with pytest.raises(CheckpointError, match="the shipped mim-tokenizer model is not one hyperset-export writes"):
        resolve_checkpoint("mim-tokenizer")


@pytest.mark.parametrize("args, line", [
    (["hyperset-eval", "sudoku", "--iters", "0"],
     "hyperset-eval sudoku: error: Invalid value for '--iters': 0 is not in the range 1<=x<=10000."),
    (["hyperset-eval", "classify", "--iters", "20000"],
     "hyperset-eval classify: error: Invalid value for '--iters': 20000 is not in the range 1<=x<=10000."),
    (["hyperset-eval", "mim", "--iters", "20000"],
     "hyperset-eval mim: error: Invalid value for '--iters': 20000 is not in the range 1<=x<=10000."),
    (["hyperset-solve", "--batch-size", "0", "x.txt"],
     "hyperset-solve: error: Invalid value for '--batch-size': 0 is not in the range 1<=x<=65536."),
    (["hyperset-train", "sudoku", "--recipe", "sudoku-cpu", "--out", "o", "--bogus"],
     "hyperset-train sudoku: error: No such option '--bogus'. Did you mean '--out'?"),
    (["hyperset-export", "sudoku", "--out", "x.onnx", "--opset", "13"],
     "hyperset-export: error: Invalid value for '--opset': 13 is not in the range 14<=x<=20."),
    (["hyperset-eval", "sudoku", "--data", ""], "hyperset-eval sudoku: error: --data: an empty path"),
    (["hyperset-eval", "sudoku", "--data", "d", "--out", ""], "hyperset-eval sudoku: error: --out: an empty path"),
    (["hyperset-export", "sudoku", "--out", ""], "hyperset-export: error: --out: an empty path"),
])
@pytest.mark.slow
def test_a_usage_error_is_one_line_with_exit_2(args: list[str], line: str, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command, click's own checks included (ranges, unknown options), where click prints the usage, a hint
    and the message on three lines."""
    import subprocess
    import sys

    monkeypatch.chdir(tmp_path)
    module = {"hyperset-eval": "hyperset.training.evaluate", "hyperset-train": "hyperset.training.cli",
              "hyperset-export": "hyperset.exports.cli", "hyperset-solve": "hyperset.cli"}[args[0]]
    code = (f"import sys; from {module} import {'solve_main' if args[0] == 'hyperset-solve' else 'main'} as m; "
            f"sys.argv = {args!r}; m(prog_name={args[0]!r})")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr == line + "\n"


def test_what_the_eval_and_export_commands_take_is_checked_before_work(tmp_path: Path) -> None:
    import torch

    from hyperset.exports.solver_backend import _ort_device
    from hyperset.sudoku.board import PuzzleError
    from hyperset.sudoku.data import load_csv
    from hyperset.training.eval_classify import resolve_checkpoint

    help_text = CliRunner().invoke(eval_main, ["sudoku", "--help"]).stdout
    assert "[default: 128 on a CPU, 256 on a GPU]" in " ".join(help_text.split())
    # a first line of data with a stray letter is a mistake at line 1, not a header to skip
    src = (tmp_path / "d").mkdir() or write_sudoku_csvs(tmp_path / "d", 1, 3, seed=0)
    lines = (src / "valid.csv").read_text().splitlines()
    (tmp_path / "bad.csv").write_text("\n".join(["x" + lines[0][1:], *lines[1:]]) + "\n")
    with pytest.raises(PuzzleError, match=r"bad\.csv:1: "):
        load_csv(tmp_path / "bad.csv")
    (tmp_path / "header.csv").write_text("\n".join(["quizzes,solutions", *lines]) + "\n")
    assert len(load_csv(tmp_path / "header.csv")[0]) == 3  # a header line is still a header
    if not torch.cuda.is_available():
        out = tmp_path / "p.onnx"
        run = CliRunner().invoke(export_main, ["sudoku", "--out", str(out), "--parity", "--device", "cuda"])
        assert run.exit_code == 2 and "CUDA was requested but cannot be used" in run.stderr
        assert not out.exists() and list(tmp_path.glob("p*")) == []  # nothing exported before the refusal
    assert resolve_checkpoint("classifier").name == "classifier"  # a shipped name, as hyperset-solve takes
    assert _ort_device("cuda:0") == _ort_device("cuda") == "cuda"
    with pytest.raises(ValueError, match="set CUDA_VISIBLE_DEVICES=1"):
        _ort_device("cuda:1")


@pytest.mark.slow
def test_the_package_imports_nothing_heavy_and_ctrl_c_while_torch_loads_is_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """`import hyperset` is instant (its names load on first use), so the console scripts can guard the import of
    their command: Ctrl-C while torch loads ends with "PROG: interrupted" and 130, not a traceback."""
    import importlib
    import subprocess
    import sys

    from hyperset import _entry

    probe = subprocess.run([sys.executable, "-c", "import sys, hyperset; assert 'torch' not in sys.modules; "
                            "hyperset.create_model; assert 'torch' in sys.modules; print(hyperset.core.__name__)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0 and probe.stdout.strip() == "hyperset.core", probe.stderr

    def ctrl_c(name: str) -> None:  # Ctrl-C arriving while the command's module (and torch) load
        raise KeyboardInterrupt

    monkeypatch.setattr(importlib, "import_module", ctrl_c)
    for script, prog in ((_entry.solve, "hyperset-solve"), (_entry.train, "hyperset-train"),
                         (_entry.app, "hyperset-app")):
        with pytest.raises(SystemExit) as stop:
            script()
        assert stop.value.code == 130 and capsys.readouterr().err == f"{prog}: interrupted\n"


def test_ctrl_c_in_a_command_that_does_not_handle_it_is_one_line_and_130(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """hyperset-export and hyperset-eval leave Ctrl-C to click, which printed "Aborted!" and exited 1, the code
    hyperset-export gives a parity mismatch. Now it is "PROG: interrupted", 130, and nothing is written."""
    from hyperset.exports import export as E

    def ctrl_c(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(E, "export_unrolled", ctrl_c)
    out = tmp_path / "m.onnx"
    result = CliRunner().invoke(export_main, ["sudoku", "--out", str(out)], prog_name="hyperset-export")
    assert result.exit_code == 130 and result.stderr.strip() == "hyperset-export: interrupted", result.output
    assert not out.exists()
    from hyperset.sudoku import evaluate

    monkeypatch.setattr(evaluate, "evaluate", ctrl_c)
    data = tmp_path / "data"
    data.mkdir()
    write_sudoku_csvs(data, 2, 4, seed=0)
    result = CliRunner().invoke(eval_main, ["sudoku", "--data", str(data), "--boards", "2"], prog_name="hyperset-eval")
    assert result.exit_code == 130 and result.stderr.strip() == "hyperset-eval: interrupted", result.output


def test_every_eval_command_takes_its_checkpoint_either_way(tmp_path: Path) -> None:
    """hyperset-eval sudoku took --checkpoint and classify / mim a CHECKPOINT argument; the other form was
    'No such option' or 'unexpected extra argument'. Each takes both now; two different models are refused."""
    for name in ("sudoku", "classify", "mim"):
        params = {p.name: p for p in eval_main.commands[name].params}
        assert isinstance(params["checkpoint"], click.Argument) and not params["checkpoint"].required, name
        assert "--checkpoint" in params["checkpoint_option"].opts, name
    data = tmp_path / "data"
    data.mkdir()
    write_sudoku_csvs(data, 2, 6, seed=0)
    reports = []
    for form in (["sudoku"], ["--checkpoint", "sudoku"], ["sudoku", "--checkpoint", "sudoku"]):
        result = CliRunner().invoke(eval_main, ["sudoku", *form, "--data", str(data), "--boards", "2", "--iters", "1",
                                                "--json", "--no-progress"])
        assert result.exit_code == 0, result.output
        reports.append(json.loads(result.stdout)["checkpoint"])
    assert reports == ["sudoku"] * 3
    result = CliRunner().invoke(eval_main, ["sudoku", "sudoku", "--checkpoint", str(tmp_path), "--data", str(data)],
                                prog_name="hyperset-eval")
    assert result.exit_code == 2 and result.stderr.strip() == (
        f"hyperset-eval sudoku: error: CHECKPOINT 'sudoku' and --checkpoint '{tmp_path}' name different models: "
        "give one"), result.output
