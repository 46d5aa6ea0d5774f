"""The Hyper-SET layer: one iteration of alternating descent on E_ATTN and E_FF, on hyperspheres.

A layer is anything with `step(x, t, steps) -> x`, `energy(x, t) -> {name: (B,)}` and
`projections(x, t) -> (B, H, N, p)`. The step sizes (alpha_t, gamma_t) come from `StepSizes`, owned by the
recurrent core and shared by every distinct layer, as in the authors' code.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import device
from .accel import policy
from .config import ModelConfig
from .energies import (
    attn_energy,
    attn_energy_grad_heads,
    ff_energy,
    ff_energy_grad_hidden,
    head_projections,
    merge_heads,
    rms_normalize,
    split_heads,
)


def eager_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` in eager mode under torch.compile (torch.compiler.disable), decided at the call: disable imports
    torch._dynamo, seconds of start-up that a process which never compiles would pay at import."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return torch.compiler.disable(fn)(*args, **kwargs)
        return fn(*args, **kwargs)

    return run


class RMSNorm(nn.Module):
    """x / rms(x) * g, written out (not nn.RMSNorm) so that both ONNX exporters handle it."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_normalize(x, self.eps) * self.weight


def sinusoidal_embedding(t: Tensor, dim: int) -> Tensor:
    """[sin(t f_k), cos(t f_k)], f_k = 10000^(-k/(dim/2-1)): works for any t, so iterations past training work."""
    half = dim // 2
    k = torch.arange(half, dtype=torch.float32, device=t.device)
    freqs = torch.exp(-math.log(10000.0) * k / max(half - 1, 1))
    angles = t.float().reshape(-1, 1) * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class StepSizes(nn.Module):
    """alpha_t, gamma_t = split(L3(GELU(c_t + cond))), eq. (12) and the appendix table.

    c_t = L2(GELU(L1(sin(t)))) (or sin(t) itself when time_mlp is off, as for MIM). The step sizes are per
    token and channel, (B, N, d) each. L3 starts at zero weight and bias step_init (ReZero on the output), so
    alpha = gamma = step_init at first. L1 and L2 keep PyTorch's init (time_init "live"), or start at zero as in
    the authors' code (time_init "zero"): then GELU(L1(.)) = 0 and L2's weight = 0 give each other zero gradient
    for good, and c_t is the constant L2.bias. With step_sign "positive" the output goes through a softplus.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        if cfg.step == "fixed":
            return
        if cfg.time_mlp:
            self.L1 = nn.Linear(cfg.time_dim, d)
            self.L2 = nn.Linear(d, d)
        if cfg.step_norm != "none":
            self.norm = RMSNorm(d, cfg.norm_eps)
        self.L3 = nn.Linear(d, 2 * d)
        if cfg.time_mlp and cfg.time_init == "zero":  # "live": L1 and L2 keep nn.Linear's own init
            for lin in (self.L1, self.L2):
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)
        self._start_output()

    @torch.no_grad()
    def _start_output(self) -> None:
        """L3 as a new model starts it: zero weight and a bias that gives alpha = gamma = step_init for every token
        (with a softplus the raw output starts at log(e^s - 1))."""
        cfg = self.cfg
        nn.init.zeros_(self.L3.weight)
        bias = math.log(math.expm1(cfg.step_init)) if cfg.step_sign == "positive" else cfg.step_init
        nn.init.constant_(self.L3.bias, bias)

    @torch.no_grad()
    def revive_time_network(self) -> bool:
        """Give a dead time network (L1 = L2 = 0, trained with time_init "zero") a way to learn, keeping its
        outputs: L1 gets PyTorch's init and L2 keeps its zero weight and its bias (the constant c_t), so alpha and
        gamma are unchanged, and L2's weight (then L1) now receives gradients. Returns whether it revived."""
        if not self.cfg.time_mlp or self.cfg.step == "fixed":
            return False
        if any(bool(p.any()) for p in (self.L1.weight, self.L1.bias, self.L2.weight)):
            return False
        self.L1.reset_parameters()
        return True

    def restart_positive(self) -> bool:
        """Start the output layer L3 again as a new model with step_sign "positive" starts it (`_start_output`), for
        weights trained with signed steps, whose raw outputs mean nothing under the softplus. Returns whether it
        applied (adaptive positive steps)."""
        if self.cfg.step == "fixed" or self.cfg.step_sign != "positive":
            return False
        self._start_output()
        return True

    @eager_only  # reads a weight: under torch.compile the answer is taken in eager mode, not traced
    def constant_in_t(self) -> bool:
        """Whether the step sizes depend on the condition only: fixed steps, or a time network whose L2 weight is
        zero (c_t = L2's bias for every t)."""
        if self.cfg.step == "fixed":
            return True
        if torch._C._are_functorch_transforms_active():  # under vmap the weight cannot be read: made at every t
            return False
        return self.cfg.time_mlp and not bool(self.L2.weight.any())

    def time_embedding(self, t: Tensor) -> Tensor:
        if self.cfg.time_max:
            t = t.clamp(max=self.cfg.time_max)
        c = sinusoidal_embedding(t, self.cfg.time_dim).to(self.L3.weight.dtype)
        if self.cfg.time_mlp:
            c = self.L2(F.gelu(self.L1(c)))
        return c  # (1, d)

    def forward(self, t: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
        if self.cfg.step == "fixed":
            s = torch.full((), self.cfg.fixed_step, dtype=cond.dtype, device=cond.device)
            return s, s
        c = self.time_embedding(t).to(cond.dtype)
        if self.cfg.step_norm == "cond":
            h = c + self.norm(cond)
        elif self.cfg.step_norm == "sum":
            h = self.norm(c + cond)
        else:
            h = c + cond
        out = self.L3(F.gelu(h))
        if self.cfg.step_sign == "positive":
            out = F.softplus(out)
        alpha, gamma = out.chunk(2, dim=-1)
        return alpha, gamma


class DepthLoRA(nn.Module):
    """Depth-wise LoRA: W_t = W + s B_t A_t and D_t = D + s B'_t A'_t, one adapter per iteration.

    Both factors start at N(0, 0.02) as in the authors' code. Past the trained depth the last adapter is reused.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        T, r, d, M = cfg.iters, cfg.lora_rank, cfg.dim, cfg.ff_hidden
        self.scale = cfg.lora_scale
        self.attn_B = nn.Parameter(torch.randn(T, d, r) * 0.02)
        self.attn_A = nn.Parameter(torch.randn(T, r, d) * 0.02)
        self.ff_B = nn.Parameter(torch.randn(T, d, r) * 0.02)
        self.ff_A = nn.Parameter(torch.randn(T, r, M) * 0.02)

    def deltas(self, t: int | Tensor) -> tuple[Tensor, Tensor]:
        """(dW, dD) of iteration t (1-based), past the trained depth the last adapter's. t is an int, or an int64
        tensor (one traced step serves every t, the ONNX step graph): the adapter is then gathered inside the graph
        with clamp(t, 1, T) - 1, the index an int t gives, and the outputs are bit-identical."""
        adapters = (self.attn_B, self.attn_A, self.ff_B, self.ff_A)
        if isinstance(t, Tensor):
            i = t.reshape(1).to(torch.long).clamp(1, self.attn_B.shape[0]) - 1
            attn_B, attn_A, ff_B, ff_A = (p.index_select(0, i)[0] for p in adapters)
        else:
            i = min(t, self.attn_B.shape[0]) - 1
            attn_B, attn_A, ff_B, ff_A = (p[i] for p in adapters)
        return self.scale * attn_B @ attn_A, self.scale * ff_B @ ff_A


class HyperSETLayer(nn.Module):
    """One layer of Hyper-SET parameters: W (d x Hp) for q = k = v and D (d x M) for the tied feedforward."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, M = cfg.dim, cfg.ff_hidden
        self.W = nn.Parameter(torch.randn(d, d) * 0.02)
        self.D = nn.Parameter(torch.randn(d, M) * 0.02)
        self.norm_attn = RMSNorm(cfg.head_dim, cfg.norm_eps)  # one sphere per head, gain shared: A stays symmetric
        self.norm_ff = RMSNorm(M, cfg.norm_eps)
        self.lora = DepthLoRA(cfg) if cfg.lora_rank > 0 else None
        self._known: tuple[Tensor, int | None, tuple[int, ...], dict[str, Tensor]] | None = None

    def weights(self, t: int | Tensor | None) -> tuple[Tensor, Tensor]:
        if self.lora is None or t is None:
            return self.W, self.D
        dW, dD = self.lora.deltas(t)
        return self.W + dW, self.D + dD

    def attn_grad(self, X: Tensor, W: Tensor, normalize: bool = True) -> Tensor:
        """dE_ATTN/dX with the projections put on their spheres first (eq. 9; exact gradient if normalize=False)."""
        ops = policy(X)
        if normalize and self.cfg.attention == "bisoftmax" and ops.bisoftmax_grad is not None:
            return ops.bisoftmax_grad(X, W, self.norm_attn.weight, self.cfg.heads, self.norm_attn.eps)
        if normalize:
            return self.attn_grad_from_projections(head_projections(X, W, self.cfg.heads, True, self.norm_attn.eps), W)
        Z = split_heads(ops.matmul(X, W), self.cfg.heads)  # (B, H, N, p)
        G = attn_energy_grad_heads(Z, self.cfg.attention, self.cfg.phi)
        return ops.matmul(merge_heads(G), W.transpose(0, 1))  # back-projection through the same W

    def attn_grad_from_projections(self, Z: Tensor, W: Tensor) -> Tensor:
        """`attn_grad` from the head projections already on their spheres, `projections(X)` (B, H, N, p): their
        gain, the attention operator, the back-projection through W."""
        return policy(Z).matmul(self._attention_merged(Z), W.transpose(0, 1))

    def _attention_merged(self, Z: Tensor) -> Tensor:
        """The attention operator on the projections Z with their gain, heads merged (B, N, d), before the
        back-projection."""
        heads = policy(Z).attention_heads
        if self.cfg.attention == "bisoftmax" and heads is not None:  # the gain and the merge fused
            return heads(Z, self.norm_attn.weight, 1.0 / math.sqrt(Z.shape[-1]))
        return merge_heads(attn_energy_grad_heads(Z * self.norm_attn.weight, self.cfg.attention, self.cfg.phi))

    def attn_step(self, x: Tensor, alpha: Tensor, W: Tensor) -> Tensor:
        """x - alpha dE_ATTN/dX (eq. 9). At inference on the GEMM kernel (``Ops.step_product``) the
        back-projection and the step are one call."""
        ops = policy(x)
        if ops.step_product is not None and self.cfg.attention == "bisoftmax":
            Z = head_projections(x, W, self.cfg.heads, True, self.norm_attn.eps)
            y = ops.step_product(x, alpha, -1.0, self._attention_merged(Z), W.transpose(0, 1))
            if y is not None:
                return y
        return ops.add_scaled(x, alpha, self.attn_grad(x, W), -1.0)

    def ff_descent(self, X: Tensor, D: Tensor, normalize: bool = True,
                   folded: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """-dE_FF/dX with the hidden activations on their sphere first (eq. 11; exact if normalize=False).

        The acceleration policy may run the normalised ReLU step with the normalisation folded into the weights,
        the same value in fewer passes over the (B, N, M) hidden tensor: with g the RMSNorm gain, s = sign(g)
        (+1 at 0) and r = 1/rms(X D) per token, ReLU(r (X D) g) D^T = r ReLU(X (D s)) (D |g|)^T, because r > 0,
        |g| >= 0 and rms(X D s) = rms(X D); with gradients, with its own backward pass.
        `folded`: (D s, D |g|) made once for the pass (`pass_weights`), else they are made here."""
        ops = policy(X)
        if normalize and self.cfg.feedforward == "relu" and ops.folded_relu is not None:
            Ds, Dg = folded if folded is not None else ops.fold_ff(D, self.norm_ff.weight)
            if ops.relu_descent is not None:
                return ops.relu_descent(X, Ds, Dg, self.norm_ff.eps)
            if ops.relu_step is not None:
                return ops.relu_step(X, Ds, Dg, self.norm_ff.eps)
            return ops.folded_relu(X, Ds, Dg, self.norm_ff.eps)[0]
        U = ops.matmul(X, D)  # (B, N, M)
        if normalize:
            U = self.norm_ff(U)
        return ops.matmul(ff_energy_grad_hidden(U, self.cfg.feedforward, self.cfg.phi), D.transpose(0, 1))

    def pass_weights(self) -> tuple[Tensor, Tensor] | None:
        """What every step of a pass can share: the feedforward's folded weights (`ff_descent`) where the weights
        are the same at every t (no depth LoRA) and the folded form runs; else None and each step makes its own.
        A training step launches about 16 kernels fewer per iteration with them."""
        ops = policy(self.D)
        if self.lora is not None or self.cfg.feedforward != "relu" or ops.folded_relu is None:
            return None
        return ops.fold_ff(self.D, self.norm_ff.weight)

    def step(self, x: Tensor, t: int, steps: tuple[Tensor, Tensor], shared: object = None) -> Tensor:
        """`update`, then the step-length control where the config asks for it (`backtrack`)."""
        y = self.update(x, t, steps, shared)
        return self.backtrack(x, y, t) if self.cfg.step_control == "backtrack" else y

    def update(self, x: Tensor, t: int, steps: tuple[Tensor, Tensor], shared: object = None) -> Tensor:
        """Attention step (eq. 9), then feedforward step (eq. 11) on the updated tokens. `shared`: the
        pass's `pass_weights`."""
        alpha, gamma = steps
        W, D = self.weights(t)
        ops = policy(x)
        y = self.attn_step(x, alpha, W)  # x - alpha dE_ATTN/dX
        if ops.relu_update is not None and self.cfg.feedforward == "relu":  # the step in one call, at inference
            Ds, Dg = shared if shared is not None else ops.fold_ff(D, self.norm_ff.weight)
            out = ops.relu_update(y, gamma, Ds, Dg, self.norm_ff.eps)
            if out is not None:
                return out
        return ops.add_scaled(y, gamma, self.ff_descent(y, D, folded=shared), 1.0)  # y - gamma dE_FF/dY

    def backtrack(self, x: Tensor, y: Tensor, t: int | Tensor | None) -> Tensor:
        """The iteration's update d = y - x scaled, per sample, by the first of 1, 1/2, ..., 2^-backtracks that
        leaves E_ATTN + E_FF (``energy``, at this t) no higher than at x, and by 0 where none does: the energy
        never rises. Iterations before ``backtrack_from`` take y as it is. The scale is chosen without gradient;
        the gradient flows through x + scale * d.

        At inference, outside a graph, the energy of the state it returns is kept (`energy` gives it back for
        that state without computing it again): the next iteration's energy at x, and a trace's at every
        iteration, cost nothing more, so a pass costs one energy evaluation per iteration where every update
        descends at its full length."""
        start = self.cfg.backtrack_from
        if start > 1 and t is not None and not isinstance(t, Tensor) and t < start:
            return y
        d = y - x
        with torch.no_grad():
            scale = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)
            ok = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
            if start > 1 and isinstance(t, Tensor):  # an exported loop's counter: the same choice in the graph
                ok = ok | (t < start)
            before = self.known_energy(x, t) or self._energy_by_rows(x, t)
            e0 = before["attn"] + before["ff"]
            after = dict(before)  # the energy of the state returned, row by row
            # a fixed number of tries in a graph (export, compile); eagerly, none once every sample has its scale
            fixed = device.in_graph()
            out = None
            for _ in range(self.cfg.backtracks + 1):
                if not fixed and bool(ok.all()):
                    break
                out = x + scale.view(-1, 1, 1) * d
                e = self._energy_by_rows(out, t)
                took = (e["attn"] + e["ff"] <= e0) & ~ok
                after = {k: torch.where(took, e[k], after[k]) for k in after}
                ok = ok | took
                scale = torch.where(ok, scale, scale * 0.5)
            # the last state tried is the one returned where every sample took it whole (made without gradient)
            whole = not fixed and out is not None and bool(ok.all()) and not bool((scale != 1).any())
            scale = torch.where(ok, scale, torch.zeros_like(scale))
        if not whole or torch.is_grad_enabled():
            out = x + scale.view(-1, 1, 1) * d
        self.remember_energy(out, t, after)
        return out

    def total_energy(self, x: Tensor, t: int | Tensor | None = None) -> Tensor:
        """E_ATTN + E_FF of ``energy``, per sample (B,)."""
        e = self.energy(x, t)
        return e["attn"] + e["ff"]

    def remember_energy(self, x: Tensor, t: int | Tensor | None, energy: dict[str, Tensor]) -> None:
        """Keep `energy` as that of state x at iteration t, for `energy` to give back (see `backtrack`): only at
        inference outside a graph, with the step-length control on."""
        if device.in_graph():  # nothing kept or read while a graph is made
            return
        keep = self.cfg.step_control == "backtrack" and not torch.is_grad_enabled() and not isinstance(t, Tensor)
        self._known = (x, t, self._versions(x), energy) if keep else None

    def _versions(self, x: Tensor) -> tuple[int, ...]:
        """The in-place change counters of state x and of every parameter."""
        return device.versions(x, *self.parameters())

    def _energy_by_rows(self, x: Tensor, t: int | Tensor | None) -> dict[str, Tensor]:
        """`energy` computed afresh, by slices of rows at inference on a CPU (``Ops.slice_rows``)."""
        ops = policy(x)
        return ops.by_rows(lambda v: self._energy(v, t), ops.slice_rows(self.cfg, len(x), x.device), x)

    def known_energy(self, x: Tensor, t: int | Tensor | None) -> dict[str, Tensor] | None:
        """The energy `backtrack` kept for this very state (the same tensor object, not modified since) and the
        same weights: at any t where the weights do not depend on t (no depth LoRA), else at the same t. None
        otherwise, with gradients, and while a graph is made."""
        known = None if device.in_graph() or torch.is_grad_enabled() or isinstance(t, Tensor) else self._known
        if known is None:  # read once: another thread's pass may replace it meanwhile
            return None
        state, at, versions, energy = known
        if state is not x or (self.lora is not None and at != t) or versions != self._versions(x):
            return None
        return energy

    def projections(self, x: Tensor, t: int | None = None) -> Tensor:
        W, _ = self.weights(t)
        return head_projections(x, W, self.cfg.heads, True, self.cfg.norm_eps)

    def energy(self, x: Tensor, t: int | None = None) -> dict[str, Tensor]:
        """E_ATTN and E_FF "normalization first" (no learnable gains), per sample; with the step-length control,
        at inference, the one `backtrack` kept where x is the state it returned (no work)."""
        known = self.known_energy(x, t)
        if known is not None:
            return known
        energy = self._energy(x, t)
        self.remember_energy(x, t, energy)
        return energy

    def _energy(self, x: Tensor, t: int | None = None) -> dict[str, Tensor]:
        W, D = self.weights(t)
        cfg = self.cfg
        return {
            "attn": attn_energy(x, W, cfg.heads, cfg.attention, phi=cfg.phi, eps=cfg.norm_eps),
            "ff": ff_energy(x, D, cfg.feedforward, phi=cfg.phi, eps=cfg.norm_eps),
        }
