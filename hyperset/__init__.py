"""Hyper-SET: Transformers designed as iterative energy minimization on hyperspheres (Hu, Zou, Xu; ICLR 2026).

    import hyperset
    model = hyperset.load_pretrained("sudoku")       # the small model shipped in the package
    untrained = hyperset.create_model("sudoku")      # a preset from the paper, freshly initialised
"""

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .config import ModelConfig, get_preset, list_presets, preset_config
from .core import RecurrentCore, Trace
from .models import HyperSETModel, build_model, create_model
from .pretrained import PRETRAINED, load_pretrained

__version__ = "0.1.0"

__all__ = [
    "PRETRAINED", "CheckpointError", "HyperSETModel", "ModelConfig", "RecurrentCore", "Trace", "build_model",
    "create_model", "get_preset", "list_presets", "load_checkpoint", "load_pretrained", "preset_config",
    "save_checkpoint", "__version__",
]
