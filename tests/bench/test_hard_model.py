"""bench/hard_model.py's table: the long run's checkpoints against their training CPU-hours."""

import json
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


def test_the_search_row_splits_the_nodes_into_the_way_to_the_answer_and_the_rest(tmp_path: Path) -> None:
    """`_solve` on the search: besides the nodes, the nodes on the way to each answer (its decisions, and the node
    whose prediction answered) and those spent on decisions taken back, which add up to the nodes."""
    from conftest import write_tiny_sudoku_checkpoint

    from hyperset.solve import Solver
    from hyperset.sudoku import rated

    hard = ["060040200000807000020000000009308060001090004070000000005000009900150008000002100",
            "000000200200000109000050000010400900060080030008000060400300000580040600006002004"]
    puzzles = [rated.RatedPuzzle(p, "", 64) for p in hard]
    solver = Solver.load(write_tiny_sudoku_checkpoint(tmp_path / "m"), "cpu")
    for kw in ({}, {"first_look": False}, {"prior": "uniform"}):
        row = hard_model._solve(solver, puzzles, **kw)
        assert row["solved"] == 1.0
        assert row["path_nodes_mean"] + row["off_path_nodes_mean"] == row["nodes_mean"]
        assert row["path_nodes_median"] >= 1 and row["off_path_nodes_mean"] > 0


def test_paths_runs_each_checkpoint_and_the_uniform_prior_on_the_same_puzzles(tmp_path, monkeypatch) -> None:
    from conftest import write_tiny_sudoku_checkpoint

    from hyperset.sudoku import rated

    hard = ["060040200000807000020000000009308060001090004070000000005000009900150008000002100",
            "000000200200000109000050000010400900060080030008000060400300000580040600006002004"]
    asked = []
    monkeypatch.setattr(hard_model, "puzzles_of", lambda b, n, seed, threads: asked.append((b, n, seed)) or
                        [rated.RatedPuzzle(p, "", 64) for p in hard * 3])
    ckpt = str(write_tiny_sudoku_checkpoint(tmp_path / "m"))
    out = hard_model.search_paths([ckpt], 4, 11, 1)
    assert asked == [("51+", 200, 11)] and out["puzzles"] == 4
    row = out["models"][ckpt]["equal_checks"]
    assert row["solved"] == out["uniform"]["solved"] == 1.0
    assert out["uniform"]["path_nodes_mean"] + out["uniform"]["off_path_nodes_mean"] == out["uniform"]["nodes_mean"]
    assert row["path_nodes_mean"] + row["off_path_nodes_mean"] == row["nodes_mean"]


def test_paths_searches_again_at_each_asked_node_depth(tmp_path, monkeypatch) -> None:
    """--node-iters: the same puzzles searched at each asked number of iterations per node, each row solved and its
    nodes split as at the checkpoint's own; the node depth reaches the solver's search."""
    from conftest import write_tiny_sudoku_checkpoint

    from hyperset.sudoku import rated

    hard = ["060040200000807000020000000009308060001090004070000000005000009900150008000002100"]
    monkeypatch.setattr(hard_model, "puzzles_of", lambda b, n, seed, threads: [rated.RatedPuzzle(p, "", 64)
                                                                               for p in hard * 2])
    seen = []
    solve = hard_model._solve
    monkeypatch.setattr(hard_model, "_solve", lambda solver, ps, **kw: seen.append(kw.get("node_iters")) or
                        solve(solver, ps, **kw))
    ckpt = str(write_tiny_sudoku_checkpoint(tmp_path / "m"))
    out = hard_model.search_paths([ckpt], 2, 203, 1, node_iters=[2, 5])
    rows = out["models"][ckpt]["by_node_iters"]
    assert sorted(rows) == ["2", "5"] and seen == [None, 2, 5, None]
    for row in rows.values():
        assert row["solved"] == 1.0 and row["path_nodes_mean"] + row["off_path_nodes_mean"] == row["nodes_mean"]


def test_rrn_depth_reads_the_draw_out_at_every_multiple_of_t_with_the_energy(tmp_path, monkeypatch) -> None:
    """rrn-depth: measure's RRN draw in one pass to max_depth x T, board accuracy at T, 2T, ... up to it (and no
    deeper), the share of boards whose energy never rose, and the JSON named after the run."""
    from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint

    (tmp_path / "rrn").mkdir()
    data = write_sudoku_csvs(tmp_path / "rrn", 8, 12, seed=3)
    ckpt = write_tiny_sudoku_checkpoint(tmp_path / "m")
    out = hard_model.rrn_depth(str(ckpt), str(data), 10, 4, 1)
    assert out["puzzles"] == 10 and list(out["one_pass"]) == ["1T", "2T", "4T"]
    assert all(0.0 <= v <= 1.0 for v in out["one_pass"].values()) and 0.0 <= out["energy_never_rises_4T"] <= 1.0
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(hard_model, "RESULTS", results)
    hard_model.main(["rrn-depth", "--checkpoint", str(ckpt), "--name", "tiny", "--rrn", str(data),
                     "--n-rrn", "10", "--max-depth", "2"])
    saved = json.loads((results / "rrn-depth-tiny.json").read_text())
    assert list(saved["one_pass"]) == ["1T", "2T"] and "energy_never_rises_2T" in saved and "device" in saved


def test_rrn_depth_reads_every_bucket_out_too_and_the_control_keeps_each_energy_from_rising(tmp_path,
                                                                                               monkeypatch) -> None:
    """rrn-depth --buckets n: every bucket's n puzzles in one pass as well; with --backtrack-from 2 the energy
    never rises on any board of any bucket (the control's promise, read from the trace)."""
    from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint

    from hyperset.sudoku import rated
    from hyperset.sudoku.exact import generate

    (tmp_path / "rrn").mkdir()
    data = write_sudoku_csvs(tmp_path / "rrn", 8, 12, seed=3)
    ckpt = write_tiny_sudoku_checkpoint(tmp_path / "m")
    asked = []
    monkeypatch.setattr(hard_model, "puzzles_of", lambda b, n, seed, threads: asked.append((b, n, seed)) or [
        rated.RatedPuzzle(p, s, 0) for p, s in generate(n, 24, 30, seed=len(asked))])
    out = hard_model.rrn_depth(str(ckpt), str(data), 6, 4, 1, backtrack_from=2, buckets=5)
    assert asked == [(b, 5, 11) for b in rated.BUCKETS] and list(out["buckets"]) == list(rated.BUCKETS)
    assert out["step_control"] == "backtrack" and out["backtrack_from"] == 2 and out["bucket_seed"] == 11
    for row in [out, *out["buckets"].values()]:
        assert list(row["one_pass"]) == ["1T", "2T", "4T"] and row["energy_never_rises_4T"] == 1.0
        assert row["seconds"] > 0


def test_control_cost_times_both_passes_and_counts_the_energy_evaluations(tmp_path) -> None:
    """control-cost: both settings timed every round; the plain traced pass evaluates the energy once per board and
    iteration (the trace), the untraced one never; with the control from iteration 2 the trace adds nothing to
    the control's own evaluations."""
    from conftest import write_sudoku_csvs, write_tiny_sudoku_checkpoint

    (tmp_path / "rrn").mkdir()
    data = write_sudoku_csvs(tmp_path / "rrn", 8, 12, seed=3)
    ckpt = write_tiny_sudoku_checkpoint(tmp_path / "m")
    out = hard_model.control_cost(str(ckpt), str(data), 6, 5, 2, 1, 2)
    assert all(len(v) == 2 and min(v) > 0 for v in out["seconds"].values()) and len(out["seconds"]) == 6
    ev = out["energy_evaluations_per_board_iteration"]
    assert ev["plain_traced"] == ev["plain_per_iteration"] == 1.0 and ev["plain_untraced"] == 0.0
    # every iteration but the first, at least once
    assert ev["control_traced"] == ev["control_untraced"] == ev["control_per_iteration"] >= 4 / 5
    assert 0 <= out["boards_answered_differently"] <= 6


def test_search_per_bucket_runs_the_default_strategy_with_the_control_when_asked(tmp_path, monkeypatch) -> None:
    """search --backtrack-from K: the default strategy on every bucket with the step-length control from K (what
    hyperset-solve --descent runs), recorded beside the counts; every board answered validly."""
    from conftest import write_tiny_sudoku_checkpoint

    from hyperset.sudoku import rated
    from hyperset.sudoku.exact import generate

    ckpt = write_tiny_sudoku_checkpoint(tmp_path / "m")
    monkeypatch.setattr(hard_model, "puzzles_of", lambda b, n, seed, threads: [
        rated.RatedPuzzle(p, s, 0) for p, s in generate(n, 40, 45, seed=7)])
    for start, control in ((None, "none"), (2, "backtrack")):
        out = hard_model.search_per_bucket(str(ckpt), 3, 11, 1, start)
        assert out["step_control"] == control and list(out["buckets"]) == list(rated.BUCKETS)
        assert all(r["solved"] == 1.0 and r["nodes_median"] >= 0 for r in out["buckets"].values())
