"""One meaning per option across hyperset-train, hyperset-eval and hyperset-export; --version; renamed options."""

from __future__ import annotations

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

    monkeypatch.setattr(train_cli, "Trainer", FakeTrainer)
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
    from hyperset.cli import check_output_file
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
