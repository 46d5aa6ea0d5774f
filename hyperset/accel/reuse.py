"""Head projections handed from the trace's energy to the next update, at inference.

A traced pass evaluates E_ATTN at every state x_t (``hyperset.core.Trace.record``), and the update that follows
starts from the same x_t: both put the same head projections Zn = RMSNorm(split(x_t W)) on their spheres (the
energy without the gain, the update before multiplying by it). `remember` keeps the energy's Zn, and the update's
`recall` takes it instead of making it again: one product X W and one normalisation fewer per iteration, the same
values. A kept Zn serves one recall only, and only for the same state and weight objects, neither changed in place
since, and the same heads and eps; anything else is a miss, and the caller computes Zn as before. It is used where
no gradient is taken (the acceleration policy's `reuse`), so no graph is kept alive through it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from torch import Tensor

from ..device import versions

_slot = threading.local()


def remember(X: Tensor, W: Tensor, heads: int, eps: float, Zn: Tensor) -> None:
    """Keep Zn, the normalised head projections of state X by weight W, for the next `recall` on this thread."""
    _slot.kept = (weakref.ref(X), weakref.ref(W), versions(X, W), heads, eps, Zn)


def recall(X: Tensor, W: Tensor, heads: int, eps: float) -> Tensor | None:
    """The Zn `remember` kept for exactly this X, W, heads and eps (then forgotten), else None."""
    kept: Any = getattr(_slot, "kept", None)
    if kept is None:
        return None
    _slot.kept = None
    x_ref, w_ref, kept_versions, h, e, Zn = kept
    if x_ref() is X and w_ref() is W and h == heads and e == eps and kept_versions == versions(X, W):
        return Zn
    return None


def forget() -> None:
    """Drop what is kept (tests; a pass that ends keeps at most one Zn alive until the next)."""
    _slot.kept = None
