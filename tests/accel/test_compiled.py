"""torch.compile, as the trainer uses it (``train.compile = true``) and bench/peer_bench.py times it: the compiled
model, which runs the fused operators (hyperset.accel.fused) through the compiler, computes the same logits and the same
gradients as the unoptimised eager path (``hyperset.accel.fused.written_out()``), within 1e-5."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hyperset.accel import fused
from hyperset.config import ModelConfig
from hyperset.models import build_model


def _pair(cfg: ModelConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    eager = build_model(cfg)
    with torch.no_grad():  # every parameter non-zero (zero-initialised step sizes would hide the step path)
        for p in eager.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return eager, copy.deepcopy(eager)


# the peer benchmark's configuration at a small size, and the depth recipe's path (deep supervision, detached
# segments, loss on every iteration)
CASES = {
    "peer": (dict(task="sudoku", dim=32, heads=4, ff_hidden=128, iters=4, time_dim=64, time_mlp=True, step_cond="x0",
                  step_norm="none", pos="learned", emb_dropout=0.0), {}),
    "depth": (dict(task="sudoku", dim=32, heads=4, ff_hidden=64, iters=3, time_dim=32, emb_dropout=0.0,
                   time_init="zero"), dict(iters=6, all_logits=True, detach_every=3)),
    # the Energy Transformer baseline: its energy's gradient in closed form under the compiler, by autograd in eager
    "et": (dict(task="sudoku", layer="et", dim=32, heads=4, ff_hidden=64, iters=3, emb_dropout=0.0), {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_outputs_and_gradients_match_eager(case: str) -> None:
    model_kw, call = CASES[case]
    cfg = ModelConfig(**model_kw)
    eager, twin = _pair(cfg)
    compiled = torch.compile(twin)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len), generator=g)
    y = torch.randint(0, cfg.num_classes, (4, cfg.seq_len), generator=g)
    outs = []
    for model, mode in ((eager, fused.written_out), (compiled, contextlib.nullcontext)):
        model.train()
        with mode():
            logits = model(x, **call)
        logits = torch.stack(list(logits)) if isinstance(logits, (list, tuple)) else logits
        loss = F.cross_entropy(logits.reshape(-1, cfg.num_classes), y.expand(*logits.shape[:-1]).reshape(-1))
        loss.backward()
        outs.append(logits.detach())
    assert torch.allclose(outs[0], outs[1], atol=1e-5, rtol=0), (outs[0] - outs[1]).abs().max()
    for (name, a), b in zip(eager.named_parameters(), twin.parameters()):
        assert a.grad is not None and b.grad is not None, name
        assert torch.allclose(a.grad, b.grad, atol=1e-5, rtol=0), (name, (a.grad - b.grad).abs().max())


def _counting_backend() -> tuple[Callable[..., Any], dict[str, int]]:
    """A torch.compile backend that runs each graph as traced and counts the graphs it is given and their calls."""
    counts = {"graphs": 0, "calls": 0}

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Callable[..., Any]:
        counts["graphs"] += 1

        def run(*args: Any) -> Any:
            counts["calls"] += 1
            return gm(*args)
        return run

    return backend, counts


@pytest.mark.slow
@pytest.mark.parametrize("case", ["peer", "et"])
def test_the_compiler_traces_a_pass_into_graphs_that_do_not_grow_with_depth(case: str) -> None:
    """A pass compiles to a fixed number of graphs (the updates unrolled in one), not one graph call per update:
    the step-size check that runs in eager mode falls outside the iterations' generator, and the Energy
    Transformer takes its energy's gradient in closed form rather than by autograd inside the pass."""
    torch._dynamo.reset()
    cfg = ModelConfig(**CASES[case][0])
    backend, counts = _counting_backend()
    compiled = torch.compile(build_model(cfg), backend=backend)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    per_pass = {}
    for iters in (2, 6):
        compiled(x, iters)  # compiles for this depth
        counts["calls"] = 0
        compiled(x, iters).sum().backward()
        per_pass[iters] = counts["calls"]
    assert per_pass[2] == per_pass[6] < 6, per_pass  # one graph per update would make 6 or more at 6 updates


@pytest.mark.slow
def test_a_core_with_a_graph_per_update_compiles_once_for_every_depth() -> None:
    """With graph_per_update (set by an objective that draws the depth at every step) a new depth compiles
    nothing: the updates are graphs of their own. Without it the pass is one graph per depth."""
    cfg = ModelConfig(**CASES["peer"][0])
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    new_graphs = {}
    for per_update in (False, True):
        torch._dynamo.reset()
        model = build_model(cfg)
        model.core.graph_per_update = per_update
        backend, counts = _counting_backend()
        compiled = torch.compile(model, backend=backend)
        compiled(x, 2).sum().backward()
        compiled(x, 3).sum().backward()
        before = counts["graphs"]
        for iters in (4, 5, 6):
            compiled(x, iters).sum().backward()
        new_graphs[per_update] = counts["graphs"] - before
    assert new_graphs[True] == 0 and new_graphs[False] >= 3, new_graphs
