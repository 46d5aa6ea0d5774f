"""The FLOP model of bench/flops.py against PyTorch's own FLOP counter, and its roofline arithmetic."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hyperset.accel import cpu_kernels
from hyperset.config import ModelConfig, preset_config
from hyperset.models import HyperSETModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_args  # noqa: E402
import flops  # noqa: E402

SMALL = dict(dim=32, heads=4, iters=3)
CONFIGS = {
    "authors-sudoku": bench_args.model_config("sudoku", flops.PEER_D128).replace(**SMALL, ff_hidden=64, time_dim=16),
    "classify": preset_config("cifar10-small", **SMALL, ff_hidden=32, time_dim=16),
    "transformer": preset_config("sudoku-cpu-transformer", **SMALL, ff_hidden=64),
    "crate": preset_config("cifar10-crate", **SMALL),
    "lora-linear-gated": preset_config("sudoku", **SMALL, ff_hidden=64, time_dim=16, lora_rank=2,
                                       attention="linear", feedforward="gated", n_layers=2),
}


def _inputs(cfg: ModelConfig, batch: int) -> torch.Tensor:
    if cfg.task == "classify":
        return torch.randn(batch, cfg.channels, cfg.img_size, cfg.img_size)
    return torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len))


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_flop_model_equals_pytorch_flop_counter_forward_and_training(name: str) -> None:
    cfg, batch = CONFIGS[name], 3
    torch.manual_seed(0)
    model = HyperSETModel(cfg)
    x = _inputs(cfg, batch)
    trace = cfg.layer == "hyperset"
    with torch.no_grad():
        forward = _counted(lambda: model.run(x, trace=trace))
    # the attention maps' kernel (hyperset.accel.cpu_kernels) runs one product fewer backward than autograd's count
    with cpu_kernels.using_cpu_kernels("off"):
        training = _counted(lambda: model(x).float().square().mean().backward())
    assert flops.count(cfg, batch, energies=trace)["forward_flops"] * batch == forward
    assert flops.count(cfg, batch)["training_flops"] * batch == training


def test_flop_model_scales_with_iterations_past_training() -> None:
    cfg = CONFIGS["authors-sudoku"]
    model = HyperSETModel(cfg)
    with torch.no_grad():
        counted = _counted(lambda: model.run(_inputs(cfg, 2), iters=7))
    assert flops.count(cfg, 2, iters=7)["forward_flops"] * 2 == counted


def test_components_of_the_authors_configuration_match_the_hand_count() -> None:
    """d=128, M=4d, 81 tokens: feedforward 4 N d M, projections 4 N d^2, attention maps 4 N^2 d, L3 4 N d^2."""
    cfg = bench_args.model_config("sudoku", flops.PEER_D128)
    counts = flops.count(cfg, 64)
    per_it = counts["forward_flops_per_iteration"]
    N, d, M = 81, 128, 512
    assert per_it["feedforward"] == 4 * N * d * M
    assert per_it["projections"] == 4 * N * d * d
    assert per_it["attention_maps"] == 4 * N * N * d
    step_sizes = pytest.approx(4 * N * d * d + 2 * (512 * d + d * d) / 64)
    # the authors' time network is dead (zero init): the step sizes are made once per pass, in inference and in
    # training; the authors' code makes them at every iteration (steps_every_t)
    assert flops.steps_once(cfg) and "step_sizes" not in per_it
    assert "step_sizes" not in counts["training_flops_per_iteration"]
    assert counts["forward_flops_per_pass"]["step_sizes"] == step_sizes
    theirs = flops.count(cfg, 64, steps_every_t=True)
    assert theirs["forward_flops_per_iteration"]["step_sizes"] == step_sizes
    extra = (cfg.iters - 1) * 3 * 4 * N * d * d  # L3's forward and two backward products, at 23 more iterations
    assert theirs["training_flops"] - counts["training_flops"] == pytest.approx(extra, rel=1e-3)


def test_the_written_out_path_counts_step_sizes_at_every_iteration() -> None:
    """Inside hyperset.accel.fused.written_out() a training step makes the step sizes at every t, as the authors' code:
    torch's counter then equals the model's steps_every_t count."""
    from hyperset.accel import fused

    cfg, batch = CONFIGS["authors-sudoku"], 3
    torch.manual_seed(0)
    model = HyperSETModel(cfg)
    x = _inputs(cfg, batch)
    with fused.written_out():
        training = _counted(lambda: model(x).float().square().mean().backward())
    assert flops.count(cfg, batch, steps_every_t=True)["training_flops"] * batch == training
    assert flops.count(cfg, batch)["training_flops"] < flops.count(cfg, batch, steps_every_t=True)["training_flops"]


def test_roofline_is_batch_over_the_matmul_time_at_the_given_rates() -> None:
    cfg, batch = CONFIGS["authors-sudoku"], 4
    mms = flops.training_matmuls(cfg, batch)
    rates = {flops._shape_key(mm): 1e9 for mm in mms}  # every shape at 1 GFLOP/s: no timing
    roof = flops.roofline(mms, cfg.iters, batch, rates=rates)
    assert roof["roofline_boards_per_s"] == pytest.approx(1e9 / flops.count(cfg, batch)["training_flops"])
    assert flops.share(roof["roofline_boards_per_s"] / 2, roof) == pytest.approx(0.5)


def test_backward_matmuls_transpose_the_right_operand() -> None:
    mm = flops.MatMul("feedforward", "X D", 10, 3, 7)
    da, db = mm.backward()
    assert (da.m, da.k, da.n, da.layout) == (10, 7, 3, "nt")
    assert (db.m, db.k, db.n, db.layout) == (3, 10, 7, "tn")
    for m in (da, db):
        a, b = flops._operands(m, torch.float32)
        assert torch.matmul(a, b).shape == (m.m, m.n)


@pytest.mark.slow
def test_flops_script_writes_counts_and_a_measured_roofline(tmp_path: Path) -> None:
    out = tmp_path / "flops.json"
    flops.main(["--set", "dim=32", "--set", "heads=4", "--set", "ff_hidden=64", "--set", "time_dim=16",
                "--iters", "2", "--batch", "2", "--out", str(out)])
    rep = json.loads(out.read_text())
    assert rep["config"]["dim"] == 32 and rep["counts"]["inference"]["iterations"] == 2
    fp32 = rep["roofline"]["float32"]
    assert fp32["inference"]["roofline_boards_per_s"] > fp32["training"]["roofline_boards_per_s"] > 0
    assert rep["machine"]["load_average_1min_at_end"] is not None
    assert rep["machine"]["cpu_matmul_library"] in ("onednn", "aten") and "roofline_other_blas" not in rep
    flops.main(["--set", "dim=32", "--set", "heads=4", "--set", "ff_hidden=64", "--set", "time_dim=16",
                "--iters", "2", "--batch", "2", "--other-blas", "--out", str(out)])
    rep = json.loads(out.read_text())
    best, mine = rep["roofline_best_of_libraries"], rep["roofline"]["float32"]
    for kind in ("inference", "training"):  # at each shape the faster library: at least as fast as either
        assert best[kind]["roofline_boards_per_s"] >= max(mine[kind]["roofline_boards_per_s"],
                                                          rep["roofline_other_blas"]["float32"][kind]
                                                          ["roofline_boards_per_s"]) * (1 - 1e-9)


def test_machine_facts_name_the_simd_level_and_any_cap_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in flops.ISA_LIMITS:
        monkeypatch.delenv(var, raising=False)
    facts = flops.machine(1)
    assert facts["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and facts["isa_limits"] == {}
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert flops.machine(1)["isa_limits"] == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_machine_facts_name_the_cpu_generation_where_the_model_name_does_not() -> None:
    # a virtual machine's model name can be just "AMD EPYC"; the family and model numbers tell Zen 4 from Zen 2
    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma avx512f avx512_bf16\n\n"
            "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 143\n")
    fields = flops.cpuinfo_fields(text)
    assert (fields["cpu family"], fields["model"], fields["model name"]) == ("25", "17", "AMD EPYC")
    assert "avx512_bf16" in fields["flags"].split()
    facts = flops.machine(1)
    assert {"cpu", "simd_flags", "bf16_flags"} <= facts.keys()
    assert set(facts["bf16_flags"]) <= {"avx512_bf16", "amx_bf16"}
    if Path("/proc/cpuinfo").is_file():
        mine = flops.cpuinfo_fields(Path("/proc/cpuinfo").read_text())
        if mine.get("cpu family", "").isdigit():
            assert facts["cpu_family"] == int(mine["cpu family"])


@pytest.mark.slow
def test_the_other_blas_rooflines_time_the_same_shapes() -> None:
    cfg = bench_args.model_config("sudoku", ["dim=32", "heads=4", "ff_hidden=64", "time_dim=16"])
    other = flops.other_blas_rooflines(cfg, 2, 2, 1, min_seconds=0.001)
    assert other["library"].startswith("numpy ") and other["threads"] == 1
    mine = flops.measure_rooflines(cfg, 2, 2)["float32"]
    shape = lambda r: (r["m"], r["k"], r["n"], r["count"], r["layout"])  # noqa: E731
    assert sorted(map(shape, other["float32"]["shapes"])) == sorted(map(shape, mine["shapes"]))
    assert all(r["flops_per_s"] > 0 for r in other["float32"]["shapes"])
    for kind in ("inference", "training"):
        assert other["float32"][kind]["roofline_boards_per_s"] > 0
        assert other["float32"][kind]["seconds_per_batch"] * other["float32"][kind]["matmul_flops_per_s"] == \
            pytest.approx(mine[kind]["seconds_per_batch"] * mine[kind]["matmul_flops_per_s"])  # the same FLOPs


def test_pytorchs_roofline_takes_the_faster_of_aten_and_onednn_at_each_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = bench_args.model_config("sudoku", ["dim=32", "heads=4", "ff_hidden=64", "time_dim=16"])
    fake = {"aten": 1e9, "onednn": 3e9}  # oneDNN three times as fast where it applies
    monkeypatch.setattr(flops, "time_matmul", lambda mm, dtype=torch.float32, min_seconds=0.02, repeats=3,
                        cold=False, library="aten": fake[library])
    monkeypatch.setattr(flops, "LIBRARY_RATES", {})
    monkeypatch.setattr(flops.fused, "onednn_here", lambda: True)  # as on x86 with oneDNN
    shapes = flops.measure_rooflines(cfg, 2, 2)["float32"]["shapes"]
    plain = [r for r in shapes if r["count"] == 1]
    batched = [r for r in shapes if r["count"] > 1]  # the attention maps' batched products: ATen's alone
    assert plain and batched
    assert all(r["flops_per_s"] == 3e9 and r["flops_per_s_by_library"] == {"aten": 1e9, "onednn": 3e9}
               for r in plain)
    assert all(r["flops_per_s"] == 1e9 and "flops_per_s_by_library" not in r for r in batched)
    fake["onednn"] = 0.5e9  # slower: ATen's rate stays
    monkeypatch.setattr(flops, "LIBRARY_RATES", {})
    shapes = flops.measure_rooflines(cfg, 2, 2)["float32"]["shapes"]
    assert all(r["flops_per_s"] == 1e9 for r in shapes)
    assert all(r["flops_per_s_by_library"]["onednn"] == 0.5e9 for r in shapes if r["count"] == 1)
    monkeypatch.setattr(flops.fused, "onednn_here", lambda: False)  # no oneDNN in this PyTorch
    monkeypatch.setattr(flops, "LIBRARY_RATES", {})
    assert all("flops_per_s_by_library" not in r for r in flops.measure_rooflines(cfg, 2, 2)["float32"]["shapes"])


def test_the_best_of_two_libraries_takes_each_shapes_faster_rate() -> None:
    cfg = bench_args.model_config("sudoku", ["dim=32", "heads=4", "ff_hidden=64", "time_dim=16"])
    keys = list(dict.fromkeys(flops._shape_key(mm) for mm in flops.matmuls(cfg, 2) + flops.training_matmuls(cfg, 2)))
    one = {k: (2e9 if i % 2 else 1e9) for i, k in enumerate(keys)}  # each library twice as fast on half the shapes
    two = {k: (1e9 if i % 2 else 2e9) for i, k in enumerate(keys)}
    at = lambda rates: flops._rooflines_at(cfg, 2, 2, False, False, torch.float32, dict(rates))  # noqa: E731
    best = flops.best_of_rooflines(cfg, 2, 2, False, at(one), at(two))
    assert all(r["flops_per_s"] == 2e9 for r in best["shapes"])
    for kind in ("inference", "training"):
        assert best[kind]["roofline_boards_per_s"] == pytest.approx(at({k: 2e9 for k in keys})[kind]
                                                                    ["roofline_boards_per_s"])
        assert best[kind]["roofline_boards_per_s"] > max(at(one)[kind]["roofline_boards_per_s"],
                                                         at(two)[kind]["roofline_boards_per_s"])


def test_the_cold_timing_sizes_its_copies_from_the_last_level_cache(tmp_path: Path) -> None:
    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "491520K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert flops.last_level_cache_bytes(tmp_path) == 480 << 20
    assert flops.last_level_cache_bytes(tmp_path / "missing") is None
    mm = flops.MatMul("feedforward", "X D", 16, 32, 24, count=2, layout="tn")
    warm, cold = flops.time_matmul(mm, min_seconds=0.001), flops.time_matmul(mm, min_seconds=0.001, cold=True)
    assert warm > 0 and cold > 0 and math.isfinite(cold)
