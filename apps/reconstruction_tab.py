"""The reconstruction tab.

A sample image (the default: the cat, the sample closest to the CIFAR-10 images the shipped models were
trained on; or an upload, resized to the tokenizer's input size) is tokenized; a share of the tokens is
masked at random (seeded; 40% by default) or where the user paints; the token model fills them in, by
default in one forward pass with the expected code embedding (the mean code vector under its predicted
distribution), or by the "Decoding" choice with MaskGIT sampling (the paper's protocol), and the tokenizer
decodes the result.
Four columns (upscaled with nearest-neighbour): original, masked input, the tokenizer alone (the image
encoded and decoded with no mask: the ceiling of any token model) and the model's output, by default with
the unmasked pixels pasted back from the original; PSNR and SSIM of each. Above them, the token model's
training budget and measured PSNR as its config.json records them; below, the energies of the token model's
last forward pass per iteration and what they show (the step sizes' signs of that pass).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import gradio as gr
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from hyperset.config import MAX_ITERS

from .energy_plot import energy_svg
from .gradio_adapter import lenient, toast
from .inputs import InputError, float_in, int_in, iterations_in, iterations_note
from .limits import MAX_IMAGE_PIXELS, MAX_UPLOAD_BYTES, MODEL_QUEUE, limit_pixels, pixel_problem
from .rendering import DISPLAY_SIDE, energy_note, error_md, mim_training_note, rgb_array, to_display

__all__ = ["DEFAULT_MASK_RATIO", "DEFAULT_SAMPLE", "MAX_ITER_FACTOR", "ReconstructionTab"]

# The token model's iterations go to 4x its trained depth (at most MAX_ITERS; Sudoku's go to MAX_ITERS, with a time
# limit): a reconstruction has no time limit, and 24 decoding steps of 10,000 iterations would hold the one model
# slot for minutes
MAX_ITER_FACTOR = 4
MIM_CLI = "hyperset-eval mim --iters"  # the command that runs the token model at any depth
MAX_DECODE_STEPS = 64
DRAW_THRESHOLD = 0.25  # a token is masked when this share of its pixels is painted
DEFAULT_SAMPLE = "chelsea"  # the cat: of the shipped samples, the closest to CIFAR-10 (a CIFAR class, close-up)
DEFAULT_MASK_RATIO = 0.4  # the share of tokens the random mask hides by default (the training maximum)
DECODING_CHOICES = [("MaskGIT sampling", "maskgit"), ("expected embedding", "expected")]  # (label, value)
# The expected embedding by default: on 1,000 CIFAR-10 test images at 40% masking it is 1.5 dB PSNR and 0.05 SSIM
# closer to the originals than MaskGIT sampling (docs/mim.md), without the speckle of sampled codes; MaskGIT
# sampling, the paper's protocol, is one click away (and hyperset-eval's default).
DEFAULT_DECODING = "expected"


def _halvings(model: Any) -> int:
    """The halvings of a token model's step-length control (0: none)."""
    cfg = getattr(model, "cfg", None)
    return int(cfg.backtracks) if getattr(cfg, "step_control", "none") == "backtrack" else 0


class ReconstructionTab:
    """The reconstruction tab's handlers and layout around one shared MIM pipeline (None: the tab says what is
    missing, ``note``)."""

    def __init__(self, mim: Any = None, note: str = "") -> None:
        self.mim = mim
        self.note = note
        self.samples: dict[str, torch.Tensor] = {}
        if mim is not None:
            from hyperset.vision.reconstruct import sample_images

            try:
                self.samples = sample_images(mim.image_size)
            except FileNotFoundError:
                self.samples = {}

    @property
    def trained_iters(self) -> int:
        return int(self.mim.trained_iters) if self.mim is not None else 12

    @property
    def max_iters(self) -> int:
        """The most token-model iterations: 4x its trained depth, at most ``MAX_ITERS``."""
        return min(MAX_ITER_FACTOR * self.trained_iters, MAX_ITERS)

    def editor_value(self, image: torch.Tensor) -> dict[str, Any]:
        """(3, s, s) in [0, 1] -> an ImageEditor value with the upscaled image as background and no paint."""
        arr = to_display(image[None])
        return {"background": arr, "layers": [], "composite": arr}

    def sample_editor(self, name: str | None) -> Any:
        if not name or name not in self.samples:
            return gr.skip()
        return self.editor_value(self.samples[name])

    def upload_image(self, path: str | None) -> tuple[Any, str]:
        """An uploaded file -> the editor (resized to the tokenizer's input size), or a message."""
        if not path:
            return gr.skip(), ""
        try:
            if self.mim is None:
                raise InputError("no reconstruction model is loaded")
            size = os.path.getsize(path)
            if size > MAX_UPLOAD_BYTES:
                raise InputError(f"the file is too large ({size / 2**20:.1f} MB; at most "
                                 f"{MAX_UPLOAD_BYTES // 2**20} MB)")
            try:
                with Image.open(path) as img:
                    w, h = img.size
                    if problem := pixel_problem(w, h):
                        raise InputError(problem)
                    rgb = img.convert("RGB")
            except InputError:
                raise
            except Exception:
                raise InputError("could not read the file as an image (PNG, JPEG, WebP, ...)") from None
        except InputError as err:
            toast(str(err))
            return gr.skip(), error_md(str(err))
        from hyperset.vision.reconstruct import prepare_images

        s = self.mim.image_size
        image = prepare_images(rgb, s)[0]
        return self.editor_value(image), (f"Uploaded {w}x{h} image: centre square, resized to {s}x{s} (the "
                                          "tokenizer's input size).")

    def _editor_image(self, editor: Any) -> tuple[torch.Tensor, np.ndarray]:
        """Editor value -> (image (1, 3, s, s) in [0, 1], background as (H, W, 3) float 0-255)."""
        from hyperset.vision.reconstruct import prepare_images

        if not isinstance(editor, dict):
            raise InputError("choose a sample image or upload one")
        background = editor.get("background")
        if background is None:
            background = editor.get("composite")
        if background is None:
            raise InputError("choose a sample image or upload one")
        if isinstance(background, Image.Image):
            background = np.asarray(background)
        background = np.asarray(background)
        if background.ndim < 2 or background.shape[0] * background.shape[1] > MAX_IMAGE_PIXELS:
            raise InputError("the image is too large")
        rgb = rgb_array(background)
        s = self.mim.image_size
        x = torch.from_numpy(rgb / 255.0).permute(2, 0, 1)[None].float()
        h, w = rgb.shape[:2]
        if h == w and h % s == 0:
            x = F.avg_pool2d(x, h // s) if h != s else x  # exact for the nearest-neighbour previews shown here
        else:
            x = prepare_images(x, s)
        return x.clamp(0, 1), rgb

    def _drawn_mask(self, editor: dict[str, Any], background: np.ndarray) -> torch.Tensor:
        """The painted pixels (alpha of the editor's layers, or where the composite differs from the background)
        -> token mask (grid, grid)."""
        from hyperset.vision.reconstruct import pixel_to_token_mask

        h, w = background.shape[:2]
        painted = np.zeros((h, w), dtype=bool)
        for layer in editor.get("layers") or []:
            if layer is None:
                continue
            a = np.asarray(layer)
            if a.ndim != 3 or a.shape[2] != 4:
                continue
            alpha = a[..., 3] > 0
            if alpha.shape != (h, w):
                alpha = np.asarray(Image.fromarray(alpha.astype(np.uint8) * 255).resize((w, h), Image.NEAREST)) > 0
            painted |= alpha
        composite = editor.get("composite")
        if not painted.any() and composite is not None:
            comp = rgb_array(np.asarray(composite))
            if comp.shape[:2] == (h, w):
                painted = np.abs(comp - background).max(-1) > 8
        if not painted.any():
            raise InputError("paint over the part of the image to hide (or choose the random mask)")
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        m = torch.from_numpy(painted[top:top + side, left:left + side])
        g, s = self.mim.grid, self.mim.image_size
        if side % g:
            m = F.interpolate(m[None, None].float(), size=(s, s), mode="nearest")[0, 0] > 0.5
        return pixel_to_token_mask(m, g, threshold=DRAW_THRESHOLD)

    def reconstruct(self, editor: Any, mask_mode: Any = "random", ratio: Any = DEFAULT_MASK_RATIO, seed: Any = 0,
                    iterations: Any = None, steps: Any = 24, temperature: Any = 1.0,
                    paste_back: Any = True, decoding: Any = DEFAULT_DECODING) -> tuple[Any, ...]:
        """-> (original, masked input, tokenizer only, model output) images, metrics text, energy plot, what the
        plot shows, details. The tokenizer-only image is the original encoded and decoded with no mask (the
        ceiling of any token model); with ``paste_back`` the model output's unmasked pixels are the original's.
        ``decoding``: "maskgit" (MaskGIT sampling over ``steps`` steps) or "expected" (one forward pass, the
        expected code embedding at the masked tokens; ``temperature`` is its softmax's, ``steps`` is unused)."""
        from hyperset.vision.maskgit import mask_by_ratio
        from hyperset.vision.metrics import psnr, ssim
        from hyperset.vision.reconstruct import paste_unmasked

        t0 = time.perf_counter()
        try:
            if self.mim is None:
                raise InputError(f"no reconstruction model is loaded. {self.note}".strip())
            trained = self.trained_iters
            iters = iterations_in(trained if iterations is None else iterations, self.max_iters, MIM_CLI)
            n_steps = int_in(steps, 1, MAX_DECODE_STEPS, "decoding steps")
            temp = float_in(temperature, 0.0, 5.0, "temperature")
            decode = DEFAULT_DECODING if decoding is None else str(decoding).lower()
            if decode not in {value for _, value in DECODING_CHOICES}:
                raise InputError(f"decoding must be 'maskgit' or 'expected' (got {decoding!r})")
            seed_v = int_in(seed if seed is not None else 0, 0, 2**31 - 1, "seed")
            image, background = self._editor_image(editor)
            g = self.mim.grid
            if str(mask_mode).lower() == "drawn":
                mask = self._drawn_mask(editor, background)
            elif str(mask_mode).lower() == "random":
                r = float_in(ratio, 0.0, 1.0, "mask ratio")
                mask = mask_by_ratio((1, g, g), r, generator=torch.Generator().manual_seed(seed_v))[0]
            else:
                raise InputError(f"mask must be 'random' or 'drawn' (got {mask_mode!r})")
            if not mask.any():
                raise InputError("the mask covers no token: raise the ratio or paint a larger area")
        except InputError as err:
            toast(str(err))
            return (*(gr.skip(),) * 4, error_md(str(err)), gr.skip(), gr.skip(), {"error": str(err)})
        paste = paste_back is None or bool(paste_back)
        result = self.mim.reconstruct(image, mask[None], iters=iters, steps=n_steps, temperature=temp,
                                      generator=torch.Generator().manual_seed(seed_v), decode=decode)
        raw = result.images.float().clamp(0, 1)
        shown = paste_unmasked(raw, image, result.mask) if paste else raw
        tokenizer_only = result.tokenizer_images.float().clamp(0, 1)
        s = self.mim.image_size
        hidden = F.interpolate(result.mask[:, None].float(), size=(s, s), mode="nearest").bool().expand_as(image)

        def masked_psnr(x: torch.Tensor) -> float:
            mse = float((x - image).pow(2)[hidden].mean())
            return min(100.0, 10 * math.log10(1.0 / mse)) if mse > 0 else 100.0

        p_shown, q_shown = float(psnr(shown, image, max_db=100.0)[0]), float(ssim(shown, image)[0])
        p_raw = float(psnr(raw, image, max_db=100.0)[0])
        p_tok, q_tok = float(psnr(tokenizer_only, image, max_db=100.0)[0]), float(ssim(tokenizer_only, image)[0])
        p_hidden, p_tok_hidden = masked_psnr(raw), masked_psnr(tokenizer_only)
        n_masked, n_tokens = int(mask.sum()), mask.numel()
        seconds = time.perf_counter() - t0
        how = "unmasked pixels pasted back from the original" if paste else "the raw output, nothing pasted back"
        decoded = (f"expected code embedding (one forward pass), softmax temperature {temp:g}" if decode == "expected"
                   else f"MaskGIT sampling, {n_steps} decoding steps, temperature {temp:g}")
        metrics = (f"**Model: PSNR {p_shown:.2f} dB · SSIM {q_shown:.3f}** ({how}; raw output {p_raw:.2f} dB) · "
                   f"**tokenizer only: PSNR {p_tok:.2f} dB · SSIM {q_tok:.3f}** (no mask: the ceiling of the raw "
                   f"output) · on the masked pixels alone: model {p_hidden:.2f} dB, tokenizer only "
                   f"{p_tok_hidden:.2f} dB · {n_masked}/{n_tokens} tokens masked · {iters} iterations (trained "
                   f"{trained}), {decoded} · {s}x{s} px · {seconds:.2f} s")
        details = {"psnr": round(p_shown, 4), "ssim": round(q_shown, 5), "paste_back": paste,
                   "raw_psnr": round(p_raw, 4), "masked_pixels_psnr": round(p_hidden, 4),
                   "tokenizer_psnr": round(p_tok, 4), "tokenizer_ssim": round(q_tok, 5),
                   "tokenizer_masked_pixels_psnr": round(p_tok_hidden, 4), "masked_tokens": n_masked,
                   "tokens": n_tokens, "iterations": iters, "trained_depth": trained, "decoding": result.decode,
                   "steps": result.steps, "temperature": temp, "seed": seed_v, "image_size": s,
                   "energy": result.energy, "step_sizes": result.step_sizes, "seconds": round(seconds, 3)}
        plot = energy_svg([result.energy], trained, x_max=iters,
                             title="Token model's last forward pass: energies after each iteration")
        note = energy_note(result.energy, result.step_sizes, result.decode, _halvings(self.mim.model))
        return (to_display(image), to_display(result.masked_images.float()), to_display(tokenizer_only),
                to_display(shown), metrics, plot, note, details)

    def layout(self) -> None:
        if self.mim is None:
            gr.Markdown(f"**No reconstruction model is loaded.** {self.note}")
            return
        trained, s = self.trained_iters, self.mim.image_size
        names = list(self.samples)
        default = DEFAULT_SAMPLE if DEFAULT_SAMPLE in self.samples else (names[0] if names else None)
        first = self.editor_value(self.samples[default]) if default else None
        n_params = sum(p.numel() for p in self.mim.model.parameters())
        gr.Markdown(mim_training_note(getattr(self.mim, "info", None), n_params, trained), elem_id="mim-training")
        with gr.Row(equal_height=False):
            with gr.Column(scale=3):
                sample = gr.Dropdown(names, value=default, elem_id="mim-sample",
                                     label=f"Sample image ({s}x{s}; the default, a cat, is the closest to the CIFAR-10 "
                                           "images the models were trained on)")
                upload = gr.Image(type="filepath", sources=["upload", "clipboard"], height=120,
                                  label=f"...or upload an image (centre square resized to {s}x{s})",
                                  elem_id="mim-upload")
                editor = gr.ImageEditor(value=first, type="numpy", image_mode="RGBA", sources=[], layers=False,
                                        transforms=[], canvas_size=(DISPLAY_SIDE, DISPLAY_SIDE), fixed_canvas=True,
                                        brush=gr.Brush(colors=["#ff00ff"], default_size=24, color_mode="fixed"),
                                        format="png", label="Image (paint here for the 'drawn' mask)",
                                        elem_id="mim-editor")
                for image_input in (upload, editor):
                    limit_pixels(image_input)  # a picture too large is refused from its header, before decoding
                mask_mode = gr.Radio(["random", "drawn"], value="random", label="Mask", elem_id="mim-mask-mode",
                                     info="random: a share of the tokens (seeded) · drawn: the tokens you paint")
                ratio = gr.Slider(0.05, 1.0, value=DEFAULT_MASK_RATIO, step=0.05,
                                  label="Masked share of tokens (random mask)")
                seed = gr.Number(value=0, precision=0, minimum=0, label="Seed (mask and sampling)")
                paste_back = gr.Checkbox(value=True, elem_id="mim-paste-back",
                                         label="Paste the unmasked pixels back into the model's output (then only "
                                               "the masked tokens' pixels are the model's)")
                iters = gr.Slider(1, self.max_iters, value=trained, step=1, elem_id="mim-iters",
                                  label=f"Token-model iterations (trained depth {trained})",
                                  info=f"the app runs 1 to {self.max_iters:,} ({MIM_CLI} takes up to "
                                       f"{MAX_ITERS:,}); a value typed past them moves back into range")
                iters_note = gr.Markdown("", elem_id="mim-iters-note")
                decoding = gr.Radio(DECODING_CHOICES, value=DEFAULT_DECODING, label="Decoding",
                                    elem_id="mim-decoding",
                                    info="MaskGIT sampling: the paper's, one code drawn per token over the decoding "
                                         "steps · expected embedding: one forward pass, each masked token decoded "
                                         "from the mean code vector under the model's distribution (higher PSNR, "
                                         "less sharp)")
                steps = gr.Slider(1, MAX_DECODE_STEPS, value=24, step=1, label="Decoding steps (MaskGIT; paper: 24)")
                temperature = gr.Slider(0.0, 2.0, value=1.0, step=0.1,
                                        label="Temperature (of the sampling, or of the expected embedding's softmax; "
                                              "0 = argmax)")
                recon_btn = gr.Button("Reconstruct", variant="primary", elem_id="reconstruct-btn")
            with gr.Column(scale=7):
                with gr.Row():
                    original = gr.Image(label="Original", format="png", interactive=False, elem_id="mim-original")
                    masked = gr.Image(label="Masked input", format="png", interactive=False, elem_id="mim-masked")
                    tokenizer = gr.Image(label="Tokenizer only", format="png", interactive=False,
                                         elem_id="mim-tokenizer")
                    recon = gr.Image(label="Model output", format="png", interactive=False, elem_id="mim-recon")
                gr.Markdown("Tokenizer only: the original encoded and decoded with no mask, the best any token model "
                            "can do. Model output: the masked tokens filled in by the token model (MaskGIT sampling, "
                            "or the expected code embedding: see Decoding), decoded by the same tokenizer.",
                            elem_id="mim-columns")
                metrics = gr.Markdown("Choose an image and a mask, then press **Reconstruct**.",
                                      elem_id="mim-metrics", label="metrics")
                plot = gr.HTML(label="energy_plot", elem_id="mim-energy")
                note = gr.Markdown("", elem_id="mim-energy-note", label="energy_note")
                with gr.Accordion("Details (JSON)", open=False):
                    details = gr.JSON(label="details", show_label=False)
        sample.change(self.sample_editor, [sample], [editor], api_name="sample", concurrency_limit=None)
        upload.upload(self.upload_image, [upload], [editor, metrics], api_name="upload", concurrency_limit=None)
        for component in (mask_mode, ratio, seed, iters, steps, temperature, paste_back, decoding):
            lenient(component)
        recon_btn.click(self.reconstruct,
                        [editor, mask_mode, ratio, seed, iters, steps, temperature, paste_back, decoding],
                        [original, masked, tokenizer, recon, metrics, plot, note, details], api_name="reconstruct",
                        concurrency_id=MODEL_QUEUE)
        iters.input(lambda value: iterations_note(value, self.max_iters, MIM_CLI), [iters], [iters_note],
                    api_visibility="private", concurrency_limit=None, show_progress="hidden")
