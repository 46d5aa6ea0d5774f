"""Image-quality metrics for reconstructions and samples: PSNR, SSIM, MS-SSIM, LPIPS and FID.

Images are float tensors (N, C, H, W) with values in [0, data_range]; each per-image metric returns (N,).

PSNR, SSIM and MS-SSIM need nothing but torch. LPIPS and FID need pretrained networks, which are never
downloaded at run time: their weights are read from local files (safetensors, or a torch file opened with
``torch.load(weights_only=True)``), given as ``weights_path`` or through the environment variables
``HYPERSET_LPIPS_WEIGHTS`` / ``HYPERSET_LPIPS_BACKBONE`` / ``HYPERSET_FID_WEIGHTS``. Without them
``compute_lpips`` / ``compute_fid`` return ``(None, reason)`` (see ``metric_unavailable``), never a made-up 0.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

MS_SSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)
ENV_VARS = {
    "lpips": "HYPERSET_LPIPS_WEIGHTS",
    "lpips_backbone": "HYPERSET_LPIPS_BACKBONE",
    "fid": "HYPERSET_FID_WEIGHTS",
}


class MetricUnavailable(RuntimeError):
    """A learned metric cannot run because its pretrained weights are not on this machine."""


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
# Weight files


def load_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Tensors of a weight file: safetensors, or a torch file read with ``torch.load(weights_only=True)``.

    A torch file may hold the state dict itself or nest it under "state_dict" / "model"; a "module." prefix
    (DataParallel) is removed.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weight file {path}")
    with open(path, "rb") as f:
        head = f.read(16)
    is_zip_or_pickle = head.startswith(b"PK") or head[:1] == b"\x80"
    try:
        if path.suffix == ".safetensors" or not is_zip_or_pickle:
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise their own types for a file that is not theirs
        reason = (str(e) or type(e).__name__).splitlines()[0]
        raise ValueError(f"{path}: not a safetensors or weights-only torch weight file ({reason})") from None
    for key in ("state_dict", "model"):  # a torch file may nest the state dict
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a flat dict of tensors")
    return {k.removeprefix("module."): v for k, v in state.items()}


def _load_exact(module: nn.Module, state: dict[str, torch.Tensor], source: str, assign: bool = False) -> None:
    """Load ``state`` into ``module``, failing with the missing / unexpected / mis-shaped keys named."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
             for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} keys (e.g. {', '.join(missing[:5])})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} keys (e.g. {', '.join(unexpected[:5])})")
        if wrong:
            parts.append(f"wrong shapes: {'; '.join(wrong[:5])}")
        raise ValueError(f"{source} does not fit {type(module).__name__}: {'; '.join(parts)}")
    module.load_state_dict(state, assign=assign)


def _resolve(path: str | os.PathLike | None, env: str) -> Path | None:
    if path is None:
        path = os.environ.get(ENV_VARS[env]) or None
    return None if path is None else Path(path)


def metric_unavailable(
    name: str, weights_path: str | os.PathLike | None = None, backbone_path: str | os.PathLike | None = None
) -> str:
    """Why metric ``name`` cannot run here, or "" if it can (PSNR/SSIM/MS-SSIM always can).

    LPIPS and FID need local weight files (``weights_path`` or the ``ENV_VARS`` environment variables); they
    are never downloaded.
    """
    if name in ("psnr", "ssim", "ms_ssim"):
        return ""
    if name == "lpips":
        path = _resolve(weights_path, "lpips")
        if path is None:
            return (
                "LPIPS unavailable: no weight file given (weights_path or $HYPERSET_LPIPS_WEIGHTS); it needs "
                "the AlexNet/VGG16 features and the LPIPS v0.1 linear layers, never downloaded at run time"
            )
        if not path.is_file():
            return f"LPIPS unavailable: weight file {path} does not exist"
        backbone = _resolve(backbone_path, "lpips_backbone")
        if backbone is not None and not backbone.is_file():
            return f"LPIPS unavailable: backbone weight file {backbone} does not exist"
        return ""
    if name == "fid":
        path = _resolve(weights_path, "fid")
        if path is None:
            return (
                "FID unavailable: no Inception-v3 weight file given (weights_path or $HYPERSET_FID_WEIGHTS, "
                "e.g. pytorch-fid's pt_inception-2015-12-05 weights); nothing is downloaded at run time"
            )
        if not path.is_file():
            return f"FID unavailable: weight file {path} does not exist"
        return ""
    raise ValueError(f"unknown metric {name!r}; expected psnr, ssim, ms_ssim, lpips or fid")


# ----------------------------------------------------------------------------------------------------
# LPIPS v0.1 (Zhang et al. 2018)

# Feature-layer indices of torchvision's alexnet/vgg16 ``features`` that end each LPIPS slice (after a ReLU).
_LPIPS_SLICES = {"alex": (0, 2, 5, 8, 10, 12), "vgg": (0, 4, 9, 16, 23, 30)}
_LPIPS_CHANNELS = {"alex": (64, 192, 384, 256, 256), "vgg": (64, 128, 256, 512, 512)}


def _alexnet_features() -> list[nn.Module]:
    return [
        nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True),
    ]


def _vgg16_features() -> list[nn.Module]:
    layers: list[nn.Module] = []
    channels = 3
    for out in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512):
        if out == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(channels, int(out), 3, padding=1), nn.ReLU(inplace=True)]
            channels = int(out)
    return layers


class _Slices(nn.Module):
    """Backbone cut into five sequential slices named slice1..slice5, keeping torchvision's layer indices."""

    def __init__(self, net: str) -> None:
        super().__init__()
        layers = _alexnet_features() if net == "alex" else _vgg16_features()
        bounds = _LPIPS_SLICES[net]
        for k in range(5):
            block = nn.Sequential()
            for i in range(bounds[k], bounds[k + 1]):
                block.add_module(str(i), layers[i])
            setattr(self, f"slice{k + 1}", block)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        for k in range(5):
            x = getattr(self, f"slice{k + 1}")(x)
            feats.append(x)
        return feats


class _LinearHead(nn.Module):
    """LPIPS 'NetLinLayer': dropout (inactive in eval) + 1x1 conv without bias, C -> 1."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.model = nn.Sequential(nn.Dropout(), nn.Conv2d(channels, 1, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


class LPIPS(nn.Module):
    """LPIPS v0.1 distance per image pair, on images in [0, 1] (rescaled to [-1, 1] inside).

    Each of 5 backbone feature maps is unit-normalized over channels; the squared difference is weighted per
    channel by the linear heads, averaged over space, and summed over layers.

    Weights, from local files only (``load_state_dict`` formats):
    * ``weights_path`` holding the whole model, e.g. the ``lpips`` package's ``LPIPS().state_dict()``
      (``net.slice{k}.{i}.*``, ``lin{k}.model.1.weight``), or
    * ``weights_path`` = the lpips v0.1 linear-layer file (``lin0..lin4``, e.g. ``weights/v0.1/alex.pth``)
      plus ``backbone_path`` = torchvision's ImageNet alexnet/vgg16 file (``features.{i}.*``).
    Raises ``MetricUnavailable`` when no file is given (see ``metric_unavailable``).
    """

    def __init__(
        self,
        weights_path: str | os.PathLike | None = None,
        net: str = "alex",
        backbone_path: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        if net not in _LPIPS_SLICES:
            raise ValueError(f"LPIPS net must be 'alex' or 'vgg', not {net!r}")
        self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1))
        self.net = _Slices(net)
        for k, c in enumerate(_LPIPS_CHANNELS[net]):
            setattr(self, f"lin{k}", _LinearHead(c))
        reason = metric_unavailable("lpips", weights_path, backbone_path)
        if reason:
            raise MetricUnavailable(reason)
        path = _resolve(weights_path, "lpips")
        backbone = _resolve(backbone_path, "lpips_backbone")
        assert path is not None
        self._load(load_state_dict(path), None if backbone is None else load_state_dict(backbone), net)
        self.eval().requires_grad_(False)

    def _load(
        self, state: dict[str, torch.Tensor], backbone: dict[str, torch.Tensor] | None, net: str
    ) -> None:
        merged: dict[str, torch.Tensor] = {}
        bounds = _LPIPS_SLICES[net]
        for source in (backbone or {}, state):
            for key, value in source.items():
                if key.startswith("features."):  # torchvision layout -> slice layout
                    index = int(key.split(".")[1])
                    for k in range(5):
                        if bounds[k] <= index < bounds[k + 1]:
                            merged[f"net.slice{k + 1}.{key.removeprefix('features.')}"] = value
                elif key.startswith(("net.", "lin")) and not key.startswith("lins."):
                    merged[key] = value  # lpips' `lins` list repeats lin0..lin4
        merged.setdefault("shift", self.shift)
        merged.setdefault("scale", self.scale)
        if not any(k.startswith("net.") for k in merged):
            raise MetricUnavailable(
                "LPIPS unavailable: the weight file holds only the linear layers; give the torchvision "
                f"{'alexnet' if net == 'alex' else 'vgg16'} ImageNet weights as backbone_path "
                "(or $HYPERSET_LPIPS_BACKBONE)"
            )
        _load_exact(self, merged, "LPIPS weights")

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Distance per image pair (N,) for images (N, 3, H, W) in [0, 1]."""
        _check_pair(x, y)
        fx = self.net((2 * _float(x) - 1 - self.shift) / self.scale)
        fy = self.net((2 * _float(y) - 1 - self.shift) / self.scale)
        total = torch.zeros(x.shape[0], device=x.device, dtype=fx[0].dtype)
        for k, (a, b) in enumerate(zip(fx, fy)):
            a = a / (a.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
            b = b / (b.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
            total = total + getattr(self, f"lin{k}")((a - b) ** 2).mean(dim=(1, 2, 3))
        return total


@functools.lru_cache(maxsize=2)
def _cached_lpips(path: str, net: str, backbone: str | None) -> LPIPS:
    return LPIPS(path, net, backbone)


def compute_lpips(
    x: torch.Tensor,
    y: torch.Tensor,
    weights_path: str | os.PathLike | None = None,
    net: str = "alex",
    backbone_path: str | os.PathLike | None = None,
) -> tuple[torch.Tensor | None, str]:
    """(LPIPS per image, "") for images in [0, 1], or (None, reason) when the weights are not available."""
    reason = metric_unavailable("lpips", weights_path, backbone_path)
    if reason:
        return None, reason
    path, backbone = _resolve(weights_path, "lpips"), _resolve(backbone_path, "lpips_backbone")
    try:
        model = _cached_lpips(str(path), net, None if backbone is None else str(backbone))
    except MetricUnavailable as e:
        return None, str(e)
    model = model.to(x.device)
    with torch.no_grad():
        return model(x, y), ""


# ----------------------------------------------------------------------------------------------------
# FID: Inception-v3 pool features (pytorch-fid layout) and the Fréchet distance


class _BasicConv2d(nn.Module):
    def __init__(
        self, cin: int, cout: int, kernel: int | tuple[int, int], **kw: int | tuple[int, int]
    ) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, bias=False, **kw)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


def _avg3(x: torch.Tensor) -> torch.Tensor:
    # FID Inception (a TF graph port) averages over valid pixels only at the borders.
    return F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)


class _InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = _BasicConv2d(cin, 64, 1)
        self.branch5x5_1 = _BasicConv2d(cin, 48, 1)
        self.branch5x5_2 = _BasicConv2d(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = _BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = _BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = _BasicConv2d(96, 96, 3, padding=1)
        self.branch_pool = _BasicConv2d(cin, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b1, b5, b3, self.branch_pool(_avg3(x))], 1)


class _InceptionB(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3 = _BasicConv2d(cin, 384, 3, stride=2)
        self.branch3x3dbl_1 = _BasicConv2d(cin, 64, 1)
        self.branch3x3dbl_2 = _BasicConv2d(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = _BasicConv2d(96, 96, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b3, bd, F.max_pool2d(x, 3, stride=2)], 1)


class _InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = _BasicConv2d(cin, 192, 1)
        self.branch7x7_1 = _BasicConv2d(cin, c7, 1)
        self.branch7x7_2 = _BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = _BasicConv2d(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = _BasicConv2d(cin, c7, 1)
        self.branch7x7dbl_2 = _BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = _BasicConv2d(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = _BasicConv2d(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = _BasicConv2d(c7, 192, (1, 7), padding=(0, 3))
        self.branch_pool = _BasicConv2d(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        for layer in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            bd = layer(bd)
        return torch.cat([b1, b7, bd, self.branch_pool(_avg3(x))], 1)


class _InceptionD(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.branch3x3_1 = _BasicConv2d(cin, 192, 1)
        self.branch3x3_2 = _BasicConv2d(192, 320, 3, stride=2)
        self.branch7x7x3_1 = _BasicConv2d(cin, 192, 1)
        self.branch7x7x3_2 = _BasicConv2d(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = _BasicConv2d(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = _BasicConv2d(192, 192, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        return torch.cat([b3, b7, F.max_pool2d(x, 3, stride=2)], 1)


class _InceptionE(nn.Module):
    """Last blocks; the FID network pools with an average in Mixed_7b and a max in Mixed_7c."""

    def __init__(self, cin: int, pool: str) -> None:
        super().__init__()
        self.pool = pool
        self.branch1x1 = _BasicConv2d(cin, 320, 1)
        self.branch3x3_1 = _BasicConv2d(cin, 384, 1)
        self.branch3x3_2a = _BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = _BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = _BasicConv2d(cin, 448, 1)
        self.branch3x3dbl_2 = _BasicConv2d(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = _BasicConv2d(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = _BasicConv2d(384, 384, (3, 1), padding=(1, 0))
        self.branch_pool = _BasicConv2d(cin, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        pooled = _avg3(x) if self.pool == "avg" else F.max_pool2d(x, 3, stride=1, padding=1)
        return torch.cat([b1, b3, bd, self.branch_pool(pooled)], 1)


# pytorch-fid's InceptionV3 wraps the same layers in ``blocks``; its keys are mapped to these names on load.
_FID_BLOCKS = {
    "blocks.0.0": "Conv2d_1a_3x3", "blocks.0.1": "Conv2d_2a_3x3", "blocks.0.2": "Conv2d_2b_3x3",
    "blocks.1.0": "Conv2d_3b_1x1", "blocks.1.1": "Conv2d_4a_3x3",
    "blocks.2.0": "Mixed_5b", "blocks.2.1": "Mixed_5c", "blocks.2.2": "Mixed_5d", "blocks.2.3": "Mixed_6a",
    "blocks.2.4": "Mixed_6b", "blocks.2.5": "Mixed_6c", "blocks.2.6": "Mixed_6d", "blocks.2.7": "Mixed_6e",
    "blocks.3.0": "Mixed_7a", "blocks.3.1": "Mixed_7b", "blocks.3.2": "Mixed_7c",
}


def resize_bilinear_tf1(x: torch.Tensor, size: int) -> torch.Tensor:
    """TensorFlow 1 ``resize_bilinear`` (align_corners=False, no half-pixel centres): output pixel i samples
    the input at i * in/out. This is the resize of the TF FID code, torch-fidelity and torchmetrics."""
    for dim in (2, 3):
        n_in = x.shape[dim]
        src = torch.arange(size, dtype=torch.float64, device=x.device) * (n_in / size)
        i0 = src.floor().long().clamp(max=n_in - 1)
        i1 = (i0 + 1).clamp(max=n_in - 1)
        shape = [1, 1, 1, 1]
        shape[dim] = size
        frac = (src - i0).to(x.dtype).view(shape)
        x = x.index_select(dim, i0) * (1 - frac) + x.index_select(dim, i1) * frac
    return x


FID_PREPROCESS = ("torch-fidelity", "pytorch-fid", "none")


class InceptionV3Features(nn.Module):
    """Inception-v3 as used for FID (the TF 2015-12-05 graph, as ported by pytorch-fid and torch-fidelity).

    Input: images (N, 3, H, W) in [0, 1]; output: the 2048-d average-pool features. ``preprocess``:
    * "torch-fidelity" (default; torchmetrics' FID, which the authors' evaluation used): quantize to uint8
      by truncation (``(x * 255).byte()``, as torchmetrics does), TF1 bilinear resize to 299, (u - 128) / 128;
    * "pytorch-fid": bilinear ``F.interpolate`` to 299 (align_corners=False), then 2x - 1;
    * "none": no resize (the input must already be at least 75 px), then 2x - 1.
    The two resizes give slightly different features, hence slightly different FIDs. Module names follow
    torchvision (``Conv2d_1a_3x3`` ... ``Mixed_7c``), the layout of pytorch-fid's ``pt_inception-2015-12-05``
    and torch-fidelity's ``weights-inception-2015-12-05`` files; their ``fc`` / ``AuxLogits`` are ignored.
    """

    def __init__(self, preprocess: str = "torch-fidelity") -> None:
        super().__init__()
        if preprocess not in FID_PREPROCESS:
            raise ValueError(f"preprocess must be one of {FID_PREPROCESS}, not {preprocess!r}")
        self.preprocess = preprocess
        self.Conv2d_1a_3x3 = _BasicConv2d(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = _BasicConv2d(32, 32, 3)
        self.Conv2d_2b_3x3 = _BasicConv2d(32, 64, 3, padding=1)
        self.Conv2d_3b_1x1 = _BasicConv2d(64, 80, 1)
        self.Conv2d_4a_3x3 = _BasicConv2d(80, 192, 3)
        self.Mixed_5b = _InceptionA(192, 32)
        self.Mixed_5c = _InceptionA(256, 64)
        self.Mixed_5d = _InceptionA(288, 64)
        self.Mixed_6a = _InceptionB(288)
        self.Mixed_6b = _InceptionC(768, 128)
        self.Mixed_6c = _InceptionC(768, 160)
        self.Mixed_6d = _InceptionC(768, 160)
        self.Mixed_6e = _InceptionC(768, 192)
        self.Mixed_7a = _InceptionD(768)
        self.Mixed_7b = _InceptionE(1280, "avg")
        self.Mixed_7c = _InceptionE(2048, "max")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _float(x)
        if self.preprocess == "torch-fidelity":
            x = (x.clamp(0, 1) * 255).to(torch.uint8).float()
            x = (resize_bilinear_tf1(x, 299) - 128) / 128
        elif self.preprocess == "pytorch-fid":
            x = 2 * F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False) - 1
        else:
            x = 2 * x - 1
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))  # (N, 64, 147, 147)
        x = F.max_pool2d(x, 3, stride=2)
        x = F.max_pool2d(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)), 3, stride=2)  # (N, 192, 35, 35)
        for name in ("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c"):
            x = getattr(self, f"Mixed_{name}")(x)  # ends (N, 2048, 8, 8)
        return x.mean(dim=(2, 3))

    @classmethod
    def from_file(cls, path: str | os.PathLike, preprocess: str = "torch-fidelity") -> InceptionV3Features:
        """Load FID Inception weights (torchvision-style or pytorch-fid ``blocks.*`` names) from a file."""
        state = {}
        for key, value in load_state_dict(path).items():
            for old, new in _FID_BLOCKS.items():
                if key.startswith(old + "."):
                    key = new + key[len(old):]
                    break
            if not key.startswith(("fc.", "AuxLogits.")) and "num_batches_tracked" not in key:
                state[key] = value
        with torch.device("meta"):  # no random initialization: every tensor is taken from the file
            model = cls(preprocess)
        for key in model.state_dict():
            if key.endswith("num_batches_tracked"):
                state[key] = torch.zeros((), dtype=torch.long)
        _load_exact(model, state, str(path), assign=True)
        return model.eval().requires_grad_(False)


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

    Features come from ``feature_extractor`` (any callable (N, 3, H, W) in [0, 1] -> (N, D)) or, by default,
    the FID Inception-v3 loaded from ``weights_path`` / $HYPERSET_FID_WEIGHTS (``MetricUnavailable`` when
    absent) with ``preprocess`` (see ``InceptionV3Features``). Statistics accumulate in float64 sums, so
    memory does not grow with the number of images.
    """

    def __init__(
        self,
        weights_path: str | os.PathLike | None = None,
        feature_extractor: Callable[[torch.Tensor], torch.Tensor] | None = None,
        device: str | torch.device = "cpu",
        preprocess: str = "torch-fidelity",
    ) -> None:
        if feature_extractor is None:
            reason = metric_unavailable("fid", weights_path)
            if reason:
                raise MetricUnavailable(reason)
            path = _resolve(weights_path, "fid")
            assert path is not None
            feature_extractor = InceptionV3Features.from_file(path, preprocess).to(device)
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


def compute_fid(
    real: Iterable[torch.Tensor],
    fake: Iterable[torch.Tensor],
    weights_path: str | os.PathLike | None = None,
    feature_extractor: Callable[[torch.Tensor], torch.Tensor] | None = None,
    device: str | torch.device = "cpu",
    preprocess: str = "torch-fidelity",
) -> tuple[float | None, str]:
    """(FID, "") between two streams of image batches in [0, 1], or (None, reason) without the weights."""
    if feature_extractor is None:
        reason = metric_unavailable("fid", weights_path)
        if reason:
            return None, reason
    fid = FID(weights_path, feature_extractor, device, preprocess)
    for batch in real:
        fid.update(batch, real=True)
    for batch in fake:
        fid.update(batch, real=False)
    value = fid.compute()
    return (value, "") if math.isfinite(value) else (None, "FID is not finite (degenerate features)")
