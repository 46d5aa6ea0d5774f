"""Hyper-SET: Transformers designed as iterative energy minimization on hyperspheres (Hu, Zou, Xu; ICLR 2026).

    import hyperset
    model = hyperset.create_model("sudoku")          # a preset from the paper
    logits = model(boards, iters=48)                 # iterations past the trained depth just work
"""

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .config import ModelConfig, get_preset, list_presets, preset_config
from .core import RecurrentCore, Trace
from .models import HyperSETModel, build_model, create_model

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "HyperSETModel", "ModelConfig", "RecurrentCore", "Trace", "build_model", "create_model",
    "get_preset", "list_presets", "load_checkpoint", "preset_config", "save_checkpoint", "__version__",
]
