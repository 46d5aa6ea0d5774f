"""Taming VQGAN structure, checkpoint key layout and loader (hyperset.vision.vqgan)."""

import torch
import torch.nn.functional as F
from pytest import raises
from safetensors.torch import save_file

from hyperset.vision.vqgan import VQGAN, CheckpointError, Downsample, VQGANConfig, load_vqgan

SMALL = VQGANConfig(embed_dim=16, n_embed=64, z_channels=16, resolution=32, ch=32, ch_mult=(1, 1, 2),
                    num_res_blocks=1, attn_resolutions=(8,))




def _taming_f16_1024_shapes() -> dict[str, tuple[int, ...]]:
    """Key -> shape of ``vqgan_imagenet_f16_1024`` as laid out in the taming checkpoint (from the notes)."""
    shapes: dict[str, tuple[int, ...]] = {}

    def conv(name, cin, cout, k):
        shapes[f"{name}.weight"] = (cout, cin, k, k)
        shapes[f"{name}.bias"] = (cout,)

    def norm(name, c):
        shapes[f"{name}.weight"] = shapes[f"{name}.bias"] = (c,)

    def res(p, cin, cout):
        norm(f"{p}.norm1", cin)
        conv(f"{p}.conv1", cin, cout, 3)
        norm(f"{p}.norm2", cout)
        conv(f"{p}.conv2", cout, cout, 3)
        if cin != cout:
            conv(f"{p}.nin_shortcut", cin, cout, 1)

    def attn(p, c):
        norm(f"{p}.norm", c)
        for n in ("q", "k", "v", "proj_out"):
            conv(f"{p}.{n}", c, c, 1)

    chans = [128, 128, 256, 256, 512]
    conv("encoder.conv_in", 3, 128, 3)
    cin = 128
    for i, c in enumerate(chans):
        for j in range(2):
            res(f"encoder.down.{i}.block.{j}", cin if j == 0 else c, c)
            if i == 4:
                attn(f"encoder.down.{i}.attn.{j}", c)
        if i < 4:
            conv(f"encoder.down.{i}.downsample.conv", c, c, 3)
        cin = c
    for side in ("encoder", "decoder"):
        res(f"{side}.mid.block_1", 512, 512)
        attn(f"{side}.mid.attn_1", 512)
        res(f"{side}.mid.block_2", 512, 512)
    norm("encoder.norm_out", 512)
    conv("encoder.conv_out", 512, 256, 3)
    conv("quant_conv", 256, 256, 1)
    shapes["quantize.embedding.weight"] = (1024, 256)
    conv("post_quant_conv", 256, 256, 1)
    conv("decoder.conv_in", 256, 512, 3)
    cin = 512
    for i in reversed(range(5)):
        c = chans[i]
        for j in range(3):
            res(f"decoder.up.{i}.block.{j}", cin if j == 0 else c, c)
            if i == 4:
                attn(f"decoder.up.{i}.attn.{j}", c)
        if i > 0:
            conv(f"decoder.up.{i}.upsample.conv", c, c, 3)
        cin = c
    norm("decoder.norm_out", 128)
    conv("decoder.conv_out", 128, 3, 3)
    return shapes


def test_full_size_model_has_the_taming_checkpoint_layout():
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = VQGAN()
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = _taming_f16_1024_shapes()
    assert sorted(set(expected) - set(got)) == []
    assert sorted(set(got) - set(expected)) == []
    assert got == expected
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - 72.1) < 0.05  # MaskGIT README: 72.1 M
    assert model.cfg.grid == 16


def test_small_model_encodes_to_codes_and_decodes_to_images():
    torch.manual_seed(0)
    model = VQGAN(SMALL).eval()
    x = torch.rand(2, 3, 32, 32)
    codes = model.encode(x)
    assert codes.shape == (2, 8, 8) and codes.dtype == torch.long
    assert codes.min() >= 0 and codes.max() < 64
    images = model.decode_code(codes)
    assert images.shape == (2, 3, 32, 32)
    assert images.min() >= 0 and images.max() <= 1
    recon, loss, fcodes = model(x)
    assert torch.equal(fcodes, codes)
    assert torch.allclose(recon, images, atol=1e-5)
    assert loss.ndim == 0 and loss > 0


def test_downsample_pads_right_and_bottom_only():
    torch.manual_seed(0)
    down = Downsample(4)
    x = torch.randn(1, 4, 8, 8)
    ref = F.conv2d(F.pad(x, (0, 1, 0, 1)), down.conv.weight, down.conv.bias, stride=2)
    assert down(x).shape == (1, 4, 4, 4)
    assert torch.allclose(down(x), ref)


def _small_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return VQGAN(SMALL).state_dict()


def test_lightning_checkpoint_loads_ignoring_loss_keys(tmp_path):
    sd = _small_state()
    path = tmp_path / "last.ckpt"
    extra = {"loss.discriminator.main.0.weight": torch.randn(4, 3, 4, 4), "loss.logvar": torch.zeros(())}
    torch.save({"state_dict": {**sd, **extra}, "epoch": 3, "global_step": 1000}, path)
    model = load_vqgan(path, SMALL)
    assert not model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, sd[k]), k


def test_bare_state_dict_and_safetensors_load(tmp_path):
    sd = _small_state()
    torch.save(sd, tmp_path / "bare.pth")
    save_file(sd, str(tmp_path / "vqgan.safetensors"))
    x = torch.rand(1, 3, 32, 32)
    a = load_vqgan(tmp_path / "bare.pth", SMALL).encode(x)
    b = load_vqgan(tmp_path / "vqgan.safetensors", SMALL).encode(x)
    assert torch.equal(a, b)


class TrainerCallback:
    """Stands for the Python objects a Lightning checkpoint pickles besides its tensors."""


def test_checkpoint_needing_full_unpickling_is_refused_with_conversion_advice(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": _small_state(), "callbacks": {"cb": TrainerCallback()}}, path)
    with raises(CheckpointError) as err:
        load_vqgan(path, SMALL)
    msg = str(err.value)
    assert "refusing" in msg and "weights_only=False" in msg and "safetensors" in msg
    assert "\n" not in msg


def test_missing_or_unexpected_keys_give_a_one_line_error(tmp_path):
    sd = _small_state()
    del sd["quant_conv.weight"]
    sd["encoder.extra.weight"] = torch.zeros(1)
    path = tmp_path / "bad.ckpt"
    torch.save({"state_dict": sd}, path)
    with raises(CheckpointError) as err:
        load_vqgan(path, SMALL)
    msg = str(err.value)
    assert "missing keys [quant_conv.weight]" in msg
    assert "unexpected keys [encoder.extra.weight]" in msg
    assert "\n" not in msg


def test_wrong_config_reports_shape_mismatch(tmp_path):
    path = tmp_path / "small.ckpt"
    torch.save({"state_dict": _small_state()}, path)
    with raises(CheckpointError, match="shape mismatch"):
        load_vqgan(path, VQGANConfig(embed_dim=16, n_embed=128, z_channels=16, resolution=32, ch=32,
                                     ch_mult=(1, 1, 2), num_res_blocks=1, attn_resolutions=(8,)))


def test_missing_file_is_reported(tmp_path):
    with raises(CheckpointError, match="not found"):
        load_vqgan(tmp_path / "nope.ckpt")


def test_a_file_that_is_not_a_checkpoint_is_reported(tmp_path):
    path = tmp_path / "notes.ckpt"
    path.write_text("hello world")
    with raises(CheckpointError, match="not a PyTorch checkpoint"):
        load_vqgan(path, SMALL)


def test_a_garbage_ckpt_is_not_reported_as_holding_python_objects(tmp_path):
    path = tmp_path / "garbage.ckpt"
    path.write_bytes(b"garbage, not a checkpoint at all")
    with raises(CheckpointError) as err:
        load_vqgan(path, SMALL)
    msg = str(err.value)
    assert f"{path} is not a PyTorch checkpoint" in msg and "\n" not in msg
    assert "Python objects" not in msg and "weights_only=False" not in msg


def test_vqgan_tokenizer_at_another_image_size_keeps_the_models_factor(tmp_path, monkeypatch):
    import hyperset.vision.vqgan as vqgan_module
    from hyperset.vision.reconstruct import load_tokenizer

    path = tmp_path / "small.ckpt"
    torch.save({"state_dict": _small_state()}, path)
    monkeypatch.setattr(vqgan_module, "VQGAN", lambda cfg=None: VQGAN(SMALL))  # load_tokenizer's default config
    tok = load_tokenizer(path, image_size=64)
    assert SMALL.resolution // SMALL.grid == 4 and tok.grid == 16
    assert tuple(tok.encode(torch.rand(1, 3, 64, 64)).shape) == (1, 16, 16)
    assert tok.source == str(path.resolve())


def test_an_unreadable_safetensors_file_is_reported(tmp_path):
    path = tmp_path / "vqgan.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    with raises(CheckpointError, match="not a readable safetensors file"):
        load_vqgan(path, SMALL)
