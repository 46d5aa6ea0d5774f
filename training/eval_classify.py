"""`hyperset-eval classify [CHECKPOINT] --data DIR --split test|val [--iters N ...] [--json]`: top-1 accuracy.

The paper (Sec. 4.2, Table "Top-1 accuracy on image classification") reports top-1 on the CIFAR test set and
the ImageNet-100 validation set at the trained 12 iterations; Hyper-SET's recurrence also runs past the trained
depth (``--iters``). "val" is the part of the training set held out during training (same fraction and seed as
the checkpoint's training run, read from its config.json).
"""

from __future__ import annotations

import contextlib
import pickle
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import torch

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
from hyperset.device import autocast_dtype, autocast_name, describe, pick_device, set_cpu_threads
from hyperset.download import DownloadError
from hyperset.models import load_checkpoint
from hyperset.vision.data import download_cifar

from .classify_task import ClassifyData, ImageSplit, check_class_ids, dataset_classes, load_split, sample, top1

TRAIN_HINT = ("train one with `hyperset-train classify --recipe cifar10-cpu --data DIR --out runs/cifar10-cpu` "
              "and pass runs/cifar10-cpu/best as CHECKPOINT")


def shipped_classifier_dir() -> Path:
    """Where the package ships its classifier: hyperset/weights/classifier/ (model.safetensors + config.json)."""
    from hyperset.pretrained import PRETRAINED, weights_root

    return weights_root() / PRETRAINED["classifier"]


class EvalError(Exception):
    """A user mistake: reported as one line, exit code 2."""


def resolve_checkpoint(checkpoint: str | None) -> Path:
    """A checkpoint folder, or a shipped model's name ("classifier"), as every command takes them; none: the
    shipped classifier."""
    if checkpoint:
        from hyperset.pretrained import resolve

        return resolve(checkpoint)
    folder = shipped_classifier_dir()
    if not (folder / "config.json").is_file():
        raise EvalError(f"no classifier is shipped yet ({folder} does not exist); {TRAIN_HINT}")
    return folder


def data_for_checkpoint(meta: dict[str, Any], data_dir: str, dataset: str | None,
                        checkpoint: str | Path | None = None) -> ClassifyData:
    """The data description of the checkpoint's training run (dataset, val split, image size, classes).

    ``data.classes`` must be the list of WordNet ids the trainer records: a path there is not opened.
    """
    info = meta.get("data") if isinstance(meta.get("data"), dict) else {}
    name = dataset or info.get("dataset") or "cifar10"
    kw: dict[str, Any] = {"dataset": name, "data_dir": data_dir}
    if info.get("dataset", name) == name:
        classes = info.get("classes")
        if classes is not None:
            # a checkpoint may come from elsewhere: a path in it could name any file here, or a device without end
            where = f"{Path(checkpoint) / 'config.json' if checkpoint else 'the checkpoint config.json'}: data.classes"
            if isinstance(classes, str):
                raise EvalError(f"{where} is a path; a checkpoint records the list of WordNet ids itself, and a file "
                                "it names is not opened")
            try:
                check_class_ids(classes, where)
            except ValueError as e:
                raise EvalError(str(e)) from None
        for key in ("val_fraction", "seed", "eval_mode", "classes"):
            if info.get(key) is not None:
                kw[key] = info[key]
        if name == "imagenet100" and info.get("image_size"):
            kw["image_size"] = int(info["image_size"])
    return ClassifyData(**kw)


def run_eval(checkpoint: str | None, data_dir: str, split: str, iters: Sequence[int] | None, batch_size: int,
             device_name: str, dataset: str | None = None, precision: str = "auto", limit: int = 0,
             download: bool = False) -> dict[str, Any]:
    """Evaluate a classifier at each number of iterations in ``iters`` (default: its trained depth), in one pass
    where the core allows it; returns the --json document: what was evaluated (with the ``device`` and the
    ``precision`` used: "fp32" or e.g. "bf16 autocast"), and ``results`` with one {"iters", "top1"} per depth in
    the order asked. ``download`` first fetches CIFAR-10/100 into ``data_dir`` if it is not there. Raises
    EvalError for user mistakes (an empty split, a dataset with another class count)."""
    path = resolve_checkpoint(checkpoint)
    if not download and not Path(data_dir).is_dir():
        raise EvalError(f"data folder {data_dir} does not exist (expected e.g. DIR/cifar-10-batches-py/; "
                        "--download fetches CIFAR into it)")
    device = pick_device(device_name)
    model, meta = load_checkpoint(path, task="classify", map_location=device)
    data = data_for_checkpoint(meta, data_dir, dataset, path)
    if download:
        if not data.is_cifar:
            raise EvalError(f"--download fetches CIFAR-10/100, not {data.dataset}: get ImageNet from image-net.org "
                            "(its terms) and pass DIR with train/<wnid>/ and val/<wnid>/ folders")
        download_cifar(data.dataset, data_dir)
    if data.size != model.cfg.img_size:
        raise EvalError(f"{path}: the model takes {model.cfg.img_size} px images, {data.dataset} here has "
                        f"{data.size} px")
    n_classes = dataset_classes(data)
    if n_classes != model.cfg.num_classes:
        raise EvalError(f"{path}: the model has {model.cfg.num_classes} classes but {data.dataset} has {n_classes}; "
                        "pass the dataset it was trained on (--dataset)")
    split_data: ImageSplit = load_split(data, split)
    if len(split_data) == 0:
        raise EvalError(f"{data_dir}: the {data.dataset} {split} split holds no images")
    split_data = sample(split_data, limit)
    labels_max = int(split_data.labels.max())
    if labels_max >= model.cfg.num_classes:
        raise EvalError(f"{path}: the model has {model.cfg.num_classes} classes but {data.dataset} has label "
                        f"{labels_max}; pass the dataset it was trained on")
    dtype = autocast_dtype(device) if precision == "auto" else None
    autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype is not None else contextlib.nullcontext
    used = autocast_name(dtype)
    depths = list(dict.fromkeys(iters or [model.cfg.iters]))
    start = time.time()
    accuracy, images = top1(model, split_data, depths, device, autocast, batch_size, progress=True)
    seconds = round(time.time() - start, 3)
    return {"checkpoint": str(path), "dataset": data.dataset, "split": split, "images": images,
            "device": describe(device), "precision": used, "seconds": seconds,
            "results": [{"iters": d, "top1": accuracy[d]} for d in depths]}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@checkpoint_input(None, "the shipped classifier")
@click.option("--data", "data_dir", required=True, help="dataset folder (CIFAR python layout or ImageNet tree)")
@click.option("--download", is_flag=True, help="fetch CIFAR-10/100 into --data first if it is not there (checksum "
                                               "verified)")
@click.option("--split", type=click.Choice(["test", "val"]), default="test", show_default=True,
              help="test split, or the part of train held out during training")
@click.option("--iters", type=click.IntRange(1, MAX_ITERS), multiple=True,
              help="iterations (default: the trained depth; may exceed it); repeat it for several depths, "
                   "evaluated in one pass")
@click.option("--batch-size", type=click.IntRange(min=1), default=500, show_default=True,
              help="images per forward pass")
@threads_option()
@device_option()
@click.option("--dataset", type=click.Choice(["cifar10", "cifar100", "imagenet100"]), default=None,
              help="default: the dataset recorded in the checkpoint")
@click.option("--precision", type=click.Choice(["auto", "fp32"]), default="auto", show_default=True,
              help="auto: bf16/fp16 autocast where the device supports it")
@click.option("--limit", type=click.IntRange(min=0), default=0,
              help="evaluate a seeded random sample of N images (0: all)")
@json_option("print one JSON document (a result per depth under \"results\")")
@out_option()
def classify_command(checkpoint: str | None, data_dir: str, download: bool, split: str, iters: tuple[int, ...],
                     batch_size: int, threads: int | None, device: str, dataset: str | None, precision: str,
                     limit: int, as_json: bool, out: str | None) -> None:
    """Top-1 accuracy of a classifier (default: the one shipped in the package) at N iterations."""
    from hyperset.cli_options import check_output_file

    if out is not None:
        check_output_file("--out", out)
    try:
        set_cpu_threads(threads)
        report = run_eval(checkpoint, data_dir, split, iters, batch_size, device, dataset, precision, limit,
                          download)
    except (EvalError, CheckpointError, DownloadError, FileNotFoundError, ValueError, pickle.UnpicklingError) as e:
        click.echo(error_line("hyperset-eval classify", e), err=True)
        sys.exit(2)
    if out:
        write_json_out("hyperset-eval classify", out, report)
    if as_json:
        echo_json(report)
        return
    for result in report["results"]:
        click.echo(f"{report['dataset']} {split}: top-1 {100 * result['top1']:.2f}% on {report['images']} images "
                   f"at {result['iters']} iterations ({report['checkpoint']}, {report['device']}, "
                   f"{report['precision']}, {report['seconds']:.1f} s)")
