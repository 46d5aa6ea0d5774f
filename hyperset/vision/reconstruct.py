"""Masked image reconstruction with a trained tokenizer and token model (the paper's masked image modeling).

An image is tokenized (VQ tokenizer: 32x32 CIFAR images -> 8x8 codes; or the paper's VQGAN: 256 px -> 16x16),
the tokens under a mask are replaced by the mask id (= codebook size), the token model fills them in with
MaskGIT iterative decoding (Sec. 4.3 and App. "Masked Image Modeling": 24 steps, temperature 1), and the filled
codes are decoded back to pixels.

``reconstruct(..., decode="expected")`` decodes instead the expected code embedding: one forward pass of the
token model on the masked codes, then at each masked position the mean of the codebook vectors under its
predicted distribution (softmax(logits) @ codebook), at the others the image's own code vector, and the
tokenizer's decoder on that latent grid. That mean is the MSE-optimal latent under the model's distribution, so it
trades sharpness (a blend of codes, not one code) for PSNR; MaskGIT sampling draws one code per token.

    from hyperset.vision.reconstruct import load_mim, sample_images, pixel_to_token_mask
    pipe = load_mim()                                  # the shipped CIFAR-10 tokenizer + token model
    images = torch.stack(list(sample_images().values()))
    mask = pixel_to_token_mask(drawn_mask, pipe.grid)  # (H, W) bool -> (8, 8) bool
    result = pipe.reconstruct(images, mask.expand(len(images), -1, -1))
    result.images, result.energy["attn"]              # reconstructions, E_ATTN per iteration
    pipe.reconstruct(images, mask, decode="expected")  # the expected code embedding instead of sampling

Used by ``hyperset-eval mim`` and by the web app.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor, nn

from ..checkpoint import CheckpointError, check_weights_fit, checkpoint_dir, is_shipped, load_weights_into, read_config
from ..config import check_table, whole_number
from ..models import HyperSETModel, load_checkpoint, model_bytes, shapes_only
from ..pretrained import weights_root
from .data import decode_image, resize_crop
from .maskgit import decode as maskgit_decode
from .vq import VQConfig, VQTokenizer

WEIGHTS_DIR = weights_root() / "mim"
TOKENIZER_KIND = "vq-tokenizer"
VQGAN_SUFFIXES = (".ckpt", ".pth", ".pt", ".safetensors")
DECODINGS = ("maskgit", "expected")  # reconstruct(decode=...): MaskGIT sampling (the paper's), expected embedding
# What a tokenizer checkpoint's config.json may describe (a file received from someone else): far above the shipped
# tokenizer (hidden 128, 2 residual blocks, 512 codes of 64) and any CIFAR or ImageNet one, so that a config cannot
# make the loader build without end; the sizes within these bounds are then checked against the weights' header.
TOKENIZER_SIZES = {"in_channels": (1, 64), "hidden": (2, 8_192), "num_res_blocks": (0, 64), "num_downsamples": (1, 8),
                   "codebook_size": (1, 1 << 20), "code_dim": (1, 8_192), "restart_after": (0, 1 << 40)}
MAX_TOKENIZER_BYTES = 2 << 30  # weights and buffers (the shipped tokenizer: 3.5 MB; the paper's VQGAN: 0.4 GB)
MAX_IMAGE_SIZE = 1_024  # the side of the images a tokenizer's config.json may ask for (data.image_size)


class MIMWeightsMissing(FileNotFoundError):
    """The shipped tokenizer or token model is not in the package (not trained / not copied there yet)."""


class Tokenizer(nn.Module):
    """One interface over the CIFAR VQ tokenizer and the Taming VQGAN: images [0, 1] <-> codes (B, h, w).

    Attributes: ``num_codes`` (K; the mask id is K), ``image_size`` (side of the images it is used at),
    ``grid`` (side of the code grid), ``kind`` ("vq-tokenizer" or "vqgan"), ``info`` (its config.json) and
    ``source`` (where it was loaded from: its absolute path, or "shipped"; "" when built in memory).
    """

    def __init__(self, model: nn.Module, kind: str, image_size: int, info: dict[str, Any] | None = None,
                 source: str = "") -> None:
        super().__init__()
        self.model = model.eval()
        self.kind = kind
        self.image_size = int(image_size)
        self.info = info or {}
        self.source = source
        cfg = model.cfg
        downsample = 2 ** cfg.num_downsamples if kind == TOKENIZER_KIND else cfg.resolution // cfg.grid
        if self.image_size % downsample:
            raise ValueError(f"image size {image_size} is not a multiple of the tokenizer's factor {downsample}")
        self.grid = self.image_size // downsample

    @property
    def num_codes(self) -> int:
        return int(self.model.num_codes)

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """images (B, 3, H, W) in [0, 1] -> codes (B, h, w) long."""
        return self.model.encode(images)

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """codes (B, h, w) long in [0, K) -> images (B, 3, H, W) in [0, 1]."""
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.num_codes):
            raise ValueError(f"codes must lie in [0, {self.num_codes}); masked positions must be filled first")
        if self.kind == TOKENIZER_KIND:
            return self.model.decode(codes)
        return self.model.decode_code(codes)

    @property
    def codebook(self) -> Tensor:
        """The code vectors (K, D): ``decode(codes)`` is ``decode_latents`` of ``codebook[codes]`` (channels first)."""
        return self.model.quantize.embedding.weight

    @torch.no_grad()
    def decode_latents(self, latents: Tensor) -> Tensor:
        """latents (B, D, h, w) in the codebook's space -> images (B, 3, H, W) in [0, 1]: the decoder applied to
        any latent grid, e.g. a mean of code vectors (for the VQGAN after its ``post_quant_conv``, as for codes)."""
        d = self.codebook.shape[1]
        if latents.ndim != 4 or latents.shape[1] != d or tuple(latents.shape[2:]) != (self.grid, self.grid):
            raise ValueError(f"latents must be (B, {d}, {self.grid}, {self.grid}), got {tuple(latents.shape)}")
        return self.model.decode_latents(latents.to(self.codebook.dtype))


def default_tokenizer_dir() -> Path:
    return WEIGHTS_DIR / "tokenizer"


def default_model_dir() -> Path:
    return WEIGHTS_DIR / "model"


def _shipped(directory: Path, what: str) -> Path:
    if not (directory / "config.json").is_file() or not (directory / "model.safetensors").is_file():
        raise MIMWeightsMissing(
            f"the shipped {what} is not in this package ({directory} lacks config.json / model.safetensors); "
            "train one (hyperset-train mim --recipe mim-cpu-tokenizer / mim-cpu) and pass its folder")
    return directory


def load_tokenizer(path: str | Path | None = None, device: str | torch.device = "cpu",
                   image_size: int | None = None) -> Tokenizer:
    """A tokenizer from a ``vq-tokenizer`` checkpoint folder (default: the shipped one) or a VQGAN file.

    A file ending in .ckpt/.pth/.pt/.safetensors is read as a Taming VQGAN checkpoint (``load_vqgan``), the
    paper's tokenizer, used at 256 px unless ``image_size`` says otherwise. The tokenizer's ``source`` is the
    absolute path it was read from, or "shipped".
    """
    source = "shipped" if path is None else str(Path(path).resolve())
    path = _shipped(default_tokenizer_dir(), "tokenizer") if path is None else Path(path)
    if path.is_file() and path.suffix in VQGAN_SUFFIXES and path.name != "model.safetensors":
        from .vqgan import load_vqgan

        vqgan = load_vqgan(path)
        return Tokenizer(vqgan, "vqgan", image_size or vqgan.cfg.resolution, {"path": str(path)},
                         source=source).to(device)
    path = checkpoint_dir(path)
    meta = read_config(path, kind=TOKENIZER_KIND)
    cfg, stored_size = _tokenizer_config(meta, path / "config.json")
    with shapes_only(path):  # checked against the weights' header before anything is allocated
        shapes = VQTokenizer(cfg)
    size = model_bytes(shapes)
    if size > MAX_TOKENIZER_BYTES:
        raise CheckpointError(f"{path / 'config.json'}: describes a tokenizer of {size / 2**30:.1f} GiB; a tokenizer "
                              f"checkpoint is at most {MAX_TOKENIZER_BYTES / 2**30:.0f} GiB")
    what = "weights of a VQ tokenizer"
    check_weights_fit(shapes, path, what)
    model = shapes if is_shipped(path) else VQTokenizer(cfg)
    load_weights_into(model, path, what)
    return Tokenizer(model, TOKENIZER_KIND, image_size or stored_size, meta, source=source).to(device)


def _tokenizer_config(meta: dict[str, Any], where: Path) -> tuple[VQConfig, int]:
    """The VQConfig of a tokenizer checkpoint's config.json (`meta`, read from `where`) and the image size it was
    trained at (``data.image_size``, default 32), checked: the keys and types of VQConfig, sizes within
    ``TOKENIZER_SIZES``, finite floats, ``data`` a table and the image size a whole number up to MAX_IMAGE_SIZE
    that the code grid divides. Anything else is a CheckpointError naming the file."""
    model = meta["model"]  # a dict (read_config)
    try:
        check_table(VQConfig, model, "model")
        for key, (least, most) in TOKENIZER_SIZES.items():
            if key in model and not least <= model[key] <= most:
                raise ValueError(f"model.{key} = {str(model[key])[:40]}: expected {least:,} to {most:,}")
        for key in ("beta", "decay", "eps"):
            if key in model and not -1e300 < model[key] < 1e300:  # not NaN, infinite or an integer past floats
                raise ValueError(f"model.{key} = {str(model[key])[:40]}: expected a finite number")
        cfg = VQConfig(**model)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: invalid tokenizer config ({e})") from None
    data = meta.get("data", {})
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: data = {str(data)[:40]}: expected a table (the data the tokenizer was "
                              "trained on)")
    size = data.get("image_size", 32)
    factor = 2**cfg.num_downsamples
    if isinstance(size, bool) or not isinstance(size, int) or not factor <= size <= MAX_IMAGE_SIZE or size % factor:
        raise CheckpointError(f"{where}: data.image_size = {str(size)[:40]}: expected a whole number from {factor} "
                              f"to {MAX_IMAGE_SIZE:,}, a multiple of the tokenizer's factor {factor}")
    return cfg, size


def check_compatible(tokenizer: Tokenizer, model: HyperSETModel) -> None:
    """The token model must read K + 1 tokens (codes + mask id K), predict K codes over h * w positions."""
    cfg, k, n = model.cfg, tokenizer.num_codes, tokenizer.grid**2
    problems = []
    if cfg.vocab_size != k + 1:
        problems.append(f"vocab_size {cfg.vocab_size} != codebook size + 1 = {k + 1}")
    if cfg.num_classes != k:
        problems.append(f"num_classes {cfg.num_classes} != codebook size {k}")
    if cfg.seq_len != n:
        problems.append(f"seq_len {cfg.seq_len} != {tokenizer.grid}x{tokenizer.grid} code grid = {n}")
    if problems:
        raise ValueError("token model and tokenizer do not match: " + "; ".join(problems))


def expected_latents(codebook: Tensor, codes: Tensor, mask: Tensor, logits: Tensor,
                     temperature: float = 1.0) -> Tensor:
    """The expected code embedding: latents (B, D, h, w) for the tokenizer's ``decode_latents``.

    At masked positions (mask (B, h, w), True = masked) the mean code vector under the token model's predicted
    distribution, softmax(logits / temperature) @ codebook (temperature 0: the most probable code's vector); at
    the others the image's own code vector codebook[codes]. ``codebook`` (K, D), ``codes`` (B, h, w) long in
    [0, K) at the unmasked positions (masked ones are ignored), ``logits`` (B, h * w, >= K): classes from K on
    (the mask id) are never part of the distribution, as in MaskGIT sampling.
    """
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    b, h, w = codes.shape
    k = codebook.shape[0]
    book = codebook.float()
    logits = logits.reshape(b, h * w, -1)[..., :k].float()
    if temperature == 0:
        mean = book[logits.argmax(-1)]
    else:
        mean = (logits / temperature).softmax(-1) @ book  # (B, N, D)
    mask = mask.reshape(b, h * w, 1).to(mean.device)
    own = book[codes.reshape(b, h * w).masked_fill(mask[..., 0], 0)]
    z = torch.where(mask, mean, own)
    return z.reshape(b, h, w, -1).permute(0, 3, 1, 2).to(codebook.dtype)


@dataclass
class ReconstructionResult:
    """What ``MIMPipeline.reconstruct`` returns (all tensors on the CPU).

    images: reconstructions (B, 3, H, W) in [0, 1]: decoded from ``codes`` ("maskgit"), or from the expected code
        embedding at the masked positions ("expected"; see ``expected_latents``).
    codes: the filled code grids (B, h, w); unmasked positions equal ``input_codes``. For "expected" the masked
        positions hold the most probable code (argmax of the same logits): a summary, not what ``images`` shows.
    input_codes: the tokenizer's codes of the input images (B, h, w).
    mask: the token mask used (B, h, w), True = masked.
    tokenizer_images: decode(input_codes): the best any token model can do (the tokenizer's ceiling).
    masked_images: the inputs with every masked token's pixel block painted mid-gray (for display).
    energy: {"attn": [T], "ff": [T]} E_ATTN and E_FF after each iteration t = 1..T of the token model's
        forward pass at the final decoding step (its input: the codes with the last still-masked tokens; for
        "expected" the one forward pass, on the codes with every masked token), averaged over the batch; empty
        for baselines without an energy (Transformer). As the trace defines them: "normalization first", without
        the learned gains (``hyperset.energies``).
    energy_per_image: the same, per image: {"attn": (B, T), "ff": (B, T)}.
    step_sizes: the step sizes of that same forward pass per iteration (``step_size_stats``): the mean of
        alpha_t and gamma_t and the share of their entries below zero; empty for models without them.
    iters, steps, temperature: the settings used ("expected": steps is 1, one forward pass, and the temperature is
        that of its softmax).
    decode: "maskgit" or "expected", the decoding used.
    """

    images: Tensor
    codes: Tensor
    input_codes: Tensor
    mask: Tensor
    tokenizer_images: Tensor
    masked_images: Tensor
    energy: dict[str, list[float]] = field(default_factory=dict)
    energy_per_image: dict[str, Tensor] = field(default_factory=dict)
    step_sizes: dict[str, list[float]] = field(default_factory=dict)
    iters: int = 0
    steps: int = 0
    temperature: float = 1.0
    decode: str = "maskgit"


def pixel_to_token_mask(pixel_mask: Tensor | np.ndarray, grid: int, threshold: float = 0.5) -> Tensor:
    """A drawn pixel mask (H, W) or (B, H, W), True = hidden, -> a token mask (grid, grid) / (B, grid, grid).

    Each token covers an (H / grid) x (W / grid) block of pixels. A token is masked when at least
    ``threshold`` of its pixels are masked: the default 0.5 masks a token when most of it is hidden (a thin
    stroke does not wipe out whole tokens); any value in (0, 1] works, and a tiny value such as 1e-6 masks a
    token when any of its pixels is hidden. H and W must be multiples of ``grid``.
    """
    m = torch.as_tensor(np.asarray(pixel_mask) if not isinstance(pixel_mask, Tensor) else pixel_mask)
    if m.ndim not in (2, 3):
        raise ValueError(f"pixel mask must be (H, W) or (B, H, W), got shape {tuple(m.shape)}")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    h, w = m.shape[-2:]
    if h % grid or w % grid:
        raise ValueError(f"a {h}x{w} pixel mask does not split into a {grid}x{grid} token grid")
    frac = F.avg_pool2d(m.reshape(-1, 1, h, w).float(), (h // grid, w // grid))
    return (frac >= threshold - 1e-9).reshape(*m.shape[:-2], grid, grid)


def paint_mask(images: Tensor, mask: Tensor, value: float = 0.5) -> Tensor:
    """images (B, 3, H, W) with the pixels of masked tokens (mask (B, h, w)) set to ``value``."""
    h, w = images.shape[-2:]
    pixels = F.interpolate(mask[:, None].float(), size=(h, w), mode="nearest").bool()
    return images.masked_fill(pixels, value)


def paste_unmasked(images: Tensor, originals: Tensor, mask: Tensor) -> Tensor:
    """``images`` with the pixels of every unmasked token (mask (B, h, w), True = masked) taken from
    ``originals`` unchanged: only the masked tokens' pixels remain the model's. Both (B, 3, H, W)."""
    if images.shape != originals.shape:
        raise ValueError(f"images {tuple(images.shape)} and originals {tuple(originals.shape)} differ in shape")
    h, w = images.shape[-2:]
    pixels = F.interpolate(mask[:, None].float(), size=(h, w), mode="nearest").bool()
    return torch.where(pixels, images, originals.to(images.dtype))


@torch.no_grad()
def step_size_stats(model: HyperSETModel, tokens: Tensor, iters: int | None = None) -> dict[str, list[float]]:
    """The step sizes of the token model's forward pass on ``tokens`` (B, N), per iteration t = 1..iters (means
    over the batch): ``alpha_mean``, ``gamma_mean`` and ``alpha_negative``, ``gamma_negative``, the share of
    their entries (images x tokens x channels) below zero. Where alpha (gamma) is negative, that coordinate of the
    attention (feedforward) step moves up its energy's gradient. For layers with an attention step
    (``attn_grad``) also ``attn_step``: the change of E_ATTN (as the trace reports it) in the attention half of
    iteration t, and ``attn_step_abs``: the same step with |alpha| instead of alpha. Empty for models without
    step sizes."""
    core = model.core
    if core.step_sizes is None:
        return {}
    out: dict[str, list[float]] = {}
    x0 = model.stem(tokens)
    prev = x0
    for layer, t, x in core.iterate(x0, iters):
        alpha, gamma = (v.expand_as(prev) for v in core.steps_at(prev, x0, t))
        for name, value in (("alpha", alpha), ("gamma", gamma)):
            out.setdefault(f"{name}_mean", []).append(float(value.float().mean()))
            out.setdefault(f"{name}_negative", []).append(float((value < 0).float().mean()))
        if hasattr(layer, "attn_grad"):
            update = layer.attn_grad(prev, layer.weights(t)[0])
            before = layer.energy(prev, t)["attn"]
            for key, a in (("attn_step", alpha), ("attn_step_abs", alpha.abs())):
                out.setdefault(key, []).append(float((layer.energy(prev - a * update, t)["attn"] - before).mean()))
        prev = x
    return out


def prepare_images(images: Tensor | Image.Image | list[Image.Image], size: int) -> Tensor:
    """PIL image(s) or a float tensor (B, 3, H, W) in [0, 1] -> (B, 3, size, size): the largest central square,
    resized with antialiased bilinear interpolation (``hyperset.vision.data.resize_crop``, the preprocessing of
    MIM training too; a no-op when already size x size)."""
    if isinstance(images, Image.Image):
        images = [images]
    if isinstance(images, list):
        return torch.cat([prepare_images(decode_image(im)[None], size) for im in images])
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected RGB images (B, 3, H, W), got shape {tuple(images.shape)}")
    return resize_crop(images, size)


class MIMPipeline:
    """Tokenizer + token model: masked reconstruction by MaskGIT decoding or the expected code embedding (see the
    module docstring)."""

    def __init__(self, tokenizer: Tokenizer, model: HyperSETModel, info: dict[str, Any] | None = None) -> None:
        check_compatible(tokenizer, model)
        self.tokenizer = tokenizer.eval()
        self.model = model.eval()
        self.info = info or {}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def mask_id(self) -> int:
        """The token written at masked positions: the codebook size K (paper: 1024 for the VQGAN)."""
        return self.tokenizer.num_codes

    @property
    def grid(self) -> int:
        return self.tokenizer.grid

    @property
    def image_size(self) -> int:
        return self.tokenizer.image_size

    @property
    def trained_iters(self) -> int:
        return self.model.cfg.iters

    def logits_fn(self, iters: int | None = None) -> Callable[[Tensor], Tensor]:
        """codes (B, N) with mask ids -> logits (B, N, K) of the token model run for ``iters`` iterations."""
        return lambda codes: self.model(codes.to(self.device), iters=iters)

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        return self.tokenizer.encode(images.to(self.device)).cpu()

    @torch.no_grad()
    def decode(self, codes: Tensor, fill: int | None = None) -> Tensor:
        """codes (B, h, w) -> images; positions holding the mask id are replaced by ``fill`` first (e.g. to
        preview a partly decoded grid); without ``fill`` they are an error."""
        codes = codes.to(self.device)
        if fill is not None:
            codes = codes.masked_fill(codes >= self.mask_id, fill)
        return self.tokenizer.decode(codes).cpu()

    @torch.no_grad()
    def reconstruct(self, images: Tensor, mask: Tensor, iters: int | None = None, steps: int = 24,
                    temperature: float = 1.0, randomize_temp: float = 0.0, mode: str = "arccos",
                    generator: torch.Generator | None = None,
                    on_step: Callable[[int, Tensor], None] | None = None,
                    decode: str = "maskgit") -> ReconstructionResult:
        """Reconstruct masked images.

        Args:
            images: (B, 3, H, W) in [0, 1] at the tokenizer's image size (see ``prepare_images``).
            mask: token mask (B, h, w) or (h, w) bool, True = masked; a pixel mask (B, H, W) / (H, W) is
                converted with ``pixel_to_token_mask`` (a token is masked when most of its pixels are).
            iters: token-model iterations (default: the trained number; any number works).
            steps: MaskGIT decoding steps (paper: 24).
            temperature: sampling temperature (paper: 1; 0 = argmax); for "expected" the temperature of the
                softmax whose mean is taken (0: the most probable code's vector).
            randomize_temp: Gumbel noise on the confidences (the authors' reconstruction evaluation: 0).
            mode: reveal schedule (paper: arccos).
            generator: CPU generator for reproducible sampling.
            on_step: ``on_step(step, codes)`` after each decoding step (masked positions hold ``mask_id``;
                preview with ``decode(codes, fill=...)``); "expected" calls it once, with the argmax codes.
            decode: "maskgit" (MaskGIT iterative sampling, the paper's protocol) or "expected" (one forward pass of
                ``iters`` iterations; masked positions decoded from the expected code embedding, see
                ``expected_latents``; ``steps``, ``randomize_temp``, ``mode`` and ``generator`` do not apply).
        """
        if decode not in DECODINGS:
            raise ValueError(f"decode must be one of {', '.join(map(repr, DECODINGS))}, got {decode!r}")
        if not isinstance(images, Tensor):
            raise TypeError(f"images must be a float torch.Tensor in [0, 1], got {type(images).__name__}")
        if not images.is_floating_point():
            raise TypeError(f"images must be float in [0, 1], got {images.dtype} (uint8 pixels: images / 255)")
        if images.ndim == 3:
            images = images[None]
        b = images.shape[0]
        if images.ndim != 4 or tuple(images.shape[1:]) != (3, self.image_size, self.image_size) or b == 0:
            raise ValueError(f"images must be (B >= 1, 3, {self.image_size}, {self.image_size}) in [0, 1], got "
                             f"{tuple(images.shape)}; resize them with prepare_images(images, {self.image_size})")
        lo, hi = (float(v) for v in torch.aminmax(images.detach().float()))
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo < -1e-3 or hi > 1 + 1e-3:
            raise ValueError(f"images must be finite values in [0, 1], got values from {lo:g} to {hi:g}")
        images = images.float().clamp(0, 1)  # a resize's rounding may step past [0, 1] by a hair
        mask = torch.as_tensor(mask)
        if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must be bool, or hold only 0 and 1 (True / 1 = masked)")
        mask = mask.bool().cpu()
        if mask.shape[-1] == self.image_size and self.image_size != self.grid:
            mask = pixel_to_token_mask(mask, self.grid)
        if mask.ndim == 2:
            mask = mask.expand(b, -1, -1)
        if tuple(mask.shape) != (b, self.grid, self.grid):
            raise ValueError(f"mask must be ({b}, {self.grid}, {self.grid}) tokens or a pixel mask, "
                             f"got {tuple(mask.shape)}")
        iters = self.trained_iters if iters is None else whole_number("iters", iters, 1)
        whole_number("steps", steps, 1)
        codes = self.encode(images)
        if decode == "expected":
            return self._reconstruct_expected(images, codes, mask, iters, temperature, on_step)
        last_input: list[Tensor] = []
        base = self.logits_fn(iters)

        def logits_fn(cur: Tensor) -> Tensor:
            last_input[:] = [cur]
            return base(cur)

        filled = maskgit_decode(logits_fn, codes.to(self.device), mask.to(self.device), self.mask_id, steps=steps,
                                temperature=temperature, mode=mode, randomize_temp=randomize_temp,
                                generator=generator, on_step=on_step).cpu()
        final_input = last_input[0] if last_input else codes.to(self.device)
        trace = self.model.run(final_input.reshape(b, -1), iters=iters, trace=True).trace
        per_image = {k: torch.stack(v, dim=1).cpu() for k, v in (trace.energy if trace else {}).items()}
        return ReconstructionResult(
            images=self.decode(filled), codes=filled, input_codes=codes, mask=mask,
            tokenizer_images=self.decode(codes), masked_images=paint_mask(images.cpu().float(), mask),
            energy={k: v.mean(0).tolist() for k, v in per_image.items()}, energy_per_image=per_image,
            step_sizes=step_size_stats(self.model, final_input.reshape(b, -1), iters),
            iters=iters, steps=steps, temperature=temperature, decode="maskgit")

    @torch.no_grad()
    def _reconstruct_expected(self, images: Tensor, codes: Tensor, mask: Tensor, iters: int, temperature: float,
                              on_step: Callable[[int, Tensor], None] | None) -> ReconstructionResult:
        """``reconstruct(decode="expected")``: one traced forward pass on the masked codes gives the logits, the
        energies and (recomputed on the same input) the step sizes; the images are the expected latents decoded."""
        b, n = codes.shape[0], self.grid**2
        inputs = codes.masked_fill(mask, self.mask_id).reshape(b, n).to(self.device)
        out = self.model.run(inputs, iters=iters, trace=True)
        latents = expected_latents(self.tokenizer.codebook, codes.to(self.device), mask, out.logits, temperature)
        best = out.logits.reshape(b, n, -1)[..., :self.mask_id].argmax(-1).reshape(codes.shape).cpu()
        filled = torch.where(mask, best, codes)
        if on_step is not None:
            on_step(0, filled.clone())
        per_image = {k: torch.stack(v, dim=1).cpu() for k, v in (out.trace.energy if out.trace else {}).items()}
        return ReconstructionResult(
            images=self.tokenizer.decode_latents(latents).cpu(), codes=filled, input_codes=codes, mask=mask,
            tokenizer_images=self.decode(codes), masked_images=paint_mask(images.cpu().float(), mask),
            energy={k: v.mean(0).tolist() for k, v in per_image.items()}, energy_per_image=per_image,
            step_sizes=step_size_stats(self.model, inputs, iters),
            iters=iters, steps=1, temperature=temperature, decode="expected")


def load_mim(directory: str | Path | None = None, tokenizer: str | Path | None = None,
             device: str | torch.device = "cpu") -> MIMPipeline:
    """Tokenizer + token model. ``directory`` is a token-model checkpoint folder (default: the shipped
    ``hyperset/weights/mim/model``); the tokenizer is ``tokenizer``, else the one named in the model's
    config.json (``data.tokenizer``), else (nothing recorded, or "shipped: ...") the shipped
    ``weights/mim/tokenizer``. A recorded tokenizer that does not exist here is a CheckpointError saying to pass
    it (``--tokenizer PATH``): the model's codes mean nothing to another tokenizer.
    ``device`` is a name the commands take ("auto", "cpu", "cuda", ...; one that cannot be had is a ValueError)
    or a torch.device."""
    if isinstance(device, str):
        from ..device import pick_device

        device = str(pick_device(device))
    model_dir = _shipped(default_model_dir(), "token model") if directory is None else Path(directory)
    model, info = load_checkpoint(model_dir, task="mim", map_location=device)
    if tokenizer is None:
        data = info.get("data")
        named = str(data.get("tokenizer") or "") if isinstance(data, dict) else ""
        if named and not named.startswith("shipped"):
            if not Path(named).exists():
                raise CheckpointError(
                    f"{model_dir / 'config.json'}: the token model was trained with the tokenizer {named}, which "
                    "does not exist here; pass it with --tokenizer PATH (load_mim(..., tokenizer=PATH))")
            tokenizer = named
    tok = load_tokenizer(tokenizer, device=device)
    return MIMPipeline(tok, model, info)


SAMPLES_DIR = WEIGHTS_DIR / "samples"


def sample_images(size: int = 32) -> dict[str, Tensor]:
    """The redistributable sample images shipped in ``hyperset/weights/mim/samples`` (sources and licenses in
    SOURCES.md there): name -> (3, size, size) float in [0, 1]. The 32 px files are used as they are; other
    sizes are resized from the 128 px versions in ``samples/large``."""
    folder = SAMPLES_DIR if size == 32 else SAMPLES_DIR / "large"
    files = sorted(folder.glob("*.png"))
    if not files:
        raise MIMWeightsMissing(f"no sample images in {folder}")
    out = {}
    for path in files:
        with Image.open(path) as img:
            out[path.stem] = prepare_images(img, size)[0]
    return out


def most_frequent_fill(codes: Tensor, mask: Tensor, code: int) -> Tensor:
    """The simple baseline: every masked token becomes the same (most frequent) code."""
    return codes.masked_fill(mask.bool(), int(code))


def describe_tokenizer(tokenizer: Tokenizer) -> dict[str, Any]:
    """A few facts about a tokenizer for reports."""
    cfg = tokenizer.model.cfg
    return {"kind": tokenizer.kind, "source": tokenizer.source, "codebook_size": tokenizer.num_codes,
            "grid": tokenizer.grid,
            "image_size": tokenizer.image_size, "bits_per_image": round(tokenizer.grid**2 * math.log2(
                tokenizer.num_codes), 1), "config": dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else {}}
