"""Specification of hyperset.vision.metrics against hand-computed values, independent numpy code, scikit-image and
torchmetrics; LPIPS and FID through the `metrics` extra, offline."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hyperset.vision import metrics as vm


@pytest.fixture(autouse=True)
def _no_weight_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in vm.ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)


def _images(n: int, size: int, seed: int, channels: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, channels, size, size, generator=gen, dtype=torch.float64)


def np_ssim_cs(x: np.ndarray, y: np.ndarray, data_range: float = 1.0) -> tuple[float, float]:
    """Mean SSIM and mean cs of one (C, H, W) pair, window by window, with an 11x11 Gaussian (sigma 1.5)."""
    g = np.exp(-((np.arange(11) - 5.0) ** 2) / (2 * 1.5**2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    ssims, css = [], []
    for c in range(x.shape[0]):
        for i in range(x.shape[1] - 10):
            for j in range(x.shape[2] - 10):
                px, py = x[c, i:i + 11, j:j + 11], y[c, i:i + 11, j:j + 11]
                mx, my = (w * px).sum(), (w * py).sum()
                vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
                cov = (w * (px - mx) * (py - my)).sum()
                cs = (2 * cov + c2) / (vx + vy + c2)
                ssims.append((2 * mx * my + c1) / (mx**2 + my**2 + c1) * cs)
                css.append(cs)
    return float(np.mean(ssims)), float(np.mean(css))


# ----------------------------------------------------------------------------------------------------
# PSNR


def test_psnr_of_a_constant_offset_is_exact() -> None:
    x = _images(2, 8, 0) * 0.8
    assert torch.allclose(vm.psnr(x, x + 0.1), torch.full((2,), 20.0, dtype=torch.float64))  # MSE 0.01
    y = torch.full((1, 3, 4, 4), 100.0)
    assert vm.psnr(y, y + 5, data_range=255).item() == pytest.approx(10 * math.log10(255**2 / 25), abs=1e-4)


def test_psnr_of_identical_images_is_inf_unless_clamped() -> None:
    x = _images(3, 8, 1)
    assert torch.isinf(vm.psnr(x, x)).all()
    assert vm.psnr(x, x, max_db=100.0).tolist() == [100.0] * 3
    assert math.isinf(vm.mean_score(vm.psnr(x, x)))


# ----------------------------------------------------------------------------------------------------
# SSIM


def test_ssim_of_identical_images_is_one_and_ssim_is_symmetric() -> None:
    x, y = _images(2, 24, 2), _images(2, 24, 3)
    assert torch.allclose(vm.ssim(x, x), torch.ones(2, dtype=torch.float64))
    assert torch.allclose(vm.ssim(x, y), vm.ssim(y, x))
    assert (vm.ssim(x, y) < 0.2).all()


def test_ssim_of_two_constant_images_is_the_luminance_term() -> None:
    a, b = 0.3, 0.6
    c1 = 0.01**2
    got = vm.ssim(torch.full((1, 1, 16, 16), a), torch.full((1, 1, 16, 16), b)).item()
    assert got == pytest.approx((2 * a * b + c1) / (a * a + b * b + c1), rel=1e-5)


def test_ssim_of_a_shifted_image_matches_a_direct_numpy_computation() -> None:
    x = _images(2, 20, 4) * 0.7
    y = (x + 0.15 + 0.05 * _images(2, 20, 5)).clamp(0, 1)
    got = vm.ssim(x, y)
    for i in range(2):
        assert got[i].item() == pytest.approx(np_ssim_cs(x[i].numpy(), y[i].numpy())[0], abs=1e-9)
    assert vm.ssim(x.float(), y.float())[0].item() == pytest.approx(got[0].item(), abs=1e-4)


def test_ssim_matches_scikit_image() -> None:
    import skimage.metrics as skm  # the [test] extra: this cross-check must run, not skip
    x = _images(1, 32, 6)
    y = (x * 0.8 + 0.2 * _images(1, 32, 7)).clamp(0, 1)
    ref = skm.structural_similarity(x[0].numpy(), y[0].numpy(), channel_axis=0, data_range=1.0,
                                    gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
    assert vm.ssim(x, y).item() == pytest.approx(ref, abs=1e-6)


def test_psnr_and_ssim_match_scikit_image_on_a_batch() -> None:
    import skimage.metrics as skm

    x = _images(3, 24, 16)
    y = (x + 0.1 * _images(3, 24, 17) - 0.05).clamp(0, 1)
    for i in range(3):
        a, b = x[i].numpy(), y[i].numpy()
        assert vm.psnr(x, y)[i].item() == pytest.approx(skm.peak_signal_noise_ratio(a, b, data_range=1.0), abs=1e-9)
        ref = skm.structural_similarity(a, b, channel_axis=0, data_range=1.0, gaussian_weights=True, sigma=1.5,
                                        use_sample_covariance=False)
        assert vm.ssim(x, y)[i].item() == pytest.approx(ref, abs=1e-6)


def test_psnr_and_reflect_padded_ssim_and_ms_ssim_match_torchmetrics() -> None:
    import torchmetrics.functional.image as tm  # the [test] extra: this cross-check must run, not skip

    x = _images(2, 176, 14).float()
    y = (0.7 * x + 0.3 * _images(2, 176, 15).float()).clamp(0, 1)
    ref_psnr = tm.peak_signal_noise_ratio(x, y, data_range=1.0, reduction="none", dim=(1, 2, 3))
    assert torch.allclose(vm.psnr(x, y), ref_psnr, atol=1e-4)
    x = _images(2, 176, 14).float()
    y = (0.7 * x + 0.3 * _images(2, 176, 15).float()).clamp(0, 1)
    ref = tm.structural_similarity_index_measure(x, y, data_range=1.0, reduction="none")
    assert torch.allclose(vm.ssim(x, y, padding="reflect"), ref, atol=1e-5)
    ref_ms = tm.multiscale_structural_similarity_index_measure(x, y, data_range=1.0, reduction="none")
    assert torch.allclose(vm.ms_ssim(x, y, padding="reflect"), ref_ms, atol=1e-5)


def test_ssim_rejects_images_smaller_than_the_window() -> None:
    with pytest.raises(ValueError, match="window 11"):
        vm.ssim(torch.rand(1, 3, 8, 8), torch.rand(1, 3, 8, 8))


# ----------------------------------------------------------------------------------------------------
# MS-SSIM


def test_ms_ssim_config_keeps_the_standard_recipe_when_it_fits_and_reports_reductions() -> None:
    full = vm.ms_ssim_config(256, 256)
    assert (full.scales, full.win_size, full.weights, full.reduced) == (5, 11, vm.MS_SSIM_WEIGHTS, False)
    assert vm.ms_ssim_config(176, 200).scales == 5 and vm.ms_ssim_config(175, 200).scales == 4
    small = vm.ms_ssim_config(32, 32)
    assert small.scales == 2 and small.win_size == 11 and small.reduced
    assert small.weights == pytest.approx((0.0448 / 0.3304, 0.2856 / 0.3304))
    assert "2 scales" in small.describe() and "reduced" in small.describe()
    tiny = vm.ms_ssim_config(8, 10)
    assert (tiny.scales, tiny.win_size, tiny.weights) == (1, 7, (1.0,))


def test_ms_ssim_on_32px_combines_full_scale_cs_and_half_scale_ssim() -> None:
    x = _images(1, 32, 8)
    y = (0.7 * x + 0.3 * _images(1, 32, 9)).clamp(0, 1)
    _, cs1 = np_ssim_cs(x[0].numpy(), y[0].numpy())
    ssim2, _ = np_ssim_cs(F.avg_pool2d(x, 2)[0].numpy(), F.avg_pool2d(y, 2)[0].numpy())
    w1, w2 = vm.ms_ssim_config(32, 32).weights
    assert vm.ms_ssim(x, y).item() == pytest.approx(cs1**w1 * ssim2**w2, abs=1e-9)


def test_ms_ssim_is_one_for_identical_images_and_symmetric_at_full_size() -> None:
    x, y = _images(1, 176, 10).float(), _images(1, 176, 11).float()
    assert vm.ms_ssim(x, x).item() == pytest.approx(1.0, abs=1e-5)
    assert vm.ms_ssim(x, y).item() == pytest.approx(vm.ms_ssim(y, x).item(), abs=1e-6)
    assert 0.0 <= vm.ms_ssim(x, y).item() < 0.5


# ----------------------------------------------------------------------------------------------------
# Fréchet distance and FID


def test_frechet_distance_of_identical_statistics_is_zero() -> None:
    a = torch.randn(50, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mu, sigma = vm.feature_statistics(a)
    assert abs(vm.frechet_distance(mu, sigma, mu, sigma)) < 1e-8


def test_frechet_distance_of_diagonal_gaussians_has_the_closed_form() -> None:
    mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
    v1, v2 = np.array([1.0, 4.0, 0.25]), np.array([9.0, 1.0, 0.25])
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(v1) - np.sqrt(v2)) ** 2)  # 5 + 4 + 1 + 0
    assert vm.frechet_distance(mu1, np.diag(v1), mu2, np.diag(v2)) == pytest.approx(expected)
    assert expected == pytest.approx(10.0)


def test_frechet_distance_with_full_covariances_matches_numpy() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
    s1, s2 = a @ a.T + 0.1 * np.eye(6), b @ b.T
    mu1, mu2 = rng.normal(size=6), rng.normal(size=6)
    tr_sqrt = np.sqrt(np.linalg.eigvals(s1 @ s2).real.clip(min=0)).sum()
    expected = np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * tr_sqrt
    assert vm.frechet_distance(mu1, s1, mu2, s2) == pytest.approx(expected, rel=1e-9)


def test_streaming_fid_with_a_pluggable_extractor_equals_the_batch_statistics() -> None:
    def extractor(images: torch.Tensor) -> torch.Tensor:
        return images.mean(dim=(2, 3))  # (N, 3) channel means

    real, fake = _images(40, 4, 12), _images(30, 4, 13) * 0.5
    fid = vm.FID(extractor)
    for chunk in real.split(7):
        fid.update(chunk, real=True)
    fid.update(fake, real=False)
    stats_real, stats_fake = vm.feature_statistics(extractor(real)), vm.feature_statistics(extractor(fake))
    expected = vm.frechet_distance(*stats_real, *stats_fake)
    assert fid.compute() == pytest.approx(expected, rel=1e-9) and expected > 0.05
    value, reason = vm.compute_fid([real], [real], feature_extractor=extractor)
    assert value == pytest.approx(0.0, abs=1e-9) and reason == ""


# ----------------------------------------------------------------------------------------------------
# Learned metrics: torchmetrics' LPIPS and FID under the `metrics` extra, offline


def _metrics_extra_works() -> str:
    """"" when torchmetrics, torchvision and torch-fidelity import here, else why not."""
    try:
        import torch_fidelity  # noqa: F401
        import torchmetrics.image.fid  # noqa: F401
        import torchmetrics.image.lpip  # noqa: F401
        import torchvision  # noqa: F401
    except Exception as e:  # missing, or a torchvision built for another torch
        return f"the 'metrics' extra does not import here ({type(e).__name__}: {str(e).splitlines()[0]})"
    return ""


needs_extra = pytest.mark.skipif(bool(_metrics_extra_works()), reason=_metrics_extra_works() or "ok")


def test_without_the_metrics_extra_lpips_and_fid_are_null_with_the_install_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("torchvision", "torch_fidelity") else find_spec(name, *a))
    x = torch.rand(2, 3, 32, 32)
    value, reason = vm.compute_lpips(x, x)
    assert value is None and reason.startswith("LPIPS unavailable") and "pip install 'hyperset[metrics]'" in reason
    fid, reason = vm.compute_fid([x], [x])
    assert fid is None and reason.startswith("FID unavailable") and "hyperset[metrics]" in reason
    assert "torch_fidelity" in reason


def test_without_weights_lpips_and_fid_are_null_and_say_which_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import hyperset.extras

    monkeypatch.setattr(hyperset.extras, "require", lambda *a, **k: None)  # as if the extra were installed
    monkeypatch.setattr(vm, "hub_checkpoints", lambda: tmp_path / "hub" / "checkpoints")
    x = torch.rand(2, 3, 32, 32)
    value, reason = vm.compute_lpips(x, x)
    assert value is None and "alexnet-owt-7be5be79.pth" in reason and "--lpips-weights" in reason
    assert "HYPERSET_LPIPS_WEIGHTS" in reason and "Nothing is downloaded" in reason
    fid, reason = vm.compute_fid([x], [x])
    assert fid is None and "weights-inception-2015-12-05-6726825d.pth" in reason and "--fid-weights" in reason
    assert "does not exist" in vm.metric_unavailable("fid", tmp_path / "missing.pth")
    monkeypatch.setenv("HYPERSET_FID_WEIGHTS", str(tmp_path / "env.pth"))
    assert "env.pth does not exist" in vm.metric_unavailable("fid")
    assert vm.metric_unavailable("psnr") == "" and vm.metric_unavailable("ms_ssim") == ""
    with pytest.raises(ValueError):
        vm.metric_unavailable("is")


@needs_extra
def test_lpips_runs_torchmetrics_on_a_given_backbone_file_without_downloading(tmp_path: Path) -> None:
    import torchvision

    torch.manual_seed(0)
    path = tmp_path / "my-alexnet.pth"  # random weights of the right shape: this checks the loading, not values
    torch.save(torchvision.models.alexnet(weights=None).state_dict(), path)
    hub = torch.hub.get_dir()
    x, y = torch.rand(3, 3, 32, 32), torch.rand(3, 3, 32, 32)
    d, reason = vm.compute_lpips(x, y, weights_path=path, batch=2)
    assert reason == "" and d is not None and d.shape == (3,) and (d > 0).all()
    same, _ = vm.compute_lpips(x, x, weights_path=path)
    assert same is not None and torch.allclose(same, torch.zeros(3), atol=1e-6)
    assert torch.hub.get_dir() == hub  # the temporary hub folder is gone
    (tmp_path / "junk.pth").write_bytes(b"not weights")
    value, reason = vm.compute_lpips(x, y, weights_path=tmp_path / "junk.pth")
    assert value is None and "could not be loaded as the alex backbone" in reason


@needs_extra
def test_fid_runs_torchmetrics_on_a_given_inception_file(tmp_path: Path) -> None:
    import torchvision

    torch.manual_seed(0)
    path = tmp_path / "inception.pth"  # random weights in torch-fidelity's layout (1008 classes)
    model = torchvision.models.inception_v3(weights=None, aux_logits=False, init_weights=False, num_classes=1008)
    torch.save(model.state_dict(), path)
    real, fake = _images(4, 32, 1).float(), _images(4, 32, 2).float()
    value, reason = vm.compute_fid([real[:2], real[2:]], [fake], weights_path=path)
    assert reason == "" and value is not None and value > 0
    same, _ = vm.compute_fid([real], [real], weights_path=path)
    assert same == pytest.approx(0.0, abs=1e-3)


def _cached(name: str) -> Path:
    return vm.hub_checkpoints() / name


@needs_extra
@pytest.mark.skipif(not _cached(vm.LPIPS_BACKBONE_FILES["alex"]).is_file(),
                    reason="needs torchvision's AlexNet weights in the torch hub cache (never downloaded by tests)")
def test_lpips_with_the_real_backbone() -> None:
    x = _images(2, 64, 5).float()
    y = (x + 0.2 * _images(2, 64, 6).float()).clamp(0, 1)
    d, reason = vm.compute_lpips(x, y)
    same, _ = vm.compute_lpips(x, x)
    assert reason == "" and d is not None and same is not None
    assert (d > same).all() and torch.allclose(same, torch.zeros(2), atol=1e-5)


@needs_extra
@pytest.mark.skipif(not _cached(vm.FID_WEIGHTS_FILE).is_file(),
                    reason="needs torch-fidelity's Inception weights in the torch hub cache (never downloaded)")
def test_fid_with_the_real_inception() -> None:
    real, fake = _images(8, 32, 7).float(), (_images(8, 32, 8).float() * 0.3)
    value, reason = vm.compute_fid([real], [fake])
    same, _ = vm.compute_fid([real], [real])
    assert reason == "" and value is not None and same is not None and value > same >= -1e-3
