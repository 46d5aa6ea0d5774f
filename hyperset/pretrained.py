"""The models shipped in the package, by name, in one place; and the Hugging Face folder convention.

    import hyperset
    model = hyperset.load_pretrained("sudoku")              # offline: the weights ship in the package
    model.save_pretrained("my-sudoku")                      # model.safetensors + config.json + README.md
    same = hyperset.HyperSETModel.from_pretrained("my-sudoku")
    model.push_to_hub("owner/my-sudoku")                    # the same three files, to the Hugging Face Hub

A name is one of `PRETRAINED` (unless a checkpoint folder of that name, one holding config.json, is in the working
directory); anything else is a checkpoint folder, or (where huggingface_hub is installed and there is a network) a
Hugging Face Hub repository id such as "owner/name" holding the same two files.

This module gathers the names: the loaders are :mod:`hyperset.models`' (beside the model's own methods), the names
and folders :mod:`hyperset.checkpoint`'s.
"""

from __future__ import annotations

from .checkpoint import MODELS, PRETRAINED, pretrained_dir, resolve, weights_root
from .models import load_pretrained, push_to_hub

__all__ = ["MODELS", "PRETRAINED", "load_pretrained", "pretrained_dir", "push_to_hub", "resolve", "weights_root"]
