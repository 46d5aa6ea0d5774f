"""The attention maps fused per (board, head) in C (hyperset.accel.cpu_kernels): the values of PyTorch's batched calls
within fp32 rounding, through the fused attention operator too, on one thread and on several; and where the kernel
cannot run, the operator on PyTorch's calls with the reason stated."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch

from hyperset.accel import cpu_gemm, cpu_kernels, fused
from hyperset.energies import attn_energy_grad_heads, merge_heads, rms_normalize, split_heads

with cpu_kernels.using_cpu_kernels("on"):
    HERE = cpu_kernels.status()
needs_kernel = pytest.mark.skipif(HERE != "on", reason=f"the kernel cannot run here: {HERE}")


def _maps(z: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    P = torch.softmax(beta * z @ z.transpose(1, 2), dim=-1)
    return P, (P + P.transpose(1, 2)) @ z


def _maps_backward(z: torch.Tensor, P: torch.Tensor, dG: torch.Tensor, beta: float) -> torch.Tensor:
    """The derivative of z -> (P + P^T) z along dG, by autograd of the written-out maps."""
    z = z.detach().requires_grad_()
    _, G = _maps(z, beta)
    return torch.autograd.grad(G, z, dG)[0]


@contextlib.contextmanager
def _kernel_on(threads: int) -> Iterator[None]:
    """The kernel on, PyTorch (and so the kernel) on `threads` threads, inside the block."""
    before, share = torch.get_num_threads(), cpu_kernels.MIN_SHARE
    torch.set_num_threads(threads)
    cpu_kernels.MIN_SHARE = 0  # every call split across the threads, however small
    try:
        with cpu_kernels.using_cpu_kernels("on"):
            yield
    finally:
        torch.set_num_threads(before)
        cpu_kernels.MIN_SHARE = share


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.abs().max()).item()


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "p"), [(81, 32), (5, 3), (15, 8), (17, 16), (16, 32), (65, 64), (33, 40), (100, 24)])
def test_the_fused_maps_equal_the_written_out_maps_within_fp32_rounding(n: int, p: int, threads: int) -> None:
    """P, G = (P + P^T) Zn and the backward pass against the maps written out in fp64, for sizes that fill whole
    vectors and that leave a tail; the kernel's error is of the size of PyTorch's own fp32 calls'."""
    gen = torch.Generator().manual_seed(n * 100 + p)
    z = torch.randn(6, n, p, generator=gen)
    z = z / z.pow(2).mean(-1, keepdim=True).sqrt() * 1.5  # on the sphere of radius sqrt(p), a gain of 1.5
    dG = torch.randn(6, n, p, generator=gen)
    beta = 1.0 / math.sqrt(p)
    with _kernel_on(threads):
        P, G = cpu_kernels.bisoftmax_maps(z, beta)
        dz = cpu_kernels.bisoftmax_maps_backward(z, P, dG, beta)
    P64, G64 = _maps(z.double(), beta)
    dz64 = _maps_backward(z.double(), P64, dG.double(), beta)
    P32, G32 = _maps(z, beta)
    dz32 = _maps_backward(z, P32, dG, beta)
    for ours, fp32, exact in ((P, P32, P64), (G, G32, G64), (dz, dz32, dz64)):
        assert _rel(ours, exact) <= max(4 * _rel(fp32, exact), 2e-6)
    torch.testing.assert_close(P.sum(-1), torch.ones(6, n), rtol=0, atol=2e-6)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "p"), [(81, 32), (5, 3), (17, 16), (65, 64), (100, 24)])
def test_the_fused_energy_equals_the_written_out_energy_within_fp32_rounding(n: int, p: int, threads: int) -> None:
    """sum_i logsumexp_j(beta Zn Zn^T)_ij per map against the written-out energy in fp64, for sizes that fill whole
    vectors and that leave a tail: on spheres (the trace's case: bounded scores, the upper triangle and no max) and
    far off them (scores past the bound: the max is taken)."""
    gen = torch.Generator().manual_seed(n * 100 + p + 7)
    beta = 1.0 / math.sqrt(p)
    for radius in (1.0, 20.0):
        z = torch.randn(2, 3, n, p, generator=gen)
        z = z / z.pow(2).mean(-1, keepdim=True).sqrt() * radius
        with _kernel_on(threads):
            ours = cpu_kernels.bisoftmax_energy(z, beta)
        z64 = z.double()
        exact = torch.logsumexp(beta * z64 @ z64.transpose(-1, -2), dim=-1).sum(-1)
        fp32 = torch.logsumexp(beta * z @ z.transpose(-1, -2), dim=-1).sum(-1)
        assert ours.shape == (2, 3)
        assert _rel(ours, exact) <= max(4 * _rel(fp32, exact), 2e-6)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "p"), [(81, 32), (5, 3), (17, 16), (65, 64), (100, 24)])
def test_the_attention_at_inference_equals_the_written_out_maps(n: int, p: int, threads: int) -> None:
    """(P + P^T) z without P written, against the maps written out in fp64: on spheres with a gain (bounded scores:
    each pair's exponential once, no max) and far off them (the softmax with its max), maps of both kinds in one
    call; the kernel's error is of the size of PyTorch's fp32 calls'."""
    gen = torch.Generator().manual_seed(n * 10 + p)
    z = torch.randn(4, n, p, generator=gen)
    z = z / z.pow(2).mean(-1, keepdim=True).sqrt() * torch.tensor([1.0, 1.5, 20.0, 1.0]).view(4, 1, 1)
    beta = 1.0 / math.sqrt(p)
    with _kernel_on(threads):
        G = cpu_kernels.bisoftmax_attention(z, beta)
    G64, G32 = _maps(z.double(), beta)[1], _maps(z, beta)[1]
    for k in range(4):
        assert _rel(G[k], G64[k]) <= max(4 * _rel(G32[k], G64[k]), 2e-6), k


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "heads", "p"), [(81, 4, 32), (5, 2, 3), (17, 3, 16), (65, 2, 40), (9, 1, 8)])
def test_the_head_projections_and_the_merged_attention_at_inference_equal_the_written_out_ones(
        n: int, heads: int, p: int, threads: int) -> None:
    """heads_rms: split_heads + rms_normalize of X W in one pass, head-major and contiguous, within fp32 rounding;
    bisoftmax_attention_heads: merge((P + P^T) (Zn g)) with the gain and the merge in the same call, against the
    maps written out in fp64 on the same gained projections (maps of several boards and heads in one call, split
    over the threads mid-board where the count is odd), with a gain far from 1 on one head so that its scores
    need the softmax's max."""
    gen = torch.Generator().manual_seed(n * 100 + heads * 10 + p)
    xw = torch.randn(3, n, heads * p, generator=gen) * 3.0
    g = torch.rand(p, generator=gen) + 0.5
    beta = 1.0 / math.sqrt(p)
    with _kernel_on(threads):
        zn = cpu_kernels.heads_rms(xw, heads, 1e-6)
        Gm = cpu_kernels.bisoftmax_attention_heads(zn, g, beta)
        G_far = cpu_kernels.bisoftmax_attention_heads(zn, g * 20.0, beta)
    ref = rms_normalize(split_heads(xw, heads), 1e-6)
    assert zn.shape == (3, heads, n, p) and zn.is_contiguous()
    torch.testing.assert_close(zn, ref, rtol=2e-6, atol=2e-6)
    for gain, got in ((g, Gm), (g * 20.0, G_far)):
        zg = (ref * gain).reshape(-1, n, p)
        G64 = merge_heads(_maps(zg.double(), beta)[1].view(3, heads, n, p))
        G32 = merge_heads(_maps(zg, beta)[1].view(3, heads, n, p))
        assert got.shape == (3, n, heads * p)
        assert _rel(got, G64) <= max(4 * _rel(G32, G64), 2e-6)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m", [512, 7, 16, 37])
def test_the_feedforward_rows_equal_the_normalised_relu_and_its_energy(m: int, threads: int) -> None:
    """ReLU(U) / rms(U) per row and the normalised ReLU energy per sample within fp32 rounding of fp64, whole
    vectors and tails, rows far from the unit sphere and rows near zero (where eps matters)."""
    gen = torch.Generator().manual_seed(m)
    u = torch.randn(3, 81, m, generator=gen) * 4
    u[1, :5] *= 1e-4
    eps = 1e-6
    with _kernel_on(threads):
        v = cpu_kernels.relu_rms(u, eps)
        e = cpu_kernels.relu_energy(u, eps)
    u64 = u.double()
    inv = torch.rsqrt(u64.square().mean(-1, keepdim=True) + eps)
    assert v.shape == u.shape and _rel(v, torch.relu(u64) * inv) <= 1e-6
    exact = -0.5 * (torch.relu(u64).square().sum(-1) * inv.squeeze(-1).square()).sum(-1)
    assert e.shape == (3,) and _rel(e, exact) <= 1e-6
    assert torch.equal(v >= 0, torch.ones_like(v, dtype=torch.bool)) and torch.equal(v > 0, u > 0)


@needs_kernel
def test_the_attention_operator_with_the_kernel_equals_the_written_out_attention_within_1e_5() -> None:
    """`fused.bisoftmax_grad` at the Sudoku configuration (81 tokens, d=128, 4 heads) with the maps in the kernel:
    output and gradients of X, W and the gains within 1e-5 of the written-out attention in fp64 (relative to each
    one's largest magnitude), as close as without the kernel."""
    gen = torch.Generator().manual_seed(5)
    heads, d = 4, 128
    X = torch.randn(8, 81, d, generator=gen)
    W = torch.randn(d, d, generator=gen) / math.sqrt(d)
    g = torch.rand(d // heads, generator=gen) * 3 + 0.5
    probe = torch.randn(8, 81, d, generator=gen)

    def run(dtype: torch.dtype, kernels: str) -> list[torch.Tensor]:
        leaves = [t.to(dtype).clone().requires_grad_() for t in (X, W, g)]
        with cpu_kernels.using_cpu_kernels(kernels):
            if dtype == torch.float64:
                Z = rms_normalize(split_heads(leaves[0] @ leaves[1], heads), 1e-6) * leaves[2]
                out = merge_heads(attn_energy_grad_heads(Z, "bisoftmax")) @ leaves[1].t()
            else:
                out = fused.bisoftmax_grad(*leaves, heads, 1e-6)
            (out * probe.to(dtype)).sum().backward()
        return [out.detach(), *(t.grad for t in leaves)]

    exact = run(torch.float64, "off")
    errors = {k: [_rel(a, b) for a, b in zip(run(torch.float32, k), exact)] for k in ("on", "off")}
    assert max(errors["on"]) <= 1e-5, errors
    assert max(errors["on"]) <= 4 * max(errors["off"]), errors


@needs_kernel
def test_the_operator_runs_the_kernel_only_where_it_may(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    maps = cpu_kernels.bisoftmax_maps
    monkeypatch.setattr(cpu_kernels, "bisoftmax_maps", lambda z, beta: calls.append(z.dtype) or maps(z, beta))
    X = torch.randn(2, 9, 16, requires_grad=True)
    W = torch.randn(16, 16, requires_grad=True)
    g = torch.ones(4, requires_grad=True)
    with cpu_kernels.using_cpu_kernels("on"):
        fused.bisoftmax_grad(X, W, g, 4, 1e-6).sum().backward()
        assert calls == [torch.float32]
        fused.bisoftmax_grad(X.double(), W.double(), g.double(), 4, 1e-6).sum().backward()  # fp64: PyTorch's calls
        assert calls == [torch.float32]
        assert not cpu_kernels.usable(torch.randn(2, cpu_kernels.MAX_TOKENS + 1, 4))
        traced = torch.jit.trace(lambda z: torch.tensor(cpu_kernels.usable(z)), torch.randn(2, 9, 4), check_trace=False)
        assert not traced(torch.randn(2, 9, 4)).item()
    with cpu_kernels.using_cpu_kernels("off"):
        fused.bisoftmax_grad(X, W, g, 4, 1e-6).sum().backward()
        assert calls == [torch.float32]
        assert cpu_kernels.status() == "off"


def _fresh_process(code: str, *flags: str, **env: str) -> subprocess.CompletedProcess:
    """`code` run by a new Python with `env` added to the environment (the module reads its settings at import)."""
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


@pytest.mark.slow
def test_without_a_compiler_the_operator_runs_on_pytorchs_calls_and_says_why() -> None:
    """A fresh process whose C compiler does not exist: status names it, and the attention operator still trains."""
    code = (
        "import torch\n"
        "from hyperset.accel import cpu_kernels, fused\n"
        "with cpu_kernels.using_cpu_kernels('on'):\n"
        "    X = torch.randn(2, 9, 16, requires_grad=True)\n"
        "    fused.bisoftmax_grad(X, torch.randn(16, 16), torch.ones(4), 4, 1e-6).sum().backward()\n"
        "    assert X.grad is not None and torch.isfinite(X.grad).all()\n"
        "    print(cpu_kernels.status())\n"
    )
    done = _fresh_process(code, CC="no-such-compiler-here", HYPERSET_CACHE_DIR="/nonexistent/x")
    assert done.returncode == 0, done.stderr
    status = done.stdout.strip().splitlines()[-1]
    if "AVX-512" in status:  # this CPU cannot run the kernel at all
        assert status == "off (needs an x86 CPU with AVX2 or AVX-512)"
    else:
        assert status == "off (no C compiler (no-such-compiler-here) on the PATH)"


@needs_kernel
def test_a_cache_folder_that_anyone_can_write_to_is_not_loaded_from(tmp_path) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels").chmod(0o777)
    code = ("from hyperset.accel import cpu_kernels\n"
            "with cpu_kernels.using_cpu_kernels('on'):\n"
            "    print(cpu_kernels.status())\n")
    done = _fresh_process(code, HYPERSET_CACHE_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    why = f"{tmp_path / 'kernels'} is not this user's own (another owner, or writable by all): not loading from it"
    assert done.stdout.strip() == f"off ({why})"
    assert list((tmp_path / "kernels").iterdir()) == []


@pytest.mark.slow
def test_a_bad_environment_value_warns_and_uses_auto() -> None:
    code = "from hyperset.accel import cpu_kernels; print(cpu_kernels._wanted == cpu_kernels._resolve('auto'))"
    done = _fresh_process(code, "-W", "always", HYPERSET_CPU_KERNELS="sometimes")
    assert done.returncode == 0 and done.stdout.strip() == "True"
    assert "HYPERSET_CPU_KERNELS='sometimes' is not one of auto, on, off: using auto" in done.stderr
    with pytest.raises(ValueError, match="expected one of auto, on, off"):
        with cpu_kernels.using_cpu_kernels("always"):
            pass


@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_auto_takes_the_kernel_where_it_was_measured_faster(monkeypatch: pytest.MonkeyPatch, isa: str) -> None:
    """auto: on with AVX-512 from a known vendor, and with AVX2 on CPUs not made by Intel; an unknown vendor keeps
    PyTorch's calls."""
    monkeypatch.setattr(cpu_kernels, "isa", lambda: isa)
    for vendor, wanted in (("AuthenticAMD", True), ("GenuineIntel", isa == "avx512"), (None, False)):
        monkeypatch.setattr(cpu_kernels.device, "cpu_vendor", lambda v=vendor: v)
        assert cpu_kernels._resolve("auto") == wanted
        assert cpu_kernels._resolve("on") and not cpu_kernels._resolve("off")
    monkeypatch.setattr(cpu_kernels, "isa", lambda: None)
    assert not cpu_kernels._resolve("on")


def test_the_instruction_set_follows_pytorchs_reading_of_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_kernels.platform, "machine", lambda: "x86_64")
    for capability, isa in (("AVX512", "avx512"), ("AMX", "avx512"), ("AVX2", "avx2"), ("DEFAULT", None)):
        monkeypatch.setattr(cpu_kernels.torch.backends.cpu, "get_cpu_capability", lambda c=capability: c)
        assert cpu_kernels.isa() == isa
    monkeypatch.setattr(cpu_kernels.platform, "machine", lambda: "aarch64")
    assert cpu_kernels.isa() is None


@needs_kernel
def test_inference_takes_the_kernel_and_gives_the_same_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """At inference (no gradient through Z) the bi-softmax attention (from the head-major projections, the gain and
    the merge in the same call) and the trace's attention energy run in the kernel without writing P, the head
    projections go on their spheres in one pass, and the feedforward's normalised ReLU and its energy in row passes:
    the model's logits and energies within 1e-5 of PyTorch's calls; with a gradient to take through Z it steps
    aside."""
    from hyperset.config import preset_config
    from hyperset.energies import attn_energy_grad_heads
    from hyperset.models import HyperSETModel

    calls, energy_calls, row_calls, rms_calls = [], [], [], []
    attention, energy = cpu_kernels.bisoftmax_attention, cpu_kernels.bisoftmax_energy
    relu_rms, relu_energy = cpu_kernels.relu_rms, cpu_kernels.relu_energy
    heads, rms = cpu_kernels.bisoftmax_attention_heads, cpu_kernels.heads_rms
    monkeypatch.setattr(cpu_kernels, "bisoftmax_attention", lambda z, beta: calls.append(1) or attention(z, beta))
    monkeypatch.setattr(cpu_kernels, "bisoftmax_attention_heads",
                        lambda z, g, beta: calls.append(1) or heads(z, g, beta))
    monkeypatch.setattr(cpu_kernels, "heads_rms", lambda xw, h, eps: rms_calls.append(1) or rms(xw, h, eps))
    monkeypatch.setattr(cpu_kernels, "bisoftmax_energy", lambda z, beta: energy_calls.append(1) or energy(z, beta))
    monkeypatch.setattr(cpu_kernels, "relu_rms", lambda u, eps: row_calls.append("step") or relu_rms(u, eps))
    monkeypatch.setattr(cpu_kernels, "relu_energy", lambda u, eps: row_calls.append("energy") or relu_energy(u, eps))
    torch.manual_seed(0)
    model = HyperSETModel(preset_config("sudoku-cpu")).eval()
    x = torch.randint(0, 10, (3, 81))
    with torch.no_grad():
        with cpu_kernels.using_cpu_kernels("off"):
            ref = model.run(x, trace=True)
        assert not calls and not energy_calls and not row_calls and not rms_calls
        with cpu_kernels.using_cpu_kernels("on"), cpu_gemm.using_cpu_gemm("off"):  # its products: test_cpu_gemm
            out = model.run(x, trace=True)
    assert len(calls) == len(energy_calls) == model.cfg.iters
    assert len(rms_calls) == model.cfg.iters + 1  # each energy's, handed to the next update; the first update's
    assert row_calls == ["step", "energy"] * model.cfg.iters  # the update's normalised ReLU, then the energy
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
    for name, values in ref.trace.energy.items():
        torch.testing.assert_close(torch.stack(out.trace.energy[name]), torch.stack(values), rtol=1e-5, atol=1e-5)
    z = torch.randn(2, 4, 9, 8, requires_grad=True)
    with cpu_kernels.using_cpu_kernels("on"):
        attn_energy_grad_heads(z).sum().backward()
    assert len(calls) == model.cfg.iters and z.grad is not None


def test_a_call_is_split_across_threads_only_where_each_share_is_worth_a_hand_off() -> None:
    """One board's product by a 128 x 128 weight stays on one thread; a batch's, or one board's feedforward step,
    goes to both; never more threads than items, and one thread where PyTorch has one."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert cpu_kernels.threads_for(81, 128 * 128) == 1
        assert cpu_kernels.threads_for(128 * 81, 128 * 128) == 2
        assert cpu_kernels.threads_for(81, 2 * 128 * 512) == 2
        assert cpu_kernels.threads_for(1, 10**9) == 1
        torch.set_num_threads(1)
        assert cpu_kernels.threads_for(128 * 81, 128 * 128) == 1
    finally:
        torch.set_num_threads(before)
