"""`hyperset-eval sudoku [--checkpoint NAME|DIR] --data FILE|DIR|sudoku-extreme [--download] [--iters N ...]
[--strategy S ...] [--json]`.

Board and cell accuracy of a Sudoku model (default: the one shipped in the package) on puzzles with known
solutions, by the library's :mod:`hyperset.sudoku.evaluate`: a per-iteration table (one single pass read out at
each --iters), a per-givens table, and the solver's strategies (single, auto, commit) timed; on Sudoku-Extreme
(:mod:`hyperset.sudoku.extreme`) also board accuracy per rating bucket.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from hyperset.checkpoint import CheckpointError
from hyperset.cli_options import (
    checkpoint_input,
    device_option,
    echo_json,
    error_line,
    json_option,
    out_option,
    threads_option,
    write_json_out,
)
from hyperset.config import MAX_ITERS
from hyperset.download import DownloadError
from hyperset.solve import CPU_BATCH_SIZE, DEFAULT_PASSES, GPU_BATCH_SIZE
from hyperset.strategy_registry import strategy_names
from hyperset.sudoku import extreme
from hyperset.sudoku.board import PuzzleError
from hyperset.sudoku.data import SPLITS

PROG = "hyperset-eval sudoku"


def _fail(message: str) -> NoReturn:
    click.echo(error_line(PROG, message), err=True)
    sys.exit(2)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def print_report(report: dict[str, Any]) -> None:
    """The tables as text: depths, strategies, then board accuracy per givens count."""
    split = f" ({report['split']})" if report.get("split") else ""
    click.echo(f"{report['boards']} boards of {report['data']}{split}, seed {report['seed']}; "
               f"{report['checkpoint']} ({report['layer']}, {report['parameters']:,} parameters, trained depth "
               f"{report['trained_iterations']}) on {report['device']}")
    click.echo("")
    click.echo("single pass, read out at each depth")
    click.echo("  iters  board acc  cell acc")
    for row in report["depths"]:
        mark = "  (trained depth)" if row["iters"] == report["trained_iterations"] else ""
        click.echo(f"  {row['iters']:5d}  {_pct(row['board_acc']):>9}  {_pct(row['cell_acc']):>8}{mark}")
    if report["strategies"]:
        click.echo("")
        click.echo("strategies")
        click.echo(f"  {'strategy':<16} board acc  cell acc  valid   boards/s  mean iters  mean passes")
        for r in report["strategies"]:
            speed = "n/a" if r["boards_per_s"] is None else f"{r['boards_per_s']:.1f}"
            click.echo(f"  {r['strategy']:<16} {_pct(r['board_acc']):>9}  {_pct(r['cell_acc']):>8}  "
                       f"{_pct(r['valid']):>6}  {speed:>8}  {r['mean_iterations']:>10.1f}  {r['mean_passes']:>11.2f}")
    click.echo("")
    depths = report["iters"]
    givens = sorted({int(g) for d in depths for g in report["per_givens"][str(d)]})
    click.echo("board accuracy per givens count")
    click.echo("  givens  boards  " + "  ".join(f"{'@' + str(d):>7}" for d in depths))
    for g in givens:
        cells = [report["per_givens"][str(d)].get(str(g)) for d in depths]
        count = next(c["boards"] for c in cells if c)
        click.echo(f"  {g:6d}  {count:6d}  " + "  ".join(f"{_pct(c['board_acc'] if c else None):>7}" for c in cells))
    if "per_rating" in report:
        print_rating_table(report)


def print_rating_table(report: dict[str, Any]) -> None:
    """Board accuracy per rating bucket: the single pass at each depth, then each strategy but single (the same
    numbers as the depths)."""
    columns = [(f"@{d}", report["per_rating"][str(d)]) for d in report["iters"]]
    columns += [(r["strategy"], r["per_rating"]) for r in report["strategies"]
                if r["settings"].get("strategy") != "single"]
    width = max(7, *(len(name) for name, _ in columns))
    click.echo("")
    click.echo(f"board accuracy per rating bucket ({report['boards']:,} of the split's {report['available']:,} "
               f"puzzles, a seeded uniform draw)")
    click.echo("  rating  boards  " + "  ".join(f"{name:>{width}}" for name, _ in columns))
    for bucket, row in columns[0][1].items():
        cells = "  ".join(f"{_pct(table[bucket]['board_acc']):>{width}}" for _, table in columns)
        click.echo(f"  {bucket:>6}  {row['boards']:6d}  {cells}")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@checkpoint_input("sudoku")
@click.option("--data", required=True, type=click.Path(),
              help="puzzle,solution CSV file (plain, .gz, or a zip member), a folder holding the --split file, or "
                   f"{extreme.NAME} (the Hugging Face dataset, kept in the cache; ./{extreme.NAME} for a folder)")
@click.option("--download", is_flag=True,
              help=f"fetch the data first if it is not there: {extreme.NAME} into the cache, or the RRN "
                   "sudoku-hard data into the --data folder (verified)")
@click.option("--split", type=click.Choice(SPLITS), default=None,
              help=f"which file of a --data folder (train.csv, valid.csv, test.csv, ...) or of {extreme.NAME} "
                   "(train, test) [default: valid; test for sudoku-extreme]")
@click.option("--boards", type=click.IntRange(min=0), default=None,
              help="evaluate a seeded draw of N boards (the paper protocol: a seeded shuffle, the first N; 0: all) "
                   "[default: 1000, or all if fewer]")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the draw")
@click.option("--iters", type=click.IntRange(1, MAX_ITERS), multiple=True,
              help="depths to read out and to run the strategies at (repeatable; may exceed the trained depth) "
                   "[default: trained depth]")
@click.option("--strategy", "strategies", type=click.Choice(strategy_names()), multiple=True,
              help="solver strategies to time (repeatable) [default: single]")
@click.option("--passes", type=click.IntRange(1, 81), default=DEFAULT_PASSES, show_default=True,
              help="most passes of the commit strategy")
@click.option("--batch-size", type=click.IntRange(1, 65536), default=None,
              help=f"boards per forward pass [default: {CPU_BATCH_SIZE} on a CPU, {GPU_BATCH_SIZE} on a GPU]")
@threads_option()
@device_option()
@json_option()
@out_option()
@click.option("--progress/--no-progress", default=None, help="progress bars on standard error [default: on a terminal]")
def sudoku_command(checkpoint: str, data: str, download: bool, split: str | None, boards: int | None, seed: int,
                   iters: tuple[int, ...], strategies: tuple[str, ...], passes: int, batch_size: int | None,
                   threads: int | None, device: str, as_json: bool, out: str | None, progress: bool | None) -> None:
    """Board and cell accuracy of a Sudoku model (default: the shipped one) on puzzles with known solutions; on
    sudoku-extreme also per rating bucket.

    Exit code 0 when done, 2 on bad input (a malformed line is named by file and line).
    """
    from hyperset.cli_options import check_output_file
    from hyperset.device import set_cpu_threads
    from hyperset.pretrained import resolve
    from hyperset.solve import Solver
    from hyperset.sudoku.data import download_rrn
    from hyperset.sudoku.evaluate import draw, evaluate, load_boards

    try:
        if out is not None:
            check_output_file("--out", out)
        if not data.strip():
            raise click.UsageError("--data: an empty path")
        set_cpu_threads(threads)
        if data == extreme.NAME:
            split = split or "test"
            rated = extreme.load(extreme.cached_split(split, download, progress))
            loaded = draw(rated.puzzles, rated.solutions, str(extreme.split_path(split)), split, boards, seed,
                          rated.ratings)
        else:
            if download:
                if Path(data).is_file() or Path(data).suffix.lower() in (".csv", ".gz", ".zip"):
                    raise click.UsageError(f"--download fetches into a folder: --data DIR or --data {extreme.NAME}")
                download_rrn(data)
            loaded = load_boards(Path(data), split or "valid", boards, seed)
        path = resolve(checkpoint)
        solver = Solver.load(path, device)
    except click.UsageError as e:
        _fail(e.message)
    except (PuzzleError, CheckpointError, DownloadError, FileNotFoundError, ValueError) as e:
        _fail(str(e))
    try:
        report = evaluate(solver, loaded, iters or None, strategies or ("single",), passes, batch_size,
                          progress=progress, checkpoint=checkpoint if checkpoint == "sudoku" else str(path))
    except ValueError as e:
        _fail(str(e))
    if out:
        write_json_out("hyperset-eval sudoku", out, report)
    if as_json:
        echo_json(report)
    else:
        print_report(report)
        if out:
            click.echo(f"\nwritten to {out}")
