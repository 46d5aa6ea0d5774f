"""Benchmark scripts on tiny inputs: results go to --out with the command that made them, and input they cannot
use (a run without Sudoku evaluations, more puzzles than the data holds, an --out nothing can be written to) stops
them in one line with exit status 2 before any work (bench/)."""

import importlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


def _refused(main, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """The one line `main(argv)` ends with, which must be an error with exit status 2."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err and err.count("\n") == 1, err
    return err


def test_sudoku_eval_writes_to_out_without_geometry(tmp_path: Path) -> None:
    sudoku_eval = importlib.import_module("sudoku_eval")
    ckpt = write_tiny_sudoku_checkpoint(tmp_path / "ckpt", iters=2)
    data = write_sudoku_csvs(tmp_path, 1, 4, seed=0)
    out = tmp_path / "figures" / "eval.json"
    sudoku_eval.main(["--checkpoint", str(ckpt), "--data", str(data), "--n", "4", "--max-factor", "2",
                      "--geometry-boards", "0", "--no-strategies", "--batch-sizes", "", "--threads", "1",
                      "--name", "tiny", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert "effective_rank" not in doc["per_iteration"] and doc["puzzles"] == 4
    assert doc["command"].startswith("python bench/sudoku_eval.py --checkpoint") and doc["torch"] and doc["cpu"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["eval.json", "tiny_accuracy.png", "tiny_energy.png"]


def test_sudoku_baseline_refuses_a_run_without_sudoku_evaluations(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "cifar10-cpu"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 704, "eval": {"val/top1@12": 0.44, "val/top1@24": 0.39}}\n')
    out = tmp_path / "baseline.json"
    err = _refused(importlib.import_module("sudoku_baseline").main,
                   ["--ours", str(run), "--baseline", str(run), "--out", str(out)], capsys)
    assert "metrics.jsonl: no Sudoku evaluations (val/board_acc@16" in err and not out.exists()


def test_depth_ablation_checks_the_puzzle_counts_before_measuring(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    depth_ablation = importlib.import_module("depth_ablation")
    ckpt = write_tiny_sudoku_checkpoint(tmp_path / "ckpt", iters=1)
    data = str(write_sudoku_csvs(tmp_path, 1, 5, seed=0))
    out = tmp_path / "measured.json"
    base = ["measure", "--checkpoint", str(ckpt), "--name", "tiny", "--data", data, "--threads", "1",
            "--out", str(out)]
    for args, why in [(["--n", "20000"], "--n 20000: the validation file of"),
                      (["--n", "2", "--n17", "1", "--speed-threads", "0"], "--n17 1: the validation file of"),
                      (["--n", "2", "--n17", "1"], "--speed-threads (timed on the protocol's draw of 1,000")]:
        err = _refused(depth_ablation.main, base + args, capsys)
        assert why in err and not out.exists()
    with pytest.raises(SystemExit) as stop:
        depth_ablation.main(["run", "--arm", "scratch-live", "--data", data, "--n", "20000"])
    assert stop.value.code == 2 and "--n 20000: the validation file of" in capsys.readouterr().err


def test_train_throughput_writes_to_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    train_throughput = importlib.import_module("train_throughput")
    rates = {"train_boards_per_s": 2.0, "train_share_of_roofline": 0.5, "inference_boards_per_s": 8.0,
             "inference_share_of_roofline": 0.25}
    monkeypatch.setattr(train_throughput, "measure", lambda row, steps, warmup: dict(rates))
    out = tmp_path / "throughput.json"
    name = next(iter(train_throughput.ROWS))
    train_throughput.main(["--rows", name, "--out", str(out)])
    doc = json.loads(out.read_text())
    assert [r["name"] for r in doc["rows"]] == [name]
    assert doc["command"] == f"python bench/train_throughput.py --rows {name} --out {out}"


@pytest.mark.parametrize("script", ["classify_test", "classify_figures"])
def test_classify_scripts_check_out_before_the_evaluation(script: str, tmp_path: Path) -> None:
    main = importlib.import_module(script).main
    (tmp_path / "file").write_text("")
    for out, why in [("/proc/classify", "no files can be made in /proc"),
                     (str(tmp_path / "file" / "classify"), "file is a file, not a folder")]:
        run = CliRunner().invoke(main, ["--data", str(tmp_path / "missing"), "--out", out])
        assert run.exit_code == 2 and run.stderr.startswith(f"{script}: error: --out: "), run.output
        assert why in run.stderr and run.stderr.count("\n") == 1
