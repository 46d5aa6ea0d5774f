"""Automatic device choice, reported honestly."""

from __future__ import annotations

import torch


def pick_device(requested: str = "auto") -> torch.device:
    """auto: CUDA when it is really usable, else Apple MPS, else CPU. 'cuda' without CUDA is an error."""
    requested = requested.lower()
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was requested but PyTorch sees no CUDA device "
                           f"(torch {torch.__version__}, built with CUDA {torch.version.cuda or 'none'})")
    return torch.device(requested)


def describe(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index or 0} ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(device)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """Mixed precision: bf16 on CUDA with bf16 support (else fp16), bf16 on CPUs with native support."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return None


def cpu_has_native_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
