"""Hyper-SET: Transformers designed as iterative energy minimization on hyperspheres (Hu, Zou, Xu; ICLR 2026).

    import hyperset
    model = hyperset.load_pretrained("sudoku")       # the small model shipped in the package
    untrained = hyperset.create_model("sudoku")      # a preset from the paper, freshly initialised

The names below are imported on first use (PEP 562), so that importing the package, as every console script does
first, is instant and does not load torch until a command needs it.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from .version import __version__

# public name -> the module that defines it
_EXPORTS = {
    "CheckpointError": "checkpoint", "load_checkpoint": "models", "save_checkpoint": "models",
    "ModelConfig": "config", "get_preset": "config", "list_presets": "config", "preset_config": "config",
    "RecurrentCore": "core", "Trace": "core",
    "HyperSETModel": "models", "build_model": "models", "create_model": "models",
    "PRETRAINED": "pretrained", "load_pretrained": "pretrained", "push_to_hub": "pretrained",
}

__all__ = [
    "PRETRAINED", "CheckpointError", "HyperSETModel", "ModelConfig", "RecurrentCore", "Trace", "build_model",
    "create_model", "get_preset", "list_presets", "load_checkpoint", "load_pretrained", "preset_config",
    "push_to_hub", "save_checkpoint", "__version__",
]

if TYPE_CHECKING:
    from .checkpoint import CheckpointError
    from .config import ModelConfig, get_preset, list_presets, preset_config
    from .core import RecurrentCore, Trace
    from .models import HyperSETModel, build_model, create_model, load_checkpoint, save_checkpoint
    from .pretrained import PRETRAINED, load_pretrained, push_to_hub


def __getattr__(name: str) -> Any:
    """A public name, or a submodule (``hyperset.core``), imported when first asked for."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
