"""CIFAR-10 VQ-VAE tokenizer (hyperset.vision.vq)."""

import dataclasses
import json

import torch

from hyperset.vision.vq import VQConfig, VQTokenizer

SMALL = VQConfig(hidden=32, codebook_size=64, code_dim=16, restart_after=3)




def _images(n: int = 8, seed: int = 0) -> torch.Tensor:
    """Smooth synthetic 32x32 images: a colour gradient plus a coloured square."""
    g = torch.Generator().manual_seed(seed)
    lin = torch.linspace(0, 1, 32)
    slope, offset = torch.rand(n, 3, 1, 1, generator=g), 0.3 * torch.rand(n, 3, 1, 1, generator=g)
    base = slope * lin.view(1, 1, 1, 32) + offset
    out = base.expand(n, 3, 32, 32).clone()
    for i in range(n):
        y, x = torch.randint(0, 20, (2,), generator=g).tolist()
        out[i, :, y:y + 12, x:x + 12] = torch.rand(3, 1, 1, generator=g)
    return out.clamp(0, 1)


def test_config_is_json_serialisable_and_rebuilds_the_model():
    d = json.loads(json.dumps(dataclasses.asdict(SMALL)))
    assert VQConfig(**d) == SMALL
    assert VQTokenizer(VQConfig(**d)).num_codes == 64


def test_encode_decode_round_trip_shapes_and_ranges():
    torch.manual_seed(0)
    model = VQTokenizer(SMALL)
    x = _images(4)
    model.train()
    model(x)  # seeds the codebook from encoder outputs
    model.eval()
    codes = model.encode(x)
    assert codes.shape == (4, 8, 8) and codes.dtype == torch.long
    assert codes.min() >= 0 and codes.max() < 64
    images = model.decode(codes)
    assert images.shape == (4, 3, 32, 32)
    assert images.min() >= 0 and images.max() <= 1
    recon, losses, fcodes = model(x)
    assert torch.equal(fcodes, codes)
    assert torch.allclose(recon, images, atol=1e-6)
    assert {"total", "recon", "commit", "codebook", "perplexity"} <= set(losses)


def test_default_config_maps_cifar_images_to_an_8x8_grid_of_512_codes():
    model = VQTokenizer().eval()
    assert model.encode(torch.rand(2, 3, 32, 32)).shape == (2, 8, 8)
    assert model.num_codes == 512


def test_codebook_usage_is_the_fraction_of_codes_that_occur():
    model = VQTokenizer(SMALL)
    codes = torch.tensor([[[0, 1], [1, 5]], [[5, 5], [63, 0]]])
    assert model.codebook_usage(codes) == 4 / 64


def test_straight_through_gradient_reaches_the_encoder():
    torch.manual_seed(0)
    model = VQTokenizer(SMALL).train()
    _, losses, _ = model(_images(4))
    losses["recon"].backward()  # the reconstruction term depends on the encoder only through the STE
    grads = [p.grad for p in model.encoder.parameters()]
    assert all(g is not None for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0
    assert model.quantize.embedding.weight.grad is None  # EMA codebook: not trained by gradient


def test_gradient_codebook_mode_trains_the_codebook_by_its_loss():
    torch.manual_seed(0)
    model = VQTokenizer(dataclasses.replace(SMALL, ema=False)).train()
    _, losses, _ = model(_images(4))
    assert losses["codebook"] > 0
    losses["total"].backward()
    assert model.quantize.embedding.weight.grad.abs().sum() > 0


def test_dead_codes_are_restarted_from_encoder_outputs():
    torch.manual_seed(0)
    model = VQTokenizer(SMALL)
    vq = model.quantize
    flat = torch.randn(200, 16)
    vq.unused_steps[:10] = SMALL.restart_after
    before = vq.embedding.weight.detach().clone()
    assert vq.restart_dead_codes(flat) == 10
    after = vq.embedding.weight.detach()
    assert torch.equal(after[10:], before[10:])
    for row in after[:10]:
        assert (flat == row).all(1).any()  # each restarted code is one of the encoder outputs
    assert (vq.unused_steps[:10] == 0).all()


def test_training_steps_restart_codes_left_unused():
    torch.manual_seed(0)
    model = VQTokenizer(SMALL).train()
    vq = model.quantize
    restarted = []
    restart = vq.restart_dead_codes
    vq.restart_dead_codes = lambda flat: restarted.append(restart(flat)) or restarted[-1]
    x = torch.rand(1, 3, 16, 16)  # 4x4 = 16 latents for 64 codes: at least 48 codes go unused
    for _ in range(SMALL.restart_after + 1):
        model(x)
    assert restarted[:SMALL.restart_after - 1] == [0] * (SMALL.restart_after - 1)
    assert restarted[SMALL.restart_after - 1] >= 64 - 16
    assert (vq.unused_steps < SMALL.restart_after).all()  # nothing stays dead past the limit


def test_eval_forward_leaves_codebook_statistics_untouched():
    torch.manual_seed(0)
    model = VQTokenizer(SMALL).train()
    model(_images(4))
    model.eval()
    state = {k: v.clone() for k, v in model.quantize.state_dict().items()}
    model(_images(4, seed=1))
    for k, v in model.quantize.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_a_few_optimisation_steps_lower_the_reconstruction_loss():
    torch.manual_seed(0)
    model = VQTokenizer(SMALL).train()
    x = _images(16)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    history = []
    for _ in range(40):
        _, losses, codes = model(x)
        opt.zero_grad()
        losses["total"].backward()
        opt.step()
        history.append(losses["recon"].item())
    assert sum(history[-5:]) / 5 < 0.5 * sum(history[:3]) / 3
    assert model.codebook_usage(codes) > 0.2
