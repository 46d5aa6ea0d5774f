"""What the app draws as HTML, Markdown and images: the Sudoku board, the token model's training note, what the
reconstruction's energy plot shows, input problems, and images upscaled for display (the energy plot itself:
:mod:`hyperset.apps.energy_plot`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from hyperset.sudoku.board import cell_name

from .inputs import InputError

__all__ = ["DISPLAY_SIDE", "cells_list", "energy_note", "error_md", "mim_training_note", "render_board", "rgb_array",
           "to_display"]

DISPLAY_SIDE = 256  # images are shown upscaled to about this many pixels


def render_board(board: str, givens: str, confidence: Sequence[float] | None = None,
                 conflicting: Iterable[int] = (), caption: str = "") -> str:
    """A 9x9 board as HTML with inline styles: givens bold on grey, predicted digits on blue whose strength is
    the model's confidence, conflicting cells red. ``board`` and ``givens`` are 81 characters, 0 = blank."""
    bad = set(conflicting)
    rows = []
    for r in range(9):
        cells = []
        for c in range(9):
            i = r * 9 + c
            d, given = board[i], givens[i] != "0"
            border = ("border-top:{};border-left:{};border-right:{};border-bottom:{};".format(
                "3px solid #111827" if r % 3 == 0 else "1px solid #9ca3af",
                "3px solid #111827" if c % 3 == 0 else "1px solid #9ca3af",
                "3px solid #111827" if c == 8 else "1px solid #9ca3af",
                "3px solid #111827" if r == 8 else "1px solid #9ca3af"))
            if d == "0":
                text, bg, fg, weight, title = "", "#ffffff", "#111827", 400, f"{cell_name(i)}: blank"
            elif given:
                text, bg, fg, weight, title = d, "#e5e7eb", "#111827", 800, f"{cell_name(i)}: given {d}"
            else:
                p = float(confidence[i]) if confidence is not None else 1.0
                bg = f"rgba(37,99,235,{0.06 + 0.5 * max(0.0, min(1.0, p)):.3f})"
                text, fg, weight = d, "#1e3a8a", 500
                title = f"{cell_name(i)}: {d} (confidence {p:.2f})"
            if i in bad:
                bg, fg = ("#fca5a5" if given else "#fee2e2"), "#b91c1c"
                title += " - conflict"
            cells.append(f'<td title="{title}" style="{border}width:2.1em;height:2.1em;padding:0;margin:0;'
                         f'text-align:center;vertical-align:middle;background:{bg};color:{fg};'
                         f'font-weight:{weight};">{text}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    legend = ('<span style="font-weight:800">bold</span> = given &nbsp;·&nbsp; '
              '<span style="background:rgba(37,99,235,0.5);padding:0 4px">blue</span> = predicted, darker = more '
              'confident &nbsp;·&nbsp; <span style="color:#b91c1c;background:#fee2e2;padding:0 4px">red</span> = '
              'conflict')
    note = f'<div style="margin-top:4px;font-weight:600">{caption}</div>' if caption else ""
    return ('<div class="hyperset-board" style="display:flex;flex-direction:column;align-items:center;'
            'background:#ffffff;color:#111827;color-scheme:light;padding:10px;border-radius:8px;">'
            '<table style="border-collapse:collapse;font-family:ui-monospace,Menlo,Consolas,monospace;'
            'font-size:22px;line-height:1;margin:0;">' + "".join(rows) + "</table>" + note +
            f'<div style="margin-top:6px;font-size:12px;color:#4b5563">{legend}</div></div>')


def cells_list(cells: Iterable[int], limit: int = 24) -> str:
    names = [cell_name(i) for i in cells]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def error_md(message: str) -> str:
    return f"**Input problem:** {message}"


def _count(value: Any) -> int | None:
    """A positive whole number from a config value, else None (missing, null, a string, a bool, zero)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return int(value)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def mim_training_note(info: dict[str, Any] | None, parameters: int | None = None,
                      trained_iters: int | None = None) -> str:
    """The token model's training budget and measured PSNR, as its checkpoint's config.json records them (``info``:
    the dict ``load_mim`` keeps as ``MIMPipeline.info``), in one Markdown paragraph. Every fact is read at run
    time and is optional: a field the file lacks is left out, never guessed; with none, the note says so."""
    info = info if isinstance(info, dict) else {}
    section = lambda key: info.get(key) if isinstance(info.get(key), dict) else {}  # noqa: E731
    train, data = section("train"), section("data")
    model = [f"{parameters / 1e6:.2f} M parameters" if parameters else "",
             f"trained depth {trained_iters}" if trained_iters else ""]
    facts = []
    steps, planned, batch = _count(info.get("steps")), _count(train.get("steps")), _count(train.get("batch_size"))
    train_images = _count(data.get("train_images"))
    source = str(data.get("source") or "").split(" (")[0]
    if isinstance(info.get("budget"), str) and info["budget"]:
        facts.append(info["budget"])  # the whole budget, as recorded, when it spans several runs
    elif steps:
        budget = f"trained for {steps:,} steps"
        if batch:
            budget += f" of {batch} images ({steps * batch:,} images seen"
            if train_images:
                budget += f": {steps * batch / train_images:.1f} epochs of {train_images:,}"
                budget += f" {source} images)" if source else " training images)"
            else:
                budget += ")"
        if planned and planned > steps:
            budget += f", step {steps:,} of the {planned:,} its recipe plans (an early snapshot)"
        facts.append(budget)
    elif train_images:
        facts.append(f"trained on {train_images:,} {source or 'training'} images")
    if info.get("device"):
        facts.append(f"on {info['device']}")
    metrics = section("metrics")
    evaluation = data.get("eval") if isinstance(data.get("eval"), dict) else {}
    measured = []
    for key in sorted(metrics):
        value = _number(metrics[key])
        name = str(key).split("/")[-1]
        if value is None or not name.startswith("psnr"):
            continue
        pct, _, depth = name.split("@", 1)[1].partition("_iters") if "@" in name else ("", "", "")
        where = (f" with {pct}% of the tokens masked" if pct else "") + (f" at {depth} iterations" if depth else "")
        measured.append(f"PSNR **{value:.2f} dB**{where}")
    ceiling = _number(metrics.get("val/tokenizer_psnr"))
    if measured and ceiling is not None:
        measured.append(f"tokenizer alone {ceiling:.2f} dB")
    text = "**Token model** (from its config.json): " + ", ".join(m for m in model if m)
    text += ("; " if any(model) else "") + (", ".join(facts) if facts else "no training budget recorded") + "."
    if measured:
        n_eval, n_steps = _count(evaluation.get("images")), _count(evaluation.get("steps"))
        decoding = ("expected code embedding" if evaluation.get("decode") == "expected"
                    else f"{n_steps} decoding steps" if n_steps else "")
        on = [f"{n_eval:,} validation images" if n_eval else "validation images", decoding]
        text += (f" Validation metrics it records ({', '.join(o for o in on if o)}): " + ", ".join(measured) +
                 " (the model's raw output, nothing pasted back).")
    else:
        text += " No measured PSNR recorded."
    test = section("evaluation")

    def psnr_by_depth(key: str) -> list[tuple[str, float]]:
        """(iterations, PSNR) of the evaluation's `key` table, its malformed rows left out."""
        table = test.get(key) if isinstance(test.get(key), dict) else {}
        rows = [(k, _number(v.get("psnr"))) for k, v in table.items() if isinstance(v, dict)]
        return [(k, v) for k, v in rows if v is not None]

    scores = psnr_by_depth("by_iterations")
    if scores:
        n_test, pct = _count(test.get("images")), _number(test.get("mask_ratio"))
        where = ", ".join(x for x in (f"{n_test:,} {test.get('split') or 'test'} images" if n_test else "",
                                      f"{100 * pct:.0f}% of the tokens masked" if pct is not None else "") if x)
        text += (f" Measured ({where}; nothing pasted back): PSNR " +
                 " / ".join(f"{v:.2f}" for _, v in scores) + " dB at " + " / ".join(k for k, _ in scores) +
                 " iterations")
        other = psnr_by_depth("expected_by_iterations")
        if other:
            text += (" with MaskGIT sampling, " + " / ".join(f"{v:.2f}" for _, v in other) + " dB at " +
                     " / ".join(k for k, _ in other) + " with the expected embedding")
        text += "."
    return text


def energy_note(energy: dict[str, Sequence[float]], step_sizes: dict[str, Sequence[float]] | None = None,
                decoding: str = "maskgit", halvings: int = 0) -> str:
    """What the reconstruction tab's energy plot shows, with this run's numbers: which energies, which forward
    pass (``decoding``: "maskgit", the pass at the last decoding step; "expected", the one pass), the signs of the
    step sizes, the model's step-length control (``halvings`` > 0: ``model.step_control = "backtrack"`` with that
    many halvings) and whether E_ATTN and E_ATTN + E_FF fell (from the values, never assumed)."""
    attn, ff = list(energy.get("attn") or []), list(energy.get("ff") or [])
    if not attn:
        return "This model defines no energy."
    n = len(attn)
    which = ("the token model's only forward pass (expected embedding: every masked token at once)"
             if decoding == "expected" else "the token model's forward pass at the last decoding step")
    text = (f"**What the plot shows:** E_ATTN + E_FF, and E_ATTN and E_FF apart, as the paper defines them "
            f"(normalization first, without the learned gains) after each of the {n} iterations of {which}. Each "
            "iteration is an attention step x − α ∇E_ATTN, then a feedforward step x − γ ∇E_FF (eq. 9 and 11); α "
            "and γ are learned per token and channel with no sign constraint.")
    if halvings:
        text += (f" This model runs with a step-length control: an iteration's update is halved (up to {halvings} "
                 "times) until E_ATTN + E_FF does not rise, and left out where no halving helps, so the sum cannot "
                 "rise; E_ATTN or E_FF alone may.")
    alpha_neg = list((step_sizes or {}).get("alpha_negative") or [])
    gamma_neg = list((step_sizes or {}).get("gamma_negative") or [])
    if alpha_neg:
        text += (f" In this pass {float(np.mean(alpha_neg)):.0%} of the α entries" +
                 (f" and {float(np.mean(gamma_neg)):.0%} of the γ entries" if gamma_neg else "") +
                 " are negative; where α < 0 the attention step climbs E_ATTN instead of descending it.")
    if n > 1:
        went = "rose" if attn[-1] > attn[0] else "fell"
        text += f" Here E_ATTN {went} from {attn[0]:,.0f} (iteration 1) to {attn[-1]:,.0f} (iteration {n})"
        if ff:
            total = np.asarray(attn[:len(ff)], dtype=np.float64) + np.asarray(ff[:len(attn)], dtype=np.float64)
            ups = int((np.diff(total) > 1e-5 * np.abs(total[:-1]).clip(min=1.0)).sum())
            text += (", and E_ATTN + E_FF never rose" if not ups else
                     f", and E_ATTN + E_FF rose at {ups} of {len(total) - 1} iterations")
        text += "."
    signed = list((step_sizes or {}).get("attn_step") or [])
    unsigned = list((step_sizes or {}).get("attn_step_abs") or [])
    if signed and unsigned:
        up, up_abs = float(np.sum(signed)), float(np.sum(unsigned))
        text += (f" The attention steps of this pass changed E_ATTN by {up:+,.0f} in all; each of them with |α| in "
                 f"place of α (the same magnitudes) would have changed it by {up_abs:+,.0f} in all")
        text += (": the rise comes from the negative α, a property of the trained step sizes." if up > 0 > up_abs
                 else ".")
    return text


def to_display(images: torch.Tensor) -> np.ndarray:
    """(1, 3, s, s) in [0, 1] -> (S, S, 3) uint8, upscaled by an integer factor with nearest-neighbour."""
    img = images[0].clamp(0, 1)
    scale = max(1, DISPLAY_SIDE // img.shape[-1])
    if scale > 1:
        img = img.repeat_interleave(scale, 1).repeat_interleave(scale, 2)
    return (img.permute(1, 2, 0).numpy() * 255 + 0.5).astype(np.uint8)


def rgb_array(array: np.ndarray) -> np.ndarray:
    """Any image array (H, W), (H, W, 3) or (H, W, 4) -> (H, W, 3) float in [0, 255]; transparency on white."""
    a = np.asarray(array)
    if a.ndim == 2:
        a = np.repeat(a[..., None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise InputError(f"unexpected image shape {tuple(a.shape)}")
    a = a.astype(np.float32)
    if a.shape[2] == 4:
        alpha = a[..., 3:] / 255.0
        a = a[..., :3] * alpha + 255.0 * (1 - alpha)
    return a
