"""Image classification for the shared trainer (paper Sec. 4.2 and App. "Image Classification").

The paper trains a one-layer model for 12 iterations on CIFAR-10/100 (32 px, 8 x 8 patches of 4 px) and
ImageNet-100 (224 px, 16 x 16 patches of 14 px) with Adam, 5 warm-up epochs, cosine decay, label-smoothed
(0.1) cross-entropy on the CLS logits, random crop (pad 4) + horizontal flip on CIFAR and RandomResizedCrop +
flip on ImageNet. Here:

* CIFAR is held in memory as uint8 tensors; a batch is drawn from a seeded permutation of the training images
  and augmented as a whole (``random_crop_flip``), so ``batch(step)`` is a pure function of (seed, step) and a
  resumed run sees exactly the batches it would have seen.
* ImageNet-100 is an ImageFolder tree decoded per item (``ImageSource`` + ``ImageNetTransform``, whose every
  resize is ``resize_crop``), each item with its own generator seeded from (seed, step, position in the batch).
* "val" is held out from the training set (``val_fraction``, drawn with ``seed``). The best checkpoint is
  selected on it at the trained depth; the test split is never looked at during training (the authors'
  code selected on the test set).
* Recipes may count in epochs: ``build_classify_task`` rewrites ``[train] epochs / warmup_epochs /
  eval_every_epochs`` into steps with ``hyperset.training.epochs.epochs_to_steps`` (ceil(epochs * n_train / batch_size),
  the rule of every task). The paper's scheduler steps once per epoch; ours steps per update, which is the same
  curve sampled finer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from hyperset.config import MAX_ITERS, ModelConfig, check_choice, check_table
from hyperset.models import HyperSETModel
from hyperset.vision.data import (
    DATASETS,
    EVAL_MODES,
    IMAGENET100_WNIDS,
    NORMALIZATION,
    WNID_RE,
    ImageNetTransform,
    ImageSource,
    normalize,
    random_crop_flip,
    read_class_list,
    train_val_split,
)

from .epochs import epochs_to_steps
from .task import (
    Task,
    check_depth_range,
    check_eval_iters,
    check_nonnegative,
    check_segments,
    draw_depth,
    energy_rise,
    segment_mean,
    segment_outputs,
)

CIFAR_SIZE = 32
DATA_KEYS = ("dataset", "val_fraction", "seed", "n_train", "n_val", "image_size", "eval_mode", "classes", "workers")
OBJECTIVE_KEYS = ("label_smoothing", "eval_iters", "eval_batch", "segments", "segment_weights", "train_iters",
                  "rise_weight", "select_iters")


# ----------------------------------------------------------------------------------------------------
# Data


@dataclass
class ClassifyData:
    """Where the images come from and how the training set is split (recipe table ``[data]``).

    Args:
        dataset: "cifar10", "cifar100" or "imagenet100".
        data_dir: CIFAR root (holding ``cifar-10-batches-py/`` or ``cifar-100-python/``) or ImageNet-100 root
            (``train/<wnid>/*`` and ``val/<wnid>/*``).
        val_fraction: part of the training set held out for checkpoint selection (must be > 0).
        seed: seed of the train/val split, the training subset and the batch order.
        n_train: train on a seeded subset of this many images (0: all of the training part).
        n_val: evaluate on the first n_val held-out images only (0: all), for quick runs.
        image_size: ImageNet input size (CIFAR is always 32).
        eval_mode: ImageNet evaluation resize, "resize" (the authors') or "resize_center_crop".
        classes: ImageNet class list: WordNet ids or a list file (default: the paper's ImageNet-100 classes).
        workers: threads decoding ImageNet images (0: decode in the training thread).
    """

    dataset: str = "cifar10"
    data_dir: str = ""
    val_fraction: float = 0.1
    seed: int = 0
    n_train: int = 0
    n_val: int = 0
    image_size: int = 224
    eval_mode: str = "resize"
    classes: list[str] | str | None = None
    workers: int = 0

    def __post_init__(self) -> None:
        check_choice("data", "dataset", self.dataset, DATASETS)
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}: a held-out part of "
                             "the training set selects the best checkpoint (the test split is never used for it)")
        check_choice("data", "eval_mode", self.eval_mode, tuple(EVAL_MODES))
        if self.n_train < 0 or self.n_val < 0:
            raise ValueError("data.n_train and data.n_val must be >= 0 (0 means all)")
        if self.classes is not None and not isinstance(self.classes, str):
            check_class_ids(self.classes, "data.classes")

    @property
    def is_cifar(self) -> bool:
        return self.dataset in ("cifar10", "cifar100")

    @property
    def size(self) -> int:
        return CIFAR_SIZE if self.is_cifar else self.image_size


def check_class_ids(classes: Any, where: str) -> None:
    """Raise a ValueError unless ``classes`` is a non-empty list of WordNet ids (the names of class folders: no
    other path may be listed through them)."""
    if not isinstance(classes, (list, tuple)) or not classes:
        found = "an empty list" if isinstance(classes, (list, tuple)) else type(classes).__name__
        raise ValueError(f"{where} must be a list of WordNet ids like n01558993, found {found}")
    for c in classes:
        if not (isinstance(c, str) and WNID_RE.fullmatch(c)):
            shown = repr(c[:40]) if isinstance(c, str) else f"a {type(c).__name__}"
            raise ValueError(f"{where}: {shown} is not a WordNet id like n01558993")


def class_names_for(data: ClassifyData) -> list[str]:
    """The ImageNet class list (sorted WordNet ids, the ImageFolder order)."""
    if data.classes is None:
        return sorted(IMAGENET100_WNIDS)
    if isinstance(data.classes, str):
        return sorted(read_class_list(data.classes))
    return sorted(dict.fromkeys(data.classes))


def _generator(seed: Sequence[int] | None) -> torch.Generator | None:
    """A CPU generator seeded from a sequence of ints (e.g. (seed, step, 1)); None draws from the global RNG."""
    if seed is None:
        return None
    return torch.Generator().manual_seed(int(np.random.default_rng(list(seed)).integers(2**62)))


class ImageSplit:
    """The images of one split for classification: an ``ImageSource`` (CIFAR uint8 (N, 3, 32, 32) in memory, or
    ImageNet files decoded on demand) with normalization and the paper's augmentation.

    ``batch(indices, seed)`` returns normalized float images and labels; with ``augment`` the paper's
    augmentation is applied (CIFAR: pad-4 crop + flip for the whole batch; ImageNet: RandomResizedCrop + flip).
    ``images`` may be an ``ImageSource`` or uint8 arrays; ``labels`` replace the source's labels.
    """

    def __init__(self, data: ClassifyData, augment: bool, images: ImageSource | Tensor,
                 labels: Tensor | None = None) -> None:
        if not isinstance(images, ImageSource):
            images = ImageSource(arrays=images, labels=labels)
        elif labels is not None:
            images = ImageSource(arrays=images.arrays, files=images.files, labels=labels, name=images.name)
        self.data, self.augment, self.images = data, augment, images
        self.labels = images.labels
        self.mean, self.std = NORMALIZATION[data.dataset]
        self.transform = ImageNetTransform(train=augment, size=data.size, eval_mode=data.eval_mode,
                                           mean=self.mean, std=self.std)
        self._pool: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: np.ndarray) -> ImageSplit:
        return ImageSplit(self.data, self.augment, self.images.subset(indices))

    def _decode(self, index: int, seed: Sequence[int] | None) -> Tensor:
        return self.transform(self.images.raw(index), generator=_generator(seed))

    def batch(self, indices: Sequence[int] | np.ndarray, seed: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        """(images (n, 3, S, S) normalized float32, labels (n,)); augmentation drawn from ``seed`` if given."""
        idx = np.asarray(indices, dtype=np.int64)
        labels = self.labels[torch.from_numpy(idx)]
        if self.images.arrays is not None:
            x = self.images.arrays[torch.from_numpy(idx)]
            if self.augment:
                x = random_crop_flip(x, pad=4, generator=_generator(seed))
            return normalize(x.float().div_(255.0), self.mean, self.std), labels
        seeds = [None if seed is None else [*seed, i] for i in range(len(idx))]
        if self.data.workers > 0:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.data.workers)
            items = list(self._pool.map(self._decode, idx.tolist(), seeds))
        else:
            items = [self._decode(int(i), s) for i, s in zip(idx, seeds)]
        return torch.stack(items), labels

    def batches(self, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """The whole split in order, without augmentation randomness (for evaluation)."""
        for start in range(0, len(self), batch_size):
            yield self.batch(range(start, min(start + batch_size, len(self))))


def sample(split: ImageSplit, n: int, seed: int = 0) -> ImageSplit:
    """A seeded random subset of n images (in index order): split files may be sorted by class."""
    if n <= 0 or n >= len(split):
        return split
    return split.subset(np.sort(np.random.default_rng(seed).permutation(len(split))[:n]))


def load_split(data: ClassifyData, split: str) -> ImageSplit:
    """One split ("train", "val" or "test") of ``data``; "val" is the held-out part of the training set."""
    if split not in ("train", "val", "test"):
        raise ValueError(f"unknown split {split!r}; expected train, val or test")
    if not data.data_dir:
        raise ValueError(f"no data folder given (--data DIR) for {data.dataset}")
    root = Path(data.data_dir)
    if not root.is_dir():
        hint = " (hyperset-train --download fetches CIFAR into it)" if data.is_cifar else ""
        raise FileNotFoundError(f"data folder {root} does not exist{hint}")
    augment = split == "train"
    if data.is_cifar:
        full = ImageSplit(data, augment, ImageSource.cifar(data.dataset, root, "test" if split == "test" else "train"))
        if split == "test":
            return full
        train_idx, val_idx = train_val_split(len(full), data.val_fraction, data.seed)
        return full.subset(train_idx if split == "train" else val_idx)
    classes = class_names_for(data)
    if split == "test":
        folder = root / "val"
        if not folder.is_dir():
            raise FileNotFoundError(f"{root} has no val/ folder; the ImageNet test split is root/val/<wnid>/<images>")
        return ImageSplit(data, augment, ImageSource.folder(folder, classes))
    folder = root / "train" if (root / "train").is_dir() else root
    full = ImageSplit(data, augment, ImageSource.folder(folder, classes))
    train_idx, val_idx = train_val_split(len(full), data.val_fraction, data.seed)
    return full.subset(train_idx if split == "train" else val_idx)


def dataset_classes(data: ClassifyData) -> int:
    if data.dataset == "cifar10":
        return 10
    if data.dataset == "cifar100":
        return 100
    return len(class_names_for(data))


# ----------------------------------------------------------------------------------------------------
# Evaluation shared with `hyperset-eval classify`


@torch.no_grad()
def top1(model: HyperSETModel, split: ImageSplit, iters: Sequence[int], device: torch.device, autocast: Any,
         batch_size: int = 500, progress: bool = False) -> tuple[dict[int, float], int]:
    """Top-1 accuracy of ``model`` on ``split`` after each number of iterations in ``iters``, and the number of
    images. A one-layer core runs once to the largest depth and is read out on the way (the state after t
    iterations does not depend on how many follow); with several distinct layers, each iterated in turn, every
    depth is a run of its own. ``progress``: a progress bar over the images (on a terminal)."""
    model.eval()
    depths = sorted({int(i) for i in iters})
    correct = dict.fromkeys(depths, 0)
    total = 0
    bar = tqdm(total=len(split), unit="img", desc="evaluating", disable=None if progress else True, leave=False)
    for images, labels in split.batches(batch_size):
        images = images.to(device)
        with autocast():
            if model.cfg.n_layers == 1:
                x0 = model.stem(images)
                logits = {0: model.readout(x0)} if 0 in correct else {}
                for _, t, x in model.core.iterate(x0, depths[-1]):
                    if t in correct:
                        logits[t] = model.readout(x)
            else:
                logits = {d: model(images, iters=d) for d in depths}
        for d, out in logits.items():
            correct[d] += int((out.float().argmax(-1).cpu() == labels).sum())
        total += len(labels)
        bar.update(len(labels))
    bar.close()
    return {d: c / max(total, 1) for d, c in correct.items()}, total


# ----------------------------------------------------------------------------------------------------
# The task


@dataclass
class ClassifyTask(Task):
    """Classification for ``hyperset.training.trainer.Trainer``: label-smoothed CE on the CLS logits, top-1 on val."""

    model: ModelConfig
    data: ClassifyData
    label_smoothing: float = 0.1
    eval_iters: list[int] = field(default_factory=list)
    eval_batch: int = 500
    # depth-robust training: the loss after each of `segments` segments of T iterations, the state carried on
    # detached between them (1: the paper's loss at T only); weighted equally or by segment_weights
    segments: int = 1
    segment_weights: list[float] = field(default_factory=list)
    # [lo, hi]: the iterations of each segment drawn per step from (seed, step), uniform in lo..hi (empty: T)
    train_iters: list[int] = field(default_factory=list)
    select_iters: int = 0  # the depth at which the best checkpoint is chosen on val (0: the trained depth)
    # > 0: plus rise_weight x how far E_ATTN + E_FF rises from one iteration to the next (training.task.energy_rise)
    rise_weight: float = 0.0
    epochs: float | None = None
    steps_per_epoch: int = 0
    name: str = "classify"

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"objective.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if isinstance(self.eval_batch, bool) or not isinstance(self.eval_batch, int) or self.eval_batch < 1:
            raise ValueError(f"objective.eval_batch must be a whole number >= 1, got {self.eval_batch!r}")
        check_eval_iters(self.eval_iters)
        check_segments(self.segments, self.segment_weights)
        check_depth_range("train_iters", self.train_iters)
        check_nonnegative("objective", "rise_weight", self.rise_weight)
        if self.rise_weight and self.model.layer != "hyperset":
            raise ValueError(f"objective.rise_weight needs an energy: model.layer = {self.model.layer!r} has none")
        if (isinstance(self.select_iters, bool) or not isinstance(self.select_iters, int)
                or not 0 <= self.select_iters <= MAX_ITERS):
            raise ValueError(f"objective.select_iters must be a whole number in [0, {MAX_ITERS}] (0: the trained "
                             f"depth), got {self.select_iters!r}")
        self.train = load_split(self.data, "train")
        if self.data.n_train:
            if self.data.n_train > len(self.train):
                raise ValueError(f"data.n_train = {self.data.n_train} but the training part holds only "
                                 f"{len(self.train)} images")
            keep = np.random.default_rng([self.data.seed, 7]).permutation(len(self.train))[: self.data.n_train]
            self.train = self.train.subset(np.sort(keep))
        self.val = load_split(self.data, "val")
        if self.data.n_val:
            self.val = sample(self.val, self.data.n_val, self.data.seed)
        if len(self.train) == 0 or len(self.val) == 0:
            raise ValueError(f"{self.data.data_dir}: the training part ({len(self.train)} images) and the held-out "
                             f"val part ({len(self.val)} images) must both be non-empty; adjust data.val_fraction")
        self.eval_iters = [int(i) for i in self.eval_iters] or [self.model.iters, 2 * self.model.iters]
        self.select_iters = self.select_iters or self.model.iters
        self.select_metric = f"val/top1@{self.select_iters}"
        for depth in sorted({self.model.iters, self.select_iters}, reverse=True):
            if depth not in self.eval_iters:
                self.eval_iters.insert(0, depth)

    def model_config(self) -> ModelConfig:
        return self.model

    def train_size(self) -> int:
        return len(self.train)

    def describe(self) -> dict[str, Any]:
        d = self.data
        out: dict[str, Any] = {
            "dataset": d.dataset, "data_dir": str(d.data_dir), "val_fraction": d.val_fraction, "seed": d.seed,
            "train_images": len(self.train), "val_images": len(self.val), "n_train": d.n_train, "n_val": d.n_val,
            "image_size": d.size, "normalization": {"mean": list(self.train.mean), "std": list(self.train.std)},
            "augmentation": "random crop (pad 4) + horizontal flip" if d.is_cifar
            else "RandomResizedCrop (0.08-1) + horizontal flip",
            "label_smoothing": self.label_smoothing, "segments": self.segments,
            "segment_weights": self.segment_weights or None, "train_iters": self.train_iters or None,
            "rise_weight": self.rise_weight,
            "selection": f"{self.select_metric} (held out from train)",
            "epochs": self.epochs, "steps_per_epoch": self.steps_per_epoch,
        }
        if not d.is_cifar:
            out["eval_mode"] = d.eval_mode
            out["classes"] = class_names_for(d)
        return out

    def batch(self, step: int, batch_size: int, seed: int, device: torch.device) -> dict[str, Tensor]:
        """Deterministic in (seed, step): epochs are seeded permutations, augmentation is seeded per step."""
        idx = self.batch_indices(step, batch_size, seed)
        images, labels = self.train.batch(idx, seed=[seed, step, 1])
        out = {"images": images.to(device), "labels": labels.to(device)}
        if self.train_iters:  # on the CPU: the loss reads it as a Python int, which must not wait for the device
            out["depth"] = torch.tensor(self.depth_draw(step, seed)).expand(len(labels))
        return out

    def depth_draw(self, step: int, seed: int) -> int:
        """The iterations per segment of step `step`: drawn from `train_iters`, else the trained depth."""
        return draw_depth(np.random.default_rng([seed, step, 2]), self.train_iters, self.model.iters)

    def build_model(self) -> HyperSETModel:
        model = super().build_model()
        # a depth drawn at every step: under torch.compile one graph per update, compiled once for every depth
        model.core.graph_per_update = bool(self.train_iters)
        return model

    def loss(self, model: HyperSETModel, batch: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        labels = batch["labels"]
        iters = int(batch["depth"][0]) if "depth" in batch else self.model.iters
        logged = {}
        if self.segments > 1 or iters != self.model.iters or self.rise_weight:
            every = segment_outputs(model, batch["images"], iters, self.segments, energies=bool(self.rise_weight))
            if self.rise_weight:
                every, energy = every
            losses = torch.stack([F.cross_entropy(lg.float(), labels, label_smoothing=self.label_smoothing)
                                  for lg in every])
            loss, logits = segment_mean(losses, self.segment_weights), every[-1]
            if self.rise_weight:
                rise = energy_rise(energy)
                loss = loss + self.rise_weight * rise
                logged["rise"] = rise.detach()
        else:
            logits = model(batch["images"])
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing)
        with torch.no_grad():
            logged["acc"] = (logits.argmax(-1) == labels).float().mean()
        return loss, logged

    @torch.no_grad()
    def evaluate(self, model: HyperSETModel, device: torch.device, autocast: Any) -> dict[str, float]:
        accuracy, _ = top1(model, self.val, self.eval_iters, device, autocast, self.eval_batch)
        return {f"val/top1@{iters}": accuracy[iters] for iters in self.eval_iters}


# ----------------------------------------------------------------------------------------------------
# Building from a recipe


def fit_model_to_data(model_cfg: ModelConfig, data: ClassifyData, explicit: dict[str, Any]) -> ModelConfig:
    """Set num_classes and img_size from the dataset; error when the recipe or preset cannot fit it."""
    if model_cfg.task != "classify":
        raise ValueError(f"the model preset is for task {model_cfg.task!r}; image classification needs a classify "
                         "preset (e.g. cifar10-small, cifar100-small, imagenet100-small, cifar10-cpu)")
    classes, size = dataset_classes(data), data.size
    for key, want in (("num_classes", classes), ("img_size", size)):
        if key in explicit and explicit[key] != want:
            raise ValueError(f"model.{key} = {explicit[key]} does not fit {data.dataset}, which needs {want}")
    if size % model_cfg.patch_grid:
        raise ValueError(f"{data.dataset} images are {size} px, which patch_grid {model_cfg.patch_grid} does not "
                         f"divide; choose a fitting preset or --set model.patch_grid=N (the paper: 8 for 32 px, "
                         "16 for 224 px)")
    if model_cfg.channels != 3:
        raise ValueError(f"model.channels = {model_cfg.channels}, but {data.dataset} images are RGB (3 channels)")
    return model_cfg.replace(num_classes=classes, img_size=size)


def build_classify_task(model_cfg: ModelConfig, recipe: dict[str, Any], data_dir: str) -> ClassifyTask:
    """The classification task of a recipe. Rewrites ``recipe["train"]`` epochs into steps (in place)."""
    data_table = dict(recipe.get("data", {}))
    objective = dict(recipe.get("objective", {}))
    check_table(ClassifyData, data_table, "data", DATA_KEYS)
    check_table(ClassifyTask, objective, "objective", OBJECTIVE_KEYS)
    data = ClassifyData(data_dir=data_dir, **data_table)
    model_cfg = fit_model_to_data(model_cfg, data, recipe.get("model", {}))
    task = ClassifyTask(model=model_cfg, data=data, **objective)
    task.epochs, task.steps_per_epoch = epochs_to_steps(recipe.setdefault("train", {}), len(task.train))
    return task
