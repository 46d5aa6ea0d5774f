"""Inference on a CPU in slices of rows whose working set stays in cache.

At inference on a CPU the batch runs through each update in slices of rows whose largest intermediate (the
feedforward's hidden U, or the attention maps) stays near `SLICE_BYTES`: a core's L2 cache holds a slice's working
set, where a whole batch of 128 Sudoku boards (21 MB of U) would go through memory at every op. The arithmetic is
the same row by row (bench/onnx_bench.py measures the difference).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

SLICE_BYTES = 2 << 20


def cache_rows(cfg: Any, nbytes: int | None = None, state_only: bool = False) -> int:
    """Rows of a batch whose widest per-update intermediate (fp32) takes about `nbytes` (default SLICE_BYTES), for
    a model config with dim, ff_hidden, heads and seq_len. `state_only`: the update's kernels write nothing wider
    than the state (the feedforward's hidden rows and the attention maps stay inside them)."""
    widest = cfg.dim if state_only else max(cfg.dim, cfg.ff_hidden, cfg.heads * cfg.seq_len, 1)
    return max(1, (SLICE_BYTES if nbytes is None else nbytes) // (4 * cfg.seq_len * widest))


def slice_rows(cfg: Any, batch: int, device: torch.device, state_only: bool = False) -> int:
    """Rows per slice for an inference update of `batch` rows on `device` (`cache_rows`): 0 (the whole batch at
    once) on an accelerator, with gradients, while tracing or compiling, or when the batch fits in one slice."""
    if device.type != "cpu" or torch.is_grad_enabled() or torch.jit.is_tracing() or torch.compiler.is_compiling():
        return 0
    rows = cache_rows(cfg, state_only=state_only)
    return rows if batch > rows else 0


def by_rows(fn: Callable[..., Any], rows: int, *tensors: Tensor) -> Any:
    """fn(*tensors), computed `rows` rows at a time (all the tensors sliced alike; 0-dim ones passed whole) and
    joined again: a tensor, a tuple of tensors or a {name: tensor} dict, as fn returns it."""
    if not rows:
        return fn(*tensors)
    parts = [fn(*(v[i:i + rows] if v.dim() else v for v in tensors)) for i in range(0, len(tensors[0]), rows)]
    first = parts[0]
    if isinstance(first, dict):
        return {k: torch.cat([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(torch.cat([p[j] for p in parts]) for j in range(len(first)))
    return torch.cat(parts)
