"""Checkpoints: the format, `model.safetensors` + `config.json` in one folder, read and checked without ever
unpickling; and where a checkpoint named by the user is (a shipped model's name, a folder, a Hub repository).
A model is saved and loaded by :mod:`hyperset.models` (`save_checkpoint`, `load_checkpoint`, `load_pretrained`),
beside the model's own `from_pretrained` and `save_pretrained`."""

from __future__ import annotations

import json
import os
import re
import struct
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from .config import ModelConfig, check_iterations
from .files import (  # noqa: F401  (the writers every front end uses, importable from here too)
    NotReplacedError,
    _default_mode,
    _temp_beside,
    atomic_write_bytes,
    atomic_write_json,
    json_safe,
    read_problem,
    replace_problem,
)

FORMAT = "hyperset-checkpoint"
# the iteration counts a checkpoint's config.json may hold (inference defaults and the trained depth), each checked
# on save and on load: 1..MAX_ITERS
ITERATION_KEYS = ("trained_iterations", "solve_iterations", "search_iterations")
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A missing, truncated or mismatched checkpoint; the message names what was expected."""


def save_tensors(path: str | os.PathLike, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None,
                 then: Any = None) -> None:
    """safetensors file written atomically (tensors are made contiguous and unshared); `then()`, if given, runs
    once the file is written in full, before it replaces an old one (a failure there leaves the old file)."""
    path = Path(path)
    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        try:
            save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, tmp, metadata=metadata)
        except SafetensorError as e:  # the writer's I/O errors ("File too large (os error 27)") as an OSError
            code = re.search(r"os error (\d+)", str(e))
            if code is None:
                raise OSError(f"{path}: {e}") from None
            raise OSError(int(code.group(1)), os.strerror(int(code.group(1))), str(path)) from None
        os.chmod(tmp, _default_mode())
        if then is not None:  # a companion file, written before the tensors replace their old file
            then()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_tensors(path: str | os.PathLike, what: str = "weights") -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file whose size is what its header declares (`read_header`), parsed from one
    read of that many bytes: nothing is mapped, and a file that grows after its size was checked is read no
    further than its header declares."""
    path = Path(path)
    why = read_problem(path)
    if why is not None:
        raise CheckpointError(f"{path}{' ' if why.startswith('is ') else ': '}{why} (expected the {what} as a "
                              ".safetensors file)")
    try:
        with open(path, "rb") as f:
            _, size = read_header(f)
            f.seek(0)
            data = f.read(size)
        if len(data) != size:  # the file shrank since its size was checked
            raise ValueError(f"{len(data):,} bytes read of the {size:,} its header declares")
        return load_safetensors(data)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (SafetensorError, ValueError, RecursionError, AttributeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(e)[:200]}); expected the {what}"
                              ) from None


RESERVED_INFO = frozenset({"format", "format_version", "kind", "model", "parameters"})  # config.json keys of the format


def save_module(directory: str | os.PathLike, module: torch.nn.Module, kind: str, config: dict[str, Any],
                info: dict[str, Any] | None = None) -> Path:
    """Write any module as model.safetensors + config.json ({"kind": kind, "model": config, ...info}).

    Everything is checked before anything is written: `info` must be JSON (non-finite numbers are written as
    null), its iteration counts valid, the weights finite, and a folder that already holds files of these names
    must hold a Hyper-SET checkpoint (anything else is not overwritten). Both files are written in full before
    either replaces an old one."""
    directory = Path(directory)
    module = getattr(module, "_orig_mod", module)  # torch.compile's wrapper: the weights under their own names
    clash = sorted(RESERVED_INFO & set(info or {}))
    if clash:
        raise ValueError(f"checkpoint info may not set the reserved keys {', '.join(clash)}")
    for key in ITERATION_KEYS:
        if (info or {}).get(key) is not None:
            check_iterations(info[key], key)  # type: ignore[index]
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "model": config,
            "parameters": sum(p.numel() for p in module.parameters()), **(info or {})}
    try:
        text = json.dumps(json_safe(meta), indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint info must be JSON (strings, numbers, lists, dicts): {e}") from None
    state = module.state_dict()
    bad = [name for name, t in state.items() if t.is_floating_point() and not bool(t.isfinite().all())]
    if bad:
        raise ValueError(f"weights not saved: {', '.join(bad[:4])} hold NaN or infinite values")
    _check_writable_checkpoint_folder(directory)
    save_tensors(directory / "model.safetensors", state, {"format": FORMAT, "kind": kind},
                 then=lambda: atomic_write_bytes(directory / "config.json", text.encode()))
    return directory


def _check_writable_checkpoint_folder(directory: Path) -> None:
    """A folder save_module may write into: new, or holding no config.json / model.safetensors, or a Hyper-SET
    checkpoint's. Another program's files of those names are not overwritten."""
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{directory} is a file: a checkpoint is a folder (model.safetensors + config.json)")
    config, weights = directory / "config.json", directory / "model.safetensors"
    if config.exists():
        try:
            ours = read_json_file(config, "a Hyper-SET config.json").get("format") == FORMAT
        except (CheckpointError, AttributeError):
            ours = False
        if not ours:
            raise ValueError(f"{config} is not a Hyper-SET checkpoint's config: not overwritten (save into another "
                             "folder)")
    elif weights.exists():
        raise ValueError(f"{weights} has no Hyper-SET config.json beside it: not overwritten (save into another "
                         "folder)")


# safetensors' names of the floating-point dtypes torch loads
FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


# a safetensors header lists names, dtypes, shapes and offsets: a few kB for these models
MAX_HEADER_BYTES = 16 << 20
# the most bytes of tensors a safetensors file may declare: far above any model of this project (its largest
# preset, mim-transformer, is 8.7 M parameters: 35 MB in float32, 69 MB in float64; the shipped models are under
# 1 MiB; the taming VQGAN the token models are trained with, under 1 GB), so that a file received from someone
# else is refused before anything maps or reads that much
MAX_TENSOR_BYTES = 4 << 30


def read_header(f: BinaryIO) -> tuple[dict[str, Any], int]:
    """(header, file size) of the safetensors file open as `f`, read by hand with bounds: a ValueError unless
    the file is exactly 8 bytes + the header + the tensor bytes the header's data_offsets declare (a truncated,
    padded or sparse-extended file is refused before its data is read) and those are at most MAX_TENSOR_BYTES."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(8)
    if len(head) < 8:
        raise ValueError(f"{size} bytes: shorter than a safetensors header")
    length = struct.unpack("<Q", head)[0]
    if length > min(size - 8, MAX_HEADER_BYTES):
        raise ValueError(f"a header of {length:,} bytes in a file of {size:,}")
    header = json.loads(f.read(length).decode("utf-8"))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    declared = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(n, int) and not isinstance(n, bool) for n in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"the entry of {name!r} has no data_offsets [begin, end]")
        declared = max(declared, offsets[1])
    if declared > MAX_TENSOR_BYTES:
        raise ValueError(f"its header declares {declared / 2**30:.1f} GiB of tensors; at most "
                         f"{MAX_TENSOR_BYTES >> 30} GiB are read")
    if size != 8 + length + declared:
        raise ValueError(f"{size:,} bytes, but its header declares {8 + length + declared:,} (a truncated, padded "
                         "or extended file)")
    return header, size


def stored_header(path: Path, what: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """The tensor shapes and dtypes (safetensors' names: "F32", "BF16", "I64", ...) in a safetensors file, read
    from its header alone (`read_header`: the file's size is checked against it)."""
    why = read_problem(path)
    if why is not None:
        raise CheckpointError(f"{path}{' ' if why.startswith('is ') else ': '}{why} (expected the {what} as a "
                              ".safetensors file)")
    try:
        # the header read by hand: safetensors maps the whole file, which a sparse file claiming terabytes makes
        # fail where address space is limited; its loader validates the rest when the weights are read
        with open(path, "rb") as f:
            header, _ = read_header(f)
        out = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            shape, dtype = entry.get("shape"), entry.get("dtype")
            if not (isinstance(dtype, str) and isinstance(shape, list)
                    and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
                raise ValueError(f"the entry of {name!r} has no dtype and shape")
            out[name] = (tuple(shape), dtype)
        return out
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (ValueError, RecursionError, AttributeError) as e:  # JSON, UTF-8 and the checks above
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(e)[:200]}); expected the {what}"
                              ) from None


def check_weights_fit(module: torch.nn.Module, directory: Path, what: str) -> None:
    """The names and shapes of `module` (which may live on the meta device) against the header of
    model.safetensors: a one-line error for missing/unexpected keys or shapes, before any weight is read."""
    path = directory / "model.safetensors"
    header = stored_header(path, what)
    stored = {k: shape for k, (shape, _) in header.items()}
    state = module.state_dict()
    expected = {k: tuple(v.shape) for k, v in state.items()}
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match config.json "
            f"(missing: {', '.join(missing[:4]) or '-'}; unexpected: {', '.join(unexpected[:4]) or '-'})")
    for k, shape in stored.items():
        if shape != expected[k]:
            raise CheckpointError(f"{path}: {k} has shape {shape}, config.json expects {expected[k]}")
        if state[k].is_floating_point() != (header[k][1] in FLOAT_DTYPES):
            kind = "floating-point" if state[k].is_floating_point() else str(state[k].dtype).removeprefix("torch.")
            raise CheckpointError(f"{path}: {k} is stored as {header[k][1]}, expected {kind} values")


def stored_float_dtype(directory: Path) -> torch.dtype | None:
    """The one floating-point dtype of a checked model.safetensors' floating tensors (None if they mix dtypes)."""
    found = {FLOAT_DTYPES[d] for _, d in stored_header(directory / "model.safetensors", "weights").values()
             if d in FLOAT_DTYPES}
    return found.pop() if len(found) == 1 else None


def load_weights_into(module: torch.nn.Module, directory: Path, what: str) -> None:
    """Load model.safetensors into `module`, with a one-line error for missing/unexpected keys or shapes."""
    check_weights_fit(module, directory, what)
    module.load_state_dict(load_tensors(directory / "model.safetensors", what))


def checkpoint_dir(path: str | os.PathLike) -> Path:
    """The checkpoint folder of `path`: the folder itself or the folder of its config.json / model.safetensors."""
    path = Path(path)
    if not path.is_file():
        return path
    if path.name not in ("config.json", "model.safetensors"):
        raise CheckpointError(f"{path} is a file, not a checkpoint: expected a folder with model.safetensors + "
                              "config.json (or one of those two files)")
    return path.parent


# a config.json or trainer.json is a few kB; one received from someone else may be anything
MAX_JSON_BYTES = 16 << 20


def read_json_file(path: Path, what: str, max_bytes: int | None = None) -> Any:
    """A JSON file of the project's (a checkpoint's config.json, a run's trainer.json), read with bounds: larger
    than `max_bytes`, not UTF-8, not JSON, nested beyond Python's recursion limit or holding an integer too long
    to convert is a one-line CheckpointError naming the file and `what` was expected (`max_bytes`: MAX_JSON_BYTES
    by default)."""
    max_bytes = MAX_JSON_BYTES if max_bytes is None else max_bytes
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)  # bounded by the read: a pipe or /dev/zero has no size to check first
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise CheckpointError(f"{path}: more than {max_bytes >> 20} MiB; {what} is at most that")
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, integers over 4,300 digits
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise CheckpointError(f"{path}: not valid JSON ({reason}); expected {what}") from None


def read_config(directory: str | os.PathLike, kind: str | None = None) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / "config.json"
    if not directory.exists():
        raise CheckpointError(f"{directory}: no such checkpoint folder (expected model.safetensors + config.json)")
    why = read_problem(path)
    if why is not None and why != "file not found":
        raise CheckpointError(f"{path} {why} (expected model.safetensors + config.json in {directory})")
    if why is not None:
        run = [str(directory / d) for d in ("best", "last") if (directory / d / "config.json").is_file()]
        hint = f"; a training run folder: pass {' or '.join(run)}" if run else ""
        raise CheckpointError(f"{directory}: config.json is missing (expected model.safetensors + config.json){hint}")
    meta = read_json_file(path, "a Hyper-SET config.json")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("model"), dict):
        raise CheckpointError(f"{path}: not a Hyper-SET checkpoint config (expected \"format\": \"{FORMAT}\")")
    version = meta.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{path}: format_version = {version!r}: expected a whole number >= 1")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path}: written in checkpoint format version {version}, newer than this version of "
                              f"hyperset reads ({FORMAT_VERSION}): upgrade hyperset to load it")
    found = meta.get("kind", "hyperset")
    if kind is not None and found != kind:
        raise CheckpointError(f"{directory}: this checkpoint holds a {found!r} model, expected a {kind!r} model")
    for key in ITERATION_KEYS:
        if meta.get(key) is not None:
            try:
                check_iterations(meta[key], key)
            except ValueError as e:
                raise CheckpointError(f"{path}: {e}") from None
    return meta


def trained_iterations(cfg: ModelConfig, info: dict[str, Any] | None) -> int:
    """The depth a model was trained at: its checkpoint's `trained_iterations` (checked by read_config), else the
    config's iterations."""
    value = (info or {}).get("trained_iterations")
    return int(value) if value is not None else int(cfg.iters)


def solve_iterations(cfg: ModelConfig, info: dict[str, Any] | None) -> int:
    """The iterations per pass a solver runs when the caller does not say: the checkpoint's `solve_iterations`
    (the depth per pass chosen for the model by measurement, checked by read_config), else its trained depth."""
    value = (info or {}).get("solve_iterations")
    return int(value) if value is not None else trained_iterations(cfg, info)


def check_finite(module: torch.nn.Module, where: str | os.PathLike, expected: str) -> None:
    """A CheckpointError naming `where` if any floating weight of `module` is NaN or infinite (loaded weights that
    diverged: exporting, solving with or training on from them gives nothing that means anything)."""
    bad = [k for k, v in module.state_dict().items() if v.is_floating_point() and not bool(v.isfinite().all())]
    if bad:
        raise CheckpointError(f"{where}: weights hold NaN or infinite values ({', '.join(bad[:3])}); expected "
                              f"{expected}")


def weights_root() -> Path:
    """The folder of the models shipped in the package (hyperset/weights)."""
    return Path(str(resources.files("hyperset") / "weights"))


def is_shipped(directory: Path) -> bool:
    """Whether checkpoint folder `directory` is one of the models shipped in the package (hyperset/weights)."""
    return directory.resolve().is_relative_to(weights_root().resolve())


# ---------------------------------------------------------------------------------------------------------------
# the shipped models and the Hub: where a checkpoint named by the user is


# name -> folder under hyperset/weights; "mim-tokenizer" is the MIM model's VQ tokenizer
# (hyperset.vision.reconstruct.load_tokenizer), the others load_pretrained's Hyper-SET models
PRETRAINED = {"sudoku": "sudoku", "classifier": "classifier", "mim": "mim/model", "mim-tokenizer": "mim/tokenizer"}


def pretrained_dir(name: str) -> Path:
    """The folder of a shipped model by name (see PRETRAINED); a CheckpointError if this installation lacks it."""
    if name not in PRETRAINED:
        raise CheckpointError(f"no shipped model named {name!r}; shipped: {', '.join(PRETRAINED)}")
    folder = weights_root() / PRETRAINED[name]
    if not (folder / "config.json").is_file() or not (folder / "model.safetensors").is_file():
        raise CheckpointError(f"the shipped {name} model is not in this installation ({folder}); "
                              "pass a checkpoint folder instead")
    return folder


MODELS = tuple(k for k in PRETRAINED if k != "mim-tokenizer")  # the names load_pretrained takes


def resolve(name_or_path: str | os.PathLike, names: tuple[str, ...] = tuple(PRETRAINED)) -> Path:
    """A checkpoint folder from a shipped model's name, a local path, or a Hub repository id (downloaded); an
    unknown name's error lists `names`."""
    text = str(name_or_path)
    path = Path(text)
    # a shipped name is the shipped model unless a checkpoint folder of that name is here (a data folder named
    # "sudoku" in the working directory does not hide it)
    if text in PRETRAINED and not (path / "config.json").is_file():
        return pretrained_dir(text)
    if path.exists():
        return path
    # "owner/name" is a Hub id unless its first part is a local folder: then it names a folder that is missing
    if text.count("/") == 1 and not text.startswith((".", "/", "~")) and not Path(text.split("/")[0]).is_dir():
        return _from_hub(text)
    raise CheckpointError(f"{text}: no such checkpoint folder, and not a shipped model ({', '.join(names)})")


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"{repo_id}: no such folder; to load it from the Hugging Face Hub install "
                              "huggingface_hub (pip install 'hyperset[hub]')") from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["config.json", "model.safetensors", "README.md"]))
    except Exception as e:  # network, authentication or a missing repository: one line for the user
        reason = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
        raise CheckpointError(f"{repo_id}: no such checkpoint folder, and the Hugging Face Hub could not give it "
                              f"({type(e).__name__}{': ' + reason if reason else ''})") from None
