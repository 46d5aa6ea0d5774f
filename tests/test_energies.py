"""The energies of Hyper-SET and the geometry measures, pinned to the paper's formulas.

Independent references are written out with explicit loops over tokens (and in the paper's
column-vector notation where the paper states a closed form), so that a sign, a scale or a transposition in
the library breaks a test. Gradient checks run in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import energy_cases

from hyperset.config import ATTENTIONS, FEEDFORWARDS
from hyperset.energies import (
    ATTENTION,
    FEEDFORWARD,
    PHI,
    attn_energy,
    attn_energy_grad_heads,
    attn_energy_heads,
    average_angle,
    effective_rank,
    ff_energy,
    ff_energy_grad_hidden,
    ff_energy_hidden,
    head_projections,
    merge_heads,
    rms_normalize,
    split_heads,
)

DT = torch.float64
ATTN_CASES = energy_cases(ATTENTION)  # every registered energy: a new one is tested without an edit here
FF_CASES = energy_cases(FEEDFORWARD)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed), dtype=DT) * scale


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _case_id(case: tuple[str, str]) -> str:
    return "-".join(case)


# ----------------------------------------------------------------------------------------------- the energies


def _attn_energy_reference(Z: torch.Tensor, kind: str, phi: str) -> torch.Tensor:
    """Eq. (3)-(4) and the appendix table, one head and one token at a time. Z (B, H, N, p) -> (B,)."""
    B, H, N, p = Z.shape
    beta = 1 / math.sqrt(p)
    out = torch.zeros(B, dtype=Z.dtype)
    f = PHI[phi][0]
    for b in range(B):
        for h in range(H):
            z = Z[b, h]
            for i in range(N):
                if kind == "bisoftmax":  # beta^-1 log sum_j exp(beta z_i.z_j)
                    out[b] += torch.log(sum(torch.exp(beta * z[i] @ z[j]) for j in range(N))) / beta
                for j in range(N):
                    if kind == "sigmoid":  # 1/2 sum_ij sigmoid(beta z_i.z_j) beta^-1
                        out[b] += 0.5 * torch.sigmoid(beta * z[i] @ z[j]) / beta
                    elif kind == "linear":  # 1/4 sum_ij (beta phi(z_i).phi(z_j))^2 beta^-1
                        out[b] += 0.25 * (beta * f(z[i]) @ f(z[j])) ** 2 / beta
    return out


def _ff_energy_reference(U: torch.Tensor, kind: str, phi: str) -> torch.Tensor:
    """Eq. (5) and the appendix table, one token at a time. U (B, N, M) -> (B,)."""
    B, N, M = U.shape
    out = torch.zeros(B, dtype=U.dtype)
    for b in range(B):
        for i in range(N):
            u = U[b, i]
            if kind == "relu":  # -1/2 sum_m ReLU(u_m)^2
                out[b] -= 0.5 * sum(max(u[m].item(), 0.0) ** 2 for m in range(M))
            elif kind == "softmax":  # -log sum_m exp(u_m)
                out[b] -= math.log(sum(math.exp(u[m].item()) for m in range(M)))
            elif kind == "gated":  # -1/2 (sum_m phi(u_m))^2
                out[b] -= 0.5 * PHI[phi][0](u).sum() ** 2
    return out


# the energies the paper states, with the loops below written for each
PAPER_ATTENTION, PAPER_FEEDFORWARD = ("bisoftmax", "sigmoid", "linear"), ("relu", "softmax", "gated")


def test_every_built_in_energy_has_a_reference_written_out_token_by_token():
    assert (set(ATTENTIONS), set(FEEDFORWARDS)) == (set(PAPER_ATTENTION), set(PAPER_FEEDFORWARD))
    assert set(ATTENTIONS) <= set(ATTENTION) and set(FEEDFORWARDS) <= set(FEEDFORWARD)


@pytest.mark.parametrize("case", [c for c in ATTN_CASES if c[0] in PAPER_ATTENTION], ids=_case_id)
def test_attention_energy_matches_the_papers_formula_token_by_token(case):
    kind, phi = case
    Z = _randn(2, 2, 5, 4, seed=1)
    torch.testing.assert_close(attn_energy_heads(Z, kind, phi), _attn_energy_reference(Z, kind, phi),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", [c for c in FF_CASES if c[0] in PAPER_FEEDFORWARD], ids=_case_id)
def test_feedforward_energy_matches_the_papers_formula_token_by_token(case):
    kind, phi = case
    U = _randn(2, 5, 7, seed=2)
    torch.testing.assert_close(ff_energy_hidden(U, kind, phi), _ff_energy_reference(U, kind, phi),
                               rtol=1e-10, atol=1e-10)


def test_head_projection_of_head_h_uses_the_h_th_block_of_p_columns_of_W():
    """z_i^h = W_h^T x_i (eq. 2) with W = [W_1 | ... | W_H], each W_h of p columns."""
    B, N, d, H = 2, 5, 12, 3
    p = d // H
    X, W = _randn(B, N, d, seed=3), _randn(d, d, seed=4)
    Z = head_projections(X, W, H, normalize=False)
    assert Z.shape == (B, H, N, p)
    for h in range(H):
        torch.testing.assert_close(Z[:, h], X @ W[:, h * p:(h + 1) * p])
    torch.testing.assert_close(merge_heads(split_heads(X @ W, H)), X @ W)


def test_rms_normalize_puts_every_row_on_the_sphere_of_radius_sqrt_dim():
    x = _randn(3, 7, 10, seed=5, scale=4.0)
    norms = rms_normalize(x, eps=0.0).norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(10)))


def test_normalized_head_projections_lie_on_the_radius_sqrt_p_spheres_of_eq_7():
    X, W = _randn(2, 6, 16, seed=6), _randn(16, 16, seed=7)
    Z = head_projections(X, W, heads=4, normalize=True, eps=0.0)
    torch.testing.assert_close(Z.norm(dim=-1), torch.full(Z.shape[:-1], 2.0, dtype=DT))  # sqrt(p) = 2


@pytest.mark.parametrize("case", ATTN_CASES, ids=_case_id)
def test_normalized_attention_energy_is_invariant_to_rescaling_the_tokens(case):
    kind, phi = case
    X, W = _randn(2, 6, 16, seed=8), _randn(16, 16, seed=9)
    e = attn_energy(X, W, 4, kind, normalize=True, phi=phi, eps=0.0)
    torch.testing.assert_close(attn_energy(3.7 * X, W, 4, kind, normalize=True, phi=phi, eps=0.0), e)


@pytest.mark.parametrize("case", FF_CASES, ids=_case_id)
def test_normalized_feedforward_energy_is_invariant_to_rescaling_the_tokens(case):
    kind, phi = case
    X, D = _randn(2, 6, 16, seed=10), _randn(16, 24, seed=11)
    e = ff_energy(X, D, kind, normalize=True, phi=phi, eps=0.0)
    torch.testing.assert_close(ff_energy(0.3 * X, D, kind, normalize=True, phi=phi, eps=0.0), e)


def test_bisoftmax_energy_on_the_sphere_is_bounded_by_its_collapsed_and_spread_extremes():
    """On radius-sqrt(p) spheres beta z_i.z_j <= sqrt(p): E^h <= N (log N + sqrt(p)) / beta, at collapse."""
    N, p = 6, 4
    beta = 1 / math.sqrt(p)
    z = rms_normalize(_randn(1, 1, 1, p, seed=12), eps=0.0)
    collapsed = z.expand(1, 1, N, p)
    top = N * (math.log(N) + p * beta) / beta
    torch.testing.assert_close(attn_energy_heads(collapsed), torch.tensor([top], dtype=DT))
    spread = rms_normalize(_randn(1, 1, N, p, seed=13), eps=0.0)
    assert attn_energy_heads(spread).item() < top


# -------------------------------------------------------------------------- closed-form gradients vs autograd


@pytest.mark.parametrize("case", ATTN_CASES, ids=_case_id)
def test_attention_head_gradient_equals_autograd_of_the_energy_on_Z(case):
    kind, phi = case
    Z = _randn(2, 3, 7, 5, seed=14).requires_grad_(True)
    (auto,) = torch.autograd.grad(attn_energy_heads(Z, kind, phi).sum(), Z)
    closed = attn_energy_grad_heads(Z.detach(), kind, phi)
    assert closed.shape == Z.shape
    assert rel_err(closed, auto) < 1e-5


@pytest.mark.parametrize("case", FF_CASES, ids=_case_id)
def test_feedforward_hidden_activation_equals_minus_autograd_of_the_energy_on_U(case):
    kind, phi = case
    U = _randn(2, 7, 9, seed=15).requires_grad_(True)
    (auto,) = torch.autograd.grad(ff_energy_hidden(U, kind, phi).sum(), U)
    closed = ff_energy_grad_hidden(U.detach(), kind, phi)
    assert closed.shape == U.shape
    assert rel_err(closed, -auto) < 1e-5


def test_eq6_attention_gradient_in_the_papers_column_notation():
    """-grad_X E_ATTN = -sum_h W_h W_h^T X (softmax_col(A_h) + softmax_row(A_h)),
    A_h = beta (W_h^T X)^T (W_h^T X)."""
    B, N, d, H = 2, 6, 12, 3
    p = d // H
    beta = 1 / math.sqrt(p)
    X, W = _randn(B, N, d, seed=16), _randn(d, d, seed=17, scale=0.5)
    Xr = X.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(attn_energy(Xr, W, H, "bisoftmax", normalize=False).sum(), Xr)
    for b in range(B):
        Xc = X[b].T  # (d, N): tokens are columns, as in the paper
        grad = torch.zeros(d, N, dtype=DT)
        for h in range(H):
            Wh = W[:, h * p:(h + 1) * p]  # (d, p)
            Zh = Wh.T @ Xc  # (p, N)
            A = beta * Zh.T @ Zh
            grad += Wh @ Wh.T @ Xc @ (torch.softmax(A, dim=0) + torch.softmax(A, dim=1))
        assert rel_err(grad.T, auto[b]) < 1e-10


def test_eq9_feedforward_gradient_in_the_papers_column_notation():
    """-grad_X E_FF = D ReLU(D^T X) (eq. 10)."""
    X, D = _randn(2, 6, 12, seed=18), _randn(12, 20, seed=19)
    Xr = X.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(ff_energy(Xr, D, "relu", normalize=False).sum(), Xr)
    for b in range(2):
        Xc = X[b].T
        assert rel_err((D @ F.relu(D.T @ Xc)).T, -auto[b]) < 1e-10


def test_bisoftmax_head_gradient_is_row_plus_column_softmax_of_the_symmetric_scores():
    """Eq. (9): (softmax_row(A) + softmax_col(A)) Z, and S = P + P^T is symmetric because A is."""
    Z = _randn(2, 3, 7, 4, seed=20)
    A = Z @ Z.transpose(-1, -2) / 2.0  # beta = 1/sqrt(4)
    S = torch.softmax(A, dim=-1) + torch.softmax(A, dim=-2)
    torch.testing.assert_close(S, S.transpose(-1, -2))
    P = torch.softmax(A, dim=-1)
    torch.testing.assert_close(S, P + P.transpose(-1, -2))
    torch.testing.assert_close(attn_energy_grad_heads(Z, "bisoftmax"), S @ Z)


# ---------------------------------------------------------------------------------------- geometry measures


def test_effective_rank_of_k_equal_singular_values_is_k():
    for k in (1, 2, 3, 5):
        U, _ = torch.linalg.qr(_randn(8, 8, seed=21 + k))
        V, _ = torch.linalg.qr(_randn(6, 6, seed=41 + k))
        Z = 2.5 * U[:, :k] @ V[:, :k].T  # (8, 6) with k singular values equal to 2.5, the rest 0
        s = torch.linalg.svdvals(Z)
        assert torch.allclose(s[:k], torch.full((k,), s[0].item(), dtype=DT)) and s[k:].abs().max() < 1e-10
        assert effective_rank(Z).item() == pytest.approx(k, rel=1e-4)


def test_effective_rank_of_a_rank_one_matrix_is_one():
    u, v = _randn(9, 1, seed=30), _randn(1, 4, seed=31)
    assert effective_rank(u @ v).item() == pytest.approx(1.0, abs=1e-4)


def test_effective_rank_is_the_exponential_of_the_entropy_of_normalised_singular_values():
    """Eq. (17) on singular values 3 and 1: p = (3/4, 1/4)."""
    Z = torch.diag(torch.tensor([3.0, 1.0], dtype=DT))
    expected = math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert effective_rank(Z).item() == pytest.approx(expected, rel=1e-5)


def test_effective_rank_is_computed_over_the_last_two_dims():
    Z = _randn(2, 3, 7, 4, seed=32)
    r = effective_rank(Z)
    assert r.shape == (2, 3)
    torch.testing.assert_close(r[1, 2], effective_rank(Z[1, 2]))


def test_average_angle_of_orthogonal_vectors_is_90_degrees():
    Q, _ = torch.linalg.qr(_randn(6, 6, seed=33))
    assert average_angle(3.0 * Q.T[:5]).item() == pytest.approx(90.0, abs=1e-3)


def test_average_angle_of_identical_vectors_is_0_degrees():
    v = _randn(1, 5, seed=34)
    assert average_angle(v.expand(4, 5) * torch.tensor([[1.0], [2.0], [0.5], [7.0]], dtype=DT)).item() == \
        pytest.approx(0.0, abs=0.1)  # arccos near 1 is steep: float32 rounding gives a few hundredths


def test_average_angle_is_arccos_of_mean_cosine_eq_14_not_mean_of_angles():
    """Vectors at 0, 90 and 180 degrees, cosines 0, -1, 0: eq. (18) gives arccos(-1/3) = 109.47 degrees;
    the mean of the angles would be 120."""
    Z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=DT)
    got = average_angle(Z).item()
    assert got == pytest.approx(math.degrees(math.acos(-1 / 3)), abs=1e-3)
    assert abs(got - 120.0) > 10


def test_average_angle_over_pairs_i_less_than_j_matches_eq_14_on_random_vectors():
    Z = _randn(2, 3, 6, 4, seed=35)
    got = average_angle(Z)
    assert got.shape == (2, 3)
    u = F.normalize(Z, dim=-1)
    for b in range(2):
        for h in range(3):
            pairs = [u[b, h, i] @ u[b, h, j] for i in range(6) for j in range(i + 1, 6)]
            expected = math.degrees(math.acos(sum(pairs).item() * 2 / (6 * 5)))
            assert got[b, h].item() == pytest.approx(expected, abs=1e-3)
