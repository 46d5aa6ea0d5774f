"""Optional dependencies: the core install solves Sudoku; other commands name the extra they need."""

from __future__ import annotations

import importlib.util

# extra -> what it adds (pyproject.toml [project.optional-dependencies])
EXTRAS = {
    "onnx": "ONNX export and ONNX Runtime (hyperset-export, hyperset-solve --backend onnx)",
    "app": "the Gradio app and plots (hyperset-app, hyperset-solve --plot)",
    "train": "image data for classification and masked image modeling (hyperset-train/eval classify, mim)",
    "metrics": "LPIPS and FID by torchmetrics (hyperset-eval mim; the weight files are never downloaded)",
    "hub": "the Hugging Face Hub client (push_to_hub, load_pretrained of a Hub repository id)",
}


class MissingExtra(RuntimeError):
    """A command needs packages of an extra that is not installed: the message says what to install."""


def require(extra: str, *modules: str, what: str = "this command") -> None:
    """Raise MissingExtra naming `pip install 'hyperset[extra]'` if any of `modules` cannot be imported."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtra(f"{what} needs {', '.join(missing)} (the '{extra}' extra: {EXTRAS[extra]}); "
                           f"install it with: pip install 'hyperset[{extra}]'")
