"""A pytest plugin that registers a toy attention energy and a toy feedforward energy, as a user would add one:

    pytest -p toy_energy tests/test_energies.py tests/test_layers.py -k toy

(tests/ on PYTHONPATH). Every test parametrized over the registry then runs on them; no test file is edited.

    toy attention:   E = beta/4 sum_ij (z_i.z_j)^2          dE/dZ = beta (Z Z^T) Z
    toy feedforward: E = -1/4 sum_i sum_m u_im^4 / (1 + u_im^2)   -dE/dU = u^3 (2 + u^2) / (2 (1 + u^2)^2)
"""

from __future__ import annotations

from torch import Tensor

from hyperset import energies


def _attn(Z: Tensor, beta: float, phi: str, normalized: bool) -> Tensor:
    return beta / 4 * (Z @ Z.transpose(-1, -2)).pow(2).sum(dim=(1, 2, 3))


def _attn_grad(Z: Tensor, beta: float, phi: str) -> Tensor:
    return beta * (Z @ Z.transpose(-1, -2)) @ Z


def _ff(U: Tensor, phi: str) -> Tensor:
    return -0.25 * (U.pow(4) / (1 + U.pow(2))).sum(dim=(1, 2))


def _ff_grad(U: Tensor, phi: str) -> Tensor:
    u2 = U.pow(2)
    return U.pow(3) * (2 + u2) / (2 * (1 + u2).pow(2))


energies.register_attention("toy_quadratic", _attn, _attn_grad, formula="beta/4 sum_ij (z_i.z_j)^2")
energies.register_feedforward("toy_quartic", _ff, _ff_grad, formula="-1/4 sum u^4 / (1 + u^2)")
