"""The app's energy plot against the iteration, as inline SVG: the total E_ATTN + E_FF, then E_ATTN and E_FF,
one panel each.

The plot is drawn by the browser from a few kilobytes of markup, far cheaper to build on the server than a
Matplotlib figure of the same panels, so the streamed solve can redraw it while it runs and the final update adds
almost nothing to the solve's time.

    energy_svg(passes, trained)  # -> "<div class='energy-plot'><svg ...>...</svg></div>"

``passes`` is a list of forward passes, each {"attn": [...], "ff": [...]} (one value per iteration, iteration 1
first); several passes (the commit strategy) are drawn as several lines, darker for later ones, and the legend
names the first and the last. A dashed red line marks the depth the model was trained with.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

ENERGY_LABELS = {"total": "E_ATTN + E_FF", "attn": "E_ATTN", "ff": "E_FF"}
DEFAULT_TITLE = "Energy per iteration (dashed: the depth the model was trained with)"

WIDTH, HEIGHT = 760, 290  # the whole plot, in SVG units (it scales to the width of its box)
TOP, BOTTOM, LEFT, RIGHT = 44, 42, 62, 14  # margins of each panel: title and legend / x labels / y labels / gap
GAP = 26  # between panels
BASE_COLOR = {"total": (31, 41, 55), "attn": (37, 99, 235), "ff": (234, 88, 12)}
TRAINED_COLOR = "#dc2626"


def nice_ticks(lo: float, hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """About ``count`` round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 times a power of ten; whole
    numbers only when ``integer``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if integer:
        step = max(1, round(step))
    first = math.ceil(lo / step - 1e-9) * step
    ticks, k = [], 0
    while first + k * step <= hi + 1e-9 * step:
        ticks.append(first + k * step)
        k += 1
    return ticks


def _label(v: float, step: float) -> str:
    """A tick value with as many decimals as its step needs (2.5e-k needs one more), thousands separated."""
    exponent = math.floor(math.log10(step))
    decimals = min(max(0, -exponent + (1 if round(step / 10**exponent, 6) == 2.5 else 0)), 6)
    return f"{v:,.{decimals}f}"


def _shade(rgb: tuple[int, int, int], k: int, n: int) -> str:
    """The color of pass ``k`` of ``n``: the base color, lighter for earlier passes."""
    mix = 1.0 if n <= 1 else 0.25 + 0.75 * (k + 1) / n  # 1.0 for the last pass
    return "#" + "".join(f"{round(255 - (255 - c) * mix):02x}" for c in rgb)


def _with_total(trace: dict[str, Sequence[float]]) -> dict[str, Sequence[float]]:
    """A pass's energies with their sum E_ATTN + E_FF as "total" (where the trace has both parts)."""
    attn, ff = trace.get("attn"), trace.get("ff")
    if not attn or not ff or "total" in trace:
        return trace
    return {"total": [float(a) + float(f) for a, f in zip(attn, ff)], **trace}


def _fmt(x: float) -> str:
    return f"{x:.1f}"


def _panel(name: str, passes: Sequence[Sequence[float]], x0: float, width: float, trained: int, x_hi: int) -> list[str]:
    """One panel's SVG elements, its plotting box starting at x0 and ``width`` wide."""
    out: list[str] = []
    y_top, y_bottom = TOP, HEIGHT - BOTTOM
    finite = [v for p in passes for v in p if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
    pad = (hi - lo) * 0.06 or (abs(hi) * 0.05 or 0.5)
    lo, hi = lo - pad, hi + pad
    xs_lo, xs_hi = 0.5, x_hi + 0.5

    def sx(x: float) -> float:
        return x0 + (x - xs_lo) / (xs_hi - xs_lo) * width

    def sy(y: float) -> float:
        return y_bottom - (y - lo) / (hi - lo) * (y_bottom - y_top)

    label = ENERGY_LABELS.get(name, name)
    out.append(f'<text x="{_fmt(x0 + width / 2)}" y="{TOP - 26}" text-anchor="middle" font-size="14" '
               f'font-weight="600">{html.escape(label)}</text>')
    out.append(f'<rect x="{_fmt(x0)}" y="{y_top}" width="{_fmt(width)}" height="{y_bottom - y_top}" fill="none" '
               f'stroke="#9ca3af"/>')
    y_ticks = nice_ticks(lo, hi, 5)
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    for v in y_ticks:
        y = sy(v)
        out.append(f'<line x1="{_fmt(x0)}" x2="{_fmt(x0 + width)}" y1="{_fmt(y)}" y2="{_fmt(y)}" '
                   f'stroke="#e5e7eb"/>')
        out.append(f'<text x="{_fmt(x0 - 5)}" y="{_fmt(y + 4)}" text-anchor="end" font-size="11">'
                   f'{_label(v, y_step)}</text>')
    for v in nice_ticks(1, x_hi, 6, integer=True):
        x = sx(v)
        out.append(f'<line x1="{_fmt(x)}" x2="{_fmt(x)}" y1="{y_top}" y2="{y_bottom}" stroke="#e5e7eb"/>')
        out.append(f'<text x="{_fmt(x)}" y="{y_bottom + 15}" text-anchor="middle" font-size="11">{v:.0f}</text>')
    out.append(f'<text x="{_fmt(x0 + width / 2)}" y="{HEIGHT - 8}" text-anchor="middle" font-size="12">'
               f'iteration</text>')
    x_t = sx(trained)
    out.append(f'<line x1="{_fmt(x_t)}" x2="{_fmt(x_t)}" y1="{y_top}" y2="{y_bottom}" stroke="{TRAINED_COLOR}" '
               f'stroke-width="1.5" stroke-dasharray="6 4"/>')
    rgb = BASE_COLOR.get(name, (75, 85, 99))
    legend: list[tuple[str, str, str]] = [(TRAINED_COLOR, "6 4", f"trained depth {trained}")]
    for k, values in enumerate(passes):
        points = [(sx(i + 1), sy(v)) for i, v in enumerate(values) if math.isfinite(v)]
        if not points:
            continue
        color = _shade(rgb, k, len(passes))
        path = " ".join(f"{_fmt(x)},{_fmt(y)}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.8" '
                   f'stroke-linejoin="round"/>')
        if len(passes) == 1 and len(points) < 80:
            out.extend(f'<circle cx="{_fmt(x)}" cy="{_fmt(y)}" r="2.2" fill="{color}"/>' for x, y in points)
        if len(passes) > 1 and k in (0, len(passes) - 1):
            legend.append((color, "", f"pass {k + 1}"))
    lx = x0 + 6
    for color, dash, text in legend:  # one row above the plotting box
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(f'<line x1="{_fmt(lx)}" x2="{_fmt(lx + 18)}" y1="{TOP - 9}" y2="{TOP - 9}" stroke="{color}" '
                   f'stroke-width="2"{dashes}/>')
        out.append(f'<text x="{_fmt(lx + 22)}" y="{TOP - 5}" font-size="11">{html.escape(text)}</text>')
        lx += 30 + 6.2 * len(text)
    return out


def energy_svg(passes: Sequence[dict[str, Sequence[float]]], trained: int, x_max: int | None = None,
               title: str = "") -> str:
    """The energy plot as HTML (a ``<div>`` holding one ``<svg>``): a panel per energy found in ``passes``
    (first the total E_ATTN + E_FF, which the iterations descend, where both parts are there; then E_ATTN, E_FF,
    then any other name), x from 1 to max(x_max, the longest pass, ``trained``), a dashed line at ``trained``;
    ``title`` (default: ``DEFAULT_TITLE``) is the caption under it."""
    passes = [_with_total(p) for p in passes]
    names = [k for k in ENERGY_LABELS if any(p.get(k) for p in passes)]
    names += sorted({k for p in passes for k, v in p.items() if v and k not in names})
    caption = html.escape(title or DEFAULT_TITLE)
    if not names:
        body = (f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="14">'
                'no energy trace (this model defines no energy)</text>')
    else:
        longest = max((len(v) for p in passes for v in p.values() if v), default=1)
        x_hi = max(x_max or longest, longest, trained, 2)
        width = (WIDTH - LEFT * len(names) - RIGHT - GAP * (len(names) - 1)) / len(names)
        parts: list[str] = []
        for j, name in enumerate(names):
            x0 = LEFT + j * (width + LEFT + GAP)
            series = [[float(v) for v in (p.get(name) or [])] for p in passes]
            parts += _panel(name, [s for s in series if s], x0, width, trained, x_hi)
        body = "".join(parts)
    return (f'<div class="energy-plot"><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="100%" role="img" aria-label="{caption}" font-family="sans-serif" fill="currentColor">'
            f'<title>{caption}</title>{body}</svg><div class="energy-caption" '
            f'style="font-size: 0.85em; text-align: center; opacity: 0.8">{caption}</div></div>')
