"""The models shipped in the package load offline, are what their config.json says, and carry their provenance
(recipe, steps, measured validation metrics), so a clean clone can run every default command."""

from __future__ import annotations

import json

import pytest
import torch

from hyperset.checkpoint import read_config
from hyperset.models import load_checkpoint
from hyperset.solve import Solver, bundled_checkpoint
from hyperset.training.eval_classify import resolve_checkpoint
from hyperset.vision.reconstruct import load_mim


def test_shipped_sudoku_model_solves_an_easy_puzzle_and_records_its_training() -> None:
    meta = read_config(bundled_checkpoint())
    assert meta["model"]["task"] == "sudoku" and meta["recipe"] == "sudoku-cpu-deep" and meta["steps"] > 0
    assert meta["metrics"]["val/board_acc@16"] > 0.6  # one pass at the trained depth (64.9% on its validation split)
    assert meta["metrics"]["val/board_acc@64"] > meta["metrics"]["val/board_acc@16"]  # and more at 4x that depth
    solver = Solver.load(None, "cpu")
    easy = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
    (result,) = solver.solve([easy])
    assert result.valid and result.prediction.startswith("534678912")


def test_shipped_classifier_loads_and_says_how_far_it_was_trained() -> None:
    folder = resolve_checkpoint(None)
    model, meta = load_checkpoint(folder, task="classify")
    # the mean of two fine-tunes (hyperset-train average): each one's recipe and steps
    sources = meta["averaged_from"]
    assert len(sources) == 2 and sum(s["weight"] for s in sources) == pytest.approx(1.0)
    assert all(s["recipe"] and s["steps"] > 0 for s in sources)
    # past the trained depth the step-length control keeps E_ATTN + E_FF from rising
    assert (model.cfg.step_control, model.cfg.backtrack_from) == ("backtrack", model.cfg.iters + 1)
    test = meta["test"]  # measured with hyperset-eval classify on the CIFAR-10 test set, copied into the file
    assert test["images"] == 10000 and 0.0 < test["top1"] <= 1.0 and test["iters"] == 12
    assert 0.0 < test["top1@48"] <= 1.0
    with torch.no_grad():
        logits = model(torch.zeros(2, 3, 32, 32))
    assert logits.shape == (2, 10)
    assert (folder / "model.safetensors").stat().st_size < 2_000_000  # small enough to ship


def test_shipped_mim_models_load_with_their_tokenizer() -> None:
    pipeline = load_mim(None, device=torch.device("cpu"))
    assert pipeline is not None
    meta = json.loads((bundled_checkpoint().parent / "mim" / "model" / "config.json").read_text())
    assert meta["model"]["task"] == "mim" and meta["recipe"] in ("mim-cpu", "mim-cpu-deep")
