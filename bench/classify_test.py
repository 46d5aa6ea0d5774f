"""Top-1 of a classifier on the CIFAR test set at several depths, as JSON (the classification results table).

Writes ``bench/results/classify_test.json``: one row per number of iterations (default: the trained depth and
twice it), all from one pass over the images (a one-layer core is read out on the way to the largest depth).
With ``--record`` the numbers are also written into the checkpoint's ``config.json`` under ``test`` (that is
how the shipped classifier carries its test accuracy; ``tests/test_shipped.py`` reads it).

Usage: python bench/classify_test.py [CHECKPOINT] --data data/cifar10 [--iters 12 --iters 24] [--record]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import click
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_args  # noqa: E402

from hyperset.checkpoint import CheckpointError, atomic_write_json, checkpoint_dir, read_config  # noqa: E402
from hyperset.training.eval_classify import EvalError, resolve_checkpoint, run_eval  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = "hyperset-eval classify CHECKPOINT --data DIR --split test --iters N --precision fp32 --json"


def measure(checkpoint: str | None, data_dir: str, iters: tuple[int, ...], split: str = "test",
            batch_size: int = 500, device: str = "auto") -> dict[str, Any]:
    """The classify_test.json record: the checkpoint, its training steps, one row per depth measured in fp32 (so a CPU
    with native bf16 reads the same numbers as any other), and the `hyperset-eval classify` command that gives them."""
    path = checkpoint_dir(resolve_checkpoint(checkpoint))
    meta = read_config(path)
    trained = int(meta["model"]["iters"])
    depths = list(iters) or [trained, 2 * trained]
    doc = run_eval(str(path), data_dir, split, depths, batch_size, device, precision="fp32")
    shared = {k: doc[k] for k in ("images", "device", "precision", "seconds")}
    return {"checkpoint": str(path), "steps": meta.get("steps"), "split": split, "dataset": doc["dataset"],
            "parameters": meta.get("parameters"), "trained_iters": trained, "threads": torch.get_num_threads(),
            "rows": [{"top1": r["top1"], "iters": r["iters"], **shared} for r in doc["results"]],
            "torch": torch.__version__, "equivalent_command": COMMAND}


def record_in_checkpoint(result: dict[str, Any], note: str) -> None:
    """The test numbers under "test" in the checkpoint's config.json (written atomically)."""
    folder = Path(result["checkpoint"])
    meta = read_config(folder)
    rows = {r["iters"]: r for r in result["rows"]}
    trained = result["trained_iters"]
    if trained not in rows:
        raise EvalError(f"--record needs the trained depth ({trained}) among --iters")
    test = {"top1": rows[trained]["top1"], "images": rows[trained]["images"], "iters": trained}
    test.update({f"top1@{d}": r["top1"] for d, r in rows.items() if d != trained})
    test["command"] = COMMAND.replace("CHECKPOINT ", "")
    if note:
        test["note"] = note
    atomic_write_json(folder / "config.json", {**meta, "test": test})


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint", required=False)
@click.option("--data", "data_dir", default="data/cifar10", show_default=True, help="CIFAR root folder")
@click.option("--iters", type=click.IntRange(min=1), multiple=True,
              help="depths to evaluate (repeatable; default: trained and 2x trained)")
@click.option("--split", type=click.Choice(["test", "val"]), default="test", show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True)
@click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda | cuda:N")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads [default: torch's]")
@click.option("--out", type=click.Path(dir_okay=False), default=str(RESULTS / "classify_test.json"),
              show_default=True)
@click.option("--record", is_flag=True, help="also write the numbers into the checkpoint's config.json")
@click.option("--note", default="", help="a note stored with --record")
def main(checkpoint: str | None, data_dir: str, iters: tuple[int, ...], split: str, batch_size: int, device: str,
         threads: int | None, out: str, record: bool, note: str) -> None:
    """Top-1 on the test split at several depths (default checkpoint: the shipped classifier)."""
    command = bench_args.command_line("classify_test", None)
    if threads:
        torch.set_num_threads(threads)
    try:
        out_json = bench_args.output_file(out)
    except argparse.ArgumentTypeError as e:
        click.echo(f"classify_test: error: --out: {e}", err=True)
        sys.exit(2)
    try:
        if record and split != "test":
            raise EvalError("--record stores test-set numbers; drop --split val")
        result = {**measure(checkpoint, data_dir, iters, split, batch_size, device), "command": command}
        if record:
            record_in_checkpoint(result, note)
        out_json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(out_json, result)
    except (EvalError, CheckpointError, OSError, ValueError, KeyError) as e:
        click.echo(f"classify_test: error: {bench_args.reason(e)}", err=True)
        sys.exit(2)
    for row in result["rows"]:
        click.echo(f"{result['dataset']} {split}: top-1 {100 * row['top1']:.2f}% at {row['iters']} iterations "
                   f"({row['images']} images, {row['device']})")
    click.echo(str(out))


if __name__ == "__main__":
    main()
