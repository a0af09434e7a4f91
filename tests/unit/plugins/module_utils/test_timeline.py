# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The memory timeline SVG: well-formed, every series drawn, the KV moment where it belongs."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from ansible_collections.uma.vllm.plugins.module_utils.diagnose import timeline as tl

NS = {"s": "http://www.w3.org/2000/svg"}
GIB = 1024**3


def samples(n=50, t_step=2.0):
    rows = []
    for i in range(n):
        rows.append(
            {
                "t": i * t_step,
                "MemAvailable": (110 - i) * GIB,
                "Cached": (4 + i * 0.8) * GIB,
                "Mapped": 2 * GIB,
                "AnonPages": (2 + i) * GIB,
                "Dirty": 0,
            }
        )
    return rows


def parse(svg):
    return ET.fromstring(svg.encode("utf-8"))


def test_every_series_is_a_polyline_with_one_point_per_sample():
    root = parse(tl.render_svg(samples(), kv_alloc_t=61.0))
    lines = root.findall("s:polyline", NS)
    assert [p.get("data-key") for p in lines] == ["MemAvailable", "Cached", "Mapped", "AnonPages", "Dirty"]
    assert all(len(p.get("points").split()) == 50 for p in lines)


@pytest.mark.parametrize("kv_t,fraction", [(0.0, 0.0), (49.0, 0.5), (98.0, 1.0)])
def test_kv_mark_is_placed_on_the_time_axis(kv_t, fraction):
    root = parse(tl.render_svg(samples(), kv_alloc_t=kv_t, width=900))
    mark = root.find("s:line[@class='mark']", NS)
    assert mark is not None
    left, plot_w = 70, 900 - 70 - 190
    assert float(mark.get("x1")) == pytest.approx(left + fraction * plot_w, abs=0.2)
    assert any("KV cache allocated" in (t.text or "") for t in root.findall("s:text", NS))


def test_mark_after_the_last_sample_stretches_the_axis():
    root = parse(tl.render_svg(samples(10), kv_alloc_t=None, marks=[(40.0, "failed")]))
    mark = root.find("s:line[@class='mark']", NS)
    assert float(mark.get("x1")) == pytest.approx(70 + (900 - 70 - 190), abs=0.2)


def test_series_missing_from_samples_is_left_out_and_threshold_drawn():
    rows = [{"t": 0, "Cached": GIB}, {"t": 1, "Cached": 3 * GIB}]
    root = parse(tl.render_svg(rows, threshold_bytes=2 * GIB))
    assert [p.get("data-key") for p in root.findall("s:polyline", NS)] == ["Cached"]
    assert root.find("s:line[@class='threshold']", NS) is not None


def test_no_samples_still_renders_a_readable_svg():
    root = parse(tl.render_svg([], kv_alloc_t=3.0, title="engine <x> & y"))
    assert root.find("s:title", NS).text == "engine <x> & y"
    assert any("no samples" in (t.text or "") for t in root.findall("s:text", NS))


def test_many_samples_are_thinned_but_the_peak_survives():
    rows = [{"t": float(i), "Cached": GIB} for i in range(10000)]
    rows[7777]["Cached"] = 50 * GIB
    svg = tl.render_svg(rows)
    poly = parse(svg).find("s:polyline", NS)
    points = [tuple(map(float, p.split(","))) for p in poly.get("points").split()]
    assert len(points) <= tl.MAX_POINTS + 2
    assert min(p[1] for p in points) < 100  # the 50 GiB spike is near the top of the plot


@pytest.mark.parametrize(
    "low,high,expected",
    [(0, 10, [0, 2, 4, 6, 8, 10]), (0, 119.7, [0, 20, 40, 60, 80, 100, 120]), (0, 0, [0, 0.2, 0.4, 0.6, 0.8, 1.0])],
)
def test_nice_ticks(low, high, expected):
    assert tl.nice_ticks(low, high) == pytest.approx(expected)
