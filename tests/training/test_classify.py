"""Image classification: data pipeline, task, trainer (Hyper-SET and baselines), resume, eval command, figures.

Every dataset here is generated: tiny CIFAR-10/100 in the standard pickle layout and a tiny ImageFolder tree.
Images of class c carry a class colour plus noise, so a few optimizer steps visibly lower the loss.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from hyperset.config import preset_config
from hyperset.models import HyperSETModel, load_checkpoint, save_checkpoint
from hyperset.training import eval_classify
from hyperset.training.classify_task import ImageSplit, build_classify_task, epochs_to_steps, load_split, top1
from hyperset.training.eval_classify import classify_command
from hyperset.training.trainer import TrainConfig, Trainer

TINY = dict(dim=32, heads=2, ff_hidden=32, iters=2, patch_grid=4, time_dim=16)
PRESETS = {"hyperset": "cifar10-small", "transformer": "cifar10-transformer", "crate": "cifar10-crate",
           "crate-t": "cifar10-crate-t", "et": "cifar10-et"}
WNIDS = ["n01558993", "n01692333", "n01729322"]


def _images(labels: np.ndarray, rng: np.random.Generator, size: int = 32) -> np.ndarray:
    """uint8 (N, size, size, 3): a class colour + noise."""
    palette = np.random.default_rng(123).integers(30, 226, size=(100, 3))
    noise = rng.integers(-30, 31, size=(len(labels), size, size, 3))
    return np.clip(palette[labels][:, None, None, :] + noise, 0, 255).astype(np.uint8)


def _dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _cifar_rows(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(N, 3072) uint8: row-major R, G and B planes, as the CIFAR batches store them."""
    return _images(labels, rng).transpose(0, 3, 1, 2).reshape(len(labels), -1)


@pytest.fixture(scope="module")
def cifar10(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("c10")
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        y = rng.integers(0, 10, 24)
        _dump(folder / f"data_batch_{i}", {b"batch_label": b"train", b"data": _cifar_rows(y, rng),
                                            b"labels": [int(v) for v in y]})
    y = rng.integers(0, 10, 30)
    _dump(folder / "test_batch", {b"data": _cifar_rows(y, rng), b"labels": [int(v) for v in y]})
    _dump(folder / "batches.meta", {b"label_names": [f"class{i}".encode() for i in range(10)]})
    return root


@pytest.fixture(scope="module")
def cifar100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("c100")
    folder = root / "cifar-100-python"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for name, n in (("train", 80), ("test", 20)):
        y = rng.integers(0, 100, n)
        _dump(folder / name, {b"data": _cifar_rows(y, rng), b"fine_labels": [int(v) for v in y],
                              b"coarse_labels": [int(v) // 5 for v in y]})
    _dump(folder / "meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
                            b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})
    return root


@pytest.fixture(scope="module")
def imagefolder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("in100")
    rng = np.random.default_rng(2)
    for split, per_class in (("train", 6), ("val", 2)):
        for c, wnid in enumerate(WNIDS):
            (root / split / wnid).mkdir(parents=True)
            for i, img in enumerate(_images(np.full(per_class, c), rng, size=40)):
                Image.fromarray(img[:, :36]).save(root / split / wnid / f"{i}.png")
    return root


def _recipe(dataset: str = "cifar10", layer: str = "hyperset", **data: object) -> dict:
    return {"preset": PRESETS[layer], "data": {"dataset": dataset, "val_fraction": 0.25, "seed": 0, **data},
            "objective": {"label_smoothing": 0.1}, "train": {"batch_size": 16}}


def _task(root: Path, dataset: str = "cifar10", layer: str = "hyperset", **data: object):
    recipe = _recipe(dataset, layer, **data)
    return build_classify_task(preset_config(recipe["preset"], **TINY), recipe, str(root))


def _train_cfg(steps: int, **kw: object) -> TrainConfig:
    base = dict(steps=steps, batch_size=16, optimizer="adam", betas=(0.9, 0.999), lr=3e-3, min_lr=1e-4,
                warmup_steps=2, weight_decay=5e-5, clip=1.0, amp="off", eval_every=1000, log_every=1,
                save_every_seconds=1e9, seed=0)
    base.update(kw)
    return TrainConfig(**base)


def _losses(out: Path) -> list[float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


# ---------------------------------------------------------------------------------------------------- data


def test_cifar_tasks_fit_the_model_to_the_dataset(cifar10: Path, cifar100: Path) -> None:
    t10 = _task(cifar10)
    assert (len(t10.train), len(t10.val)) == (90, 30)
    assert t10.model.num_classes == 10 and t10.model.img_size == 32
    assert t10.select_metric == "val/top1@2" and t10.eval_iters == [2, 4]
    t100 = _task(cifar100, "cifar100", n_train=40)
    assert t100.model.num_classes == 100 and len(t100.train) == 40
    assert t100.describe()["dataset"] == "cifar100"


def test_batches_are_augmented_normalized_and_deterministic(cifar10: Path) -> None:
    task = _task(cifar10)
    a = task.batch(3, 8, seed=0, device=torch.device("cpu"))
    b = task.batch(3, 8, seed=0, device=torch.device("cpu"))
    assert a["images"].shape == (8, 3, 32, 32) and a["images"].dtype == torch.float32
    assert a["labels"].shape == (8,) and a["labels"].dtype == torch.int64
    assert torch.equal(a["images"], b["images"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(a["images"], task.batch(4, 8, seed=0, device=torch.device("cpu"))["images"])
    assert not torch.equal(a["images"], task.batch(3, 8, seed=1, device=torch.device("cpu"))["images"])
    # zero padding shows up as the normalized value of black in cropped images
    plain, _ = task.train.subset(np.arange(len(task.train))).batch(range(8))
    assert abs(float(plain.mean())) < 1.5 and float(plain.std()) > 0.05
    # one epoch visits every training image once
    seen = torch.cat([task.batch(s, 10, 0, torch.device("cpu"))["labels"] for s in range(9)])
    assert torch.equal(torch.sort(seen).values, torch.sort(task.train.labels).values)


def test_imagefolder_batches(imagefolder: Path) -> None:
    task = _task(imagefolder, "imagenet100", image_size=32, classes=WNIDS, workers=2)
    assert task.model.num_classes == 3 and task.model.img_size == 32
    a = task.batch(1, 4, seed=0, device=torch.device("cpu"))
    b = task.batch(1, 4, seed=0, device=torch.device("cpu"))
    assert a["images"].shape == (4, 3, 32, 32) and torch.equal(a["images"], b["images"])
    assert set(task.evaluate(HyperSETModel(task.model), torch.device("cpu"), _nullcontext)) == {
        "val/top1@2", "val/top1@4"}


def test_epochs_become_steps() -> None:
    # batches run on across epochs (no short last batch): an epoch of 100 images in batches of 16 is 6.25 steps,
    # every count is rounded up (3 epochs: 18.75 -> 19 steps, not 3 x ceil(6.25) = 21)
    train = {"epochs": 3, "warmup_epochs": 0.5, "eval_every_epochs": 2, "batch_size": 16}
    epochs, per_epoch = epochs_to_steps(train, 100)
    assert (epochs, per_epoch) == (3, 7)
    assert train == {"steps": 19, "warmup_steps": 4, "eval_every": 13, "batch_size": 16}
    assert TrainConfig.from_dict(train).steps == 19
    with pytest.raises(ValueError, match="both"):
        epochs_to_steps({"epochs": 1, "steps": 5}, 100)


def test_incompatible_presets_and_settings_are_errors(cifar10: Path) -> None:
    recipe = _recipe()
    with pytest.raises(ValueError, match="classify preset"):
        build_classify_task(preset_config("sudoku"), recipe, str(cifar10))
    with pytest.raises(ValueError, match="patch_grid 5"):
        build_classify_task(preset_config("cifar10-small", **{**TINY, "patch_grid": 5}), recipe, str(cifar10))
    with pytest.raises(ValueError, match="num_classes"):
        build_classify_task(preset_config("cifar10-small", **TINY), {**recipe, "model": {"num_classes": 7}},
                            str(cifar10))
    with pytest.raises(ValueError, match="val_fraction"):
        _task(cifar10, val_fraction=0.0)
    with pytest.raises(ValueError, match="unknown \\[data\\] keys"):
        _task(cifar10, colour=True)
    with pytest.raises(FileNotFoundError):
        _task(cifar10.parent / "missing")


# ---------------------------------------------------------------------------------------------------- training


def _nullcontext():
    import contextlib

    return contextlib.nullcontext()


@pytest.mark.parametrize("layer", list(PRESETS))
def test_training_lowers_the_loss(cifar10: Path, tmp_path: Path, layer: str) -> None:
    task = _task(cifar10, layer=layer)
    assert task.model.layer == layer
    result = Trainer(task, _train_cfg(24), tmp_path, device="cpu", quiet=True).fit()
    losses = _losses(tmp_path)
    assert result["finished"] and len(losses) == 24
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.1, losses
    assert (tmp_path / "best" / "model.safetensors").is_file()


def test_resume_matches_an_uninterrupted_run(cifar10: Path, tmp_path: Path) -> None:
    class Interrupted:
        """The task, with a SIGTERM sent while step `at` is being prepared (as if the run were killed)."""

        def __init__(self, task: object, at: int) -> None:
            self.task, self.at = task, at

        def __getattr__(self, name: str) -> object:
            return getattr(self.task, name)

        def batch(self, step: int, *args: object) -> dict:
            if step == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
            return self.task.batch(step, *args)

    cfg = _train_cfg(8, eval_every=5)
    Trainer(_task(cifar10), cfg, tmp_path / "full", device="cpu", quiet=True).fit()
    first = Trainer(Interrupted(_task(cifar10), 3), cfg, tmp_path / "split", device="cpu", quiet=True).fit()
    assert first["step"] == 4 and not first["finished"]
    second = Trainer(_task(cifar10), cfg, tmp_path / "split", device="cpu", resume=True, quiet=True).fit()
    assert second["step"] == 8 and second["finished"]
    full, _ = load_checkpoint(tmp_path / "full" / "last")
    resumed, _ = load_checkpoint(tmp_path / "split" / "last")
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name


# ---------------------------------------------------------------------------------------------------- evaluation


@pytest.fixture(scope="module")
def checkpoint(cifar10: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    task = _task(cifar10)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("ckpt") / "best"
    save_checkpoint(folder, HyperSETModel(task.model), {"task": "classify", "data": task.describe()})
    return folder


def test_eval_command_json_beyond_the_trained_depth(cifar10: Path, checkpoint: Path) -> None:
    run = CliRunner().invoke(classify_command, [str(checkpoint), "--data", str(cifar10), "--json", "--iters", "5"])
    assert run.exit_code == 0, run.output
    report = json.loads(run.output)
    assert set(report) == {"checkpoint", "dataset", "split", "images", "device", "precision", "seconds", "results"}
    assert report["images"] == 30 and report["dataset"] == "cifar10" and report["split"] == "test"
    (record,) = report["results"]
    assert record["iters"] == 5 and 0.0 <= record["top1"] <= 1.0
    val = CliRunner().invoke(classify_command, [str(checkpoint), "--data", str(cifar10), "--split", "val", "--json"])
    assert val.exit_code == 0 and json.loads(val.output)["images"] == 30
    assert json.loads(val.output)["results"][0]["iters"] == 2
    few = CliRunner().invoke(classify_command, [str(checkpoint), "--data", str(cifar10), "--limit", "7", "--json"])
    assert few.exit_code == 0 and json.loads(few.output)["images"] == 7
    text = CliRunner().invoke(classify_command, [str(checkpoint), "--data", str(cifar10)])
    assert text.exit_code == 0 and "top-1" in text.output and "at 2 iterations" in text.output


def test_eval_command_out_writes_the_json_document(cifar10: Path, checkpoint: Path, tmp_path: Path) -> None:
    """--out as in hyperset-eval sudoku: the document --json prints, written atomically; a folder that does not
    exist is refused before any work."""
    args = [str(checkpoint), "--data", str(cifar10), "--limit", "5", "--iters", "1", "--json"]
    run = CliRunner().invoke(classify_command, [*args, "--out", str(tmp_path / "r.json")])
    assert run.exit_code == 0, run.output
    written = json.loads((tmp_path / "r.json").read_text())
    printed = json.loads(run.stdout)
    assert written["results"] == printed["results"] and written["images"] == 5
    bad = CliRunner().invoke(classify_command, [*args, "--out", str(tmp_path / "no" / "r.json")])
    assert bad.exit_code == 2 and "folder" in bad.output and bad.stdout.count("{") == 0


@pytest.mark.parametrize("n_layers, lora_rank", [(1, 0), (1, 4), (2, 0)])
def test_one_pass_over_several_depths_matches_a_run_per_depth(cifar10: Path, n_layers: int, lora_rank: int) -> None:
    task = _task(cifar10)
    torch.manual_seed(0)
    # large steps and head weights: the predictions of an untrained model then differ from depth to depth
    model = HyperSETModel(task.model.replace(n_layers=n_layers, lora_rank=lora_rank, step_init=1.0)).eval()
    torch.nn.init.normal_(model.head.weight, std=1.0)
    split = load_split(task.data, "test")
    with torch.no_grad():
        preds = {d: torch.cat([model(x, iters=d) for x, _ in split.batches(7)]).argmax(-1) for d in (1, 3, 5)}
    assert not torch.equal(preds[1], preds[5]) or not torch.equal(preds[3], preds[5])
    for depth, labels in preds.items():  # label the images with one depth's predictions: 100% there only
        labelled = ImageSplit(task.data, False, split.images, labels)
        together, images = top1(model, labelled, [5, 1, 3], torch.device("cpu"), contextlib.nullcontext, 7)
        assert images == 30 and list(together) == [1, 3, 5]
        assert together == {d: pytest.approx(float((p == labels).float().mean())) for d, p in preds.items()}
        assert together[depth] == 1.0


def test_eval_command_several_depths_give_one_json_document(cifar10: Path, checkpoint: Path) -> None:
    args = [str(checkpoint), "--data", str(cifar10), "--json", "--threads", "1", "--iters", "4", "--iters", "2"]
    run = CliRunner().invoke(classify_command, args)
    assert run.exit_code == 0, run.output
    assert len(run.stdout.strip().splitlines()) == 1
    report = json.loads(run.stdout)
    assert [r["iters"] for r in report["results"]] == [4, 2] and report["images"] == 30
    single = json.loads(CliRunner().invoke(classify_command, args[:-4] + ["--iters", "2"]).stdout)
    assert single["results"][0]["top1"] == report["results"][1]["top1"]


def test_classify_test_bench_writes_json_and_records_in_the_checkpoint(cifar10: Path, checkpoint: Path,
                                                                        tmp_path: Path) -> None:
    import importlib.util
    import shutil

    path = Path(__file__).resolve().parents[2] / "bench" / "classify_test.py"
    spec = importlib.util.spec_from_file_location("classify_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    out = tmp_path / "result.json"
    run = CliRunner().invoke(module.main, [str(ckpt), "--data", str(cifar10), "--out", str(out), "--record",
                                           "--note", "a test"])
    assert run.exit_code == 0, run.output
    result = json.loads(out.read_text())
    assert [r["iters"] for r in result["rows"]] == [2, 4] and result["split"] == "test"
    assert all(r["images"] == 30 and 0.0 <= r["top1"] <= 1.0 and r["precision"] == "fp32" for r in result["rows"])
    test = json.loads((ckpt / "config.json").read_text())["test"]
    assert test["iters"] == 2 and test["images"] == 30 and test["note"] == "a test"
    assert test["top1"] == result["rows"][0]["top1"] and test["top1@4"] == result["rows"][1]["top1"]
    load_checkpoint(ckpt)  # still a valid checkpoint
    refused = CliRunner().invoke(module.main, [str(ckpt), "--data", str(cifar10), "--out", str(out), "--record",
                                               "--iters", "4"])
    assert refused.exit_code == 2 and "trained depth (2)" in refused.stderr


def test_eval_command_errors(cifar10: Path, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                             ) -> None:
    runner = CliRunner()
    missing = runner.invoke(classify_command, [str(checkpoint), "--data", str(tmp_path / "nope"), "--json"])
    assert missing.exit_code == 2 and "does not exist" in missing.output and "Traceback" not in missing.output
    sudoku = tmp_path / "sudoku"
    save_checkpoint(sudoku, HyperSETModel(preset_config("sudoku", dim=16, heads=2, ff_hidden=16, iters=1)))
    wrong = runner.invoke(classify_command, [str(sudoku), "--data", str(cifar10)])
    assert wrong.exit_code == 2 and "classify" in wrong.output
    monkeypatch.setattr(eval_classify, "shipped_classifier_dir", lambda: tmp_path / "none")
    unshipped = runner.invoke(classify_command, ["--data", str(cifar10)])
    assert unshipped.exit_code == 2 and "no classifier is shipped yet" in unshipped.output


class _CallsGetcwd:
    def __reduce__(self):
        return (os.getcwd, ())


def test_cli_reports_a_refused_cifar_file_and_bad_recipe_values_in_one_line(cifar10: Path, tmp_path: Path) -> None:
    import shutil

    from hyperset.training.cli import main as train_main

    shutil.copytree(cifar10, tmp_path / "data")
    _dump(tmp_path / "data" / "cifar-10-batches-py" / "data_batch_2", {b"data": _CallsGetcwd(), b"labels": [0]})
    base = ["classify", "--recipe", "cifar10-cpu", "--out", str(tmp_path / "run"), "--steps", "1"]
    for args, message in [(["--data", str(tmp_path / "data")], "refusing to load global posix.getcwd"),
                          (["--data", str(cifar10), "--set", "data.val_fraction=abc"], "data.val_fraction = 'abc'"),
                          (["--data", str(cifar10), "--set", "objective.eval_iters=[1.5]"], "objective.eval_iters"),
                          (["--data", str(cifar10), "--set", "train.epochs=x"], "train.epochs = 'x'")]:
        result = CliRunner().invoke(train_main, base + args)
        assert result.exit_code == 2 and message in result.stderr, result.output
        assert "Traceback" not in result.output and result.stderr.count("\n") == 1


def test_eval_command_names_a_file_that_is_no_checkpoint(cifar10: Path, checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "model.pkl").write_bytes(pickle.dumps({"weights": [1, 2]}))
    run = CliRunner().invoke(classify_command, [str(tmp_path / "model.pkl"), "--data", str(cifar10)])
    assert run.exit_code == 2 and "model.pkl is a file, not a checkpoint" in run.stderr
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("model.safetensors", "config.json"):
        (odd / name).write_bytes((checkpoint / name).read_bytes())
    meta = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**meta, "data": "cifar10"}))  # hand-edited: not a table
    run = CliRunner().invoke(classify_command, [str(odd), "--data", str(cifar10), "--json"])
    assert run.exit_code == 0 and json.loads(run.stdout)["dataset"] == "cifar10", run.output


def test_figures(cifar10: Path, checkpoint: Path, tmp_path: Path) -> None:
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "classify_figures.py"
    spec = importlib.util.spec_from_file_location("classify_figures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.make_figures(str(checkpoint), str(cifar10), images=12, iters=4, out=tmp_path, batch_size=5)
    assert all(p.is_file() for p in written.values())
    energy = json.loads((tmp_path / "classify_energy.json").read_text())
    assert len(energy["energy_attn"]["mean"]) == 5 and len(energy["top1"]) == 5 and energy["trained_iters"] == 2
    geometry = json.loads((tmp_path / "classify_rank_angle.json").read_text())
    assert np.array(geometry["effective_rank"]["mean"]).shape == (5, 2)


def test_train_download_fetches_cifar_into_data_then_trains(cifar10: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    import hashlib
    import tarfile

    from hyperset.training.cli import main as train_main
    from hyperset.vision import data as vd

    archive = tmp_path / "mirror.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(cifar10 / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    recipe = tmp_path / "tiny.toml"
    tiny = "\n".join(f"{k} = {v}" for k, v in TINY.items())
    recipe.write_text(f'task = "classify"\npreset = "cifar10-small"\n[model]\n{tiny}\n[data]\nval_fraction = 0.25\n'
                      '[train]\nbatch_size = 16\nsave_every_seconds = 1e9\n')
    args = ["classify", "--recipe", str(recipe), "--data", str(tmp_path / "data"), "--steps", "2", "--download",
            "--quiet"]
    offline = dataclasses.replace(vd._CIFAR["cifar10"], url=(tmp_path / "nowhere.tar.gz").as_uri())
    monkeypatch.setitem(vd._CIFAR, "cifar10", offline)
    failed = CliRunner().invoke(train_main, args + ["--out", str(tmp_path / "run0")])
    assert failed.exit_code == 2 and "could not download cifar10" in failed.stderr, failed.output
    assert "Traceback" not in failed.output and not (tmp_path / "run0" / "last").exists()
    mirror = dataclasses.replace(offline, url=archive.as_uri(), md5=hashlib.md5(archive.read_bytes()).hexdigest())
    monkeypatch.setitem(vd._CIFAR, "cifar10", mirror)
    run = CliRunner().invoke(train_main, args + ["--out", str(tmp_path / "run")])
    assert run.exit_code == 0, run.output
    assert (tmp_path / "data" / "cifar-10-batches-py" / "test_batch").is_file()
    assert (tmp_path / "run" / "last" / "trainer.json").is_file()
    imagenet = CliRunner().invoke(train_main, args + ["--out", str(tmp_path / "run2"), "--dataset", "imagenet100"])
    assert imagenet.exit_code == 2 and "image-net.org" in imagenet.stderr


def test_eval_command_reports_the_precision_it_used(cifar10: Path, checkpoint: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    args = [str(checkpoint), "--data", str(cifar10), "--limit", "4", "--device", "cpu"]
    fp32 = CliRunner().invoke(classify_command, [*args, "--precision", "fp32", "--json"])
    assert fp32.exit_code == 0 and json.loads(fp32.stdout)["precision"] == "fp32", fp32.output
    monkeypatch.setattr(eval_classify, "autocast_dtype", lambda device: torch.bfloat16)  # a CPU with native bf16
    auto = CliRunner().invoke(classify_command, [*args, "--json"])
    assert auto.exit_code == 0 and json.loads(auto.stdout)["precision"] == "bf16 autocast", auto.output
    text = CliRunner().invoke(classify_command, args)
    assert text.exit_code == 0 and ", bf16 autocast, " in text.stdout, text.output


def test_eval_command_refuses_an_empty_split(cifar10: Path, checkpoint: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(cifar10, tmp_path / "data")
    with open(tmp_path / "data" / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((0, 3072), dtype=np.uint8), b"labels": []}, f, protocol=4)
    run = CliRunner().invoke(classify_command, [str(checkpoint), "--data", str(tmp_path / "data"), "--json"])
    assert run.exit_code == 2 and "test split holds no images" in run.stderr, run.output
    assert run.stdout == "" and "Traceback" not in run.output


def test_eval_command_refuses_a_dataset_with_another_class_count(cifar10: Path, cifar100: Path,
                                                                  tmp_path: Path) -> None:
    task = _task(cifar100, "cifar100")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "c100", HyperSETModel(task.model), {"task": "classify", "data": task.describe()})
    run = CliRunner().invoke(classify_command, [str(tmp_path / "c100"), "--data", str(cifar10),
                                                "--dataset", "cifar10"])
    assert run.exit_code == 2 and "the model has 100 classes but cifar10 has 10" in run.stderr, run.output


def test_eval_command_names_an_unreadable_image(imagefolder: Path, tmp_path: Path) -> None:
    import shutil

    data = tmp_path / "in100"
    shutil.copytree(imagefolder, data)
    (data / "val" / WNIDS[1] / "1.png").write_bytes(b"garbage, not a png")
    task = _task(imagefolder, "imagenet100", image_size=32, classes=WNIDS)
    save_checkpoint(tmp_path / "ckpt", HyperSETModel(task.model), {"task": "classify", "data": task.describe()})
    run = CliRunner().invoke(classify_command, [str(tmp_path / "ckpt"), "--data", str(data), "--json"])
    assert run.exit_code == 2 and "1.png: not a readable image" in run.stderr, run.output
    assert "Traceback" not in run.output and run.stderr.count("\n") == 1


@pytest.mark.parametrize("objective, message", [
    ({"eval_batch": 0}, "objective.eval_batch must be a whole number >= 1"),
    ({"eval_iters": [-3]}, "objective.eval_iters must hold iteration counts in [1, 10000]"),
    ({"eval_iters": [2, 20000]}, "objective.eval_iters must hold iteration counts in [1, 10000]"),
    ({"rise_weight": -1.0}, "objective.rise_weight must be a finite number >= 0"),
    ({"rise_weight": float("nan")}, "objective.rise_weight must be a finite number >= 0"),
    ({"rise_weight": True}, "objective.rise_weight = True: expected float")])
def test_bad_objective_values_are_refused_before_training(cifar10: Path, objective: dict, message: str) -> None:
    recipe = {**_recipe(), "objective": objective}
    with pytest.raises(ValueError) as err:
        build_classify_task(preset_config(recipe["preset"], **TINY), recipe, str(cifar10))
    assert message in str(err.value)


def _seeded_model_and_batch(task) -> tuple[HyperSETModel, dict, int]:
    """A model of the task's config made from seed 0, the task's first batch of 8 and the trained depth."""
    torch.manual_seed(0)
    return HyperSETModel(task.model), task.batch(0, 8, 0, torch.device("cpu")), task.model.iters


def test_deep_supervision_is_the_mean_of_the_losses_after_each_segment(cifar10: Path) -> None:
    """objective.segments = 2: the loss is the (weighted) mean of the label-smoothed CE after T and after 2T
    iterations, the second segment starting from the first one's detached state; bad values name their key."""
    import torch.nn.functional as F

    recipe = _recipe()
    recipe["objective"].update(segments=2, segment_weights=[1.0, 3.0])
    task = build_classify_task(preset_config(recipe["preset"], **TINY), recipe, str(cifar10))
    assert task.describe()["segments"] == 2
    model, batch, T = _seeded_model_and_batch(task)
    loss, _ = task.loss(model, batch)
    ce = [F.cross_entropy(model(batch["images"], iters=k * T), batch["labels"], label_smoothing=0.1) for k in (1, 2)]
    assert torch.allclose(loss, (ce[0] + 3 * ce[1]) / 4, atol=1e-5)
    model.zero_grad()
    loss.backward()  # the first segment's state is detached: its parameters get the second segment's gradient too
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    for bad, key in (({"segments": 0}, "segments"), ({"segments": 2, "segment_weights": [1.0]}, "segment_weights"),
                     ({"segments": 2, "segment_weights": [0.0, 0.0]}, "segment_weights")):
        recipe["objective"] = {"label_smoothing": 0.1, **bad}
        with pytest.raises(ValueError, match=f"objective.{key}"):
            build_classify_task(preset_config(recipe["preset"], **TINY), recipe, str(cifar10))


def test_the_rise_penalty_adds_how_far_the_energy_rises_to_the_segments_loss(cifar10: Path) -> None:
    """objective.rise_weight = w: the loss is the segments' CE plus w x energy_rise of E_ATTN + E_FF after every
    iteration of the pass (the trace's energies, here with their gradient), logged as "rise"; the penalty's
    gradient reaches the weights. A layer without an energy is refused."""
    import torch.nn.functional as F

    from hyperset.training.task import energy_rise

    task = _deep_task(cifar10, segments=2, rise_weight=50.0)
    assert task.describe()["rise_weight"] == 50.0
    model, batch, T = _seeded_model_and_batch(task)
    loss, logged = task.loss(model, batch)
    with torch.no_grad():
        ce = [F.cross_entropy(model(batch["images"], iters=k * T), batch["labels"], label_smoothing=0.1)
              for k in (1, 2)]
        energy = model.run(batch["images"], iters=2 * T, trace=True).trace.stacked()
    total = energy["energy_attn"] + energy["energy_ff"]
    rise = energy_rise(total)
    assert float(rise) > 0 and torch.allclose(logged["rise"], rise, rtol=1e-4, atol=1e-9)
    assert torch.allclose(loss, (ce[0] + ce[1]) / 2 + 50.0 * rise, rtol=1e-5, atol=1e-6)
    model.zero_grad()
    loss.backward()
    assert model.core.layers[0].W.grad is not None and float(model.core.layers[0].W.grad.abs().sum()) > 0
    recipe = _recipe(layer="transformer")
    recipe["objective"].update(rise_weight=1.0)
    with pytest.raises(ValueError, match="objective.rise_weight needs an energy"):
        build_classify_task(preset_config(recipe["preset"], **TINY), recipe, str(cifar10))


def test_energy_rise_counts_only_rises_and_moves_only_the_later_state() -> None:
    """energy_rise: zero where every step falls by more than RISE_RTOL of the energy's size; else the mean of
    the relative rises plus RISE_RTOL, clipped at 0; the earlier energy gets no gradient."""
    from hyperset.training.task import RISE_RTOL, energy_rise

    falling = torch.tensor([[100.0, -50.0], [99.0, -51.0], [98.0, -52.0]])
    assert float(energy_rise(falling)) == 0.0 and float(energy_rise(falling[:1])) == 0.0
    e = torch.tensor([[100.0], [101.0], [100.5]], requires_grad=True)
    expected = (max(0.0, 1.0 / 100 + RISE_RTOL) + max(0.0, -0.5 / 101 + RISE_RTOL)) / 2
    rise = energy_rise(e)
    assert abs(float(rise.detach()) - expected) < 1e-7
    rise.backward()
    assert e.grad[0, 0] == 0 and e.grad[1, 0] > 0 and e.grad[2, 0] == 0
    flat = torch.tensor([[10.0], [10.0]])  # no change is a rise of RISE_RTOL: a step must fall to count
    assert abs(float(energy_rise(flat)) - RISE_RTOL) < 1e-9


# ---------------------------------------------------------------------------------------------------- depth


def _deep_task(root: Path, **objective: object):
    recipe = _recipe()
    recipe["objective"].update(objective)
    return build_classify_task(preset_config(recipe["preset"], **TINY), recipe, str(root))


def test_a_drawn_depth_is_in_range_a_function_of_the_step_and_what_the_loss_runs(cifar10: Path) -> None:
    """objective.train_iters = [lo, hi]: each step's iterations per segment drawn from (seed, step) in lo..hi, the
    loss running segments x that many iterations, detached every that many; the model built with a graph per
    update (compiled once for every depth); without it, the trained depth."""
    task = _deep_task(cifar10, segments=2, train_iters=[1, 4])
    draws = [task.depth_draw(step, 0) for step in range(60)]
    assert draws == [task.depth_draw(step, 0) for step in range(60)] and set(draws) == {1, 2, 3, 4}
    assert task.build_model().core.graph_per_update and task.describe()["train_iters"] == [1, 4]
    batch = task.batch(5, 8, 0, torch.device("cpu"))
    assert batch["depth"].shape == (8,) and int(batch["depth"][0]) == task.depth_draw(5, 0)
    model = HyperSETModel(task.model)
    seen = []
    model.register_forward_hook(lambda m, args, kw, out: seen.append(kw), with_kwargs=True)
    loss, _ = task.loss(model, batch)
    k = task.depth_draw(5, 0)
    assert seen[0]["iters"] == 2 * k and seen[0]["detach_every"] == k and torch.isfinite(loss)
    plain = _deep_task(cifar10)
    assert "depth" not in plain.batch(5, 8, 0, torch.device("cpu")) and not plain.build_model().core.graph_per_update


def test_the_best_classifier_can_be_chosen_at_another_depth(cifar10: Path) -> None:
    task = _deep_task(cifar10, select_iters=5, eval_iters=[2])
    assert task.select_metric == "val/top1@5" and task.eval_iters == [5, 2]
    metrics = task.evaluate(HyperSETModel(task.model), torch.device("cpu"), contextlib.nullcontext)
    assert set(metrics) == {"val/top1@5", "val/top1@2"}
    assert _deep_task(cifar10).select_metric == "val/top1@2"


@pytest.mark.parametrize("objective, message", [
    ({"train_iters": [3, 1]}, "objective.train_iters must be [lo, hi] with 1 <= lo <= hi"),
    ({"train_iters": [0, 2]}, "objective.train_iters must be [lo, hi] with 1 <= lo <= hi"),
    ({"train_iters": [2]}, "objective.train_iters must be [lo, hi] with 1 <= lo <= hi"),
    ({"select_iters": -1}, "objective.select_iters must be a whole number in [0, 10000]"),
    ({"select_iters": 2.5}, "objective.select_iters = 2.5: expected int")])
def test_bad_depth_options_of_a_classifier_are_named(cifar10: Path, objective: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        _deep_task(cifar10, **objective)
    assert message in str(err.value)


@pytest.mark.parametrize("name", ["cifar10-cpu-deep", "cifar10-cpu-descent", "cifar100-deep", "imagenet100-deep"])
def test_the_depth_robust_recipes_train_and_resume_on_small_data(name: str, cifar10: Path, cifar100: Path,
                                                                  imagefolder: Path, tmp_path: Path) -> None:
    """Each shipped depth-robust classification recipe, on a small copy of its dataset and a tiny model: its
    objective as written (2 segments, 8-16 iterations per segment, chosen at 24), three steps with the recipe's
    optimizer (and its energy-rise penalty, where it has one) that resume to the same weights as an uninterrupted
    run."""
    from hyperset.training.recipes import load_recipe

    _, recipe = load_recipe(name)
    dataset = recipe["data"]["dataset"]
    root = {"cifar10": cifar10, "cifar100": cifar100, "imagenet100": imagefolder}[dataset]
    recipe["data"].update(val_fraction=0.25, workers=0)
    if dataset == "imagenet100":
        recipe["data"].update(image_size=32, classes=WNIDS)
    make = lambda: build_classify_task(preset_config(recipe["preset"], **TINY), recipe, str(root))  # noqa: E731
    task = make()
    assert task.segments == 2 and task.train_iters == [8, 16] and task.select_metric == "val/top1@24"
    assert {12, 24, 48} <= set(task.eval_iters)
    assert task.rise_weight == (300.0 if name == "cifar10-cpu-descent" else 0.0)
    t = recipe["train"]
    cfg = lambda steps: _train_cfg(steps, optimizer=t["optimizer"], lr=t["lr"], batch_size=8,  # noqa: E731
                                   weight_decay=t["weight_decay"], clip=t["clip"])
    Trainer(make(), cfg(3), tmp_path / "straight", quiet=True).fit()
    Trainer(make(), cfg(1), tmp_path / "split", quiet=True).fit()
    Trainer(make(), cfg(3), tmp_path / "split", resume=True, quiet=True).fit()
    a, _ = load_checkpoint(tmp_path / "straight" / "last")
    b, _ = load_checkpoint(tmp_path / "split" / "last")
    for (key, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), key
    assert all(np.isfinite(v) for v in _losses(tmp_path / "straight"))
