"""The shared trainer on PyTorch's DistributedDataParallel (torchrun, gloo on CPU) and gradient accumulation."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import write_sudoku_csvs
from safetensors.torch import load_file

from hyperset.config import preset_config
from hyperset.models import load_checkpoint
from hyperset.training.sudoku_task import SudokuData, SudokuTask
from hyperset.training.trainer import TrainConfig, Trainer

WORKER = textwrap.dedent('''
    import json, os, sys
    import torch
    from safetensors.torch import save_file
    from hyperset.config import preset_config
    from hyperset.training.sudoku_task import SudokuData, SudokuTask
    from hyperset.training.trainer import Trainer, TrainConfig
    data, out, steps, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    cfg = preset_config("sudoku-cpu", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2)
    task = SudokuTask(model=cfg, data=SudokuData(data_dir=data, n_train=0, n_val=8, n_select=8))
    train = TrainConfig(steps=steps, batch_size=8, lr=3e-3, warmup_steps=1, amp="off", eval_every=1000,
                        log_every=1, save_every_seconds=1e9, threads=1)
    trainer = Trainer(task, train, __import__("pathlib").Path(out), resume=resume, quiet=True)
    result = trainer.fit()
    result["group_alive_after_fit"] = torch.distributed.is_initialized()
    # test-only: every rank dumps its replica and result so the test can compare them
    rank = int(os.environ.get("RANK", "0"))
    dump = os.path.join(os.path.dirname(out), f"dump-{os.path.basename(out)}-rank{rank}")
    save_file({k: v.detach().contiguous() for k, v in trainer.model.state_dict().items()}, dump + ".safetensors")
    json.dump(result, open(dump + ".json", "w"))
''')


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sudoku_csvs(tmp_path_factory.mktemp("sudoku-ddp"), 24, 16, seed=3)


def task(data_dir: Path) -> SudokuTask:
    cfg = preset_config("sudoku-cpu", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2)
    return SudokuTask(model=cfg, data=SudokuData(data_dir=str(data_dir), n_train=0, n_val=8, n_select=8))


def train_cfg(steps: int, accum: int = 1, batch: int = 8) -> TrainConfig:
    return TrainConfig(steps=steps, batch_size=batch, lr=3e-3, warmup_steps=1, amp="off", eval_every=1000,
                       log_every=1, save_every_seconds=1e9, threads=1, accum_steps=accum)


def torchrun(worker: Path, *args: str, nproc: int = 2) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(worker), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


def test_gradient_accumulation_equals_one_big_batch(data_dir: Path, tmp_path: Path) -> None:
    Trainer(task(data_dir), train_cfg(3, accum=1), tmp_path / "big", quiet=True).fit()
    Trainer(task(data_dir), train_cfg(3, accum=4), tmp_path / "accum", quiet=True).fit()
    a, _ = load_checkpoint(tmp_path / "big" / "last")
    b, _ = load_checkpoint(tmp_path / "accum" / "last")
    # four micro-batches sum their gradients in another order than one batch; Adam's g / sqrt(v) turns the rounding
    # of a near-zero gradient into weight differences of ~1e-6 on some CPUs (AVX2 kernels), never more than 1e-5
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    assert losses(tmp_path / "big") == pytest.approx(losses(tmp_path / "accum"), rel=1e-5)


@pytest.mark.slow
def test_two_processes_match_one_process_and_write_one_checkpoint(data_dir: Path, tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    torchrun(worker, str(data_dir), str(tmp_path / "ddp"), "3", "0")
    Trainer(task(data_dir), train_cfg(3), tmp_path / "single", quiet=True).fit()
    # same global batch: the loss curve and the weights agree within float tolerance
    assert losses(tmp_path / "ddp") == pytest.approx(losses(tmp_path / "single"), rel=1e-4)
    ddp = load_file(tmp_path / "ddp" / "last" / "model.safetensors")
    single = load_file(tmp_path / "single" / "last" / "model.safetensors")
    for k in single:
        torch.testing.assert_close(ddp[k], single[k], rtol=1e-4, atol=1e-6, msg=k)
    # both replicas hold identical weights
    r0 = load_file(tmp_path / "dump-ddp-rank0.safetensors")
    r1 = load_file(tmp_path / "dump-ddp-rank1.safetensors")
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    # only rank 0 wrote checkpoints, logs and the run folder's lock: one set of files
    assert sorted(p.name for p in (tmp_path / "ddp").iterdir()) == [".lock", "best", "last", "metrics.jsonl"]
    for rank in (0, 1):
        result = json.loads((tmp_path / f"dump-ddp-rank{rank}.json").read_text())
        assert result["world_size"] == 2
        # fit destroyed the process group it created: a process exiting with gloo's threads alive can abort
        assert result["group_alive_after_fit"] is False
    assert len(losses(tmp_path / "ddp")) == 3  # rank 0 alone logged each step once


@pytest.mark.slow
def test_resume_with_a_different_number_of_processes(data_dir: Path, tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    torchrun(worker, str(data_dir), str(tmp_path / "run"), "2", "0")
    result = Trainer(task(data_dir), train_cfg(4), tmp_path / "run", resume=True, quiet=True).fit()
    assert result["step"] == 4
    progress = json.loads((tmp_path / "run" / "last" / "trainer.json").read_text())
    assert progress["step"] == 4 and progress["world_size"] == 1
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4]  # 2 steps on 2 processes, then 2 on 1
