"""bench/mim_energy.py on a tiny random token model: its monotonicity count, energies and step-size signs agree with
what the model's own trace and step sizes say."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hyperset.config import preset_config
from hyperset.models import HyperSETModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import mim_energy  # noqa: E402

TINY = {"dim": 32, "heads": 2, "ff_hidden": 32, "iters": 3, "time_dim": 32, "vocab_size": 65, "num_classes": 64,
        "seq_len": 64}


def _model(seed: int = 2, spread: float = 0.05, scale: float = 0.1) -> HyperSETModel:
    """A tiny token model whose step sizes vary in sign (random L3) and whose weights are large enough to move
    (with these values its energy never rises on 4 of the 12 inputs below over 6 iterations)."""
    torch.manual_seed(seed)
    model = HyperSETModel(preset_config("mim-cpu", **TINY)).eval()
    with torch.no_grad():
        layer = model.core.layers[0]
        layer.W.normal_(0, scale)
        layer.D.normal_(0, scale)
        model.core.step_sizes.L3.weight.normal_(0, spread)
    return model


def _tokens(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 64, (n, 64), generator=g)
    return tokens.masked_fill(torch.rand(n, 64, generator=g) < 0.4, 64)  # 64 = the mask id


def test_monotone_counts_rises_beyond_float_noise():
    energy = np.array([[5.0, 5.0, 5.0, 5.0],
                       [4.0, 5.0, 6.0, 5.0 + 1e-7],
                       [3.0, 5.0, 5.0, 5.0]])  # columns: falling, flat, one rise, a rise within float noise
    assert mim_energy.monotone(energy).tolist() == [True, True, False, True]
    assert mim_energy.rises(energy)[:, 2].tolist() == [True, False]


@pytest.mark.parametrize("seed, spread, scale", [(2, 0.05, 0.1), (3, 0.05, 0.05)])
def test_measure_agrees_with_the_models_trace(seed: int, spread: float, scale: float):
    """Two tiny models: one whose energy never rises on some inputs to T and 2T alike, one on which it never rises
    on most inputs to T and on none to 2T (so a count taken to the wrong depth shows)."""
    model, tokens, iters = _model(seed, spread, scale), _tokens(12), 6
    out = mim_energy.measure(model, tokens, iters, batch=5)  # batches of 5, 5 and 2
    trace = model.run(tokens, iters=iters, trace=True).trace.stacked()
    total = (trace["energy_attn"] + trace["energy_ff"]).double().numpy()  # (iters, B), t = 1..iters
    rises = np.diff(total, axis=0) > mim_energy.RTOL * np.abs(total[:-1]).clip(min=1.0)
    never = int((~rises.any(0)).sum())
    never_to_T = int((~rises[: model.cfg.iters - 1].any(0)).sum())
    assert 0 < never_to_T < len(tokens)  # the tiny model's energy rises on some inputs and not on others
    assert out["monotone_total_count"] == {"T": never_to_T, "2T": never}
    assert out["monotone_total"]["2T"] == pytest.approx(never / len(tokens))
    np.testing.assert_allclose(out["mean"]["attn"][1:], trace["energy_attn"].double().mean(1).numpy(), rtol=1e-4)
    np.testing.assert_allclose(out["mean"]["ff"][1:], trace["energy_ff"].double().mean(1).numpy(), rtol=1e-4)
    with torch.no_grad():
        e0 = model.core.layers[0].energy(model.stem(tokens), 1)
    assert out["mean"]["attn"][0] == pytest.approx(float(e0["attn"].double().mean()), rel=1e-4)
    # the two half-steps add up to the whole iteration's change of E_ATTN
    steps = np.array(out["per_iteration"]["d_attn_attn_step"]) + np.array(out["per_iteration"]["d_attn_ff_step"])
    np.testing.assert_allclose(steps, np.diff(out["mean"]["attn"]), rtol=1e-4, atol=1e-3)


def test_measure_reports_the_signs_of_the_step_sizes():
    model, tokens = _model(), _tokens(6)
    with torch.no_grad():
        alpha, gamma = model.core.steps_at(model.stem(tokens), model.stem(tokens), 1)
    out = mim_energy.measure(model, tokens, 2)
    per = out["per_iteration"]
    assert per["alpha_neg"][0] == pytest.approx(float((alpha < 0).double().mean()), abs=1e-4)  # 4 digits kept
    assert per["gamma_neg"][0] == pytest.approx(float((gamma < 0).double().mean()), abs=1e-4)
    assert 0 < per["alpha_neg"][0] < 1
    masked = (tokens == 64)[..., None].expand_as(alpha)
    per_image = [float((alpha[i] < 0)[masked[i]].double().mean()) for i in range(len(tokens))]
    assert per["alpha_neg_masked"][0] == pytest.approx(float(np.mean(per_image)), abs=1e-4)
    with torch.no_grad():  # every step size positive: |alpha| changes nothing, and nothing is negative
        model.core.step_sizes.L3.weight.zero_()
    out = mim_energy.measure(model, tokens, 2)
    assert out["per_iteration"]["alpha_neg"] == [0.0, 0.0]
    assert out["per_iteration"]["d_attn_abs_alpha"] == pytest.approx(out["per_iteration"]["d_attn_attn_step"])
    assert out["counterfactual_abs_steps"]["mean"] == out["mean"]
