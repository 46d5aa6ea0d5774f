"""Baseline layers that run through the same recurrent core: Transformer, CRATE, CRATE-T, Energy Transformer.

Each is one layer of parameters applied `iters` times with shared weights, as in the paper's comparisons.
They ignore the step sizes the core passes (their steps are fixed by design).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .device import in_onnx_export
from .energies import logsumexp, merge_heads, split_heads
from .layers import RMSNorm


def _softmax_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Row-softmax attention per head; q, k, v (B, H, N, p)."""
    A = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(A, dim=-1) @ v


class TransformerLayer(nn.Module):
    """Pre-RMSNorm Transformer block, no biases, no dropout, ReLU MLP (the paper's fair baseline)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, M = cfg.dim, cfg.ff_hidden
        self.heads = cfg.heads
        self.norm1 = RMSNorm(d, cfg.norm_eps)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.norm2 = RMSNorm(d, cfg.norm_eps)
        self.fc1 = nn.Linear(d, M, bias=False)
        self.fc2 = nn.Linear(M, d, bias=False)
        for lin in (self.q, self.k, self.v, self.o, self.fc1, self.fc2):
            nn.init.normal_(lin.weight, std=0.02)

    def step(self, x: Tensor, t: int, steps: object = None, shared: object = None) -> Tensor:
        y = self.norm1(x)
        q, k, v = (split_heads(f(y), self.heads) for f in (self.q, self.k, self.v))
        x = x + self.o(merge_heads(_softmax_attention(q, k, v)))
        return x + self.fc2(F.relu(self.fc1(self.norm2(x))))

    def projections(self, x: Tensor, t: int | None = None) -> Tensor:
        return split_heads(self.q(self.norm1(x)), self.heads)

    def energy(self, x: Tensor, t: int | None = None) -> dict[str, Tensor]:
        return {}


class CRATELayer(nn.Module):
    """CRATE: x + MSSA(LN(x)), then ISTA(LN(x)) = ReLU(y + eta (y D - y D^T D) - eta lambda).

    tied=True is CRATE-T: no output matrix, the heads go back through the transpose of the shared projection
    (o W, the gradient-consistent back-projection; the authors' code uses o W^T, see the README).
    """

    def __init__(self, cfg: ModelConfig, tied: bool = False, eta: float = 0.1, lam: float = 0.1):
        super().__init__()
        d = cfg.dim
        self.heads, self.eta, self.lam, self.tied = cfg.heads, eta, lam, tied
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, d, bias=False)
        self.to_out = None if tied else nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.D = nn.Parameter(torch.empty(d, d))
        nn.init.kaiming_uniform_(self.D, a=math.sqrt(5))

    def step(self, x: Tensor, t: int, steps: object = None, shared: object = None) -> Tensor:
        w = split_heads(self.qkv(self.ln1(x)), self.heads)
        o = merge_heads(_softmax_attention(w, w, w))
        x = x + (o @ self.qkv.weight if self.tied else self.to_out(o))
        y = self.ln2(x)
        return F.relu(y + self.eta * (y @ self.D - y @ self.D.t() @ self.D) - self.eta * self.lam)

    def projections(self, x: Tensor, t: int | None = None) -> Tensor:
        return split_heads(self.qkv(self.ln1(x)), self.heads)

    def energy(self, x: Tensor, t: int | None = None) -> dict[str, Tensor]:
        return {}


class EnergyLayerNorm(nn.Module):
    """ET's LayerNorm: a scalar gain and a per-channel bias, so that it is the gradient of a Lagrangian."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(()))
        self.delta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        xc = x - x.mean(-1, keepdim=True)
        return self.gamma * xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + self.eps) + self.delta


class EnergyTransformerLayer(nn.Module):
    """Energy Transformer: x <- x - a dE/dg at g = LN(x), E = E_ATT + E_HN, the gradient taken by autograd.

    E_ATT = -1/beta sum_h sum_C logsumexp_B(beta K_B.Q_C); E_HN = -1/2 sum_B sum_mu ReLU(xi_mu.g_B)^2.
    `energy_grad` is the same gradient in closed form, used where autograd is unavailable (ONNX export,
    inference mode) and under torch.compile, where a gradient taken inside the forward pass would break the graph
    at every update; the tests check the two agree, second-order gradients included.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, H, Y = cfg.dim, cfg.heads, cfg.head_dim
        self.step_size = cfg.et_step
        self.norm = EnergyLayerNorm(d)
        self.Wq = nn.Parameter(torch.randn(H, Y, d) * 0.002)
        self.Wk = nn.Parameter(torch.randn(H, Y, d) * 0.002)
        self.Xi = nn.Parameter(torch.randn(cfg.ff_hidden, d) * 0.02)
        self.beta = 1.0 / math.sqrt(Y)

    def _qk(self, g: Tensor) -> tuple[Tensor, Tensor]:
        q = torch.einsum("bnd,hyd->bhny", g, self.Wq)
        k = torch.einsum("bnd,hyd->bhny", g, self.Wk)
        return q, k

    def energies(self, g: Tensor) -> dict[str, Tensor]:
        q, k = self._qk(g)
        A = self.beta * q @ k.transpose(-1, -2)  # (B, H, N_query, N_key)
        e_att = -logsumexp(A, dim=-1).sum(dim=(1, 2)) / self.beta
        e_hn = -0.5 * F.relu(g @ self.Xi.t()).pow(2).sum(dim=(1, 2))
        return {"attn": e_att, "ff": e_hn}

    def energy_grad(self, g: Tensor) -> Tensor:
        """dE/dg in closed form."""
        q, k = self._qk(g)
        P = torch.softmax(self.beta * q @ k.transpose(-1, -2), dim=-1)
        dq = -(P @ k)  # dE/dQ
        dk = -(P.transpose(-1, -2) @ q)  # dE/dK
        g_att = torch.einsum("bhny,hyd->bnd", dq, self.Wq) + torch.einsum("bhny,hyd->bnd", dk, self.Wk)
        g_hn = -F.relu(g @ self.Xi.t()) @ self.Xi
        return g_att + g_hn

    def step(self, x: Tensor, t: int, steps: object = None, shared: object = None) -> Tensor:
        g = self.norm(x)
        # is_compiling first: the compiler cannot trace is_inference_mode_enabled
        if torch.compiler.is_compiling() or torch.is_inference_mode_enabled() or in_onnx_export():
            grad = self.energy_grad(g)
        else:
            with torch.enable_grad():
                needs_graph = g.requires_grad
                g_in = g if needs_graph else g.detach().requires_grad_(True)
                E = sum(self.energies(g_in).values()).sum()
                (grad,) = torch.autograd.grad(E, g_in, create_graph=needs_graph)
            if not needs_graph:
                grad = grad.detach()
        return x - self.step_size * grad

    def projections(self, x: Tensor, t: int | None = None) -> Tensor:
        return self._qk(self.norm(x))[0]

    def energy(self, x: Tensor, t: int | None = None) -> dict[str, Tensor]:
        return self.energies(self.norm(x))
