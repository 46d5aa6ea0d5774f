"""Products of a state by a weight and the fused feedforward in C (hyperset.accel.cpu_gemm): the written-out values
within fp32 rounding, for shapes that fill whole tiles and that leave a tail, on one thread and on two, with each
build this CPU runs (AVX-512 and AVX2, or AVX2); the packed weights follow a weight changed in place; a model's pass
gives the same logits and energies with the kernel as without it; and the kernel runs only where it may."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from hyperset.accel import cpu_gemm, cpu_kernels, fused, policy, rows
from hyperset.config import ModelConfig
from hyperset.models import HyperSETModel

with cpu_kernels.using_cpu_kernels("on"), cpu_gemm.using_cpu_gemm("on"):
    HERE = cpu_gemm.status() if cpu_kernels.status() == "on" else cpu_kernels.status()
needs_kernel = pytest.mark.skipif(HERE != "on", reason=f"the kernel cannot run here: {HERE}")
# every build this CPU runs: its own, and the AVX2 one beside the AVX-512 one
BUILDS = ["own", "avx2"] if HERE == "on" and cpu_kernels.isa() == "avx512" else ["own"]


@pytest.fixture(autouse=True, params=BUILDS)
def build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test with each build of the kernel (the packed weights are laid out alike in both)."""
    if request.param != "own":
        handle = cpu_gemm._build(request.param)
        monkeypatch.setattr(cpu_gemm, "_library", lambda: handle)
    return request.param


@contextlib.contextmanager
def _kernel(threads: int, on: str = "on") -> Iterator[None]:
    before, share = torch.get_num_threads(), cpu_kernels.MIN_SHARE
    torch.set_num_threads(threads)
    cpu_kernels.MIN_SHARE = 0  # every call split across the threads, however small
    try:
        with cpu_kernels.using_cpu_kernels("on"), cpu_gemm.using_cpu_gemm(on), torch.inference_mode():
            yield
    finally:
        torch.set_num_threads(before)
        cpu_kernels.MIN_SHARE = share


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("rows", "k", "n"), [(1, 1, 16), (5, 7, 32), (13, 128, 128), (81, 33, 48), (972, 128, 512)])
def test_the_product_equals_the_written_out_product_within_fp32_rounding(rows: int, k: int, n: int,
                                                                          threads: int) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + k + n)
    a, b = torch.randn(rows, k, generator=gen), torch.randn(k, n, generator=gen)
    with _kernel(threads):
        out = cpu_gemm.matmul(a.view(1, rows, k), b)
        out_t = cpu_gemm.matmul(a, b.t().contiguous().t())  # a transposed view of a weight
    exact = a.double() @ b.double()
    assert out.shape == (1, rows, n) and _rel(out[0], exact) <= max(4 * _rel(a @ b, exact), 1e-6)
    assert torch.equal(out_t, out[0])


@needs_kernel
def test_the_product_declines_what_it_cannot_run() -> None:
    a = torch.randn(4, 8)
    with _kernel(1):
        assert cpu_gemm.matmul(a, torch.randn(8, 12)) is None  # columns not a multiple of 16
        assert cpu_gemm.matmul(a.double(), torch.randn(8, 16).double()) is None
        assert cpu_gemm.matmul(a, torch.randn(9, 16)) is None
    assert cpu_gemm.matmul(a, torch.randn(8, 16)) is None  # gradients on


def _ff_update_written(y: torch.Tensor, gamma: torch.Tensor, D: torch.Tensor, g: torch.Tensor,
                       eps: float) -> torch.Tensor:
    """y + gamma ReLU(RMSNorm_g(y D)) D^T, as the paper writes the feedforward step (eq. 11)."""
    U = y @ D
    U = U / torch.sqrt(U.square().mean(-1, keepdim=True) + eps) * g
    return y + gamma * (torch.relu(U) @ D.t())


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("boards", "n", "d", "m"), [(3, 81, 128, 512), (2, 5, 16, 32), (4, 7, 48, 64)])
def test_the_feedforward_step_equals_the_written_out_step(boards: int, n: int, d: int, m: int, threads: int) -> None:
    """From the folded weights (gains of both signs), with step sizes that are half of a wider tensor (rows apart,
    as the step-size network makes them) and with contiguous ones."""
    gen = torch.Generator().manual_seed(boards * n + d + m)
    y = torch.randn(boards, n, d, generator=gen)
    D = torch.randn(d, m, generator=gen) / d ** 0.5
    g = torch.randn(m, generator=gen)
    both = torch.rand(boards, n, 2 * d, generator=gen)
    gamma = both.chunk(2, dim=-1)[1]
    exact = _ff_update_written(y.double(), gamma.double(), D.double(), g.double(), 1e-6)
    fp32 = _ff_update_written(y, gamma, D, g, 1e-6)
    with _kernel(threads):
        Ds, Dg = fused.fold_ff(D, g)
        out = cpu_gemm.ff_update(y, gamma, Ds, Dg, 1e-6)
        out_c = cpu_gemm.ff_update(y, gamma.contiguous(), Ds, Dg, 1e-6)
    assert not gamma.is_contiguous() and torch.equal(out, out_c)
    assert _rel(out - y, exact - y.double()) <= max(4 * _rel(fp32 - y, exact - y.double()), 2e-6)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("boards", "n", "d", "m"), [(3, 81, 128, 512), (2, 5, 16, 32), (5, 13, 32, 16)])
def test_the_feedforward_energy_from_x_equals_the_written_out_energy(boards: int, n: int, d: int, m: int,
                                                                     threads: int) -> None:
    gen = torch.Generator().manual_seed(7 * n + d + m)
    x = torch.randn(boards, n, d, generator=gen)
    D = torch.randn(d, m, generator=gen)
    with _kernel(threads):
        e = cpu_gemm.relu_energy(x, D, 1e-6)
    u = x.double() @ D.double()
    exact = -0.5 * (torch.relu(u).square().sum(-1) / (u.square().mean(-1) + 1e-6)).sum(-1)
    assert e.shape == (boards,) and _rel(e, exact) <= 2e-6


@needs_kernel
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("boards", "n", "d", "width", "heads"),
                         [(3, 81, 128, 128, 4), (2, 5, 16, 48, 4), (4, 13, 32, 32, 1), (2, 30, 24, 80, 5)])
def test_the_head_projections_equal_the_written_out_ones(boards: int, n: int, d: int, width: int, heads: int,
                                                          threads: int) -> None:
    """X W put on the heads' spheres, head-major, with heads whose width fills whole vectors and ones that leave a
    tail (12 and 16 values); rows of one board split across the threads' shares and the kernel's blocks."""
    gen = torch.Generator().manual_seed(n * d + width + heads)
    x, w = torch.randn(boards, n, d, generator=gen), torch.randn(d, width, generator=gen)
    with _kernel(threads):
        z = cpu_gemm.project_heads(x, w, heads, 1e-6)
        assert cpu_gemm.project_heads(x, w, width + 1, 1e-6) is None  # heads that do not divide the width
    u = (x.double() @ w.double()).view(boards, n, heads, -1).transpose(1, 2)
    exact = u / torch.sqrt(u.square().mean(-1, keepdim=True) + 1e-6)
    assert z.shape == (boards, heads, n, width // heads) and _rel(z, exact) <= 2e-6


@needs_kernel
def test_a_weight_changed_in_place_is_packed_again() -> None:
    a = torch.randn(6, 16)
    w = torch.nn.Parameter(torch.randn(16, 32))
    with _kernel(1):
        first = cpu_gemm.matmul(a, w)
        second = cpu_gemm.matmul(a, w.t().t())  # another view of the same weight: its panels reused
    with torch.no_grad():
        w.mul_(2.0)
    with _kernel(1):
        third = cpu_gemm.matmul(a, w)
    assert torch.equal(first, second)
    torch.testing.assert_close(third, 2 * first, rtol=1e-6, atol=1e-5)


def _model(dim: int, ff_hidden: int, heads: int) -> HyperSETModel:
    torch.manual_seed(dim + ff_hidden)
    cfg = ModelConfig(task="sudoku", dim=dim, heads=heads, ff_hidden=ff_hidden, iters=4, step_init=0.1)
    return HyperSETModel(cfg).eval()


@needs_kernel
@pytest.mark.parametrize(("dim", "ff_hidden", "heads"), [(64, 128, 4), (48, 96, 3), (40, 72, 4)])
def test_a_pass_with_the_kernel_gives_the_passs_logits_and_energies_without_it(dim: int, ff_hidden: int,
                                                                               heads: int) -> None:
    """Whole traced passes (slices of rows as on a CPU), the widths multiples of 16 or not (then the kernel declines
    and the library's calls run): the same logits and energies within fp32 rounding, the same answers."""
    model = _model(dim, ff_hidden, heads)
    boards = torch.randint(0, 10, (30, 81), generator=torch.Generator().manual_seed(3))
    runs, calls = {}, {}
    for on in ("on", "off"):
        with _kernel(1, on), profile(activities=[ProfilerActivity.CPU]) as prof:
            runs[on] = model.run(boards, iters=8, trace=True)
        calls[on] = {e.key for e in prof.key_averages() if e.key.startswith("hyperset::")}
    fits = dim % 16 == 0 and ff_hidden % 16 == 0
    fused_ops = {"hyperset::ff_update", "hyperset::relu_energy_x", "hyperset::step_product", "hyperset::project_heads"}
    assert (fused_ops <= calls["on"]) is fits
    assert ("hyperset::heads_rms" in calls["on"]) is not fits  # the projections' own pass only where they do not fit
    assert not calls["off"] & {"hyperset::ff_update", "hyperset::gemm", "hyperset::project_heads"}
    on, off = runs["on"], runs["off"]
    torch.testing.assert_close(on.logits, off.logits, rtol=1e-4, atol=1e-4)
    for key in ("attn", "ff"):
        torch.testing.assert_close(on.trace.stacked()[f"energy_{key}"], off.trace.stacked()[f"energy_{key}"],
                                   rtol=1e-5, atol=1e-3)


@needs_kernel
def test_with_the_kernel_a_slice_of_rows_is_sized_by_the_state_alone() -> None:
    """The update's kernels write nothing wider than the state where they run the whole update, so a slice holds
    as many rows as fit in SLICE_BYTES at the state's width; elsewhere at the widest intermediate as before."""
    x = torch.randn(2, 81, 64)
    fits, other = _model(64, 128, 4).cfg, _model(64, 72, 4).cfg
    with cpu_kernels.using_cpu_kernels("on"), torch.no_grad():
        for on, cfg, state_only in (("on", fits, True), ("on", other, False), ("off", fits, False)):
            with cpu_gemm.using_cpu_gemm(on):
                expected = rows.cache_rows(cfg, state_only=state_only)
                assert policy(x).slice_rows(cfg, 10 * expected, x.device) == expected, (on, cfg.ff_hidden)
    assert rows.cache_rows(fits, state_only=True) == rows.SLICE_BYTES // (4 * 81 * 64)
    assert rows.cache_rows(fits) == rows.SLICE_BYTES // (4 * 81 * max(64, 128, 4 * 81))


@needs_kernel
def test_the_policy_chooses_the_kernel_only_at_inference_with_the_maps_kernel() -> None:
    x = torch.randn(2, 9, 16)
    with cpu_kernels.using_cpu_kernels("on"), cpu_gemm.using_cpu_gemm("on"):
        with torch.no_grad():
            assert policy(x).gemm and policy(x).relu_update is not None
            assert not policy(x.double()).gemm
        assert not policy(x).gemm  # gradients on
        with torch.no_grad(), fused.written_out():
            assert not policy(x).gemm
    with cpu_kernels.using_cpu_kernels("off"), cpu_gemm.using_cpu_gemm("on"), torch.no_grad():
        assert not policy(x).gemm
    with cpu_kernels.using_cpu_kernels("on"), cpu_gemm.using_cpu_gemm("off"), torch.no_grad():
        assert not policy(x).gemm and policy(x).relu_update is None


def test_auto_takes_the_kernel_where_it_was_measured_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = (("avx2", "AuthenticAMD", True), ("avx2", "GenuineIntel", False), ("avx2", None, False),
             ("avx512", "AuthenticAMD", False), ("avx512", "GenuineIntel", True), ("avx512", None, False),
             (None, "AuthenticAMD", False), (None, "GenuineIntel", False))
    for isa, vendor, expected in cases:
        monkeypatch.setattr(cpu_kernels, "isa", lambda isa=isa: isa)
        monkeypatch.setattr(cpu_gemm.device, "cpu_vendor", lambda vendor=vendor: vendor)
        assert cpu_gemm._resolve("auto") is expected, (isa, vendor)
        assert cpu_gemm._resolve("on") is (isa is not None)
        assert cpu_gemm._resolve("off") is False
    with pytest.raises(ValueError, match="expected one of auto, on, off"):
        cpu_gemm._resolve("always")
