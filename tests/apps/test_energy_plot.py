"""The app's energy plot (inline SVG): one panel per energy, one line per pass, every finite value a point at
its iteration, the trained depth marked, and the values' range on the y axis."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import pytest

from hyperset.apps.energy_plot import DEFAULT_TITLE, energy_svg, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"


def _svg(markup: str) -> ET.Element:
    root = ET.fromstring(markup)  # well-formed XML, or this raises
    svg = root.find(f"{SVG}svg")
    assert svg is not None
    return svg


def _points(line: ET.Element) -> list[tuple[float, float]]:
    return [tuple(map(float, p.split(","))) for p in line.get("points", "").split()]  # type: ignore[misc]


def test_panels_lines_and_points():
    passes = [{"attn": [5.0, 4.0, 3.0], "ff": [2.0, 1.5, 1.0]}, {"attn": [3.0, 2.5], "ff": [1.0, 0.9]}]
    svg = _svg(energy_svg(passes, trained=4, x_max=6))
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    assert "E_ATTN" in texts and "E_FF" in texts and "trained depth 4" in texts
    assert "pass 1" in texts and "pass 2" in texts
    # the total the iterations descend comes first, its parts beside it
    assert texts.index("E_ATTN + E_FF") < texts.index("E_ATTN") < texts.index("E_FF")
    lines = svg.findall(f"{SVG}polyline")
    assert [len(_points(p)) for p in lines] == [3, 2, 3, 2, 3, 2]
    total, a1, a2 = _points(lines[0]), _points(lines[2]), _points(lines[3])
    assert total[0][1] < total[1][1] < total[2][1]  # 7, 5.5, 4: falling
    # the same x for the same iteration, x grows with the iteration; a larger energy is higher (smaller y)
    assert a1[0][0] == a2[0][0] and a1[0][0] < a1[1][0] < a1[2][0]
    assert a1[0][1] < a1[1][1] < a1[2][1]
    # the dashed trained-depth line sits where iteration 4 would be (x spacing is uniform)
    dashed = [ln for ln in svg.findall(f"{SVG}line")
              if ln.get("stroke-dasharray") == "6 4" and ln.get("y1") != ln.get("y2")]
    step = a1[1][0] - a1[0][0]
    assert any(math.isclose(float(ln.get("x1")), a1[0][0] + 3 * step, abs_tol=0.2) for ln in dashed)
    # later passes are drawn darker: two colors for two passes
    assert lines[0].get("stroke") != lines[1].get("stroke")


def test_non_finite_values_are_skipped_and_ticks_cover_the_range():
    svg = _svg(energy_svg([{"attn": [10_900.0, float("nan"), 11_700.0]}], trained=12, title="last pass"))
    line = svg.find(f"{SVG}polyline")
    assert line is not None and len(_points(line)) == 2
    labels = [t.text for t in svg.iter(f"{SVG}text") if t.text and re.fullmatch(r"[\d,.-]+", t.text)]
    values = [float(v.replace(",", "")) for v in labels]
    assert any(10_850 <= v <= 11_000 for v in values) and any(11_500 <= v <= 11_750 for v in values)
    assert svg.find(f"{SVG}title").text == "last pass"  # type: ignore[union-attr]
    assert len(svg.findall(f"{SVG}circle")) == 2  # one pass: its points are marked


def test_no_energy_and_escaping():
    svg = _svg(energy_svg([], trained=16))
    assert "no energy trace" in "".join(t.text or "" for t in svg.iter(f"{SVG}text"))
    assert svg.find(f"{SVG}title").text == DEFAULT_TITLE  # type: ignore[union-attr]
    svg = _svg(energy_svg([{"<b>": [1.0, 2.0]}], trained=1, title="a < b & c"))
    assert "<b>" in [t.text for t in svg.iter(f"{SVG}text")]


@pytest.mark.parametrize("lo,hi,integer", [(0.5, 48.5, True), (-1234.5, -1100.2, False), (0.013, 0.037, False),
                                           (3.0, 3.0, False), (1, 7, True)])
def test_nice_ticks_are_round_and_inside(lo, hi, integer):
    ticks = nice_ticks(lo, hi, 5, integer=integer)
    assert ticks and all(lo - 1e-9 <= t <= hi + 1e-9 for t in ticks)
    if len(ticks) > 1:
        steps = {round(b - a, 9) for a, b in zip(ticks, ticks[1:])}
        assert len(steps) == 1
        step = steps.pop()
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert round(mantissa, 6) in (1, 2, 2.5, 5) and (not integer or float(step).is_integer())
