"""bench/train_throughput.py on a small model: a row trained in accumulated parts runs and reports its rates and
roofline shares like a whole-batch row."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import train_throughput  # noqa: E402


@pytest.mark.slow
def test_a_row_in_accumulated_parts_is_measured() -> None:
    row = dict(preset="sudoku-cpu", overrides=dict(dim=32, heads=4, ff_hidden=64, iters=2), batch=4,
               supervise="all", amp=False, accum=2)
    out = train_throughput.measure(row, steps=1, warmup=1)
    assert out["accum"] == 2 and out["train_boards_per_s"] > 0 and out["inference_boards_per_s"] > 0
    assert 0 < out["train_share_of_roofline"] and out["iters"] == 2
