"""Taming-Transformers VQGAN (``vqgan_imagenet_f16_1024``), the frozen tokenizer of MaskGIT-pytorch v1.

Written from the architecture description, with the original parameter names
(``encoder.down.0.block.0.norm1``, ``encoder.down.4.attn.0.q``, ``encoder.mid.block_1``, ``quant_conv``,
``quantize.embedding``, ``post_quant_conv``, ``decoder.up.4.attn.2`` ...) so that a user's ``last.ckpt``
loads with :func:`load_vqgan`.
256x256 images in [0, 1] map to 16x16 codes from a 1024 x 256 codebook and back.
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import FLOAT_DTYPES, stored_header
from ..checkpoint import CheckpointError as FileError


@dataclass
class VQGANConfig:
    """``model.params`` of the taming config (defaults: ``vqgan_imagenet_f16_1024``)."""

    embed_dim: int = 256
    n_embed: int = 1024
    z_channels: int = 256
    resolution: int = 256
    in_channels: int = 3
    out_ch: int = 3
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 1, 2, 2, 4)
    num_res_blocks: int = 2
    attn_resolutions: tuple[int, ...] = (16,)
    dropout: float = 0.0
    beta: float = 0.25

    @property
    def grid(self) -> int:
        """Side of the code grid (resolution / 2^(levels - 1))."""
        return self.resolution // 2 ** (len(self.ch_mult) - 1)


def normalize(ch: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, ch, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    """norm-swish-conv3x3 twice plus a skip (1x1 ``nin_shortcut`` when channels change); no timestep input."""

    def __init__(self, ch_in: int, ch_out: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = normalize(ch_in)
        self.conv1 = nn.Conv2d(ch_in, ch_out, 3, padding=1)
        self.norm2 = normalize(ch_out)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(ch_out, ch_out, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(ch_in, ch_out, 1) if ch_in != ch_out else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return h + (x if self.nin_shortcut is None else self.nin_shortcut(x))


class AttnBlock(nn.Module):
    """Single-head spatial self-attention with 1x1 conv projections and a residual."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.norm = normalize(ch)
        self.q = nn.Conv2d(ch, ch, 1)
        self.k = nn.Conv2d(ch, ch, 1)
        self.v = nn.Conv2d(ch, ch, 1)
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (p(y).reshape(b, 1, c, h * w).transpose(2, 3) for p in (self.q, self.k, self.v))  # B,1,HW,C
        out = F.scaled_dot_product_attention(q, k, v)  # softmax(q k^T / sqrt(C)) v
        return x + self.proj_out(out.transpose(2, 3).reshape(b, c, h, w))


class Downsample(nn.Module):
    """Zero-pad right and bottom by one, then conv3x3 stride 2 without padding (taming's asymmetric pad)."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=0)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest x2, then conv3x3."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Mid(nn.Module):
    """Res -> Attn -> Res at the lowest resolution."""

    def __init__(self, ch: int, dropout: float) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(ch, ch, dropout)
        self.attn_1 = AttnBlock(ch)
        self.block_2 = ResnetBlock(ch, ch, dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Level(nn.Module):
    """One resolution level: ``block`` (res blocks), ``attn`` (one per block or none), optional resampler."""

    def __init__(self, chans: list[tuple[int, int]], attn: bool, dropout: float) -> None:
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(i, o, dropout) for i, o in chans)
        self.attn = nn.ModuleList(AttnBlock(o) for _, o in chans) if attn else nn.ModuleList()

    def forward(self, x: Tensor) -> Tensor:
        for i, blk in enumerate(self.block):
            x = blk(x)
            if len(self.attn) > 0:
                x = self.attn[i](x)
        return x


class Encoder(nn.Module):
    """Images in [-1, 1] (B, 3, R, R) -> z (B, z_channels, R/f, R/f), f = 2^(levels - 1)."""

    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        n = len(cfg.ch_mult)
        self.conv_in = nn.Conv2d(cfg.in_channels, cfg.ch, 3, padding=1)
        self.down = nn.ModuleList()
        res, ch_in = cfg.resolution, cfg.ch
        for i, mult in enumerate(cfg.ch_mult):
            ch_out = cfg.ch * mult
            chans = [(ch_in if j == 0 else ch_out, ch_out) for j in range(cfg.num_res_blocks)]
            level = Level(chans, res in cfg.attn_resolutions, cfg.dropout)
            if i != n - 1:
                level.downsample = Downsample(ch_out)
                res //= 2
            self.down.append(level)
            ch_in = ch_out
        self.mid = Mid(ch_in, cfg.dropout)
        self.norm_out = normalize(ch_in)
        self.conv_out = nn.Conv2d(ch_in, cfg.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
        h = self.mid(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    """z (B, z_channels, r, r) -> images in [-1, 1] (unclamped); built top-down, ``up[i]`` is level i."""

    def __init__(self, cfg: VQGANConfig) -> None:
        super().__init__()
        n = len(cfg.ch_mult)
        ch_in = cfg.ch * cfg.ch_mult[-1]
        res = cfg.grid
        self.conv_in = nn.Conv2d(cfg.z_channels, ch_in, 3, padding=1)
        self.mid = Mid(ch_in, cfg.dropout)
        levels: list[Level] = []
        for i in reversed(range(n)):
            ch_out = cfg.ch * cfg.ch_mult[i]
            chans = [(ch_in if j == 0 else ch_out, ch_out) for j in range(cfg.num_res_blocks + 1)]
            level = Level(chans, res in cfg.attn_resolutions, cfg.dropout)
            if i != 0:
                level.upsample = Upsample(ch_out)
                res *= 2
            levels.insert(0, level)
            ch_in = ch_out
        self.up = nn.ModuleList(levels)
        self.norm_out = normalize(ch_in)
        self.conv_out = nn.Conv2d(ch_in, cfg.out_ch, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class VectorQuantizer2(nn.Module):
    """Nearest code by squared L2 over ``embedding`` (n_embed, embed_dim); taming's legacy loss, beta 0.25."""

    def __init__(self, n_embed: int, embed_dim: int, beta: float) -> None:
        super().__init__()
        self.beta = beta
        self.embedding = nn.Embedding(n_embed, embed_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / n_embed, 1.0 / n_embed)

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """z (B, D, h, w) -> (z_q straight-through, loss, codes (B, h, w))."""
        b, d, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)
        e = self.embedding.weight
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ e.t() + e.pow(2).sum(1)[None]
        codes = dist.argmin(1)
        z_q = self.embedding(codes)
        loss = F.mse_loss(z_q.detach(), flat) + self.beta * F.mse_loss(z_q, flat.detach())
        z_q = flat + (z_q - flat).detach()
        return z_q.view(b, h, w, d).permute(0, 3, 1, 2).contiguous(), loss, codes.view(b, h, w)


class VQGAN(nn.Module):
    """Taming VQModel without its training loss: encoder, quant_conv, quantize, post_quant_conv, decoder."""

    def __init__(self, cfg: VQGANConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or VQGANConfig()
        c = self.cfg
        self.encoder = Encoder(c)
        self.decoder = Decoder(c)
        self.quantize = VectorQuantizer2(c.n_embed, c.embed_dim, c.beta)
        self.quant_conv = nn.Conv2d(c.z_channels, c.embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(c.embed_dim, c.z_channels, 1)

    @property
    def num_codes(self) -> int:
        """Codebook size (token values are 0..n_embed-1)."""
        return self.cfg.n_embed

    def forward(self, images: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """images [0, 1] (B, 3, R, R) -> (recon [0, 1], quantizer loss, codes (B, r, r))."""
        z_q, loss, codes = self.quantize(self.quant_conv(self.encoder(images * 2 - 1)))
        out = self.decoder(self.post_quant_conv(z_q))
        return ((out + 1) / 2).clamp(0, 1), loss, codes

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """images [0, 1] (B, 3, R, R) -> codes (B, r, r) long (16x16 at 256 px)."""
        return self.quantize(self.quant_conv(self.encoder(images * 2 - 1)))[2]

    @torch.no_grad()
    def decode_code(self, codes: Tensor) -> Tensor:
        """codes (B, r, r) long -> images [0, 1] (B, 3, R, R)."""
        return self.decode_latents(self.quantize.embedding(codes).permute(0, 3, 1, 2))  # (B, embed_dim, r, r)

    @torch.no_grad()
    def decode_latents(self, latents: Tensor) -> Tensor:
        """latents (B, embed_dim, r, r) in the codebook's space -> images [0, 1] (B, 3, R, R): post_quant_conv,
        then the decoder, as ``decode_code`` does for codebook vectors; any latent grid works (e.g. the expected
        code embedding under a token model's predicted distribution)."""
        out = self.decoder(self.post_quant_conv(latents))
        return ((out + 1) / 2).clamp(0, 1)


class CheckpointError(ValueError):
    """A VQGAN checkpoint that cannot be loaded safely or does not match the model."""


_CONVERT_HINT = (
    "convert it once in a trusted environment: "
    "sd = torch.load(path, map_location='cpu', weights_only=False)['state_dict']; "
    "torch.save({'state_dict': sd}, 'vqgan_tensors.ckpt') "
    "(or safetensors.torch.save_file({k: v.contiguous() for k, v in sd.items()}, 'vqgan.safetensors'))"
)


def _safetensors_header(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Name -> (shape, safetensors dtype) from the header of a .safetensors file alone (no tensor is read)."""
    try:
        return stored_header(path, "VQGAN weights")
    except FileError as err:
        raise CheckpointError(str(err)) from None


def _read_safetensors(path: Path, names: list[str]) -> dict[str, Tensor]:
    """The tensors `names` of a .safetensors file whose header was checked (nothing else in it is read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in names}
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors file ({_first_line(err)})") from err


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    """The tensors of a .ckpt/.pth/.pt file, unpickled with torch's weights-only unpickler; a file in the zip format
    (torch >= 1.6) is memory-mapped, so that its tensors are read only when copied into the model."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as err:
        if "unsupported global" not in str(err).lower():  # not the refusal of a Python object: a damaged file
            raise CheckpointError(f"{path} is not a PyTorch checkpoint ({_unpickling_reason(err)})") from err
        raise CheckpointError(
            f"{path} holds Python objects besides tensors and would need full unpickling, which can run "
            f"arbitrary code; refusing. To use it, {_CONVERT_HINT}"
        ) from err
    except Exception as err:  # truncated or foreign files fail in many ways inside torch.load
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ({_first_line(err)})") from err
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} is not a VQGAN state dict (tensors, optionally under 'state_dict')")
    return obj


def _unpickling_reason(err: Exception) -> str:
    """What torch's weights-only unpickler objected to (its message wraps that in advice about weights_only)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error" in line:
            rest = line.split("WeightsUnpickler error:", 1)[-1].strip()
            return rest or (lines[i + 1] if i + 1 < len(lines) else "unreadable")
    return _first_line(err) if lines and "weights only" not in lines[0].lower() else "unreadable"


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


def _short(keys: list[str], limit: int = 12) -> str:
    more = f" ... (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return "[" + ", ".join(keys[:limit]) + "]" + more


def load_vqgan(path: str | Path, cfg: VQGANConfig | None = None) -> VQGAN:
    """Load a taming VQGAN checkpoint (Lightning ``.ckpt``/``.pth`` with tensors only, or ``.safetensors``).

    Keys under ``loss.`` (LPIPS, discriminator) are ignored; every other key must match the model exactly.
    Returns the model in eval mode.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"VQGAN checkpoint not found: {path}")
    with torch.device("meta"):  # names and shapes only: nothing is allocated before the file is checked
        shapes = VQGAN(cfg)
    expected = {k: tuple(v.shape) for k, v in shapes.state_dict().items()}
    if path.suffix == ".safetensors":  # the header first; then only the model's tensors are read
        header = {k: v for k, v in _safetensors_header(path).items() if not k.startswith("loss.")}
        _check_fit(path, shapes.cfg, expected, {k: (shape, dtype in FLOAT_DTYPES) for k, (shape, dtype) in
                                                header.items()})
        sd = _read_safetensors(path, sorted(expected))
    else:
        sd = {k: v for k, v in _read_state_dict(path).items() if not k.startswith("loss.")}
        _check_fit(path, shapes.cfg, expected, {k: (tuple(v.shape), v.is_floating_point()) for k, v in sd.items()})
    model = VQGAN(cfg)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def _check_fit(path: Path, cfg: VQGANConfig, expected: dict[str, tuple[int, ...]],
               stored: dict[str, tuple[tuple[int, ...], bool]]) -> None:
    """The names, shapes and (floating or not) dtypes in the file (`stored`, the ignored keys left out) against
    the model's: a one-line CheckpointError for missing, unexpected, misshapen or integer tensors."""
    missing = sorted(set(expected) - set(stored))
    unexpected = sorted(set(stored) - set(expected))
    wrong = sorted(k for k in set(stored) & set(expected) if stored[k][0] != expected[k])
    integers = sorted(k for k in set(stored) & set(expected) if not stored[k][1])
    if missing or unexpected or wrong or integers:
        parts = [f"missing keys {_short(missing)}" if missing else "",
                 f"unexpected keys {_short(unexpected)}" if unexpected else "",
                 "shape mismatch " + _short([f"{k} {stored[k][0]} vs {expected[k]}" for k in wrong]) if wrong else "",
                 f"not floating-point {_short(integers)}" if integers else ""]
        detail = "; ".join(p for p in parts if p)
        raise CheckpointError(f"{path} does not match VQGAN({cfg}): {detail}")
