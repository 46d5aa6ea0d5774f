"""Image-quality metrics for reconstructions and samples: PSNR, SSIM, MS-SSIM, LPIPS and FID.

Images are float tensors (N, C, H, W) with values in [0, data_range]; each per-image metric returns (N,).

PSNR, SSIM and MS-SSIM need nothing but torch (and are cross-checked against scikit-image and torchmetrics in
the tests). LPIPS and FID are torchmetrics' implementations (``pip install 'hyperset[metrics]'``: torchmetrics,
torchvision, torch-fidelity) on pretrained networks that are never downloaded at run time: the weight file is
``weights_path``, else $HYPERSET_LPIPS_WEIGHTS / $HYPERSET_FID_WEIGHTS, else the torch.hub cache
($TORCH_HOME/hub/checkpoints/, where those libraries keep it). Without the extra or the file,
``compute_lpips`` / ``compute_fid`` return ``(None, reason)`` (see ``metric_unavailable``), never a made-up 0.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

MS_SSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)
ENV_VARS = {"lpips": "HYPERSET_LPIPS_WEIGHTS", "fid": "HYPERSET_FID_WEIGHTS"}


def _check_pair(x: torch.Tensor, y: torch.Tensor) -> None:
    if x.shape != y.shape or x.ndim != 4:
        raise ValueError(f"expected two (N, C, H, W) tensors of one shape: {tuple(x.shape)} {tuple(y.shape)}")


def _float(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) or not x.is_floating_point() else x


def mean_score(values: torch.Tensor) -> float:
    """Mean of per-image values as a float (``inf`` if any PSNR is infinite: see ``psnr``'s ``max_db``)."""
    return float(values.double().mean())


# ----------------------------------------------------------------------------------------------------
# PSNR


def psnr(
    x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0, max_db: float | None = None
) -> torch.Tensor:
    """Peak signal-to-noise ratio per image, 10 log10(data_range^2 / MSE), in dB.

    Identical images have MSE 0 and PSNR ``inf``; pass ``max_db`` (e.g. 100) to clamp instead.
    """
    _check_pair(x, y)
    mse = (_float(x).double() - _float(y).double()).pow(2).flatten(1).mean(1)
    value = 10.0 * torch.log10(data_range**2 / mse)  # division by 0 gives inf, as documented
    if max_db is not None:
        value = value.clamp(max=max_db)
    return value.to(_float(x).dtype)


# ----------------------------------------------------------------------------------------------------
# SSIM and MS-SSIM (Wang et al. 2004; Wang, Simoncelli & Bovik 2003)


def gaussian_window(size: int, sigma: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Normalized 1-D Gaussian of ``size`` taps centred on the middle tap."""
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    return (g / g.sum()).to(dtype)


def _filter(x: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Separable 'valid' Gaussian filtering of each channel: (N, C, H, W) -> (N, C, H-k+1, W-k+1)."""
    c, k = x.shape[1], window.numel()
    x = F.conv2d(x, window.view(1, 1, k, 1).expand(c, 1, k, 1), groups=c)
    return F.conv2d(x, window.view(1, 1, 1, k).expand(c, 1, 1, k), groups=c)


def _ssim_and_cs(
    x: torch.Tensor,
    y: torch.Tensor,
    data_range: float,
    window: torch.Tensor,
    k1: float,
    k2: float,
    padding: str = "valid",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image mean SSIM and mean contrast-structure term over channels and window positions.

    "valid": both over the positions where the window fits. "reflect" (torchmetrics): the images are
    reflect-padded by half a window, SSIM is averaged over the whole padded-and-filtered map and cs over the
    valid part only.
    """
    if padding not in ("valid", "reflect"):
        raise ValueError(f"padding must be 'valid' or 'reflect', not {padding!r}")
    c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
    half = (window.numel() - 1) // 2
    if padding == "reflect":
        x, y = (F.pad(t, (half, half, half, half), mode="reflect") for t in (x, y))
    # Moments of mean-removed images: same values, far less cancellation in E[x^2] - E[x]^2 (float32).
    mx, my = x.mean(dim=(2, 3), keepdim=True), y.mean(dim=(2, 3), keepdim=True)
    x, y = x - mx, y - my
    mu_x, mu_y = _filter(x, window), _filter(y, window)
    var_x = (_filter(x * x, window) - mu_x**2).clamp(min=0)
    var_y = (_filter(y * y, window) - mu_y**2).clamp(min=0)
    cov = _filter(x * y, window) - mu_x * mu_y
    cs_map = (2 * cov + c2) / (var_x + var_y + c2)
    mu_x, mu_y = mu_x + mx, mu_y + my
    ssim_map = (2 * mu_x * mu_y + c1) / (mu_x**2 + mu_y**2 + c1) * cs_map
    if padding == "reflect" and half > 0:
        cs_map = cs_map[..., half:-half, half:-half]
    return ssim_map.flatten(1).mean(1), cs_map.flatten(1).mean(1)


def ssim(
    x: torch.Tensor,
    y: torch.Tensor,
    data_range: float = 1.0,
    win_size: int = 11,
    sigma: float = 1.5,
    k1: float = 0.01,
    k2: float = 0.03,
    padding: str = "valid",
) -> torch.Tensor:
    """Structural similarity per image (Wang et al. 2004) with an 11-tap Gaussian window, sigma 1.5.

    Local statistics use population (weighted) moments. With ``padding="valid"`` (default) the SSIM map is
    averaged over the positions where the window fits entirely in the image, and over channels: this equals
    scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False)``.
    ``padding="reflect"`` reproduces torchmetrics (which the authors' evaluation used): reflect-pad by 5 px
    and average the whole map, borders included; it differs from "valid" by about 1e-3.
    """
    _check_pair(x, y)
    if min(x.shape[-2:]) < win_size:
        raise ValueError(f"SSIM window {win_size} does not fit in a {x.shape[-2]}x{x.shape[-1]} image")
    x, y = _float(x), _float(y)
    window = gaussian_window(win_size, sigma, x.dtype).to(x.device)
    return _ssim_and_cs(x, y, data_range, window, k1, k2, padding)[0]


@dataclass(frozen=True)
class MSSSIMConfig:
    """What ``ms_ssim`` computes for an image size: number of scales, window and per-scale weights."""

    scales: int
    win_size: int
    sigma: float
    weights: tuple[float, ...]
    reduced: bool

    def describe(self) -> str:
        """One line for reports, e.g. 'MS-SSIM over 2 scales (window 11, sigma 1.5), weights ...'."""
        note = " (reduced from 5 scales / window 11 for this image size)" if self.reduced else ""
        weights = ", ".join(f"{w:.4f}" for w in self.weights)
        return (
            f"MS-SSIM over {self.scales} scales (window {self.win_size}, sigma {self.sigma}), "
            f"weights ({weights}){note}"
        )


def ms_ssim_config(height: int, width: int, win_size: int = 11, sigma: float = 1.5) -> MSSSIMConfig:
    """Scales and window that fit an image size, keeping the standard recipe whenever possible.

    The standard 5 scales need the coarsest scale (side // 16) to hold the 11-px window, i.e. images of at
    least 176 px. Smaller images use the most scales M whose coarsest side still holds the window, with the
    first M standard weights renormalized to sum to 1 (32x32: 2 scales, weights 0.1356, 0.8644; 64x64: 3
    scales). Images under 11 px use one scale and the largest odd window that fits (sigma kept): plain SSIM.
    """
    side = min(height, width)
    if side < 3:
        raise ValueError(f"MS-SSIM needs images of at least 3x3, got {height}x{width}")
    scales = len(MS_SSIM_WEIGHTS)
    while scales > 1 and side // 2 ** (scales - 1) < win_size:
        scales -= 1
    win = win_size if side >= win_size else (side if side % 2 else side - 1)
    raw = MS_SSIM_WEIGHTS[:scales]
    weights = tuple(w / sum(raw) for w in raw) if scales < len(MS_SSIM_WEIGHTS) else MS_SSIM_WEIGHTS
    return MSSSIMConfig(scales, win, sigma, weights, reduced=scales < len(MS_SSIM_WEIGHTS) or win != win_size)


def ms_ssim(
    x: torch.Tensor,
    y: torch.Tensor,
    data_range: float = 1.0,
    config: MSSSIMConfig | None = None,
    k1: float = 0.01,
    k2: float = 0.03,
    padding: str = "valid",
) -> torch.Tensor:
    """Multi-scale SSIM per image: prod_{j<M} cs_j^w_j * ssim_M^w_M over M scales (2x average pooling).

    Each scale's cs and SSIM are per-image means as in ``ssim``; negative values are clamped to 0 before the
    powers (torchmetrics' default "relu" normalization). ``config`` defaults to ``ms_ssim_config(H, W)``,
    which keeps the standard 5 scales / 11-px window / weights (0.0448, 0.2856, 0.3001, 0.2363, 0.1333) when
    the image is large enough (>= 176 px) and otherwise reduces them as documented there. ``padding`` as in
    ``ssim``; "reflect" with the 5-scale config reproduces torchmetrics' MS-SSIM.
    """
    _check_pair(x, y)
    cfg = config or ms_ssim_config(x.shape[-2], x.shape[-1])
    x, y = _float(x), _float(y)
    window = gaussian_window(cfg.win_size, cfg.sigma, x.dtype).to(x.device)
    weights = torch.tensor(cfg.weights, dtype=x.dtype, device=x.device)
    terms = []
    for scale in range(cfg.scales):
        if min(x.shape[-2:]) < cfg.win_size:
            raise ValueError(f"scale {scale + 1} is {x.shape[-2]}x{x.shape[-1]}, smaller than the window")
        s, cs = _ssim_and_cs(x, y, data_range, window, k1, k2, padding)
        terms.append(s if scale == cfg.scales - 1 else cs)
        if scale < cfg.scales - 1:
            x, y = F.avg_pool2d(x, 2), F.avg_pool2d(y, 2)
    stacked = torch.stack(terms, dim=1).clamp(min=0)  # (N, M)
    return (stacked ** weights[None, :]).prod(dim=1)


# ----------------------------------------------------------------------------------------------------
# LPIPS and FID: the maintained implementations of torchmetrics (the `metrics` extra), offline

METRICS_EXTRA = "metrics"
# The pretrained files the two metrics need, by the names under which torch.hub caches them
# (<torch.hub.get_dir()>/checkpoints/, i.e. $TORCH_HOME/hub/checkpoints/): torchvision's ImageNet backbones for
# LPIPS (its linear layers ship inside torchmetrics) and torch-fidelity's FID Inception-v3. Never downloaded here.
LPIPS_BACKBONE_FILES = {
    "alex": "alexnet-owt-7be5be79.pth",
    "vgg": "vgg16-397923af.pth",
    "squeeze": "squeezenet1_1-b8a52dc0.pth",
}
FID_WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
_MODULES = {"lpips": ("torchmetrics", "torchvision"), "fid": ("torchmetrics", "torch_fidelity")}


def hub_checkpoints() -> Path:
    """The folder where torch.hub (and so torchvision and torch-fidelity) look for cached weight files."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def _resolve(path: str | os.PathLike | None, env: str) -> Path | None:
    if path is None:
        path = os.environ.get(ENV_VARS[env]) or None
    return None if path is None else Path(path)


def weights_file(name: str, weights_path: str | os.PathLike | None = None, net: str = "alex") -> Path:
    """The weight file metric ``name`` ("lpips" or "fid") would use: ``weights_path``, else the environment
    variable (``ENV_VARS``), else the torch.hub cache file (which may not exist)."""
    path = _resolve(weights_path, name)
    if path is not None:
        return path
    if name == "lpips":
        if net not in LPIPS_BACKBONE_FILES:
            raise ValueError(f"unknown LPIPS network {net!r}; expected one of {', '.join(LPIPS_BACKBONE_FILES)}")
        return hub_checkpoints() / LPIPS_BACKBONE_FILES[net]
    return hub_checkpoints() / FID_WEIGHTS_FILE


def metric_unavailable(name: str, weights_path: str | os.PathLike | None = None, net: str = "alex") -> str:
    """Why metric ``name`` cannot run here, or "" if it can (PSNR/SSIM/MS-SSIM always can).

    LPIPS and FID need the `metrics` extra (torchmetrics with torchvision / torch-fidelity) and a local weight
    file: ``weights_path``, $HYPERSET_LPIPS_WEIGHTS / $HYPERSET_FID_WEIGHTS, or the torch.hub cache
    (``hub_checkpoints()``). Nothing is downloaded.
    """
    if name in ("psnr", "ssim", "ms_ssim"):
        return ""
    if name not in _MODULES:
        raise ValueError(f"unknown metric {name!r}; expected psnr, ssim, ms_ssim, lpips or fid")
    label = name.upper()
    from ..extras import MissingExtra, require

    try:
        require(METRICS_EXTRA, *_MODULES[name], what=label)
    except MissingExtra as e:
        return f"{label} unavailable: {e}"
    path = weights_file(name, weights_path, net)
    given = _resolve(weights_path, name) is not None
    if path.is_file():
        return ""
    if given:
        return f"{label} unavailable: weight file {path} does not exist"
    option, env = ("--lpips-weights", ENV_VARS["lpips"]) if name == "lpips" else ("--fid-weights", ENV_VARS["fid"])
    what = (f"torchvision's ImageNet {net} backbone ({path.name})" if name == "lpips"
            else f"torch-fidelity's FID Inception-v3 ({path.name})")
    return (f"{label} unavailable: it needs {what}, which is not in the torch hub cache {path.parent}; give the "
            f"file with {option} PATH (or ${env}) or put it there. Nothing is downloaded.")


@contextlib.contextmanager
def _hub_file(path: Path, filename: str) -> Iterator[None]:
    """While inside, torch.hub finds ``path`` as its cached ``filename`` (a temporary hub folder linking to it),
    so that a library that loads its weights through torch.hub reads that file and downloads nothing."""
    cached = hub_checkpoints() / filename
    if cached.exists() and cached.resolve() == path.resolve():
        yield
        return
    saved = getattr(torch.hub, "_hub_dir", None)
    with tempfile.TemporaryDirectory(prefix="hyperset-hub-") as tmp:
        link = Path(tmp) / "checkpoints" / filename
        link.parent.mkdir()
        try:
            link.symlink_to(path.resolve())
        except OSError:  # no symlinks on this file system
            shutil.copyfile(path, link)
        torch.hub.set_dir(tmp)
        try:
            yield
        finally:
            torch.hub._hub_dir = saved  # back to what it was (None: follow $TORCH_HOME again)


def _one_line(e: BaseException) -> str:
    return (str(e) or type(e).__name__).strip().splitlines()[0]


@functools.lru_cache(maxsize=2)
def _lpips_metric(path: str, net: str) -> torch.nn.Module:
    from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

    with _hub_file(Path(path), LPIPS_BACKBONE_FILES[net]):
        return LearnedPerceptualImagePatchSimilarity(net_type=net, reduction="none", normalize=True).eval()


def compute_lpips(
    x: torch.Tensor,
    y: torch.Tensor,
    weights_path: str | os.PathLike | None = None,
    net: str = "alex",
    batch: int = 100,
) -> tuple[torch.Tensor | None, str]:
    """(LPIPS per image (N,), "") for images (N, 3, H, W) in [0, 1] by torchmetrics'
    ``LearnedPerceptualImagePatchSimilarity`` (LPIPS v0.1, ``net`` alex | vgg | squeeze), or (None, reason)
    when the `metrics` extra or the backbone weight file is missing (see ``metric_unavailable``)."""
    _check_pair(x, y)
    reason = metric_unavailable("lpips", weights_path, net)
    if reason:
        return None, reason
    path = weights_file("lpips", weights_path, net)
    try:
        metric = _lpips_metric(str(path), net).to(x.device)
    except Exception as e:  # a file that is not the backbone's weights, or a broken install
        return None, f"LPIPS unavailable: {path} could not be loaded as the {net} backbone ({_one_line(e)})"
    values = []
    with torch.no_grad():
        for a, b in zip(x.split(batch), y.split(batch)):
            metric.reset()
            metric.update(_float(a).float().clamp(0, 1), _float(b).float().clamp(0, 1))
            values.append(metric.compute().reshape(-1).cpu())
    return torch.cat(values), ""


# ----------------------------------------------------------------------------------------------------
# The Fréchet distance (for FID over any features)


def feature_statistics(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (D,) and unbiased covariance (D, D), in float64, of features (N, D) with N >= 2."""
    f = features.detach().double()
    if f.ndim != 2 or f.shape[0] < 2:
        raise ValueError(f"need features of shape (N >= 2, D), got {tuple(f.shape)}")
    mu = f.mean(0)
    centred = f - mu
    return mu, centred.T @ centred / (f.shape[0] - 1)


def _sqrt_psd(m: torch.Tensor) -> torch.Tensor:
    vals, vecs = torch.linalg.eigh((m + m.T) / 2)
    return (vecs * vals.clamp(min=0).sqrt()) @ vecs.T


def frechet_distance(
    mu1: torch.Tensor | np.ndarray,
    sigma1: torch.Tensor | np.ndarray,
    mu2: torch.Tensor | np.ndarray,
    sigma2: torch.Tensor | np.ndarray,
) -> float:
    """Fréchet distance of two Gaussians: |mu1 - mu2|^2 + tr(S1 + S2 - 2 (S1 S2)^(1/2)).

    tr((S1 S2)^(1/2)) is computed as the sum of square roots of the eigenvalues of the symmetric PSD matrix
    S1^(1/2) S2 S1^(1/2) (same eigenvalues as S1 S2), in float64 with torch.linalg.eigh. This is exact for PSD
    inputs and avoids scipy's ``sqrtm`` (pytorch-fid's route), its complex round-off and its eps retry.
    """
    m1, m2 = torch.as_tensor(mu1).double(), torch.as_tensor(mu2).double()
    s1, s2 = torch.as_tensor(sigma1).double(), torch.as_tensor(sigma2).double()
    if m1.shape != m2.shape or s1.shape != s2.shape or s1.shape != (m1.numel(), m1.numel()):
        raise ValueError(
            f"shapes do not match: mu {tuple(m1.shape)}/{tuple(m2.shape)}, sigma {tuple(s1.shape)}"
        )
    root1 = _sqrt_psd(s1)
    inner = root1 @ s2 @ root1
    eig = torch.linalg.eigvalsh((inner + inner.T) / 2).clamp(min=0)
    value = (m1 - m2).pow(2).sum() + torch.trace(s1) + torch.trace(s2) - 2 * eig.sqrt().sum()
    return float(value)


class FID:
    """Streaming FID: feed real and generated images in batches, then ``compute()``.

    Features come from ``feature_extractor``, any callable (N, 3, H, W) in [0, 1] -> (N, D): this is the
    Fréchet distance for features of your choice (``compute_fid`` without an extractor is the standard FID on
    torchmetrics' Inception-v3). Statistics accumulate in float64 sums, so memory does not grow with the
    number of images.
    """

    def __init__(
        self,
        feature_extractor: Callable[[torch.Tensor], torch.Tensor],
        device: str | torch.device = "cpu",
    ) -> None:
        self.extractor = feature_extractor
        self.device = torch.device(device)
        self.reset()

    def reset(self) -> None:
        """Forget all images seen so far."""
        self._n = {True: 0, False: 0}
        self._sum: dict[bool, torch.Tensor | None] = {True: None, False: None}
        self._outer: dict[bool, torch.Tensor | None] = {True: None, False: None}

    @torch.no_grad()
    def update(self, images: torch.Tensor, real: bool) -> None:
        """Add a batch of images (N, 3, H, W) in [0, 1] to the real or the generated set."""
        feats = self.extractor(images.to(self.device)).double().cpu()
        if self._sum[real] is None:
            d = feats.shape[1]
            self._sum[real] = torch.zeros(d, dtype=torch.float64)
            self._outer[real] = torch.zeros(d, d, dtype=torch.float64)
        self._sum[real] += feats.sum(0)
        self._outer[real] += feats.T @ feats
        self._n[real] += feats.shape[0]

    def statistics(self, real: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and unbiased covariance of the features of one set."""
        n, s, o = self._n[real], self._sum[real], self._outer[real]
        if n < 2 or s is None or o is None:
            raise ValueError(f"FID needs at least 2 {'real' if real else 'generated'} images, got {n}")
        mu = s / n
        return mu, (o - n * torch.outer(mu, mu)) / (n - 1)

    def compute(self) -> float:
        """FID between everything fed as real and as generated."""
        return frechet_distance(*self.statistics(True), *self.statistics(False))


def _fid_metric(path: Path, device: str | torch.device) -> Any:
    import inspect

    from torchmetrics.image.fid import FrechetInceptionDistance

    kw: dict[str, Any] = {"feature": 2048, "normalize": True, "feature_extractor_weights_path": str(path)}
    if "antialias" in inspect.signature(FrechetInceptionDistance.__init__).parameters:
        kw["antialias"] = False  # TensorFlow 1's bilinear resize to 299 px, as the original FID and the paper's
    return FrechetInceptionDistance(**kw).to(device)


def compute_fid(
    real: Iterable[torch.Tensor],
    fake: Iterable[torch.Tensor],
    weights_path: str | os.PathLike | None = None,
    feature_extractor: Callable[[torch.Tensor], torch.Tensor] | None = None,
    device: str | torch.device = "cpu",
) -> tuple[float | None, str]:
    """(FID, "") between two streams of image batches (N, 3, H, W) in [0, 1], or (None, reason).

    Without ``feature_extractor``: torchmetrics' ``FrechetInceptionDistance`` (2048-d pool features of
    torch-fidelity's Inception-v3, images quantized to uint8 and resized to 299 px as the TF original) with the
    weight file of ``metric_unavailable``; None and the reason when the `metrics` extra or the file is missing.
    With one: the Fréchet distance of its features (``FID``)."""
    if feature_extractor is not None:
        fid = FID(feature_extractor, device)
        for batch in real:
            fid.update(batch, real=True)
        for batch in fake:
            fid.update(batch, real=False)
        value = fid.compute()
    else:
        reason = metric_unavailable("fid", weights_path)
        if reason:
            return None, reason
        path = weights_file("fid", weights_path)
        try:
            metric = _fid_metric(path, device)
        except Exception as e:  # not the Inception weights, or a broken install
            return None, f"FID unavailable: {path} could not be loaded as the FID Inception-v3 ({_one_line(e)})"
        with torch.no_grad():
            for batch in real:
                metric.update(_float(batch).float().clamp(0, 1).to(device), real=True)
            for batch in fake:
                metric.update(_float(batch).float().clamp(0, 1).to(device), real=False)
            try:
                value = float(metric.compute())
            except RuntimeError as e:  # fewer than 2 images on a side
                raise ValueError(f"FID: {_one_line(e)}") from None
    return (value, "") if math.isfinite(value) else (None, "FID is not finite (degenerate features)")
