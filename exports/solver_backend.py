"""The ONNX Runtime implementation of ``hyperset.backends.SolverBackend``: ``hyperset-solve --backend onnx`` and
``hyperset-app --backend onnx``.

:func:`create_backend` (the ``onnx`` entry of the ``hyperset.backends`` entry-point group) exports the model as
a Loop graph (iterations are a run-time input) to a cache file keyed by the SHA-256 of the model's config and
weights and opens it with :class:`OrtSession` (honest provider choice). With an explicit ``path`` that file is
used instead; it may be a Loop graph (any iteration count) or an unrolled graph (only its own iteration count).
Whole passes run the Loop (or unrolled) graph; iteration by iteration (``iterate``: the app's frames, the
``auto`` strategy) runs the exported stem, step and head graphs, so those frames come from ONNX Runtime too.
The step graphs are the ones ``hyperset-export --loop`` writes next to the Loop graph, or for the cached model
exported into the cache on first use. ``attach_onnx_backend(solver)`` sets ``solver.backend`` (older API).

Cache folder: ``$HYPERSET_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/hyperset/onnx`` (``~/.cache/hyperset/onnx``);
a temporary folder when that is not writable.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyperset.backends import BackendStep
from hyperset.config import MAX_ITERS, MAX_SIZES, check_iterations

from .runtime import OnnxModelError, OrtSession, ProviderError, expect_task

__all__ = ["OnnxSolverBackend", "attach_onnx_backend", "cache_dir", "cached_loop_model", "cached_step_models",
           "create_backend"]

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
        index = name.partition(":")[2]
        if index not in ("", "0"):  # the session's CUDA provider runs on the first visible GPU
            raise ValueError(f"device {name}: the ONNX backend runs on the first visible GPU (cuda or cuda:0); "
                             f"to run on GPU {index}, set CUDA_VISIBLE_DEVICES={index}")
        return "cuda"
    if name == "cpu":
        return "cpu"
    return "auto"  # mps and anything else: ORT picks CUDA if really usable, else the CPU


def _cache_folder(directory: str | Path | None) -> Path:
    directory = Path(directory) if directory is not None else cache_dir()
    if not _writable(directory):
        directory = Path(tempfile.gettempdir()) / "hyperset-onnx"
        directory.mkdir(parents=True, exist_ok=True)
    return directory


def _cached(path: Path, digest: str) -> bool:
    if not path.is_file():
        return False
    from .export import read_metadata

    try:
        return read_metadata(path).get("model_sha256") == digest
    except Exception:  # a truncated or corrupted cache file: export again
        return False


def cached_loop_model(model: Any, info: dict[str, Any] | None = None, directory: str | Path | None = None,
                      opset: int | None = None) -> Path:
    """Path of the Loop graph of ``model`` in the cache, exporting it first when missing or unreadable."""
    from .export import DEFAULT_OPSET, export_loop, model_fingerprint

    opset = opset or DEFAULT_OPSET
    directory = _cache_folder(directory)
    digest = model_fingerprint(model)
    path = directory / f"{model.cfg.task}-{digest[:20]}-{CACHE_VERSION}-opset{opset}.onnx"
    if not _cached(path, digest):
        export_loop(model, path, opset=opset, info=info)
    return path


def cached_step_models(model: Any, info: dict[str, Any] | None = None, directory: str | Path | None = None,
                       opset: int | None = None) -> dict[str, Any]:
    """The stem, step (one per distinct layer) and head graphs of ``model`` in the cache (``step_paths`` names
    for ``steps-<task>-<digest>...onnx``), exporting them first when missing or unreadable."""
    from .export import DEFAULT_OPSET, export_head, export_stem, export_step, model_fingerprint, step_paths

    opset = opset or DEFAULT_OPSET
    digest = model_fingerprint(model)
    base = _cache_folder(directory) / f"steps-{model.cfg.task}-{digest[:20]}-{CACHE_VERSION}-opset{opset}.onnx"
    names = step_paths(base, model.cfg.n_layers)
    if not _cached(names["stem"], digest):
        export_stem(model, names["stem"], opset, info=info)
    if not _cached(names["head"], digest):
        export_head(model, names["head"], opset, info=info)
    for k, p in enumerate(names["step"]):
        if not _cached(p, digest):
            export_step(model, p, opset, layer=k, info=info)
    return names


# ONNX Runtime runs a solver batch on a CPU in slices a third the size of the torch path's
# (hyperset.accel.rows.SLICE_BYTES):
# each ORT call has little fixed cost, and its kernels are faster while a slice's intermediates stay in the core's
# L2. For the shipped Sudoku model that is 4 boards per call (bench/onnx_bench.py measures the choice).
ORT_SLICE_BYTES = (2 << 20) // 3


def by_rows(run: Any, feeds: dict[str, np.ndarray], batched: set[str], rows: int) -> dict[str, np.ndarray]:
    """``run(feeds)``, ``rows`` boards at a time when ``rows`` > 0 (the feeds named in ``batched`` sliced on their
    first axis), the outputs joined again: on axis 1 for the (T, B) energies of a pass, else on axis 0. On a CPU
    each slice's activations stay in cache (as ``hyperset.accel.rows.slice_rows`` does for the torch path)."""
    n = len(next(feeds[k] for k in batched))
    if not rows or n <= rows:
        return run(feeds)
    parts = [run({k: v[i:i + rows] if k in batched else v for k, v in feeds.items()}) for i in range(0, n, rows)]
    return {k: np.concatenate([p[k] for p in parts], axis=1 if k.startswith("energy_") and v.ndim == 2 else 0)
            for k, v in parts[0].items()}


# the most distinct layers a graph's metadata may name (each has a step graph file of its own), as for a checkpoint's
# config: a file received from someone else cannot make the backend list paths without end
MAX_LAYERS = MAX_SIZES["n_layers"]
ENERGIES = ("attn", "ff")  # the energies a graph may report, as its outputs energy_attn and energy_ff


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _metadata_count(metadata: dict[str, str], key: str, name: str, most: int | None = None) -> int:
    """Metadata `key` of the graph `name` as a whole number: an iteration count (hyperset.config's
    check_iterations, at most MAX_ITERS) or, with `most`, a number in 1..most. Anything else is an OnnxModelError
    naming the file and the key."""
    raw = metadata[key].strip()
    value: Any = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else _short(raw)
    try:
        if most is None:
            return check_iterations(value, f"metadata {key}")
        if not isinstance(value, int) or not 1 <= value <= most:
            raise ValueError(f"metadata {key} = {value!r}: expected a whole number from 1 to {most}")
        return value
    except ValueError as e:
        raise OnnxModelError(f"{name}: {e}") from None


def _metadata_config(metadata: dict[str, str], name: str) -> Any:
    """The ModelConfig in the graph's metadata ``config`` (JSON), or None when there is none; malformed JSON or a
    config that ModelConfig refuses is an OnnxModelError naming the file and the key."""
    if not metadata.get("config"):
        return None
    import json

    from hyperset.config import ModelConfig

    try:
        return ModelConfig.from_dict(json.loads(metadata["config"]))
    except (ValueError, RecursionError, TypeError, OverflowError) as e:  # JSON errors; TableError is a ValueError
        reason = (str(e) or type(e).__name__).splitlines()[0]
        raise OnnxModelError(f"{name}: metadata config is not a valid model config ({_short(reason, 300)})") from None


def _checked(array: np.ndarray, shape: tuple[int | None, ...], what: str, name: str) -> np.ndarray:
    """A graph output, if it is a real-valued array of `shape` (None: any size there); else an OnnxModelError
    naming the file (a graph that is not a Hyper-SET solver's, whose outputs would fail far from here)."""
    if array.dtype.kind not in "fiu" or array.ndim != len(shape) or any(
            want is not None and have != want for have, want in zip(array.shape, shape)):
        expected = ", ".join("..." if n is None else str(n) for n in shape)
        raise OnnxModelError(f"{name}: output {what} is {array.dtype.name} of shape {list(array.shape)}, expected "
                             f"numbers of shape [{expected}]")
    return array


def _expect_io(session: OrtSession, inputs: tuple[str, ...] | None, outputs: tuple[str, ...]) -> None:
    """A step-by-step graph (stem, step or head) with these inputs (None: one input) and at least these outputs;
    else an OnnxModelError naming the file."""
    if len(session.input_names) != 1 if inputs is None else set(session.input_names) != set(inputs):
        raise OnnxModelError(f"{session.path.name}: inputs {session.input_names}, expected "
                             f"{'one input' if inputs is None else sorted(inputs)}")
    missing = [n for n in outputs if n not in session.output_names]
    if missing:
        raise OnnxModelError(f"{session.path.name}: outputs {missing} are missing (have {session.output_names})")


class OnnxSolverBackend:
    """A ``hyperset.backends.SolverBackend`` on ONNX Runtime; also the callable
    ``(boards (B, 81) int64, iters) -> (logits (B, 81, 9), energies)`` (= ``run``).

    ``run`` runs the Loop (or unrolled) graph; ``iterate`` the stem/step/head graphs given as ``steps`` (paths
    as :func:`hyperset.exports.export.step_paths` names them), else those next to the graph when they exist, else (when
    ``model`` is given) those exported into the cache on first use. Energies are ``{"attn": (T, B), "ff": (T, B)}``
    float tensors, or ``{}`` for layers without an energy (Transformer, CRATE), like the torch path. Attributes:
    ``name`` (e.g. ``"onnxruntime (CPUExecutionProvider)"``), ``source`` (``"onnxruntime"``), ``device``
    (``"cpu"`` or ``"cuda"``), ``device_name``, ``path``, ``session`` (:class:`OrtSession`), ``graph`` (``"loop"``
    or ``"unrolled"``), ``metadata``.
    """

    source = "onnxruntime"
    # what a run can raise because a file or the runtime cannot serve it (a step graph opened on first use): the
    # commands report these in one line
    errors = (OnnxModelError, ProviderError)

    def __init__(self, session: OrtSession, steps: dict[str, Any] | None = None, model: Any = None,
                 info: dict[str, Any] | None = None):
        self.session = session
        self._steps_paths, self._model, self._info = steps, model, info
        self._step_sessions: tuple[OrtSession, list[OrtSession], OrtSession] | None = None
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
        for i in session.session.get_inputs():  # what the solver feeds: boards (B, 81) and a count, both int64
            fixed = [d if isinstance(d, int) else None for d in i.shape]  # None: a named or unknown size
            if i.type != "tensor(int64)" or not (fixed in ([None, 81], [None, None]) if i.name == self.input
                                                 else fixed == []):
                raise OnnxModelError(f"{self.path.name}: input {i.name!r} is {i.type} {list(i.shape)}, expected "
                                     f"tensor(int64) {'[batch, 81]' if i.name == self.input else '[] (a scalar)'}")
        # the metadata, parsed and bounded once: a graph is a file received from someone else
        name = self.path.name
        self.unrolled = (_metadata_count(self.metadata, "unrolled_iterations", name) if self.graph == "unrolled"
                         else None)
        self.energies = [e for e in self.metadata.get("energies", ",".join(ENERGIES)).split(",") if e]
        if any(e not in ENERGIES for e in self.energies):
            raise OnnxModelError(f"{name}: metadata energies = {_short(self.metadata['energies'])!r}: expected "
                                 f"{','.join(ENERGIES)!r} or '' (none)")
        self.config = _metadata_config(self.metadata, name)
        if self.metadata.get("n_layers"):
            self.n_layers = _metadata_count(self.metadata, "n_layers", name, MAX_LAYERS)
        else:
            self.n_layers = self.config.n_layers if self.config is not None else 1
        if self.config is not None and self.config.n_layers != self.n_layers:
            raise OnnxModelError(f"{name}: metadata n_layers = {self.n_layers}, but its config has "
                                 f"n_layers = {self.config.n_layers}")
        import onnxruntime

        self.name = f"onnxruntime ({session.provider})"
        # why "auto" runs on the CPU although this onnxruntime has a CUDA provider (onnxruntime-gpu without its
        # CUDA/cuDNN libraries, or no driver): the commands print it, once
        self.note = session.reason if (session.requested == "auto" and session.device == "cpu"
                                       and "CUDAExecutionProvider" in onnxruntime.get_available_providers()
                                       and "NVIDIA driver)" not in session.reason) else None  # a GPU machine
        self.device = session.device  # "cpu" or "cuda": the solver sizes its batches by it
        self.rows = 0  # boards per ONNX Runtime call on a CPU (see `by_rows`); 0: the whole batch
        if session.device == "cpu" and self.config is not None:
            from hyperset.accel.rows import cache_rows

            self.rows = cache_rows(self.config, ORT_SLICE_BYTES)
        threads = session.session.get_session_options().intra_op_num_threads
        where = f"{threads} thread{'' if threads == 1 else 's'}" if session.device == "cpu" else session.provider
        self.device_name = f"{session.device} (ONNX Runtime {onnxruntime.__version__}, {where})"

    def _step_files(self) -> dict[str, Any] | None:
        """The stem/step/head files for ``iterate``, or None when there are none to be had."""
        if self._steps_paths is not None:
            return self._steps_paths
        from .export import step_paths

        beside = step_paths(self.path, self.n_layers)
        files = [beside["stem"], beside["head"], *beside["step"]]
        if all(Path(p).is_file() for p in files):
            other = self._other_model(files)
            if other is None:
                self._steps_paths = beside  # checked once: later calls do not read the files' metadata again
                return beside
            if self._model is None:
                raise OnnxModelError(f"{other} was exported from another model than {self.path.name} (their "
                                     "model_sha256 differ, e.g. after an export was stopped between files); export "
                                     "the set again with hyperset-export --loop")
        if self._model is not None:
            return cached_step_models(self._model, self._info)
        return None

    def _other_model(self, files: list[Path]) -> str | None:
        """Name of the first of `files` whose weight hash differs from the Loop graph's (None: all the same, or no
        hash recorded to compare)."""
        from .export import read_metadata

        mine = self.metadata.get("model_sha256")
        if not mine:
            return None
        for f in files:
            try:
                theirs = read_metadata(f).get("model_sha256")
            except Exception as e:  # onnx's DecodeError and friends: a truncated or foreign file
                raise OnnxModelError(f"{Path(f).name}: not a valid ONNX model (truncated or corrupted?): {e}") from None
            if theirs and theirs != mine:
                return Path(f).name
        return None

    def can_iterate(self) -> bool:
        return self._step_sessions is not None or self._steps_paths is not None or self._model is not None or (
            self._step_files() is not None)

    def check(self, iters: int, per_iteration: bool) -> None:
        """ValueError when this graph cannot run ``iters`` iterations (per iteration: without step graphs)."""
        if per_iteration and not self.can_iterate():
            raise ValueError(f"reading the prediction after every iteration (iterations 'auto', the app's frames) "
                             f"needs the step graphs next to {self.path.name} (hyperset-export --loop writes them); "
                             "without them it runs on the torch backend only")
        if int(iters) > MAX_ITERS:  # the torch path's limit (RecurrentCore.run); a Loop graph itself has none
            raise ValueError(f"iters = {iters}: at most {MAX_ITERS:,} iterations per layer")
        if not per_iteration and self.unrolled is not None and int(iters) != self.unrolled:
            raise ValueError(f"{self.path.name} is unrolled for {self.unrolled} iterations and cannot run {iters}; "
                             f"use {self.unrolled} iterations or export a Loop graph (hyperset-export --loop)")

    def _sessions(self) -> tuple[OrtSession, list[OrtSession], OrtSession]:
        if self._step_sessions is None:
            files = self._step_files()
            if files is None:
                self.check(1, True)
            options = {"intra_op_threads": self.session.session.get_session_options().intra_op_num_threads}
            dev = self.session.device
            stem, head = OrtSession(files["stem"], dev, **options), OrtSession(files["head"], dev, **options)
            steps = [OrtSession(p, dev, **options) for p in files["step"]]
            _expect_io(stem, None, ("x0",))
            for s in steps:
                _expect_io(s, ("x", "x0", "t"), ("x_next", *(f"energy_{e}" for e in self.energies)))
            _expect_io(head, ("x",), ("logits",))
            self._step_sessions = (stem, steps, head)
        return self._step_sessions

    def iterate(self, boards: torch.Tensor, iters: int) -> Generator[BackendStep, torch.Tensor | None, None]:
        """One :class:`~hyperset.backends.BackendStep` per iteration, from the ONNX step graphs; rows to keep may
        be sent (``generator.send``), as the protocol says."""
        stem, steps, head = self._sessions()
        device = boards.device
        n = boards.shape[0]
        x0 = stem.run({stem.input_names[0]: boards.detach().cpu().numpy().astype(np.int64, copy=False)})["x0"]
        x0 = _checked(x0, (n, *x0.shape[1:]), "x0", stem.path.name)
        x, step = x0, 0

        def run_step(s: OrtSession, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            out, rows = s.run(feeds), len(feeds["x"])  # one slice: checked before the slices are joined
            checked = {"x_next": _checked(out["x_next"], feeds["x"].shape, "x_next", s.path.name)}
            for k in self.energies:
                checked[f"energy_{k}"] = _checked(out[f"energy_{k}"], (rows,), f"energy_{k}", s.path.name)
            return checked

        for s in steps:
            for t in range(1, int(iters) + 1):
                out = by_rows(lambda feeds, s=s: run_step(s, feeds),
                              {"x": x, "x0": x0, "t": np.asarray(t, dtype=np.int64)}, {"x", "x0"}, self.rows)
                x = out["x_next"]
                step += 1
                logits = _checked(head.run({"x": x})["logits"], (len(x), 81, 9), "logits", head.path.name)
                logits = torch.from_numpy(logits).float().to(device)
                energies = {k: torch.from_numpy(out[f"energy_{k}"]).float().to(device) for k in self.energies}
                rows = yield BackendStep(step, logits, energies)
                if rows is not None:
                    keep = rows.detach().cpu().numpy()
                    x, x0 = x[keep], x0[keep]

    def run(self, boards: torch.Tensor, iters: int, energies: bool = True
            ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self(boards, iters)

    def __call__(self, boards: torch.Tensor, iters: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        iters = int(iters)
        if not 0 <= iters <= MAX_ITERS:
            raise ValueError(f"iters = {iters}: must be between 0 and {MAX_ITERS:,} iterations per layer")
        feeds: dict[str, Any] = {self.input: boards.detach().cpu().numpy().astype(np.int64, copy=False)}
        if self.graph == "loop":
            feeds["iters"] = np.asarray(iters, dtype=np.int64)
        elif iters != self.unrolled:
            raise OnnxModelError(f"{self.path.name} is unrolled for {self.unrolled} iterations and cannot run "
                                 f"{iters}; export a Loop graph (hyperset-export --loop) for any count")
        out = by_rows(lambda f: self._outputs(self.session.run(f), len(f[self.input]), self.n_layers * iters),
                      feeds, {self.input}, self.rows)
        device = boards.device
        logits = torch.from_numpy(out["logits"]).float().to(device)
        energies = {name: torch.from_numpy(out[f"energy_{name}"]).float().to(device) for name in self.energies}
        return logits, energies

    def _outputs(self, out: dict[str, np.ndarray], rows: int, iterations: int) -> dict[str, np.ndarray]:
        """The outputs of a pass over `rows` boards, checked (before the slices are joined): logits (rows, 81, 9)
        and each energy (iterations, rows), iterations = n_layers x iters; else an OnnxModelError naming the file."""
        name = self.path.name
        checked = {"logits": _checked(out["logits"], (rows, 81, 9), "logits", name)}
        for e in self.energies:
            a = out[f"energy_{e}"]
            if a.size == 0:  # no iterations: a Loop's empty scan output
                a = a.reshape(0, rows)
            checked[f"energy_{e}"] = _checked(a, (iterations, rows), f"energy_{e}", name)
        return checked

    def __repr__(self) -> str:
        return f"OnnxSolverBackend({str(self.path)!r}, graph={self.graph!r}, provider={self.session.provider!r})"


def create_backend(model: Any, *, info: dict[str, Any] | None = None, path: str | Path | None = None,
                   device: str = "auto", threads: int | None = None, **_: Any) -> OnnxSolverBackend:
    """The ONNX Runtime backend for ``model`` (the ``onnx`` backend factory of ``hyperset.backends``).

    Without ``path`` the model is exported as a Loop graph into the cache (once per set of weights), and its step
    graphs on first per-iteration use. Raises :class:`OnnxModelError` for a missing/corrupted file or a model
    whose metadata task is not "sudoku".
    """
    loop = cached_loop_model(model, info) if path is None else Path(path)
    session = OrtSession(loop, _ort_device(device), intra_op_threads=threads)
    backend = OnnxSolverBackend(session, model=model if path is None else None, info=info)
    if path is not None:
        _warn_if_other_model(model, backend)
    return backend


def attach_onnx_backend(solver: Any, onnx_path: str | Path | None = None, device: str = "auto", *,
                        threads: int | None = None) -> OnnxSolverBackend:
    """Set ``solver.backend`` to :func:`create_backend`'s backend and return it."""
    backend = create_backend(solver.model, info=solver.info, path=onnx_path, device=device, threads=threads)
    solver.backend = backend
    return backend


def _warn_if_other_model(model: Any, backend: OnnxSolverBackend) -> None:
    """The ONNX file may hold other weights than the solver's checkpoint: allowed, but say so."""
    from .export import model_fingerprint

    digest = backend.metadata.get("model_sha256")
    if digest and digest != model_fingerprint(model):
        warnings.warn(f"{backend.path.name} was exported from other weights than the loaded checkpoint; "
                      "the ONNX model's weights are used", stacklevel=3)


def _register() -> None:
    """Importing this module makes ``onnx`` a backend of ``hyperset.backends`` (the entry point does the same
    for an installed package)."""
    from hyperset.backends import register_backend

    register_backend("onnx", create_backend)


_register()
