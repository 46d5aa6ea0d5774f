"""Model configuration: one plain dataclass for every task, variant and baseline, plus named presets."""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

LAYERS = ("hyperset", "transformer", "crate", "crate-t", "et")
ATTENTIONS = ("bisoftmax", "sigmoid", "linear")
FEEDFORWARDS = ("relu", "softmax", "gated")
TASKS = ("sudoku", "classify", "mim")
TIME_INITS = ("live", "zero")
STEP_SIGNS = ("signed", "positive")
STEP_CONTROLS = ("none", "backtrack")
# Every string-valued choice of a ModelConfig, in one table: any other value is a ValueError naming the key and
# these choices (never a silent fallback). What each value means is documented on ModelConfig.
CHOICES: dict[str, tuple[str, ...]] = {
    "task": TASKS,
    "layer": LAYERS,
    "attention": ATTENTIONS,
    "feedforward": FEEDFORWARDS,
    "phi": ("sigmoid", "relu", "softplus", "elu1"),  # the keys of hyperset.energies.PHI
    "step": ("adaptive", "fixed"),
    "step_cond": ("x0", "xt"),
    "step_norm": ("none", "cond", "sum"),
    "time_init": TIME_INITS,
    "step_sign": STEP_SIGNS,
    "step_control": STEP_CONTROLS,
    "pos": ("learned", "grid", "sincos1d", "sincos2d"),
    "stem": ("ln-linear-ln", "linear"),
    "head_norm": ("rms", "layer"),
}
# The position codes each task's stem implements: the patch stem of "classify" has fixed 1-D sinusoidal positions
# (over CLS + patches) and nothing else.
TASK_POS: dict[str, tuple[str, ...]] = {
    "sudoku": CHOICES["pos"],
    "mim": CHOICES["pos"],
    "classify": ("sincos1d",),
}


def choice_error(section: str, key: str, value: Any, choices: Sequence[str], why: str = "") -> ValueError:
    """The one-line error for a value that is none of a key's choices: ``model.stem='conv': expected one of
    'ln-linear-ln', 'linear'`` (code that branches on a choice raises it past its last branch)."""
    return ValueError(f"{section}.{key}={value!r}: expected one of {', '.join(repr(c) for c in choices)}{why}")


def check_choice(section: str, key: str, value: Any, choices: Sequence[str], why: str = "") -> None:
    """A ValueError like ``model.stem='conv': expected one of 'ln-linear-ln', 'linear'`` unless value is a choice."""
    if value not in choices:
        raise choice_error(section, key, value, choices, why)


# Iterations per pass, from any source (a checkpoint, a recipe, a command line): far past any useful depth, and a
# typo'd 10**9 fails at once instead of running for days.
MAX_ITERS = 10_000
# sizes that must be >= 1 (checked before anything divides by them or allocates with them)
POSITIVE_SIZES = ("dim", "heads", "ff_hidden", "iters", "n_layers", "time_dim", "vocab_size", "num_classes",
                  "seq_len", "img_size", "patch_grid", "channels")
# and at most these (far above any model of the paper's: d=768, 1,000 classes, 256 tokens, 224 px), so that a
# config file received from someone else cannot make a loader allocate or build without end
MAX_SIZES = {"dim": 16_384, "heads": 1_024, "ff_hidden": 65_536, "n_layers": 64, "time_dim": 16_384,
             "vocab_size": 1 << 20, "num_classes": 1 << 20, "seq_len": 65_536, "img_size": 4_096,
             "patch_grid": 256, "channels": 64}
# the float settings, which must be finite (JSON readers accept NaN and Infinity)
FLOAT32_MAX = 3.4028234663852886e38
FINITE_FLOATS = ("step_init", "fixed_step", "lora_scale", "et_step", "norm_eps", "emb_dropout")


def check_iterations(value: Any, name: str) -> int:
    """An iteration count from any source: an int (not a bool) in 1..MAX_ITERS, else a ValueError naming `name`."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} = {value!r}: expected an integer number of iterations")
    if not 1 <= value <= MAX_ITERS:
        raise ValueError(f"{name} = {value}: must be between 1 and {MAX_ITERS:,}")
    return value


def whole_number(name: str, value: Any, least: int) -> int:
    """A count given in Python (passes, a batch size, decoding steps): an integer (not a bool, a float or a
    string) >= `least`, else a ValueError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}, got {value!r}")
    return int(value)


def _fits(value: Any, hint: Any) -> bool:
    """Whether a value fits a dataclass field's type (ints pass as floats; bools are not numbers)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
        return all(_fits(v, args[0]) for v in value) if args else True
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    return True  # types TOML/JSON cannot spell are not checked here


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


class TableError(ValueError):
    """A bad value or key of a table (a recipe section, a model config), with where it is: `section` (None at the
    top level) and `key`, so that a caller holding the file can point at its line."""

    def __init__(self, message: str, section: str | None, key: str) -> None:
        super().__init__(message)
        self.section, self.key = section, key


def require_table(value: Any, section: str) -> None:
    """A recipe's (or config's) `section` must be a table: `train = 5` is a TableError at the top level."""
    if not isinstance(value, dict):
        raise TableError(f"{section} = {value!r}: [{section}] must be a table of keys and values", None, section)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """A dataclass's field types, evaluated once per class (every preset is checked as the module loads)."""
    return typing.get_type_hints(cls)


def check_table(cls: type, table: dict[str, Any], section: str, known: Sequence[str] | None = None) -> None:
    """A table of values for dataclass `cls` (a recipe section, a checkpoint's model config): unknown keys and
    values of the wrong type are TableErrors (ValueErrors) that name `section.key`. `known` limits the keys that
    may be set (default: every field of `cls`)."""
    require_table(table, section)
    names = list(known) if known is not None else [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise TableError(f"unknown [{section}] keys: {', '.join(unknown)} (known: {', '.join(sorted(names))})",
                         section, unknown[0])
    hints = _type_hints(cls)
    for key, value in table.items():
        if key in hints and not _fits(value, hints[key]):
            raise TableError(f"{section}.{key} = {value!r}: expected {_type_name(hints[key])}", section, key)


@dataclass
class ModelConfig:
    """Everything that defines a model. Variants are values here, not subclasses.

    Args:
        task: "sudoku" (81 cells -> 9 digits), "classify" (patches + CLS -> classes), "mim" (VQ tokens -> codes).
        layer: the recurrent layer: "hyperset" or a baseline ("transformer", "crate", "crate-t", "et").
        dim: token dimension d.
        heads: number of subspaces H (p = d / H).
        ff_hidden: M, the number of feedforward bases (columns of D).
        iters: iterations per distinct layer in training (the trained depth when n_layers == 1).
        n_layers: distinct layers, each iterated `iters` times (layers x iterations).
        attention: attention energy: "bisoftmax" (eq. 3-4), "sigmoid" or "linear" (appendix, alternative designs).
        feedforward: feedforward energy: "relu" (eq. 5), "softmax" or "gated".
        phi: feature map for linear attention / gated feedforward ("sigmoid", "relu", "elu1", "softplus").
        step: "adaptive" (learned alpha_t, gamma_t, eq. 12) or "fixed" (alpha = gamma = fixed_step).
        step_cond: condition of the step-size network: "x0" (paper default) or "xt" (images).
        time_dim: sinusoidal embedding size of t.
        time_mlp: True: Linear(time_dim, d) -> GELU -> Linear(d, d) on the embedding (appendix table);
            False: the embedding is used directly (MIM; then time_dim must equal dim).
        step_norm: where an RMSNorm sits in the step network: "none" (Sudoku), "cond" (norm on the condition,
            images), "sum" (norm on embedding + condition, MIM).
        step_init: initial value of alpha and gamma (bias of the last zero-initialised Linear). The paper uses 0.
        time_init: initialisation of the time network L1, L2: "live" (PyTorch's default init; only the output
            layer L3 starts at zero, so the step sizes still start at step_init and every parameter of the network
            gets a gradient from the second step on) or "zero" (the authors' code: L1 = L2 = 0, which never
            move, so alpha and gamma do not depend on t at all).
        step_sign: "signed" (the paper: alpha, gamma of either sign) or "positive" (softplus of the same
            output, so every attention and feedforward step descends its energy by construction).
        step_control: "none" (the paper: every update taken as it is) or "backtrack": where an iteration's
            update would raise the sample's E_ATTN + E_FF (``HyperSETLayer.energy``), it is scaled by 1/2, 1/4, ...
            (``backtracks`` halvings) and, if every scale raises it, not taken; so the energy never rises, by
            construction. Each try costs one energy evaluation of the batch (about one iteration's work).
        backtracks: the halvings ``step_control = "backtrack"`` tries before it keeps the state.
        backtrack_from: the first iteration t the control applies to (1: every one); the updates before it are
            taken as they are. A Sudoku model's first update lifts the stem's embeddings onto the energy's landscape
            and raises E_ATTN + E_FF, so from t = 2 the control keeps the energy from rising over the iterations
            that the trace and the benchmarks count.
        time_max: the step-size network sees min(t, time_max) (0: t as it is). Iterations past time_max reuse
            the step sizes of t = time_max.
        fixed_step: alpha = gamma for step == "fixed".
        lora_rank: depth-wise LoRA rank r (0 = off); one adapter per iteration, scale lora_scale.
        et_step: Energy Transformer step size.
        norm_eps: RMSNorm epsilon.
        vocab_size: token vocabulary (Sudoku 10, MIM codebook + 1).
        num_classes: output classes (Sudoku 9, classification C, MIM codebook size).
        seq_len: tokens for "sudoku" and "mim" (grid side squared for mim).
        pos: position code: "learned", "grid" (learned + row/column/box embeddings, Sudoku), "sincos1d", "sincos2d"
            (a square token grid); a "classify" model's patch stem has fixed 1-D positions: "sincos1d" only.
        emb_dropout: dropout on the embedded input (the authors' Sudoku code keeps 0.1).
        img_size, patch_grid, channels: classification stem (patch_grid patches per side).
        stem: classification stem: "ln-linear-ln" (LayerNorm, Linear, LayerNorm: Hyper-SET) or "linear" (one
            Linear: baselines); other tasks embed tokens and do not read it.
        head_bias: bias in the output Linear.
        head_norm: "rms" (RMSNorm) or "layer" (LayerNorm) before the head.

    Every string-valued key takes one of the values in ``CHOICES``; anything else is a ValueError naming the key
    and the choices.
    """

    task: str = "sudoku"
    layer: str = "hyperset"
    dim: int = 768
    heads: int = 12
    ff_hidden: int = 3072
    iters: int = 24
    n_layers: int = 1
    attention: str = "bisoftmax"
    feedforward: str = "relu"
    phi: str = "sigmoid"
    step: str = "adaptive"
    step_cond: str = "x0"
    time_dim: int = 512
    time_mlp: bool = True
    step_norm: str = "none"
    step_init: float = 0.0
    time_init: str = "live"
    step_sign: str = "signed"
    step_control: str = "none"
    backtracks: int = 4
    backtrack_from: int = 1
    time_max: int = 0
    fixed_step: float = 0.1
    lora_rank: int = 0
    lora_scale: float = 4.0
    et_step: float = 1.0
    norm_eps: float = 1e-6
    vocab_size: int = 10
    num_classes: int = 9
    seq_len: int = 81
    pos: str = "learned"
    emb_dropout: float = 0.1
    img_size: int = 32
    patch_grid: int = 8
    channels: int = 3
    stem: str = "ln-linear-ln"
    head_bias: bool = False
    head_norm: str = "rms"

    def __post_init__(self) -> None:
        check_table(type(self), dataclasses.asdict(self), "model")  # first: a value of the wrong type, named
        for key in POSITIVE_SIZES:  # the checks below divide by them
            value, top = getattr(self, key), MAX_SIZES.get(key)
            if value < 1:
                raise ValueError(f"model.{key} = {value}: must be >= 1")
            if top is not None and value > top:
                raise ValueError(f"model.{key} = {value}: must be at most {top:,}")
        check_iterations(self.iters, "model.iters")
        for key in FINITE_FLOATS:  # each becomes a float32 parameter or buffer: finite there too, and a float
            value = getattr(self, key)
            try:
                number = float(value)
            except OverflowError:  # an integer beyond any float
                number = math.inf
            if not (math.isfinite(number) and abs(number) <= FLOAT32_MAX):
                raise ValueError(f"model.{key} = {number:.3g}: must be a finite number (at most {FLOAT32_MAX:.3g} in "
                                 "size, float32's range)")
            object.__setattr__(self, key, number)  # an integer in a config.json (1e30 written as 10**30) too
        for key, choices in CHOICES.items():
            check_choice("model", key, getattr(self, key), choices)
        check_choice("model", "pos", self.pos, TASK_POS[self.task], f" (the positions of a {self.task!r} model)")
        checks = [
            (self.dim % self.heads == 0, f"dim {self.dim} is not divisible by heads {self.heads}"),
            (self.pos != "grid" or self.seq_len == 81, "model.pos='grid' is for 9x9 Sudoku boards (seq_len 81)"),
            (self.pos != "sincos2d" or math.isqrt(self.seq_len) ** 2 == self.seq_len,
             f"model.pos='sincos2d' needs a square token grid, but seq_len = {self.seq_len}"),
            (self.pos != "sincos2d" or self.dim % 4 == 0,
             f"model.pos='sincos2d' needs dim divisible by 4 (row and column, sine and cosine), got {self.dim}"),
            (self.pos != "sincos1d" or self.dim % 2 == 0,
             f"model.pos='sincos1d' needs an even dim (sine and cosine), got {self.dim}"),
            (self.time_mlp or self.time_dim == self.dim, "without time_mlp, time_dim must equal dim"),
            (self.time_dim % 2 == 0, "time_dim must be even"),
            (self.step_sign == "signed" or self.step_init > 0,
             f"step_sign 'positive' needs step_init > 0 (softplus never reaches 0), got {self.step_init}"),
            (self.step_control == "none" or self.layer == "hyperset",
             f"step_control {self.step_control!r} controls the Hyper-SET layer's update; layer {self.layer!r} has "
             "its own"),
            (0 <= self.backtracks <= 16, f"model.backtracks = {self.backtracks}: must be between 0 and 16"),
            (1 <= self.backtrack_from <= MAX_ITERS,
             f"model.backtrack_from = {self.backtrack_from}: must be between 1 and {MAX_ITERS:,}"),
            (0 <= self.time_max <= MAX_ITERS,
             f"time_max must be between 0 (no limit) and {MAX_ITERS:,}, got {self.time_max}"),
            (0 <= self.lora_rank <= self.dim, f"model.lora_rank = {self.lora_rank}: must be between 0 (off) and dim"),
            (self.norm_eps > 0, f"model.norm_eps = {self.norm_eps}: must be > 0"),
            (0 <= self.emb_dropout < 1, f"model.emb_dropout = {self.emb_dropout}: must be in [0, 1)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def depth(self) -> int:
        """Total trained iterations: n_layers x iters."""
        return self.n_layers * self.iters

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        check_table(cls, data, "model")
        return cls(**data)

    def replace(self, **overrides: Any) -> ModelConfig:
        return dataclasses.replace(self, **overrides)


@dataclass(frozen=True)
class Preset:
    name: str
    config: ModelConfig
    paper_params: float | None  # millions, as printed in the paper; None when the paper gives no count
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    pretrained: str | None = None  # the shipped model (hyperset.pretrained.PRETRAINED) with this architecture


def _sudoku(**kw: Any) -> ModelConfig:
    return ModelConfig(task="sudoku", **kw)


def _cifar(num_classes: int = 10, **kw: Any) -> ModelConfig:
    base = dict(task="classify", dim=384, heads=6, ff_hidden=384, iters=12, num_classes=num_classes,
                img_size=32, patch_grid=8, pos="sincos1d", step_cond="xt", step_norm="cond", emb_dropout=0.0,
                head_norm="layer", head_bias=True)
    base.update(kw)
    return ModelConfig(**base)


def _baseline_cifar(layer: str, **kw: Any) -> ModelConfig:
    ff = {"transformer": 4 * 384, "et": 4 * 384}.get(layer, 384)
    return _cifar(layer=layer, stem="linear", ff_hidden=ff, **kw)


def _mim(**kw: Any) -> ModelConfig:
    base = dict(task="mim", dim=768, heads=12, ff_hidden=768, iters=12, vocab_size=1025, num_classes=1024,
                seq_len=256, pos="sincos2d", time_mlp=False, time_dim=768, step_norm="sum", emb_dropout=0.0,
                head_bias=True)
    base.update(kw)
    return ModelConfig(**base)


_PRESETS: dict[str, Preset] = {}


def _add(name: str, config: ModelConfig, paper: float | None, source: str, *notes: str,
         pretrained: str | None = None) -> None:
    _PRESETS[name] = Preset(name, config, paper, source, tuple(notes), pretrained)


_add("sudoku", _sudoku(), 5.20, "Table: model configuration for solving Sudoku")
_add("sudoku-transformer", _sudoku(layer="transformer"), 7.16, "Sudoku Transformer baseline (Sec. 4.1)")
_add("sudoku-crate", _sudoku(layer="crate", ff_hidden=768), 1.85, "Sudoku CRATE (authors' code)")
_add("sudoku-et", _sudoku(layer="et"), 3.62, "Sudoku Energy Transformer (authors' code)")
_add("sudoku-cpu", _sudoku(dim=128, heads=4, ff_hidden=512, iters=16, time_dim=128, pos="grid",
                           step_init=0.1, emb_dropout=0.0), None,
     "ours: the CPU recipe of the shipped model",
     "row/column/box position embeddings, step sizes start at 0.1, d=128", pretrained="sudoku")
_add("sudoku-cpu-transformer", _sudoku(layer="transformer", dim=128, heads=4, ff_hidden=512, iters=16,
                                       pos="grid", emb_dropout=0.0), None,
     "ours: Transformer baseline with the CPU recipe")
_add("cifar10-small", _cifar(), 0.96, "Table: model configuration for image classification (Small)")
_add("cifar10-small-scaleup", _cifar(dim=512, heads=8, ff_hidden=512), 1.61, "Table: scaling configurations")
_add("cifar10-base", _cifar(dim=768, heads=12, ff_hidden=768), None, "Table: scaling configurations (Base)")
_add("cifar100-small", _cifar(num_classes=100), None, "CIFAR-100, Small")
_add("cifar100-small-scaleup", _cifar(num_classes=100, dim=512, heads=8, ff_hidden=512), 1.66,
     "Table 1 (CIFAR-100, d=512)")
_add("imagenet100-small", _cifar(num_classes=100, img_size=224, patch_grid=16), 1.21,
     "Table: model configuration for ImageNet-100 (Small)")
_add("cifar10-transformer", _baseline_cifar("transformer"), 1.79, "Table 1 baselines (Small)")
_add("cifar10-crate", _baseline_cifar("crate"), 0.47, "Table 1 baselines (Small)")
_add("cifar10-crate-t", _baseline_cifar("crate-t"), 0.32, "Table 1 baselines (Small)")
_add("cifar10-et", _baseline_cifar("et"), 0.91, "Table 1 baselines (Small)")
_add("cifar10-cpu", _cifar(dim=192, heads=6, ff_hidden=192, time_dim=128, step_init=0.1), None,
     "ours: the CPU recipe of the shipped classifier", pretrained="classifier")
_add("mim-base", _mim(), 3.94, "Table: model configuration for masked image modeling")
_add("mim-base-24x8", _mim(iters=24, ff_hidden=8 * 768), 8.07, "MIM, 24 iterations, M=8d (authors' scripts)")
_add("mim-transformer", _mim(layer="transformer", ff_hidden=4 * 768), 8.85, "MIM Transformer baseline",
     "the authors' code gives 8.655 M for this configuration; the paper prints 8.85 M")
_add("mim-cpu", _mim(dim=256, heads=8, ff_hidden=512, iters=12, time_dim=256, vocab_size=513, num_classes=512,
                     seq_len=64, step_init=0.1), None, "ours: CIFAR-10 8x8 tokens, d=256")
_add("mim-cpu-small", _mim(dim=128, heads=4, ff_hidden=256, iters=12, time_dim=128, vocab_size=513, num_classes=512,
                           seq_len=64, step_init=0.1), None,
     "ours: CIFAR-10 8x8 tokens, d=128, the shipped token model", pretrained="mim")


def list_presets(pretrained: bool = False) -> list[str]:
    """Names of every preset; with `pretrained`, of those whose architecture a shipped model has (create_model(name,
    pretrained=True) loads its weights)."""
    return sorted(k for k, v in _PRESETS.items() if v.pretrained or not pretrained)


def get_preset(name: str) -> Preset:
    if name not in _PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose from: {', '.join(list_presets())}")
    return _PRESETS[name]


def preset_config(name: str, **overrides: Any) -> ModelConfig:
    return get_preset(name).config.replace(**overrides)
