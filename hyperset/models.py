"""Task models: a stem that embeds the input, the recurrent core, and a head. One class for all tasks."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import tempfile
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .checkpoint import (
    MODELS,
    RESERVED_INFO,
    CheckpointError,
    atomic_write_bytes,
    check_weights_fit,
    checkpoint_dir,
    is_shipped,
    load_weights_into,
    read_config,
    resolve,
    save_module,
    stored_float_dtype,
)
from .config import CHOICES, ModelConfig, choice_error, get_preset, list_presets
from .core import RecurrentCore, Trace, relay, traced_energy
from .device import in_graph, pick_device
from .extras import require
from .files import package_version
from .layers import RMSNorm


def sincos_1d(n: int, dim: int) -> Tensor:
    """Vaswani positions, sin and cos interleaved: (n, dim)."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(n, dim)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


def sincos_2d(side: int, dim: int) -> Tensor:
    """MAE-style fixed 2-D positions: half the channels encode the row, half the column: (side*side, dim)."""
    half = dim // 2
    quarter = half // 2
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    rows, cols = torch.meshgrid(torch.arange(side, dtype=torch.float32),
                                torch.arange(side, dtype=torch.float32), indexing="ij")

    def encode(coord: Tensor) -> Tensor:
        angles = coord.reshape(-1, 1) * omega
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    return torch.cat([encode(rows), encode(cols)], dim=1)


class TokenStem(nn.Module):
    """Token embedding + positions, for Sudoku cells (vocab 10) and VQ codes (codebook + mask token)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, n = cfg.dim, cfg.seq_len
        self.tok = nn.Embedding(cfg.vocab_size, d)
        nn.init.normal_(self.tok.weight, std=0.02)
        if cfg.pos in ("learned", "grid"):
            self.pos = nn.Parameter(torch.randn(n, d) * 0.02)
        elif cfg.pos == "sincos2d":
            self.register_buffer("pos", sincos_2d(int(math.isqrt(n)), d), persistent=False)
        elif cfg.pos == "sincos1d":
            self.register_buffer("pos", sincos_1d(n, d), persistent=False)
        else:
            raise choice_error("model", "pos", cfg.pos, CHOICES["pos"])
        if cfg.pos == "grid":  # Sudoku structure: learned row, column and box embeddings
            if n != 81:
                raise ValueError("pos='grid' is for 9x9 Sudoku boards (seq_len 81)")
            cell = torch.arange(81)
            self.register_buffer("cell_index", torch.stack([cell // 9, cell % 9, (cell // 27) * 3 + (cell % 9) // 3]),
                                 persistent=False)
            self.grid = nn.Parameter(torch.randn(3, 9, d) * 0.02)
        self.drop = nn.Dropout(cfg.emb_dropout)

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.dtype != torch.long:  # any integer ids (the board helpers give uint8), as the embedding wants
            tokens = tokens.long()
        x = self.tok(tokens) + self.pos
        if self.cfg.pos == "grid":
            r, c, b = self.cell_index
            x = x + self.grid[0, r] + self.grid[1, c] + self.grid[2, b]
        return self.drop(x)


class PatchStem(nn.Module):
    """Image -> patch tokens (patch_grid x patch_grid) + CLS token + fixed sinusoidal 1-D positions."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.img_size % cfg.patch_grid:
            raise ValueError(f"img_size {cfg.img_size} is not divisible by patch_grid {cfg.patch_grid}")
        self.patch = cfg.img_size // cfg.patch_grid
        f = self.patch * self.patch * cfg.channels
        if cfg.stem == "ln-linear-ln":
            self.embed = nn.Sequential(nn.LayerNorm(f), nn.Linear(f, cfg.dim), nn.LayerNorm(cfg.dim))
        elif cfg.stem == "linear":
            self.embed = nn.Linear(f, cfg.dim)
        else:
            raise choice_error("model", "stem", cfg.stem, CHOICES["stem"])
        self.cls = nn.Parameter(torch.randn(1, 1, cfg.dim))
        self.register_buffer("pos", sincos_1d(cfg.patch_grid**2 + 1, cfg.dim), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        b, c, h, w = images.shape
        g, p = self.cfg.patch_grid, self.patch
        # (B, C, g, p, g, p) -> (B, g*g, p*p*C): patches in row-major order, features (row, col, channel)
        patches = images.reshape(b, c, g, p, g, p).permute(0, 2, 4, 3, 5, 1).reshape(b, g * g, p * p * c)
        x = self.embed(patches)
        x = torch.cat([self.cls.expand(b, -1, -1), x], dim=1)
        return x + self.pos


def make_stem(cfg: ModelConfig) -> nn.Module:
    """The stem of cfg.task: patches of an image for "classify", token embeddings for "sudoku" and "mim"."""
    if cfg.task == "classify":
        return PatchStem(cfg)
    if cfg.task in ("sudoku", "mim"):
        return TokenStem(cfg)
    raise choice_error("model", "task", cfg.task, CHOICES["task"])


def make_head_norm(cfg: ModelConfig) -> nn.Module:
    """The norm before the head: "rms" (RMSNorm) or "layer" (LayerNorm)."""
    if cfg.head_norm == "rms":
        return RMSNorm(cfg.dim, cfg.norm_eps)
    if cfg.head_norm == "layer":
        return nn.LayerNorm(cfg.dim)
    raise choice_error("model", "head_norm", cfg.head_norm, CHOICES["head_norm"])


@dataclass
class ModelOutput:
    logits: Tensor
    trace: Trace | None = None
    all_logits: list[Tensor] | None = None  # one per iteration, when requested
    energies: list[Tensor] | None = None  # E_ATTN + E_FF (B,) per iteration, with gradient, when requested


@dataclass
class Frame:
    """One iteration of the recurrence, as `HyperSETModel.frames` yields it.

    t is the iteration of the current layer (1-based; it restarts for every distinct layer), layer the index of
    that layer, step the number of updates so far over all layers (1-based). state is x_t (B, N, d), logits the
    head's readout of x_t, energies {"attn": (B,), "ff": (B,)} when requested (empty for layers without one).
    """

    t: int
    layer: int
    step: int
    state: Tensor
    logits: Tensor | None = None
    energies: dict[str, Tensor] | None = None


class HyperSETModel(nn.Module):
    """stem -> RecurrentCore -> head. `iters` is a run-time argument everywhere."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.stem = make_stem(cfg)
        self.core = RecurrentCore(cfg)
        self.head_norm = make_head_norm(cfg)
        self.head = nn.Linear(cfg.dim, cfg.num_classes, bias=cfg.head_bias)
        nn.init.normal_(self.head.weight, std=0.02)
        if cfg.head_bias:
            nn.init.zeros_(self.head.bias)

    def set_step_control(self, step_control: str | None = None, backtrack_from: int | None = None) -> None:
        """Switch the step-length control at inference (``ModelConfig.step_control``, ``backtrack_from``; None
        keeps the current value): e.g. ``("backtrack", 2)`` keeps E_ATTN + E_FF from rising from the first
        update on, ``("none")`` runs the paper's updates as they are. Checked as a config is (ValueError); the
        model's parts share its one config object, so every layer follows."""
        changes = {k: v for k, v in (("step_control", step_control), ("backtrack_from", backtrack_from))
                   if v is not None}
        self.cfg.replace(**changes)  # the config's own checks
        for key, value in changes.items():
            setattr(self.cfg, key, value)

    def readout(self, x: Tensor) -> Tensor:
        if self.cfg.task == "classify":
            x = x[:, 0]  # the CLS token
        return self.head(self.head_norm(x))

    def check_inputs(self, inputs: Any) -> None:
        """What `run`, `frames` and `forward` take, checked up front (TypeError / ValueError naming `inputs`):
        token ids of shape (batch, seq_len) with values in 0..vocab_size-1 for Sudoku and MIM (Sudoku: 0 = blank,
        1-9 the digits; the values in eval mode only: in training mode reading them would stop the device at every
        step), float images (batch, channels, img_size, img_size) for classification. Skipped in a trace, an export
        or under torch.compile, where the shapes are the graph's."""
        if in_graph():
            return
        if not isinstance(inputs, Tensor):
            raise TypeError(f"inputs must be a torch.Tensor, got {type(inputs).__module__}.{type(inputs).__name__}"
                            " (torch.as_tensor(...) makes one)")
        cfg = self.cfg
        if cfg.task == "classify":
            want = (cfg.channels, cfg.img_size, cfg.img_size)
            if not inputs.is_floating_point():
                raise TypeError(f"inputs: expected float images, got {inputs.dtype}")
            if inputs.dim() != 4 or tuple(inputs.shape[1:]) != want or len(inputs) == 0:
                raise ValueError(f"inputs: expected images of shape (batch >= 1, {', '.join(map(str, want))}), got "
                                 f"{tuple(inputs.shape)}")
            return
        if inputs.is_floating_point() or inputs.is_complex() or inputs.dtype == torch.bool:
            raise TypeError(f"inputs: expected integer token ids (torch.long or another integer dtype), got "
                            f"{inputs.dtype}")
        if inputs.dim() != 2 or inputs.shape[1] != cfg.seq_len or len(inputs) == 0:
            raise ValueError(f"inputs: expected shape (batch >= 1, {cfg.seq_len}), got {tuple(inputs.shape)}"
                             + (" (a board is 81 cells in one row: reshape(-1, 81))" if cfg.task == "sudoku" else ""))
        if self.training:  # a training batch: from the checked data pipeline, and reading values back would sync
            return
        if torch._C._are_functorch_transforms_active():  # under vmap the values cannot be read back
            return
        lo, hi = (int(v) for v in torch.aminmax(inputs))
        if lo < 0 or hi >= cfg.vocab_size:
            raise ValueError(f"inputs: token ids must be in 0..{cfg.vocab_size - 1}, got values from {lo} to {hi}")

    def run(self, inputs: Tensor, iters: int | None = None, trace: bool = False, geometry: bool = False,
            all_logits: bool = False, skip: int = 0, detach_every: int = 0, energies: bool = False) -> ModelOutput:
        """The forward pass with what it can record: a :class:`ModelOutput` with the logits after the last
        iteration, and optionally the trace and every iteration's logits.

        inputs: token ids (B, seq_len) for Sudoku (0 = blank, 1-9 the digits) and MIM, float images (B, C, H, W)
        for classification (`check_inputs`). iters: the number of iterations, per layer (the config's ``iters`` when
        None; any whole number 0-10,000, past the trained depth too; 0 reads out the stem). trace: record the energies
        E_ATTN and E_FF after every iteration (``out.trace.energy`` / ``out.trace.stacked()``); geometry: also
        the effective rank and average angle of the heads (eqs. 17-18). all_logits: keep every iteration's
        logits (``out.all_logits``, a list of T tensors). skip, detach_every: the depth-training options of
        ``RecurrentCore.iterate`` (`skip` iterations run first without gradient and are not recorded;
        `detach_every` = k cuts the graph every k iterations). energies: keep E_ATTN + E_FF of every iteration's
        state with its gradient (``out.energies``, for a training objective; the trace's are detached). Gradients
        flow as usual unless called under ``torch.no_grad()``."""
        self.check_inputs(inputs)
        out = self.core.run(self.stem(inputs), iters, trace=trace, geometry=geometry, keep_states=all_logits,
                            skip=skip, detach_every=detach_every, energies=energies)
        per_iter = [self.readout(s) for s in out.states] if all_logits else None
        return ModelOutput(self.readout(out.x), out.trace, per_iter, out.energies)

    def frames(self, inputs: Tensor, iters: int | None = None, energies: bool = False,
               logits: bool = True) -> Generator[Frame, Tensor | None, None]:
        """The forward pass one iteration at a time, in the spirit of timm's ``forward_intermediates``: a
        :class:`Frame` after every update of the core (state, readout, and the energies of the state when
        ``energies``). The last frame's logits are ``forward(inputs, iters)``'s; the energies are those that
        ``run(trace=True)`` records. Rows to keep may be sent, as to :meth:`RecurrentCore.iterate`: the frames
        after it cover those rows only."""
        index = {id(layer): k for k, layer in enumerate(self.core.layers)}
        steps = itertools.count(1)

        def frame(item: tuple[nn.Module, int, Tensor]) -> Frame:
            layer, t, x = item
            e = traced_energy(layer, x, t, self.cfg) if energies else None
            return Frame(t, index[id(layer)], next(steps), x, self.readout(x) if logits else None, e)

        self.check_inputs(inputs)
        return relay(self.core.iterate(self.stem(inputs), iters), frame)

    def forward(self, inputs: Tensor, iters: int | None = None, all_logits: bool = False, skip: int = 0,
                detach_every: int = 0, energies: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Logits of `inputs` (as `run` takes them) after `iters` iterations; with all_logits, the logits of every
        iteration stacked: (T, B, ...).

        `skip` and `detach_every` are the core's depth-training options (RecurrentCore.iterate): with them the
        logits are those of iterations skip+1 .. skip+iters. With `energies` (a training objective's), the pair
        (those logits, E_ATTN + E_FF of every iteration's state with its gradient, (T, B)).
        """
        out = self.run(inputs, iters, all_logits=all_logits, skip=skip, detach_every=detach_every, energies=energies)
        if not all_logits:
            logits = out.logits
        elif out.all_logits:
            logits = torch.stack(out.all_logits)
        else:  # iters=0: no iteration, so (0, B, ...)
            logits = out.logits.new_empty((0, *out.logits.shape))
        if not energies:
            return logits
        return logits, torch.stack(out.energies) if out.energies else logits.new_empty((0, len(inputs)))

    def num_parameters(self) -> int:
        """The number of parameters (the counts docs/model.md compares with the paper's)."""
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_pretrained(cls, name_or_path: str, device: Any = "cpu", dtype: Any = None) -> HyperSETModel:
        """A shipped model by name ("sudoku", "classifier", "mim"), a checkpoint folder, or a Hub repository id;
        ``dtype`` as for :func:`hyperset.load_pretrained` (float32 unless "saved" or a torch.dtype)."""
        return load_pretrained(name_or_path, device, dtype)

    def save_pretrained(self, directory: str, info: dict[str, Any] | None = None, card: bool = True) -> None:
        """Write model.safetensors + config.json (the checkpoint format every loader reads) and, with `card`, a
        model card (README.md with a Hugging Face Hub metadata header). A model loaded from a checkpoint keeps
        what its config.json said (the inference defaults such as solve_iterations, the metrics, the recipe)
        and records where it came from (`derived_from`); `info` goes on top."""
        kept = dict(getattr(self, "checkpoint_info", None) or {})
        source = getattr(self, "checkpoint_source", None)
        if source is not None:
            kept["derived_from"] = source
        meta = {"trained_iterations": self.cfg.iters, **kept, **(info or {})}
        save_checkpoint(directory, self, meta)
        if card:
            atomic_write_bytes(Path(directory) / "README.md", model_card(self, meta).encode())

    def push_to_hub(self, repo_id: str, token: str | None = None, private: bool = False,
                    commit_message: str = "Upload Hyper-SET model") -> Any:
        """save_pretrained's files, uploaded to the Hugging Face Hub repository `repo_id`: see
        :func:`hyperset.pretrained.push_to_hub` (the [hub] extra)."""
        return push_to_hub(self, repo_id, token=token, private=private, commit_message=commit_message)


# task -> its tag on the Hugging Face Hub (the model card's metadata header)
HUB_TAGS = {"sudoku": "sudoku", "classify": "image-classification", "mim": "masked-image-modeling"}


def card_header(task: str) -> str:
    """The Hugging Face Hub metadata header of a model card of a `task` model (YAML between two --- lines): the
    library, the license and the tags. save_pretrained writes it; the shipped cards (hyperset/weights) begin with it."""
    tags = ["hyperset", "energy-based-model", HUB_TAGS.get(task, task)]
    return "\n".join(["---", "library_name: hyperset", "license: mit", "tags:", *(f"- {t}" for t in tags), "---", ""])


def model_card(model: HyperSETModel, info: dict[str, Any]) -> str:
    """A short model card: the Hub metadata header (`card_header`), what the model is, its inference defaults and
    measured metrics as config.json records them, and how to load it."""
    cfg = model.cfg
    params = sum(p.numel() for p in model.parameters())
    task = {"sudoku": "Sudoku", "classify": "image classification", "mim": "masked image modeling"}.get(cfg.task,
                                                                                                       cfg.task)
    lines = ["", f"# Hyper-SET {task} model", "",
             f"{cfg.n_layers} {cfg.layer} layer(s) (d={cfg.dim}, {cfg.heads} heads, feedforward {cfg.ff_hidden}), "
             f"weights shared across iterations, trained at {info.get('trained_iterations', cfg.iters)} "
             f"iterations; {params:,} parameters.", ""]
    facts = [(k, info[k]) for k in ("recipe", "steps", "solve_iterations", "search_iterations", "derived_from")
             if info.get(k) is not None]
    metrics = info.get("metrics")
    if isinstance(metrics, dict):
        facts += [(f"metric {k}", round(v, 4)) for k, v in metrics.items() if isinstance(v, (int, float))][:12]
    if facts:
        lines += ["| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in facts), ""]
    lines += ["```python", "import hyperset", "model = hyperset.load_pretrained(\"path/to/this/folder\")", "```", ""]
    return card_header(cfg.task) + "\n".join(lines)


def build_model(cfg: ModelConfig) -> HyperSETModel:
    return HyperSETModel(cfg)


def create_model(name: str, pretrained: bool = False, **overrides: Any) -> HyperSETModel:
    """A model from a named preset (see `list_presets()`), with config overrides: create_model("sudoku", iters=32).

    With pretrained=True the preset's shipped weights are loaded (presets that have them: `list_presets(pretrained=
    True)`; "sudoku-cpu" is the shipped Sudoku model's architecture, "sudoku" the paper's): the same architecture
    as create_model(name), trained. No overrides then: they would not fit the weights."""
    preset = get_preset(name)
    if pretrained:
        if overrides:
            raise ValueError(f"create_model({name!r}, pretrained=True) takes no config overrides "
                             f"({', '.join(overrides)}): the shipped weights fix the config")
        if preset.pretrained is None:
            with_weights = ", ".join(list_presets(pretrained=True))
            raise ValueError(f"preset {name!r} has no shipped weights; presets with them: {with_weights} "
                             "(or hyperset.load_pretrained(folder) for a checkpoint of your own)")
        return load_pretrained(preset.pretrained)
    return HyperSETModel(preset.config.replace(**overrides))


# ---------------------------------------------------------------------------------------------------------------
# checkpoints: a model saved and loaded (the format and the folders are hyperset.checkpoint's)


def save_checkpoint(directory: str | os.PathLike, model: HyperSETModel, info: dict[str, Any] | None = None) -> Path:
    """Write model.safetensors + config.json. `info` (recipe, data, metrics, ...) goes into config.json."""
    return save_module(directory, model, "hyperset", model.cfg.to_dict(), info)


# the largest model a checkpoint may describe, weights and buffers in float32 (the shipped ones are under 1 MiB,
# the paper's largest about 0.1 GiB)
MAX_MODEL_BYTES = 8 << 30


def model_bytes(model: torch.nn.Module) -> int:
    """The bytes of a model's parameters and buffers (a model built on the meta device allocates none)."""
    return sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))


def shapes_only(directory: Path) -> contextlib.AbstractContextManager:
    """Where a loader builds the model of checkpoint `directory` to check its shapes and size before loading: on the
    meta device, so that a config that disagrees with its weights allocates nothing. The package's own models (every
    check still runs on them, and the tests load each) are built for real, once: building on the meta device imports
    torch._dynamo for its Python meta kernels, about as long as importing torch."""
    return contextlib.nullcontext() if is_shipped(directory) else torch.device("meta")


def load_checkpoint(directory: str | os.PathLike, task: str | None = None,
                    map_location: str | torch.device = "cpu", dtype: torch.dtype | str | None = None
                    ) -> tuple[HyperSETModel, dict[str, Any]]:
    """Load a checkpoint folder (or its config.json / model.safetensors path). Returns (model in eval mode, info).

    The weights load in float32 (what every command runs), whatever they were saved in; ``dtype="saved"`` keeps
    the floating dtype they were saved in (a float64 or bfloat16 model stays one), a torch.dtype casts to it."""
    if dtype is not None and dtype != "saved" and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype = {dtype!r}: expected None (float32), 'saved' or a floating torch.dtype")
    directory = checkpoint_dir(directory)
    meta = read_config(directory, kind="hyperset")
    try:
        cfg = ModelConfig.from_dict(meta["model"])
        with shapes_only(directory):
            shapes = HyperSETModel(cfg)
    except (TypeError, ValueError, OverflowError, RuntimeError) as e:
        reason = (str(e) or type(e).__name__).splitlines()[0]  # torch's errors carry C++ frames after the first line
        raise CheckpointError(f"{directory / 'config.json'}: invalid model config ({reason})") from None
    size = model_bytes(shapes)
    if size > MAX_MODEL_BYTES:  # the position tables are buffers no weight file holds: the header cannot tell
        raise CheckpointError(f"{directory / 'config.json'}: describes a model of {size / 2**30:.1f} GiB (weights and "
                              f"position tables); a checkpoint is at most {MAX_MODEL_BYTES / 2**30:.0f} GiB")
    if task is not None and cfg.task != task:
        raise CheckpointError(f"{directory}: this is a {cfg.task!r} model, expected a {task!r} model")
    what = f"weights of a {cfg.layer} {cfg.task} model"
    try:
        check_weights_fit(shapes, directory, what)
    except CheckpointError as e:
        absent = sorted(set(cfg.to_dict()) - set(meta["model"]))
        if not absent:
            raise
        raise CheckpointError(f"{e}; config.json lacks the model keys {', '.join(absent)} (defaults were "
                              "assumed)") from None
    model = shapes if is_shipped(directory) else HyperSETModel(cfg)
    cast = stored_float_dtype(directory) if dtype == "saved" else dtype
    if cast is not None:
        model.to(cast)
    load_weights_into(model, directory, what)
    model.to(map_location).eval()
    # what save_pretrained keeps: the inference defaults (solve_iterations, ...) and the provenance
    model.checkpoint_info = {k: v for k, v in meta.items() if k not in RESERVED_INFO}
    model.checkpoint_source = str(directory)
    return model, meta


def load_pretrained(name_or_path: str | os.PathLike, device: Any = "cpu", dtype: torch.dtype | str | None = None
                    ) -> Any:
    """A Hyper-SET model (eval mode) by shipped name ("sudoku", "classifier", "mim"), folder or Hub id, on `device`
    ("auto", "cpu", "cuda", "cuda:N", "mps" or a torch.device; one that cannot be had is a ValueError), in float32
    (``dtype="saved"``: the dtype its weights were saved in; a torch.dtype: that one)."""
    if name_or_path == "mim-tokenizer":
        raise CheckpointError("'mim-tokenizer' is the MIM model's VQ tokenizer, not a Hyper-SET model: load it with "
                              "hyperset.vision.reconstruct.load_tokenizer()")
    device = pick_device(str(device)) if isinstance(device, (str, torch.device)) else device
    model, _ = load_checkpoint(resolve(name_or_path, MODELS), map_location=device, dtype=dtype)
    if str(name_or_path) in MODELS and not (Path(str(name_or_path)) / "config.json").is_file():
            model.checkpoint_source = f"hyperset {package_version()}, shipped model {str(name_or_path)!r}"
    return model


def push_to_hub(model_or_folder: Any, repo_id: str, token: str | None = None, private: bool = False,
                commit_message: str = "Upload Hyper-SET model") -> Any:
    """Upload a model, or what load_pretrained takes (a shipped name, a checkpoint folder, a Hub id), to the Hugging
    Face Hub repository `repo_id` ("owner/name"; created if missing, `private` then) as save_pretrained writes it:
    model.safetensors, config.json with the inference defaults and provenance, the model card. `token`: a Hub
    token (default: the one huggingface_hub finds, `hf auth login`). Returns huggingface_hub's CommitInfo (a str:
    the commit's URL). Needs huggingface_hub, the [hub] extra."""
    require("hub", "huggingface_hub", what="push_to_hub")
    from huggingface_hub import HfApi


    model = model_or_folder if hasattr(model_or_folder, "save_pretrained") else load_pretrained(model_or_folder)
    api = HfApi(token=token, library_name="hyperset", library_version=package_version())
    with tempfile.TemporaryDirectory(prefix="hyperset-push-") as folder:
        model.save_pretrained(folder)  # checked and written in full before anything is sent
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        return api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message,
                                 repo_type="model")
