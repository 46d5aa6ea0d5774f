"""The step-size network and the depth-robust training options: a live time network, positive steps, t clamping,
random depth, deep supervision over detached segments and the no-grad prefix."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
import torch
from conftest import write_sudoku_csvs

from hyperset.config import preset_config
from hyperset.models import HyperSETModel, load_checkpoint, save_checkpoint
from hyperset.solve import bundled_checkpoint
from hyperset.training.sudoku_task import SudokuData, SudokuTask
from hyperset.training.trainer import TrainConfig, Trainer

STEP_PARAMS = ("L1.weight", "L1.bias", "L2.weight", "L2.bias", "L3.weight", "L3.bias")


def tiny(**kw) -> HyperSETModel:
    torch.manual_seed(0)
    return HyperSETModel(preset_config("sudoku-cpu", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=4, **kw))


def boards(n: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    digits = torch.randint(1, 10, (n, 81), generator=g)
    return torch.where(torch.rand(n, 81, generator=g) < 0.4, digits, torch.zeros_like(digits))


def step_sizes_at(model: HyperSETModel, t: float) -> tuple[torch.Tensor, torch.Tensor]:
    x0 = model.stem(boards())
    with torch.no_grad():
        return model.core.step_sizes(torch.tensor(t), x0)


def train_steps(model: HyperSETModel, n: int) -> dict[str, torch.Tensor]:
    """n SGD steps on the all-iteration loss; returns the gradients of the last step by parameter name."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    p = boards(4)
    for _ in range(n):
        opt.zero_grad()
        logits = model(p, all_logits=True)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 2), torch.zeros(logits[..., 0].numel()).long())
        loss.backward()
        grads = {k: v.grad.clone() for k, v in model.named_parameters() if v.grad is not None}
        opt.step()
    return grads


def test_default_time_network_gets_a_gradient_in_every_parameter_after_one_step() -> None:
    model = tiny()
    grads = train_steps(model, 2)  # the gradients of the second step, after one update
    for name in STEP_PARAMS:
        g = grads[f"core.step_sizes.{name}"]
        assert g.abs().sum() > 0, name


def test_authors_init_keeps_the_time_network_dead_so_step_sizes_ignore_t() -> None:
    model = tiny(time_init="zero")
    train_steps(model, 5)
    s = model.core.step_sizes
    for lin in (s.L1, s.L2):
        assert not lin.weight.any()
    a1, g1 = step_sizes_at(model, 1)
    for t in (4, 5, 64, 128):
        a, g = step_sizes_at(model, t)
        assert torch.equal(a, a1) and torch.equal(g, g1)


def test_live_time_network_makes_step_sizes_depend_on_t_after_training() -> None:
    model = tiny()
    train_steps(model, 5)
    a1, _ = step_sizes_at(model, 1)
    a4, _ = step_sizes_at(model, 4)
    assert not torch.allclose(a1, a4)


def test_the_default_init_changes_only_the_step_size_network_and_not_the_start() -> None:
    live, dead = tiny(), tiny(time_init="zero")
    for (name, a), (_, b) in zip(live.state_dict().items(), dead.state_dict().items()):
        if name.startswith(("core.step_sizes.L1", "core.step_sizes.L2")):
            assert not torch.equal(a, b), name
        else:
            assert torch.equal(a, b), name
    with torch.no_grad():  # L3 starts at zero weight, so both start with alpha = gamma = step_init
        assert torch.equal(live(boards()), dead(boards()))
    alpha, gamma = step_sizes_at(live, 7)
    assert torch.allclose(alpha, torch.full_like(alpha, 0.1)) and torch.allclose(gamma, torch.full_like(gamma, 0.1))


def test_positive_step_sizes_start_at_step_init_and_stay_positive() -> None:
    model = tiny(step_sign="positive")
    alpha, gamma = step_sizes_at(model, 3)
    assert torch.allclose(alpha, torch.full_like(alpha, 0.1), atol=1e-6)
    with torch.no_grad():
        model.core.step_sizes.L3.weight.normal_(std=3.0)
    alpha, gamma = step_sizes_at(model, 3)
    assert (alpha > 0).all() and (gamma > 0).all()
    signed = tiny()
    with torch.no_grad():
        signed.core.step_sizes.L3.weight.normal_(std=3.0)
    assert (step_sizes_at(signed, 3)[0] < 0).any()  # the paper's form has no sign constraint


def test_positive_steps_need_a_positive_step_init() -> None:
    with pytest.raises(ValueError, match="step_init > 0"):
        preset_config("sudoku-cpu", step_sign="positive", step_init=0.0)


def test_time_max_reuses_the_step_sizes_of_t_max_past_it() -> None:
    model = tiny(time_max=4)
    train_steps(model, 3)
    assert torch.equal(step_sizes_at(model, 4)[0], step_sizes_at(model, 9)[0])
    assert not torch.equal(step_sizes_at(model, 3)[0], step_sizes_at(model, 4)[0])


def test_the_shipped_model_has_a_dead_time_network_and_loads_with_its_outputs() -> None:
    """Its config.json predates time_init; the weights (L1 = L2 = 0) decide what it computes."""
    model, _ = load_checkpoint(bundled_checkpoint())
    s = model.core.step_sizes
    assert not s.L1.weight.any() and not s.L2.weight.any()
    x0 = model.stem(boards())
    with torch.no_grad():
        ref = s(torch.tensor(1.0), x0)
        for t in (16.0, 17.0, 64.0, 128.0):
            assert all(torch.equal(a, b) for a, b in zip(s(torch.tensor(t), x0), ref))


def test_checkpoints_without_the_new_config_keys_load_with_the_same_outputs(tmp_path: Path) -> None:
    model = tiny(time_init="zero")
    train_steps(model, 2)
    save_checkpoint(tmp_path / "ck", model)
    cfg_file = tmp_path / "ck" / "config.json"
    meta = json.loads(cfg_file.read_text())
    for key in ("time_init", "step_sign", "time_max"):
        del meta["model"][key]
    cfg_file.write_text(json.dumps(meta))
    loaded, _ = load_checkpoint(tmp_path / "ck")
    assert loaded.cfg.time_init == "live" and loaded.cfg.step_sign == "signed" and loaded.cfg.time_max == 0
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(boards(), iters=9), model(boards(), iters=9))


def test_reviving_a_dead_time_network_keeps_outputs_and_lets_it_learn() -> None:
    model = tiny(time_init="zero")
    train_steps(model, 3)
    model.eval()
    with torch.no_grad():
        before = model(boards(), iters=6)
    assert model.core.step_sizes.revive_time_network()
    assert not model.core.step_sizes.revive_time_network()  # only a dead one is revived
    with torch.no_grad():
        assert torch.allclose(model(boards(), iters=6), before, atol=1e-6)
    grads = train_steps(model.train(), 1)
    assert grads["core.step_sizes.L2.weight"].abs().sum() > 0


def test_skip_runs_a_no_grad_prefix_and_yields_the_iterations_after_it() -> None:
    model = tiny()
    x0 = model.stem(boards())
    full = [x for _, _, x in model.core.iterate(x0, 7)]
    out = list(model.core.iterate(x0, 3, skip=4))
    assert [t for _, t, _ in out] == [5, 6, 7]
    for (_, _, x), ref in zip(out, full[4:]):
        assert torch.allclose(x, ref, atol=1e-6)
    grad = torch.autograd.grad(out[-1][2].sum(), model.core.layers[0].W, allow_unused=True)[0]
    assert grad is not None  # the supervised iterations are differentiable


def test_detach_every_cuts_the_graph_between_segments() -> None:
    model = tiny()
    x0 = model.stem(boards())
    states = [x for _, _, x in model.core.iterate(x0, 4, detach_every=2)]
    assert torch.autograd.grad(states[3].sum(), states[1], allow_unused=True)[0] is None
    assert torch.autograd.grad(states[1].sum(), states[0], allow_unused=True)[0] is not None
    plain = [x for _, _, x in model.core.iterate(x0, 4)]
    assert torch.allclose(states[3], plain[3])  # the values are the same, only the graph differs


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sudoku_csvs(tmp_path_factory.mktemp("sudoku-depth"), 64, 20, seed=2)


def task(data_dir: Path, **objective) -> SudokuTask:
    cfg = preset_config("sudoku-cpu", dim=32, heads=2, ff_hidden=64, time_dim=16, iters=2)
    return SudokuTask(model=cfg, data=SudokuData(data_dir=str(data_dir), n_train=0, n_val=10, n_select=10),
                      **objective)


def test_depth_draws_are_in_range_and_a_function_of_the_step(data_dir: Path) -> None:
    t = task(data_dir, train_iters=[1, 5], skip_iters=[0, 3])
    draws = [t.depth_draw(step, 0) for step in range(60)]
    assert draws == [t.depth_draw(step, 0) for step in range(60)]
    assert {d[0] for d in draws} == {1, 2, 3, 4, 5} and {d[1] for d in draws} == {0, 1, 2, 3}
    assert task(data_dir).depth_draw(7, 0) == (2, 0)


@pytest.mark.parametrize("objective, per_update", [({}, False), ({"segments": 2}, False),
                                                  ({"train_iters": [1, 3]}, True), ({"skip_iters": [0, 2]}, True)])
def test_a_depth_drawn_at_every_step_compiles_a_graph_per_update(data_dir: Path, objective: dict,
                                                                 per_update: bool) -> None:
    """Under torch.compile a pass is one graph specialised on its depth; an objective that draws the depth at every
    step builds its model with a graph per update instead (tests/accel/test_compiled.py checks what each does)."""
    assert task(data_dir, **objective).build_model().core.graph_per_update is per_update


def test_segments_supervise_every_iteration_of_every_segment(data_dir: Path) -> None:
    t = task(data_dir, segments=3, train_iters=[2, 2])
    model = HyperSETModel(t.model_config())
    batch = t.batch(0, 4, 0, torch.device("cpu"))
    seen = []
    model.register_forward_hook(lambda m, args, kw, out: seen.append((kw, out.shape)), with_kwargs=True)
    t.loss(model, batch)
    kw, shape = seen[0]
    assert kw["iters"] == 6 and kw["detach_every"] == 2 and shape[0] == 6


@pytest.mark.parametrize("objective", [{"segments": 2}, {"train_iters": [1, 3]}, {"skip_iters": [0, 2]}])
def test_each_depth_option_trains_and_resumes_to_the_same_weights(data_dir: Path, tmp_path: Path,
                                                                  objective: dict) -> None:
    cfg = lambda steps: TrainConfig(steps=steps, batch_size=8, lr=3e-3, warmup_steps=1, amp="off",  # noqa: E731
                                    eval_every=1000, log_every=1, save_every_seconds=1e9, threads=1)
    Trainer(task(data_dir, **objective), cfg(5), tmp_path / "straight", quiet=True).fit()
    Trainer(task(data_dir, **objective), cfg(2), tmp_path / "split", quiet=True).fit()
    Trainer(task(data_dir, **objective), cfg(5), tmp_path / "split", resume=True, quiet=True).fit()
    a, _ = load_checkpoint(tmp_path / "straight" / "last")
    b, _ = load_checkpoint(tmp_path / "split" / "last")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("bad", [{"train_iters": [3, 1]}, {"train_iters": [0, 2]}, {"skip_iters": [2]},
                                 {"segments": 0}, {"supervise": "every"}])
def test_bad_depth_options_are_named(data_dir: Path, bad: dict) -> None:
    with pytest.raises(ValueError, match="objective"):
        task(data_dir, **bad)


def test_init_from_starts_a_new_run_from_a_checkpoint_and_revives_its_time_network(data_dir: Path,
                                                                                   tmp_path: Path) -> None:
    torch.manual_seed(123)
    src = HyperSETModel(task(data_dir).model_config().replace(time_init="zero"))
    save_checkpoint(tmp_path / "src", src)
    trainer = Trainer(task(data_dir), TrainConfig(steps=1, batch_size=8, amp="off", eval_every=1000, threads=1),
                      tmp_path / "run", quiet=True, init_from=str(tmp_path / "src"))
    trainer.fit()
    assert trainer.model.core.step_sizes.L1.weight.any()  # revived
    moved = (trainer.model.core.layers[0].W - src.core.layers[0].W).abs().max()
    assert moved < 5e-3  # one Adam step from the source weights, not a new initialisation (std 0.02)


def test_init_from_signed_steps_into_positive_ones_restarts_the_step_output(data_dir: Path, tmp_path: Path) -> None:
    """A positive-step run from a signed checkpoint keeps every weight but L3, which starts as a new positive model
    starts it (alpha = gamma = step_init); from a positive checkpoint L3 is kept."""
    torch.manual_seed(5)
    cfg = task(data_dir).model_config()
    src = HyperSETModel(cfg)
    with torch.no_grad():
        src.core.step_sizes.L3.weight.normal_(0, 0.05)
    save_checkpoint(tmp_path / "signed", src)
    positive = task(data_dir)
    positive.model = cfg.replace(step_sign="positive")
    still = TrainConfig(steps=1, batch_size=8, amp="off", eval_every=1000, threads=1, lr=1e-12,
                        min_lr=0.0)  # one step, ~no move
    trainer = Trainer(positive, still, tmp_path / "run", quiet=True, init_from=str(tmp_path / "signed"))
    trainer.fit()
    sizes = trainer.model.core.step_sizes
    start = math.log(math.expm1(cfg.step_init))
    assert sizes.L3.weight.abs().max() < 1e-9 and torch.allclose(sizes.L3.bias, torch.full_like(sizes.L3.bias, start))
    assert torch.allclose(trainer.model.core.layers[0].W, src.core.layers[0].W, atol=1e-9)  # the rest as loaded
    with torch.no_grad():
        trainer.model.core.step_sizes.L3.weight.fill_(0.01)
    save_checkpoint(tmp_path / "positive", trainer.model)
    again = Trainer(positive, still, tmp_path / "run2", quiet=True, init_from=str(tmp_path / "positive"))
    again.fit()
    assert torch.allclose(again.model.core.step_sizes.L3.weight, torch.full_like(sizes.L3.weight, 0.01), atol=1e-9)


def test_the_best_checkpoint_can_be_chosen_at_another_depth(data_dir: Path) -> None:
    t = task(data_dir, select_iters=6)
    assert t.select_metric == "select/board_acc@6"
    metrics = t.evaluate(HyperSETModel(t.model_config()), torch.device("cpu"), contextlib.nullcontext)
    assert "select/board_acc@6" in metrics and "select/board_acc@2" not in metrics
    assert task(data_dir).select_metric == "select/board_acc@2"
