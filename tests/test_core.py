"""The recurrent core: layers x iterations, run-time depth, traces, geometry, zero-init steps, baselines."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hyperset.accel import rows as accel_rows
from hyperset.config import ModelConfig
from hyperset.core import RecurrentCore
from hyperset.models import build_model


def _cfg(task: str = "sudoku", **kw) -> ModelConfig:
    base = dict(task=task, dim=16, heads=4, ff_hidden=32, iters=3, time_dim=16, emb_dropout=0.0)
    if task == "classify":
        base.update(img_size=8, patch_grid=2, num_classes=4, pos="sincos1d", step_cond="xt", step_norm="cond",
                    head_norm="layer", head_bias=True)
    base.update(kw)
    return ModelConfig(**base)


def _inputs(cfg: ModelConfig, batch: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if cfg.task == "classify":
        x = torch.randn(batch, cfg.channels, cfg.img_size, cfg.img_size, generator=g)
        y = torch.randint(0, cfg.num_classes, (batch,), generator=g)
    else:
        x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
        y = torch.randint(0, cfg.num_classes, (batch, cfg.seq_len), generator=g)
    return x, y


def _model(cfg: ModelConfig, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(cfg)


def _x0(cfg: ModelConfig, batch: int = 2, n: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, n, cfg.dim, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------- 6. layers x iterations


def test_two_layers_times_three_iterations_run_six_updates_in_order():
    cfg = _cfg(n_layers=2, iters=3, step_init=0.1)
    torch.manual_seed(0)
    core = RecurrentCore(cfg)
    x0 = _x0(cfg)
    with torch.no_grad():
        index = {id(m): i for i, m in enumerate(core.layers)}
        seen = [(index[id(layer)], t) for layer, t, _ in core.iterate(x0)]
        out = core.run(x0, trace=True)
    assert seen == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]  # t restarts for every distinct layer
    stacked = out.trace.stacked()
    assert stacked["energy_attn"].shape == stacked["energy_ff"].shape == (6, 2)


def test_each_distinct_layer_has_its_own_parameters():
    cfg = _cfg(n_layers=2, iters=3, step_init=0.1)
    torch.manual_seed(0)
    core = RecurrentCore(cfg)
    one = sum(p.numel() for p in core.layers[0].parameters())
    assert sum(p.numel() for p in core.layers[1].parameters()) == one
    steps = sum(p.numel() for p in core.step_sizes.parameters())
    assert sum(p.numel() for p in core.parameters()) == 2 * one + steps  # the step network is shared
    ptrs0 = {p.data_ptr() for p in core.layers[0].parameters()}
    assert ptrs0.isdisjoint(p.data_ptr() for p in core.layers[1].parameters())
    assert not torch.equal(core.layers[0].W, core.layers[1].W)
    x0 = _x0(cfg)
    with torch.no_grad():
        before = core.run(x0, keep_states=True).states
        core.layers[1].W.add_(0.5)
        after = core.run(x0, keep_states=True).states
    for t in range(3):  # layer 0's updates do not see layer 1's parameters
        assert torch.equal(before[t], after[t])
    assert not torch.allclose(before[5], after[5])


# ----------------------------------------------------------------------------------------------- 7. core


def test_running_four_times_the_trained_depth_is_deterministic_in_eval_mode():
    cfg = _cfg(iters=3, step_init=0.1, emb_dropout=0.1)
    model = _model(cfg).eval()
    x, _ = _inputs(cfg)
    with torch.no_grad():
        a = model(x, iters=12)
        b = model(x, iters=12)
        trained = model(x)
    assert torch.isfinite(a).all()
    assert torch.equal(a, b)
    assert not torch.equal(a, trained)


def test_trace_gives_one_attention_and_feedforward_energy_per_iteration_per_sample():
    cfg = _cfg(iters=3, step_init=0.1)
    torch.manual_seed(0)
    core = RecurrentCore(cfg)
    x0 = _x0(cfg, batch=4)
    with torch.no_grad():
        out = core.run(x0, iters=5, trace=True, keep_states=True)
    stacked = out.trace.stacked()
    assert set(stacked) == {"energy_attn", "energy_ff"}
    assert stacked["energy_attn"].shape == stacked["energy_ff"].shape == (5, 4)
    layer = core.layers[0]
    for t, x in enumerate(out.states, start=1):  # recorded after each update, normalization first
        e = layer.energy(x, t)
        torch.testing.assert_close(stacked["energy_attn"][t - 1], e["attn"])
        torch.testing.assert_close(stacked["energy_ff"][t - 1], e["ff"])


def test_model_trace_has_one_value_per_iteration_per_sample():
    cfg = _cfg(iters=3, step_init=0.1)
    model = _model(cfg).eval()
    x, _ = _inputs(cfg, batch=2)
    with torch.no_grad():
        out = model.run(x, iters=4, trace=True, all_logits=True)
    assert len(out.trace.energy["attn"]) == len(out.trace.energy["ff"]) == 4
    assert all(e.shape == (2,) for e in out.trace.energy["attn"] + out.trace.energy["ff"])
    assert len(out.all_logits) == 4
    assert torch.equal(out.all_logits[-1], out.logits)


def test_energies_with_gradient_are_the_traces_and_reach_the_weights():
    """run(energies=True): E_ATTN + E_FF after every iteration, as the trace records them, but with their gradient
    (a training objective's); forward gives them beside the logits; by slices of rows at inference the same."""
    cfg = _cfg(iters=3, step_init=0.1)
    torch.manual_seed(0)
    model = _model(cfg)
    x, _ = _inputs(cfg, batch=3)
    out = model.run(x, iters=4, trace=True, energies=True)
    stacked = out.trace.stacked()
    assert len(out.energies) == 4 and all(e.requires_grad for e in out.energies)
    torch.testing.assert_close(torch.stack(out.energies).detach(), stacked["energy_attn"] + stacked["energy_ff"])
    logits, energy = model(x, iters=4, all_logits=True, energies=True)
    assert logits.shape[0] == 4 and energy.shape == (4, 3)
    energy.sum().backward()
    assert float(model.core.layers[0].W.grad.abs().sum()) > 0
    last, none = model(x, iters=0, energies=True)
    assert none.shape == (0, 3) and last.shape[0] == 3
    big, _ = _inputs(cfg, batch=2 * accel_rows.cache_rows(cfg) + 1)  # more rows than a slice: run slice by slice
    with torch.no_grad():
        sliced = model.run(big, iters=3, energies=True).energies
        whole = [torch.cat(p) for p in zip(*(model.core._run(model.stem(big[i:i + 1]), 3, False, False, False, 0, 0,
                                                              True).energies for i in range(len(big))))]
    assert len(sliced) == 3 and sliced[0].shape == (len(big),)
    torch.testing.assert_close(sliced, whole, rtol=1e-4, atol=1e-3)


def test_geometry_gives_effective_rank_in_1_to_p_and_angle_in_0_to_180_per_head_per_iteration():
    cfg = _cfg(iters=3, step_init=0.1)
    torch.manual_seed(0)
    core = RecurrentCore(cfg)
    x0 = _x0(cfg, batch=2, n=9)
    with torch.no_grad():
        out = core.run(x0, iters=4, geometry=True)
    p = cfg.head_dim
    assert len(out.trace.effective_rank) == len(out.trace.average_angle) == 4
    for r, a in zip(out.trace.effective_rank, out.trace.average_angle):
        assert r.shape == a.shape == (2, cfg.heads)
        assert (r >= 1 - 1e-4).all() and (r <= p + 1e-4).all()
        assert (a >= 0).all() and (a <= 180).all()
    stacked = out.trace.stacked()
    assert stacked["effective_rank"].shape == stacked["average_angle"].shape == (4, 2, cfg.heads)


def test_zero_iterations_return_the_stem_output_through_the_head():
    cfg = _cfg(step_init=0.1)
    model = _model(cfg).eval()
    x, _ = _inputs(cfg)
    with torch.no_grad():
        assert torch.equal(model.core.run(model.stem(x), iters=0).x, model.stem(x))
        assert torch.equal(model(x, iters=0), model.readout(model.stem(x)))
    with pytest.raises(ValueError):
        model(x, iters=-1)


@pytest.mark.parametrize("task", ["sudoku", "classify"])
def test_zero_initialised_step_network_makes_the_core_the_identity_at_init(task):
    cfg = _cfg(task, step_init=0.0)
    model = _model(cfg).eval()
    x, _ = _inputs(cfg)
    with torch.no_grad():
        x0 = model.stem(x)
        assert torch.equal(model.core.run(x0).x, x0)
        assert torch.equal(model.core.run(x0, iters=7).x, x0)
        assert torch.equal(model(x), model(x, iters=0))


def test_at_init_the_gradient_reaches_the_last_step_linear_only():
    """ReZero: with L1, L2, L3 zero, only L3 receives a gradient in the first step."""
    cfg = _cfg()
    model = _model(cfg).train()
    x, y = _inputs(cfg)
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    s = model.core.step_sizes
    assert s.L3.weight.grad.abs().max() > 0
    for lin in (s.L1, s.L2):
        assert lin.weight.grad.abs().max() == 0 and lin.bias.grad.abs().max() == 0


@pytest.mark.parametrize("cond", ["x0", "xt"])
def test_step_sizes_are_conditioned_on_x0_or_the_current_state(cond, monkeypatch):
    cfg = _cfg(step_cond=cond, step_init=0.1)
    torch.manual_seed(0)
    core = RecurrentCore(cfg)
    seen = []
    forward = core.step_sizes.forward
    def recording(t: torch.Tensor, c: torch.Tensor):
        seen.append((t.item(), c))
        return forward(t, c)

    monkeypatch.setattr(core.step_sizes, "forward", recording)
    x0 = _x0(cfg)
    with torch.no_grad():
        states = core.run(x0, keep_states=True).states
    assert [t for t, _ in seen] == [1.0, 2.0, 3.0]
    expected = [x0, x0, x0] if cond == "x0" else [x0, states[0], states[1]]
    for (_, c), e in zip(seen, expected):
        assert torch.equal(c, e)


def test_a_float64_model_with_the_time_mlp_runs():
    cfg = _cfg(step_init=0.1)
    model = _model(cfg).double().eval()
    x, _ = _inputs(cfg)
    with torch.no_grad():
        out = model(x)
    assert out.dtype == torch.float64


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_traced_energies_keep_the_precision_of_a_float64_model(dtype):
    """A trace is in float32, or in float64 for a float64 model: the energy steps of a tiny update stay visible."""
    cfg = _cfg(step_init=0.1)
    model = _model(cfg).to(dtype).eval()
    x, _ = _inputs(cfg)
    with torch.no_grad():
        out = model.run(x, iters=2, trace=True)
        frames = list(model.frames(x, iters=2, energies=True))
    want = torch.float64 if dtype == torch.float64 else torch.float32
    assert {e.dtype for e in out.trace.energy["attn"] + out.trace.energy["ff"]} == {want}
    assert {e.dtype for f in frames for e in f.energies.values()} == {want}


# ---------------------------------------------------------------------------------------- 10. baselines


@pytest.mark.parametrize("layer", ["hyperset", "transformer", "crate", "crate-t", "et"])
@pytest.mark.parametrize("task", ["sudoku", "classify"])
def test_every_layer_runs_through_the_core_gets_gradients_and_learns(layer, task):
    stem = "ln-linear-ln" if layer == "hyperset" else "linear"
    kw = dict(stem=stem) if task == "classify" else {}
    cfg = _cfg(task, layer=layer, iters=2, step_init=0.1, **kw)
    model = _model(cfg).train()
    assert type(model.core.layers[0]).__name__ == {
        "hyperset": "HyperSETLayer", "transformer": "TransformerLayer", "crate": "CRATELayer",
        "crate-t": "CRATELayer", "et": "EnergyTransformerLayer"}[layer]
    x, y = _inputs(cfg, batch=4)

    def loss_fn() -> torch.Tensor:
        logits = model(x)
        return F.cross_entropy(logits.reshape(-1, cfg.num_classes), y.reshape(-1))

    loss = loss_fn()
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    core_grads = [p.grad.abs().max() for p in model.core.layers[0].parameters()]
    assert max(core_grads) > 0
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = loss.item()
    for _ in range(6):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    with torch.no_grad():
        assert loss_fn().item() < first


# ------------------------------------------------------------------------------- rows sent to the iteration


@pytest.mark.parametrize("time_init", ["zero", "live"])
def test_rows_sent_to_iterate_run_on_as_if_they_had_run_alone(time_init):
    """A consumer that drops rows mid-run (the solver, for finished boards) gets, for the rows it keeps, the states
    of running those rows alone; with a dead time network (step sizes computed once, without gradient) too."""
    cfg = _cfg(time_init=time_init)
    model = _model(cfg).eval()
    x0 = _x0(cfg, batch=4)
    keep = torch.tensor([3, 1])
    with torch.no_grad():
        assert (model.core._fixed_steps(x0) is not None) == (time_init == "zero")
        alone = [x for _, _, x in model.core.iterate(x0[keep], 5)]
        it = model.core.iterate(x0, 5)
        got = [next(it)[2][keep]]
        got.append(it.send(keep)[2])
        got += [x for _, _, x in it]
    assert len(got) == 5
    for a, b in zip(got, alone):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_step_sizes_computed_once_equal_those_of_every_iteration_and_gradients_still_flow():
    cfg = _cfg(time_init="zero")
    model = _model(cfg)
    with torch.no_grad():
        model.core.step_sizes.L3.weight.normal_(0, 0.1)
    x0 = _x0(cfg, batch=2)
    with torch.no_grad():
        cached = [x for _, _, x in model.core.iterate(x0, 4)]
    per_t = [x for _, _, x in model.core.iterate(x0, 4)]  # with gradient: step sizes at every t
    for a, b in zip(cached, per_t):
        torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-7)
    per_t[-1].sum().backward()
    assert model.core.step_sizes.L3.weight.grad.abs().sum() > 0


# ------------------------------------------------------------------------------- inference in slices of rows


def test_cpu_inference_runs_slices_of_rows_with_the_numbers_of_the_whole_batch(monkeypatch):
    """Without gradients on a CPU a few rows at a time run so that they stay in cache: `run` takes each slice
    through every iteration, `frames` slices each update (and each traced energy), the torch solver backend runs
    like `run`. Logits, energies, geometry, every state and every frame equal those of the whole batch at once."""
    from hyperset.accel import cpu_gemm
    from hyperset.backends import TorchBackend

    cfg = _cfg()
    model = _model(cfg).eval()
    x, _ = _inputs(cfg, batch=8)
    layer = model.core.layers[0]
    calls = []
    step = layer.step
    monkeypatch.setattr(layer, "step", lambda v, t, s, shared=None: calls.append(len(v)) or step(v, t, s, shared))
    widest = max(cfg.dim, cfg.ff_hidden, cfg.heads * cfg.seq_len)
    monkeypatch.setattr(accel_rows, "SLICE_BYTES", 3 * 4 * cfg.seq_len * widest)  # 3 rows per slice
    monkeypatch.setattr(cpu_gemm, "_wanted", False)  # its slices of the state's width: test_cpu_gemm
    assert accel_rows.slice_rows(cfg, 8, torch.device("cpu")) == 0  # gradients on: the whole batch
    with torch.no_grad():
        assert accel_rows.slice_rows(cfg, 8, torch.device("cpu")) == 3
        assert accel_rows.slice_rows(cfg, 3, torch.device("cpu")) == 0  # one slice is the batch
        sliced = model.run(x, 5, trace=True, geometry=True, all_logits=True)
        frames = [f.energies for f in model.frames(x, 5, energies=True)]
        assert calls[:15] == [3] * 10 + [2] * 5  # run: slice by slice, each through the 5 iterations
        assert calls[15:30] == [3, 3, 2] * 5  # frames: every update in slices
        backend = TorchBackend(model, "cpu").run(x, 5)
        monkeypatch.setattr(accel_rows, "SLICE_BYTES", 1 << 40)
        whole = model.run(x, 5, trace=True, geometry=True, all_logits=True)
        whole_backend = TorchBackend(model, "cpu").run(x, 5)
    assert len(calls) == 3 * 15 + 2 * 5  # run, frames and the backend in 3 slices; run and the backend whole
    torch.testing.assert_close(sliced.logits, whole.logits, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.stack(sliced.all_logits), torch.stack(whole.all_logits), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(backend[0], whole_backend[0], atol=1e-6, rtol=1e-6)
    for k, v in whole_backend[1].items():
        torch.testing.assert_close(backend[1][k], v, atol=1e-5, rtol=1e-6)
        torch.testing.assert_close(v, whole.trace.stacked()[f"energy_{k}"], atol=1e-5, rtol=1e-6)
    assert set(sliced.trace.stacked()) == set(whole.trace.stacked()) >= {"effective_rank", "average_angle"}
    for k, v in whole.trace.stacked().items():
        torch.testing.assert_close(sliced.trace.stacked()[k], v, atol=1e-5, rtol=1e-6)
        if k.startswith("energy_"):
            torch.testing.assert_close(torch.stack([f[k.removeprefix("energy_")] for f in frames]), v, atol=1e-5,
                                       rtol=1e-6)
