"""The paper's classification figures for a trained classifier (Sec. 4.4 "Energy Evolution, Effective Rank and
Average Angle", Figs. "energy" (CIFAR-10 row) and "rank angle", and App. "Rank and Average Angle of Each Head").

* ``classify_energy.png/json``: E_ATTN and E_FF (normalization first, no learnable gains) after each iteration,
  mean and standard deviation over the images, from the embedded input (iteration 0) to ``--iters`` (default
  twice the trained depth; the trained depth is marked), plus top-1 accuracy of the CLS readout per iteration.
* ``classify_rank_angle.png/json``: effective rank (eq. 17) and average angle (eq. 18) of the tokens projected
  to each head's subspace (RMS-normalized), averaged over images, per head and iteration; the effective rank
  of the full token matrix is given for comparison.

Usage: python bench/classify_figures.py [CHECKPOINT] --data data/cifar10 [--images 1000] [--iters 24]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_args  # noqa: E402

from hyperset.checkpoint import CheckpointError  # noqa: E402
from hyperset.device import describe, pick_device  # noqa: E402
from hyperset.energies import average_angle, effective_rank  # noqa: E402
from hyperset.models import load_checkpoint  # noqa: E402
from hyperset.training.classify_task import load_split, sample  # noqa: E402
from hyperset.training.eval_classify import EvalError, data_for_checkpoint, resolve_checkpoint  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


class Moments:
    """Running mean and standard deviation over images of per-iteration values (T, B, ...)."""

    def __init__(self) -> None:
        self.n = 0
        self.s: np.ndarray | None = None
        self.ss: np.ndarray | None = None

    def add(self, values: torch.Tensor) -> None:
        v = values.double().cpu().numpy()  # (T, B, ...)
        if self.s is None:
            self.s, self.ss = np.zeros(v.shape[:1] + v.shape[2:]), np.zeros(v.shape[:1] + v.shape[2:])
        self.s += v.sum(1)
        self.ss += (v**2).sum(1)
        self.n += v.shape[1]

    def result(self) -> dict[str, list]:
        assert self.s is not None and self.ss is not None
        mean = self.s / self.n
        std = np.sqrt(np.maximum(self.ss / self.n - mean**2, 0.0))
        return {"mean": mean.tolist(), "std": std.tolist()}


@torch.no_grad()
def measure(model: Any, split: Any, iters: int, batch_size: int, device: torch.device) -> dict[str, Any]:
    """Energies, geometry and accuracy at iterations 0..iters over all images of ``split`` (fp32)."""
    stats: dict[str, Moments] = {}
    correct = np.zeros(iters + 1)
    first = model.core.layers[0]
    for images, labels in split.batches(batch_size):
        x0 = model.stem(images.to(device))
        out = model.core.run(x0, iters, trace=True, geometry=True, keep_states=True)
        series = {f"energy_{k}": torch.stack([v0, *out.trace.energy[k]])
                  for k, v0 in first.energy(x0, 1).items()}
        z0 = first.projections(x0, 1)
        series["effective_rank"] = torch.stack([effective_rank(z0), *out.trace.effective_rank])
        series["average_angle"] = torch.stack([average_angle(z0), *out.trace.average_angle])
        states = [x0, *out.states]
        series["effective_rank_full"] = torch.stack([effective_rank(s) for s in states])
        for name, values in series.items():
            stats.setdefault(name, Moments()).add(values)
        for t, s in enumerate(states):
            correct[t] += int((model.readout(s).argmax(-1).cpu() == labels).sum())
    result = {name: m.result() for name, m in stats.items()}
    result["top1"] = (correct / len(split)).tolist()
    return result


def plot_energy(result: dict[str, Any], meta: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in ("energy_attn", "energy_ff") if k in result]
    titles = {"energy_attn": r"$E_{\mathrm{ATTN}}$", "energy_ff": r"$E_{\mathrm{FF}}$"}
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(4.2 * (len(names) + 1), 3.4))
    t = np.arange(len(result["top1"]))
    for ax, name in zip(axes, names):
        mean, std = np.array(result[name]["mean"]), np.array(result[name]["std"])
        ax.plot(t, mean, marker="o", ms=3)
        ax.fill_between(t, mean - std, mean + std, alpha=0.25)
        ax.set_title(titles[name])
    axes[-1].plot(t, 100 * np.array(result["top1"]), marker="o", ms=3, color="tab:green")
    axes[-1].set_title("top-1 (%) of the CLS readout")
    for ax in axes:
        ax.axvline(meta["trained_iters"], color="gray", ls="--", lw=1, label="trained depth")
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize=8)
    fig.suptitle(f"{meta['dataset']} {meta['split']}, {meta['images']} images, mean ± std", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_rank_angle(result: dict[str, Any], meta: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rank = np.array(result["effective_rank"]["mean"])  # (T+1, H)
    angle = np.array(result["average_angle"]["mean"])
    t = np.arange(rank.shape[0])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for h in range(rank.shape[1]):
        axes[0].plot(t, rank[:, h], lw=1.2, label=f"head {h + 1}")
        axes[1].plot(t, angle[:, h], lw=1.2, label=f"head {h + 1}")
    axes[0].plot(t, result["effective_rank_full"]["mean"], color="black", ls=":", lw=1.5, label="full space")
    axes[0].set_title("effective rank per subspace")
    axes[1].set_title("average angle (degrees) per subspace")
    for ax in axes:
        ax.axvline(meta["trained_iters"], color="gray", ls="--", lw=1)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{meta['dataset']} {meta['split']}, {meta['images']} images (dashed: trained depth)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def make_figures(checkpoint: str | None, data_dir: str, images: int, iters: int | None, split: str = "test",
                 out: Path = RESULTS, batch_size: int = 100, device_name: str = "cpu",
                 command: str | None = None) -> dict[str, Path]:
    """Compute and write classify_energy.{png,json} and classify_rank_angle.{png,json} under ``out`` (the JSONs
    record ``command``, the command that made them, where given)."""
    path = resolve_checkpoint(checkpoint)
    if not Path(data_dir).is_dir():
        raise EvalError(f"data folder {data_dir} does not exist (expected e.g. DIR/cifar-10-batches-py/)")
    device = pick_device(device_name)
    model, meta = load_checkpoint(path, task="classify", map_location=device)
    data = data_for_checkpoint(meta, data_dir, None)
    images_split = sample(load_split(data, split), images)  # seeded random sample: files may be class-sorted
    trained = model.cfg.iters
    iters = 2 * trained if iters is None else iters
    start = time.time()
    result = measure(model, images_split, iters, batch_size, device)
    info = {"checkpoint": str(path), "dataset": data.dataset, "split": split, "images": len(images_split),
            "iters": iters, "trained_iters": trained * model.cfg.n_layers, "layer": model.cfg.layer,
            "heads": model.cfg.heads,
            "device": describe(device), "seconds": round(time.time() - start, 1),
            "iterations": list(range(iters * model.cfg.n_layers + 1)), "torch": torch.__version__}
    if command is not None:
        info["command"] = command
    out.mkdir(parents=True, exist_ok=True)
    energy = {**info, "note": "iteration 0 is the embedded input; energies use RMS-normalized projections, no gains",
              **{k: result[k] for k in ("energy_attn", "energy_ff") if k in result}, "top1": result["top1"]}
    if "energy_attn" not in result:
        energy["note"] = f"the {model.cfg.layer} layer defines no energy; only accuracy is recorded"
    geometry = {**info, "note": "per head: mean and std over images; effective_rank_full: all d channels",
                **{k: result[k] for k in ("effective_rank", "average_angle", "effective_rank_full")}}
    paths = {"classify_energy.json": energy, "classify_rank_angle.json": geometry}
    for name, record in paths.items():
        (out / name).write_text(json.dumps(record, indent=1) + "\n")
    plot_energy(result, info, out / "classify_energy.png")
    plot_rank_angle(result, info, out / "classify_rank_angle.png")
    return {name: out / name for name in (*paths, "classify_energy.png", "classify_rank_angle.png")}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint", required=False)
@click.option("--data", "data_dir", default="data/cifar10", show_default=True, help="CIFAR-10 root folder")
@click.option("--images", type=click.IntRange(min=0), default=1000, show_default=True,
              help="images, a seeded random sample (0: all)")
@click.option("--iters", type=click.IntRange(min=1), default=None, help="iterations (default: 2x trained)")
@click.option("--split", type=click.Choice(["test", "val"]), default="test", show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=str(RESULTS), show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True)
def main(checkpoint: str | None, data_dir: str, images: int, iters: int | None, split: str, out: str,
         batch_size: int, device: str, threads: int) -> None:
    """Energy, effective rank and average angle per iteration of a classifier (default: the shipped one)."""
    command = bench_args.command_line("classify_figures", None)
    torch.set_num_threads(threads)
    try:
        folder = bench_args.output_folder(out)
    except argparse.ArgumentTypeError as e:
        click.echo(f"classify_figures: error: --out: {e}", err=True)
        sys.exit(2)
    try:
        written = make_figures(checkpoint, data_dir, images, iters, split, folder, batch_size, device, command)
    except (EvalError, CheckpointError, OSError, ValueError, RuntimeError) as e:
        click.echo(f"classify_figures: error: {bench_args.reason(e)}", err=True)
        sys.exit(2)
    for path in written.values():
        click.echo(str(path))


if __name__ == "__main__":
    main()
