"""Specification of hyperset.vision.metrics against hand-computed values and independent numpy code."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

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


def test_ssim_matches_scikit_image_when_installed() -> None:
    skm = pytest.importorskip("skimage.metrics")
    x = _images(1, 32, 6)
    y = (x * 0.8 + 0.2 * _images(1, 32, 7)).clamp(0, 1)
    ref = skm.structural_similarity(x[0].numpy(), y[0].numpy(), channel_axis=0, data_range=1.0,
                                    gaussian_weights=True, sigma=1.5, use_sample_covariance=False)
    assert vm.ssim(x, y).item() == pytest.approx(ref, abs=1e-6)


def test_reflect_padding_matches_torchmetrics_when_installed() -> None:
    tm = pytest.importorskip("torchmetrics.functional.image")
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


def test_tf1_bilinear_resize_samples_at_i_times_in_over_out() -> None:
    row = torch.tensor([0.0, 10.0]).view(1, 1, 1, 2).expand(1, 1, 2, 2)
    # Output column i samples input column i * 2/4: 0, 0.5, 1, 1.5 -> 0, 5, 10, 10 (clamped at the edge).
    assert vm.resize_bilinear_tf1(row, 4)[0, 0, 0].tolist() == [0.0, 5.0, 10.0, 10.0]
    x = torch.rand(1, 3, 9, 9)
    assert torch.equal(vm.resize_bilinear_tf1(x, 9), x)


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
    fid = vm.FID(feature_extractor=extractor)
    for chunk in real.split(7):
        fid.update(chunk, real=True)
    fid.update(fake, real=False)
    stats_real, stats_fake = vm.feature_statistics(extractor(real)), vm.feature_statistics(extractor(fake))
    expected = vm.frechet_distance(*stats_real, *stats_fake)
    assert fid.compute() == pytest.approx(expected, rel=1e-9) and expected > 0.05
    value, reason = vm.compute_fid([real], [real], feature_extractor=extractor)
    assert value == pytest.approx(0.0, abs=1e-9) and reason == ""


# ----------------------------------------------------------------------------------------------------
# Learned metrics: the unavailable path and the weight loading


def test_learned_metrics_without_weights_return_none_and_a_reason(tmp_path: Path) -> None:
    x = torch.rand(1, 3, 64, 64)
    value, reason = vm.compute_lpips(x, x)
    assert value is None and "LPIPS unavailable" in reason and "HYPERSET_LPIPS_WEIGHTS" in reason
    value, reason = vm.compute_fid([x], [x])
    assert value is None and "FID unavailable" in reason
    assert "does not exist" in vm.metric_unavailable("fid", tmp_path / "missing.pth")
    assert vm.metric_unavailable("psnr") == "" and vm.metric_unavailable("ms_ssim") == ""
    with pytest.raises(vm.MetricUnavailable):
        vm.LPIPS()
    with pytest.raises(vm.MetricUnavailable):
        vm.FID()
    with pytest.raises(ValueError):
        vm.metric_unavailable("is")


def _random_lpips_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A whole-model safetensors file, and the same weights split as torchvision alexnet + lpips lin .pth."""
    torch.manual_seed(0)
    layers = vm._alexnet_features()
    backbone = {f"features.{i}.{k}": v for i, m in enumerate(layers) for k, v in m.state_dict().items()}
    backbone["classifier.1.weight"] = torch.zeros(4, 4)  # torchvision's head, ignored
    lins = {f"lin{k}.model.1.weight": torch.rand(1, c, 1, 1) for k, c in enumerate((64, 192, 384, 256, 256))}
    bounds = (0, 2, 5, 8, 10, 12)
    whole = {f"net.slice{next(s + 1 for s in range(5) if bounds[s] <= int(k.split('.')[1]) < bounds[s + 1])}."
             f"{k.removeprefix('features.')}": v for k, v in backbone.items() if k.startswith("features.")}
    whole.update(lins)
    whole.update({f"lins.{k}.model.1.weight": lins[f"lin{k}.model.1.weight"].clone() for k in range(5)})
    save_file(whole, tmp_path / "lpips_alex.safetensors")
    torch.save(backbone, tmp_path / "alexnet.pth")
    torch.save(lins, tmp_path / "alex_lin.pth")
    return tmp_path / "lpips_alex.safetensors", tmp_path / "alex_lin.pth", tmp_path / "alexnet.pth"


def _lpips_by_hand(path: Path, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Zhang et al.'s formula written out with functional ops on the raw tensors of the whole-model file."""
    from safetensors.torch import load_file

    w = load_file(str(path))
    shift = torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1)
    scale = torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1)

    def feats(img: torch.Tensor) -> list[torch.Tensor]:
        h = (2 * img - 1 - shift) / scale
        out = []
        h = F.relu(F.conv2d(h, w["net.slice1.0.weight"], w["net.slice1.0.bias"], stride=4, padding=2))
        out.append(h)
        h = F.max_pool2d(h, 3, 2)
        h = F.relu(F.conv2d(h, w["net.slice2.3.weight"], w["net.slice2.3.bias"], padding=2))
        out.append(h)
        h = F.max_pool2d(h, 3, 2)
        h = F.relu(F.conv2d(h, w["net.slice3.6.weight"], w["net.slice3.6.bias"], padding=1))
        out.append(h)
        h = F.relu(F.conv2d(h, w["net.slice4.8.weight"], w["net.slice4.8.bias"], padding=1))
        out.append(h)
        out.append(F.relu(F.conv2d(h, w["net.slice5.10.weight"], w["net.slice5.10.bias"], padding=1)))
        return out

    total = torch.zeros(x.shape[0])
    for k, (a, b) in enumerate(zip(feats(x), feats(y))):
        a = a / (a.norm(dim=1, keepdim=True) + 1e-10)
        b = b / (b.norm(dim=1, keepdim=True) + 1e-10)
        total += ((a - b) ** 2 * w[f"lin{k}.model.1.weight"].view(1, -1, 1, 1)).sum(1).mean(dim=(1, 2))
    return total


def test_lpips_loads_both_weight_layouts_and_follows_the_formula(tmp_path: Path) -> None:
    whole, lin, backbone = _random_lpips_files(tmp_path)
    x, y = torch.rand(2, 3, 64, 64), torch.rand(2, 3, 64, 64)
    model = vm.LPIPS(whole)
    d = model(x, y)
    assert d.shape == (2,) and (d > 0).all()
    assert torch.allclose(d, _lpips_by_hand(whole, x, y), rtol=1e-4, atol=1e-6)
    assert torch.allclose(model(x, x), torch.zeros(2), atol=1e-6)
    assert torch.allclose(d, model(y, x), rtol=1e-5)
    split, reason = vm.compute_lpips(x, y, weights_path=lin, backbone_path=backbone)
    assert reason == "" and split is not None and torch.allclose(split, d, rtol=1e-5)
    value, reason = vm.compute_lpips(x, y, weights_path=lin)
    assert value is None and "backbone_path" in reason


def test_lpips_rejects_a_file_of_the_wrong_network(tmp_path: Path) -> None:
    whole, _, _ = _random_lpips_files(tmp_path)
    with pytest.raises(ValueError, match="does not fit LPIPS"):
        vm.LPIPS(whole, net="vgg")


def test_fid_inception_has_inception_v3_size_and_loads_both_key_layouts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = vm.InceptionV3Features()
    # torchvision's inception_v3 has 27,161,264 parameters: minus AuxLogits (3,326,696) and fc (2,049,000).
    assert sum(p.numel() for p in model.parameters()) == 21_785_568
    state = {k: v for k, v in model.state_dict().items() if "num_batches_tracked" not in k}
    save_file({**state, "fc.weight": torch.zeros(1008, 2048), "fc.bias": torch.zeros(1008)},
              tmp_path / "tv.safetensors")
    renamed = {}
    for key, value in state.items():
        for old, new in vm._FID_BLOCKS.items():
            if key.startswith(new + "."):
                key = old + key[len(new):]
                break
        renamed[key] = value
    torch.save(renamed, tmp_path / "pytorch_fid_blocks.pth")
    for path in (tmp_path / "tv.safetensors", tmp_path / "pytorch_fid_blocks.pth"):
        loaded = vm.InceptionV3Features.from_file(path)
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    loaded.preprocess = "none"
    with torch.no_grad():
        feats = loaded(torch.rand(1, 3, 75, 75))  # the smallest input the network accepts
    assert feats.shape == (1, 2048) and torch.isfinite(feats).all() and (feats >= 0).all()
    del state["Mixed_7c.branch_pool.conv.weight"]
    save_file(state, tmp_path / "broken.safetensors")
    with pytest.raises(ValueError, match=r"missing 1 keys.*Mixed_7c.branch_pool.conv.weight"):
        vm.InceptionV3Features.from_file(tmp_path / "broken.safetensors")


@pytest.mark.parametrize("content, name", [(b"not weights at all" * 10, "w.safetensors"), (b"\x80\x04garbage", "w.pth"),
                                           (b"PK\x03\x04garbage", "w.pt")])
def test_a_garbage_weight_file_is_a_one_line_value_error(tmp_path, content: bytes, name: str) -> None:
    from hyperset.vision.metrics import load_state_dict

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a safetensors or weights-only torch weight file") as info:
        load_state_dict(path)
    assert "\n" not in str(info.value)
