"""The energies of Hyper-SET as pure functions, and the geometry measures of the paper's figures.

Row-vector convention: X is (B, N, d), W is (d, H*p) so the projections are Z = X W, and D is (d, M) so
U = X D. Energies are per sample, summed over heads and tokens: shape (B,).

"Normalization first" (as the paper's figures): the energies are evaluated on the projections put on their
spheres by an RMSNorm *without* learnable gain. With `normalize=False` they are the raw energies, whose
autograd gradient the layer's update reproduces exactly (tests check this).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from . import config
from .accel import policy

PHI = {
    "sigmoid": (torch.sigmoid, lambda u: torch.sigmoid(u) * (1 - torch.sigmoid(u))),
    "relu": (F.relu, lambda u: (u > 0).to(u.dtype)),
    "softplus": (F.softplus, torch.sigmoid),
    "elu1": (lambda u: F.elu(u) + 1, lambda u: torch.where(u > 0, torch.ones_like(u), torch.exp(u))),
}


def sq_norm(x: Tensor) -> Tensor:
    """|x|^2 of each row, (..., 1), without materialising x^2 (a norm)."""
    onnx = policy(x).onnx
    if onnx is not None:
        return onnx.sq_norm(x)
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).square()


def inv_rms(x: Tensor, eps: float = 1e-6) -> Tensor:
    """1 / rms of each row, (..., 1): rsqrt(mean(x^2) + eps)."""
    return torch.rsqrt(sq_norm(x) / x.shape[-1] + eps)


def logsumexp(x: Tensor, dim: int = -1, bound: float | None = None) -> Tensor:
    """torch.logsumexp (`bound` >= |x|, where known, lets an export's form skip the max)."""
    onnx = policy(x).onnx
    if onnx is not None:
        return onnx.logsumexp(x, dim, bound)
    return torch.logsumexp(x, dim=dim)


def rms_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """Put each row on the sphere of radius sqrt(dim): the constraint of eq. (4)/(5)."""
    onnx = policy(x).onnx
    if onnx is not None:
        return onnx.rms_normalize(x, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def split_heads(z: Tensor, heads: int) -> Tensor:
    """(B, N, H*p) -> (B, H, N, p)."""
    b, n, _ = z.shape
    return z.view(b, n, heads, -1).transpose(1, 2)


def merge_heads(z: Tensor) -> Tensor:
    """(B, H, N, p) -> (B, N, H*p)."""
    b, h, n, p = z.shape
    return z.transpose(1, 2).reshape(b, n, h * p)


def head_projections(X: Tensor, W: Tensor, heads: int, normalize: bool = True, eps: float = 1e-6) -> Tensor:
    """z_i^h = W_h^T x_i (eq. 2), per head, optionally on the radius-sqrt(p) sphere (eq. 8): (B, H, N, p).

    At inference the normalised ones are handed on (``hyperset.accel.reuse``): the trace's energy at a state and
    the update from it make them once."""
    ops = policy(X)
    memo = ops.memo if normalize else None
    kept = memo.recall(X, W, heads, eps) if memo is not None else None
    if kept is not None:
        return kept
    Zn = ops.project_heads(X, W, heads, eps) if normalize and ops.project_heads is not None else None
    if Zn is None:
        XW = ops.matmul(X, W)
        if not normalize:
            return split_heads(XW, heads)
        Zn = ops.heads_rms(XW, heads, eps) if ops.heads_rms is not None else rms_normalize(split_heads(XW, heads), eps)
    if memo is not None:
        memo.remember(X, W, heads, eps, Zn)
    return Zn


# ---------------------------------------------------------------------------------------------------------------
# the registry: each energy beside its closed-form gradient


@dataclass(frozen=True)
class Energy:
    """One energy and its gradient, written like the paper.

    An attention energy takes head projections Z (B, H, N, p) and beta = 1/sqrt(p): ``value(Z, beta, phi,
    normalized)`` is E summed over heads and tokens (B,) (`normalized`: Z lies on the radius-sqrt(p) spheres, so
    |beta z_i.z_j| <= sqrt(p)), ``grad(Z, beta, phi)`` is dE/dZ (B, H, N, p). A feedforward energy takes hidden
    activations U (B, N, M): ``value(U, phi)`` is E (B,), ``grad(U, phi)`` is -dE/dU (B, N, M), the activation
    the update adds. `uses_phi`: whether the feature map `phi` (PHI's keys) changes it."""

    name: str
    formula: str
    value: Callable[..., Tensor]
    grad: Callable[..., Tensor]
    uses_phi: bool = False


ATTENTION: dict[str, Energy] = {}
FEEDFORWARD: dict[str, Energy] = {}


def _register(table: dict[str, Energy], key: str, energy: Energy) -> Energy:
    if not energy.name.isidentifier() or energy.name in table:
        raise ValueError(f"{key} energy {energy.name!r}: a new name made of letters, digits and _ is needed "
                         f"(taken: {', '.join(table)})")
    table[energy.name] = energy
    config.CHOICES[key] = tuple(table)  # a ModelConfig may now name it
    return energy


def register_attention(name: str, value: Callable[..., Tensor], grad: Callable[..., Tensor], *,
                       formula: str = "", uses_phi: bool = False) -> Energy:
    """Add an attention energy (see `Energy`): `ModelConfig(attention=name)` then builds layers that descend it,
    and every test of the energies and of the update covers it."""
    return _register(ATTENTION, "attention", Energy(name, formula, value, grad, uses_phi))


def register_feedforward(name: str, value: Callable[..., Tensor], grad: Callable[..., Tensor], *,
                         formula: str = "", uses_phi: bool = False) -> Energy:
    """Add a feedforward energy (see `Energy`), as `register_attention`."""
    return _register(FEEDFORWARD, "feedforward", Energy(name, formula, value, grad, uses_phi))


def _lookup(table: dict[str, Energy], key: str, kind: str) -> Energy:
    if kind not in table:
        raise ValueError(f"unknown {key} energy {kind!r} (known: {', '.join(table)})")
    return table[kind]


def _scores(Z: Tensor, beta: float) -> Tensor:
    return beta * Z @ Z.transpose(-1, -2)  # A_ij = beta z_i.z_j (B, H, N, N), symmetric


def _bisoftmax(Z: Tensor, beta: float, phi: str, normalized: bool) -> Tensor:
    energy = policy(Z).attention_energy  # fused per (board, head) at inference
    if energy is not None:
        return energy(Z, beta).sum(dim=1) / beta
    bound = math.sqrt(Z.shape[-1]) if normalized else None
    return logsumexp(_scores(Z, beta), dim=-1, bound=bound).sum(dim=(1, 2)) / beta


def _bisoftmax_grad(Z: Tensor, beta: float, phi: str) -> Tensor:
    maps = policy(Z).attention_maps  # fused per (board, head) at inference
    if maps is not None:
        return maps(Z, beta)
    P = torch.softmax(_scores(Z, beta), dim=-1)  # A is symmetric, so the column softmax is P^T
    return (P + P.transpose(-1, -2)) @ Z


def _sigmoid(Z: Tensor, beta: float, phi: str, normalized: bool) -> Tensor:
    return torch.sigmoid(_scores(Z, beta)).sum(dim=(1, 2, 3)) / (2 * beta)


def _sigmoid_grad(Z: Tensor, beta: float, phi: str) -> Tensor:
    s = torch.sigmoid(_scores(Z, beta))
    S = s * (1 - s)
    return 0.5 * (S + S.transpose(-1, -2)) @ Z


def _linear(Z: Tensor, beta: float, phi: str, normalized: bool) -> Tensor:
    P = PHI[phi][0](Z)
    G = P.transpose(-1, -2) @ P  # (B, H, p, p): sum_ij (phi_i.phi_j)^2 = ||P^T P||_F^2
    return beta / 4 * G.pow(2).sum(dim=(1, 2, 3))


def _linear_grad(Z: Tensor, beta: float, phi: str) -> Tensor:
    f, df = PHI[phi]
    P = f(Z)
    Mh = beta * (P.transpose(-1, -2) @ P)  # (B, H, p, p): the O(N) "kernel" matrix
    return (P @ Mh) * df(Z)


register_attention("bisoftmax", _bisoftmax, _bisoftmax_grad,
                   formula="1/beta sum_i logsumexp_j(beta z_i.z_j), eq. (3)-(4); its gradient is the bi-softmax "
                           "attention (softmax_row(A) + softmax_col(A)) Z of eq. (7)/(9)")
register_attention("sigmoid", _sigmoid, _sigmoid_grad,
                   formula="1/(2 beta) sum_ij sigmoid(beta z_i.z_j) (alternative designs)")
register_attention("linear", _linear, _linear_grad, uses_phi=True,
                   formula="beta/4 sum_ij (phi(z_i).phi(z_j))^2 (alternative designs; an O(N) update)")

register_feedforward("relu", lambda U, phi: -0.5 * F.relu(U).pow(2).sum(dim=(1, 2)), lambda U, phi: F.relu(U),
                     formula="-1/2 sum_i sum_m ReLU(u_im)^2, eq. (5)")
register_feedforward("softmax", lambda U, phi: -logsumexp(U, dim=-1).sum(dim=1),
                     lambda U, phi: torch.softmax(U, dim=-1), formula="-sum_i logsumexp_m(u_im)")
register_feedforward("gated", lambda U, phi: -0.5 * PHI[phi][0](U).sum(-1).pow(2).sum(dim=1),
                     lambda U, phi: PHI[phi][0](U).sum(-1, keepdim=True) * PHI[phi][1](U), uses_phi=True,
                     formula="-1/2 sum_i (sum_m phi(u_im))^2")


def attn_energy_heads(Z: Tensor, kind: str = "bisoftmax", phi: str = "sigmoid", normalized: bool = False) -> Tensor:
    """Attention energy `kind` (ATTENTION's keys) of head projections Z (B, H, N, p), summed over heads and
    tokens -> (B,). `normalized`: Z is on the radius-sqrt(p) sphere (rms_normalize)."""
    return _lookup(ATTENTION, "attention", kind).value(Z, 1.0 / math.sqrt(Z.shape[-1]), phi, normalized)


def ff_energy_hidden(U: Tensor, kind: str = "relu", phi: str = "sigmoid") -> Tensor:
    """Feedforward energy `kind` (FEEDFORWARD's keys) of hidden activations U = X D (B, N, M), summed over
    tokens -> (B,)."""
    return _lookup(FEEDFORWARD, "feedforward", kind).value(U, phi)


def attn_energy(X: Tensor, W: Tensor, heads: int, kind: str = "bisoftmax", normalize: bool = True,
                phi: str = "sigmoid", eps: float = 1e-6) -> Tensor:
    """E_ATTN(X; W), eq. (3)-(4), per sample (B,)."""
    return attn_energy_heads(head_projections(X, W, heads, normalize, eps), kind, phi, normalized=normalize)


def ff_energy(X: Tensor, D: Tensor, kind: str = "relu", normalize: bool = True, phi: str = "sigmoid",
              eps: float = 1e-6) -> Tensor:
    """E_FF(X; D), eq. (5), per sample (B,).

    The ReLU energy is positively homogeneous, so the normalised one needs no normalised copy of U:
    -1/2 sum_m ReLU(u_m / rms(u))^2 = -1/2 |ReLU(u)|^2 / rms(u)^2 per token (rms with its eps)."""
    ops = policy(X)
    if normalize and kind == "relu" and ops.relu_energy_x is not None:  # from X and D, U never written
        energy = ops.relu_energy_x(X, D, eps)
        if energy is not None:
            return energy
    U = ops.matmul(X, D)
    if normalize and kind == "relu":
        if ops.relu_energy is not None:  # one pass over U at inference
            return ops.relu_energy(U, eps)
        relu_sq = sq_norm(F.relu(U))
        return -0.5 * (relu_sq * inv_rms(U, eps).square()).sum((-2, -1))
    return ff_energy_hidden(rms_normalize(U, eps) if normalize else U, kind, phi)


def attn_energy_grad_heads(Z: Tensor, kind: str = "bisoftmax", phi: str = "sigmoid") -> Tensor:
    """dE_ATTN/dZ in closed form, per head (B, H, N, p): the attention operator before back-projection."""
    return _lookup(ATTENTION, "attention", kind).grad(Z, 1.0 / math.sqrt(Z.shape[-1]), phi)


def ff_energy_grad_hidden(U: Tensor, kind: str = "relu", phi: str = "sigmoid") -> Tensor:
    """-dE_FF/dU in closed form (B, N, M): the feedforward activation of eq. (10)/(11)."""
    return _lookup(FEEDFORWARD, "feedforward", kind).grad(U, phi)


def effective_rank(Z: Tensor) -> Tensor:
    """Effective rank, eq. (17): exp of the entropy of normalised singular values. Z (..., N, p) -> (...)."""
    s = torch.linalg.svdvals(Z.float())
    p = s / s.sum(-1, keepdim=True).clamp_min(1e-12)
    entropy = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)
    return torch.exp(entropy)


def average_angle(Z: Tensor) -> Tensor:
    """Average angle in degrees, eq. (18): arccos of the mean pairwise cosine over i < j. Z (..., N, p) -> (...).

    This is the paper's definition; the authors' code averages the angles instead (mean of arccos).
    """
    u = F.normalize(Z.float(), dim=-1)
    n = u.shape[-2]
    cos = u @ u.transpose(-1, -2)
    off_diag = cos.sum((-1, -2)) - cos.diagonal(dim1=-2, dim2=-1).sum(-1)
    mean_cos = off_diag / (n * (n - 1))
    return torch.rad2deg(torch.arccos(mean_cos.clamp(-1, 1)))
