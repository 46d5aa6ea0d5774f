"""The models shipped in the package, by name, in one place; and the Hugging Face folder convention.

    import hyperset
    model = hyperset.load_pretrained("sudoku")              # offline: the weights ship in the package
    model.save_pretrained("my-sudoku")                      # model.safetensors + config.json + README.md
    same = hyperset.HyperSETModel.from_pretrained("my-sudoku")
    model.push_to_hub("owner/my-sudoku")                    # the same three files, to the Hugging Face Hub

A name is one of `PRETRAINED` (unless a checkpoint folder of that name, one holding config.json, is in the working
directory); anything else is a checkpoint folder, or (where huggingface_hub is installed and there is a network) a
Hugging Face Hub repository id such as "owner/name" holding the same two files.
"""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from .checkpoint import CheckpointError, load_checkpoint
from .extras import require

# name -> folder under hyperset/weights; "mim-tokenizer" is the MIM model's VQ tokenizer
# (hyperset.vision.reconstruct.load_tokenizer), the others load_pretrained's Hyper-SET models
PRETRAINED = {"sudoku": "sudoku", "classifier": "classifier", "mim": "mim/model", "mim-tokenizer": "mim/tokenizer"}


def weights_root() -> Path:
    return Path(str(resources.files("hyperset") / "weights"))


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


def load_pretrained(name_or_path: str | os.PathLike, device: Any = "cpu", dtype: torch.dtype | str | None = None
                    ) -> Any:
    """A Hyper-SET model (eval mode) by shipped name ("sudoku", "classifier", "mim"), folder or Hub id, on `device`
    ("auto", "cpu", "cuda", "cuda:N", "mps" or a torch.device; one that cannot be had is a ValueError), in float32
    (``dtype="saved"``: the dtype its weights were saved in; a torch.dtype: that one)."""
    from .device import pick_device

    if name_or_path == "mim-tokenizer":
        raise CheckpointError("'mim-tokenizer' is the MIM model's VQ tokenizer, not a Hyper-SET model: load it with "
                              "hyperset.vision.reconstruct.load_tokenizer()")
    device = pick_device(str(device)) if isinstance(device, (str, torch.device)) else device
    model, _ = load_checkpoint(resolve(name_or_path, MODELS), map_location=device, dtype=dtype)
    if str(name_or_path) in MODELS and not (Path(str(name_or_path)) / "config.json").is_file():
        from .cli_options import package_version

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

    from .cli_options import package_version

    model = model_or_folder if hasattr(model_or_folder, "save_pretrained") else load_pretrained(model_or_folder)
    api = HfApi(token=token, library_name="hyperset", library_version=package_version())
    with tempfile.TemporaryDirectory(prefix="hyperset-push-") as folder:
        model.save_pretrained(folder)  # checked and written in full before anything is sent
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        return api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message,
                                 repo_type="model")
