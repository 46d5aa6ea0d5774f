"""Model config choices are validated in one place: an unknown value is a one-line error naming the key and the
choices, and every shipped config and recipe still validates."""

import json
import re
from importlib import resources
from pathlib import Path

import pytest

import hyperset
from hyperset.config import CHOICES, TASK_POS, ModelConfig, get_preset, list_presets
from hyperset.models import HyperSETModel

WEIGHTS = Path(hyperset.__file__).parent / "weights"


def _base(task: str) -> dict:
    return {"sudoku": get_preset("sudoku-cpu"), "classify": get_preset("cifar10-cpu"),
            "mim": get_preset("mim-cpu")}[task].config.to_dict()


@pytest.mark.parametrize("key", sorted(CHOICES))
def test_an_unknown_value_names_the_key_and_every_choice(key):
    data = {**_base("sudoku"), key: "bogus"}
    with pytest.raises(ValueError) as info:
        ModelConfig.from_dict(data)
    message = str(info.value)
    assert message.startswith(f"model.{key}='bogus': expected one of ")
    assert "\n" not in message
    for choice in CHOICES[key]:
        assert repr(choice) in message


def test_the_error_reads_as_documented():
    with pytest.raises(ValueError, match=r"^model\.stem='conv': expected one of 'ln-linear-ln', 'linear'$"):
        ModelConfig(**{**_base("classify"), "stem": "conv"})


@pytest.mark.parametrize("pos", [p for p in CHOICES["pos"] if p not in TASK_POS["classify"]])
def test_a_patch_stem_accepts_only_the_positions_it_implements(pos):
    with pytest.raises(ValueError, match=r"model\.pos=.*expected one of 'sincos1d'.*classify"):
        ModelConfig(**{**_base("classify"), "pos": pos})


def test_token_positions_that_cannot_fit_the_sequence_are_config_errors():
    with pytest.raises(ValueError, match="grid"):
        ModelConfig(**{**_base("mim"), "pos": "grid"})  # seq_len 64: not a Sudoku board
    with pytest.raises(ValueError, match="square"):
        ModelConfig(**{**_base("sudoku"), "pos": "sincos2d", "seq_len": 80})


@pytest.mark.parametrize("preset, overrides, message", [
    ("mim-cpu", dict(dim=18, heads=2, time_dim=18), "sincos2d' needs dim divisible by 4"),
    ("sudoku-cpu", dict(dim=18, heads=3, pos="sincos2d"), "sincos2d' needs dim divisible by 4"),
    ("cifar10-cpu", dict(dim=15, heads=3), "sincos1d' needs an even dim"),
])
def test_fixed_position_codes_that_cannot_fill_the_width_are_config_errors(preset, overrides, message):
    with pytest.raises(ValueError, match=message):
        hyperset.create_model(preset, **overrides)
    for dim in (16, 20):  # widths they fill build and run
        model = hyperset.create_model(preset, **{**overrides, "dim": dim, "heads": 2, "time_dim": dim})
        assert model.stem.pos.shape[-1] == dim


def test_every_accepted_stem_and_head_norm_means_what_it_says():
    import torch.nn as nn

    from hyperset.layers import RMSNorm

    for stem, first in (("ln-linear-ln", nn.Sequential), ("linear", nn.Linear)):
        model = HyperSETModel(ModelConfig(**{**_base("classify"), "stem": stem}))
        assert type(model.stem.embed) is first
    for head_norm, kind in (("rms", RMSNorm), ("layer", nn.LayerNorm)):
        assert type(HyperSETModel(ModelConfig(**{**_base("sudoku"), "head_norm": head_norm})).head_norm) is kind
    for task, stem in (("sudoku", "TokenStem"), ("mim", "TokenStem"), ("classify", "PatchStem")):
        assert type(HyperSETModel(ModelConfig(**_base(task))).stem).__name__ == stem


@pytest.mark.parametrize("task, key", [("classify", "stem"), ("sudoku", "head_norm"), ("classify", "head_norm"),
                                       ("sudoku", "task"), ("sudoku", "pos"), ("mim", "pos")])
def test_the_model_branches_on_every_choice_and_names_any_other_value(task, key):
    """A config changed after its checks (a plain dataclass) reaches the model: a value that is no choice is the
    same one-line error there, never a silent fallback to one of the choices."""
    cfg = ModelConfig(**_base(task))
    setattr(cfg, key, "bogus")
    message = f"model.{key}='bogus': expected one of " + ", ".join(repr(c) for c in CHOICES[key])
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        HyperSETModel(cfg)


@pytest.mark.parametrize("name", list_presets())
def test_every_preset_validates(name):
    cfg = get_preset(name).config
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


SHIPPED = sorted([*WEIGHTS.glob("*/config.json"), *WEIGHTS.glob("mim/*/config.json")])


@pytest.mark.parametrize("path", SHIPPED, ids=[str(p.relative_to(WEIGHTS)) for p in SHIPPED])
def test_every_shipped_config_validates(path):
    meta = json.loads(path.read_text())
    if meta.get("kind", "hyperset") != "hyperset":
        pytest.skip(f"a {meta.get('kind')} checkpoint has no model config")
    from hyperset.models import load_checkpoint

    model, _ = load_checkpoint(path.parent)
    assert model.cfg == ModelConfig.from_dict(model.cfg.to_dict())


RECIPES = sorted(p.name for p in (resources.files("hyperset.training") / "recipes").iterdir()
                 if p.name.endswith(".toml"))


@pytest.mark.parametrize("name", [r[: -len(".toml")] for r in RECIPES])
def test_every_recipe_validates(name):
    from hyperset.training.cli import model_config
    from hyperset.training.epochs import epochs_to_steps
    from hyperset.training.recipes import load_recipe
    from hyperset.training.trainer import TrainConfig

    _, recipe = load_recipe(name)
    cfg = model_config(recipe)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    train = dict(recipe.get("train", {}))
    epochs_to_steps(train, 50_000)
    TrainConfig.from_dict(train)


def test_task_choices_name_the_key_and_the_choices_too():
    from hyperset.training.classify_task import ClassifyData
    from hyperset.training.mim_task import build_mim_task

    with pytest.raises(ValueError, match=r"^data\.dataset='mnist': expected one of 'cifar10', 'cifar100', 'imagenet"):
        ClassifyData(dataset="mnist")
    with pytest.raises(ValueError, match=r"^data\.eval_mode='crop': expected one of 'resize', 'resize_center_crop'$"):
        ClassifyData(eval_mode="crop")
    stages = r"^objective\.stage='pixels': expected one of 'tokenizer', 'tokens', 'decoder'$"
    with pytest.raises(ValueError, match=stages):
        build_mim_task(get_preset("mim-cpu").config, {"objective": {"stage": "pixels"}}, "")


@pytest.mark.parametrize("overrides, message", [
    ({"time_mlp": "no"}, "model.time_mlp = 'no': expected bool"),
    ({"head_bias": 1}, "model.head_bias = 1: expected bool"),
    ({"n_layers": True}, "model.n_layers = True: expected int"),
    ({"dim": 64.0}, "model.dim = 64.0: expected int"),
    ({"step_init": "0"}, "model.step_init = '0': expected float"),
    ({"et_step": None}, "model.et_step = None: expected float"),
    ({"norm_eps": -1.0}, "model.norm_eps = -1.0: must be > 0"),
    ({"emb_dropout": 1.0}, "model.emb_dropout = 1.0: must be in [0, 1)"),
])
def test_a_config_of_the_wrong_type_or_range_is_refused_when_built_not_when_reloaded(overrides, message):
    """The constructor checks what loading a checkpoint checks: a model that builds also reloads."""
    with pytest.raises(ValueError) as info:
        ModelConfig(**{"task": "sudoku", "dim": 32, "heads": 4, **overrides})
    assert str(info.value) == message
    with pytest.raises(ValueError, match=re.escape(message)):
        hyperset.create_model("sudoku-cpu", **overrides)
