"""The trace's head projections handed to the next update at inference (hyperset.accel.reuse): the same logits and
energies bit for bit, one product X W fewer per iteration, and never across states, weights or gradients."""

from __future__ import annotations

import pytest
import torch

from hyperset.accel import reuse
from hyperset.config import preset_config
from hyperset.models import HyperSETModel


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of `reuse.recall`'s hits and misses."""
    counts = {"hit": 0, "miss": 0}
    recall = reuse.recall

    def counting(*args):
        z = recall(*args)
        counts["hit" if z is not None else "miss"] += 1
        return z

    monkeypatch.setattr(reuse, "recall", counting)
    return counts


def _model() -> HyperSETModel:
    torch.manual_seed(0)
    return HyperSETModel(preset_config("sudoku-cpu", iters=6)).eval()


def test_a_traced_pass_reuses_the_energys_projections_and_gives_the_same_numbers(
        counted: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    x = torch.randint(0, 10, (3, 81))
    with torch.inference_mode():
        out = model.run(x, iters=6, trace=True)
        hits = counted["hit"]
        monkeypatch.setattr(reuse, "recall", lambda *args: None)  # every update makes its own
        ref = model.run(x, iters=6, trace=True)
    assert hits == 5  # every update but the first starts from a state whose energy the trace took
    assert torch.equal(out.logits, ref.logits)
    for name, values in ref.trace.energy.items():
        assert torch.equal(torch.stack(out.trace.energy[name]), torch.stack(values))


def test_nothing_is_reused_without_a_trace_or_under_gradients(counted: dict[str, int]) -> None:
    model = _model()
    x = torch.randint(0, 10, (2, 81))
    with torch.no_grad():
        model.run(x, iters=4)
    assert counted["hit"] == 0
    model.train()
    model.run(x, iters=4, trace=True).logits.sum().backward()
    assert counted["hit"] == 0


def test_a_kept_projection_serves_only_the_same_state_and_weight_once() -> None:
    X, W = torch.randn(2, 9, 8), torch.randn(8, 8)
    Z = torch.randn(2, 2, 9, 4)
    reuse.remember(X, W, 2, 1e-6, Z)
    assert reuse.recall(X.clone(), W, 2, 1e-6) is None  # equal values, another state
    reuse.remember(X, W, 2, 1e-6, Z)
    assert reuse.recall(X, W.clone(), 2, 1e-6) is None
    reuse.remember(X, W, 2, 1e-6, Z)
    assert reuse.recall(X, W, 4, 1e-6) is None and reuse.recall(X, W, 2, 1e-6) is None  # missed: forgotten
    reuse.remember(X, W, 2, 1e-6, Z)
    assert reuse.recall(X, W, 2, 1e-6) is Z
    assert reuse.recall(X, W, 2, 1e-6) is None  # once
    reuse.remember(X, W, 2, 1e-6, Z)
    reuse.forget()
    assert reuse.recall(X, W, 2, 1e-6) is None


def test_a_held_choice_serves_the_pass_and_nothing_else() -> None:
    """Inside `held` at inference the policy answers with the choice made for the state, for tensors of its device
    and dtype; a float64 tensor, and any tensor once gradients are on again, are asked as usual; outside the block,
    and with gradients on at its start, nothing is kept."""
    import hyperset.accel as accel

    x = torch.randn(2, 9, 8)
    with torch.no_grad():
        made = accel.policy(x)
        with accel.policy(x).hold(x):
            assert accel.policy(torch.randn(2, 4, 9, 2)) is made
            assert accel._held.choice[2] is made
            wider = accel.policy(x.double())
            assert wider is accel._choose(x.double())
            with torch.enable_grad():
                assert accel.policy(x) is accel._choose(x) and accel.policy(x).train
        assert getattr(accel._held, "choice", None) is None
    with accel.held(x):
        assert getattr(accel._held, "choice", None) is None


def test_a_state_or_weight_changed_in_place_is_a_miss() -> None:
    X, W = torch.randn(2, 5, 8), torch.randn(8, 8)
    for change in (X, W):
        reuse.remember(X, W, 2, 1e-6, torch.zeros(2, 2, 5, 4))
        change.mul_(2.0)
        assert reuse.recall(X, W, 2, 1e-6) is None
    reuse.remember(X, W, 2, 1e-6, Zn := torch.zeros(2, 2, 5, 4))
    assert reuse.recall(X, W, 2, 1e-6) is Zn
