"""Image-classification data for the paper's experiments: CIFAR-10/100 and ImageNet-100.

* CIFAR in its standard python layout (``cifar-10-batches-py/``, ``cifar-100-python/``), read with a
  restricted unpickler (no arbitrary code runs when a batch file is opened), held in memory as uint8 arrays.
* ImageNet-100 as an ImageFolder tree (``root/<wnid>/<image>`` or ``root/{train,val}/<wnid>/<image>``),
  decoded lazily with Pillow, restricted to the 100 classes of CMC's ``imagenet100.txt``.
* The paper's augmentation: pad-4 random crop + horizontal flip on CIFAR (also batched, on any device, seeded
  per batch so that a resumed run replays it), and RandomResizedCrop(224) + flip on ImageNet, with per-dataset
  mean/std normalization.
* One image source (``ImageSource``: CIFAR arrays, ImageFolder trees, lists of files; ``decode_image`` for a
  single image) and one resize-and-crop (``resize_crop``: antialiased bilinear on tensors) for every path that
  resizes an image: classification training and evaluation, MIM training, reconstruction and the app.

``load_classification(name, root, split)`` is the single entry point. For every dataset "val" is a held-out
part of the training set (``train_val_split``): model selection never looks at the test split.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import re
import shutil
import struct
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from ..download import DownloadError, fetch, file_digest

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NORMALIZATION: dict[str, tuple[tuple[float, float, float], tuple[float, float, float]]] = {
    "cifar10": (CIFAR10_MEAN, CIFAR10_STD),
    "cifar100": (CIFAR100_MEAN, CIFAR100_STD),
    "imagenet100": (IMAGENET_MEAN, IMAGENET_STD),
}
DATASETS = ("cifar10", "cifar100", "imagenet100")
SPLITS = ("train", "val", "test")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")

# The 100 ImageNet-1k classes of ImageNet-100, in the order of CMC's imagenet100.txt (Tian et al., 2019),
# which the paper uses. Class indices follow the sorted order of these WordNet ids (ImageFolder convention).
IMAGENET100_WNIDS: tuple[str, ...] = tuple(
    """
    n02869837 n01749939 n02488291 n02107142 n13037406 n02091831 n04517823 n04589890 n03062245 n01773797
    n01735189 n07831146 n07753275 n03085013 n04485082 n02105505 n01983481 n02788148 n03530642 n04435653
    n02086910 n02859443 n13040303 n03594734 n02085620 n02099849 n01558993 n04493381 n02109047 n04111531
    n02877765 n04429376 n02009229 n01978455 n02106550 n01820546 n01692333 n07714571 n02974003 n02114855
    n03785016 n03764736 n03775546 n02087046 n07836838 n04099969 n04592741 n03891251 n02701002 n03379051
    n02259212 n07715103 n03947888 n04026417 n02326432 n03637318 n01980166 n02113799 n02086240 n03903868
    n02483362 n04127249 n02089973 n03017168 n02093428 n02804414 n02396427 n04418357 n02172182 n01729322
    n02113978 n03787032 n02089867 n02119022 n03777754 n04238763 n02231487 n03032252 n02138441 n02104029
    n03837869 n03494278 n04136333 n03794056 n03492542 n02018207 n04067472 n03930630 n03584829 n02123045
    n04229816 n02100583 n03642806 n04336792 n03259280 n02116738 n02108089 n03424325 n01855672 n02090622
    """.split()
)


WNID_RE = re.compile(r"n\d{8}")  # a WordNet id, the name of an ImageNet class folder
MAX_CLASS_LIST_BYTES = 2**20  # a class list file larger than this is refused (ImageNet-1k's 1,000 ids take 10 KB)


class ImageArrays(NamedTuple):
    """Decoded images (N, H, W, 3) uint8, labels (N,) int64 and the class names."""

    images: np.ndarray
    labels: np.ndarray
    class_names: list[str]


# ----------------------------------------------------------------------------------------------------
# CIFAR: restricted unpickling of the standard python batches


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as Python 3 uses it to pickle bytes at protocol <= 2; only latin-1 is accepted."""
    if encoding.lower().replace("_", "-") not in ("latin1", "latin-1", "iso-8859-1"):
        raise pickle.UnpicklingError(f"refusing _codecs.encode with encoding {encoding!r} in a CIFAR file")
    if not isinstance(text, str):
        raise pickle.UnpicklingError("refusing _codecs.encode on a non-string in a CIFAR file")
    return text.encode("latin-1")


def _numpy_reconstruction_globals() -> dict[tuple[str, str], Any]:
    core = getattr(np, "_core", None)
    if core is None:  # numpy < 2
        core = np.core
    table: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): _latin1_encode,
    }
    for package in ("numpy.core", "numpy._core"):  # numpy 1.x and 2.x spell the module differently
        table[(f"{package}.multiarray", "_reconstruct")] = core.multiarray._reconstruct
        table[(f"{package}.multiarray", "scalar")] = core.multiarray.scalar
        table[(f"{package}.numeric", "_frombuffer")] = core.numeric._frombuffer
    return table


class _CifarUnpickler(pickle.Unpickler):
    """Unpickler that resolves no global except numpy's array/scalar reconstruction helpers.

    Allowed: ``numpy.ndarray``, ``numpy.dtype``, ``numpy.{core,_core}.multiarray._reconstruct`` and
    ``.scalar`` (protocol <= 4 arrays and numpy scalars), ``numpy.{core,_core}.numeric._frombuffer``
    (protocol 5 arrays), and ``_codecs.encode`` restricted to latin-1 (how Python 3 pickles bytes at
    protocol 2). Every other global is refused, so opening a CIFAR file never imports a module or calls a
    function chosen by the file.
    """

    _ALLOWED = _numpy_reconstruction_globals()

    def find_class(self, module: str, name: str) -> Any:
        found = self._ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}: CIFAR files hold only dicts, lists, strings, "
                "numbers and numpy arrays"
            )
        return found


class CifarFileError(pickle.UnpicklingError, ValueError):
    """A CIFAR batch file that is truncated or holds something else than plain data (a ValueError, so that
    callers report it like any other bad data file)."""


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _read_pickle_dict(path: Path) -> dict[str, Any]:
    """Read one CIFAR batch/meta file with the restricted unpickler; dict keys become ``str``."""
    if not path.is_file():
        raise FileNotFoundError(f"missing CIFAR file {path}")
    with open(path, "rb") as f:
        try:
            obj = _CifarUnpickler(f, encoding="latin1").load()
        except pickle.UnpicklingError as e:
            raise CifarFileError(f"{path}: {e}") from e
        except (EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
            raise ValueError(f"{path} is not a readable CIFAR pickle ({type(e).__name__}: {e})") from e
        except MemoryError as e:
            raise ValueError(f"{path}: an array in this CIFAR file would not fit in memory ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a dict, found {type(obj).__name__}")
    return {_text(k): v for k, v in obj.items()}


@dataclass(frozen=True)
class _CifarLayout:
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    meta_file: str
    names_key: str
    num_classes: int
    archive: str
    url: str
    md5: str

    def files(self) -> tuple[str, ...]:
        return (*self.train_files, self.test_file, self.meta_file)


_CIFAR = {
    "cifar10": _CifarLayout(
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_file="test_batch",
        meta_file="batches.meta",
        names_key="label_names",
        num_classes=10,
        archive="cifar-10-python.tar.gz",
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
    ),
    "cifar100": _CifarLayout(
        folder="cifar-100-python",
        train_files=("train",),
        test_file="test",
        meta_file="meta",
        names_key="fine_label_names",
        num_classes=100,
        archive="cifar-100-python.tar.gz",
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
    ),
}


def _cifar_layout(name: str) -> _CifarLayout:
    if name not in _CIFAR:
        raise ValueError(f"unknown CIFAR dataset {name!r}; expected one of {sorted(_CIFAR)}")
    return _CIFAR[name]


def cifar_dir(name: str, root: str | os.PathLike) -> Path:
    """The folder of batch files: ``root/<standard folder>``, or ``root`` itself if it is that folder."""
    layout = _cifar_layout(name)
    root = Path(root)
    if root.name == layout.folder and root.is_dir():
        return root
    folder = root / layout.folder
    if not folder.is_dir():
        raise FileNotFoundError(
            f"{name}: no folder {folder}. Expected the standard python layout {layout.folder}/ with files "
            f"{', '.join(layout.files())} (fetch it with hyperset-train --download or download_cifar)"
        )
    missing = [f for f in layout.files() if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{name}: {folder} lacks {', '.join(missing)}; "
            f"the standard layout has {', '.join(layout.files())}"
        )
    return folder


def _integer_labels(path: Path, key: str, value: Any) -> np.ndarray:
    """The labels of a CIFAR batch as int64 (N,): integers only, else a ValueError naming the file."""
    # checked before np.asarray: a pickle can nest one list in another many times over (a few KB on disk), and
    # converting that visits every copy; real batches hold a flat list of ints (or an integer array)
    if not isinstance(value, np.ndarray):
        if not isinstance(value, list):
            raise ValueError(f"{path}: {key!r} must be a list of integer labels, found {type(value).__name__}")
        for v in value:
            if not isinstance(v, (int, np.integer)):
                raise ValueError(f"{path}: {key!r} must be a list of integer labels, found a {type(v).__name__} in it")
    try:
        y = np.asarray(value)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {key!r} is not a list of integer labels ({e})") from None
    if y.size == 0:
        return np.zeros(0, dtype=np.int64)
    if y.dtype.kind not in "iu" or y.ndim != 1:
        # no repr of an object array's items: they may be nested lists as large as above
        shown = "" if y.dtype.kind == "O" else f" ({', '.join(repr(v) for v in y.reshape(-1)[:3].tolist())} ...)"
        raise ValueError(f"{path}: {key!r} must be a list of integer labels, found {y.dtype} {y.shape}{shown}")
    return y.astype(np.int64)


def read_cifar(name: str, root: str | os.PathLike, split: str, label_mode: str = "fine") -> ImageArrays:
    """Read a CIFAR split ("train" or "test") into uint8 images (N, 32, 32, 3) HWC and int64 labels.

    ``label_mode`` chooses CIFAR-100's "fine" (100 classes, default) or "coarse" (20 superclasses) labels.
    """
    layout = _cifar_layout(name)
    if split not in ("train", "test"):
        raise ValueError(f"CIFAR files hold the splits 'train' and 'test', not {split!r}")
    if label_mode not in ("fine", "coarse"):
        raise ValueError(f"label_mode must be 'fine' or 'coarse', not {label_mode!r}")
    folder = cifar_dir(name, root)
    meta = _read_pickle_dict(folder / layout.meta_file)
    names_key, labels_key, num_classes = layout.names_key, "labels", layout.num_classes
    if name == "cifar100":
        labels_key = f"{label_mode}_labels"
        names_key, num_classes = f"{label_mode}_label_names", (100 if label_mode == "fine" else 20)
    if names_key not in meta:
        raise ValueError(f"{folder / layout.meta_file}: no key {names_key!r} (found {sorted(meta)})")
    names = meta[names_key]
    if not isinstance(names, list) or not all(isinstance(n, (str, bytes)) for n in names):  # not str() of nested lists
        raise ValueError(f"{folder / layout.meta_file}: {names_key!r} must be a list of class names (strings)")
    class_names = [_text(n) for n in names]
    if len(class_names) != num_classes:
        raise ValueError(
            f"{folder / layout.meta_file}: {len(class_names)} class names, expected {num_classes}"
        )

    images, labels = [], []
    for fname in layout.train_files if split == "train" else (layout.test_file,):
        path = folder / fname
        batch = _read_pickle_dict(path)
        for key in ("data", labels_key):
            if key not in batch:
                raise ValueError(f"{path}: no key {key!r} (found {sorted(batch)})")
        data = batch["data"]
        if not isinstance(data, np.ndarray):  # real batches hold an array; np.asarray of shared nested lists never ends
            raise ValueError(f"{path}: 'data' must be a uint8 numpy array of shape (N, 3072), found "
                             f"{type(data).__name__}")
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
            raise ValueError(
                f"{path}: 'data' must be uint8 of shape (N, 3072), found {data.dtype} {data.shape}"
            )
        y = _integer_labels(path, labels_key, batch[labels_key])
        if len(y) != len(data):
            raise ValueError(f"{path}: {len(data)} images but {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"{path}: labels outside [0, {num_classes})")
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))  # stored CHW row-major -> HWC
        labels.append(y)
    return ImageArrays(np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels), class_names)


# ----------------------------------------------------------------------------------------------------
# CIFAR download


def _check_tar_member(member: tarfile.TarInfo) -> None:
    name = member.name
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts:
        raise DownloadError(f"unsafe path in archive: {name!r} (absolute or with '..'); nothing extracted")
    if not (member.isfile() or member.isdir()):
        raise DownloadError(f"archive member {name!r} is not a regular file or folder; nothing extracted")


def safe_extract(archive: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Extract a tar archive into ``dest`` after checking all members: no absolute paths, '..' or links."""
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            _check_tar_member(member)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python without extraction filters; members were checked above
            tar.extractall(dest, members=members)


def download_cifar(
    name: str, root: str | os.PathLike, url: str | None = None, md5: str | None = None, timeout: float = 60.0
) -> Path:
    """Fetch, verify (md5) and unpack CIFAR into ``root``; returns the folder with the batch files.

    Nothing is fetched when the folder is already complete, or when the archive already sits in ``root`` with
    the right checksum (the manual route when offline). The download goes to a temporary file that is moved
    into place only after its checksum matched; extraction rejects members with absolute paths or '..'.
    ``url`` replaces the official address (e.g. a mirror); ``md5`` replaces the official checksum.
    """
    layout = _cifar_layout(name)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    folder = root / layout.folder
    if folder.is_dir():
        missing = [f for f in layout.files() if not (folder / f).is_file()]
        if not missing:
            return folder
        raise DownloadError(f"{folder} exists but lacks {', '.join(missing)}; remove it and call again")
    url = url or layout.url
    md5 = (md5 or layout.md5).lower()
    archive = root / layout.archive
    manual = (
        f"To install it by hand, fetch {layout.url} elsewhere and put it at {archive} (md5 {layout.md5}), "
        f"or unpack it so that {folder}/ holds {', '.join(layout.files())}."
    )
    if not (archive.is_file() and file_digest(archive, "md5") == md5):
        try:
            fetch(url, archive, algorithm="md5", expected=md5, timeout=timeout)
        except DownloadError as e:
            raise DownloadError(f"could not download {name} from {url} ({e}). {manual}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise DownloadError(f"could not download {name} from {url} ({e}). {manual}") from e
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".extract-"))
    try:
        try:
            safe_extract(archive, staging)
        except (tarfile.TarError, OSError) as e:
            raise DownloadError(f"could not unpack {archive} ({e}). {manual}") from e
        if not (staging / layout.folder).is_dir():
            raise DownloadError(f"{archive} has no folder {layout.folder}/. {manual}")
        os.replace(staging / layout.folder, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cifar_dir(name, root)


# ----------------------------------------------------------------------------------------------------
# ImageNet-100: class lists and ImageFolder trees


def read_class_list(path: str | os.PathLike) -> list[str]:
    """Read a class list (CMC's ``imagenet100.txt``): one WordNet id a line; blanks, '#' comments skipped.

    The file must be a regular file of at most ``MAX_CLASS_LIST_BYTES``, else a ValueError naming it.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such class list file")
    # a device (/dev/zero) or a FIFO would be read without end; a large file is no class list
    if not path.is_file():
        raise ValueError(f"{path}: not a regular file (a class list is a text file of WordNet ids)")
    try:
        with open(path, "rb") as f:
            raw_bytes = f.read(MAX_CLASS_LIST_BYTES + 1)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the class list ({e.strerror or e})") from None
    if len(raw_bytes) > MAX_CLASS_LIST_BYTES:
        raise ValueError(f"{path}: larger than {MAX_CLASS_LIST_BYTES:,} bytes, too large for a class list "
                         "(CMC's imagenet100.txt is 1 KB)")
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (a class list is a text file of WordNet ids)") from None
    wnids: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not WNID_RE.fullmatch(line):
            raise ValueError(f"{path}:{lineno}: {line!r} is not a WordNet id like n01558993")
        if line in wnids:
            raise ValueError(f"{path}:{lineno}: {line} is listed twice")
        wnids.append(line)
    if not wnids:
        raise ValueError(f"{path} lists no classes")
    return wnids


def _split_dirs(root: Path) -> list[Path]:
    """The class-folder trees under ``root``: ``root/train`` and ``root/val`` when present, else ``root``."""
    if not root.is_dir():
        raise FileNotFoundError(
            f"no folder {root}; expected root/<class>/<images> or root/{{train,val}}/<class>/<images>"
        )
    splits = [root / s for s in ("train", "val") if (root / s).is_dir()]
    return splits or [root]


def filter_classes(
    root: str | os.PathLike, class_list: Sequence[str], link_to: str | os.PathLike | None = None
) -> list[str]:
    """Check that each class of ``class_list`` has a folder in the ImageNet tree ``root``; return them sorted.

    ``root`` is a class tree or holds ``train/`` and ``val/`` class trees (each is checked). A
    ``FileNotFoundError`` names the missing WordNet ids. With ``link_to``, a tree of symlinks to just these
    class folders is made there (same train/val layout), usable by any ImageFolder reader.
    """
    root = Path(root)
    wanted = list(dict.fromkeys(class_list))
    for split in _split_dirs(root):
        present = {p.name for p in split.iterdir() if p.is_dir()}
        missing = [w for w in wanted if w not in present]
        if missing:
            shown = ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
            raise FileNotFoundError(
                f"{len(missing)} of {len(wanted)} classes have no folder in {split}: {shown}"
            )
    if link_to is not None:
        for split in _split_dirs(root):
            target_dir = Path(link_to) / split.relative_to(root)
            target_dir.mkdir(parents=True, exist_ok=True)
            for wnid in wanted:
                link = target_dir / wnid
                if link.is_symlink() and link.resolve() == (split / wnid).resolve():
                    continue
                link.symlink_to((split / wnid).resolve(), target_is_directory=True)
    return sorted(wanted)


def list_image_folder(
    root: str | os.PathLike, classes: Sequence[str] | None = None
) -> tuple[list[tuple[Path, int]], list[str]]:
    """(path, class index) pairs of an ImageFolder tree, and the class names (sorted folder names).

    ``classes`` keeps only those folders (all must exist); indices follow their sorted order. Hidden files and
    folders (names starting with '.', such as macOS' ``._x.png`` AppleDouble files) are not images.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"no image folder {root}; expected {root}/<class>/<image files>")
    if classes is None:
        names = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not names:
            raise FileNotFoundError(f"{root} has no class folders; expected {root}/<class>/<image files>")
    else:
        names = sorted(dict.fromkeys(classes))
        missing = [c for c in names if not (root / c).is_dir()]
        if missing:
            shown = ", ".join(missing[:20]) + (" ..." if len(missing) > 20 else "")
            raise FileNotFoundError(
                f"{len(missing)} of {len(names)} classes have no folder in {root}: {shown}"
            )
    samples: list[tuple[Path, int]] = []
    for index, name in enumerate(names):
        files = sorted(
            p for p in (root / name).rglob("*")
            if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(root / name).parts)
        )
        if not files:
            raise FileNotFoundError(
                f"class folder {root / name} has no images (extensions {', '.join(IMAGE_EXTENSIONS)})"
            )
        samples.extend((p, index) for p in files)
    return samples, names


# ----------------------------------------------------------------------------------------------------
# Augmentation and normalization


def _uniform(low: float, high: float, generator: torch.Generator | None) -> float:
    return float(torch.empty(()).uniform_(low, high, generator=generator))


def _randint(low: int, high: int, generator: torch.Generator | None) -> int:
    """An integer in [low, high] inclusive."""
    return int(torch.randint(low, high + 1, (), generator=generator))


def normalize(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """(x - mean) / std per channel for float images (..., C, H, W) in [0, 1]."""
    m = torch.as_tensor(mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
    return (x - m) / s


def random_crop_flip(
    batch: torch.Tensor, pad: int = 4, generator: torch.Generator | None = None, flip: bool = True
) -> torch.Tensor:
    """Pad-``pad`` zero padding, random crop back to (H, W) and random horizontal flip, per image of a batch.

    ``batch`` is (N, C, H, W) of any dtype (uint8 or float) on any device; the random draws come from
    ``generator`` (a CPU ``torch.Generator``; global RNG when None), so a seed makes the result reproducible.
    """
    if batch.ndim != 4:
        raise ValueError(f"random_crop_flip expects (N, C, H, W), got shape {tuple(batch.shape)}")
    n, c, h, w = batch.shape
    padded = batch.new_zeros((n, c, h + 2 * pad, w + 2 * pad))
    padded[:, :, pad : pad + h, pad : pad + w] = batch
    oy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    ox = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    flipped = torch.rand(n, generator=generator) < 0.5 if flip else torch.zeros(n, dtype=torch.bool)
    cols = torch.arange(w)
    cols = torch.where(flipped[:, None], (w - 1 - cols)[None, :], cols[None, :]) + ox[:, None]  # (N, W)
    rows = oy[:, None] + torch.arange(h)[None, :]  # (N, H)
    idx, rows, cols = torch.arange(n).to(batch.device), rows.to(batch.device), cols.to(batch.device)
    out = padded[idx[:, None, None], :, rows[:, :, None], cols[:, None, :]]  # (N, H, W, C)
    return out.permute(0, 3, 1, 2).contiguous()


# ----------------------------------------------------------------------------------------------------
# Decoding, and the one resize-and-crop of every image path (training, evaluation, reconstruction, the app)


class ImageDecodeError(ValueError):
    """An image file that cannot be decoded (missing, truncated, not an image, too large): "PATH: not a readable
    image (reason)"."""


_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, struct.error, Image.DecompressionBombError)


def _pil_to_rgb_array(img: Image.Image) -> np.ndarray:
    """A PIL image -> uint8 (H, W, 3). 16-bit grayscale (I;16*) is scaled to 8 bits (value / 257, rounded); 32-bit
    integer images ('I') likewise when any value exceeds 255, else taken as they are."""
    if img.mode.startswith("I;16") or img.mode == "I":
        values = np.asarray(img).astype(np.float64)
        if img.mode != "I" or (values.size and values.max() > 255):
            values = values / 257.0
        gray = np.rint(values).clip(0, 255).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    return np.array(img.convert("RGB"), dtype=np.uint8)  # a writable copy


def decode_image(source: str | os.PathLike | Image.Image | np.ndarray) -> torch.Tensor:
    """An image file, a PIL image or an (H, W[, C]) uint8 array -> uint8 RGB tensor (3, H, W).

    A file that cannot be decoded is an ``ImageDecodeError`` (a ValueError) naming it. 16-bit images are scaled
    to 8 bits.
    """
    if isinstance(source, (str, os.PathLike)):
        try:
            with Image.open(source) as img:
                return torch.from_numpy(_pil_to_rgb_array(img)).permute(2, 0, 1)
        except _DECODE_ERRORS as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ImageDecodeError(f"{source}: not a readable image ({reason})") from None
    if isinstance(source, Image.Image):
        source = _pil_to_rgb_array(source)
    arr = np.asarray(source)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.dtype != np.uint8:
        raise ValueError(f"expected an RGB(A) uint8 image (H, W, 3), got {arr.dtype} {arr.shape}")
    return torch.from_numpy(np.ascontiguousarray(arr[..., :3])).permute(2, 0, 1)


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> float tensor (3, H, W) in [0, 1]."""
    return decode_image(img).float().div_(255.0)


Box = tuple[int, int, int, int]  # (left, top, width, height) in pixels


def center_box(height: int, width: int, fraction: float = 1.0) -> Box:
    """The central square whose side is ``fraction`` of the shorter side (at least one pixel)."""
    side = max(1, round(min(height, width) * fraction))
    return (width - side) // 2, (height - side) // 2, side, side


def resize_crop(images: torch.Tensor, size: int, crop: float | str | Box = 1.0) -> torch.Tensor:
    """Cut a region out of images (..., 3, H, W) (uint8, or float in [0, 1]) and resize it to size x size with
    antialiased bilinear interpolation (the filter of PIL's BILINEAR and torchvision's Resize): float in [0, 1].

    ``crop``: a float f in (0, 1]: the central square of side f x the shorter side (1: the largest central
    square, the MIM and app preprocessing; 224/256: ImageNet's Resize(256) + CenterCrop(224)); "full": the whole
    image, squashed to a square (the authors' ImageNet test-time resize); a (left, top, width, height) box
    (RandomResizedCrop, see ``random_resized_box``). A region already of size x size is returned as it is.
    """
    if images.ndim < 3 or images.shape[-3] != 3:
        raise ValueError(f"expected RGB images (..., 3, H, W), got shape {tuple(images.shape)}")
    h, w = images.shape[-2:]
    if crop == "full":
        box: Box = (0, 0, w, h)
    elif isinstance(crop, str):
        raise ValueError(f"crop must be a fraction in (0, 1], 'full' or a (left, top, width, height) box, not {crop!r}")
    elif isinstance(crop, (int, float)):
        if not 0 < crop <= 1:
            raise ValueError(f"crop fraction must be in (0, 1], got {crop}")
        box = center_box(h, w, float(crop))
    else:
        box = tuple(int(v) for v in crop)  # type: ignore[assignment]
    left, top, bw, bh = box
    if bw < 1 or bh < 1 or left < 0 or top < 0 or left + bw > w or top + bh > h:
        raise ValueError(f"crop box {box} does not fit a {w}x{h} image")
    x = images[..., top:top + bh, left:left + bw]
    x = x.float().div(255.0) if x.dtype == torch.uint8 else x.float()
    if (bh, bw) != (size, size):
        lead = x.shape[:-3]
        x = F.interpolate(x.reshape(-1, 3, bh, bw), size=(size, size), mode="bilinear", antialias=True,
                          align_corners=False).reshape(*lead, 3, size, size)
    return x.clamp(0, 1)


def to_uint8(images: torch.Tensor) -> torch.Tensor:
    """Float images in [0, 1] -> uint8 (rounded)."""
    return images.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)


def random_resized_box(
    height: int,
    width: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    generator: torch.Generator | None = None,
) -> Box:
    """The region of RandomResizedCrop: a random area fraction in ``scale`` with aspect ratio in ``ratio``
    (Inception-style sampling as torchvision's: 10 tries, then a central crop with the ratio clamped)."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * _uniform(scale[0], scale[1], generator)
        aspect = math.exp(_uniform(log_lo, log_hi, generator))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = _randint(0, height - h, generator), _randint(0, width - w, generator)
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


EVAL_MODES = {"resize": "full", "resize_center_crop": 224 / 256}  # ImageNet eval_mode -> resize_crop's crop


class ImageNetTransform:
    """An image (PIL, or uint8 (3, H, W)) -> normalized float tensor (3, size, size), the paper's ImageNet recipe.

    train: RandomResizedCrop(size, scale (0.08, 1), ratio (3/4, 4/3)) + horizontal flip.
    eval: ``eval_mode="resize"`` squashes the image to (size, size), as the authors' code does at test time;
    ``eval_mode="resize_center_crop"`` is the common Resize(size * 256/224) + CenterCrop(size). Every resize is
    ``resize_crop``.
    """

    def __init__(
        self,
        train: bool,
        size: int = 224,
        eval_mode: str = "resize",
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
    ) -> None:
        if eval_mode not in EVAL_MODES:
            raise ValueError(f"eval_mode must be 'resize' or 'resize_center_crop', not {eval_mode!r}")
        self.train, self.size, self.eval_mode = train, size, eval_mode
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, img: Image.Image | torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        x = img if isinstance(img, torch.Tensor) else decode_image(img)
        if self.train:
            x = resize_crop(x, self.size, random_resized_box(*x.shape[-2:], generator=generator))
            if _uniform(0.0, 1.0, generator) < 0.5:
                x = x.flip(-1)
        else:
            x = resize_crop(x, self.size, EVAL_MODES[self.eval_mode])
        return normalize(x, self.mean, self.std)


def train_val_split(n: int, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Random disjoint (train, val) index arrays over range(n), each sorted; val has round(n * fraction)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    order = np.random.default_rng(seed).permutation(n)
    n_val = int(round(n * val_fraction))
    return np.sort(order[n_val:]).astype(np.int64), np.sort(order[:n_val]).astype(np.int64)


# ----------------------------------------------------------------------------------------------------
# Datasets


class CIFARDataset(Dataset):
    """In-memory CIFAR split: items are (normalized float tensor (3, 32, 32), label).

    With ``augment`` each item gets the paper's pad-4 random crop + horizontal flip (global torch RNG, which
    DataLoader seeds per worker). For a faster pipeline, take ``tensors()`` and apply ``random_crop_flip`` and
    ``normalize`` to whole batches on the training device.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        class_names: Sequence[str],
        mean: Sequence[float],
        std: Sequence[float],
        augment: bool = False,
        pad: int = 4,
    ) -> None:
        if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] != 3:
            raise ValueError(f"images must be uint8 (N, H, W, 3), got {images.dtype} {images.shape}")
        if len(labels) != len(images):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()  # (N, 3, H, W) uint8
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.int64)
        self.classes = list(class_names)
        self.mean, self.std = tuple(mean), tuple(std)
        self.augment, self.pad = augment, pad

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = self.images[index]
        if self.augment:
            x = random_crop_flip(x[None], self.pad)[0]
        return normalize(x.float() / 255.0, self.mean, self.std), int(self.labels[index])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All images as uint8 (N, 3, H, W) and labels (N,) int64, for batched GPU augmentation."""
        return self.images, self.labels


class ImageFolderDataset(Dataset):
    """Lazily decoded ImageFolder tree: items are (transform(uint8 RGB image (3, H, W)), label).

    Without a transform, items are float tensors (3, H, W) in [0, 1] at the file's own size.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        classes: Sequence[str] | None = None,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.root = Path(root)
        self.samples, self.classes = list_image_folder(self.root, classes)
        self.targets = [label for _, label in self.samples]
        self.transform = transform

    def select(self, indices: Sequence[int] | np.ndarray) -> ImageFolderDataset:
        """A copy holding only the samples at ``indices`` (the folder is not listed again)."""
        subset = copy.copy(self)
        subset.samples = [self.samples[int(i)] for i in indices]
        subset.targets = [label for _, label in subset.samples]
        return subset

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        x = decode_image(path)
        return (self.transform(x) if self.transform is not None else x.float().div_(255.0)), label


class ImageSource:
    """The images of one split, whatever holds them: a CIFAR split in memory (uint8 (N, 3, H, W)), the files of
    an ImageFolder tree or any list of image files (decoded on demand), with labels when known (else -1).

    ``raw(i)`` is image i as uint8 (3, H, W) at its own size; ``floats(indices, size)`` is a batch in [0, 1],
    every image through ``resize_crop`` (largest central square, resized to size x size; images already at that
    size are taken as they are); ``get`` is the same as uint8.
    """

    def __init__(self, arrays: torch.Tensor | None = None, files: Sequence[str | os.PathLike] | None = None,
                 labels: Sequence[int] | np.ndarray | torch.Tensor | None = None, name: str = "") -> None:
        if (arrays is None) == (files is None):
            raise ValueError("an ImageSource holds either arrays or files")
        self.arrays = arrays
        self.files = None if files is None else [Path(f) for f in files]
        n = len(arrays) if arrays is not None else len(self.files or [])
        self.labels = (torch.full((n,), -1, dtype=torch.int64) if labels is None
                       else torch.as_tensor(np.asarray(labels), dtype=torch.int64))
        if len(self.labels) != n:
            raise ValueError(f"{n} images but {len(self.labels)} labels")
        self.name = name

    @classmethod
    def cifar(cls, name: str, root: str | os.PathLike, split: str) -> ImageSource:
        """A CIFAR split ("train" or "test") read with the restricted unpickler, held as uint8 (N, 3, 32, 32)."""
        arrays = read_cifar(name, root, split)
        images = torch.from_numpy(arrays.images).permute(0, 3, 1, 2).contiguous()
        return cls(arrays=images, labels=arrays.labels, name=f"{name} {split} ({root})")

    @classmethod
    def folder(cls, root: str | os.PathLike, classes: Sequence[str] | None = None) -> ImageSource:
        """The images of an ImageFolder tree ``root/<class>/<image>``, labelled by sorted class folder."""
        samples, _ = list_image_folder(root, classes)
        return cls(files=[p for p, _ in samples], labels=[c for _, c in samples], name=f"image folder {root}")

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, indices: Sequence[int] | np.ndarray) -> ImageSource:
        idx = np.asarray(indices, dtype=np.int64)
        labels = self.labels[torch.from_numpy(idx)]
        if self.arrays is not None:
            return ImageSource(arrays=self.arrays[torch.from_numpy(idx)], labels=labels, name=self.name)
        assert self.files is not None
        return ImageSource(files=[self.files[i] for i in idx], labels=labels, name=self.name)

    def raw(self, index: int) -> torch.Tensor:
        """Image ``index`` as uint8 (3, H, W), at its own size."""
        if self.arrays is not None:
            return self.arrays[index]
        assert self.files is not None
        return decode_image(self.files[index])

    def floats(self, indices: Sequence[int] | np.ndarray | range, size: int) -> torch.Tensor:
        """float (n, 3, size, size) in [0, 1] (``resize_crop``: central square, antialiased bilinear)."""
        idx = [int(i) for i in indices]
        if self.arrays is not None and self.arrays.shape[-2:] == (size, size):
            return self.arrays[torch.as_tensor(idx, dtype=torch.int64)].float().div_(255.0)
        return torch.stack([resize_crop(self.raw(i), size) for i in idx]) if idx else torch.zeros(0, 3, size, size)

    def get(self, indices: Sequence[int] | np.ndarray | range, size: int) -> torch.Tensor:
        """uint8 (n, 3, size, size): ``floats`` rounded (exact for images already at that size)."""
        idx = [int(i) for i in indices]
        if self.arrays is not None and self.arrays.shape[-2:] == (size, size):
            return self.arrays[torch.as_tensor(idx, dtype=torch.int64)]
        return to_uint8(self.floats(idx, size))


def _imagenet_dirs(root: Path) -> tuple[Path, Path | None]:
    """(train tree, test tree or None): ``root/train`` + ``root/val`` if present, else ``root`` alone."""
    if (root / "train").is_dir():
        return root / "train", (root / "val") if (root / "val").is_dir() else None
    if not root.is_dir():
        raise FileNotFoundError(
            f"no folder {root}; expected root/{{train,val}}/<wnid>/<images> or root/<wnid>/<images>"
        )
    return root, None


def load_classification(
    name: str,
    root: str | os.PathLike,
    split: str,
    *,
    val_fraction: float = 0.1,
    seed: int = 0,
    augment: bool | None = None,
    image_size: int = 224,
    eval_mode: str = "resize",
    class_list: Sequence[str] | str | os.PathLike | None = None,
) -> tuple[Dataset, list[str]]:
    """Dataset and class names for ``name`` in {"cifar10", "cifar100", "imagenet100"} and a split.

    "train" is the training set minus the held-out "val" part (``val_fraction`` of it, drawn with ``seed``);
    ``val_fraction=0`` trains on the full training set, as the paper does. "test" is CIFAR's test batch, or
    ImageNet's validation folder (``root/val``), which the paper reports as test. ``augment`` defaults to True
    for "train" only. ImageNet-100 options: ``image_size``, ``eval_mode`` (see ``ImageNetTransform``) and
    ``class_list`` (WordNet ids or a list file; default ``IMAGENET100_WNIDS``).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {', '.join(DATASETS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")
    if split == "val" and val_fraction <= 0:
        raise ValueError("split 'val' needs val_fraction > 0 (it is held out from the training set)")
    augment = (split == "train") if augment is None else augment
    mean, std = NORMALIZATION[name]
    if name in _CIFAR:
        arrays = read_cifar(name, root, "test" if split == "test" else "train")
        images, labels = arrays.images, arrays.labels
        if split != "test":
            train_idx, val_idx = train_val_split(len(labels), val_fraction, seed)
            keep = train_idx if split == "train" else val_idx
            images, labels = images[keep], labels[keep]
        dataset = CIFARDataset(images, labels, arrays.class_names, mean, std, augment=augment)
        return dataset, arrays.class_names

    if class_list is None:
        classes: Sequence[str] = IMAGENET100_WNIDS
    elif isinstance(class_list, (str, os.PathLike)):
        classes = read_class_list(class_list)
    else:
        classes = list(class_list)
    train_dir, test_dir = _imagenet_dirs(Path(root))
    transform = ImageNetTransform(train=augment, size=image_size, eval_mode=eval_mode, mean=mean, std=std)
    if split == "test":
        if test_dir is None:
            raise FileNotFoundError(
                f"{root} has no val/ folder; the ImageNet test split reads root/val/<wnid>/<images>"
            )
        dataset = ImageFolderDataset(test_dir, classes, transform)
    else:
        full = ImageFolderDataset(train_dir, classes, transform)
        train_idx, val_idx = train_val_split(len(full), val_fraction, seed)
        dataset = full.select(train_idx if split == "train" else val_idx)
    return dataset, dataset.classes
