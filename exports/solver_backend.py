"""Run ``hyperset.solve.Solver`` through ONNX Runtime: ``hyperset-solve --backend onnx``.

``attach_onnx_backend(solver)`` exports the solver's model as a Loop graph (iterations are a run-time input) to a
cache file keyed by the SHA-256 of the model's config and weights, opens it with :class:`OrtSession` (honest
provider choice) and sets ``solver.backend``. With an explicit ``onnx_path`` that file is used instead; it may
be a Loop graph (any iteration count) or an unrolled graph (only its own iteration count).

Cache folder: ``$HYPERSET_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/hyperset/onnx`` (``~/.cache/hyperset/onnx``);
a temporary folder when that is not writable.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .runtime import OnnxModelError, OrtSession, expect_task

__all__ = ["OnnxSolverBackend", "attach_onnx_backend", "cache_dir", "cached_loop_model"]

CACHE_VERSION = "loop-v1"  # bump when the exported graph changes for the same weights


def cache_dir() -> Path:
    """Where exported Loop graphs are cached (see the module docstring)."""
    explicit = os.environ.get("HYPERSET_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hyperset" / "onnx"


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
        return True
    except OSError:
        return False


def _ort_device(device: str | torch.device | None) -> str:
    """Map a solver device (auto, cpu, cuda, cuda:1, mps, ...) to an OrtSession device (auto, cpu, cuda)."""
    name = str(device or "auto").lower()
    if name.startswith("cuda"):
        return "cuda"
    if name == "cpu":
        return "cpu"
    return "auto"  # mps and anything else: ORT picks CUDA if really usable, else the CPU


def cached_loop_model(model: Any, info: dict[str, Any] | None = None, directory: str | Path | None = None,
                      opset: int | None = None) -> Path:
    """Path of the Loop graph of ``model`` in the cache, exporting it first when missing or unreadable."""
    from .export import DEFAULT_OPSET, export_loop, model_fingerprint, read_metadata

    opset = opset or DEFAULT_OPSET
    directory = Path(directory) if directory is not None else cache_dir()
    if not _writable(directory):
        directory = Path(tempfile.gettempdir()) / "hyperset-onnx"
        directory.mkdir(parents=True, exist_ok=True)
    digest = model_fingerprint(model)
    path = directory / f"{model.cfg.task}-{digest[:20]}-{CACHE_VERSION}-opset{opset}.onnx"
    if path.is_file():
        try:
            if read_metadata(path).get("model_sha256") == digest:
                return path
        except Exception:  # a truncated or corrupted cache file: export again
            pass
    export_loop(model, path, opset=opset, info=info)
    return path


class OnnxSolverBackend:
    """The callable ``Solver.backend``: ``(boards (B, 81) int64, iters) -> (logits (B, 81, 9), energies)``.

    Energies are ``{"attn": (T, B), "ff": (T, B)}`` float tensors, or ``{}`` for layers without an energy
    (Transformer, CRATE), like the torch path. Attributes: ``name`` (e.g. ``"onnxruntime (CPUExecutionProvider)"``),
    ``device`` (``"cpu"`` or ``"cuda"``), ``device_name``, ``path``, ``session`` (:class:`OrtSession`), ``graph``
    (``"loop"`` or ``"unrolled"``), ``metadata``.
    """

    def __init__(self, session: OrtSession):
        self.session = session
        self.path = session.path
        self.metadata = dict(session.metadata)
        expect_task(self.metadata, "sudoku", name=self.path.name)
        self.graph = self.metadata.get("graph") or ("loop" if "iters" in session.input_names else "unrolled")
        if self.graph not in ("loop", "unrolled"):
            raise OnnxModelError(f"{self.path.name} is a '{self.graph}' graph; the solver needs the Loop graph "
                                 "(or an unrolled graph) written by hyperset-export")
        self.input = self.metadata.get("input", "tokens")
        expected = {self.input, "iters"} if self.graph == "loop" else {self.input}
        if set(session.input_names) != expected:
            raise OnnxModelError(f"{self.path.name}: inputs {session.input_names}, expected {sorted(expected)}")
        missing = [n for n in ("logits", "energy_attn", "energy_ff") if n not in session.output_names]
        if missing:
            raise OnnxModelError(f"{self.path.name}: outputs {missing} are missing (have {session.output_names})")
        self.unrolled = int(self.metadata["unrolled_iterations"]) if self.graph == "unrolled" else None
        self.energies = [e for e in self.metadata.get("energies", "attn,ff").split(",") if e]
        import onnxruntime

        self.name = f"onnxruntime ({session.provider})"
        self.device = session.device  # "cpu" or "cuda": the solver sizes its batches by it
        threads = session.session.get_session_options().intra_op_num_threads
        where = f"{threads} threads" if session.device == "cpu" else session.provider
        self.device_name = f"{session.device} (ONNX Runtime {onnxruntime.__version__}, {where})"

    def __call__(self, boards: torch.Tensor, iters: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        iters = int(iters)
        if iters < 0:
            raise ValueError(f"iterations must be >= 0, got {iters}")
        feeds: dict[str, Any] = {self.input: boards.detach().cpu().numpy().astype(np.int64, copy=False)}
        if self.graph == "loop":
            feeds["iters"] = np.asarray(iters, dtype=np.int64)
        elif iters != self.unrolled:
            raise OnnxModelError(f"{self.path.name} is unrolled for {self.unrolled} iterations and cannot run "
                                 f"{iters}; export a Loop graph (hyperset-export --loop) for any count")
        out = self.session.run(feeds)
        device = boards.device
        logits = torch.from_numpy(out["logits"]).float().to(device)
        energies = {}
        for name in self.energies:
            e = out[f"energy_{name}"]
            if e.size == 0:
                e = e.reshape(0, boards.shape[0])
            energies[name] = torch.from_numpy(e).float().to(device)
        return logits, energies

    def __repr__(self) -> str:
        return f"OnnxSolverBackend({str(self.path)!r}, graph={self.graph!r}, provider={self.session.provider!r})"


def attach_onnx_backend(solver: Any, onnx_path: str | Path | None = None, device: str = "auto", *,
                        threads: int | None = None) -> OnnxSolverBackend:
    """Set ``solver.backend`` to an ONNX Runtime backend and return it.

    Without ``onnx_path`` the solver's model is exported as a Loop graph into the cache (once per set of weights).
    Raises :class:`OnnxModelError` for a missing/corrupted file or a model whose metadata task is not "sudoku".
    """
    if onnx_path is None:
        path = cached_loop_model(solver.model, solver.info)
    else:
        path = Path(onnx_path)
    session = OrtSession(path, _ort_device(device), intra_op_threads=threads)
    backend = OnnxSolverBackend(session)
    if onnx_path is not None:
        _warn_if_other_model(solver, backend)
    solver.backend = backend
    return backend


def _warn_if_other_model(solver: Any, backend: OnnxSolverBackend) -> None:
    """The ONNX file may hold other weights than the solver's checkpoint: allowed, but say so."""
    from .export import model_fingerprint

    digest = backend.metadata.get("model_sha256")
    if digest and digest != model_fingerprint(solver.model):
        warnings.warn(f"{backend.path.name} was exported from other weights than the loaded checkpoint; "
                      "the ONNX model's weights are used", stacklevel=3)
