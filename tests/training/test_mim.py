"""Masked image modeling: training task (both stages), reconstruction pipeline and the eval command."""

from __future__ import annotations

import contextlib
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hyperset.config import preset_config
from hyperset.models import HyperSETModel
from hyperset.training.eval_mim import mim_command
from hyperset.training.mim_task import (
    TokensTask,
    _generator,
    build_mim_task,
    expected_latent_loss,
    masked_token_loss,
)
from hyperset.training.trainer import TrainConfig, Trainer
from hyperset.vision import reconstruct
from hyperset.vision.maskgit import mask_by_ratio, random_token_mask
from hyperset.vision.metrics import psnr
from hyperset.vision.reconstruct import MIMPipeline, Tokenizer, pixel_to_token_mask, sample_images
from hyperset.vision.vq import VQConfig, VQTokenizer

TINY_VQ = {"hidden": 32, "num_res_blocks": 1, "codebook_size": 64, "code_dim": 16, "restart_after": 5}
TINY_MODEL = {"dim": 32, "heads": 2, "ff_hidden": 32, "iters": 2, "time_dim": 32, "vocab_size": 65,
              "num_classes": 64, "seq_len": 64}


def _images(n: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth synthetic images (N, 3, 32, 32) uint8: a colour gradient plus a coloured square."""
    lin = np.linspace(0, 1, 32)
    out = np.empty((n, 3, 32, 32))
    for i in range(n):
        slope, offset = rng.random((3, 1, 1)), 0.3 * rng.random((3, 1, 1))
        img = np.broadcast_to(slope * lin[None, None, :] + offset, (3, 32, 32)).copy()
        y, x = rng.integers(0, 20, 2)
        img[:, y:y + 12, x:x + 12] = rng.random((3, 1, 1))
        out[i] = img
    return (out.clip(0, 1) * 255).astype(np.uint8)


def write_cifar(root: Path, per_batch: int = 16, n_test: int = 16) -> Path:
    """A tiny CIFAR-10 in the real python layout: pickled dicts with b"data" (N, 3072) uint8 and b"labels"."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else per_batch
        batch = {b"data": _images(n, rng).reshape(n, -1), b"labels": rng.integers(0, 10, n).tolist(),
                 b"batch_label": name.encode()}
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    return root


def _train_cfg(steps: int, **kw) -> TrainConfig:
    base = dict(steps=steps, batch_size=16, optimizer="adam", lr=3e-3, min_lr=3e-3, schedule="constant",
                weight_decay=0.0, clip=1.0, amp="off", eval_every=steps, log_every=5, save_every_seconds=1e9)
    base.update(kw)
    return TrainConfig(**base)


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def cifar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cifar(tmp_path_factory.mktemp("cifar"))


@pytest.fixture(scope="module")
def tokenizer_run(cifar: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    recipe = {"preset": "mim-cpu", "objective": {"stage": "tokenizer", "eval_batch": 16},
              "tokenizer": TINY_VQ, "data": {"n_val": 16}, "train": {}}
    task = build_mim_task(preset_config("mim-cpu"), recipe, str(cifar))
    out = tmp_path_factory.mktemp("tok")
    torch.manual_seed(0)
    Trainer(task, _train_cfg(30), out, quiet=True).fit()
    return out


def _tokens_recipe(tokenizer: Path) -> dict:
    return {"preset": "mim-cpu", "model": TINY_MODEL,
            "objective": {"stage": "tokens", "decode_steps": 4, "eval_batch": 8},
            "data": {"n_val": 16, "tokenizer": str(tokenizer), "eval_images": 4, "eval_tokens": 16}, "train": {}}


def _tokens_task(cifar: Path, tokenizer: Path) -> TokensTask:
    recipe = _tokens_recipe(tokenizer)
    task = build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))
    assert isinstance(task, TokensTask)
    return task


@pytest.fixture(scope="module")
def tokens_run(cifar: Path, tokenizer_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokens")
    torch.manual_seed(0)
    Trainer(_tokens_task(cifar, tokenizer_run / "best"), _train_cfg(40, eval_every=20), out, quiet=True).fit()
    return out


def _tiny_pipeline() -> MIMPipeline:
    torch.manual_seed(0)
    vq = VQTokenizer(VQConfig(**TINY_VQ))
    vq.train()
    vq(torch.rand(4, 3, 32, 32))  # seeds the codebook
    model = HyperSETModel(preset_config("mim-cpu", **TINY_MODEL))
    return MIMPipeline(Tokenizer(vq, "vq-tokenizer", 32), model)


# ----------------------------------------------------------------------------------------------------


def test_training_mask_masks_a_fifth_of_the_tokens_on_average(cifar: Path, tokenizer_run: Path):
    """p = 0.4 * U(0, 1) per sample -> E[masked fraction] = 0.2; masked inputs hold the mask id."""
    frac = random_token_mask((4000, 64), 0.4, generator=torch.Generator().manual_seed(0)).float().mean()
    assert abs(float(frac) - 0.2) < 0.01
    task = _tokens_task(cifar, tokenizer_run / "best")
    batches = [task.batch(s, 64, 0, torch.device("cpu")) for s in range(20)]
    fracs = torch.stack([b["mask"].float().mean(1) for b in batches]).flatten()
    assert abs(float(fracs.mean()) - 0.2) < 0.03 and float(fracs.max()) <= 0.75
    for b in batches[:3]:
        assert torch.equal(b["inputs"][b["mask"]], torch.full_like(b["inputs"][b["mask"]], task.mask_id))
        assert torch.equal(b["inputs"][~b["mask"]], b["targets"][~b["mask"]])
    again = task.batch(7, 64, 0, torch.device("cpu"))
    assert all(torch.equal(again[k], batches[7][k]) for k in again)  # deterministic in (seed, step)


def test_loss_only_sees_masked_tokens():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 64, 64, generator=g)
    targets = torch.randint(0, 64, (4, 64), generator=g)
    mask = torch.rand(4, 64, generator=g) < 0.3
    loss = masked_token_loss(logits, targets, mask, 0.1)
    changed = logits.clone()
    changed[~mask] = torch.randn_like(changed[~mask]) * 10
    assert torch.allclose(masked_token_loss(changed, targets, mask, 0.1), loss)
    changed[mask] += torch.randn_like(changed[mask])
    assert not torch.allclose(masked_token_loss(changed, targets, mask, 0.1), loss)
    expected = torch.nn.functional.cross_entropy(logits[mask], targets[mask], label_smoothing=0.1)
    assert torch.allclose(loss, expected)


def test_reconstruct_fills_masked_tokens_and_keeps_the_others():
    pipe = _tiny_pipeline()
    images = torch.rand(3, 3, 32, 32)
    mask = torch.rand(3, 8, 8, generator=torch.Generator().manual_seed(1)) < 0.4
    seen = []
    res = pipe.reconstruct(images, mask, steps=6, generator=torch.Generator().manual_seed(0),
                           on_step=lambda s, c: seen.append(s))
    assert res.images.shape == (3, 3, 32, 32) and res.codes.shape == (3, 8, 8)
    assert int(res.codes.max()) < pipe.mask_id and int(res.codes.min()) >= 0
    assert torch.equal(res.codes[~mask], res.input_codes[~mask])
    assert torch.equal(res.mask, mask) and seen == list(range(6))
    hidden = res.masked_images[0, :, :4, :4] if mask[0, 0, 0] else res.masked_images[0, :, :4, :4] * 0 + 0.5
    assert torch.all(hidden == 0.5) and res.masked_images.shape == images.shape
    assert set(res.energy) == {"attn", "ff"} and len(res.energy["attn"]) == pipe.trained_iters
    assert res.energy_per_image["ff"].shape == (3, pipe.trained_iters)
    res5 = pipe.reconstruct(images, mask, iters=5, steps=2)
    assert len(res5.energy["attn"]) == 5 and torch.equal(res5.codes[~mask], res5.input_codes[~mask])
    with pytest.raises(ValueError, match="prepare_images"):
        pipe.reconstruct(torch.rand(1, 3, 16, 16), mask[:1])


def test_paste_unmasked_keeps_the_unmasked_pixels_exact():
    recon, original = torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)
    mask = torch.zeros(2, 8, 8, dtype=torch.bool)
    mask[0, 1, 2] = mask[1, 7, 7] = mask[1, 0, 0] = True
    out = reconstruct.paste_unmasked(recon, original, mask)
    pixels = mask.repeat_interleave(4, 1).repeat_interleave(4, 2)[:, None].expand_as(recon)  # 4x4 px per token
    assert torch.equal(out[~pixels], original[~pixels]) and torch.equal(out[pixels], recon[pixels])
    assert int(pixels.sum()) == 3 * 3 * 16
    with pytest.raises(ValueError, match="differ in shape"):
        reconstruct.paste_unmasked(recon, original[:1], mask)


def test_step_size_stats_report_the_signs_the_core_uses():
    pipe = _tiny_pipeline()
    tokens = torch.randint(0, 65, (3, 64), generator=torch.Generator().manual_seed(2))
    steps = pipe.model.core.step_sizes
    stats = reconstruct.step_size_stats(pipe.model, tokens, 3)
    assert stats["alpha_negative"] == [0.0] * 3  # step_init everywhere at first
    assert stats["alpha_mean"] == pytest.approx([0.1] * 3, rel=1e-5)
    assert stats["attn_step"] == pytest.approx(stats["attn_step_abs"])  # |alpha| = alpha: the same steps
    with torch.no_grad():
        d = pipe.model.cfg.dim
        steps.L3.bias[:d] = -0.1  # every alpha negative: the attention steps climb E_ATTN
        steps.L3.weight.normal_(0, 0.05, generator=torch.Generator().manual_seed(3))
    stats = reconstruct.step_size_stats(pipe.model, tokens, 3)
    alpha, _ = pipe.model.core.steps_at(pipe.model.stem(tokens), pipe.model.stem(tokens), 1)
    assert stats["alpha_negative"][0] == pytest.approx(float((alpha < 0).float().mean()))
    assert 0.5 < stats["alpha_negative"][0] < 1.0 and 0.0 < stats["gamma_negative"][0] < 1.0
    assert len(stats["gamma_mean"]) == len(stats["attn_step"]) == 3
    assert stats["attn_step"] != pytest.approx(stats["attn_step_abs"])
    res = pipe.reconstruct(torch.rand(1, 3, 32, 32), torch.ones(8, 8, dtype=torch.bool), iters=3, steps=1)
    assert set(res.step_sizes) == set(stats) and len(res.step_sizes["alpha_negative"]) == 3


def test_pixel_mask_to_token_mask():
    pixels = torch.zeros(32, 32, dtype=torch.bool)
    pixels[0:4, 0:4] = True  # all of token (0, 0)
    pixels[4:6, 4:8] = True  # half of token (1, 1)
    pixels[8, 8] = True  # one pixel of token (2, 2)
    most = pixel_to_token_mask(pixels, 8)
    assert most.shape == (8, 8) and most.sum() == 2 and most[0, 0] and most[1, 1]
    anyp = pixel_to_token_mask(pixels, 8, threshold=1e-6)
    assert anyp.sum() == 3 and anyp[2, 2]
    assert pixel_to_token_mask(pixels[None].expand(2, -1, -1), 8).shape == (2, 8, 8)
    with pytest.raises(ValueError):
        pixel_to_token_mask(torch.zeros(30, 30, dtype=torch.bool), 8)


def test_a_few_steps_lower_the_tokenizer_loss(tokenizer_run: Path):
    losses = _losses(tokenizer_run)
    assert losses[-1] < 0.75 * losses[0]
    meta = json.loads((tokenizer_run / "best" / "config.json").read_text())
    assert meta["kind"] == "vq-tokenizer" and meta["model"]["codebook_size"] == 64
    assert "val/psnr" in meta["metrics"] and "val/codebook_usage" in meta["metrics"]


def test_a_few_steps_lower_the_token_loss(tokens_run: Path):
    losses = _losses(tokens_run)
    assert losses[-1] < losses[0] - 0.3
    meta = json.loads((tokens_run / "best" / "config.json").read_text())
    assert {"val/psnr@40", "val/token_acc@40", "val/tokenizer_psnr"} <= set(meta["metrics"])


def test_resume_continues_exactly(cifar: Path, tokenizer_run: Path, tmp_path: Path):
    from safetensors.torch import load_file

    tok = tokenizer_run / "best"
    full, part = tmp_path / "full", tmp_path / "part"
    cfg = dict(eval_every=4, log_every=2)
    Trainer(_tokens_task(cifar, tok), _train_cfg(8, **cfg), full, quiet=True).fit()
    Trainer(_tokens_task(cifar, tok), _train_cfg(4, **cfg), part, quiet=True).fit()
    result = Trainer(_tokens_task(cifar, tok), _train_cfg(8, **cfg), part, resume=True, quiet=True).fit()
    assert result["step"] == 8
    a, b = load_file(str(full / "last" / "model.safetensors")), load_file(str(part / "last" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    with pytest.raises(ValueError, match="--resume"):
        Trainer(_tokens_task(cifar, tok), _train_cfg(8), part, quiet=True).fit()


def test_eval_command_json(cifar: Path, tokenizer_run: Path, tokens_run: Path, monkeypatch: pytest.MonkeyPatch):
    for var in ("HYPERSET_LPIPS_WEIGHTS", "HYPERSET_LPIPS_BACKBONE", "HYPERSET_FID_WEIGHTS"):
        monkeypatch.delenv(var, raising=False)
    args = [str(tokens_run / "best"), "--data", str(cifar), "--tokenizer", str(tokenizer_run / "best"),
            "--images", "6", "--decode-steps", "3", "--batch-size", "4", "--mask-ratio", "0.25", "--json"]
    out = CliRunner().invoke(mim_command, args)
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    old_names = [{"--decode-steps": "--steps", "--batch-size": "--batch"}.get(a, a) for a in args]
    old = CliRunner().invoke(mim_command, old_names)  # the deprecated names still work, and say so
    assert old.exit_code == 0 and json.loads(old.stdout) == result, old.output
    assert "--steps is deprecated" in old.stderr and "--batch is deprecated" in old.stderr
    keys = {"psnr", "ssim", "ms_ssim", "lpips", "fid", "images", "iters", "mask_ratio", "tokenizer_psnr"}
    assert keys <= set(result)
    assert result["images"] == 6 and result["iters"] == TINY_MODEL["iters"] and result["mask_ratio"] == 0.25
    assert result["masked_tokens"] == 16 and all(isinstance(result[k], float) for k in ("psnr", "ssim", "ms_ssim"))
    assert result["lpips"] is None and "LPIPS unavailable" in result["lpips_reason"]
    assert result["fid"] is None and "FID unavailable" in result["fid_reason"]
    assert "2 scales" in result["ms_ssim_config"]
    table = CliRunner().invoke(mim_command, args[:-1] + ["--iters", "3"])
    assert table.exit_code == 0 and "PSNR" in table.output and "Iter 3" in table.output
    base = CliRunner().invoke(mim_command, ["--baseline", "most-frequent", "--data", str(cifar), "--tokenizer",
                                            str(tokenizer_run / "best"), "--images", "6", "--json"])
    assert base.exit_code == 0, base.output
    b = json.loads(base.output)
    assert b["model"] == "Most-frequent code" and 0 <= b["most_frequent_code"] < 64
    assert b["tokenizer_psnr"] == pytest.approx(result["tokenizer_psnr"])


def test_eval_command_without_shipped_models_exits_2(cifar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(reconstruct, "WEIGHTS_DIR", tmp_path / "nothing")
    out = CliRunner().invoke(mim_command, ["--data", str(cifar), "--json"])
    assert out.exit_code == 2 and "not in this package" in out.output


@pytest.mark.parametrize("args, message", [
    (["--iters", "0"], "0 is not in the range 1<=x<=10000"), (["--images", "-1"], "-1 is not in the range x>=0"),
    (["--batch-size", "0"], "0 is not in the range x>=1"), (["--batch", "0"], "0 is not in the range x>=1"),
    (["--decode-steps", "0"], "0 is not in the range x>=1"), (["--image-size", "0"], "0 is not in the range x>=1"),
    (["--device", "banana"], "banana"), (["--tokenizer", "BAD"], "not a readable safetensors file")])
def test_eval_command_user_mistakes_exit_2(cifar: Path, tmp_path: Path, args: list[str], message: str):
    (tmp_path / "vqgan.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage")
    args = [str(tmp_path / "vqgan.safetensors") if a == "BAD" else a for a in args]
    out = CliRunner().invoke(mim_command, ["--data", str(cifar), "--images", "2", "--decode-steps", "2", *args])
    assert out.exit_code == 2 and message in out.stderr and "Traceback" not in out.output, out.output


def test_recipe_values_of_the_wrong_type_name_their_key(cifar: Path):
    recipe = {"preset": "mim-cpu", "objective": {"stage": "tokens", "eval_ratio": "high"}, "data": {"n_val": 16}}
    with pytest.raises(ValueError, match="objective.eval_ratio = 'high': expected float"):
        build_mim_task(preset_config("mim-cpu"), recipe, str(cifar))
    recipe = {"preset": "mim-cpu", "objective": {"stage": "tokenizer"}, "tokenizer": {"hidden": "wide"}}
    with pytest.raises(ValueError, match="tokenizer.hidden = 'wide': expected int"):
        build_mim_task(preset_config("mim-cpu"), recipe, str(cifar))


def test_sample_images_are_shipped_with_their_sources():
    small, large = sample_images(), sample_images(64)
    assert len(small) >= 5 and set(small) == set(large)
    assert all(v.shape == (3, 32, 32) and 0 <= float(v.min()) and float(v.max()) <= 1 for v in small.values())
    assert all(v.shape == (3, 64, 64) for v in large.values())
    sources = (reconstruct.SAMPLES_DIR / "SOURCES.md").read_text()
    assert all(f"{name}.png" in sources for name in small)


def test_shipped_recipes_build(cifar: Path):
    from hyperset.training.epochs import epochs_to_steps
    from hyperset.training.mim_task import TokenizerTask
    from hyperset.training.recipes import load_recipe

    _, recipe = load_recipe("mim-cpu-tokenizer")
    recipe["data"]["n_val"] = 16
    task = build_mim_task(preset_config(recipe["preset"]), recipe, str(cifar))
    assert isinstance(task, TokenizerTask) and task.vq.codebook_size == 512 and len(task.train) == 64
    TrainConfig.from_dict(recipe["train"])
    _, paper = load_recipe("mim-paper")
    assert TrainConfig.from_dict({k: v for k, v in paper["train"].items() if k != "epochs"}).lr == 1e-4
    with pytest.raises(ValueError, match="VQGAN"):
        build_mim_task(preset_config(paper["preset"]), paper, str(cifar))
    train = {"epochs": 300, "batch_size": 256}
    epochs_to_steps(train, 126689)
    assert train == {"steps": 148464, "batch_size": 256, "eval_every": 495}  # eval_every: one epoch by default
    _, cpu = load_recipe("mim-cpu")
    cfg = preset_config(cpu["preset"], **cpu["model"])
    assert (cfg.dim, cfg.vocab_size, cfg.num_classes, cfg.seq_len, cfg.iters) == (128, 513, 512, 64, 12)


def _two_segment_losses(task: TokensTask) -> tuple[HyperSETModel, torch.Tensor, list[torch.Tensor]]:
    """A fresh model, the task's loss on one batch, and the masked-token losses after T and 2T iterations."""
    torch.manual_seed(0)
    model = HyperSETModel(task.model)
    batch = task.batch(0, 8, 0, torch.device("cpu"))
    loss, _ = task.loss(model, batch)
    T = task.model.iters
    at = [masked_token_loss(model(batch["inputs"], iters=k * T), batch["targets"], batch["mask"], 0.1)
          for k in (1, 2)]
    return model, loss, at


def test_deep_supervision_segments_and_extra_eval_depths(cifar: Path, tokenizer_run: Path):
    """segments=2: the loss is the mean of the masked-token losses after T and after 2T iterations (the state
    detached between them); eval_iters reports PSNR at further depths with the same sampling draws."""
    recipe = _tokens_recipe(tokenizer_run / "best")
    recipe["objective"].update(segments=2, eval_iters=[2 * TINY_MODEL["iters"]])
    task = build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))
    assert isinstance(task, TokensTask) and task.describe()["segments"] == 2
    model, loss, expected = _two_segment_losses(task)
    assert torch.allclose(loss, torch.stack(expected).mean(), atol=1e-5)
    scores = task.evaluate(model, torch.device("cpu"), contextlib.nullcontext)
    T = task.model.iters
    assert f"val/psnr@40_iters{2 * T}" in scores and scores[f"val/psnr@40_iters{2 * T}"] > 0
    recipe["objective"]["segments"] = 0
    with pytest.raises(ValueError, match="segments"):
        build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))


def test_validation_can_score_the_expected_embedding(cifar: Path, tokenizer_run: Path):
    """objective.decode = "expected": the validation PSNR is that of MIMPipeline.reconstruct(decode="expected") on
    the same images and mask; an unknown decoding is named."""
    recipe = _tokens_recipe(tokenizer_run / "best")
    recipe["objective"].update(decode="expected")
    task = build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))
    assert isinstance(task, TokensTask) and task.describe()["eval"]["decode"] == "expected"
    torch.manual_seed(0)
    model = HyperSETModel(task.model).eval()
    scores = task.evaluate(model, torch.device("cpu"), contextlib.nullcontext)
    n = min(task.data.eval_images, len(task.val))
    images = task.val.floats(range(n))
    g = task.tokenizer.grid
    mask = mask_by_ratio((n, g, g), task.eval_ratio, generator=_generator(task.data.seed, 8))
    pipe = MIMPipeline(task.tokenizer, model)
    recon = pipe.reconstruct(images, mask, decode="expected").images
    assert scores["val/psnr@40"] == pytest.approx(float(psnr(recon, images).mean()), abs=1e-4)
    recipe["objective"]["decode"] = "sampled"
    with pytest.raises(ValueError, match="decode"):
        build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))


def test_expected_latent_loss_is_the_expected_embeddings_error_on_masked_tokens():
    torch.manual_seed(0)
    book = torch.randn(5, 3)
    targets = torch.tensor([[0, 1, 2, 3]])
    mask = torch.tensor([[True, False, True, False]])
    # a confident, right prediction has (almost) no error; the unmasked tokens never count
    right = torch.full((1, 4, 6), -30.0).scatter(-1, targets[..., None], 30.0)
    right[0, 1] = torch.tensor([9.0, -9.0, -9.0, -9.0, -9.0, 50.0])  # wrong and unmasked: ignored; class 5 = mask id
    assert float(expected_latent_loss(right, targets, mask, book)) < 1e-6
    # a uniform prediction: the error of the codebook mean, over the two masked tokens
    uniform = torch.zeros(1, 4, 5)
    mean = book.mean(0)
    want = ((mean - book[0]).pow(2).sum() + (mean - book[2]).pow(2).sum()) / 2 / book.pow(2).sum(-1).mean()
    assert torch.allclose(expected_latent_loss(uniform, targets, mask, book), want, atol=1e-6)
    assert float(expected_latent_loss(uniform, targets, torch.zeros_like(mask), book)) == 0.0
    # gradients reach the logits, never the (frozen) codebook
    book.requires_grad_(True)
    logits = torch.zeros(1, 4, 5, requires_grad=True)
    expected_latent_loss(logits, targets, mask, book).backward()
    assert logits.grad is not None and logits.grad[0, 1].abs().sum() == 0 and logits.grad[0, 0].abs().sum() > 0
    assert book.grad is None


def test_latent_weight_adds_the_expected_embedding_loss(cifar: Path, tokenizer_run: Path):
    recipe = _tokens_recipe(tokenizer_run / "best")
    recipe["objective"].update(latent_weight=0.5)
    task = build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))
    assert isinstance(task, TokensTask) and task.describe()["latent_weight"] == 0.5
    torch.manual_seed(0)
    model = HyperSETModel(task.model)
    batch = task.batch(0, 8, 0, torch.device("cpu"))
    loss, _ = task.loss(model, batch)
    logits = model(batch["inputs"])
    want = masked_token_loss(logits, batch["targets"], batch["mask"], 0.1) + 0.5 * expected_latent_loss(
        logits, batch["targets"], batch["mask"], task.tokenizer.codebook)
    assert torch.allclose(loss, want, atol=1e-5)
    recipe["objective"]["latent_weight"] = -1.0
    with pytest.raises(ValueError, match="latent_weight"):
        build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))


def test_segment_weights_weigh_the_depths(cifar: Path, tokenizer_run: Path):
    recipe = _tokens_recipe(tokenizer_run / "best")
    recipe["objective"].update(segments=2, segment_weights=[1.0, 3.0])
    task = build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))
    assert isinstance(task, TokensTask) and task.describe()["segment_weights"] == [1.0, 3.0]
    _, loss, at = _two_segment_losses(task)
    assert torch.allclose(loss, (at[0] + 3 * at[1]) / 4, atol=1e-5)
    for bad in ([1.0], [0.0, 0.0], [1.0, -1.0]):
        recipe["objective"]["segment_weights"] = bad
        with pytest.raises(ValueError, match="segment_weights"):
            build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))


def test_training_records_the_tokenizers_absolute_path(cifar: Path, tokenizer_run: Path,
                                                      monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tokenizer_run)
    recipe = _tokens_recipe(Path("best"))  # as typed on a command line: relative to the working directory
    task = build_mim_task(preset_config("mim-cpu", **TINY_MODEL), recipe, str(cifar))
    assert task.describe()["tokenizer"] == str((tokenizer_run / "best").resolve())


def test_a_missing_recorded_tokenizer_is_an_error_not_the_shipped_one(tokens_run: Path, tokenizer_run: Path,
                                                                       tmp_path: Path, cifar: Path):
    import shutil

    from hyperset.checkpoint import CheckpointError

    model = tmp_path / "model"
    shutil.copytree(tokens_run / "best", model)
    meta = json.loads((model / "config.json").read_text())
    meta["data"]["tokenizer"] = "runs/gone/best"
    (model / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"runs/gone/best, which does not exist here; pass it with --tokenizer"):
        reconstruct.load_mim(model)
    out = CliRunner().invoke(mim_command, [str(model), "--data", str(cifar), "--images", "2", "--json"])
    assert out.exit_code == 2 and "--tokenizer PATH" in out.stderr and "Traceback" not in out.output, out.output
    pipe = reconstruct.load_mim(model, tokenizer=tokenizer_run / "best")
    assert pipe.tokenizer.source == str((tokenizer_run / "best").resolve())


def test_eval_command_json_names_the_tokenizer_device_and_precision(cifar: Path, tokenizer_run: Path,
                                                                    tokens_run: Path):
    args = [str(tokens_run / "best"), "--data", str(cifar), "--images", "2", "--batch-size", "2", "--device", "cpu"]
    out = CliRunner().invoke(mim_command, [*args, "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    assert result["tokenizer"] == str((tokenizer_run / "best").resolve())  # the one recorded at training
    assert result["device"].startswith("cpu (") and result["precision"] == "fp32"
    table = CliRunner().invoke(mim_command, args)
    assert table.exit_code == 0 and f"tokenizer: {result['tokenizer']}; cpu (" in table.stdout, table.output


def test_eval_command_refuses_an_empty_split(cifar: Path, tokenizer_run: Path, tokens_run: Path, tmp_path: Path):
    import shutil

    shutil.copytree(cifar, tmp_path / "data")
    with open(tmp_path / "data" / "cifar-10-batches-py" / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((0, 3072), dtype=np.uint8), b"labels": []}, f, protocol=4)
    out = CliRunner().invoke(mim_command, [str(tokens_run / "best"), "--data", str(tmp_path / "data"), "--json"])
    assert out.exit_code == 2 and "the test split holds no images" in out.stderr, out.output
    assert "Traceback" not in out.output and out.stdout == ""


def test_eval_command_names_an_unreadable_image(tokenizer_run: Path, tokens_run: Path, tmp_path: Path):
    from PIL import Image

    folder = tmp_path / "tree" / "val" / "cls"
    folder.mkdir(parents=True)
    Image.fromarray(_images(1, np.random.default_rng(0))[0].transpose(1, 2, 0)).save(folder / "a.png")
    (folder / "b.png").write_bytes(b"garbage, not a png")
    out = CliRunner().invoke(mim_command, [str(tokens_run / "best"), "--data", str(tmp_path / "tree"),
                                           "--decode-steps", "2"])
    assert out.exit_code == 2 and "b.png: not a readable image" in out.stderr, out.output
    assert "Traceback" not in out.output and out.stderr.count("\n") == 1


@pytest.mark.parametrize("section, key, value, message", [
    ("data", "eval_images", -1, "data.eval_images must be a whole number >= 0"),
    ("data", "n_train", -3, "data.n_train must be a whole number >= 0"),
    ("data", "n_train", 10**6, "data.n_train = 1000000 but"),
    ("data", "encode_batch", 0, "data.encode_batch must be a whole number >= 1"),
    ("objective", "label_smoothing", 2, "objective.label_smoothing must be a number in [0, 1)"),
    ("objective", "decode_steps", 0, "objective.decode_steps must be a whole number >= 1"),
    ("objective", "eval_ratio", 1.5, "objective.eval_ratio must be a number in (0, 1]"),
    ("objective", "eval_iters", [20000], "objective.eval_iters must hold iteration counts in [1, 10000]"),
    ("objective", "schedule", "spiral", "objective.schedule"),
])
def test_bad_recipe_values_are_refused_before_training(cifar: Path, section: str, key: str, value: object,
                                                       message: str):
    recipe = {"preset": "mim-cpu", "objective": {"stage": "tokens"}, "data": {"n_val": 16}}
    recipe[section][key] = value
    with pytest.raises(ValueError) as err:
        build_mim_task(preset_config("mim-cpu"), recipe, str(cifar))
    assert message in str(err.value)


def test_tokenizer_stage_refuses_a_zero_eval_batch(cifar: Path):
    recipe = {"preset": "mim-cpu", "objective": {"stage": "tokenizer", "eval_batch": 0}, "data": {"n_val": 16}}
    with pytest.raises(ValueError, match="objective.eval_batch must be a whole number >= 1"):
        build_mim_task(preset_config("mim-cpu"), recipe, str(cifar))


def test_train_command_reports_a_bad_recipe_value_in_one_line(cifar: Path, tmp_path: Path):
    from hyperset.training.cli import main as train_main

    result = CliRunner().invoke(train_main, ["mim", "--recipe", "mim-cpu", "--data", str(cifar), "--out",
                                             str(tmp_path / "run"), "--steps", "1", "--set", "data.n_val=16",
                                             "--set", "data.eval_images=-1"])
    assert result.exit_code == 2 and "data.eval_images must be a whole number >= 0" in result.stderr, result.output
    assert "Traceback" not in result.output and result.stderr.count("\n") == 1 and not (tmp_path / "run").exists()


def _decoder_task(cifar: Path, tokenizer: Path, tokens: Path, **objective):
    recipe = {"preset": "mim-cpu",
              "objective": {"stage": "decoder", "token_model": str(tokens), "eval_batch": 8, **objective},
              "data": {"n_val": 16, "tokenizer": str(tokenizer), "eval_images": 8}, "train": {}}
    return build_mim_task(preset_config("mim-cpu"), recipe, str(cifar))


def test_the_decoder_stage_trains_the_decoder_alone_on_the_token_models_expected_embeddings(
        cifar: Path, tokenizer_run: Path, tokens_run: Path, tmp_path: Path):
    from safetensors.torch import load_file

    from hyperset.training.mim_task import DecoderTask

    tok, tokens = tokenizer_run / "best", tokens_run / "best"
    task = _decoder_task(cifar, tok, tokens, eval_iters=[4])
    assert isinstance(task, DecoderTask) and task.iters == 2  # the token model's trained iterations
    model = task.build_model()
    assert {n.split(".")[0] for n, p in model.named_parameters() if p.requires_grad} == {"decoder"}
    batch = task.batch(0, 8, 0, torch.device("cpu"))
    pipe = MIMPipeline(reconstruct.load_tokenizer(tok), task.tokens)
    # the loss is the pixels' MSE of the default decoding (pipeline.reconstruct(decode="expected"))
    result = pipe.reconstruct(batch["images"], batch["mask"], decode="expected")
    loss, logged = task.loss(model, batch)
    # (decoded images are clamped to [0, 1]; a fresh tiny decoder may step past it, so compare before the clamp)
    raw = model.decoder(reconstruct.expected_latents(pipe.tokenizer.codebook, result.input_codes, batch["mask"],
                                                     task.tokens(result.input_codes.masked_fill(
                                                         batch["mask"], pipe.mask_id).flatten(1))))
    target = batch["images"] * 2 - 1
    assert torch.allclose(raw.clamp(-1, 1), result.images * 2 - 1, atol=1e-5)
    own = model.decoder(pipe.tokenizer.codebook[result.input_codes].permute(0, 3, 1, 2))
    expected, codes = (raw - target).pow(2).mean(), (own - target).pow(2).mean()
    assert torch.allclose(logged["recon"], expected, rtol=1e-4)
    assert torch.allclose(logged["codes_recon"], codes, rtol=1e-4)
    assert loss.requires_grad and torch.allclose(loss, expected + codes, rtol=1e-4)
    alone, logged = _decoder_task(cifar, tok, tokens, codes_weight=0).loss(model, batch)
    assert torch.allclose(alone, expected, rtol=1e-4) and "codes_recon" not in logged

    out = tmp_path / "dec"
    torch.manual_seed(0)
    Trainer(task, _train_cfg(30, lr=1e-3, min_lr=1e-3, eval_every=30), out, quiet=True).fit()
    losses = _losses(out)
    assert losses[-1] < losses[0]
    meta = json.loads((out / "best" / "config.json").read_text())
    assert meta["kind"] == "vq-tokenizer" and meta["data"]["stage"] == "decoder"
    assert {"val/psnr@40", "val/psnr@40_iters4", "val/tokenizer_psnr"} <= set(meta["metrics"])
    before, after = load_file(str(tok / "model.safetensors")), load_file(str(out / "best" / "model.safetensors"))
    assert before.keys() == after.keys()
    for name in before:  # encoder and codebook as they were: the codes keep their meaning
        same = torch.equal(before[name], after[name])
        assert same != name.startswith("decoder."), name
    # the trained decoder loads as a tokenizer, and a token model decodes with it
    trained = reconstruct.load_tokenizer(out / "best")
    codes = trained.encode(batch["images"])
    assert torch.equal(codes, pipe.encode(batch["images"]))


@pytest.mark.parametrize("objective,message", [
    ({"token_model": ""}, "token_model"),
    ({"max_mask_ratio": 0}, "max_mask_ratio"),
    ({"eval_iters": [0]}, "eval_iters"),
    ({"decode_steps": 4}, "decode_steps"),
    ({"codes_weight": -1.0}, "codes_weight"),
])
def test_the_decoder_stage_refuses_bad_objectives(cifar: Path, tokenizer_run: Path, tokens_run: Path,
                                                  objective: dict, message: str):
    with pytest.raises(ValueError, match=message):
        _decoder_task(cifar, tokenizer_run / "best", tokens_run / "best", **objective)
