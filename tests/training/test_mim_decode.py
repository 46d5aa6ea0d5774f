"""Masked reconstruction by the expected code embedding (``reconstruct(decode="expected")``), against hand-computed
decodes on tiny untrained models (both tokenizer kinds), and the ``--decode`` option of ``hyperset-eval mim``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_mim import TINY_MODEL, TINY_VQ, write_cifar

from hyperset.checkpoint import save_module
from hyperset.config import preset_config
from hyperset.models import HyperSETModel, save_checkpoint
from hyperset.training.eval_mim import evaluate_reconstruction, mim_command
from hyperset.training.mim_task import load_images
from hyperset.vision.reconstruct import (
    TOKENIZER_KIND,
    MIMPipeline,
    Tokenizer,
    expected_latents,
    load_mim,
    step_size_stats,
)
from hyperset.vision.vq import VQConfig, VQTokenizer
from hyperset.vision.vqgan import VQGAN, VQGANConfig

TINY_VQGAN = VQGANConfig(embed_dim=8, n_embed=16, z_channels=32, resolution=16, ch=32, ch_mult=(1, 2),
                         num_res_blocks=1, attn_resolutions=(8,))


def _vq_pipeline() -> MIMPipeline:
    """A tiny VQ tokenizer with spread-out code vectors (so that different codes decode to visibly different
    pixels) and a tiny token model whose head is scaled up, so that its predicted distributions are far from
    uniform (a uniform one would hide a wrong weighting)."""
    torch.manual_seed(0)
    vq = VQTokenizer(VQConfig(**TINY_VQ)).eval()
    with torch.no_grad():
        vq.quantize.embedding.weight.normal_(0, 1.0)
    model = HyperSETModel(preset_config("mim-cpu", **TINY_MODEL))
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
    return MIMPipeline(Tokenizer(vq, TOKENIZER_KIND, 32), model)


def _vqgan_pipeline() -> MIMPipeline:
    torch.manual_seed(0)
    vqgan = VQGAN(TINY_VQGAN).eval()
    with torch.no_grad():
        vqgan.quantize.embedding.weight.normal_(0, 1.0)  # spread codes: random images use several of them
    k, grid = TINY_VQGAN.n_embed, TINY_VQGAN.grid
    model = HyperSETModel(preset_config("mim-cpu", **{**TINY_MODEL, "vocab_size": k + 1, "num_classes": k,
                                                      "seq_len": grid * grid}))
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(1))
    return MIMPipeline(Tokenizer(vqgan, "vqgan", TINY_VQGAN.resolution), model)


def _mask(b: int, grid: int, seed: int = 1) -> torch.Tensor:
    mask = torch.rand(b, grid, grid, generator=torch.Generator().manual_seed(seed)) < 0.4
    mask[:, 0, 0], mask[:, 0, 1] = True, False  # both kinds of position in every image
    return mask


def _hand_decode(pipe: MIMPipeline, images: torch.Tensor, mask: torch.Tensor, iters: int,
                 temperature: float = 1.0) -> torch.Tensor:
    """The expected decode written out: softmax(logits / T) @ codebook where masked, the own code vector elsewhere,
    then the tokenizer's decoder (the VQGAN's after its post_quant_conv) and [-1, 1] -> [0, 1]."""
    tok = pipe.tokenizer.model
    codes = pipe.encode(images)
    b, g = codes.shape[0], pipe.grid
    logits = pipe.model(codes.masked_fill(mask, pipe.mask_id).reshape(b, -1), iters=iters)
    book = tok.quantize.embedding.weight
    z = torch.where(mask.reshape(b, -1, 1), torch.softmax(logits / temperature, -1) @ book, book[codes.reshape(b, -1)])
    z = z.reshape(b, g, g, -1).permute(0, 3, 1, 2)
    if pipe.tokenizer.kind == "vqgan":
        z = tok.post_quant_conv(z)
    return ((tok.decoder(z) + 1) / 2).clamp(0, 1)


@torch.no_grad()
def test_expected_equals_the_hand_computed_softmax_codebook_decode():
    pipe = _vq_pipeline()
    images, mask = torch.rand(3, 3, 32, 32), _mask(3, 8)
    res = pipe.reconstruct(images, mask, iters=3, decode="expected")
    assert torch.allclose(res.images, _hand_decode(pipe, images, mask, 3), atol=1e-5)
    sharp = pipe.reconstruct(images, mask, iters=3, temperature=0.5, decode="expected")
    assert torch.allclose(sharp.images, _hand_decode(pipe, images, mask, 3, 0.5), atol=1e-5)
    assert not torch.allclose(sharp.images, res.images, atol=1e-3)  # the temperature is applied
    # what the result records: the argmax codes of that same forward pass, its energies and step sizes
    inputs = res.input_codes.masked_fill(mask, pipe.mask_id).reshape(3, -1)
    out = pipe.model.run(inputs, iters=3, trace=True)
    argmax = out.logits.argmax(-1).reshape(3, 8, 8)
    assert torch.equal(res.codes[mask], argmax[mask]) and torch.equal(res.codes[~mask], res.input_codes[~mask])
    assert res.energy["attn"] == pytest.approx(torch.stack(out.trace.energy["attn"], 1).mean(0).tolist())
    assert res.energy_per_image["ff"].shape == (3, 3) and res.step_sizes == step_size_stats(pipe.model, inputs, 3)
    assert (res.decode, res.steps, res.iters, res.temperature) == ("expected", 1, 3, 1.0)
    assert torch.allclose(res.tokenizer_images, pipe.decode(res.input_codes))
    sampled = pipe.reconstruct(images, mask, iters=3, generator=torch.Generator().manual_seed(0))
    assert sampled.decode == "maskgit" and sampled.steps == 24
    assert not torch.allclose(sampled.images, res.images, atol=1e-3)  # the other decoding, not MaskGIT's images


@torch.no_grad()
def test_unmasked_positions_use_the_images_own_codes():
    pipe = _vq_pipeline()
    book = pipe.tokenizer.codebook
    codes = torch.randint(0, pipe.mask_id, (2, 8, 8), generator=torch.Generator().manual_seed(2))
    mask = _mask(2, 8)
    logits = torch.randn(2, 64, pipe.mask_id, generator=torch.Generator().manual_seed(3))
    z = expected_latents(book, codes, mask, logits).permute(0, 2, 3, 1)  # (B, h, w, D)
    assert torch.equal(z[~mask], book[codes[~mask]])
    assert torch.allclose(z[mask], (torch.softmax(logits, -1) @ book).reshape(2, 8, 8, -1)[mask], atol=1e-6)
    other = logits.clone()
    other.reshape(2, 8, 8, -1)[~mask] = torch.randn_like(other.reshape(2, 8, 8, -1)[~mask]) * 10
    assert torch.equal(expected_latents(book, codes, mask, other), z.permute(0, 3, 1, 2))  # never read there
    wider = torch.cat([logits, torch.full((2, 64, 1), 50.0)], -1)  # a mask-id class: never part of the mean
    assert torch.allclose(expected_latents(book, codes, mask, wider), z.permute(0, 3, 1, 2), atol=1e-6)
    images = torch.rand(2, 3, 32, 32)
    nothing = pipe.reconstruct(images, torch.zeros(8, 8, dtype=torch.bool), decode="expected")
    assert torch.allclose(nothing.images, nothing.tokenizer_images, atol=1e-6)  # no mask: the tokenizer's decode
    assert torch.equal(nothing.codes, nothing.input_codes)


@pytest.mark.parametrize("make", [_vq_pipeline, _vqgan_pipeline], ids=["vq-tokenizer", "vqgan"])
@torch.no_grad()
def test_all_mass_on_one_code_decodes_that_code(make):
    pipe = make()
    size, grid = pipe.image_size, pipe.grid
    images, mask = torch.rand(2, 3, size, size), _mask(2, grid)
    code = 5
    pipe.model.head.weight.zero_()
    pipe.model.head.bias.zero_()
    pipe.model.head.bias[code] = 1e4  # softmax: exactly one-hot on `code` in float32
    res = pipe.reconstruct(images, mask, decode="expected")
    filled = res.input_codes.masked_fill(mask, code)
    assert torch.equal(res.codes, filled)
    assert torch.allclose(res.images, pipe.decode(filled), atol=1e-6)


@pytest.mark.parametrize("make", [_vq_pipeline, _vqgan_pipeline], ids=["vq-tokenizer", "vqgan"])
@torch.no_grad()
def test_decode_latents_of_code_vectors_is_decode_for_both_tokenizer_kinds(make):
    pipe = make()
    tok, size = pipe.tokenizer, pipe.image_size
    codes = tok.encode(torch.rand(2, 3, size, size))
    latents = tok.codebook[codes].permute(0, 3, 1, 2)
    assert torch.equal(tok.decode_latents(latents), tok.decode(codes))
    with pytest.raises(ValueError, match=r"latents must be \(B, "):
        tok.decode_latents(latents[:, :-1])
    images, mask = torch.rand(2, 3, size, size), _mask(2, pipe.grid)
    res = pipe.reconstruct(images, mask, iters=2, decode="expected")
    assert torch.allclose(res.images, _hand_decode(pipe, images, mask, 2), atol=1e-5)


@torch.no_grad()
def test_temperature_zero_decodes_the_argmax_codes():
    pipe = _vq_pipeline()
    images, mask = torch.rand(2, 3, 32, 32), _mask(2, 8)
    res = pipe.reconstruct(images, mask, temperature=0, decode="expected")
    assert torch.allclose(res.images, pipe.decode(res.codes), atol=1e-6)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
        pipe.reconstruct(images, mask, temperature=-1, decode="expected")


def test_unknown_decode_is_a_one_line_error_naming_the_choices():
    pipe = _vq_pipeline()
    with pytest.raises(ValueError) as err:
        pipe.reconstruct(torch.rand(1, 3, 32, 32), _mask(1, 8), decode="mean")
    assert str(err.value) == "decode must be one of 'maskgit', 'expected', got 'mean'"


# ---- hyperset-eval mim --decode ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CIFAR-10 root, token model folder, tokenizer folder): the tiny untrained models saved as checkpoints."""
    root = tmp_path_factory.mktemp("decode")
    pipe = _vq_pipeline()
    save_module(root / "tokenizer", pipe.tokenizer.model, TOKENIZER_KIND,
                dataclasses.asdict(pipe.tokenizer.model.cfg), {"data": {"image_size": 32}})
    save_checkpoint(root / "model", pipe.model, {})
    return write_cifar(root / "cifar"), root / "model", root / "tokenizer"


def test_eval_command_decode_option_is_used_and_reported(saved: tuple[Path, Path, Path]):
    cifar, model, tokenizer = saved
    args = [str(model), "--data", str(cifar), "--tokenizer", str(tokenizer), "--images", "6", "--decode-steps", "3",
            "--batch-size", "4", "--threads", "1"]
    runs = {d: CliRunner().invoke(mim_command, [*args, "--decode", d, "--json"]) for d in ("maskgit", "expected")}
    assert all(r.exit_code == 0 for r in runs.values()), [r.output for r in runs.values()]
    result = {d: json.loads(r.stdout) for d, r in runs.items()}
    assert result["expected"]["decode"] == "expected" and result["expected"]["steps"] == 1
    assert result["maskgit"]["decode"] == "maskgit" and result["maskgit"]["steps"] == 3
    default = CliRunner().invoke(mim_command, [*args, "--json"])
    assert json.loads(default.stdout) == result["expected"]  # the expected embedding is the default, as in the app
    pipe = load_mim(model, tokenizer=tokenizer)
    images = load_images(cifar, "test", 32).subset(np.arange(6))
    direct = evaluate_reconstruction(images, 0.4, pipeline=pipe, batch=4, decode="expected")
    assert result["expected"]["psnr"] == pytest.approx(direct["psnr"], abs=1e-6)
    assert result["expected"]["psnr"] != pytest.approx(result["maskgit"]["psnr"], abs=1e-3)
    table = CliRunner().invoke(mim_command, [*args, "--decode", "expected"])
    assert table.exit_code == 0 and "decoding: expected code embedding" in table.output, table.output
    assert "decoding: expected code embedding" in CliRunner().invoke(mim_command, args).output
    assert "decoding: MaskGIT" in CliRunner().invoke(mim_command, [*args, "--decode", "maskgit"]).output
    base = CliRunner().invoke(mim_command, ["--baseline", "most-frequent", "--data", str(cifar), "--tokenizer",
                                            str(tokenizer), "--images", "4", "--decode", "expected", "--json"])
    assert base.exit_code == 0 and json.loads(base.stdout)["decode"] is None, base.output  # no token model


def test_eval_command_bad_decode_exits_2(saved: tuple[Path, Path, Path]):
    cifar, model, tokenizer = saved
    out = CliRunner().invoke(mim_command, [str(model), "--data", str(cifar), "--tokenizer", str(tokenizer),
                                           "--decode", "mean"])
    assert out.exit_code == 2 and "'mean' is not one of 'maskgit', 'expected'" in out.stderr, out.output
