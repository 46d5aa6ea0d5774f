"""Data files and checkpoint fields received from someone else: decompression bombs in the Sudoku CSVs, CIFAR
pickles of shared nested lists, and a class-list path recorded in a classifier checkpoint. Each is refused with a
one-line error naming the file, before it takes much time or memory."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import resource
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from hyperset.pretrained import weights_root
from hyperset.sudoku import data as sd
from hyperset.sudoku.board import PuzzleError
from hyperset.training.classify_task import ClassifyData
from hyperset.training.cli import main as train_main
from hyperset.training.eval_classify import classify_command
from hyperset.training.evaluate import main as eval_main
from hyperset.vision import data as vd

BIN = Path(sys.executable).parent
CAP = 1 << 20  # a small MAX_CSV_BYTES, so that a "bomb" of a few MB shows the check quickly
LIMIT = 4_000_000 * 1024  # address space of a subprocess: a loader that allocates before checking fails safely


def _limited(cmd: list[str], timeout: float = 90) -> subprocess.CompletedProcess:
    """Run ``cmd`` with bounded memory and time; a loader that hangs fails the test instead of the machine."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=cap, env=env)
    except subprocess.TimeoutExpired:
        pass
    pytest.fail(f"still running after {timeout} s: {cmd[-3:]}")


def _one_line_error(proc_or_run, prog: str, name: str) -> str:
    """Exit code 2 and one line 'prog: error: ...' naming ``name`` on standard error; returns that line."""
    code = getattr(proc_or_run, "returncode", getattr(proc_or_run, "exit_code", None))
    err = proc_or_run.stderr
    assert code == 2, err[-2000:]
    assert "Traceback" not in err and err.startswith(f"{prog}: error: ") and err.count("\n") == 1, err[-2000:]
    assert name in err, err
    return err


# ---------------------------------------------------------------------------------------------------- Sudoku CSVs


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> int:
    # raising=False: on code without the cap the file is simply read whole, and the test fails on its assertion
    monkeypatch.setattr(sd, "MAX_CSV_BYTES", CAP, raising=False)
    return CAP


def _newline_gzip(path: Path, size: int) -> Path:
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b"\n" * size)  # a few KB on disk
    return path


def _newline_zip(path: Path, valid_size: int) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for split in sd.SPLITS:
            z.writestr(f"sudoku-hard/{split}.csv", b"\n" * (valid_size if split == "valid" else 1))
    return path


@pytest.mark.parametrize("limit", [None, 5])
def test_a_gzip_csv_that_expands_past_the_cap_is_refused(tmp_path: Path, small_cap: int, limit: int | None) -> None:
    path = _newline_gzip(tmp_path / "valid.csv.gz", 2 * small_cap)
    with pytest.raises(PuzzleError, match=rf"valid\.csv\.gz: expands to more than {small_cap:,} bytes"):
        sd.load_csv(path, limit=limit)


def test_a_single_line_past_the_cap_is_refused_when_reading_the_first_rows(tmp_path: Path, small_cap: int) -> None:
    with gzip.open(tmp_path / "test.csv.gz", "wb") as f:
        f.write(b"0" * (2 * small_cap))  # no newline: one line as long as the whole file
    with pytest.raises(PuzzleError, match=r"test\.csv\.gz: expands to more than"):
        sd.load_csv(tmp_path / "test.csv.gz", limit=1)


def test_a_zip_member_that_expands_past_the_cap_is_refused(tmp_path: Path, small_cap: int) -> None:
    _newline_zip(tmp_path / "sudoku-hard.zip", 2 * small_cap)
    with pytest.raises(PuzzleError, match=r"sudoku-hard\.zip/sudoku-hard/valid\.csv: expands to more than"):
        sd.load_csv(sd.find_split(tmp_path, "valid"))


def test_a_flood_of_blank_lines_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sd, "MAX_CSV_LINES", 1000, raising=False)
    (tmp_path / "valid.csv").write_bytes(b"\n" * 5000)
    with pytest.raises(PuzzleError, match=r"valid\.csv: more than 1,000 lines"):
        sd.load_csv(tmp_path / "valid.csv")


def test_extracting_a_zip_bomb_stops_at_the_cap(tmp_path: Path, small_cap: int) -> None:
    zpath = _newline_zip(tmp_path / "sudoku-hard.zip", 2 * small_cap)
    assert "sudoku-hard/valid.csv expands to more than" in (sd._zip_problem(zpath) or "")
    with pytest.raises(PuzzleError, match=r"sudoku-hard/valid\.csv: expands to more than"):
        sd._extract(zpath, tmp_path / "sudoku-hard")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sudoku-hard.zip"]  # nothing half-extracted is left


def test_the_eval_and_train_commands_report_a_gzip_bomb_in_one_line(tmp_path: Path, small_cap: int) -> None:
    _newline_gzip(tmp_path / "valid.csv.gz", 2 * small_cap)
    run = CliRunner().invoke(eval_main, ["sudoku", "--data", str(tmp_path), "--threads", "1"])
    _one_line_error(run, "hyperset-eval sudoku", f"valid.csv.gz: expands to more than {small_cap:,} bytes")
    (tmp_path / "valid.csv.gz").rename(tmp_path / "train.csv.gz")
    (tmp_path / "valid.csv").write_text("")
    run = CliRunner().invoke(train_main, ["sudoku", "--recipe", "sudoku-cpu", "--data", str(tmp_path),
                                          "--out", str(tmp_path / "run"), "--steps", "1"])
    _one_line_error(run, "hyperset-train", f"train.csv.gz: expands to more than {small_cap:,} bytes")


def test_the_cap_leaves_room_for_the_rrn_data() -> None:
    assert sd.MAX_CSV_BYTES >= 8 * 29_520_000 and sd.MAX_CSV_LINES >= 8 * 180_000  # the RRN train.csv


# ---------------------------------------------------------------------------------------------------- CIFAR pickles


def _shared_nested(leaf: list, depth: int = 30) -> list:
    """A list that holds one list twice, ``depth`` times over: a few KB pickled, 2**depth leaves once walked."""
    for _ in range(depth):
        leaf = [leaf, leaf]
    return leaf


def _object_array(value: object) -> np.ndarray:
    out = np.empty(1, dtype=object)
    out[0] = value  # not np.array([value]): that would walk the nested lists
    return out


def _cifar10(root: Path, test_batch: dict, label_names: object = None) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = [b"c%d" % i for i in range(10)] if label_names is None else label_names
    for path, obj in [(folder / "batches.meta", {b"label_names": names}), (folder / "test_batch", test_batch),
                      *[(folder / f"data_batch_{i}", {b"data": np.zeros((0, 3072), np.uint8), b"labels": []})
                        for i in range(1, 6)]]:
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)
    return folder


ONE_IMAGE = np.zeros((1, 3072), np.uint8)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["data", "labels", "object labels", "names"])
def test_cifar_files_of_shared_nested_lists_are_refused_quickly(tmp_path: Path, case: str) -> None:
    batch = {b"data": ONE_IMAGE, b"labels": [0]}
    names = None
    if case == "data":
        batch[b"data"] = _shared_nested([0] * 3072)
    elif case == "labels":
        batch[b"labels"] = _shared_nested([0])
    elif case == "object labels":
        batch[b"labels"] = _object_array(_shared_nested([0]))
    else:
        names = _shared_nested([b"x"])
    _cifar10(tmp_path, batch, names)
    proc = _limited([sys.executable, "-c", "import sys\nfrom hyperset.vision.data import read_cifar\n"
                     "try:\n read_cifar('cifar10', sys.argv[1], 'test')\n"
                     "except ValueError as e:\n print(e)\n sys.exit(2)\n", str(tmp_path)], timeout=60)
    assert proc.returncode == 2, proc.stderr[-1500:]
    assert ("batches.meta" if case == "names" else "test_batch") in proc.stdout, proc.stdout


@pytest.mark.slow
def test_the_eval_command_refuses_a_cifar_batch_of_shared_nested_lists(tmp_path: Path) -> None:
    _cifar10(tmp_path, {b"data": _shared_nested([0] * 3072), b"labels": [0]})
    proc = _limited([str(BIN / "hyperset-eval"), "classify", "--data", str(tmp_path), "--threads", "1"])
    _one_line_error(proc, "hyperset-eval classify", "test_batch: 'data' must be a uint8 numpy array")


def test_real_cifar_batches_still_read(tmp_path: Path) -> None:
    labels = np.array([3], dtype=np.int64)  # an integer array is accepted as well as a list of ints
    _cifar10(tmp_path, {b"data": ONE_IMAGE, b"labels": labels}, [f"c{i}" for i in range(10)])
    arrays = vd.read_cifar("cifar10", tmp_path, "test")
    assert arrays.labels.tolist() == [3] and arrays.images.shape == (1, 32, 32, 3) and arrays.class_names[0] == "c0"


# ---------------------------------------------------------------------------------------------------- class lists


@pytest.mark.slow
def test_a_class_list_that_is_not_a_regular_file_is_not_read() -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    proc = _limited([sys.executable, "-c", "import sys\nfrom hyperset.vision.data import read_class_list\n"
                     "try:\n read_class_list('/dev/zero')\nexcept ValueError as e:\n print(e)\n sys.exit(2)\n"],
                    timeout=60)
    assert proc.returncode == 2 and proc.stdout == "/dev/zero: not a regular file (a class list is a text file of " \
                                                   "WordNet ids)\n", (proc.stdout, proc.stderr[-1500:])


def test_a_class_list_larger_than_the_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "classes.txt"
    with open(path, "wb") as f:
        f.truncate(2 * 2**20)  # sparse: no disk used
    with pytest.raises(ValueError, match=r"classes\.txt: larger than 1,048,576 bytes"):
        vd.read_class_list(path)
    path.write_bytes(b"n01558993\n\xff\n")
    with pytest.raises(ValueError, match=r"classes\.txt: not UTF-8 text"):
        vd.read_class_list(path)


def test_recipe_classes_are_wordnet_ids_or_a_class_list_file(tmp_path: Path) -> None:
    (tmp_path / "classes.txt").write_text("n01558993\nn01692333\n")
    assert ClassifyData(dataset="imagenet100", classes=str(tmp_path / "classes.txt")).classes.endswith("classes.txt")
    assert ClassifyData(dataset="imagenet100", classes=["n01692333", "n01558993"]).classes == ["n01692333",
                                                                                              "n01558993"]
    for bad in (["../../etc"], [1], []):
        with pytest.raises(ValueError, match=r"data\.classes"):
            ClassifyData(dataset="imagenet100", classes=bad)


def _classifier_with_classes(tmp_path: Path, classes: object) -> Path:
    d = tmp_path / "ckpt"
    shutil.copytree(weights_root() / "classifier", d)
    meta = json.loads((d / "config.json").read_text())
    meta["data"].update(dataset="imagenet100", classes=classes, image_size=32)
    (d / "config.json").write_text(json.dumps(meta))
    (tmp_path / "imnet").mkdir()
    return d


@pytest.mark.parametrize("classes, reason", [("/etc/passwd", "data.classes is a path"),
                                             (["/etc"] * 10, "data.classes: '/etc' is not a WordNet id")])
def test_a_class_list_path_in_a_checkpoint_is_not_opened(tmp_path: Path, classes: object, reason: str) -> None:
    d = _classifier_with_classes(tmp_path, classes)
    run = CliRunner().invoke(classify_command, [str(d), "--data", str(tmp_path / "imnet"), "--threads", "1"])
    err = _one_line_error(run, "hyperset-eval classify", f"{d / 'config.json'}: {reason}")
    assert "root:" not in err  # no line of another file is shown


@pytest.mark.slow
def test_a_device_as_class_list_in_a_checkpoint_is_not_read(tmp_path: Path) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    d = _classifier_with_classes(tmp_path, "/dev/zero")
    proc = _limited([str(BIN / "hyperset-eval"), "classify", str(d), "--data", str(tmp_path / "imnet"),
                     "--threads", "1"], timeout=60)
    _one_line_error(proc, "hyperset-eval classify", "data.classes is a path")


def test_a_large_real_collection_is_not_taken_for_a_bomb(tmp_path: Path, small_cap: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # a plain file is bounded by its own size, a compressed one by CSV_EXPANSION times it: a dataset larger than
    # MAX_CSV_BYTES (Kaggle's 9 M puzzles are 1.5 GB) loads, plain or compressed
    import random

    from hyperset.sudoku.exact import generate

    monkeypatch.setattr(sd, "MAX_CSV_LINES", 1000, raising=False)
    pairs = [f"{p},{s}\n" for p, s in generate(40, seed=2)]
    rng = random.Random(0)
    text = "".join(rng.choice(pairs) for _ in range(2 * small_cap // 164 + 1000))  # past the cap and the line cap
    assert len(text) > small_cap
    (tmp_path / "plain.csv").write_text(text)
    (tmp_path / "packed.csv.gz").write_bytes(gzip.compress(text.encode()))
    for name in ("plain.csv", "packed.csv.gz"):
        assert len(sd.load_csv(tmp_path / name)[0]) == text.count("\n"), name
