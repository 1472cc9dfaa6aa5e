"""Inline SVG line charts for the HTML report, laid out so no two texts overlap.

Why hand-made: the report is one self-contained file (no script, no CDN), and a chart
library would be its largest part. What makes them legible:
  - tick labels are thinned by their estimated width (x) or height (y), so crowded loads
    (1, 2, 4 ... 512 on a linear axis) or a long time axis never print on top of each other;
  - the legend sits below the plot, wrapped into rows, not over the lines;
  - latencies that span decades use a log axis (`log=True`), so a tail stays visible;
  - the load axis is padded, so the first stage (and a knee there) is off the y axis, and
    the knee's label sits at the top of the plot beside its dashed line;
  - several panels may share one x axis (`Panel`), so a stage's timeline is one chart.
Every data point is a `<circle class="pt">`, so a reader (or a test) can count them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

Series = tuple[str, str, Sequence[float], Sequence[float | None]]  # name, colour, xs, ys
FONT = 11
CHAR_W = 0.66  # a conservative average glyph width, in em, of the sans-serif fonts browsers pick


def esc(v: Any) -> str:
    return html.escape(str(v))


def text_width(text: str, size: float = FONT) -> float:
    return len(text) * size * CHAR_W


def num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _nice(x: float) -> float:
    base = 10 ** math.floor(math.log10(x))
    return next(base * m for m in (1, 2, 2.5, 5, 10) if base * m >= x)


@dataclass
class Scale:
    lo: float
    hi: float
    a: float  # pixel of lo
    b: float  # pixel of hi
    log: bool = False

    def __call__(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            f = (math.log10(v) - math.log10(self.lo)) / ((math.log10(self.hi) - math.log10(self.lo)) or 1.0)
        else:
            f = (v - self.lo) / ((self.hi - self.lo) or 1.0)
        return self.a + f * (self.b - self.a)

    def ticks(self) -> list[float]:
        if self.log:
            lo_e, hi_e = math.floor(math.log10(self.lo)), math.ceil(math.log10(self.hi))
            for mults in ((1,), (1, 3), (1, 2, 5)):
                t = [m * 10.0**e for e in range(lo_e, hi_e + 1) for m in mults]
                t = [v for v in t if self.lo * 0.999 <= v <= self.hi * 1.001]
                if len(t) >= 3:
                    return t
            # less than a decade: round numbers at linear steps, placed on the log axis
        step = _nice(((self.hi - self.lo) or 1.0) / 4)
        first = math.ceil(self.lo / step - 1e-9) * step
        return [first + i * step for i in range(int((self.hi - first) / step + 1e-9) + 1)]


def _range(values: Sequence[float], log: bool, pad: float, zero: bool) -> tuple[float, float]:
    vals = [v for v in values if v is not None and (v > 0 or not log)]
    if not vals:
        return (1.0, 10.0) if log else (0.0, 1.0)
    lo, hi = min(vals), max(vals)
    if log:
        if hi / lo < 1.3:
            lo, hi = lo / 1.15, hi * 1.15
        span = math.log10(hi) - math.log10(lo)
        return 10 ** (math.log10(lo) - pad * span), 10 ** (math.log10(hi) + pad * span)
    if zero and lo >= 0:
        lo = 0.0
    if hi == lo:
        hi = lo + (abs(lo) or 1.0)
    span = hi - lo
    return (lo if zero else lo - pad * span), hi + pad * span


def auto_log(values: Sequence[float | None], ratio: float = 20.0) -> bool:
    """Values spanning `ratio` or more (all > 0) read better on a log axis."""
    vals = [v for v in values if v is not None]
    return bool(vals) and min(vals) > 0 and max(vals) / min(vals) >= ratio


def _thin(items: list[tuple[float, float, float]], gap: float) -> list[int]:
    """Indexes of (position, low extent, high extent) items kept so none overlaps the previous."""
    keep: list[int] = []
    edge = -math.inf
    for i in sorted(range(len(items)), key=lambda k: items[k][0]):
        pos, lo, hi = items[i]
        if pos - lo >= edge + gap:
            keep.append(i)
            edge = pos + hi
    return keep


@dataclass
class Panel:
    series: list[Series]
    ylabel: str = ""
    log: bool = False
    height: int = 200
    yfloor_zero: bool = True
    extra: list[str] = field(default_factory=list)  # caller's SVG drawn in the plot area
    points_only: set[str] = field(default_factory=set)  # names of series drawn as points, not joined


def chart(
    title: str,
    panels: Panel | list[Panel],
    xlabel: str,
    *,
    xlog: bool = False,
    marks: Sequence[float] = (),
    mark_label: str = "knee",
    mark_labels: Sequence[str] | None = None,
    bands: Sequence[Sequence[float]] = (),
    w: int = 560,
    xticks: Sequence[float] | None = None,
    xpad: float = 0.04,
    xspan: Sequence[float] = (),
) -> str:
    """Panels stacked over one x axis; `marks` are dashed vertical lines labelled at the
    top, `bands` shaded x ranges (the measured windows), `xticks` the x labels wanted
    (default: round numbers), `xspan` x values the axis must include (a stage's start)."""
    panels = [panels] if isinstance(panels, Panel) else panels
    every = [s for p in panels for s in p.series]
    xs = [x for _, _, sx, sy in every for x, y in zip(sx, sy, strict=False) if y is not None]
    xs += [v for band in bands for v in band] + list(marks) + list(xspan)
    xlo, xhi = _range(xs, xlog, xpad, zero=False)
    yscales = []
    for p in panels:
        ys = [y for _, _, _, sy in p.series for y in sy if y is not None]
        lo, hi = _range(ys, p.log, 0.08, zero=p.yfloor_zero and not p.log)
        yscales.append((lo, hi))
    ylabels = [
        [num(t) for t in Scale(lo, hi, 0, 1, p.log).ticks()] for p, (lo, hi) in zip(panels, yscales, strict=True)
    ]
    widest = max((text_width(t) for labels in ylabels for t in labels), default=20.0)
    pad_l = int(max(48.0, widest + 30))
    pad_r, pad_t, gap = 18, 28, 14
    w = int(max(w, text_width(title, 13) * 1.1 + 24))
    plot_w = w - pad_l - pad_r
    y = float(pad_t)
    out: list[str] = []
    xs_px = Scale(xlo, xhi, pad_l, w - pad_r, xlog)
    for k, (p, (lo, hi)) in enumerate(zip(panels, yscales, strict=True)):
        top, bottom = y, y + p.height
        ys_px = Scale(lo, hi, bottom, top, p.log)
        for a, b in bands:
            out.append(
                f'<rect class="band" x="{xs_px(a):.1f}" y="{top:.1f}" '
                f'width="{max(xs_px(b) - xs_px(a), 1):.1f}" height="{p.height}" fill="#e8f0fe"/>'
            )
        ticks = ys_px.ticks()
        for i in _thin([(-ys_px(t), FONT * 0.6, FONT * 0.6) for t in ticks], 2):
            t, py = ticks[i], ys_px(ticks[i])
            out.append(f'<line x1="{pad_l}" y1="{py:.1f}" x2="{w - pad_r}" y2="{py:.1f}" stroke="#eee"/>')
            out.append(f'<text class="tick" x="{pad_l - 5}" y="{py + 4:.1f}" text-anchor="end">{num(t)}</text>')
        out += [
            f'<line x1="{pad_l}" y1="{bottom:.1f}" x2="{w - pad_r}" y2="{bottom:.1f}" stroke="#333"/>',
            f'<line class="yaxis" x1="{pad_l}" y1="{top:.1f}" x2="{pad_l}" y2="{bottom:.1f}" stroke="#333"/>',
        ]
        if p.ylabel:
            mid = (top + bottom) / 2
            out.append(
                f'<text class="ylabel" x="13" y="{mid:.1f}" text-anchor="middle" '
                f'transform="rotate(-90 13 {mid:.1f})">{esc(p.ylabel)}</text>'
            )
        out += p.extra
        rows: list[list[tuple[float, float]]] = []  # the labels' extents per row, so none overlaps
        for mi, m in enumerate(marks):
            out.append(
                f'<line class="mark" x1="{xs_px(m):.1f}" y1="{top:.1f}" x2="{xs_px(m):.1f}" '
                f'y2="{bottom:.1f}" stroke="#d33" stroke-dasharray="4 3"/>'
            )
            if k == 0:
                label = mark_labels[mi] if mark_labels is not None else f"{mark_label} {num(m)}"
                right = xs_px(m) + 4 + text_width(label) <= w - pad_r
                lx = xs_px(m) + 4 if right else xs_px(m) - 4
                extent = (lx, lx + text_width(label)) if right else (lx - text_width(label), lx)
                row = next(
                    (i for i, r in enumerate(rows) if all(extent[1] + 4 < a or extent[0] - 4 > b for a, b in r)),
                    len(rows),
                )
                if row == len(rows):
                    rows.append([])
                rows[row].append(extent)
                out.append(
                    f'<text class="marklabel" x="{lx:.1f}" y="{top + 12 + 13 * row:.1f}" '
                    f'text-anchor="{"start" if right else "end"}" fill="#d33" stroke="#fff" stroke-width="3" '
                    f'paint-order="stroke">{esc(label)}</text>'
                )
        for name, color, sx, sy in p.series:
            pts = [(xs_px(x), ys_px(v)) for x, v in zip(sx, sy, strict=False) if v is not None and (v > 0 or not p.log)]
            if not pts:
                continue
            if name not in p.points_only:
                out.append(
                    f'<polyline class="line" data-name="{esc(name)}" fill="none" stroke="{color}" '
                    f'stroke-width="1.8" points="' + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>'
                )
            r = 2.5 if len(pts) < 80 else 1.2
            out += [f'<circle class="pt" cx="{a:.1f}" cy="{b:.1f}" r="{r}" fill="{color}"/>' for a, b in pts]
        y = bottom + gap
    bottom = y - gap
    ticks = list(xticks) if xticks is not None else xs_px.ticks()
    ticks = [t for t in ticks if xlo <= t <= xhi and (t > 0 or not xlog)]
    labels = [num(t) for t in ticks]
    for i in _thin([(xs_px(t), text_width(s) / 2, text_width(s) / 2) for t, s in zip(ticks, labels, strict=True)], 6):
        out.append(
            f'<text class="tick" x="{xs_px(ticks[i]):.1f}" y="{bottom + 15:.1f}" '
            f'text-anchor="middle">{labels[i]}</text>'
        )
    out.append(
        f'<text class="xlabel" x="{pad_l + plot_w / 2:.1f}" y="{bottom + 32:.1f}" '
        f'text-anchor="middle">{esc(xlabel)}</text>'
    )
    dots = {name for p in panels for name in p.points_only}
    legend, h = _legend(every, pad_l, w - pad_r, bottom + 50, dots)
    head = (
        f'<svg class="chart" data-title="{esc(title)}" xmlns="http://www.w3.org/2000/svg" width="{w}" '
        f'height="{h:.0f}" viewBox="0 0 {w} {h:.0f}" font-family="sans-serif" font-size="{FONT}">'
        f'<text class="title" x="{w / 2}" y="17" text-anchor="middle" font-size="13" '
        f'font-weight="bold">{esc(title)}</text>'
    )
    return head + "".join(out) + legend + "</svg>"


def _legend(
    series: list[Series], left: float, right: float, top: float, dots: set[str] | None = None
) -> tuple[str, float]:
    """The series' names in rows below the plot: (svg, the chart's height)."""
    out, x, y = [], left, top
    seen: set[str] = set()
    for name, color, _, _ in series:
        if name in seen:
            continue
        seen.add(name)
        width = 18 + text_width(name)
        if x > left and x + width > right:
            x, y = left, y + 16
        mark = (
            f'<circle cx="{x + 7:.1f}" cy="{y - 4:.1f}" r="3" fill="{color}"/>'  # drawn as points: a point
            if dots and name in dots
            else f'<line x1="{x:.1f}" y1="{y - 4:.1f}" x2="{x + 14:.1f}" y2="{y - 4:.1f}" stroke="{color}" '
            f'stroke-width="3"/>'
        )
        out.append(f'{mark}<text class="legend" x="{x + 18:.1f}" y="{y:.1f}" fill="#333">{esc(name)}</text>')
        x += width + 14
    return "".join(out), (y + 10 if out else top - 10)
