"""Compact VQ-VAE image tokenizer for CIFAR-10: 32x32 RGB images <-> 8x8 grids of discrete codes.

The paper's masked image modelling runs on a frozen VQGAN over ImageNet (see ``vqgan.py``). For CIFAR-10 this
project trains its own small tokenizer: two stride-2 conv stages (32 -> 16 -> 8), residual blocks, a vector
quantizer with an EMA-updated codebook and dead-code restart, and a mirrored decoder.

Codebook size: 512 codes of dimension 64. 64 tokens x 9 bits = 576 bits per image is enough to reach a
reconstruction PSNR in the mid-20s dB on CIFAR-10, while a token model over 64 positions still sees every
code often (50k images x 64 tokens / 512 codes ~ 6k occurrences per code per epoch), so it can learn all of
them. Larger codebooks (1-8k) buy little PSNR at this grid size and mostly add rare codes the token model
cannot learn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class VQConfig:
    """Tokenizer hyper-parameters (plain data; ``dataclasses.asdict`` gives a JSON-serialisable dict).

    Args:
        in_channels: image channels.
        hidden: channels of the 8x8 trunk (the first stride-2 stage uses ``hidden // 2``).
        num_res_blocks: residual blocks in the encoder trunk and in the decoder trunk.
        num_downsamples: stride-2 stages; 2 turns 32x32 images into 8x8 code grids.
        codebook_size: number of codes K.
        code_dim: dimension of each code vector.
        beta: commitment loss weight.
        ema: update the codebook by exponential moving averages (k-means style) instead of a gradient loss.
        decay: EMA decay of code counts and code sums.
        eps: Laplace smoothing of the EMA counts.
        restart_after: a code unused for this many training steps is re-initialised from an encoder output.
    """

    in_channels: int = 3
    hidden: int = 128
    num_res_blocks: int = 2
    num_downsamples: int = 2
    codebook_size: int = 512
    code_dim: int = 64
    beta: float = 0.25
    ema: bool = True
    decay: float = 0.99
    eps: float = 1e-5
    restart_after: int = 100


class ResBlock(nn.Module):
    """x + conv1x1(relu(conv3x3(relu(x)))), the VQ-VAE residual block."""

    def __init__(self, ch: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(ch, ch // 2, 3, padding=1)
        self.conv2 = nn.Conv2d(ch // 2, ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv2(F.relu(self.conv1(F.relu(x))))


class Encoder(nn.Module):
    """Images in [-1, 1] (B, C, H, W) -> continuous latents (B, code_dim, H/2^n, W/2^n)."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        ch_in = cfg.in_channels
        for i in range(cfg.num_downsamples):
            ch_out = cfg.hidden if i == cfg.num_downsamples - 1 else cfg.hidden // 2
            layers += [nn.Conv2d(ch_in, ch_out, 4, stride=2, padding=1), nn.ReLU()]
            ch_in = ch_out
        layers.append(nn.Conv2d(ch_in, cfg.hidden, 3, padding=1))
        layers += [ResBlock(cfg.hidden) for _ in range(cfg.num_res_blocks)]
        layers += [nn.ReLU(), nn.Conv2d(cfg.hidden, cfg.code_dim, 1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class Decoder(nn.Module):
    """Quantized latents (B, code_dim, h, w) -> images in [-1, 1] (unclamped), mirroring the encoder."""

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(cfg.code_dim, cfg.hidden, 3, padding=1)]
        layers += [ResBlock(cfg.hidden) for _ in range(cfg.num_res_blocks)]
        layers.append(nn.ReLU())
        ch_in = cfg.hidden
        for i in range(cfg.num_downsamples):
            last = i == cfg.num_downsamples - 1
            ch_out = cfg.in_channels if last else cfg.hidden // 2
            layers.append(nn.ConvTranspose2d(ch_in, ch_out, 4, stride=2, padding=1))
            if not last:
                layers.append(nn.ReLU())
            ch_in = ch_out
        self.net = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z)


class VectorQuantizer(nn.Module):
    """Nearest-code quantizer with straight-through gradients, EMA codebook and dead-code restart.

    Buffers: ``cluster_size`` (K,) and ``embed_avg`` (K, D) are the EMA statistics; ``unused_steps`` (K,)
    counts training steps since each code was last chosen; ``initialized`` marks that the codebook was seeded
    from the first training batch of encoder outputs (random init would leave most codes far from the data).
    """

    def __init__(self, cfg: VQConfig) -> None:
        super().__init__()
        self.cfg = cfg
        k, d = cfg.codebook_size, cfg.code_dim
        self.embedding = nn.Embedding(k, d)
        nn.init.uniform_(self.embedding.weight, -1.0 / k, 1.0 / k)
        self.embedding.weight.requires_grad_(not cfg.ema)
        self.register_buffer("cluster_size", torch.zeros(k))
        self.register_buffer("embed_avg", self.embedding.weight.detach().clone())
        self.register_buffer("unused_steps", torch.zeros(k, dtype=torch.long))
        self.register_buffer("initialized", torch.tensor(False))

    def nearest(self, z: Tensor) -> Tensor:
        """Index of the nearest code (squared L2) for each row of z (M, D) -> (M,)."""
        w = self.embedding.weight
        dist = z.pow(2).sum(1, keepdim=True) - 2 * z @ w.t() + w.pow(2).sum(1)[None]
        return dist.argmin(1)

    def forward(self, z: Tensor) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """z (B, D, h, w) -> (z_q with straight-through gradient, losses, codes (B, h, w))."""
        b, d, h, w = z.shape
        flat = z.permute(0, 2, 3, 1).reshape(-1, d)  # (B*h*w, D)
        if self.training and not bool(self.initialized):
            self._seed_from(flat.detach())
        codes = self.nearest(flat.detach())
        z_q = self.embedding(codes)
        if self.training:
            self._update(flat.detach(), codes)
            if self.cfg.ema:
                z_q = self.embedding(codes)  # use the codebook after this step's EMA update
        commit = self.cfg.beta * F.mse_loss(flat, z_q.detach())
        codebook = z.new_zeros(()) if self.cfg.ema else F.mse_loss(z_q, flat.detach())
        counts = torch.bincount(codes, minlength=self.cfg.codebook_size).float()
        p = counts / counts.sum()
        perplexity = torch.exp(-(p * torch.log(p + 1e-10)).sum())
        z_q = flat + (z_q - flat).detach()  # straight-through estimator
        z_q = z_q.view(b, h, w, d).permute(0, 3, 1, 2).contiguous()
        losses = {"commit": commit, "codebook": codebook, "perplexity": perplexity.detach()}
        return z_q, losses, codes.view(b, h, w)

    @torch.no_grad()
    def _seed_from(self, flat: Tensor) -> None:
        self.embedding.weight.copy_(_sample_rows(flat, self.cfg.codebook_size))
        self.embed_avg.copy_(self.embedding.weight)
        self.cluster_size.fill_(1.0)
        self.initialized.fill_(True)

    @torch.no_grad()
    def _update(self, flat: Tensor, codes: Tensor) -> None:
        k = self.cfg.codebook_size
        counts = torch.bincount(codes, minlength=k).to(flat.dtype)
        if self.cfg.ema:
            sums = torch.zeros_like(self.embed_avg).index_add_(0, codes, flat)
            self.cluster_size.mul_(self.cfg.decay).add_(counts, alpha=1 - self.cfg.decay)
            self.embed_avg.mul_(self.cfg.decay).add_(sums, alpha=1 - self.cfg.decay)
            n = self.cluster_size.sum()
            smoothed = (self.cluster_size + self.cfg.eps) / (n + k * self.cfg.eps) * n
            self.embedding.weight.copy_(self.embed_avg / smoothed[:, None])
        self.unused_steps.add_(1).masked_fill_(counts > 0, 0)
        self.restart_dead_codes(flat)

    @torch.no_grad()
    def restart_dead_codes(self, flat: Tensor) -> int:
        """Re-initialise codes unused for ``restart_after`` steps from encoder outputs; return how many."""
        dead = (self.unused_steps >= self.cfg.restart_after).nonzero().squeeze(1)
        if dead.numel() == 0:
            return 0
        new = _sample_rows(flat, dead.numel())
        self.embedding.weight[dead] = new
        self.embed_avg[dead] = new
        self.cluster_size[dead] = 1.0
        self.unused_steps[dead] = 0
        return int(dead.numel())


def _sample_rows(flat: Tensor, n: int) -> Tensor:
    """n random rows of flat (M, D); with replacement plus a little noise when M < n."""
    m = flat.shape[0]
    if m >= n:
        return flat[torch.randperm(m, device=flat.device)[:n]].clone()
    rows = flat[torch.randint(m, (n,), device=flat.device)]
    return rows + 0.01 * flat.std() * torch.randn_like(rows)


class VQTokenizer(nn.Module):
    """VQ-VAE tokenizer. Images are float NCHW in [0, 1]; they are mapped to [-1, 1] internally."""

    def __init__(self, cfg: VQConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or VQConfig()
        self.encoder = Encoder(self.cfg)
        self.quantize = VectorQuantizer(self.cfg)
        self.decoder = Decoder(self.cfg)

    @property
    def num_codes(self) -> int:
        """Codebook size K (token values are 0..K-1)."""
        return self.cfg.codebook_size

    def forward(self, images: Tensor) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """images (B, C, H, W) in [0, 1] -> (recon in [0, 1], losses, codes (B, h, w)).

        ``losses["total"]`` = recon MSE (in [-1, 1] space) + commitment (+ codebook loss when ``ema`` is off);
        ``losses["perplexity"]`` is a detached usage statistic, not part of the total.
        """
        x = images * 2 - 1
        z_q, losses, codes = self.quantize(self.encoder(x))
        out = self.decoder(z_q)
        recon = F.mse_loss(out, x)
        losses["recon"] = recon
        losses["total"] = recon + losses["commit"] + losses["codebook"]
        return ((out + 1) / 2).clamp(0, 1), losses, codes

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) in [0, 1] -> codes (B, h, w) long."""
        z = self.encoder(images * 2 - 1)
        b, d, h, w = z.shape
        return self.quantize.nearest(z.permute(0, 2, 3, 1).reshape(-1, d)).view(b, h, w)

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """codes (B, h, w) long -> images (B, C, H, W) in [0, 1]."""
        return self.decode_latents(self.quantize.embedding(codes).permute(0, 3, 1, 2))  # (B, D, h, w)

    @torch.no_grad()
    def decode_latents(self, latents: Tensor) -> Tensor:
        """latents (B, code_dim, h, w) -> images (B, C, H, W) in [0, 1]: the decoder on any latent grid, not only
        on codebook vectors (e.g. the expected code embedding under a token model's predicted distribution)."""
        return ((self.decoder(latents) + 1) / 2).clamp(0, 1)

    def codebook_usage(self, codes: Tensor) -> float:
        """Fraction of the K codes that occur at least once in ``codes``."""
        return torch.unique(codes).numel() / self.cfg.codebook_size
