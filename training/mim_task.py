"""Masked image modeling for the shared trainer, in two stages (recipe ``[objective] stage``).

* ``stage = "tokenizer"``: train the CIFAR VQ tokenizer (``hyperset.vision.vq``) on the training images minus
  a held-out validation part; the best checkpoint (highest validation PSNR) is saved as a "vq-tokenizer".
* ``stage = "decoder"``: the tokenizer's decoder trained on a frozen token model's expected code embeddings
  (``DecoderTask``), so that the default decoding ("expected") reconstructs with less error; the encoder and the
  codebook stay as they are (the codes, and so every token model trained on them, keep their meaning).
* ``stage = "tokens"``: the paper's masked image modeling (Sec. 4.3, App. "Masked Image Modeling", following
  MaskGIT): images are tokenized once by a frozen tokenizer (each training image and its mirror image, cached
  in memory), every token of a sample is masked independently with probability 0.4 * r, r ~ U(0, 1), masked
  tokens become the mask id (= codebook size), and the token model is trained with label-smoothed (0.1)
  cross-entropy on the masked tokens only. Evaluation on held-out images: token accuracy at 40% masking and
  the reconstruction PSNR / SSIM at 40% masking after 24-step MaskGIT decoding and the tokenizer's decoder.

Data: CIFAR-10 in its python layout (``DIR/cifar-10-batches-py``) or an ImageFolder tree
(``DIR/train/<class>/*`` and ``DIR/val/<class>/*``, or ``DIR/<class>/*``): the largest central square of each
image resized to ``image_size`` (``hyperset.vision.data.resize_crop``, as in reconstruction and the app).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hyperset.checkpoint import save_module
from hyperset.config import ModelConfig, check_choice, check_table
from hyperset.vision.data import ImageSource, cifar_dir, train_val_split
from hyperset.vision.maskgit import MODES, mask_by_ratio, random_token_mask
from hyperset.vision.maskgit import decode as maskgit_decode
from hyperset.vision.metrics import psnr, ssim
from hyperset.vision.reconstruct import (
    DECODINGS,
    TOKENIZER_KIND,
    Tokenizer,
    check_compatible,
    expected_latents,
    load_tokenizer,
)
from hyperset.vision.vq import VQConfig, VQTokenizer

from .epochs import epochs_to_steps
from .task import Task, check_eval_iters, check_nonnegative, check_segments, segment_mean, segment_outputs

STAGES = ("tokenizer", "tokens", "decoder")


# ----------------------------------------------------------------------------------------------------
# Images


class ImageSet:
    """The images of one split used at one size: an ``ImageSource`` (CIFAR arrays in memory, or image files
    decoded on demand), every image through ``resize_crop`` to ``size`` (the preprocessing of reconstruction and
    of the app as well)."""

    def __init__(self, images: ImageSource, size: int = 32) -> None:
        self.images, self.size = images, size

    @property
    def source(self) -> str:
        return self.images.name

    def __len__(self) -> int:
        return len(self.images)

    def subset(self, indices: np.ndarray) -> ImageSet:
        return ImageSet(self.images.subset(indices), self.size)

    def get(self, indices: np.ndarray | list[int] | range) -> Tensor:
        """uint8 (n, 3, S, S)."""
        return self.images.get(indices, self.size)

    def floats(self, indices: np.ndarray | list[int] | range) -> Tensor:
        """float (n, 3, S, S) in [0, 1]."""
        return self.get(indices).float().div_(255.0)


def load_images(root: str | Path, split: str, image_size: int = 32) -> ImageSet:
    """The "train" or "test" images of CIFAR-10 (python layout) or of an ImageFolder tree under ``root``.

    ImageFolder: "train" reads ``root/train`` (or ``root`` when it has no train/ folder); "test" reads
    ``root/val`` (or ``root/test``). CIFAR images must be used at 32 px. A split without images is a ValueError.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = Path(root)
    if not str(root) or not root.exists():
        raise FileNotFoundError(f"no data folder {str(root) or '(none given: --data DIR)'}; expected CIFAR-10 "
                                "(DIR/cifar-10-batches-py) or an ImageFolder tree (DIR/train/<class>/<images>)")
    try:
        cifar_dir("cifar10", root)
        is_cifar = True
    except FileNotFoundError:
        is_cifar = False
    if is_cifar:
        if image_size != 32:
            raise ValueError(f"CIFAR-10 images are 32x32; image_size {image_size} is not supported for them")
        return _nonempty(ImageSet(ImageSource.cifar("cifar10", root, split), size=32), split)
    if split == "train":
        folder = root / "train" if (root / "train").is_dir() else root
    else:
        folder = next((root / s for s in ("val", "test") if (root / s).is_dir()), None)
        if folder is None:
            raise FileNotFoundError(f"{root} is neither CIFAR-10 (cifar-10-batches-py/) nor an ImageFolder tree "
                                    "with a val/ (or test/) folder for the test split")
    return _nonempty(ImageSet(ImageSource.folder(folder), size=image_size), split)


def _nonempty(images: ImageSet, split: str) -> ImageSet:
    if len(images) == 0:
        raise ValueError(f"{images.source}: the {split} split holds no images")
    return images


def _generator(*keys: int) -> torch.Generator:
    """A CPU generator seeded from integers (deterministic batches and evaluation masks)."""
    seed = int(np.random.default_rng(list(keys)).integers(0, 2**63 - 1))
    return torch.Generator().manual_seed(seed)


@dataclass
class MIMData:
    """Data settings of both stages (recipe ``[data]``).

    data_dir: CIFAR-10 root or ImageFolder tree. image_size: side the images are used at.
    n_val: training images held out for validation (model selection); the test split is never used here.
    n_train: 0 = every remaining training image.
    flip: horizontal-flip augmentation (tokens stage: each image and its mirror are both encoded once).
    tokenizer: tokens stage: a "vq-tokenizer" checkpoint folder or a VQGAN checkpoint file ("" = shipped).
    eval_images: validation images decoded with MaskGIT at each evaluation (the PSNR metric).
    eval_tokens: validation images for token accuracy (one forward pass each).
    encode_batch: batch size for pre-encoding images.
    """

    data_dir: str = ""
    image_size: int = 32
    n_val: int = 2000
    n_train: int = 0
    flip: bool = True
    tokenizer: str = ""
    eval_images: int = 128
    eval_tokens: int = 2000
    encode_batch: int = 500
    seed: int = 0

    def __post_init__(self) -> None:
        for key, least in (("image_size", 1), ("n_val", 1), ("n_train", 0), ("eval_images", 0),
                           ("eval_tokens", 1), ("encode_batch", 1)):
            _count("data", key, getattr(self, key), least)


def _count(section: str, key: str, value: Any, least: int) -> None:
    """A recipe count: a whole number >= ``least``, else a ValueError naming ``section.key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{section}.{key} must be a whole number >= {least}, got {value!r}")


def _fraction(section: str, key: str, value: Any, low: float, high: float, low_open: bool, high_open: bool) -> None:
    """A recipe number in [low, high] (ends open as asked), else a ValueError naming ``section.key``."""
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value > low if low_open else value >= low) and (value < high if high_open else value <= high))
    if not ok:
        span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{section}.{key} must be a number in {span}, got {value!r}")


def _split(data: MIMData) -> tuple[ImageSet, ImageSet]:
    images = load_images(data.data_dir, "train", data.image_size)
    if data.n_val >= len(images):
        raise ValueError(f"n_val {data.n_val} leaves no training images out of {len(images)}")
    train_idx, val_idx = train_val_split(len(images), data.n_val / len(images), data.seed)
    if data.n_train:
        if data.n_train > len(train_idx):
            raise ValueError(f"data.n_train = {data.n_train} but {images.source} holds only {len(train_idx)} "
                             f"training images besides the {len(val_idx)} held out (data.n_val)")
        train_idx = train_idx[: data.n_train]
    return images.subset(train_idx), images.subset(val_idx)


def save_tokenizer(directory: Path, model: torch.nn.Module, info: dict[str, Any], image_size: int) -> None:
    """Write a trained VQ tokenizer (either stage that trains one) as a "vq-tokenizer" checkpoint."""
    info = {**info, "data": {**info.get("data", {}), "image_size": image_size}}
    save_module(directory, model, TOKENIZER_KIND, dataclasses.asdict(model.cfg), info)


def training_images(images: ImageSet, idx: np.ndarray, flip: bool, seed: int, step: int) -> Tensor:
    """A step's training images, each mirrored with probability 1/2 where ``flip`` (seeded by (seed, step))."""
    out = images.floats(idx)
    if flip:
        mirrored = torch.rand(len(idx), generator=_generator(seed, step, 1)) < 0.5
        out = torch.where(mirrored[:, None, None, None], out.flip(-1), out)
    return out


# ----------------------------------------------------------------------------------------------------
# Stage 1: the VQ tokenizer


@dataclass
class TokenizerTask(Task):
    """Train the VQ tokenizer: reconstruction MSE + commitment, EMA codebook (hyperset.vision.vq)."""

    vq: VQConfig
    data: MIMData
    eval_batch: int = 500
    name: str = "mim-tokenizer"
    select_metric: str = "val/psnr"

    def __post_init__(self) -> None:
        _count("objective", "eval_batch", self.eval_batch, 1)
        self.train, self.val = _split(self.data)

    def model_config(self) -> VQConfig:
        return self.vq

    def train_size(self) -> int:
        return len(self.train)

    def build_model(self) -> VQTokenizer:
        return VQTokenizer(self.vq)

    def save(self, directory: Path, model: torch.nn.Module, info: dict[str, Any]) -> None:
        save_tokenizer(directory, model, info, self.data.image_size)

    def describe(self) -> dict[str, Any]:
        return {"stage": "tokenizer", "source": self.train.source, "train_images": len(self.train),
                "val_images": len(self.val), "image_size": self.data.image_size, "flip": self.data.flip,
                "seed": self.data.seed}

    def batch(self, step: int, batch_size: int, seed: int, device: torch.device) -> dict[str, Tensor]:
        return {"images": training_images(self.train, self.batch_indices(step, batch_size, seed), self.data.flip,
                                          seed, step).to(device)}

    def loss(self, model: torch.nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        _, losses, _ = model(batch["images"])
        return losses["total"], {"recon": losses["recon"].detach(), "perplexity": losses["perplexity"].detach()}

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device, autocast: Any) -> dict[str, float]:
        model.eval()
        scores, mses, codes = [], [], []
        for i in range(0, len(self.val), self.eval_batch):
            images = self.val.floats(range(i, min(i + self.eval_batch, len(self.val)))).to(device)
            recon, _, c = model(images)
            scores.append(psnr(recon.float(), images).cpu())
            mses.append((recon.float() - images).pow(2).flatten(1).mean(1).cpu())
            codes.append(c.cpu())
        all_codes = torch.cat(codes)
        return {"val/psnr": float(torch.cat(scores).mean()), "val/mse": float(torch.cat(mses).mean()),
                "val/codebook_usage": model.codebook_usage(all_codes)}


@dataclass
class DecoderTask(Task):
    """Train the tokenizer's decoder on the expected code embeddings of a frozen token model.

    The default decoding of a masked image (``MIMPipeline.reconstruct(decode="expected")``) feeds the decoder
    the mean code vector under the token model's distribution at each masked position: a latent no codebook
    entry is, which the tokenizer's decoder never saw in its own training. Here, for each training image and a
    mask drawn as the token stage draws them (each token masked with p = ``max_mask_ratio`` * U(0, 1) per image),
    the token model (``token_model``, frozen, its own step control and ``iters`` iterations) gives the expected
    latents and the decoder is trained on the pixels' MSE (in [-1, 1], as the tokenizer stage), plus
    ``codes_weight`` times its MSE on the images' own code vectors, so that it still decodes codes (MaskGIT
    sampling, the unmasked tokenizer) as well as before; the evaluation reports both. The encoder and the
    codebook are frozen: every code means what it meant."""

    data: MIMData
    token_model: str = ""
    iters: int = 0  # the token model's iterations (0: its trained number)
    max_mask_ratio: float = 0.6
    codes_weight: float = 1.0  # + this x the decoder's MSE on the images' own codes (the unmasked tokenizer)
    eval_ratio: float = 0.4
    eval_batch: int = 250
    eval_iters: list[int] = field(default_factory=list)  # further depths whose PSNR is reported (not selected on)
    name: str = "mim-decoder"
    select_metric: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if not self.token_model:
            raise ValueError("objective.token_model: the token model whose expected embeddings the decoder is "
                             "trained on (a checkpoint folder) is required")
        _count("objective", "eval_batch", self.eval_batch, 1)
        _count("objective", "iters", self.iters, 0)
        _fraction("objective", "max_mask_ratio", self.max_mask_ratio, 0, 1, True, False)
        _fraction("objective", "eval_ratio", self.eval_ratio, 0, 1, True, False)
        check_eval_iters(self.eval_iters)
        check_nonnegative("objective", "codes_weight", self.codes_weight)
        from hyperset.checkpoint import trained_iterations
        from hyperset.models import load_checkpoint

        self.tokenizer = load_tokenizer(self.data.tokenizer or None, image_size=self.data.image_size)
        if self.tokenizer.kind != TOKENIZER_KIND:
            raise ValueError(f"the decoder stage trains a {TOKENIZER_KIND} tokenizer's decoder, not a "
                             f"{self.tokenizer.kind}'s")
        self.tokens, info = load_checkpoint(self.token_model, task="mim")
        self.tokens.requires_grad_(False)
        check_compatible(self.tokenizer, self.tokens)
        self.iters = self.iters or trained_iterations(self.tokens.cfg, info)
        self.train, self.val = _split(self.data)
        self.select_metric = f"val/psnr@{round(100 * self.eval_ratio)}"

    def model_config(self) -> VQConfig:
        return self.tokenizer.model.cfg

    def train_size(self) -> int:
        return len(self.train)

    def build_model(self) -> VQTokenizer:
        model = copy.deepcopy(self.tokenizer.model)
        model.encoder.requires_grad_(False)
        model.quantize.requires_grad_(False)
        return model

    def save(self, directory: Path, model: torch.nn.Module, info: dict[str, Any]) -> None:
        save_tokenizer(directory, model, info, self.data.image_size)

    def describe(self) -> dict[str, Any]:
        return {"stage": "decoder", "source": self.train.source, "train_images": len(self.train),
                "val_images": len(self.val), "image_size": self.data.image_size, "flip": self.data.flip,
                "tokenizer": self.tokenizer.source if self.data.tokenizer
                else "shipped: hyperset/weights/mim/tokenizer",
                "token_model": str(Path(self.token_model).resolve()), "token_model_iters": self.iters,
                "masking": f"each token masked with p = {self.max_mask_ratio} * U(0, 1) per image",
                "codes_weight": self.codes_weight,
                "trained": "the decoder only (encoder and codebook frozen), on the token model's expected "
                           "code embeddings", "seed": self.data.seed}

    def batch(self, step: int, batch_size: int, seed: int, device: torch.device) -> dict[str, Tensor]:
        images = training_images(self.train, self.batch_indices(step, batch_size, seed), self.data.flip, seed, step)
        g = self.tokenizer.grid
        mask = random_token_mask((len(images), g, g), self.max_mask_ratio, generator=_generator(seed, step, 2))
        return {"images": images.to(device), "mask": mask.to(device)}

    @torch.no_grad()
    def latents(self, model: VQTokenizer, codes: Tensor, mask: Tensor, iters: int | None = None) -> Tensor:
        """The token model's expected code embeddings for images' codes under a token mask (the default
        decoding's latents), with ``model``'s codebook."""
        self.tokens.to(codes.device)
        b = codes.shape[0]
        logits = self.tokens(codes.masked_fill(mask, model.num_codes).reshape(b, -1), iters=iters or self.iters)
        return expected_latents(model.quantize.embedding.weight, codes, mask, logits.float())

    def loss(self, model: torch.nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        target = batch["images"] * 2 - 1
        codes = model.encode(batch["images"])
        mse = F.mse_loss(model.decoder(self.latents(model, codes, batch["mask"])).float(), target)
        logged = {"recon": mse.detach()}
        if not self.codes_weight:
            return mse, logged
        own = model.quantize.embedding(codes).permute(0, 3, 1, 2).detach()
        codes_mse = F.mse_loss(model.decoder(own).float(), target)
        logged["codes_recon"] = codes_mse.detach()
        return mse + self.codes_weight * codes_mse, logged

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device, autocast: Any) -> dict[str, float]:
        """PSNR of the expected decoding of the first ``eval_images`` validation images at ``eval_ratio``
        masking (a seeded mask), at the token model's iterations and at ``eval_iters``; and the decoder on the
        images' own codes (the unmasked tokenizer: what MaskGIT decoding and the app's tokenizer view show)."""
        model.eval()
        n = min(max(self.data.eval_images, 1), len(self.val))
        g = self.tokenizer.grid
        images = self.val.floats(range(n))
        mask = mask_by_ratio((n, g, g), self.eval_ratio, generator=_generator(self.data.seed, 8))
        pct = round(100 * self.eval_ratio)
        batches = [(model.encode(images[i: i + self.eval_batch].to(device)), mask[i: i + self.eval_batch].to(device))
                   for i in range(0, n, self.eval_batch)]

        def scores(iters: int) -> Tensor:
            out = [model.decode_latents(self.latents(model, c, m, iters)).float().cpu() for c, m in batches]
            return psnr(torch.cat(out), images)

        result = {f"val/psnr@{pct}": float(scores(self.iters).mean())}
        for iters in self.eval_iters:
            result[f"val/psnr@{pct}_iters{int(iters)}"] = float(scores(int(iters)).mean())
        plain = torch.cat([model.decode(c).float().cpu() for c, _ in batches])
        result["val/tokenizer_psnr"] = float(psnr(plain, images).mean())
        return result


# ----------------------------------------------------------------------------------------------------
# Stage 2: the token model


def masked_token_loss(logits: Tensor, targets: Tensor, mask: Tensor, label_smoothing: float = 0.1) -> Tensor:
    """Label-smoothed cross-entropy over the masked tokens only (the paper: "Training loss is computed only
    for the masked tokens"). logits (B, N, K), targets (B, N), mask (B, N) bool. Zero when nothing is masked.
    Shapes never depend on the mask, so a training step reads nothing back to the host here."""
    mask = mask.reshape(targets.shape).bool()
    ce = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), label_smoothing=label_smoothing,
                         reduction="none")
    return torch.where(mask.flatten(), ce, 0.0).sum() / mask.sum().clamp_min(1)


def expected_latent_loss(logits: Tensor, targets: Tensor, mask: Tensor, codebook: Tensor) -> Tensor:
    """The error of the expected code embedding (what ``decode="expected"`` reconstructs from) over the masked
    tokens: |softmax(logits) @ codebook - codebook[target]|^2, relative to the codebook's mean squared norm, averaged
    over the masked tokens. logits (B, N, >= K), targets (B, N), mask (B, N) bool, codebook (K, D) (frozen: no
    gradient reaches it). Zero when nothing is masked."""
    book = codebook.detach().float()
    mean = logits[..., : book.shape[0]].float().softmax(-1) @ book
    err = (mean - book[targets]).pow(2).sum(-1) / book.pow(2).sum(-1).mean()
    mask = mask.reshape(targets.shape).bool()
    return torch.where(mask, err, 0.0).sum() / mask.sum().clamp_min(1)


@torch.no_grad()
def encode_all(tokenizer: Tokenizer, images: ImageSet, flip: bool, batch: int, device: torch.device) -> Tensor:
    """Codes (n, N) int16 of every image (then, with ``flip``, of every mirrored image: rows n..2n-1)."""
    out = []
    for mirrored in ([False, True] if flip else [False]):
        for i in range(0, len(images), batch):
            x = images.floats(range(i, min(i + batch, len(images)))).to(device)
            if mirrored:
                x = x.flip(-1)
            out.append(tokenizer.encode(x).flatten(1).to(torch.int16).cpu())
    return torch.cat(out)


@dataclass
class TokensTask(Task):
    """Masked token modeling on frozen tokenizer codes (see the module docstring)."""

    model: ModelConfig
    data: MIMData
    max_mask_ratio: float = 0.4
    label_smoothing: float = 0.1
    eval_ratio: float = 0.4
    decode_steps: int = 24
    temperature: float = 1.0
    randomize_temp: float = 0.0
    schedule: str = "arccos"
    eval_batch: int = 250
    segments: int = 1  # deep supervision: segments x the model's iterations, detached between segments
    eval_iters: list[int] = field(default_factory=list)  # further depths whose PSNR is reported (not selected on)
    decode: str = "maskgit"  # the validation reconstructions: MaskGIT sampling or the expected code embedding
    latent_weight: float = 0.0  # + this x expected_latent_loss (the expected embedding's error) at every segment
    segment_weights: list[float] = field(default_factory=list)  # the segments' losses weighted (default: equally)
    name: str = "mim"
    select_metric: str = field(default="", init=False)

    def __post_init__(self) -> None:
        self._check_objective()
        if not self.data.tokenizer and self.data.image_size != 32:
            raise ValueError(f"image_size {self.data.image_size}: the shipped tokenizer is for 32x32 CIFAR images; "
                             "set [data] tokenizer (--set data.tokenizer=PATH) to a VQGAN checkpoint file "
                             "(e.g. the Taming vqgan_imagenet_f16_1024 last.ckpt) or a trained tokenizer folder")
        self.tokenizer = load_tokenizer(self.data.tokenizer or None, image_size=self.data.image_size)
        check_compatible(self.tokenizer, _ProbeModel(self.model))
        self.train, self.val = _split(self.data)
        pct = round(100 * self.eval_ratio)
        self.select_metric = f"val/psnr@{pct}"
        self._codes: Tensor | None = None
        self._val_codes: Tensor | None = None
        self._device: torch.device | None = None

    def _check_objective(self) -> None:
        """Every ``[objective]`` value, before anything is loaded or trained: a ValueError naming its key."""
        for key in ("decode_steps", "eval_batch"):
            _count("objective", key, getattr(self, key), 1)
        check_segments(self.segments, self.segment_weights)
        _fraction("objective", "max_mask_ratio", self.max_mask_ratio, 0, 1, True, False)
        _fraction("objective", "eval_ratio", self.eval_ratio, 0, 1, True, False)
        _fraction("objective", "label_smoothing", self.label_smoothing, 0, 1, False, True)
        for key in ("temperature", "randomize_temp", "latent_weight"):
            check_nonnegative("objective", key, getattr(self, key))
        check_choice("objective", "schedule", self.schedule, MODES)
        check_choice("objective", "decode", self.decode, DECODINGS)
        check_eval_iters(self.eval_iters)

    @property
    def mask_id(self) -> int:
        return self.tokenizer.num_codes

    def model_config(self) -> ModelConfig:
        return self.model

    def train_size(self) -> int:
        """The (image, mirror image) pairs when flipping, else the images: the rows of the encoded codes."""
        return len(self.train) * (2 if self.data.flip else 1)

    def describe(self) -> dict[str, Any]:
        return {"stage": "tokens", "source": self.train.source, "train_images": len(self.train),
                "val_images": len(self.val), "image_size": self.data.image_size, "flip": self.data.flip,
                "tokenizer": self.tokenizer.source if self.data.tokenizer
                else "shipped: hyperset/weights/mim/tokenizer",
                "tokenizer_kind": self.tokenizer.kind, "codebook_size": self.tokenizer.num_codes,
                "grid": self.tokenizer.grid, "mask_id": self.mask_id,
                "masking": f"each token masked with p = {self.max_mask_ratio} * U(0, 1) per sample",
                "label_smoothing": self.label_smoothing,
                "segments": self.segments, "segment_weights": self.segment_weights or None,
                "latent_weight": self.latent_weight,
                "eval": {"ratio": self.eval_ratio, "decode": self.decode, "steps": self.decode_steps,
                         "temperature": self.temperature, "randomize_temp": self.randomize_temp,
                         "schedule": self.schedule, "images": min(self.data.eval_images, len(self.val))},
                "seed": self.data.seed}

    def _ensure_codes(self, device: torch.device) -> None:
        """Encode the training images (and their mirrors) once, on the training device, the first time."""
        if self._codes is not None and self._device == device:
            return
        self.tokenizer.to(device)
        self._device = device
        if self._codes is None:
            self._codes = encode_all(self.tokenizer, self.train, self.data.flip, self.data.encode_batch, device)
            n_val = min(len(self.val), max(self.data.eval_tokens, self.data.eval_images))
            self._val_codes = encode_all(self.tokenizer, self.val.subset(np.arange(n_val)), False,
                                         self.data.encode_batch, device)

    def code_counts(self) -> Tensor:
        """How often each code occurs in the (encoded) training set, (K,)."""
        if self._codes is None:
            self._ensure_codes(torch.device("cpu"))
        assert self._codes is not None
        return torch.bincount(self._codes.long().flatten(), minlength=self.tokenizer.num_codes)

    def batch(self, step: int, batch_size: int, seed: int, device: torch.device) -> dict[str, Tensor]:
        """Deterministic in (seed, step): seeded epochs over (image, mirror) pairs and a seeded mask."""
        self._ensure_codes(device)
        assert self._codes is not None
        idx = self.batch_indices(step, batch_size, seed)
        targets = self._codes[torch.from_numpy(idx)].long()
        mask = random_token_mask(tuple(targets.shape), self.max_mask_ratio, generator=_generator(seed, step, 2))
        inputs = targets.masked_fill(mask, self.mask_id)
        return {"inputs": inputs.to(device), "targets": targets.to(device), "mask": mask.to(device)}

    def loss_weight(self, batch: dict[str, Tensor]) -> Tensor:
        """Supervised units of a (micro-)batch: its masked tokens (the loss is their mean)."""
        return batch["mask"].sum()

    def _token_loss(self, logits: Tensor, batch: dict[str, Tensor]) -> Tensor:
        loss = masked_token_loss(logits, batch["targets"], batch["mask"], self.label_smoothing)
        if self.latent_weight:
            codebook = self.tokenizer.codebook
            loss = loss + self.latent_weight * expected_latent_loss(logits, batch["targets"], batch["mask"],
                                                                    codebook.to(logits.device))
        return loss

    def loss(self, model: torch.nn.Module, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        if self.segments > 1:  # the loss after each segment of T iterations; the state runs on detached
            every = segment_outputs(model, batch["inputs"], self.model.iters, self.segments)
            loss = segment_mean(torch.stack([self._token_loss(lg, batch) for lg in every]), self.segment_weights)
            logits = every[-1]
        else:
            logits = model(batch["inputs"])
            loss = self._token_loss(logits, batch)
        with torch.no_grad():
            m = batch["mask"]
            acc = ((logits.argmax(-1) == batch["targets"]) & m).sum() / m.sum().clamp_min(1)
        return loss, {"acc": acc, "masked": m.float().mean()}

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device, autocast: Any) -> dict[str, float]:
        model.eval()
        self._ensure_codes(device)
        assert self._val_codes is not None
        pct = round(100 * self.eval_ratio)
        out: dict[str, float] = {}
        codes = self._val_codes[: self.data.eval_tokens].long()
        mask = mask_by_ratio(tuple(codes.shape), self.eval_ratio, generator=_generator(self.data.seed, 7))
        right, total, ce = 0, 0, 0.0
        for i in range(0, len(codes), self.eval_batch):
            c, m = codes[i: i + self.eval_batch].to(device), mask[i: i + self.eval_batch].to(device)
            with autocast():
                logits = model(c.masked_fill(m, self.mask_id)).float()
            right += int(((logits.argmax(-1) == c) & m).sum())
            total += int(m.sum())
            ce += float(F.cross_entropy(logits[m], c[m], reduction="sum"))
        out[f"val/token_acc@{pct}"] = right / max(total, 1)
        out[f"val/token_ce@{pct}"] = ce / max(total, 1)
        out.update(self.reconstruction_scores(model, device, autocast))
        return out

    @torch.no_grad()
    def reconstruction_scores(self, model: torch.nn.Module, device: torch.device, autocast: Any) -> dict[str, float]:
        """PSNR / SSIM of MaskGIT reconstructions of the first ``eval_images`` validation images at
        ``eval_ratio`` masking (seeded mask and sampling), and the tokenizer's own PSNR on them."""
        assert self._val_codes is not None
        n = min(self.data.eval_images, len(self.val))
        if n == 0:
            return {}
        pct = round(100 * self.eval_ratio)
        g = self.tokenizer.grid
        images = self.val.floats(range(n))
        codes = self._val_codes[:n].long().view(n, g, g)
        mask = mask_by_ratio((n, g, g), self.eval_ratio, generator=_generator(self.data.seed, 8))

        def reconstruct(iters: int | None) -> Tensor:
            def logits_fn(cur: Tensor) -> Tensor:
                with autocast():
                    return model(cur, iters=iters).float()

            sampler = _generator(self.data.seed, 9)  # the same draws at every depth
            recon = []
            for i in range(0, n, self.eval_batch):
                c, m = codes[i: i + self.eval_batch].to(device), mask[i: i + self.eval_batch].to(device)
                if self.decode == "expected":
                    logits = logits_fn(c.masked_fill(m, self.mask_id).flatten(1))
                    latents = expected_latents(self.tokenizer.codebook, c, m, logits, self.temperature)
                    recon.append(self.tokenizer.decode_latents(latents).float().cpu())
                    continue
                filled = maskgit_decode(logits_fn, c, m, self.mask_id, steps=self.decode_steps,
                                        temperature=self.temperature, mode=self.schedule,
                                        randomize_temp=self.randomize_temp, generator=sampler)
                recon.append(self.tokenizer.decode(filled).float().cpu())
            return torch.cat(recon)

        recon_t = reconstruct(None)
        ceiling_t = torch.cat([self.tokenizer.decode(codes[i: i + self.eval_batch].to(device)).float().cpu()
                               for i in range(0, n, self.eval_batch)])
        out = {f"val/psnr@{pct}": float(psnr(recon_t, images).mean()),
               f"val/ssim@{pct}": float(ssim(recon_t, images).mean()) if self.data.image_size >= 11 else math.nan,
               "val/tokenizer_psnr": float(psnr(ceiling_t, images).mean())}
        for iters in self.eval_iters:
            out[f"val/psnr@{pct}_iters{int(iters)}"] = float(psnr(reconstruct(int(iters)), images).mean())
        return out


class _ProbeModel:
    """Just enough of a model (``.cfg``) for ``check_compatible`` before the trainer builds the real one."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg


# ----------------------------------------------------------------------------------------------------
# Recipe -> task


def build_mim_task(model_cfg: ModelConfig, recipe: dict[str, Any], data_dir: str
                   ) -> TokenizerTask | TokensTask | DecoderTask:
    """The task of a MIM recipe: ``[objective] stage`` = "tokenizer", "tokens" (default) or "decoder".

    Tables: ``[data]`` -> MIMData; ``[objective]`` -> TokensTask options (stage tokens), DecoderTask options
    (stage decoder) or ``eval_batch``; ``[tokenizer]`` -> VQConfig (stage tokenizer); ``[train] epochs`` (passes over
    the training images) are converted to steps here (``hyperset.training.epochs.epochs_to_steps``).
    """
    objective = dict(recipe.get("objective", {}))
    stage = objective.pop("stage", "tokens")
    check_choice("objective", "stage", stage, STAGES)
    data_table = dict(recipe.get("data", {}))
    check_table(MIMData, data_table, "data")
    task_cls = {"tokenizer": TokenizerTask, "tokens": TokensTask, "decoder": DecoderTask}[stage]
    inputs = ("vq", "model", "data", "name")  # set by the builder, not by the recipe
    check_table(task_cls, objective, "objective",
                [f.name for f in dataclasses.fields(task_cls) if f.init and f.name not in inputs])
    data = MIMData(**{**data_table, "data_dir": data_dir or data_table.get("data_dir", "")})
    task: TokenizerTask | TokensTask | DecoderTask
    if stage == "decoder":
        try:
            task = DecoderTask(data=data, **objective)
        except TypeError as e:
            raise ValueError(f"[objective] table: {e}") from None
    elif stage == "tokenizer":
        check_table(VQConfig, recipe.get("tokenizer", {}), "tokenizer")
        try:
            vq = VQConfig(**recipe.get("tokenizer", {}))
        except TypeError as e:
            raise ValueError(f"[tokenizer] table: {e}") from None
        try:
            task = TokenizerTask(vq=vq, data=data, **objective)
        except TypeError as e:
            raise ValueError(f"[objective] table: {e}") from None
    else:
        if model_cfg.task != "mim":
            raise ValueError(f"preset {recipe.get('preset')!r} is a {model_cfg.task!r} model, not a mim model")
        try:
            task = TokensTask(model=model_cfg, data=data, **objective)
        except TypeError as e:
            raise ValueError(f"[objective] table: {e}") from None
    epochs_to_steps(recipe.setdefault("train", {}), len(task.train))
    return task
