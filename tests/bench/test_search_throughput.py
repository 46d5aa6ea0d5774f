"""bench/search_throughput.py: the search's puzzles/s per bucket, backend and thread count, every board checked."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import search_throughput  # noqa: E402


@pytest.mark.slow
def test_every_bucket_backend_and_thread_count_is_timed_and_every_board_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "throughput.json"
    search_throughput.main(["--puzzles", "10", "--buckets", "0", "3-10", "--threads", "1",
                            "--backends", "torch", "onnx", "--out", str(out)])
    report = json.loads(out.read_text())
    runs = report["runs"]
    assert {(r["bucket"], r["backend"], r["timing"]) for r in runs} == {
        (b, k, t) for b in ("0", "3-10") for k in ("torch", "onnx") for t in ("end to end", "search only")}
    assert report["all_checked"] and all(r["solve_rate"] == 1.0 and r["puzzles"] == 10 for r in runs)
    assert all(r["puzzles_per_s"] > 0 and r["threads"] == 1 for r in runs)
    assert {r["runner"] for r in runs if r["backend"] == "onnx"} == {"onnxruntime (CPUExecutionProvider)"}
    assert report["settings"]["command"].startswith("python bench/search_throughput.py --puzzles 10")
    assert out.with_suffix(".png").stat().st_size > 0
    table = capsys.readouterr().out
    assert "| 3-10 |" in table and "torch, 1 thread" in table


def test_more_threads_than_the_machine_has_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as e:
        search_throughput.main(["--threads", "100000", "--out", str(tmp_path / "x.json")])
    assert e.value.code == 2
    assert not (tmp_path / "x.json").exists()
