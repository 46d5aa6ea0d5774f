"""The benchmark scripts' bad input: one line "SCRIPT: error: REASON" on standard error and exit status 2, before
any work and without a traceback (bench/bench_args.py)."""

import argparse
import importlib
import shlex
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_args  # noqa: E402


@pytest.mark.parametrize(("parse", "good", "bad"), [
    (bench_args.count, [("1", 1), ("64", 64)], ["0", "-3", "x", "1.5"]),
    (bench_args.at_least(0), [("0", 0)], ["-1"]),
    (bench_args.counts, [("1,16, 128", [1, 16, 128])], ["", "1,0", "1,x"]),
    (bench_args.ratio, [("0", 0.0), ("0.4", 0.4), ("1", 1.0)], ["-0.1", "1.5", "nan", "x"]),
    (bench_args.seconds, [("1200", 1200.0)], ["0", "-5", "inf", "nan", "x"]),
    (bench_args.preset, [("sudoku", "sudoku")], ["nope"]),
    (bench_args.device, [("cpu", "cpu")], ["tpu", "cpu:x", "meta"]),
    (bench_args.compile_options, [('{"max_autotune": true, "cpp.simdlen": null}', {"max_autotune": True,
                                                                                     "cpp.simdlen": None})],
     ["x", "[]", "{}", '{"no_such_setting": 1}', '{"max_autotune": 1}', '{"cpp.threads": "4"}']),
])
def test_argument_types_take_good_values_and_refuse_bad_ones(parse, good, bad) -> None:
    for text, value in good:
        assert parse(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-CUDA refusal")
def test_cuda_is_refused_where_pytorch_sees_no_gpu() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="PyTorch sees no CUDA device"):
        bench_args.device("cuda")


def test_a_peer_checkout_needs_the_authors_sudoku_model(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a checkout of huyunzhe/hyper-set"):
        bench_args.peer_checkout(str(tmp_path))
    (tmp_path / "sudoku").mkdir()
    (tmp_path / "sudoku" / "models.py").write_text("")
    assert bench_args.peer_checkout(str(tmp_path)) == tmp_path.resolve()


def test_the_recorded_command_can_be_run_again_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in bench_args.CHOICE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    argv = ["--peer", "/tmp/a peer", "--compile", "--compile-options", '{"max_autotune": true}']
    line = bench_args.command_line("peer_bench", argv)
    assert shlex.split(line) == ["python", "bench/peer_bench.py", *argv]
    monkeypatch.setenv("HYPERSET_CPU_MATMUL", "onednn")  # a library choice changes what is measured: it is kept
    again = shlex.split(bench_args.command_line("peer_bench", argv))
    assert again == ["HYPERSET_CPU_MATMUL=onednn", *shlex.split(line)]


def test_config_overrides_name_what_is_wrong() -> None:
    assert bench_args.model_config("sudoku", ["dim=64", "heads=2"]).dim == 64
    for sets, why in [(["nope=1"], "unknown \\[model\\] keys: nope"), (["dim"], "expected KEY=VALUE"),
                      (["dim=-3"], "model.dim = -3"), (["dim=\"x\""], "model.dim = 'x'")]:
        with pytest.raises(bench_args.BenchInputError, match=why):
            bench_args.model_config("sudoku", sets)


def _fake_peer(tmp_path: Path) -> str:
    (tmp_path / "peer" / "sudoku").mkdir(parents=True)
    (tmp_path / "peer" / "sudoku" / "models.py").write_text("")
    return str(tmp_path / "peer")


CASES = [
    ("flops", ["--batch", "0"], "argument --batch"),
    ("flops", ["--preset", "nope"], "unknown preset 'nope'"),
    ("flops", ["--set", "nope=1"], "unknown [model] keys: nope"),
    ("peer_bench", ["--peer", "{missing}"], "is not a checkout of huyunzhe/hyper-set"),
    ("peer_bench", ["--peer", "{peer}", "--rounds", "0"], "argument --rounds"),
    ("peer_bench", ["--peer", "{peer}", "--slices", "5"], "--slices must divide the batch of 64"),
    ("peer_bench", ["--peer", "{peer}", "--device", "tpu"], "argument --device"),
    ("peer_bench", ["--peer", "{peer}", "--compile-options", '{{"max_autotune": true}}'],
     "--compile-options needs --compile"),
    ("peer_bench", ["--peer", "{peer}", "--compile", "--compile-options", '{{"maxautotune": true}}'],
     "'maxautotune' is not a setting of torch._inductor.config"),
    ("step_profile", ["--threads", "0"], "argument --threads"),
    ("onnx_bench", ["--batches", "1,0"], "argument --batches"),
    ("train_throughput", ["--rows", "nope"], "argument --rows"),
    ("app_stream_bench", ["--repeats", "0"], "argument --repeats"),
    ("depth_ablation", ["measure", "--checkpoint", "{missing}", "--name", "x", "--data", "{missing}"],
     "no such checkpoint folder"),
    ("depth_ablation", ["classifier", "--checkpoint", "{missing}", "--data", "{missing}", "--out", "r.json"],
     "no such checkpoint folder"),
    ("mim_table", ["--data", "{missing}"], "no data folder"),
    ("mim_energy", ["--data", "{missing}", "--mask-ratios", "1.5"], "argument --mask-ratios"),
    ("sudoku_eval", ["--data", "{missing}", "--n", "0"], "argument --n"),
    ("sudoku_eval", ["--data", "{missing}"], "file not found"),
    ("sudoku_baseline", ["--ours", "{missing}"], "metrics.jsonl: No such file or directory"),
    ("training_curve", ["--run", "x={missing}"], "metrics.jsonl: No such file or directory"),
    ("training_curve", ["--run", "bad"], "--run 'bad': expected NAME=DIR[@START]"),
    ("sudoku_eval", ["--data", "{missing}", "--split", "bogus"], "argument --split: invalid choice"),
    ("sudoku_eval", ["--data", "{missing}", "--max-factor", "1"], "argument --max-factor: expected an integer >= 2"),
    ("sudoku_eval", ["--data", "{missing}", "--batch-sizes", "x"], "argument --batch-sizes"),
    ("mim_table", ["--data", "{missing}", "--split", "bogus"], "argument --split: invalid choice"),
    ("onnx_bench", ["--iters", "20000"], "argument --iters: iterations are at most 10,000, got 20000"),
    ("flops", ["--out", "{peer}/sudoku/models.py/flops.json"], "models.py is a file, not a folder"),
    ("flops", ["--out", ""], "argument --out: an empty path"),
    ("flops", ["--preset", "sudoku-cpu", "--batch", "1", "--iters", "1", "--out", "/proc/flops.json"],
     "argument --out: cannot write /proc/flops.json: no files can be made in /proc"),
    ("mim_table", ["--data", "{missing}", "--out", "/sys/mim_table.json"], "no files can be made in /sys"),
    ("mim_energy", ["--data", "{missing}", "--out", "{tmp}/mim_energy.png"], "not a .png"),
    ("sudoku_baseline", ["--ours", "{missing}", "--out", "{tmp}/baseline.PNG"], "not a .png"),
    ("sudoku_generated", ["--givens", "17", "20"], "expected LOW <= HIGH and 22 <= HIGH <= 80"),
    ("sudoku_generated", ["--iters", "20000"], "argument --iters: iterations are at most 10,000, got 20000"),
    ("mim_table", ["--data", "{missing}", "--multipliers", "1", "20000"], "argument --multipliers"),
    ("mim_table", ["--data", "{missing}", "--multipliers", "1000"],
     "--multipliers 1000: 1000x the trained depth of 12 iterations is over 10,000"),
    ("mim_energy", ["--data", "{missing}", "--iters", "20000"], "argument --iters: iterations are at most 10,000"),
    ("mim_energy", ["--data", "{missing}", "--iters", "12"], "--iters 12: expected at least 2x the trained depth"),
    ("peer_bench", ["--peer", "{peer}", "--slices", "4"], "--slices needs --compile"),
    ("peer_bench", ["--peer", "{peer}", "--cpu-matmul", "mkl"], "argument --cpu-matmul: invalid choice: 'mkl'"),
    ("peer_bench", ["--peer", "{peer}", "--cpu-kernels", "yes"], "argument --cpu-kernels: invalid choice: 'yes'"),
    ("train_throughput", ["--rows"], "argument --rows: expected at least one argument"),
    ("train_throughput", ["--out", "/proc/train_throughput.json"], "no files can be made in /proc"),
    ("sudoku_eval", ["--data", "{missing}", "--out", "/proc/sudoku_eval.json"], "no files can be made in /proc"),
    ("depth_ablation", ["measure", "--checkpoint", "{missing}", "--name", "x", "--data", "{missing}", "--out",
                        "/proc/x.json"], "no files can be made in /proc"),
]


@pytest.mark.parametrize(("script", "args", "why"), CASES, ids=[f"{s}-{i}" for i, (s, _, _) in enumerate(CASES)])
def test_bad_input_is_one_line_and_exit_2(script: str, args: list[str], why: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    names = {"missing": str(tmp_path / "missing"), "peer": _fake_peer(tmp_path), "tmp": str(tmp_path)}
    monkeypatch.setattr(sys, "argv", [f"bench/{script}.py", *(a.format(**names) for a in args)])
    main = importlib.import_module(script).main
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "Traceback" not in err
    assert f"{script}.py" in err and "error: " in err and why in err
    assert not (tmp_path / "missing").exists()


def test_an_output_goes_where_files_can_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert bench_args.output_file(str(tmp_path / "new" / "a.json")) == tmp_path / "new" / "a.json"
    assert bench_args.output_folder(str(tmp_path / "new" / "figures")) == tmp_path / "new" / "figures"
    assert not (tmp_path / "new").exists() and [p.name for p in tmp_path.iterdir()] == ["file"]
    for parse, text, why in [(bench_args.output_file, "/proc/a.json", "no files can be made in /proc"),
                             (bench_args.output_file, "/sys/a.json", "no files can be made in /sys"),
                             (bench_args.output_file, str(tmp_path / "a.png"), "not a .png"),
                             (bench_args.output_file, str(tmp_path), "is a folder, not a file"),
                             (bench_args.output_file, "/dev/null", "is not a regular file"),
                             (bench_args.output_folder, "/proc/figures", "no files can be made in /proc"),
                             (bench_args.output_folder, str(tmp_path / "file"), "file is a file, not a folder"),
                             (bench_args.output_folder, str(tmp_path / "file" / "sub"), "is a file, not a folder")]:
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            parse(text)


def test_a_write_that_fails_at_the_end_names_the_file_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    from hyperset.checkpoint import atomic_write_json

    monkeypatch.setattr(sys, "argv", ["bench/flops.py"])
    write = bench_args.input_errors_exit(lambda path: atomic_write_json(path, {}))
    for path in ("/proc/flops.json", "/sys/flops.json"):
        with pytest.raises(SystemExit) as stop:
            write(path)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(f"flops.py: error: {path}: ") and err.count("\n") == 1


def test_iterations_are_capped() -> None:
    assert bench_args.iterations("10000") == 10_000
    for text in ("0", "10001", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench_args.iterations(text)
