"""Token masking and MaskGIT iterative decoding, independent of the token model.

The token model is any callable ``logits_fn(codes (B, N) long) -> logits (B, N, V)``; masked positions
hold ``mask_id`` (e.g. 1024 for a 1024-code VQGAN). Follows MaskGIT-pytorch v1 (``adap_sche`` and
``sample``) and the Hyper-SET MIM recipe (training mask rate 0.4 * r, r ~ U(0, 1); evaluation at fixed
ratios; 24 arccos steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

MODES = ("root", "linear", "square", "cosine", "arccos")


def _check_ratio(name: str, value: object) -> None:
    """A masking ratio: a number in [0, 1] (1.5 masked everything and -0.5 nothing, silently)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def random_token_mask(
    shape: tuple[int, ...], max_ratio: float = 0.4, generator: torch.Generator | None = None
) -> Tensor:
    """Training mask: per sample r ~ U(0, 1), each token masked independently with probability max_ratio * r.

    ``shape`` is (B, N) or (B, h, w); returns a bool tensor of that shape (True = masked).
    """
    _check_ratio("max_ratio", max_ratio)
    r = torch.rand(shape[0], generator=generator)
    p = (max_ratio * r).view(-1, *([1] * (len(shape) - 1)))
    return torch.rand(shape, generator=generator) < p


def mask_by_ratio(shape: tuple[int, ...], ratio: float, generator: torch.Generator | None = None) -> Tensor:
    """Evaluation mask: exactly round(ratio * N) tokens masked per sample, at uniformly random positions."""
    _check_ratio("ratio", ratio)
    b, n = shape[0], math.prod(shape[1:])
    k = int(math.floor(ratio * n + 0.5))
    rank = torch.rand(b, n, generator=generator).argsort(1).argsort(1)  # a random permutation per sample
    return (rank < k).view(shape)


def schedule(steps: int, n_tokens: int, mode: str = "arccos") -> Tensor:
    """Tokens revealed at each of ``steps`` steps, summing exactly to ``n_tokens`` (MaskGIT v1 ``adap_sche``).

    With r = linspace(1, 0, steps) the shape is root 1 - sqrt(r), linear 1 - r, square 1 - r^2, cosine
    cos(r pi / 2), arccos arccos(r) / (pi / 2); it is normalised to ``n_tokens`` and rounded, zeros become 1
    and the last step absorbs the remainder. When ``n_tokens`` is too small for that (fewer tokens than
    steps), the excess is taken back from the last steps, so some late steps reveal nothing.
    """
    if mode not in MODES:
        raise ValueError(f"unknown schedule mode {mode!r}; expected one of {MODES}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if n_tokens <= 0:
        return torch.zeros(steps, dtype=torch.long)
    if steps == 1:
        return torch.tensor([n_tokens], dtype=torch.long)
    r = torch.linspace(1, 0, steps, dtype=torch.float64)
    shape = {
        "root": lambda: 1 - r.sqrt(),
        "linear": lambda: 1 - r,
        "square": lambda: 1 - r**2,
        "cosine": lambda: torch.cos(r * math.pi / 2),
        "arccos": lambda: torch.arccos(r) / (math.pi / 2),
    }[mode]()
    sche = (shape / shape.sum() * n_tokens).round().long()
    sche[sche == 0] = 1
    sche[-1] += n_tokens - sche.sum()
    excess = -int(sche[-1]) if sche[-1] < 0 else 0
    sche[-1] = sche[-1].clamp(min=0)
    for i in range(steps - 2, -1, -1):  # only when n_tokens < steps: undo the zeros-become-1 surplus
        if excess == 0:
            break
        take = min(excess, int(sche[i]))
        sche[i] -= take
        excess -= take
    return sche


@torch.no_grad()
def decode(
    logits_fn: Callable[[Tensor], Tensor],
    codes: Tensor,
    mask: Tensor,
    mask_id: int,
    steps: int = 24,
    temperature: float = 1.0,
    mode: str = "arccos",
    randomize_temp: float = 0.0,
    generator: torch.Generator | None = None,
    on_step: Callable[[int, Tensor], None] | None = None,
) -> Tensor:
    """MaskGIT iterative decoding: fill the masked tokens of ``codes`` over ``steps`` steps.

    Args:
        logits_fn: token model, (B, N) long -> (B, N, V) logits. Classes >= ``mask_id`` are never sampled.
        codes: (B, N) or (B, h, w) long; values under ``mask`` are ignored. Unmasked tokens are never changed.
        mask: bool, same shape, True = unknown. Samples may have different numbers of masked tokens (each gets
            its own schedule); an all-True mask generates from a blank canvas.
        mask_id: token value written at unknown positions when calling ``logits_fn``.
        steps: decoding steps.
        temperature: softmax temperature, p = softmax(logits / temperature); 0 means argmax. MaskGIT v1
            multiplies logits by ``sm_temp`` instead, so temperature 1 equals its default sm_temp 1
            (temperature t corresponds to sm_temp 1/t).
        mode: reveal schedule, see :func:`schedule`.
        randomize_temp: scale of the Gumbel noise added to log-confidences, decayed as (1 - step / steps)
            (MaskGIT v1 ``randomize="linear"`` with ``r_temp``); 0 ranks by confidence alone.
        generator: CPU generator for sampling and noise (reproducible decoding).
        on_step: called after each step as ``on_step(step, codes)`` with a copy of the current codes (unknown
            positions hold ``mask_id``).

    Returns:
        codes with every masked position filled, same shape as the input.
    """
    shape = codes.shape
    b = shape[0]
    for name, value in (("temperature", temperature), ("randomize-temp", randomize_temp)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    unknown = mask.reshape(b, -1).bool()
    cur = codes.reshape(b, -1).clone()
    cur[unknown] = mask_id
    n = cur.shape[1]
    cache: dict[int, Tensor] = {}
    counts = [int(c) for c in unknown.sum(1)]
    sched = torch.stack([cache.setdefault(c, schedule(steps, c, mode)) for c in counts]).to(cur.device)

    for step in range(steps):
        if not unknown.any():
            break
        logits = logits_fn(cur).reshape(b, n, -1)[..., :mask_id].float()  # the mask class is never sampled
        if temperature == 0:
            pred = logits.argmax(-1)
            probs = logits.softmax(-1)
        else:
            probs = (logits / temperature).softmax(-1)
            flat = probs.reshape(-1, probs.shape[-1]).cpu()
            pred = torch.multinomial(flat, 1, generator=generator).view(b, n).to(cur.device)
        conf = probs.gather(-1, pred[..., None]).squeeze(-1).clamp_min(1e-30).log()
        if randomize_temp > 0:
            u = torch.rand(b, n, generator=generator, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
            gumbel = (-(-u.log()).log()).float().to(cur.device)
            conf = conf + randomize_temp * (1 - step / steps) * gumbel
        conf = conf.masked_fill(~unknown, float("-inf"))
        rank = conf.argsort(dim=1, descending=True, stable=True).argsort(dim=1)  # 0 = most confident
        k = torch.minimum(sched[:, step], unknown.sum(1))
        reveal = (rank < k[:, None]) & unknown
        cur[reveal] = pred[reveal]
        unknown = unknown & ~reveal
        if on_step is not None:
            on_step(step, cur.view(shape).clone())
    return cur.view(shape)
