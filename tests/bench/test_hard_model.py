"""bench/hard_model.py's table: the long run's checkpoints against their training CPU-hours."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import hard_model  # noqa: E402


def _row(name: str, acc: float, cpu_seconds: float | None = None) -> dict:
    bucket = {"one_pass": {"1T": acc / 2, "16T": acc}, "commit": {"solved": acc}, "curve": [acc]}
    row = {"name": name, "eval": {"buckets": {"0": bucket, "51+": bucket}}}
    if cpu_seconds is not None:
        row["cpu_seconds"] = cpu_seconds
    return row


def test_the_long_run_starts_at_the_shipped_model_and_follows_its_checkpoints(tmp_path: Path) -> None:
    rows = [_row("hard-cpu2-tuned", 0.7, 7200), _row("hard-deep4", 0.4, 1000), _row("shipped", 0.5),
            _row("hard-cpu-tuned", 0.6, 3600)]
    points = hard_model.long_run(rows)
    assert [(h, r["name"]) for h, r in points] == [(0.0, "shipped"), (1.0, "hard-cpu-tuned"),
                                                    (2.0, "hard-cpu2-tuned")]
    out = tmp_path / "curve.png"
    hard_model.training_curve(rows, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    alone = tmp_path / "alone.png"
    hard_model.training_curve([_row("shipped", 0.5)], alone)  # one point is no curve
    assert not alone.exists()
