# -*- coding: utf-8 -*-
# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Memory timeline of one engine launch as a self-contained SVG (pure Python, stdlib only).

Input is the guard's ``samples.jsonl`` rows (``t`` seconds since launch start and
``/proc/meminfo`` values in bytes); output is an SVG document with one line per
series, the KV-cache allocation moment marked, and optional further marks
(healthy, failed) and a horizontal threshold (the page-cache limit).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

GIB = 1024**3

# (meminfo key, label, colour): colours readable for the common colour-vision deficiencies.
SERIES: Tuple[Tuple[str, str, str], ...] = (
    ("MemAvailable", "MemAvailable", "#0072b2"),
    ("Cached", "Cached (page cache)", "#e69f00"),
    ("Mapped", "Mapped", "#009e73"),
    ("AnonPages", "AnonPages", "#cc79a7"),
    ("Dirty", "Dirty", "#999999"),
)

MAX_POINTS = 1200


def nice_ticks(low: float, high: float, count: int = 6) -> List[float]:
    """Round tick values covering [low, high] (1, 2, 5 x 10^n steps)."""
    if high <= low:
        high = low + 1.0
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.floor(low / step) * step
    ticks = [round(start, 10)]
    while ticks[-1] < high - step * 1e-9:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def _thin(points: List[Tuple[float, float]], limit: int) -> List[Tuple[float, float]]:
    """Keep at most ``limit`` points; each kept bucket keeps its min and max so peaks survive."""
    if len(points) <= limit:
        return points
    bucket = max(1, len(points) * 2 // limit + 1)
    out: List[Tuple[float, float]] = []
    for i in range(0, len(points), bucket):
        chunk = points[i : i + bucket]
        lo = min(chunk, key=lambda p: p[1])
        hi = max(chunk, key=lambda p: p[1])
        out.extend(sorted({lo, hi}, key=lambda p: p[0]))
    return out


class _Plot(NamedTuple):
    """The plot area (pixels) and its scales: seconds t0..t1 across, 0..y_top GiB up."""

    left: int
    top: int
    plot_w: int
    plot_h: int
    t0: float
    t1: float
    y_top: float

    def x(self, t: float) -> float:
        return self.left + (t - self.t0) / (self.t1 - self.t0) * self.plot_w

    def y(self, gib: float) -> float:
        return self.top + self.plot_h - gib / self.y_top * self.plot_h


def _head(title: str, width: int, height: int, left: int) -> List[str]:
    return [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d"'
        ' font-family="sans-serif" font-size="12">' % (width, height, width, height),
        "<title>%s</title>" % escape(title),
        '<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>' % (width, height),
        '<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>' % (left, escape(title)),
    ]


def _time_range(rows: Sequence[Dict[str, Any]], kv_alloc_t: Optional[float], marks: Any) -> Tuple[float, float]:
    """First to last second shown: the samples, stretched to every mark."""
    t0, t1 = float(rows[0]["t"]), float(rows[-1]["t"])
    extra_t = [float(mark[0]) for mark in (marks or [])] + ([float(kv_alloc_t)] if kv_alloc_t is not None else [])
    t1 = max([t1, *extra_t])
    if t1 <= t0:
        t1 = t0 + 1.0
    return t0, t1


def _axes(plot: _Plot, y_ticks: List[float], x_ticks: List[float], width: int, height: int) -> List[str]:
    left, top, plot_w, plot_h = plot.left, plot.top, plot.plot_w, plot.plot_h
    x, y = plot.x, plot.y
    body: List[str] = []
    for tick in y_ticks:
        body.append(
            '<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e0e0e0"/>' % (left, y(tick), left + plot_w, y(tick))
        )
        body.append('<text x="%d" y="%.1f" text-anchor="end">%g</text>' % (left - 6, y(tick) + 4, tick))
    for tick in x_ticks:
        body.append(
            '<text x="%.1f" y="%d" text-anchor="middle">%g</text>' % (x(tick), top + plot_h + 16, round(tick, 3))
        )
    body.append(
        '<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444444"/>' % (left, top, plot_w, plot_h)
    )
    body.append(
        '<text x="%d" y="%d" text-anchor="middle">seconds since launch start</text>' % (left + plot_w // 2, height - 12)
    )
    body.append(
        '<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">GiB</text>'
        % (top + plot_h // 2, top + plot_h // 2)
    )
    return body


def _threshold(plot: _Plot, threshold_bytes: Optional[float], threshold_label: str) -> List[str]:
    if not threshold_bytes:
        return []
    ty = plot.y(float(threshold_bytes) / GIB)
    return [
        '<line class="threshold" x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d55e00" stroke-dasharray="6 4"/>'
        % (plot.left, ty, plot.left + plot.plot_w, ty),
        '<text x="%d" y="%.1f" fill="#d55e00" text-anchor="end">%s</text>'
        % (plot.left + plot.plot_w - 4, ty - 4, escape(threshold_label)),
    ]


def _series(plot: _Plot, rows: Sequence[Dict[str, Any]], series: List[Tuple[str, str, str]]) -> List[str]:
    body: List[str] = []
    for key, _label, colour in series:
        points = _thin([(float(r["t"]), float(r[key]) / GIB) for r in rows if key in r], MAX_POINTS)
        coords = " ".join("%.1f,%.1f" % (plot.x(t), plot.y(v)) for t, v in points)
        body.append(
            '<polyline class="series" data-key="%s" fill="none" stroke="%s" stroke-width="2" points="%s"/>'
            % (key, colour, coords)
        )
    return body


def _marks(plot: _Plot, kv_alloc_t: Optional[float], marks: Optional[Sequence[Tuple[float, str]]]) -> List[str]:
    """The KV-cache allocation moment and the further marks, as dashed vertical lines with labels."""
    top, plot_h = plot.top, plot.plot_h
    all_marks: List[Tuple[float, str, str]] = []
    if kv_alloc_t is not None:
        all_marks.append((float(kv_alloc_t), "KV cache allocated", "#d55e00"))
    all_marks += [(float(t), label, "#555555") for t, label in (marks or [])]
    body: List[str] = []
    for i, (t, label, colour) in enumerate(all_marks):
        mx = plot.x(t)
        body.append(
            '<line class="mark" data-t="%g" x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="%s" stroke-width="2"'
            ' stroke-dasharray="3 3"/>' % (t, mx, top, mx, top + plot_h, colour)
        )
        # Labels of marks in the right part of the plot go to the left of the line.
        anchor, dx = ("end", -4) if mx > plot.left + 0.7 * plot.plot_w else ("start", 4)
        body.append(
            '<text x="%.1f" y="%d" fill="%s" text-anchor="%s">%s (%gs)</text>'
            % (mx + dx, top + 14 + 14 * i, colour, anchor, escape(label), t)
        )
    return body


def _legend(plot: _Plot, series: List[Tuple[str, str, str]]) -> List[str]:
    lx = plot.left + plot.plot_w + 16
    body: List[str] = []
    for i, (_key, label, colour) in enumerate(series):
        ly = plot.top + 10 + 20 * i
        body.append(
            '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>' % (lx, ly, lx + 22, ly, colour)
        )
        body.append('<text x="%d" y="%d">%s</text>' % (lx + 28, ly + 4, escape(label)))
    return body


def render_svg(
    samples: Sequence[Dict[str, Any]],
    kv_alloc_t: Optional[float] = None,
    title: str = "Memory during the load",
    marks: Optional[Sequence[Tuple[float, str]]] = None,
    threshold_bytes: Optional[float] = None,
    threshold_label: str = "page-cache threshold",
    width: int = 900,
    height: int = 420,
) -> str:
    """The SVG text (see the module docstring)."""
    left, right, top, bottom = 70, 190, 40, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    rows = sorted((s for s in samples if isinstance(s.get("t"), (int, float))), key=lambda s: s["t"])
    head = _head(title, width, height, left)
    if not rows:
        head.append('<text x="%d" y="%d">no samples were recorded for this launch</text>' % (left, top + plot_h // 2))
        return "\n".join([*head, "</svg>"]) + "\n"

    series = [(key, label, colour) for key, label, colour in SERIES if any(key in r for r in rows)]
    t0, t1 = _time_range(rows, kv_alloc_t, marks)
    keys = [entry[0] for entry in series]
    y_max = max([float(r.get(key, 0)) for r in rows for key in keys] + [float(threshold_bytes or 0)]) / GIB
    y_ticks = nice_ticks(0.0, y_max if y_max > 0 else 1.0)
    x_ticks = [t for t in nice_ticks(t0, t1, 8) if t0 <= t <= t1]
    plot = _Plot(left, top, plot_w, plot_h, t0, t1, y_ticks[-1])
    body = _axes(plot, y_ticks, x_ticks, width, height)
    body += _threshold(plot, threshold_bytes, threshold_label)
    body += _series(plot, rows, series)
    body += _marks(plot, kv_alloc_t, marks)
    body += _legend(plot, series)
    return "\n".join(head + body + ["</svg>"]) + "\n"
