"""The energy registry: an energy is one entry beside its gradient, and the tests parametrized over the registry
cover a new one without an edit (tests/toy_energy.py registers one as a user would)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hyperset import config, energies
from hyperset.config import ModelConfig
from hyperset.models import build_model

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def registry() -> Iterator[None]:
    """The registries and the config's choices as they were, after the test."""
    saved = dict(energies.ATTENTION), dict(energies.FEEDFORWARD), dict(config.CHOICES)
    try:
        yield
    finally:
        for table, old in zip((energies.ATTENTION, energies.FEEDFORWARD, config.CHOICES), saved):
            table.clear()
            table.update(old)


def test_the_built_in_energies_are_the_configs_choices() -> None:
    assert tuple(energies.ATTENTION) == config.ATTENTIONS == config.CHOICES["attention"]
    assert tuple(energies.FEEDFORWARD) == config.FEEDFORWARDS == config.CHOICES["feedforward"]
    assert all(e.formula for e in (*energies.ATTENTION.values(), *energies.FEEDFORWARD.values()))


def test_an_unknown_energy_is_a_value_error_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown attention energy 'cubic' \(known: bisoftmax, sigmoid, linear\)"):
        energies.attn_energy_heads(torch.zeros(1, 1, 2, 2), "cubic")
    with pytest.raises(ValueError, match=r"unknown feedforward energy 'x' \(known: relu, softmax, gated\)"):
        energies.ff_energy_grad_hidden(torch.zeros(1, 2, 2), "x")


def test_a_taken_or_unusable_name_is_refused(registry: None) -> None:
    value, grad = energies.ATTENTION["sigmoid"].value, energies.ATTENTION["sigmoid"].grad
    for name in ("bisoftmax", "two words", ""):
        with pytest.raises(ValueError, match="a new name made of letters"):
            energies.register_attention(name, value, grad)
    assert tuple(energies.ATTENTION) == config.ATTENTIONS


def test_a_registered_energy_is_a_config_choice_and_a_model_runs_on_it(registry: None) -> None:
    energies.register_attention("quadratic",
                                lambda Z, beta, phi, normalized: beta / 4 * (Z @ Z.mT).pow(2).sum((1, 2, 3)),
                                lambda Z, beta, phi: beta * (Z @ Z.mT) @ Z, formula="beta/4 sum_ij (z_i.z_j)^2")
    assert config.CHOICES["attention"][-1] == "quadratic"
    torch.manual_seed(0)
    model = build_model(ModelConfig(task="sudoku", attention="quadratic", dim=32, heads=2, ff_hidden=64, iters=4,
                                    time_dim=32, vocab_size=10, num_classes=9, seq_len=81)).eval()
    with torch.no_grad():
        logits = model(torch.randint(0, 10, (2, 81)))
    assert logits.shape == (2, 81, 9) and torch.isfinite(logits).all()


@pytest.mark.slow
def test_a_toy_energy_registered_by_a_plugin_runs_through_every_registry_test() -> None:
    """The toy energies of tests/toy_energy.py are registered before collection; the registry-parametrized tests of
    the energies and of the layer's updates then take them (gradients against autograd, invariance on the sphere,
    descent of the half-steps), and pass."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "toy_energy", "-p", "no:cacheprovider",
                           str(TESTS / "test_energies.py"), str(TESTS / "test_layers.py"), "-k", "toy"],
                          capture_output=True, text=True, env=env, cwd=TESTS.parent, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", done.stdout).group(1))
    assert passed >= 11 and " failed" not in done.stdout, done.stdout[-2000:]
