"""Does the MIM token model's energy fall at every iteration, and why does its E_ATTN rise?

    python bench/mim_energy.py --data data/cifar10 --images 200             # the shipped token model, 2T iterations
    python bench/mim_energy.py runs/mim-cpu/best --data data/cifar10 --iters 48

The first N test images are tokenized by the shipped tokenizer, a seeded share of their tokens is replaced by the
mask id (each ratio of ``--mask-ratios``; 0.4 is the app's default and the first MaskGIT step, 0 is close to the
last one), and the token model is run for ``--iters`` iterations (default 2T). Per image and iteration it records:

* E_ATTN and E_FF as the model's trace reports them (``layer.energy``: "normalization first", no learned gains,
  the paper's figure definition), at t = 0 (the embedded tokens) and after every iteration; whether E_ATTN + E_FF
  never rises from t = 1 to T and to 2T (a rise of more than 1e-5 relative counts), per image, and the share of
  images whose total rises at each iteration;
* the step sizes alpha_t and gamma_t (per token and channel; mean and share of negative entries), and alpha on
  the masked tokens and on the visible ones apart;
* each iteration in halves: the change of E_ATTN in the attention step and in the feedforward step, the
  attention step's first-order change of E_ATTN split by the sign of alpha, the change with |alpha| instead of
  alpha (same magnitudes), and the cosine between the attention update direction (eq. 9) and the autograd
  gradient of the reported E_ATTN;
* a counterfactual pass with |alpha| and |gamma| at every iteration (whether the total energy then falls);
* the mean token norm |x_t| (the update never projects the tokens; the energies only see their directions), and the
  learned RMSNorm gains the update uses and the reported energies leave out.

Writes ``bench/results/mim_energy.json`` and ``.png`` (mean energies per iteration). CPU only; the machine is in
the JSON.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path
from typing import Any

import bench_args
import numpy as np
import torch
from torch import Tensor

from hyperset.checkpoint import atomic_write_json
from hyperset.device import cpu_model
from hyperset.models import HyperSETModel

RESULTS = Path(__file__).resolve().parent / "results"
RTOL = 1e-5  # a rise of more than this share of |E| (at least 1e-5 absolute) counts as a rise


def rises(energy: np.ndarray, rtol: float = RTOL) -> np.ndarray:
    """energy (T, B) -> (T - 1, B) bool: where E_{t+1} exceeds E_t by more than float noise."""
    energy = np.asarray(energy, dtype=np.float64)
    return np.diff(energy, axis=0) > rtol * np.abs(energy[:-1]).clip(min=1.0)


def monotone(energy: np.ndarray, rtol: float = RTOL) -> np.ndarray:
    """energy (T, B) -> (B,) bool: the energy never rises over the T entries."""
    return ~rises(energy, rtol).any(axis=0)


def _energies(layer: torch.nn.Module, x: Tensor, t: int) -> tuple[Tensor, Tensor]:
    e = layer.energy(x, t)
    return e["attn"].double(), e["ff"].double()


def _cosine(a: Tensor, b: Tensor) -> Tensor:
    """Per-sample cosine between (B, N, d) tensors, flattened."""
    return torch.nn.functional.cosine_similarity(a.flatten(1).double(), b.flatten(1).double(), dim=1)


def trajectories(model: HyperSETModel, tokens: Tensor, iters: int) -> dict[str, np.ndarray]:
    """Everything per image and iteration for one batch of token grids (B, N): see the module docstring.

    Arrays are (iters + 1, B) for the energies (t = 0..iters) and (iters, B) for the per-iteration quantities.
    Only for models of Hyper-SET layers (one, or several each iterated ``iters`` times: t restarts per layer).
    """
    core = model.core
    if model.cfg.layer != "hyperset":
        raise ValueError(f"energy trajectories need Hyper-SET layers, not {model.cfg.layer!r}")
    masked = (tokens >= model.cfg.num_classes)[..., None]  # the mask id (codebook size) and above: (B, N, 1)
    rec: dict[str, list[Tensor]] = {}

    def share(values: Tensor, where: Tensor) -> Tensor:
        """Per sample: the mean of values (B, N, d) over the tokens where `where` (B, N, 1) holds (NaN: none)."""
        where = where.expand_as(values)
        return (values * where).sum((1, 2)) / where.sum((1, 2))

    def put(name: str, value: Tensor) -> None:
        rec.setdefault(name, []).append(value.detach().double().cpu())

    with torch.no_grad():
        x0 = model.stem(tokens)
    x = x_abs = x0
    for k, layer in enumerate(core.layers):
        if k == 0:
            for name, v in zip(("attn", "ff"), _energies(layer, x0, 1)):
                put(name, v)
                put(f"{name}_abs", v)
        for t in range(1, iters + 1):
            with torch.no_grad():
                alpha, gamma = core.steps_at(x, x0, t)
                alpha, gamma = alpha.expand_as(x), gamma.expand_as(x)
                W, _ = layer.weights(t)
                update = layer.attn_grad(x, W)  # the attention step is x - alpha * update (eq. 9)
                x_half = x - alpha * update
                x_next = core.step(x, x0, t, layer)
            xg = x.detach().requires_grad_(True)
            with torch.enable_grad():
                grad = torch.autograd.grad(layer.energy(xg, t)["attn"].sum(), xg)[0]
            with torch.no_grad():
                e_attn, _ = _energies(layer, x, t)
                h_attn, _ = _energies(layer, x_half, t)
                n_attn, n_ff = _energies(layer, x_next, t)
                first_order = (-alpha * update * grad).double()  # dE_ATTN ~ <grad, -alpha * update>
                neg = alpha < 0
                put("attn", n_attn)
                put("ff", n_ff)
                put("token_norm", x_next.norm(dim=-1).mean(1))  # no projection of the tokens: |x| is free
                put("alpha_mean", alpha.mean((1, 2)))
                put("alpha_neg", neg.double().mean((1, 2)))
                put("alpha_neg_masked", share(neg.double(), masked))
                put("alpha_neg_visible", share(neg.double(), ~masked))
                put("gamma_mean", gamma.mean((1, 2)))
                put("gamma_neg", (gamma < 0).double().mean((1, 2)))
                put("d_attn_attn_step", h_attn - e_attn)
                put("d_attn_ff_step", n_attn - h_attn)
                put("first_order_alpha_neg", torch.where(neg, first_order, 0.0).sum((1, 2)))
                put("first_order_alpha_pos", torch.where(neg, 0.0, first_order).sum((1, 2)))
                put("d_attn_abs_alpha", _energies(layer, x - alpha.abs() * update, t)[0] - e_attn)
                put("cos_update_grad", _cosine(update, grad))
                # the counterfactual pass: the same model with |alpha| and |gamma|
                a_abs, g_abs = core.steps_at(x_abs, x0, t)
                x_abs = layer.step(x_abs, t, (a_abs.abs(), g_abs.abs()))
                for name, v in zip(("attn_abs", "ff_abs"), _energies(layer, x_abs, t)):
                    put(name, v)
            x = x_next
    return {k: torch.stack(v).numpy() for k, v in rec.items()}


def summarize(traj: dict[str, np.ndarray], trained: int) -> dict[str, Any]:
    """Shares of images whose energies never rise, and per-iteration means (lists over t)."""
    total = traj["attn"] + traj["ff"]
    total_abs = traj["attn_abs"] + traj["ff_abs"]
    n = total.shape[0] - 1  # iterations

    def share(energy: np.ndarray, last: int, first: int = 1) -> float:
        return float(monotone(energy[first: last + 1]).mean())

    def mean(a: np.ndarray) -> list[float | None]:
        """Over images, per row; None where no image has a value (no masked token at 0% masking)."""
        counts = (~np.isnan(a)).sum(axis=1)
        sums = np.where(np.isnan(a), 0.0, a).sum(axis=1)
        return [round(float(v / c), 4) if c else None for v, c in zip(sums, counts)]

    per_iter = ("alpha_mean", "alpha_neg", "alpha_neg_masked", "alpha_neg_visible", "gamma_mean", "gamma_neg",
                "token_norm", "d_attn_attn_step", "d_attn_ff_step",
                "first_order_alpha_neg", "first_order_alpha_pos", "d_attn_abs_alpha", "cos_update_grad")
    depths = {"T": min(trained, n), "2T": min(2 * trained, n)}
    return {
        "images": int(total.shape[1]),
        "monotone_total": {k: share(total, d) for k, d in depths.items()},
        "monotone_total_count": {k: int(monotone(total[1: d + 1]).sum()) for k, d in depths.items()},
        "monotone_total_from_t0": {k: share(total, d, 0) for k, d in depths.items()},
        "monotone_attn": {k: share(traj["attn"], d) for k, d in depths.items()},
        "monotone_ff": {k: share(traj["ff"], d) for k, d in depths.items()},
        "attn_rises_t1_to_T": float((traj["attn"][depths["T"]] > traj["attn"][1]).mean()),
        # share of images whose E_ATTN + E_FF rises from t to t + 1, for t = 1..iters - 1 (entry 0: t = 1 -> 2)
        "total_rises_at": [round(float(v), 4) for v in rises(total[1:]).mean(axis=1)],
        "mean": {"attn": mean(traj["attn"]), "ff": mean(traj["ff"]), "total": mean(total)},
        "per_iteration": {k: mean(traj[k]) for k in per_iter},
        "counterfactual_abs_steps": {
            "monotone_total": {k: share(total_abs, d) for k, d in depths.items()},
            "mean": {"attn": mean(traj["attn_abs"]), "ff": mean(traj["ff_abs"]), "total": mean(total_abs)},
        },
    }


def measure(model: HyperSETModel, tokens: Tensor, iters: int, batch: int = 50) -> dict[str, Any]:
    """``trajectories`` over ``tokens`` (B, N) in batches, then ``summarize``."""
    parts = [trajectories(model, tokens[i: i + batch], iters) for i in range(0, len(tokens), batch)]
    traj = {k: np.concatenate([p[k] for p in parts], axis=1) for k in parts[0]}
    return summarize(traj, model.cfg.iters)


def gains(model: HyperSETModel) -> dict[str, dict[str, float]]:
    """The learned RMSNorm gains of the first layer's attention and feedforward updates: min, mean, max."""
    layer = model.core.layers[0]
    out = {}
    for name in ("norm_attn", "norm_ff"):
        w = getattr(layer, name).weight.detach().float()
        out[name] = {k: round(float(getattr(w, k)()), 4) for k in ("min", "mean", "max")}
    return out


def machine(threads: int) -> dict[str, Any]:
    return {"cpu": cpu_model(), "logical_cpus": os.cpu_count(), "threads": threads, "device": "cpu",
            "torch": torch.__version__, "python": platform.python_version(),
            "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


def plot(out: dict[str, Any], path: Path) -> None:
    from matplotlib.figure import Figure

    trained = out["trained_iters"]
    fig = Figure(figsize=(14, 3.3), dpi=110, layout="constrained")
    for j, (name, label) in enumerate((("attn", "E_ATTN"), ("ff", "E_FF"), ("total", "E_ATTN + E_FF"))):
        ax = fig.add_subplot(1, 4, j + 1)
        for k, run in enumerate(out["runs"]):
            values = run["mean"][name]
            ax.plot(range(len(values)), values, color=f"C{k}", marker="o", markersize=2.5,
                    label=f"{run['mask_ratio']:.0%} masked")
            cf = run["counterfactual_abs_steps"]["mean"][name]
            ax.plot(range(len(cf)), cf, color=f"C{k}", ls=":", lw=1.2,
                    label=f"{run['mask_ratio']:.0%}, |alpha|, |gamma|")
        ax.axvline(trained, color="#dc2626", ls="--", lw=1, label=f"trained depth {trained}")
        ax.set_xlabel("iteration t (0: embedded tokens)")
        ax.set_title(f"{label} (mean)", fontsize=10)
        ax.grid(alpha=0.3)
        if j == 0:
            ax.legend(fontsize=7)
    ax = fig.add_subplot(1, 4, 4)
    run = out["runs"][0]
    pi = run["per_iteration"]
    ts = range(1, len(pi["d_attn_attn_step"]) + 1)
    ax.plot(ts, pi["d_attn_attn_step"], color="C3", marker="o", markersize=2.5, label="attention step (alpha)")
    ax.plot(ts, pi["d_attn_abs_alpha"], color="C3", ls=":", label="attention step with |alpha|")
    ax.plot(ts, pi["first_order_alpha_neg"], color="C4", lw=1, label="first order, alpha < 0 entries")
    ax.plot(ts, pi["first_order_alpha_pos"], color="C2", lw=1, label="first order, alpha > 0 entries")
    ax.plot(ts, pi["d_attn_ff_step"], color="C7", ls="--", lw=1, label="feedforward step")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("iteration t")
    ax.set_title(f"E_ATTN change per half-step ({run['mask_ratio']:.0%} masked)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(f"MIM token model (training step {out.get('training_steps')}), {out['images']} CIFAR-10 "
                 f"{out['split']} images; solid: as trained, dotted: every step size replaced by its absolute value",
                 fontsize=9)
    fig.savefig(path)


@bench_args.input_errors_exit
def main() -> None:
    from hyperset.training.mim_task import load_images
    from hyperset.vision.maskgit import mask_by_ratio
    from hyperset.vision.reconstruct import load_mim

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", type=Path, default=None, help="token model (default: shipped)")
    ap.add_argument("--data", type=Path, required=True, help="CIFAR-10 root or ImageFolder tree")
    ap.add_argument("--split", default="test", choices=("train", "test"))
    ap.add_argument("--images", type=bench_args.count, default=200, help="first N images of the split")
    ap.add_argument("--iters", type=bench_args.iterations, default=None,
                    help="iterations, at least 2x the trained depth (default: 2x the trained depth)")
    ap.add_argument("--mask-ratios", type=bench_args.ratio, nargs="+", default=[0.4, 0.0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--batch", type=bench_args.count, default=50)
    ap.add_argument("--out", type=bench_args.output_file, default=RESULTS / "mim_energy.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    pipeline = load_mim(args.checkpoint, device="cpu")
    model, trained = pipeline.model, pipeline.trained_iters
    iters = args.iters or 2 * trained
    if iters < 2 * trained:
        raise bench_args.BenchInputError(f"--iters {iters}: expected at least 2x the trained depth of {trained} "
                                         f"iterations ({2 * trained}), the deepest of the depths T and 2T measured")
    images = load_images(args.data, args.split, pipeline.image_size)
    n = min(args.images, len(images))
    codes = torch.cat([pipeline.encode(images.floats(range(i, min(i + 100, n)))) for i in range(0, n, 100)])
    codes = codes.reshape(n, -1)
    runs = []
    for ratio in args.mask_ratios:
        mask = mask_by_ratio(tuple(codes.shape), ratio, generator=torch.Generator().manual_seed(args.seed))
        run = {"mask_ratio": ratio, **measure(model, codes.masked_fill(mask, pipeline.mask_id), iters, args.batch)}
        runs.append(run)
        pi = run["per_iteration"]
        print(f"{ratio:.0%} masked: E_ATTN + E_FF never rises (t = 1..T / 1..2T) on "
              f"{run['monotone_total']['T']:.1%} / {run['monotone_total']['2T']:.1%} of {n} images; "
              f"E_ATTN t=1 {run['mean']['attn'][1]:.0f} -> t=T {run['mean']['attn'][trained]:.0f}; "
              f"|alpha|,|gamma|: {run['counterfactual_abs_steps']['monotone_total']['2T']:.1%}", flush=True)
        for t in range(iters):
            masked_share = pi["alpha_neg_masked"][t]
            on_masked = f", masked tokens {masked_share:.1%}" if masked_share is not None else ""
            print(f"  t={t + 1:2d} alpha {pi['alpha_mean'][t]:+.3f} ({pi['alpha_neg'][t]:.1%} < 0{on_masked}) "
                  f"gamma {pi['gamma_mean'][t]:+.3f} ({pi['gamma_neg'][t]:.1%} < 0) | dE_ATTN attention step "
                  f"{pi['d_attn_attn_step'][t]:+8.1f} (alpha<0 {pi['first_order_alpha_neg'][t]:+7.1f}, alpha>0 "
                  f"{pi['first_order_alpha_pos'][t]:+7.1f}; |alpha| {pi['d_attn_abs_alpha'][t]:+8.1f}) "
                  f"ff step {pi['d_attn_ff_step'][t]:+7.1f} | cos {pi['cos_update_grad'][t]:.2f}", flush=True)
    cfg = model.cfg
    out = {"checkpoint": str(args.checkpoint) if args.checkpoint else "shipped", "data": str(args.data),
           "split": args.split, "images": n, "seed": args.seed, "iters": iters, "trained_iters": trained,
           "model": {"dim": cfg.dim, "heads": cfg.heads, "ff_hidden": cfg.ff_hidden, "step_cond": cfg.step_cond,
                     "step_sign": cfg.step_sign, "attention": cfg.attention, "feedforward": cfg.feedforward},
           "gains": gains(model),
           "training_steps": pipeline.info.get("steps"), "energy_definition": "layer.energy: normalization first, "
           "no learned gains (hyperset.energies)", "rtol": RTOL, "machine": machine(args.threads),
           "seconds": round(time.perf_counter() - t0, 1), "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, out)
    plot(out, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
