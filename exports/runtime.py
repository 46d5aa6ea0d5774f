"""Honest ONNX Runtime provider choice and a small session wrapper.

Why this module exists:

* ``onnxruntime-gpu`` lists ``CUDAExecutionProvider`` in ``get_available_providers()`` even on a machine
  without a GPU, and an ``InferenceSession`` that asks for CUDA silently falls back to the CPU (one log line,
  no exception). We therefore only ask for CUDA after a pre-check that the driver and the CUDA/cuDNN
  libraries the wheel was built for really load, and afterwards we read ``sess.get_providers()`` to report
  the provider that is actually used.
* ``onnxruntime`` and ``onnxruntime-gpu`` both install into the same ``onnxruntime/`` folder; with both
  installed, the last one wins silently. :func:`check_single_runtime` detects that.

``onnxruntime`` is imported lazily, so this module can diagnose a broken installation before importing it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import io
import itertools
import math
import os
import platform
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from hyperset.config import MAX_ITERS, MAX_SIZES

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"

#: Distributions that all install the same top-level ``onnxruntime`` package (at most one may be installed).
ORT_DISTRIBUTIONS: tuple[str, ...] = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-directml",
    "onnxruntime-openvino",
    "onnxruntime-qnn",
    "onnxruntime-rocm",
    "onnxruntime-training",
    "onnxruntime-silicon",
)

Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")

GRAPH_OPT_LEVELS: tuple[str, ...] = ("disable", "basic", "extended", "layout", "all")


class RuntimeConflictError(RuntimeError):
    """More than one ONNX Runtime distribution is installed in this environment."""


class ProviderError(RuntimeError):
    """The requested execution provider cannot be used."""


class OnnxModelError(RuntimeError):
    """An ONNX model file is missing, unreadable, or not the expected kind of model."""


# ----------------------------------------------------------------------------------------------------
# Installed distributions
# ----------------------------------------------------------------------------------------------------


def installed_ort_distributions(lookup: Callable[[str], str] | None = None) -> dict[str, str]:
    """Return ``{distribution: version}`` for every installed ONNX Runtime distribution.

    ``lookup`` behaves like :func:`importlib.metadata.version` (raises ``PackageNotFoundError`` when the
    distribution is not installed); tests inject a fake.
    """
    lookup = lookup or importlib.metadata.version
    found: dict[str, str] = {}
    for name in ORT_DISTRIBUTIONS:
        try:
            found[name] = lookup(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _ort_package_dir() -> str:
    """Best guess of the installed ``onnxruntime/`` folder, without importing it."""
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return str(next(iter(spec.submodule_search_locations)))
    return "<site-packages>/onnxruntime"


def check_single_runtime(lookup: Callable[[str], str] | None = None) -> str | None:
    """Raise :class:`RuntimeConflictError` if several ONNX Runtime wheels are installed.

    Returns the name of the single installed distribution (e.g. ``"onnxruntime-gpu"``), or ``None`` when none
    is installed according to the package metadata.
    """
    found = installed_ort_distributions(lookup)
    if len(found) <= 1:
        return next(iter(found), None)
    listed = " and ".join(f"{name} {version}" for name, version in found.items())
    names = " ".join(found)
    pick = "onnxruntime-gpu" if "onnxruntime-gpu" in found else next(iter(found))
    raise RuntimeConflictError(
        f"Conflicting ONNX Runtime installations: {listed} are all installed in this environment.\n"
        "These wheels all write into the same 'onnxruntime/' package folder, so the one installed last "
        "silently overwrites the others (CUDA support can disappear without any error, and uninstalling "
        "one of them leaves a broken 'onnxruntime' package).\n"
        "Fix:\n"
        f"  pip uninstall -y {names}\n"
        f"  rm -rf {_ort_package_dir()}   # remove the leftover folder\n"
        f"  pip install {pick}   # reinstall exactly one (plain 'onnxruntime' for CPU only)"
    )


# ----------------------------------------------------------------------------------------------------
# CUDA pre-check
# ----------------------------------------------------------------------------------------------------


def _ort() -> Any:
    """Import onnxruntime lazily."""
    import onnxruntime

    return onnxruntime


def ort_build_info() -> dict[str, str | None]:
    """``package_name``, ``version``, ``cuda_version`` and ``cudnn_version`` of the installed wheel build."""
    info: dict[str, str | None] = {
        "package_name": None,
        "version": None,
        "cuda_version": None,
        "cudnn_version": None,
    }
    try:
        from onnxruntime.capi import build_and_package_info as build
    except Exception:  # any import problem just means "unknown"
        return info
    info["package_name"] = getattr(build, "package_name", None)
    info["version"] = getattr(build, "__version__", None)
    info["cuda_version"] = getattr(build, "cuda_version", None) or None
    info["cudnn_version"] = getattr(build, "cudnn_version", None) or None
    return info


def _major(version: str | None) -> int | None:
    """Major number of a version string like ``"13.0"``, or None."""
    if not version:
        return None
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def required_cuda_libraries(
    cuda_version: str | None, cudnn_version: str | None = None, system: str | None = None
) -> list[tuple[str, str]]:
    """``(library file, description)`` pairs the CUDA provider of this build needs, in probe order.

    The driver comes first, so that a machine without a GPU is reported as such.
    """
    system = system or platform.system()
    cuda = _major(cuda_version)
    cudnn = _major(cudnn_version)
    if cudnn is None and cuda is not None:
        cudnn = 9 if cuda >= 12 else 8
    windows = system == "Windows"
    libs = [("nvcuda.dll" if windows else "libcuda.so.1", "NVIDIA driver")]
    if cuda is not None:
        if windows:
            libs += [
                (f"cudart64_{cuda}.dll", f"CUDA {cuda} runtime"),
                (f"cublasLt64_{cuda}.dll", f"cuBLASLt for CUDA {cuda}"),
                (f"cublas64_{cuda}.dll", f"cuBLAS for CUDA {cuda}"),
                ("curand64_10.dll", "cuRAND"),
            ]
        else:
            libs += [
                (f"libcudart.so.{cuda}", f"CUDA {cuda} runtime"),
                (f"libcublasLt.so.{cuda}", f"cuBLASLt for CUDA {cuda}"),
                (f"libcublas.so.{cuda}", f"cuBLAS for CUDA {cuda}"),
                ("libcurand.so.10", "cuRAND"),
            ]
    if cudnn is not None:
        libs.append((f"cudnn64_{cudnn}.dll" if windows else f"libcudnn.so.{cudnn}", f"cuDNN {cudnn}"))
    return libs


def _silent_preload() -> None:
    """Call ``onnxruntime.preload_dlls()`` (if it exists) without letting it print or warn."""
    preload = getattr(_ort(), "preload_dlls", None)
    if preload is None:
        return
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        preload()


@dataclass
class CudaProbe:
    """Everything :func:`cuda_usable` looks at; replace fields to test without a GPU."""

    available_providers: Callable[[], Sequence[str]]
    load_library: Callable[[str], object]
    preload: Callable[[], None] | None = None
    cuda_version: str | None = None
    cudnn_version: str | None = None
    system: str = ""

    @classmethod
    def default(cls) -> CudaProbe:
        """Probe the real onnxruntime installation and the real dynamic loader."""
        build = ort_build_info()
        return cls(
            available_providers=lambda: _ort().get_available_providers(),
            load_library=ctypes.CDLL,
            preload=_silent_preload,
            cuda_version=build["cuda_version"],
            cudnn_version=build["cudnn_version"],
            system=platform.system(),
        )


_CUDA_CACHE: tuple[bool, str] | None = None


def clear_cuda_cache() -> None:
    """Forget the cached result of :func:`cuda_usable`."""
    global _CUDA_CACHE
    _CUDA_CACHE = None


def _probe_cuda(probe: CudaProbe) -> tuple[bool, str]:
    """Run the CUDA pre-check with the given probe (uncached)."""
    try:
        providers = list(probe.available_providers())
    except Exception as exc:
        return False, f"onnxruntime could not be queried: {exc}"
    if CUDA_PROVIDER not in providers:
        return False, (
            f"this onnxruntime build has no {CUDA_PROVIDER} (available: {', '.join(providers) or 'none'}); "
            "to use an NVIDIA GPU, replace it with onnxruntime-gpu: pip uninstall -y onnxruntime && "
            "pip install 'hyperset[onnx-gpu]'"
        )
    if probe.preload is not None:
        with contextlib.suppress(Exception):
            probe.preload()
    cuda_major = _major(probe.cuda_version)
    libs = required_cuda_libraries(probe.cuda_version, probe.cudnn_version, probe.system or None)
    for lib, what in libs:
        try:
            probe.load_library(lib)
        except OSError as exc:
            if what == "NVIDIA driver":
                hint = "no NVIDIA GPU driver on this machine"
            else:
                hint = (
                    f"this onnxruntime-gpu wheel needs CUDA {probe.cuda_version} and cuDNN "
                    f"{_major(probe.cudnn_version) or (9 if (cuda_major or 0) >= 12 else 8)}; "
                    "install them with `pip install onnxruntime-gpu[cuda,cudnn]` or from NVIDIA"
                )
            return False, f"{lib} ({what}) cannot be loaded: {hint} [{exc}]"
    build = f"CUDA {probe.cuda_version}" if probe.cuda_version else "CUDA (build version unknown)"
    loaded = ", ".join(name for name, _ in libs)
    return True, f"{CUDA_PROVIDER} available and its libraries load ({build}: {loaded})"


def cuda_usable(probe: CudaProbe | None = None, *, refresh: bool = False) -> tuple[bool, str]:
    """Return ``(True, details)`` only if the CUDA provider can really load, else ``(False, reason)``.

    The reason names the first library that cannot be loaded. The result for the real machine
    (``probe=None``) is cached; pass ``refresh=True`` to probe again. An explicit ``probe`` is never cached.
    """
    global _CUDA_CACHE
    if probe is not None:
        return _probe_cuda(probe)
    if _CUDA_CACHE is None or refresh:
        _CUDA_CACHE = _probe_cuda(CudaProbe.default())
    return _CUDA_CACHE


def choose_providers(
    device: Device = "auto", *, cuda_check: Callable[[], tuple[bool, str]] | None = None
) -> tuple[list[str], str]:
    """Return ``(providers, reason)`` for ``device`` in ``"auto" | "cpu" | "cuda"``.

    ``"cuda"`` raises :class:`ProviderError` when CUDA is unusable (never silently runs on the CPU);
    ``"auto"`` uses CUDA when usable and otherwise the CPU, with the reason.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return [CPU_PROVIDER], "CPU requested"
    ok, why = (cuda_check or cuda_usable)()
    if ok:
        return [CUDA_PROVIDER, CPU_PROVIDER], why
    if device == "cuda":
        raise ProviderError(f"CUDA was requested but cannot be used: {why}. Use --device cpu or auto.")
    return [CPU_PROVIDER], f"running on CPU because CUDA is not usable: {why}"


def _device_of(provider: str) -> str:
    """Map an execution provider name to ``"cuda"`` or ``"cpu"``."""
    return "cuda" if provider in (CUDA_PROVIDER, "TensorrtExecutionProvider") else "cpu"


def default_threads() -> int:
    """CPU threads for a session: the usable cores other work leaves idle (hyperset.device.cpu_threads)."""
    from hyperset.device import cpu_threads

    return cpu_threads()


# ----------------------------------------------------------------------------------------------------
# Model files and sessions
# ----------------------------------------------------------------------------------------------------


def _model_error(path: Path, exc: BaseException) -> OnnxModelError:
    """Turn an onnxruntime load exception into an :class:`OnnxModelError`."""
    text = str(exc)
    kind = type(exc).__name__
    invalid = kind == "InvalidProtobuf" or any(
        s in text for s in ("Protobuf parsing failed", "No graph was found", "ParseFromString")
    )
    if invalid:
        return OnnxModelError(f"{path}: not a valid ONNX model (truncated or corrupted?) [{kind}: {text}]")
    if kind == "NoSuchFile":
        return OnnxModelError(f"{path}: file (or its external data file) not found [{text}]")
    return OnnxModelError(f"{path}: ONNX Runtime could not load the model [{kind}: {text}]")


def _run_error(path: Path, exc: BaseException) -> OnnxModelError:
    """An onnxruntime run exception as an :class:`OnnxModelError` naming the file, with the first line of ORT's
    message (the rest repeats it or is empty)."""
    lines = str(exc).strip().splitlines()
    return OnnxModelError(f"{path}: ONNX Runtime failed to run the model [{type(exc).__name__}: "
                          f"{lines[0] if lines else 'no message'}]")


def expect_task(metadata: Mapping[str, str], task: str, name: str = "model.onnx") -> None:
    """Raise :class:`OnnxModelError` unless the model metadata prop ``task`` equals ``task``."""
    actual = metadata.get("task")
    if actual is None:
        raise OnnxModelError(f"{name} has no 'task' metadata, expected a '{task}' model (Hyper-SET export)")
    if actual != task:
        raise OnnxModelError(f"{name} is a '{actual}' model, expected '{task}'")


def _graph_opt_level(level: str) -> Any:
    """Map a short name to ``onnxruntime.GraphOptimizationLevel``."""
    levels = _ort().GraphOptimizationLevel
    table = {
        "disable": "ORT_DISABLE_ALL",
        "basic": "ORT_ENABLE_BASIC",
        "extended": "ORT_ENABLE_EXTENDED",
        "layout": "ORT_ENABLE_LAYOUT",
        "all": "ORT_ENABLE_ALL",
    }
    if level not in table:
        choices = ", ".join(GRAPH_OPT_LEVELS)
        raise ValueError(f"graph_optimization_level must be one of {choices}, got {level!r}")
    if not hasattr(levels, table[level]):
        raise ValueError(f"graph_optimization_level {level!r} needs a newer onnxruntime than {_ort().__version__} "
                         f"(it has no GraphOptimizationLevel.{table[level]})")
    return getattr(levels, table[level])


# One graph run may take GRAPH_SECONDS plus SECONDS_PER_ROW_ITERATION for each row of its batch and each iteration
# it computes, then it is stopped: a Loop whose condition never turns false (a graph received from someone else)
# would run until the process is killed. Real runs need far less: the largest preset (mim-base-24x8) computes 9.1
# GFLOP per row and iteration with its energies (bench/flops.py), the shipped models 0.03-0.05 GFLOP; GRAPH_SECONDS
# leaves room for a process's first run and a loaded machine.
# $HYPERSET_GRAPH_SECONDS, or OrtSession's graph_seconds, replaces the sum by one bound for every run.
GRAPH_SECONDS = 60.0
SECONDS_PER_ROW_ITERATION = 1.0
GRAPH_SECONDS_ENV = "HYPERSET_GRAPH_SECONDS"


def graph_seconds_setting(value: float | None = None) -> float | None:
    """The bound of every graph run that `value` or else $HYPERSET_GRAPH_SECONDS sets (None: neither does, the
    bound scales with the run); a ValueError unless it is a number of seconds > 0."""
    name = "graph_seconds"
    if value is None:
        raw = os.environ.get(GRAPH_SECONDS_ENV, "").strip()
        if not raw:
            return None
        name, value = GRAPH_SECONDS_ENV, raw
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} = {str(value)[:40]!r}: expected a number of seconds > 0")
    return seconds


class _Watchdog:
    """One daemon thread that sets ``terminate`` on the RunOptions of each run past its deadline (a thread per
    run would cost more than a step graph's run on a few boards takes)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._runs: dict[int, tuple[float, Any]] = {}  # key -> (deadline, RunOptions)
        self._fired: set[int] = set()
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None
        self._wakes = math.inf  # the deadline the thread sleeps until

    def watch(self, options: Any, seconds: float) -> int:
        """Set ``options.terminate`` once `seconds` have passed, unless `release` comes first; the run's key."""
        deadline = time.monotonic() + seconds
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="hyperset-graph-watchdog", daemon=True)
                self._thread.start()
            key = next(self._keys)
            self._runs[key] = (deadline, options)
            if deadline < self._wakes:
                self._cond.notify()
            return key

    def release(self, key: int) -> bool:
        """Stop watching the run `key`; whether it was told to terminate."""
        with self._cond:
            self._runs.pop(key, None)
            fired = key in self._fired
            self._fired.discard(key)
            return fired

    def _serve(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for key, (deadline, options) in list(self._runs.items()):
                    if deadline <= now:
                        options.terminate = True
                        del self._runs[key]
                        self._fired.add(key)
                self._wakes = min((deadline for deadline, _ in self._runs.values()), default=math.inf)
                self._cond.wait(None if self._wakes == math.inf else self._wakes - now)


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):  # a forked child has no watchdog thread, and its lock may be held
    os.register_at_fork(after_in_child=_WATCHDOG.__init__)


def _metadata_int(metadata: Mapping[str, str], key: str, most: int) -> int:
    """A count in the metadata of a graph (a file received from someone else), bounded to 1..most; 1 if absent
    or not a whole number."""
    raw = metadata.get(key, "").strip()
    return min(max(int(raw), 1), most) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else 1


class OrtSession:
    """An ``onnxruntime.InferenceSession`` that reports the provider it really runs on.

    Attributes: ``path``, ``provider`` (e.g. ``"CPUExecutionProvider"``), ``providers`` (all, in priority
    order), ``device`` (``"cuda"``/``"cpu"``), ``requested`` (the ``device`` argument), ``reason`` (why this
    provider), ``fallback_reason`` (set when CUDA passed the pre-check but ORT still came up on the CPU under
    ``device="auto"``), ``input_names``, ``output_names``, ``metadata``, ``session`` and ``graph_seconds`` (the
    bound of every run, or None: it scales with the run, see ``run_seconds``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        device: Device = "auto",
        *,
        intra_op_threads: int | None = None,
        graph_optimization_level: str = "all",
        log_severity: int = 3,
        cuda_check: Callable[[], tuple[bool, str]] | None = None,
        check_runtime: bool = True,
        cuda_tf32: bool = False,
        graph_seconds: float | None = None,
    ) -> None:
        """Open ``path`` on ``device``; ``log_severity`` 3 shows ORT errors only (0 verbose ... 4 fatal).

        On CUDA the fp32 matrix products run in full fp32 unless ``cuda_tf32`` (ONNX Runtime's own default is
        TF32, which moves the shipped model's logits by ~0.1 and its predictions at 48 iterations).
        ``graph_seconds``: the longest any run may take, else $HYPERSET_GRAPH_SECONDS, else GRAPH_SECONDS plus
        SECONDS_PER_ROW_ITERATION per row and iteration of the run; a run past it is stopped."""
        self.graph_seconds = graph_seconds_setting(graph_seconds)
        self.path = Path(path)
        if not self.path.exists():
            raise OnnxModelError(f"{self.path}: ONNX model file not found")
        if not self.path.is_file():
            raise OnnxModelError(f"{self.path}: not a file")
        if check_runtime:
            check_single_runtime()
        ort = _ort()
        requested_providers, self.reason = choose_providers(device, cuda_check=cuda_check)
        self.requested = device
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads if intra_op_threads is not None else default_threads()
        options.graph_optimization_level = _graph_opt_level(graph_optimization_level)
        options.log_severity_level = log_severity
        try:
            providers: list[Any] = [(p, {"use_tf32": str(int(cuda_tf32))}) if p == CUDA_PROVIDER else p
                                     for p in requested_providers]
            self.session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as exc:  # ORT raises its own exception classes
            raise _model_error(self.path, exc) from exc
        self.providers: list[str] = list(self.session.get_providers())
        self.provider: str = self.providers[0]
        self.device: str = _device_of(self.provider)
        self.fallback_reason: str | None = None
        if CUDA_PROVIDER in requested_providers and self.device != "cuda":
            msg = (
                f"CUDA passed the pre-check but ONNX Runtime created the session on {self.provider} "
                "(see the ONNX Runtime log; e.g. the driver is too old for this CUDA version, or no GPU "
                "is visible)"
            )
            if device == "cuda":
                raise ProviderError(msg)
            self.fallback_reason = msg
            self.reason = msg
        self._inputs = self.session.get_inputs()  # their names, types and shapes, checked at every run
        # a run's failure is raised (an OnnxModelError naming the file); at the default severity ONNX Runtime does
        # not also log it to stderr, where it would come before the commands' one-line error
        self._run_severity = 4 if log_severity == 3 else log_severity
        self.input_names: list[str] = [i.name for i in self._inputs]
        self.output_names: list[str] = [o.name for o in self.session.get_outputs()]
        self.metadata: dict[str, str] = dict(self.session.get_modelmeta().custom_metadata_map)
        self._unrolled = _metadata_int(self.metadata, "unrolled_iterations", MAX_ITERS)
        self._layers = _metadata_int(self.metadata, "n_layers", MAX_SIZES["n_layers"])

    def expect_task(self, task: str) -> None:
        """Raise :class:`OnnxModelError` unless this model's ``task`` metadata is ``task``."""
        expect_task(self.metadata, task, name=self.path.name)

    def run(
        self, feeds: Mapping[str, Any], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run the model; returns ``{output name: array}``. ONNX Runtime's failures (a node that cannot run on
        these inputs, memory) are an :class:`OnnxModelError` naming the file, with the first line of its message;
        so is a run that takes longer than ``run_seconds`` (it is stopped)."""
        missing = [n for n in self.input_names if n not in feeds]
        unknown = [n for n in feeds if n not in self.input_names]
        if missing or unknown:
            raise ValueError(
                f"{self.path.name}: bad inputs (missing: {missing or 'none'}, unknown: {unknown or 'none'}); "
                f"expected {self.input_names}"
            )
        if isinstance(output_names, str):
            output_names = [output_names]
        names = list(output_names) if output_names is not None else self.output_names
        wrong = [n for n in names if n not in self.output_names]
        if wrong:
            raise ValueError(f"{self.path.name}: unknown outputs {wrong}; it has {self.output_names}")
        arrays = {k: np.asarray(v) for k, v in feeds.items()}
        for info in self._inputs:
            self._check_input(info, arrays[info.name])
        options = _ort().RunOptions()  # one per run: its terminate flag stops this run alone
        options.log_severity_level = self._run_severity
        seconds = self.run_seconds(arrays)
        key = _WATCHDOG.watch(options, seconds)
        try:
            results = self.session.run(names, arrays, options)
        except Exception as exc:  # ORT raises its own exception classes (Fail, InvalidArgument, RuntimeException)
            if _WATCHDOG.release(key):
                raise OnnxModelError(f"{self.path}: the graph ran longer than {seconds:,.1f} s (a Loop that does "
                                     f"not end?); {GRAPH_SECONDS_ENV} sets the bound") from None
            raise _run_error(self.path, exc) from None
        finally:
            _WATCHDOG.release(key)
        return dict(zip(names, results))

    def run_seconds(self, feeds: Mapping[str, np.ndarray]) -> float:
        """The longest a run on `feeds` may take: ``graph_seconds`` if set, else GRAPH_SECONDS plus
        SECONDS_PER_ROW_ITERATION per row (the largest first dimension of the inputs) and iteration (the ``iters``
        input of a Loop graph, else the graph's ``unrolled_iterations``, times its ``n_layers``)."""
        if self.graph_seconds is not None:
            return self.graph_seconds
        rows = max((a.shape[0] for a in feeds.values() if a.ndim), default=1)
        iters = feeds.get("iters")
        n = self._unrolled
        if iters is not None and iters.size == 1 and iters.dtype.kind in "iu":
            n = min(max(int(iters.reshape(())), 1), MAX_ITERS)
        return GRAPH_SECONDS + SECONDS_PER_ROW_ITERATION * max(rows, 1) * n * self._layers

    def _check_input(self, info: Any, array: np.ndarray) -> None:
        """An input as the graph declares it (element type, rank, fixed sizes, no empty dimension), so that a
        mistake is a ValueError naming the input rather than ONNX Runtime's error (or a silent cast)."""
        want = _ORT_TYPES.get(info.type)
        if want is not None and array.dtype != want:
            raise ValueError(f"{self.path.name}: input {info.name!r} must be {np.dtype(want).name}, got "
                             f"{array.dtype.name}")
        if array.ndim != len(info.shape):
            raise ValueError(f"{self.path.name}: input {info.name!r} must have {len(info.shape)} dimensions "
                             f"{list(info.shape)}, got shape {list(array.shape)}")
        for k, (size, dim) in enumerate(zip(array.shape, info.shape)):
            if isinstance(dim, int) and size != dim:
                raise ValueError(f"{self.path.name}: input {info.name!r} must have size {dim} in dimension {k} "
                                 f"{list(info.shape)}, got shape {list(array.shape)}")
            if size == 0:
                raise ValueError(f"{self.path.name}: input {info.name!r} is empty (shape {list(array.shape)})")

    def describe(self) -> dict[str, Any]:
        """JSON-friendly summary of the session."""
        return {
            "path": str(self.path),
            "requested": self.requested,
            "provider": self.provider,
            "providers": self.providers,
            "device": self.device,
            "reason": self.reason,
            "fallback_reason": self.fallback_reason,
            "inputs": {i.name: {"shape": list(i.shape), "type": i.type} for i in self.session.get_inputs()},
            "outputs": {o.name: {"shape": list(o.shape), "type": o.type} for o in self.session.get_outputs()},
            "metadata": self.metadata,
        }

    def __repr__(self) -> str:
        return f"OrtSession({str(self.path)!r}, provider={self.provider!r}, device={self.device!r})"


# ONNX Runtime's element types -> the numpy dtype an input of that type must have
_ORT_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def describe_runtime() -> dict[str, Any]:
    """JSON-friendly description of the ONNX Runtime installation (for ``--json`` outputs and benchmarks)."""
    info: dict[str, Any] = {
        "distributions": installed_ort_distributions(),
        "distribution": None,
        "conflict": None,
    }
    try:
        info["distribution"] = check_single_runtime()
    except RuntimeConflictError as exc:
        info["conflict"] = str(exc)
    try:
        ort = _ort()
    except Exception as exc:
        info["import_error"] = f"{type(exc).__name__}: {exc}"
        return info
    build = ort_build_info()
    ok, why = cuda_usable()
    info.update(
        onnxruntime_version=getattr(ort, "__version__", None),
        build_package=build["package_name"],
        available_providers=list(ort.get_available_providers()),
        cuda_build_version=build["cuda_version"],
        cudnn_build_version=build["cudnn_version"],
        cuda_usable=ok,
        cuda_reason=why,
        default_device="cuda" if ok else "cpu",
        cpu_threads=default_threads(),
    )
    return info
