"""bench/bf16_check.py: bf16 products against fp32, accuracy per depth and the default strategy, speed per depth;
a clear refusal where the CPU has no native bf16."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bf16_check  # noqa: E402
from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint  # noqa: E402

from hyperset.accel import fused  # noqa: E402
from hyperset.device import cpu_has_native_bf16  # noqa: E402


@pytest.mark.skipif(not cpu_has_native_bf16() or fused.cpu_matmul_library() != "onednn",
                    reason="bf16 products need native bf16 and oneDNN's GEMM")
def test_both_precisions_are_scored_on_the_same_boards_and_timed_alternately(tmp_path: Path) -> None:
    data = write_sudoku_csvs(tmp_path, 4, 6, seed=3)
    ckpt = write_tiny_sudoku_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "bf16.json"
    bf16_check.main(["--rrn", str(data), "--checkpoint", str(ckpt), "--boards", "6", "--iters", "2,3",
                     "--batch", "4", "--rounds", "2", "--out", str(out)])
    report = json.loads(out.read_text())
    acc = report["accuracy"]
    assert report["boards"] == 6 and report["machine"]["native_bf16"]
    for name in ("fp32", "bf16"):
        assert set(acc[name]["one_pass"]) == {"2", "3"} and 0 <= acc[name]["default_strategy"]["board_acc"] <= 1
    assert set(acc["one_pass_boards_differing"]) == {"2", "3"}
    for k in ("2", "3"):
        row = report["speed"][k]
        assert row["batch"] == 4 and len(row["times_s"]["fp32"]) == len(row["times_s"]["bf16"]) == 2
        assert row["bf16_over_fp32"] == pytest.approx(row["bf16_boards_per_s"] / row["fp32_boards_per_s"])


def test_without_native_bf16_it_exits_2_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bf16_check, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(SystemExit) as stop:
        bf16_check.main(["--rrn", str(tmp_path), "--out", str(tmp_path / "x.json")])
    assert stop.value.code == 2
    assert "no native bf16" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
