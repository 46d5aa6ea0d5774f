"""`hyperset-eval mim [CHECKPOINT] --data DIR --split test --mask-ratio R [--json]`: masked reconstruction.

Masks exactly R of the tokens of each image (uniformly random positions, seeded), fills them with the token model,
decodes with the tokenizer and compares with the original images: PSNR, SSIM, MS-SSIM, LPIPS and FID. LPIPS and FID
are torchmetrics' (the 'metrics' extra) on pretrained networks that are never downloaded: without the extra or the
local weight files (--lpips-weights, --fid-weights, or the torch hub cache) they are reported as null with the
reason. The tokenizer's own reconstruction (no masking) is reported as the ceiling. The JSON and the table name the
tokenizer used (its absolute path, or "shipped"), the device and the precision.

Decoding (the JSON's ``decode`` and the table say which was used):

- ``--decode expected`` (the default, as in the app): one forward pass of the token model, the mean code vector under
  its predicted distribution at each masked position (``MIMPipeline.reconstruct(decode="expected")``), decoded by the
  tokenizer. The mean is the least-squares estimate in latent space, the quantity PSNR rewards; sampling a code adds
  the spread of the distribution to the error.
- ``--decode maskgit``, the paper's protocol (App. "Masked Image Modeling"): MaskGIT decoding, 24 arccos steps,
  temperature 1 (the authors' reconstruction evaluation uses no Gumbel noise on the confidences, r_temp 0).

Differences from the authors' script: the images are not min-max normalised per image before the metrics, and
the mask is exactly R (theirs draws each token with probability R).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np
import torch

from hyperset.checkpoint import CheckpointError
from hyperset.cli_options import (
    FiniteFloat,
    checkpoint_input,
    device_option,
    echo_json,
    error_line,
    json_option,
    out_option,
    renamed_option,
    threads_option,
    write_json_out,
)
from hyperset.config import MAX_ITERS
from hyperset.device import describe, dtype_name, pick_device, set_cpu_threads
from hyperset.download import DownloadError
from hyperset.vision.data import download_cifar
from hyperset.vision.maskgit import mask_by_ratio
from hyperset.vision.metrics import compute_fid, compute_lpips, mean_score, ms_ssim, ms_ssim_config, psnr, ssim
from hyperset.vision.reconstruct import (
    DECODINGS,
    MIMPipeline,
    MIMWeightsMissing,
    Tokenizer,
    load_mim,
    load_tokenizer,
    most_frequent_fill,
)

from .mim_task import ImageSet, load_images

BASELINES = ("none", "most-frequent")


def most_frequent_code(tokenizer: Tokenizer, train: ImageSet, limit: int, batch: int, seed: int = 0) -> int:
    """The most frequent code over (a seeded sample of up to ``limit``) training images."""
    n = min(limit, len(train))
    idx = np.sort(np.random.default_rng(seed).permutation(len(train))[:n])
    counts = torch.zeros(tokenizer.num_codes, dtype=torch.long)
    device = next(tokenizer.parameters()).device
    for i in range(0, n, batch):
        codes = tokenizer.encode(train.floats(idx[i: i + batch]).to(device)).cpu()
        counts += torch.bincount(codes.flatten(), minlength=tokenizer.num_codes)
    return int(counts.argmax())


def evaluate_reconstruction(
    images: ImageSet,
    mask_ratio: float,
    pipeline: MIMPipeline | None = None,
    tokenizer: Tokenizer | None = None,
    fill_code: int | None = None,
    iters: int | None = None,
    steps: int = 24,
    temperature: float = 1.0,
    randomize_temp: float = 0.0,
    batch: int = 250,
    seed: int = 0,
    lpips_weights: str | Path | None = None,
    fid_weights: str | Path | None = None,
    decode: str = "maskgit",
) -> dict[str, Any]:
    """Metrics of masked reconstruction over ``images``: by the token model of ``pipeline`` (``decode``: "maskgit"
    sampling or the "expected" code embedding, see ``MIMPipeline.reconstruct``) or, with ``fill_code``, by the
    most-frequent-code baseline (``tokenizer`` only)."""
    tok = pipeline.tokenizer if pipeline is not None else tokenizer
    if tok is None:
        raise ValueError("give a pipeline (token model) or a tokenizer with fill_code")
    device = next(tok.parameters()).device
    n, g = len(images), tok.grid
    if n == 0:
        raise ValueError(f"{images.source}: no images to evaluate")
    mask = mask_by_ratio((n, g, g), mask_ratio, generator=torch.Generator().manual_seed(seed))
    sampler = torch.Generator().manual_seed(seed + 1)
    originals, recons, ceilings = [], [], []
    for i in range(0, n, batch):
        x = images.floats(range(i, min(i + batch, n)))
        m = mask[i: i + batch]
        if pipeline is not None and fill_code is None:
            res = pipeline.reconstruct(x, m, iters=iters, steps=steps, temperature=temperature,
                                       randomize_temp=randomize_temp, generator=sampler, decode=decode)
            recon, ceiling = res.images, res.tokenizer_images
        else:
            codes = tok.encode(x.to(device))
            recon = tok.decode(most_frequent_fill(codes, m.to(device), int(fill_code))).cpu()  # type: ignore[arg-type]
            ceiling = tok.decode(codes).cpu()
        originals.append(x)
        recons.append(recon.float())
        ceilings.append(ceiling.float())
    x, y, c = torch.cat(originals), torch.cat(recons), torch.cat(ceilings)
    size = x.shape[-1]
    ms_cfg = ms_ssim_config(size, size)
    lpips_values, lpips_reason = compute_lpips(y, x, weights_path=lpips_weights, batch=batch)
    fid, fid_reason = compute_fid(list(x.split(batch)), list(y.split(batch)), weights_path=fid_weights,
                                  device=device)
    return {
        "psnr": mean_score(psnr(y, x)),
        "ssim": mean_score(ssim(y, x)),
        "ms_ssim": mean_score(ms_ssim(y, x, config=ms_cfg)),
        "lpips": None if lpips_values is None else mean_score(lpips_values),
        "fid": fid,
        "lpips_reason": lpips_reason or None,
        "fid_reason": fid_reason or None,
        "tokenizer_psnr": mean_score(psnr(c, x)),
        "tokenizer_ssim": mean_score(ssim(c, x)),
        "ms_ssim_config": ms_cfg.describe(),
        "images": n,
        "mask_ratio": mask_ratio,
        "masked_tokens": int(mask[0].sum()),
        "tokens": g * g,
    }


def precision_of(*modules: torch.nn.Module) -> str:
    """The floating-point types the modules' weights run in ("fp32"; no autocast is used here)."""
    found = {p.dtype for m in modules for p in m.parameters() if p.is_floating_point()}
    return " + ".join(sorted(dtype_name(d) for d in found)) or "fp32"


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def model_row(pipeline: MIMPipeline | None, iters: int | None) -> tuple[str, str]:
    """(name, "Layer / Iteration / FF Ratio M (# Params)") as in the paper's tables."""
    if pipeline is None:
        return "Most-frequent code", "-"
    cfg = pipeline.model.cfg
    ratio = cfg.ff_hidden / cfg.dim
    m = f"{ratio:g}d" if ratio != 1 else "d"
    params = sum(p.numel() for p in pipeline.model.parameters()) / 1e6
    name = {"hyperset": "Ours (Hyper-SET)", "transformer": "Transformer"}.get(cfg.layer, cfg.layer)
    return name, f"L{cfg.n_layers} / Iter {iters or cfg.iters} / {m} ({params:.2f} M)"


def print_table(result: dict[str, Any]) -> None:
    """The paper's table layout, plus the tokenizer ceiling and the protocol."""
    head = ("Models", "Layer / Iteration / FF Ratio M (# Params)", "PSNR (↑)", "SSIM (↑)", "Multi-Scale SSIM (↑)",
            "LPIPS (↓)", "FID (↓)")
    rows = [(result["model"], result["model_config"], _fmt(result["psnr"]), _fmt(result["ssim"]),
             _fmt(result["ms_ssim"]), _fmt(result["lpips"]), _fmt(result["fid"])),
            ("Tokenizer (no masking)", "-", _fmt(result["tokenizer_psnr"]), _fmt(result["tokenizer_ssim"]),
             "", "", "")]
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    line = lambda r: " | ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    click.echo(f"Masked image modeling: {result['images']} {result['split']} images of {result['data']}, "
               f"masking {100 * result['mask_ratio']:g}% ({result['masked_tokens']} of {result['tokens']} tokens)")
    click.echo(line(head))
    click.echo("-+-".join("-" * w for w in widths))
    for r in rows:
        click.echo(line(r))
    if result["model"] != "Most-frequent code" and result.get("decode") == "expected":
        click.echo(f"decoding: expected code embedding (one forward pass; softmax temperature "
                   f"{result['temperature']:g}), {result['iters']} iterations")
    elif result["model"] != "Most-frequent code":
        click.echo(f"decoding: MaskGIT, {result['steps']} arccos steps, temperature {result['temperature']:g}, "
                   f"Gumbel noise {result['randomize_temp']:g}, {result['iters']} iterations")
    else:
        click.echo(f"baseline: every masked token set to code {result['most_frequent_code']} (the most frequent "
                   "code of the training images)")
    click.echo(result["ms_ssim_config"])
    click.echo(f"tokenizer: {result['tokenizer']}; {result['device']}, {result['precision']}")
    for key in ("lpips_reason", "fid_reason"):
        if result.get(key):
            click.echo(result[key])


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@checkpoint_input(None, "the shipped models")
@click.option("--data", required=True, type=click.Path(path_type=Path),
              help="CIFAR-10 root (cifar-10-batches-py/) or an ImageFolder tree (train/, val/)")
@click.option("--download", is_flag=True, help="fetch CIFAR-10 into --data first if it is not there (checksum "
                                               "verified)")
@click.option("--split", type=click.Choice(["test", "train"]), default="test", show_default=True,
              help="the split of --data whose images are masked and reconstructed")
@click.option("--mask-ratio", type=FiniteFloat(0.0, 1.0), default=0.4, show_default=True,
              help="fraction of each image's tokens that is masked (exactly, at seeded random positions)")
@click.option("--iters", type=click.IntRange(1, MAX_ITERS), default=None,
              help="token-model iterations (default: the trained number)")
@click.option("--decode", type=click.Choice(DECODINGS), default="expected", show_default=True,
              help="expected (as in the app): one forward pass, each masked token decoded from the mean code vector "
                   "under the model's predicted distribution, the least-squares estimate that PSNR rewards · "
                   "maskgit: MaskGIT iterative sampling (the paper's protocol)")
@renamed_option("--decode-steps", "steps", old="--steps", type=click.IntRange(min=1), default=24, show_default=True,
               help="MaskGIT decoding steps (paper: 24)")
@click.option("--temperature", type=FiniteFloat(0.0), default=1.0, show_default=True,
              help="softmax temperature: of MaskGIT sampling (paper: 1; 0 = argmax), or of the distribution whose "
                   "mean --decode expected takes (0 = the most probable code)")
@click.option("--randomize-temp", type=FiniteFloat(0.0), default=0.0, show_default=True,
              help="Gumbel noise on the confidences (MaskGIT r_temp; the authors' reconstruction eval: 0)")
@click.option("--images", "n_images", type=click.IntRange(min=0), default=500, show_default=True,
              help="evaluate the first N images of the split (0: all)")
@click.option("--baseline", type=click.Choice(BASELINES), default="none", show_default=True,
              help="most-frequent: fill masked tokens with the most frequent training code (no token model)")
@click.option("--tokenizer", "tokenizer_path", type=click.Path(path_type=Path), default=None,
              help="tokenizer folder or VQGAN checkpoint (default: the one the model was trained with / shipped)")
@click.option("--image-size", type=click.IntRange(min=1), default=None, help="image side (default: the tokenizer's)")
@renamed_option("--batch-size", "batch", old="--batch", type=click.IntRange(min=1), default=250, show_default=True,
               help="images per forward pass")
@click.option("--seed", type=int, default=0, show_default=True,
              help="seed of the masked positions and of MaskGIT's sampling")
@click.option("--lpips-weights", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="torchvision's ImageNet AlexNet weights (alexnet-owt-7be5be79.pth) for LPIPS [default: "
                   "$HYPERSET_LPIPS_WEIGHTS, else the torch hub cache]; needs the 'metrics' extra")
@click.option("--fid-weights", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="torch-fidelity's Inception-v3 weights (weights-inception-2015-12-05-6726825d.pth) for FID "
                   "[default: $HYPERSET_FID_WEIGHTS, else the torch hub cache]; needs the 'metrics' extra")
@threads_option()
@device_option()
@json_option()
@out_option()
def mim_command(checkpoint: str | None, data: Path, download: bool, split: str, mask_ratio: float,
                iters: int | None, decode: str, steps: int, temperature: float, randomize_temp: float,
                n_images: int, baseline: str,
                tokenizer_path: Path | None, image_size: int | None, batch: int, seed: int,
                lpips_weights: Path | None, fid_weights: Path | None, threads: int | None, device: str,
                as_json: bool, out: str | None) -> None:
    """Masked image reconstruction of a token model (default: the shipped CIFAR-10 models)."""
    from hyperset.cli_options import check_output_file

    if out is not None:
        check_output_file("--out", out)
    for name, value in (("--temperature", temperature), ("--randomize-temp", randomize_temp)):
        if not math.isfinite(value) or value < 0:  # checked whichever decoding uses it
            raise click.BadParameter(f"must be a finite number >= 0, got {value}", param_hint=f"'{name}'")
    torch.manual_seed(seed)
    path = Path(checkpoint) if checkpoint is not None else None
    try:
        set_cpu_threads(threads)
        device = str(pick_device(device))
        if download:
            download_cifar("cifar10", data)
        if path is not None and not path.exists():  # a shipped model's name ("mim"), as elsewhere
            from hyperset.pretrained import resolve

            path = resolve(str(path))
        pipeline: MIMPipeline | None = None
        if baseline == "none":
            pipeline = load_mim(path, tokenizer=tokenizer_path, device=device)
            tok = pipeline.tokenizer
        elif path is not None and tokenizer_path is None:  # the baseline on that model's tokenizer
            tok = load_mim(path, device=device).tokenizer
        else:
            tok = load_tokenizer(tokenizer_path, device=device, image_size=image_size)
        size = image_size or tok.image_size
        images = load_images(data, split, size)
        if n_images:
            images = images.subset(np.arange(min(n_images, len(images))))
        fill = None
        if baseline == "most-frequent":
            fill = most_frequent_code(tok, load_images(data, "train", size), 5000, batch, seed)
        result = evaluate_reconstruction(images, mask_ratio, pipeline=pipeline, tokenizer=tok, fill_code=fill,
                                         iters=iters, steps=steps, temperature=temperature,
                                         randomize_temp=randomize_temp, batch=batch, seed=seed,
                                         lpips_weights=lpips_weights, fid_weights=fid_weights, decode=decode)
    except MIMWeightsMissing as e:
        click.echo(error_line("hyperset-eval mim", e), err=True)
        sys.exit(2)
    except (CheckpointError, DownloadError, FileNotFoundError, ValueError) as e:
        click.echo(error_line("hyperset-eval mim", e), err=True)
        sys.exit(2)
    name, config = model_row(pipeline, iters)
    modules = [tok] if pipeline is None else [tok, pipeline.model]
    result.update({
        "tokenizer": tok.source or "shipped", "device": describe(torch.device(device)),
        "precision": precision_of(*modules),
        "model": name, "model_config": config, "baseline": baseline, "most_frequent_code": fill,
        "iters": (iters or pipeline.model.cfg.iters) if pipeline is not None else 0,
        "decode": decode if pipeline is not None else None,
        "steps": (steps if decode == "maskgit" else 1) if pipeline is not None else 0, "temperature": temperature,
        "randomize_temp": randomize_temp,
        "checkpoint": str(path) if path else ("shipped" if pipeline is not None else None),
        "split": split, "data": str(data), "seed": seed,
    })
    if out:
        write_json_out("hyperset-eval mim", out, result)
    if as_json:
        echo_json(result)
    else:
        print_table(result)
