"""The optimised training path (hyperset.accel.fused, step sizes once per pass) against the written-out one: the same
outputs and gradients, within 1e-5 in fp32 at the shared configuration of bench/peer_bench.py."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hyperset.accel import cpu_kernels, fused
from hyperset.config import ModelConfig
from hyperset.energies import attn_energy_grad_heads, merge_heads, rms_normalize, split_heads
from hyperset.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import peer_bench  # noqa: E402


def _written_out_ff(X, D, g, eps):
    return F.relu(rms_normalize(X @ D, eps) * g) @ D.t()


def _written_out_attn(X, W, g, heads, eps):
    Z = rms_normalize(split_heads(X @ W, heads), eps) * g
    return merge_heads(attn_energy_grad_heads(Z, "bisoftmax")) @ W.t()


def _gains(n: int, gen: torch.Generator) -> torch.Tensor:
    g = torch.randn(n, dtype=torch.float64, generator=gen)
    g[:3] = 0.0  # zero gains (a sign of +1 in the folded form), and both signs elsewhere
    return g


def _grads(out: torch.Tensor, inputs: tuple[torch.Tensor, ...], probe: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad((out * probe).sum(), inputs)


def test_relu_descent_equals_autograd_of_the_written_out_feedforward() -> None:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(3, 9, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    D = (0.3 * torch.randn(16, 40, dtype=torch.float64, generator=gen)).requires_grad_()
    g = _gains(40, gen).requires_grad_()
    out, ref = fused.relu_descent(X, *fused.fold_ff(D, g), 1e-6), _written_out_ff(X, D, g, 1e-6)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    probe = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    for a, b in zip(_grads(out, (X, D, g), probe), _grads(ref, (X, D, g), probe)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_bisoftmax_grad_equals_autograd_of_the_written_out_attention() -> None:
    gen = torch.Generator().manual_seed(1)
    heads = 4
    X = torch.randn(3, 9, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    W = (0.3 * torch.randn(16, 16, dtype=torch.float64, generator=gen)).requires_grad_()
    g = _gains(16 // heads, gen).requires_grad_()
    out, ref = fused.bisoftmax_grad(X, W, g, heads, 1e-6), _written_out_attn(X, W, g, heads, 1e-6)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    probe = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    for a, b in zip(_grads(out, (X, W, g), probe), _grads(ref, (X, W, g), probe)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_their_backward_cannot_be_differentiated_again() -> None:
    X = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    D = torch.randn(8, 12, dtype=torch.float64, requires_grad=True)
    (gx,) = torch.autograd.grad(fused.relu_descent(X, *fused.fold_ff(D, torch.ones(12, dtype=torch.float64)),
                                                    1e-6).sum(), X,
                                create_graph=True)
    with pytest.raises(RuntimeError):
        gx.sum().backward()


def test_they_run_only_for_training_without_autocast() -> None:
    x = torch.zeros(1)
    assert fused.usable(x)
    # under torch.compile too: the compiler traces their backward passes
    assert torch.compile(lambda v: v + float(fused.usable(v)), backend="eager")(x).item() == 1.0
    with torch.no_grad():
        assert not fused.usable(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fused.usable(x)
    with fused.written_out():
        assert not fused.usable(x) and not fused.enabled()
    assert fused.enabled()
    # torch.func's transforms cannot run these autograd.Functions: the written-out layer runs there
    assert torch.func.grad(lambda v: v.sum() * float(fused.usable(v)) + v.sum())(x).item() == 1.0


def test_torch_func_and_second_order_gradients_get_the_written_out_layer() -> None:
    """A researcher's Jacobian of a training-mode model (torch.func) equals autograd's, and gradients of gradients
    run under `written_out`, as docs/model.md says."""
    torch.manual_seed(0)
    cfg = ModelConfig(task="sudoku", dim=16, heads=4, ff_hidden=32, iters=3, time_dim=16, step_init=0.1,
                      emb_dropout=0.0)
    model = build_model(cfg).double()
    emb = model.stem(torch.randint(0, 10, (1, 81))).detach()
    jac = torch.func.jacrev(lambda e: model.core.run(e).x.sum(-1))(emb)
    ref = torch.autograd.functional.jacobian(lambda e: model.core.run(e).x.sum(-1), emb)
    torch.testing.assert_close(jac, ref, rtol=1e-10, atol=1e-12)
    e = emb.clone().requires_grad_()
    with fused.written_out():
        (g,) = torch.autograd.grad(model.readout(model.core.run(e).x).pow(2).mean(), e, create_graph=True)
        g.pow(2).sum().backward()
    assert e.grad is not None and bool(e.grad.abs().sum() > 0)


def _peer_model(dead_time_network: bool) -> torch.nn.Module:
    """The shared configuration (d=128, 4 heads, M=4d, 24 iterations, time embedding 512) with every weight
    random: the authors' dead time network (L1 = L2 = 0: step sizes once per pass) or a live one."""
    model = peer_bench.random_model(dead_time_network)
    assert model.core.step_sizes.constant_in_t() == dead_time_network
    return model


ONEDNN_HERE = fused.onednn_here()


with cpu_kernels.using_cpu_kernels("on"):
    KERNEL_HERE = cpu_kernels.status()


@pytest.mark.parametrize("kernels", ["off", pytest.param("on", marks=pytest.mark.skipif(
    KERNEL_HERE != "on", reason=f"the attention-map kernel cannot run here: {KERNEL_HERE}"))])
@pytest.mark.parametrize("library", ["aten", pytest.param("onednn", marks=pytest.mark.skipif(
    not ONEDNN_HERE, reason="PyTorch has no oneDNN here"))])
@pytest.mark.parametrize("dead_time_network", [True, False])
def test_training_step_equals_the_written_out_path_within_1e_5(dead_time_network: bool, library: str, kernels: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Logits and every parameter's gradient of one fp32 training step (last-iteration cross-entropy, as the peer
    benchmark trains), optimised against `fused.written_out()`, with the operators' products on ATen's GEMM and on
    oneDNN's, and the attention maps in PyTorch's calls and in hyperset.accel.cpu_kernels' kernel. The optimised pass
    folds the feedforward's weights once for its 24 iterations.

    A gradient through a ReLU changes by O(1), not by rounding, where rounding moves a unit across 0, so any two
    fp32 paths can differ by 1e-4 or more on some inputs (the written-out path and fp64 too), the more often the
    more units a step has. On an AMD EPYC, over input seeds 0-7 with each time network (16 cases), the path on
    oneDNN exceeded 1e-5 on 4 with four boards and on 2 with one board, oneDNN with the kernel on 7 and 2, ATen with
    the kernel on 1 and 0, ATen alone on none. So the step is of one board, one where no path crosses a kink; the
    attention operator's own test (tests/accel/test_cpu_kernels.py) holds without that condition."""
    model = _peer_model(dead_time_network)
    twin = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(3 if dead_time_network else 4)
    x = torch.randint(0, 10, (1, 81), generator=gen)
    y = torch.randint(0, 9, (1, 81), generator=gen)

    def step(m: torch.nn.Module) -> torch.Tensor:
        logits = m(x)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        return logits.detach()

    calls = []
    forward = model.core.step_sizes.forward
    model.core.step_sizes.forward = lambda t, c: calls.append(t) or forward(t, c)
    folds = []
    fold_ff = fused.fold_ff
    monkeypatch.setattr(fused, "fold_ff", lambda D, g: folds.append(1) or fold_ff(D, g))
    products = []
    onednn_mm = fused._onednn_mm
    monkeypatch.setattr(fused, "_onednn_mm", lambda a, b: products.append(1) or onednn_mm(a, b))
    with fused.using_cpu_matmul(library), cpu_kernels.using_cpu_kernels(kernels):
        fast = step(model)
    assert len(calls) == (1 if dead_time_network else 24) and len(folds) == 1
    # per iteration 4 products forward (X Ds, ReLU(U) Dg^T, X W, G W^T) and 4 backward
    assert len(products) == (8 * 24 if library == "onednn" else 0)
    with fused.written_out():
        slow = step(twin)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        scale = max(q.grad.abs().max().item(), 1e-3)
        assert (p.grad - q.grad).abs().max().item() <= 1e-5 * scale, name


def test_depth_recipe_segments_train_through_the_step_sizes_made_once() -> None:
    """Detached segments with the loss on every iteration (the depth recipe) share the once-made step sizes: the
    gradients still equal the written-out path's."""
    cfg = ModelConfig(task="sudoku", dim=32, heads=4, ff_hidden=64, iters=3, time_dim=32, emb_dropout=0.0,
                      time_init="zero")
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():
        model.core.step_sizes.L3.weight.normal_(0, 0.1)
    twin = copy.deepcopy(model)
    x = torch.randint(0, 10, (3, 81), generator=torch.Generator().manual_seed(3))
    model(x, iters=6, all_logits=True, detach_every=3).square().mean().backward()
    with fused.written_out():
        twin(x, iters=6, all_logits=True, detach_every=3).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_depth_wise_lora_and_two_layers_get_the_written_out_gradients() -> None:
    """W_t = W + B_t A_t reaches the fused operators as a computed tensor: its gradient flows on to the adapters."""
    cfg = ModelConfig(task="sudoku", dim=32, heads=4, ff_hidden=64, iters=3, time_dim=32, emb_dropout=0.0,
                      lora_rank=2, n_layers=2)
    torch.manual_seed(0)
    model = build_model(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    twin = copy.deepcopy(model)
    x = torch.randint(0, 10, (3, 81), generator=torch.Generator().manual_seed(4))
    model(x).square().mean().backward()
    with fused.written_out():
        twin(x).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        scale = max(q.grad.abs().max().item(), 1e-6)
        assert (p.grad - q.grad).abs().max().item() <= 1e-5 * scale, name


@pytest.mark.skipif(not ONEDNN_HERE, reason="PyTorch has no oneDNN here")
def test_the_onednn_products_step_aside_where_they_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fused.matmul` on oneDNN equals a @ b; it is a @ b where a gradient must flow through it, under autocast,
    in a trace and for other dtypes, and torch's FLOP counter counts it as the product it is."""
    from torch.utils.flop_counter import FlopCounterMode

    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 9, 16, generator=gen), torch.randn(16, 24, generator=gen)
    seen = []
    onednn_mm = fused._onednn_mm
    monkeypatch.setattr(fused, "_onednn_mm", lambda x, y: seen.append(1) or onednn_mm(x, y))
    with fused.using_cpu_matmul("onednn") as used:
        assert used == "onednn" == fused.cpu_matmul_library()
        torch.testing.assert_close(fused.matmul(a, b), a @ b, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(fused.matmul(a, b.t().contiguous().t()), a @ b, rtol=1e-6, atol=1e-6)
        assert len(seen) == 2
        with FlopCounterMode(display=False) as counter:
            fused.matmul(a, b)
        assert counter.get_total_flops() == 2 * 2 * 9 * 16 * 24 and len(seen) == 3
        w = b.clone().requires_grad_()
        fused.matmul(a, w).sum().backward()  # autograd through it: ATen's product
        assert w.grad is not None and len(seen) == 3
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert fused.matmul(a, b).dtype == torch.bfloat16 and len(seen) == 3
        fused.matmul(a.double(), b.double())
        torch.jit.trace(lambda x: fused.matmul(x, b), (a,), check_trace=False)  # check_trace reruns it untraced
        assert len(seen) == 3
    with fused.using_cpu_matmul("aten") as used:
        assert used == "aten"
        fused.matmul(a, b)
        assert len(seen) == 3
    with pytest.raises(ValueError, match="expected one of auto, onednn, aten"):
        with fused.using_cpu_matmul("mkl"):
            pass


def test_auto_takes_onednn_on_x86_cpus_not_made_by_intel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(fused.torch.backends.mkldnn, "is_available", lambda: True)
    for vendor, library in (("AuthenticAMD", "onednn"), ("HygonGenuine", "onednn"), ("GenuineIntel", "aten"),
                            (None, "aten")):
        monkeypatch.setattr(fused.device, "cpu_vendor", lambda v=vendor: v)
        for asked, used in (("auto", library), ("aten", "aten"), ("onednn", "onednn")):
            with fused.using_cpu_matmul(asked) as got:
                assert got == used == fused.cpu_matmul_library()
    monkeypatch.setattr(fused.platform, "machine", lambda: "aarch64")  # no x86: ATen's whatever is asked
    for asked in ("auto", "onednn"):
        with fused.using_cpu_matmul(asked) as got:
            assert got == "aten"
    monkeypatch.setenv("HYPERSET_CPU_MATMUL", "Intel-MKL")
    with pytest.warns(UserWarning, match="HYPERSET_CPU_MATMUL='intel-mkl' is not one of auto, onednn, aten"):
        assert fused.env_choice("HYPERSET_CPU_MATMUL", fused.CPU_MATMULS) == "auto"
    monkeypatch.setenv("HYPERSET_CPU_MATMUL", "ATEN")
    assert fused.env_choice("HYPERSET_CPU_MATMUL", fused.CPU_MATMULS) == "aten"


@pytest.mark.skipif(not ONEDNN_HERE, reason="PyTorch has no oneDNN here")
def test_bf16_products_round_both_operands_at_inference_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the bf16 precision on a CPU with native bf16, a product at inference is that of the operands rounded to
    bf16 (summed in fp32, the result rounded to bf16), returned in fp32; with a gradient to take, or without native
    bf16 (asked for, fp32 is used), it is fp32's."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 9, 64, generator=gen), torch.randn(64, 24, generator=gen)
    rounded = a.to(torch.bfloat16).float() @ b.to(torch.bfloat16).float()
    native = fused.device.cpu_has_native_bf16()
    # oneDNN makes a bf16 GEMM on AVX-512 CPUs (emulated without native bf16), none on AVX2 alone
    gemm = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    monkeypatch.setattr(fused.device, "cpu_has_native_bf16", lambda: False)
    with fused.using_cpu_precision("bf16") as used:
        assert used == "fp32" == fused.cpu_precision()
    monkeypatch.setattr(fused.device, "cpu_has_native_bf16", lambda: True)
    with fused.using_cpu_precision("bf16") as used:
        assert used == "bf16"
        if gemm:
            with torch.no_grad():
                out = fused.onednn_matmul(a, b)
            assert out.dtype == torch.float32
        w = b.clone().requires_grad_()
        exact = fused.onednn_matmul(a, w)  # gradients on: fp32 operands
    torch.testing.assert_close(exact, a @ b, rtol=1e-6, atol=1e-5)
    if native:  # the real bf16 GEMM: the rounded operands' product within one bf16 rounding of the result
        torch.testing.assert_close(out, rounded, rtol=2 ** -7, atol=1e-3)
        assert (out - a @ b).abs().max() > 1e-4
    with fused.using_cpu_precision("fp32") as used:
        assert used == "fp32"
        with torch.no_grad():
            torch.testing.assert_close(fused.onednn_matmul(a, b), a @ b, rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="expected one of fp32, bf16"):
        with fused.using_cpu_precision("fp16"):
            pass
