"""bench/depth_ablation.py classifier: a classifier checkpoint's one pass on a CIFAR split, read out at T, 2T, ...
with the share of images whose energy never rises, against a direct count from the model itself."""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import numpy as np
import torch

from hyperset.config import preset_config
from hyperset.models import HyperSETModel, save_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import depth_ablation  # noqa: E402


def _cifar(root: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)

    def dump(name: str, n: int) -> None:
        y = rng.integers(0, 10, n)
        rows = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": rows, b"labels": [int(v) for v in y]}, f)

    for i in range(1, 6):
        dump(f"data_batch_{i}", 8)
    dump("test_batch", 12)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    return root


def test_the_classifier_depth_curve_matches_the_models_own_readouts(tmp_path: Path) -> None:
    data = _cifar(tmp_path / "cifar")
    torch.manual_seed(0)
    cfg = preset_config("cifar10-small", dim=32, heads=2, ff_hidden=32, iters=2, patch_grid=4, time_dim=16)
    model = HyperSETModel(cfg).eval()
    with torch.no_grad():
        model.core.step_sizes.L3.weight.normal_(0, 0.05)  # steps that vary in sign: some energies rise
    save_checkpoint(tmp_path / "ckpt", model, {"task": "classify", "data": {"dataset": "cifar10"}})
    out = tmp_path / "r.json"
    depth_ablation.main(["classifier", "--checkpoint", str(tmp_path / "ckpt"), "--data", str(data),
                         "--depth", "4", "--out", str(out)])
    r = json.loads(out.read_text())
    assert r["images"] == 12 and list(r["top1"]) == ["T", "2T", "4T"] and len(r["curve"]) == 8
    from hyperset.training.classify_task import ClassifyData, load_split

    images, labels = next(load_split(ClassifyData(data_dir=str(data)), "test").batches(100))
    energies, correct = [], []
    with torch.no_grad():
        for layer, t, x in model.core.iterate(model.stem(images), 8):
            correct.append(int((model.readout(x).argmax(-1) == labels).sum()) / len(labels))
            energies.append(sum(v.double() for v in layer.energy(x, t).values()))
    e = torch.stack(energies)
    rises = (e[1:] - e[:-1]) > 1e-5 * e[:-1].abs().clamp(min=1.0)
    for k, name in ((1, "T"), (2, "2T"), (4, "4T")):
        assert abs(r["top1"][name] - correct[2 * k - 1]) < 1e-9
        assert abs(r["energy_never_rises"][name] - float((~rises[: 2 * k - 1].any(0)).double().mean())) < 1e-9
    assert 0.0 < r["energy_never_rises"]["T"] < 1.0  # both kinds of image: the count is not trivially right


def test_a_control_from_past_the_trained_depth_keeps_t_and_stops_the_rises_after_it(tmp_path: Path) -> None:
    """--step-control backtrack --backtrack-from T+1: the first T iterations run as trained (top-1 at T and the
    rises to T unchanged) and no image's energy rises after T, so the share that never rises to 4T is that to T."""
    data = _cifar(tmp_path / "cifar")
    torch.manual_seed(0)
    cfg = preset_config("cifar10-small", dim=32, heads=2, ff_hidden=32, iters=2, patch_grid=4, time_dim=16)
    model = HyperSETModel(cfg).eval()
    with torch.no_grad():
        model.core.step_sizes.L3.weight.normal_(0, 0.05)
    save_checkpoint(tmp_path / "ckpt", model, {"task": "classify", "data": {"dataset": "cifar10"}})
    runs = {}
    for name, extra in (("plain", []), ("after", ["--step-control", "backtrack", "--backtrack-from", "3"])):
        depth_ablation.main(["classifier", "--checkpoint", str(tmp_path / "ckpt"), "--data", str(data),
                             "--depth", "4", "--out", str(tmp_path / f"{name}.json"), *extra])
        runs[name] = json.loads((tmp_path / f"{name}.json").read_text())
    plain, after = runs["plain"], runs["after"]
    assert after["step_control"] == "backtrack" and after["backtrack_from"] == 3
    assert after["top1"]["T"] == plain["top1"]["T"]
    assert after["energy_never_rises"]["T"] == plain["energy_never_rises"]["T"]
    assert after["energy_never_rises"]["4T"] == after["energy_never_rises"]["T"]
    assert plain["energy_never_rises"]["4T"] < plain["energy_never_rises"]["T"]  # without it some rise after T
