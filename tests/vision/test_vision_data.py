"""Specification of hyperset.vision.data on tiny datasets built by the tests (no network, no real data)."""

from __future__ import annotations

import collections
import hashlib
import io
import os
import pickle
import pickletools
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hyperset.vision import data as vd


def _cifar_images(n: int, seed: int) -> np.ndarray:
    """(n, 3072) uint8 rows in CIFAR's storage order (CHW, row-major)."""
    return np.random.default_rng(seed).integers(0, 256, size=(n, 3072), dtype=np.uint8)


class _Python2Pickler(pickle._Pickler):
    """Writes bytes and str as Python 2 ``str`` (SHORT_BINSTRING / BINSTRING), as in the official files."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj: bytes | str) -> None:
        raw = obj.encode("latin-1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def _dump(path: Path, obj: dict, protocol: int | str = 2) -> None:
    if protocol == "py2":
        buf = io.BytesIO()
        _Python2Pickler(buf, protocol=2).dump(obj)
        # numpy 1.x module path, as in the official files
        path.write_bytes(buf.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n"))
        return
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def write_cifar10(root: Path, per_batch: int = 3, protocol: int | str = 2) -> tuple[np.ndarray, np.ndarray]:
    """Standard cifar-10-batches-py/ layout, ``per_batch`` images per file; returns the train rows/labels."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rows, labels = [], []
    for b in range(1, 6):
        x = _cifar_images(per_batch, b)
        y = [(b + i) % 10 for i in range(per_batch)]
        _dump(folder / f"data_batch_{b}", {b"batch_label": b"train", b"data": x, b"labels": y}, protocol)
        rows.append(x)
        labels += y
    _dump(folder / "test_batch", {b"data": _cifar_images(2, 99), b"labels": [7, 1]}, protocol)
    names = [n.encode() for n in ("airplane automobile bird cat deer dog frog horse ship truck").split()]
    _dump(folder / "batches.meta", {b"label_names": names, b"num_cases_per_batch": per_batch}, protocol)
    return np.concatenate(rows), np.array(labels)


def write_cifar100(root: Path) -> None:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    _dump(folder / "train", {b"data": _cifar_images(4, 1), b"fine_labels": [0, 99, 5, 6],
                             b"coarse_labels": [0, 19, 1, 2]})
    _dump(folder / "test", {b"data": _cifar_images(2, 2), b"fine_labels": [3, 4], b"coarse_labels": [5, 6]})
    _dump(folder / "meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
                            b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})


# ----------------------------------------------------------------------------------------------------
# CIFAR reading


def test_read_cifar10_gives_hwc_uint8_images_and_int64_labels(tmp_path: Path) -> None:
    rows, labels = write_cifar10(tmp_path)
    train = vd.read_cifar("cifar10", tmp_path, "train")
    assert train.images.shape == (15, 32, 32, 3) and train.images.dtype == np.uint8
    assert train.labels.dtype == np.int64 and train.labels.tolist() == labels.tolist()
    # CIFAR stores the red plane, then green, then blue: pixel (r, c) of channel k is row[k*1024 + r*32 + c].
    assert train.images[4, 2, 7, 1] == rows[4, 1 * 1024 + 2 * 32 + 7]
    assert train.class_names[0] == "airplane" and len(train.class_names) == 10
    test = vd.read_cifar("cifar10", tmp_path / "cifar-10-batches-py", "test")  # the folder itself works too
    assert test.images.shape == (2, 32, 32, 3) and test.labels.tolist() == [7, 1]


@pytest.mark.parametrize("protocol", ["py2", 2, 4, 5])
def test_cifar_reader_reads_python2_files_and_all_pickle_protocols(tmp_path: Path, protocol: object) -> None:
    rows, labels = write_cifar10(tmp_path, per_batch=2, protocol=protocol)
    if protocol == "py2":
        raw = (tmp_path / "cifar-10-batches-py" / "data_batch_1").read_bytes()
        opcodes = {op.name for op, _, _ in pickletools.genops(raw)}
        assert b"numpy.core.multiarray\n_reconstruct" in raw and not any("UNICODE" in o for o in opcodes)
    train = vd.read_cifar("cifar10", tmp_path, "train")
    assert train.images.shape == (10, 32, 32, 3) and train.labels.tolist() == labels.tolist()
    assert train.images[3, 31, 0, 2] == rows[3, 2 * 1024 + 31 * 32] and train.class_names[-1] == "truck"


def test_cifar100_reads_fine_labels_by_default_and_coarse_on_request(tmp_path: Path) -> None:
    write_cifar100(tmp_path)
    fine = vd.read_cifar("cifar100", tmp_path, "train")
    assert fine.labels.tolist() == [0, 99, 5, 6] and len(fine.class_names) == 100
    coarse = vd.read_cifar("cifar100", tmp_path, "test", label_mode="coarse")
    assert coarse.labels.tolist() == [5, 6] and coarse.class_names[5] == "coarse5"
    test, names = vd.load_classification("cifar100", tmp_path, "test")
    x, y = test[1]
    raw = torch.from_numpy(vd.read_cifar("cifar100", tmp_path, "test").images[1]).permute(2, 0, 1) / 255
    assert len(names) == 100 and y == 4
    assert torch.allclose(x, vd.normalize(raw, *vd.NORMALIZATION["cifar100"]))


class _CallsGetcwd:
    def __reduce__(self):
        return (os.getcwd, ())


@pytest.mark.parametrize("payload", [_CallsGetcwd(), collections.OrderedDict(a=1)])
def test_cifar_unpickler_refuses_any_global_but_numpy_reconstruction(tmp_path: Path, payload: object) -> None:
    write_cifar10(tmp_path, per_batch=1)
    _dump(tmp_path / "cifar-10-batches-py" / "data_batch_3", {b"data": payload, b"labels": [0]})
    with pytest.raises(pickle.UnpicklingError, match=r"data_batch_3.*refusing to load global"):
        vd.read_cifar("cifar10", tmp_path, "train")


def test_refused_or_truncated_cifar_files_are_value_errors(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=1)
    _dump(tmp_path / "cifar-10-batches-py" / "data_batch_2", {b"data": _CallsGetcwd(), b"labels": [0]})
    with pytest.raises(ValueError, match=r"data_batch_2.*refusing to load global"):
        vd.read_cifar("cifar10", tmp_path, "train")
    path = tmp_path / "cifar-10-batches-py" / "test_batch"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="test_batch"):
        vd.read_cifar("cifar10", tmp_path, "test")


def test_missing_cifar_file_is_named_with_the_expected_layout(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=1)
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks data_batch_4.*test_batch, batches.meta"):
        vd.read_cifar("cifar10", tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="cifar-100-python"):
        vd.read_cifar("cifar100", tmp_path, "train")


def test_wrongly_shaped_cifar_data_is_rejected(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=1)
    bad = np.zeros((1, 1000), dtype=np.uint8)
    _dump(tmp_path / "cifar-10-batches-py" / "data_batch_2", {b"data": bad, b"labels": [0]})
    with pytest.raises(ValueError, match=r"data_batch_2.*\(N, 3072\)"):
        vd.read_cifar("cifar10", tmp_path, "train")


# ----------------------------------------------------------------------------------------------------
# Download


def _tarball(src_root: Path, out: Path, extra: tuple[str, bytes] | None = None) -> str:
    with tarfile.open(out, "w:gz") as tar:
        if src_root is not None:
            tar.add(src_root / "cifar-10-batches-py", arcname="cifar-10-batches-py")
        if extra is not None:
            info = tarfile.TarInfo(extra[0])
            info.size = len(extra[1])
            tar.addfile(info, io.BytesIO(extra[1]))
    return hashlib.md5(out.read_bytes()).hexdigest()


def test_download_cifar_fetches_verifies_and_unpacks_a_file_url(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "src", per_batch=2)
    archive = tmp_path / "mirror.tar.gz"
    md5 = _tarball(tmp_path / "src", archive)
    folder = vd.download_cifar("cifar10", tmp_path / "data", url=archive.as_uri(), md5=md5)
    assert folder == tmp_path / "data" / "cifar-10-batches-py"
    assert vd.read_cifar("cifar10", tmp_path / "data", "train").images.shape == (10, 32, 32, 3)
    left = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert left == ["cifar-10-batches-py", "cifar-10-python.tar.gz"]
    # A second call finds the folder complete and fetches nothing (the URL no longer exists).
    assert vd.download_cifar("cifar10", tmp_path / "data", url=(tmp_path / "gone").as_uri()) == folder


def test_download_cifar_offline_raises_download_error_saying_where_to_put_the_archive(tmp_path: Path) -> None:
    with pytest.raises(vd.DownloadError, match=r"could not download cifar10.*cifar-10-python\.tar\.gz"):
        vd.download_cifar("cifar10", tmp_path, url=(tmp_path / "nowhere.tar.gz").as_uri())
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


def test_download_cifar_rejects_a_checksum_mismatch_and_keeps_nothing(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "src", per_batch=1)
    archive = tmp_path / "mirror.tar.gz"
    _tarball(tmp_path / "src", archive)
    with pytest.raises(vd.DownloadError, match="checksum mismatch"):
        vd.download_cifar("cifar100", tmp_path / "data", url=archive.as_uri())  # official md5 expected
    assert list((tmp_path / "data").iterdir()) == []


def test_download_cifar_uses_an_archive_placed_by_hand(tmp_path: Path) -> None:
    write_cifar10(tmp_path / "src", per_batch=1)
    (tmp_path / "data").mkdir()
    md5 = _tarball(tmp_path / "src", tmp_path / "data" / "cifar-10-python.tar.gz")
    folder = vd.download_cifar("cifar10", tmp_path / "data", url=(tmp_path / "gone").as_uri(), md5=md5)
    assert (folder / "batches.meta").is_file()


@pytest.mark.parametrize("name", ["../escape.txt", "/tmp/absolute.txt", "cifar-10-batches-py/../../up.txt"])
def test_unsafe_archive_members_are_refused_before_anything_is_extracted(tmp_path: Path, name: str) -> None:
    write_cifar10(tmp_path / "src", per_batch=1)
    archive = tmp_path / "evil.tar.gz"
    md5 = _tarball(tmp_path / "src", archive, extra=(name, b"x"))
    with pytest.raises(vd.DownloadError, match="unsafe path"):
        vd.download_cifar("cifar10", tmp_path / "data", url=archive.as_uri(), md5=md5)
    assert not (tmp_path / "data" / "cifar-10-batches-py").exists()
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "up.txt").exists()


# ----------------------------------------------------------------------------------------------------
# Augmentation and splits


def test_random_crop_flip_is_a_padded_shifted_possibly_mirrored_crop() -> None:
    x = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    out = vd.random_crop_flip(x, pad=2, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.uint8
    padded = torch.zeros(6, 3, 12, 12, dtype=torch.uint8)
    padded[:, :, 2:10, 2:10] = x
    for i in range(6):
        candidates = [padded[i, :, dy:dy + 8, dx:dx + 8] for dy in range(5) for dx in range(5)]
        candidates += [c.flip(-1) for c in candidates]
        assert any(torch.equal(out[i], c) for c in candidates)


def test_random_crop_flip_is_reproducible_under_a_seed_and_varies_across_seeds() -> None:
    x = torch.rand(16, 3, 32, 32)
    a = vd.random_crop_flip(x, 4, torch.Generator().manual_seed(1))
    b = vd.random_crop_flip(x, 4, torch.Generator().manual_seed(1))
    c = vd.random_crop_flip(x, 4, torch.Generator().manual_seed(2))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(vd.random_crop_flip(x, 0, flip=False), x)


def test_train_val_split_is_disjoint_complete_and_seeded() -> None:
    train, val = vd.train_val_split(100, 0.2, seed=3)
    assert len(val) == 20 and len(train) == 80
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(100))
    again = vd.train_val_split(100, 0.2, seed=3)
    assert np.array_equal(val, again[1]) and not np.array_equal(val, vd.train_val_split(100, 0.2, seed=4)[1])
    assert len(vd.train_val_split(10, 0.0)[1]) == 0
    with pytest.raises(ValueError):
        vd.train_val_split(10, 1.0)


def test_random_resized_box_falls_back_to_a_central_crop_with_clamped_ratio() -> None:
    # No 3/4..4/3 crop of the full area fits a 100x10 image: central 13x10 crop (ratio 4/3).
    box = vd.random_resized_box(10, 100, scale=(1.0, 1.0), generator=torch.Generator().manual_seed(0))
    assert box == (43, 0, 13, 10)
    img = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 10, 100), dtype=np.uint8))
    out = vd.resize_crop(img, 16, box)
    expected = vd.resize_crop(img[:, :, 43:56], 16, "full")
    assert out.shape == (3, 16, 16) and torch.equal(out, expected)
    left, top, w, h = vd.random_resized_box(20, 30, generator=torch.Generator().manual_seed(1))
    assert 0 <= left and left + w <= 30 and 0 <= top and top + h <= 20


def test_resize_crop_is_the_filter_of_pil_bilinear() -> None:
    """One resize for every image path: antialiased bilinear, within a grey level of PIL's BILINEAR on the crop."""
    arr = np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    img = Image.fromarray(arr)
    ours = vd.to_uint8(vd.resize_crop(vd.decode_image(img), 16, (5, 3, 30, 30)))
    crop = img.crop((5, 3, 35, 33)).resize((16, 16), Image.BILINEAR)
    pil = torch.from_numpy(np.array(crop)).permute(2, 0, 1)
    assert (ours.int() - pil.int()).abs().max() <= 1


def test_resize_crop_regions() -> None:
    x = torch.rand(2, 3, 30, 20)
    assert vd.center_box(30, 20) == (0, 5, 20, 20) and vd.center_box(256, 300, 224 / 256) == (38, 16, 224, 224)
    assert torch.equal(vd.resize_crop(x, 20), x[..., 5:25, :])  # central square, already at size: as it is
    assert vd.resize_crop(x, 8, "full").shape == (2, 3, 8, 8)  # the authors' test-time squash
    assert vd.resize_crop(x[0], 8, 0.5).shape == (3, 8, 8)
    assert torch.equal(vd.resize_crop((x * 255).round().to(torch.uint8), 20), (x[..., 5:25, :] * 255).round() / 255)
    with pytest.raises(ValueError, match="does not fit"):
        vd.resize_crop(x, 8, (10, 0, 20, 20))
    with pytest.raises(ValueError, match="crop"):
        vd.resize_crop(x, 8, "middle")


def test_one_image_source_for_arrays_folders_and_files(tmp_path: Path) -> None:
    _save_image(tmp_path / "a" / "wide.png", (40, 20))
    _save_image(tmp_path / "b" / "small.png", (8, 8))
    folder = vd.ImageSource.folder(tmp_path)
    assert len(folder) == 2 and folder.labels.tolist() == [0, 1] and folder.raw(0).shape == (3, 20, 40)
    wide = vd.decode_image(tmp_path / "a" / "wide.png")
    assert torch.equal(folder.floats([0], 8)[0], vd.resize_crop(wide, 8))
    assert torch.equal(folder.get([1], 8)[0], vd.decode_image(tmp_path / "b" / "small.png"))
    files = vd.ImageSource(files=[tmp_path / "b" / "small.png"])
    assert files.labels.tolist() == [-1] and files.subset([0]).get([0], 4).shape == (1, 3, 4, 4)
    arrays = vd.ImageSource(arrays=torch.zeros(3, 3, 8, 8, dtype=torch.uint8), labels=[1, 2, 3])
    assert arrays.subset(np.array([2, 0])).labels.tolist() == [3, 1] and arrays.get([0, 1], 8).dtype == torch.uint8


# ----------------------------------------------------------------------------------------------------
# Datasets and the entry point


def test_cifar_items_are_normalized_chw_tensors_and_val_is_held_out_of_train(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=4)
    train, names = vd.load_classification("cifar10", tmp_path, "train", val_fraction=0.25, augment=False)
    val, _ = vd.load_classification("cifar10", tmp_path, "val", val_fraction=0.25)
    test, _ = vd.load_classification("cifar10", tmp_path, "test")
    assert (len(train), len(val), len(test)) == (15, 5, 2) and names[9] == "truck"
    x, y = test[0]
    raw = vd.read_cifar("cifar10", tmp_path, "test").images[0]
    mean, std = torch.tensor(vd.CIFAR10_MEAN)[:, None, None], torch.tensor(vd.CIFAR10_STD)[:, None, None]
    expected = (torch.from_numpy(raw).permute(2, 0, 1).float() / 255 - mean) / std
    assert x.shape == (3, 32, 32) and y == 7 and torch.allclose(x, expected, atol=1e-6)
    train_rows = {t[0].numpy().tobytes() for t in (train[i] for i in range(len(train)))}
    assert not any(val[i][0].numpy().tobytes() in train_rows for i in range(len(val)))
    images, labels = train.tensors()
    assert images.shape == (15, 3, 32, 32) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    with pytest.raises(ValueError, match="val_fraction"):
        vd.load_classification("cifar10", tmp_path, "val", val_fraction=0.0)


def test_cifar_train_items_are_augmented(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=1)
    train, _ = vd.load_classification("cifar10", tmp_path, "train", val_fraction=0.0)
    torch.manual_seed(0)
    views = [train[0][0] for _ in range(8)]
    assert any(not torch.equal(views[0], v) for v in views[1:])


def _save_image(path: Path, size: tuple[int, int], mode: str = "RGB", seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    Image.fromarray(arr.squeeze(-1) if channels == 1 else arr, mode).save(path)


def _imagenet_tree(root: Path) -> list[str]:
    wnids = ["n01000002", "n01000001", "n01000003"]
    for split, count in (("train", 4), ("val", 2)):
        for k, wnid in enumerate(wnids):
            for i in range(count):
                ext = (".JPEG", ".png", ".bmp", ".webp")[i % 4]
                _save_image(root / split / wnid / f"img{i}{ext}", (40 + 3 * i, 30), seed=10 * k + i)
    (root / "train" / wnids[0] / "notes.txt").write_text("not an image")
    _save_image(root / "train" / "n09999999" / "extra.png", (8, 8))  # a class outside the list
    return wnids


def test_image_folder_sorts_classes_converts_to_rgb_and_ignores_other_files(tmp_path: Path) -> None:
    _save_image(tmp_path / "b" / "gray.png", (12, 10), "L")
    _save_image(tmp_path / "a" / "alpha.png", (9, 9), "RGBA")
    _save_image(tmp_path / "a" / "photo.jpg", (9, 9))
    (tmp_path / "a" / "readme.md").write_text("x")
    ds = vd.ImageFolderDataset(tmp_path)
    assert ds.classes == ["a", "b"] and ds.targets == [0, 0, 1] and len(ds) == 3
    x, y = ds[2]
    assert x.shape == (3, 10, 12) and y == 1 and x.dtype == torch.float32
    assert torch.equal(x[0], x[1]) and torch.equal(x[1], x[2])  # gray -> RGB repeats the plane


def test_image_folder_errors_name_the_empty_or_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no image folder"):
        vd.ImageFolderDataset(tmp_path / "missing")
    (tmp_path / "cls" / "sub").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"cls has no images"):
        vd.ImageFolderDataset(tmp_path)


def test_read_class_list_parses_wnids_and_rejects_bad_lines(tmp_path: Path) -> None:
    good = tmp_path / "imagenet100.txt"
    good.write_text("n01558993\n\n# comment\nn02869837  \n")
    assert vd.read_class_list(good) == ["n01558993", "n02869837"]
    bad = tmp_path / "bad.txt"
    bad.write_text("n01558993\ncat\n")
    with pytest.raises(ValueError, match=r"bad.txt:2"):
        vd.read_class_list(bad)
    assert len(vd.IMAGENET100_WNIDS) == 100 and len(set(vd.IMAGENET100_WNIDS)) == 100


def test_filter_classes_names_missing_wnids_and_can_link_a_subset_tree(tmp_path: Path) -> None:
    wnids = _imagenet_tree(tmp_path / "in")
    assert vd.filter_classes(tmp_path / "in", wnids, link_to=tmp_path / "in3") == sorted(wnids)
    linked = vd.ImageFolderDataset(tmp_path / "in3" / "train")
    assert linked.classes == sorted(wnids) and len(linked) == 12
    with pytest.raises(FileNotFoundError, match=r"1 of 4 classes.*n01234567"):
        vd.filter_classes(tmp_path / "in", [*wnids, "n01234567"])


def test_load_imagenet100_splits_and_transforms(tmp_path: Path) -> None:
    wnids = _imagenet_tree(tmp_path)
    common = dict(class_list=wnids, image_size=24, val_fraction=0.25)
    train, names = vd.load_classification("imagenet100", tmp_path, "train", **common)
    val, _ = vd.load_classification("imagenet100", tmp_path, "val", **common)
    test, _ = vd.load_classification("imagenet100", tmp_path, "test", eval_mode="resize_center_crop",
                                     **common)
    assert names == sorted(wnids) and (len(train), len(val), len(test)) == (9, 3, 6)
    assert {p for p, _ in train.samples}.isdisjoint(p for p, _ in val.samples)
    for ds in (train, val, test):
        x, y = ds[0]
        assert x.shape == (3, 24, 24) and 0 <= y < 3
    listed = tmp_path / "list.txt"
    listed.write_text("\n".join(wnids[:2]))
    sub, sub_names = vd.load_classification("imagenet100", tmp_path, "test", class_list=listed)
    assert sub_names == sorted(wnids[:2]) and len(sub) == 4
    with pytest.raises(FileNotFoundError, match=r"100 of 100 classes"):
        vd.load_classification("imagenet100", tmp_path, "train")  # the real class list is not in this tree


# ----------------------------------------------------------------------------------------------------
# Damaged and unusual files


class _HugeArray:
    """Pickles as numpy's reconstruction of an array far larger than any memory."""

    def __reduce__(self) -> tuple:
        return np._core.multiarray._reconstruct, (np.ndarray, (10**14,), b"b")


def test_a_cifar_array_too_large_for_memory_is_a_value_error_naming_the_file(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=1)
    _dump(tmp_path / "cifar-10-batches-py" / "test_batch", {b"data": _HugeArray(), b"labels": [0]}, 4)
    with pytest.raises(ValueError, match=r"test_batch: .*would not fit in memory"):
        vd.read_cifar("cifar10", tmp_path, "test")


@pytest.mark.parametrize("labels", [["a", "b"], [1.7, 2.0], [[1], [2]]])
def test_cifar_labels_must_be_integers(tmp_path: Path, labels: list) -> None:
    write_cifar10(tmp_path, per_batch=1)
    _dump(tmp_path / "cifar-10-batches-py" / "test_batch", {b"data": _cifar_images(2, 1), b"labels": labels})
    with pytest.raises(ValueError, match=r"test_batch: 'labels' must be a list of integer labels"):
        vd.read_cifar("cifar10", tmp_path, "test")


def test_an_empty_cifar_batch_reads_as_no_images(tmp_path: Path) -> None:
    write_cifar10(tmp_path, per_batch=1)
    _dump(tmp_path / "cifar-10-batches-py" / "test_batch",
          {b"data": np.zeros((0, 3072), dtype=np.uint8), b"labels": []}, 4)
    test = vd.read_cifar("cifar10", tmp_path, "test")
    assert test.images.shape == (0, 32, 32, 3) and test.labels.dtype == np.int64


@pytest.mark.parametrize("content", [b"garbage, not an image", "truncated"])
def test_an_unreadable_image_file_is_a_value_error_naming_it(tmp_path: Path, content: bytes | str) -> None:
    path = tmp_path / "cls" / "bad.png"
    _save_image(path, (64, 64))
    path.write_bytes(path.read_bytes()[:150] if content == "truncated" else content)
    with pytest.raises(vd.ImageDecodeError, match=rf"{path}: not a readable image \(") as err:
        vd.decode_image(path)
    assert isinstance(err.value, ValueError) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="bad.png: not a readable image"):
        vd.ImageSource.folder(tmp_path).raw(0)


def test_hidden_files_such_as_appledouble_are_not_images(tmp_path: Path) -> None:
    _save_image(tmp_path / "cls" / "x.png", (8, 8))
    (tmp_path / "cls" / "._x.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    _save_image(tmp_path / "cls" / ".thumbs" / "y.png", (8, 8))
    samples, _ = vd.list_image_folder(tmp_path)
    assert [p.name for p, _ in samples] == ["x.png"]


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I"])
def test_16_bit_images_are_scaled_to_8_bits(tmp_path: Path, mode: str) -> None:
    values = np.array([[0, 257, 32896], [65535, 1000, 51400]], dtype=np.uint16)
    if mode == "I":
        img = Image.fromarray(values.astype(np.int32), "I")
    else:
        img = Image.frombytes(mode, (3, 2), values.astype(">u2" if mode == "I;16B" else "<u2").tobytes())
    if mode == "I;16":
        img.save(tmp_path / "deep.png")  # a 16-bit PNG opens as I;16
        img = Image.open(tmp_path / "deep.png")
        assert img.mode == "I;16"
    x = vd.decode_image(img)
    expected = torch.tensor([[0, 1, 128], [255, 4, 200]], dtype=torch.uint8)
    assert x.dtype == torch.uint8 and x.shape == (3, 2, 3)
    assert all(torch.equal(x[c], expected) for c in range(3))


def test_32_bit_integer_images_within_8_bits_are_taken_as_they_are() -> None:
    values = np.array([[0, 17, 255]], dtype=np.int32)
    x = vd.decode_image(Image.fromarray(values, "I"))
    assert x[0].tolist() == [[0, 17, 255]]
