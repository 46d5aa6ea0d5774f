"""Automatic device choice, reported honestly."""

from __future__ import annotations

import os
import platform
import sys

import torch


def in_onnx_export() -> bool:
    """torch.onnx.is_in_onnx_export() without importing torch.onnx, which costs a solve or an app start a good
    share of its start-up: an export has imported it before it begins, so while it is absent no export runs."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and onnx.is_in_onnx_export()


def in_graph() -> bool:
    """Whether the code runs while a graph is made (a trace, an ONNX export, torch.compile), where values cannot be
    read back and the work must not depend on them."""
    return torch.jit.is_tracing() or in_onnx_export() or torch.compiler.is_compiling()


def versions(*tensors: torch.Tensor) -> tuple[int, ...]:
    """The tensors' in-place change counters (-1 for an inference tensor, which has none and cannot change): a
    value kept for them stays good while these are unchanged."""
    return tuple(-1 if v.is_inference() else v._version for v in tensors)


def check_device_name(requested: str) -> tuple[str, str]:
    """(kind, index) of a device name the commands take (auto, cpu, cuda, cuda:N, mps), whatever this machine
    has; another name is a ValueError that names --device."""
    kind, _, index = requested.lower().partition(":")
    if kind not in ("auto", "cpu", "cuda", "mps") or (index and not (kind == "cuda" and index.isdigit())):
        raise ValueError(f"--device {requested!r}: expected auto, cpu, cuda, cuda:N or mps")
    return kind, index


def pick_device(requested: str = "auto") -> torch.device:
    """auto: CUDA when it is really usable, else Apple MPS, else CPU. A device that cannot be had ('cuda' without
    CUDA, a misspelt name) is a ValueError that names --device."""
    requested = requested.lower()
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind, index = check_device_name(requested)
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but PyTorch sees no CUDA device "
                         f"(torch {torch.__version__}, built with CUDA {torch.version.cuda or 'none'})")
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"--device {requested}: PyTorch sees {torch.cuda.device_count()} CUDA device(s), "
                         f"numbered from 0")
    if kind == "mps" and not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        raise ValueError("--device mps was requested but PyTorch sees no Apple MPS device")
    return torch.device(requested)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index or 0} ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        n = torch.get_num_threads()
        return f"cpu ({n} thread{'s' if n != 1 else ''})"
    return str(device)


DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


def dtype_name(dtype: torch.dtype) -> str:
    """The short name reports use for a floating dtype ("fp32", "bf16", "fp16", "fp64")."""
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def autocast_name(dtype: torch.dtype | None) -> str:
    """How reports name the precision of work run under autocast to `dtype` (None: no autocast): "fp32" or e.g.
    "bf16 autocast"."""
    return "fp32" if dtype is None else f"{dtype_name(dtype)} autocast"


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """Mixed precision: bf16 on CUDA with bf16 support (else fp16), bf16 on CPUs with native support."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return None


def _cpuinfo_value(key: str) -> str | None:
    """The first value of `key` in /proc/cpuinfo ("model name", "vendor_id"), None where missing, empty or not
    readable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's model name as the OS reports it (/proc/cpuinfo), else what the platform module knows."""
    return _cpuinfo_value("model name") or platform.processor() or platform.machine() or "cpu"


def cpu_vendor() -> str | None:
    """The CPU's vendor as the OS reports it (/proc/cpuinfo's vendor_id: "GenuineIntel", "AuthenticAMD"), None
    where not known."""
    return _cpuinfo_value("vendor_id")


def made_by_intel_or_unknown() -> bool:
    """Whether the CPU's vendor is Intel or not known: where the library keeps PyTorch's own products by default
    (MKL's fast paths are Intel's; `hyperset.accel.fused.matmul`'s oneDNN products were measured faster on others)."""
    return cpu_vendor() in (None, "GenuineIntel")


def cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def usable_cores() -> int:
    """Number of CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def cpu_threads(requested: int | None = None) -> int:
    """Threads for CPU inference: `requested`, else the usable cores that other work leaves idle (by the 1-minute
    load average), at least one. More threads than idle cores make OpenMP threads wait on each other, and a solve
    beside other work then runs many times slower than on one thread (measured in docs/sudoku.md, `hyperset-solve`)."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be at least 1, got {requested}")
        return requested
    cores = usable_cores()
    try:
        busy = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return cores
    return max(1, min(cores, cores - round(busy)))


def set_cpu_threads(requested: int | None = None) -> int:
    """Give PyTorch `cpu_threads(requested)` threads and return that number (for ONNX Runtime sessions too)."""
    threads = cpu_threads(requested)
    torch.set_num_threads(threads)
    return threads
