"""The masked-image-modeling table of docs/mim.md, from the shipped models (or a checkpoint), as JSON + Markdown.

    python bench/mim_table.py --data data/cifar10 --images 300            # CIFAR-10 test images

For each masking ratio (10/20/30/40%): the token model at its trained number of iterations and at 2x (MaskGIT
decoding, 24 arccos steps, temperature 1, the same seeded masks for every row), and the most-frequent-code
baseline; plus the tokenizer's own reconstruction (the ceiling). Each cell is what `hyperset-eval mim` prints for
the same arguments (it calls the same function), so any single number can be re-checked with, e.g.,

    hyperset-eval mim --data data/cifar10 --images 300 --mask-ratio 0.3 --iters 24 --json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import bench_args
import numpy as np
import torch

from hyperset.checkpoint import atomic_write_json
from hyperset.config import MAX_ITERS
from hyperset.training.eval_mim import evaluate_reconstruction, model_row, most_frequent_code
from hyperset.training.mim_task import load_images
from hyperset.vision.reconstruct import load_mim

RESULTS = Path(__file__).resolve().parent / "results"


@bench_args.input_errors_exit
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", nargs="?", type=Path, default=None, help="token model (default: shipped)")
    ap.add_argument("--data", type=Path, required=True, help="CIFAR-10 root or ImageFolder tree")
    ap.add_argument("--split", default="test", choices=("train", "test"))
    ap.add_argument("--images", type=bench_args.at_least(0), default=300, help="first N images of the split (0: all)")
    ap.add_argument("--ratios", type=bench_args.ratio, nargs="+", default=[0.1, 0.2, 0.3, 0.4])
    ap.add_argument("--multipliers", type=bench_args.iterations, nargs="+", default=[1, 2],
                    help=f"iterations as multiples of trained (at most {MAX_ITERS:,} iterations)")
    ap.add_argument("--steps", type=bench_args.count, default=24)
    ap.add_argument("--threads", type=bench_args.count, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=bench_args.output_file, default=RESULTS / "mim_table.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    pipeline = load_mim(args.checkpoint, device="cpu")
    tok = pipeline.tokenizer
    trained = pipeline.model.cfg.iters
    if trained * max(args.multipliers) > MAX_ITERS:
        raise bench_args.BenchInputError(f"--multipliers {max(args.multipliers)}: {max(args.multipliers)}x the "
                                         f"trained depth of {trained} iterations is over {MAX_ITERS:,}")
    images = load_images(args.data, args.split, tok.image_size)
    if args.images:
        images = images.subset(np.arange(min(args.images, len(images))))
    fill = most_frequent_code(tok, load_images(args.data, "train", tok.image_size), 5000, 250, args.seed)
    rows = []
    for ratio in args.ratios:
        base = evaluate_reconstruction(images, ratio, tokenizer=tok, fill_code=fill, seed=args.seed)
        rows.append({"model": "most-frequent code", "iters": 0, "mask_ratio": ratio, **_metrics(base)})
        print(f"{ratio:.0%} most-frequent      PSNR {base['psnr']:.2f}  SSIM {base['ssim']:.3f}", flush=True)
        for mult in args.multipliers:
            t0 = time.perf_counter()
            res = evaluate_reconstruction(images, ratio, pipeline=pipeline, iters=trained * mult, steps=args.steps,
                                          seed=args.seed)
            name, config = model_row(pipeline, trained * mult)
            rows.append({"model": name, "config": config, "iters": trained * mult, "mask_ratio": ratio,
                         "seconds": time.perf_counter() - t0, **_metrics(res)})
            print(f"{ratio:.0%} {name} @{trained * mult:<3d} PSNR {res['psnr']:.2f}  SSIM {res['ssim']:.3f}  "
                  f"MS-SSIM {res['ms_ssim']:.3f}", flush=True)
    out = {"checkpoint": str(args.checkpoint) if args.checkpoint else "shipped", "data": str(args.data),
           "split": args.split, "images": len(images), "steps": args.steps, "temperature": 1.0, "seed": args.seed,
           "trained_iters": trained, "most_frequent_code": fill, "tokenizer_psnr": base["tokenizer_psnr"],
           "tokenizer_ssim": base["tokenizer_ssim"], "ms_ssim_config": base["ms_ssim_config"],
           "lpips": base["lpips_reason"], "fid": base["fid_reason"], "rows": rows, "torch": torch.__version__,
           "command": bench_args.command_line("mim_table", None)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, out)
    print(markdown(out))


def _metrics(res: dict) -> dict:
    return {k: res[k] for k in ("psnr", "ssim", "ms_ssim", "lpips", "fid")}


def markdown(out: dict) -> str:
    ratios = sorted({r["mask_ratio"] for r in out["rows"]})
    names = []
    for r in out["rows"]:
        key = (r["model"], r["iters"])
        if key not in names:
            names.append(key)
    lines = ["| masked tokens | " + " | ".join(f"{x:.0%}" for x in ratios) + " |",
             "|---|" + "---|" * len(ratios)]
    for model, iters in names:
        label = model if not iters else f"{model}, {iters} iterations"
        cells = [next(f"{r['psnr']:.2f} / {r['ssim']:.3f}" for r in out["rows"]
                      if r["model"] == model and r["iters"] == iters and r["mask_ratio"] == x) for x in ratios]
        lines.append(f"| {label}, PSNR / SSIM | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
