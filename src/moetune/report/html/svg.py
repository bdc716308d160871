"""Inline SVG charts for the HTML report: a linear scale, nice ticks, a line chart with shaded
phase bands, a horizontal stacked bar against a capacity, bars with confidence intervals, and
an HTML legend. Pure functions from figures to markup; every label is escaped; no external
resource is referenced (the SVG is inline, with no ``xmlns`` and no ``href``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from moetune.report.html.markup import esc, fmt

# colour-blind-friendly categorical colours (Tableau 10), in order of use
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")
BAND_FILLS = ("#eef3f9", "#f8f3ea")
AXIS = "#6b7280"
GRID = "#e5e7eb"
FONT = 11


def n(x: float) -> str:
    """A coordinate, short: 12.5, 3, -0.25."""
    t = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if t in ("-0", "") else t


@dataclass(frozen=True, slots=True)
class Linear:
    """Maps the domain [d0, d1] onto the range [r0, r1]."""

    d0: float
    d1: float
    r0: float
    r1: float

    def __call__(self, v: float) -> float:
        if self.d1 == self.d0:
            return (self.r0 + self.r1) / 2
        return self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)


def nice_step(span: float, count: int) -> float:
    """A step of 1, 2, 2.5 or 5 times a power of ten that cuts ``span`` into about ``count`` parts."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag * (1 + 1e-9):
            return float(m * mag)
    return float(10 * mag)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]; the last one is at or above ``hi``."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        hi = lo + (abs(lo) or 1.0)
    step = nice_step(hi - lo, count)
    start = math.floor(lo / step + 1e-9) * step
    ticks = []
    v = start
    while v < hi - 1e-9 * step:
        ticks.append(v)
        v = start + step * len(ticks)
    ticks.append(v)
    return [round(t, 10) for t in ticks]


def tick_label(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:,.10g}" if a >= 1 else f"{v:.3g}"


def clip(s: str, px: float, char_px: float = 6.2) -> str:
    """``s`` cut to about ``px`` pixels of 11 px text, with an ellipsis when cut."""
    most = max(1, int(px / char_px))
    return s if len(s) <= most else s[: most - 1] + "…"


def text(x: float, y: float, s: str, *, anchor: str = "start", cls: str = "", size: int = FONT, extra: str = "") -> str:
    c = f' class="{esc(cls)}"' if cls else ""
    return f'<text x="{n(x)}" y="{n(y)}" font-size="{size}" text-anchor="{anchor}"{c}{extra}>{esc(s)}</text>'


def title(s: str) -> str:
    """A tooltip (the hover text browsers show for the enclosing SVG element)."""
    return f"<title>{esc(s)}</title>"


def svg(width: float, height: float, body: str, *, label: str, cls: str = "chart") -> str:
    return (
        f'<svg class="{esc(cls)}" viewBox="0 0 {n(width)} {n(height)}" width="{n(width)}" '
        f'height="{n(height)}" role="img" aria-label="{esc(label)}">{body}</svg>'
    )


# -- line charts --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    """One line: points (x, y); a None y breaks the line there."""

    name: str
    points: tuple[tuple[float, float | None], ...]
    color: str
    dash: bool = False
    unit: str = ""  # for the points' tooltips


@dataclass(frozen=True, slots=True)
class Band:
    """A span of the x axis (a benchmark phase), shaded and labelled; x0 == x1 draws a line."""

    x0: float
    x1: float
    label: str


def _segments(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    out: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None or not math.isfinite(y):
            if out[-1]:
                out.append([])
            continue
        out[-1].append((x, y))
    return [s for s in out if s]


def line_chart(
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    bands: Sequence[Band] = (),
    width: float = 600,
    height: float = 230,
    x_ticks: Sequence[float] | None = None,
    x_tick_labels: Sequence[str] | None = None,
    y_max: float | None = None,
    x_range: tuple[float, float] | None = None,
    max_dots: int = 160,
    log2_x: bool = False,
) -> str:
    """Lines over shared axes (y from 0), with phase bands behind them. Axis labels carry the unit.
    ``log2_x`` spaces x by its logarithm (concurrency 1, 2, 4 … 64), every x being positive."""
    tx: Callable[[float], float] = (lambda v: math.log2(v)) if log2_x else (lambda v: v)
    pts = [(tx(x), y) for s in series for x, y in s.points if y is not None and math.isfinite(y)]
    left, right, top, bottom = 58.0, 14.0, 20.0 if bands else 10.0, 40.0
    pw, ph = width - left - right, height - top - bottom
    xs = [x for x, _ in pts] + [tx(v) for b in bands for v in (b.x0, b.x1)] + [tx(v) for v in x_ticks or ()]
    x0, x1 = (tx(x_range[0]), tx(x_range[1])) if x_range else ((min(xs), max(xs)) if xs else (0.0, 1.0))
    if x1 <= x0:
        x0, x1 = x0 - 0.5, x1 + 0.5
    ytop = max([y for _, y in pts] + [y_max or 0.0]) if pts else 1.0
    yt = nice_ticks(0.0, ytop if ytop > 0 else 1.0, 4)
    lin, sy = Linear(x0, x1, left, left + pw), Linear(0.0, yt[-1], top + ph, top)

    def sx(v: float) -> float:
        return lin(tx(v))

    parts: list[str] = []
    for i, b in enumerate(bands):
        bx0, bx1 = lin(max(tx(b.x0), x0)), lin(min(tx(b.x1), x1))
        if b.x1 <= b.x0:
            parts.append(
                f'<g class="phase">{title(b.label)}<line x1="{n(bx0)}" x2="{n(bx0)}" y1="{n(top)}" '
                f'y2="{n(top + ph)}" stroke="{AXIS}" stroke-dasharray="3 3"/>'
                + text(bx0 + 3, top - 6, b.label, size=10, cls="phase-label")
                + "</g>"
            )
            continue
        w = max(bx1 - bx0, 0.5)
        label = text(bx0 + 3, top - 6, b.label, size=10, cls="phase-label") if w >= 6.2 * len(b.label) + 6 else ""
        parts.append(
            f'<g class="phase">{title(b.label)}<rect class="band" x="{n(bx0)}" y="{n(top)}" '
            f'width="{n(w)}" height="{n(ph)}" fill="{BAND_FILLS[i % 2]}"/>{label}</g>'
        )
    for v in yt:
        y = sy(v)
        parts.append(f'<line x1="{n(left)}" x2="{n(left + pw)}" y1="{n(y)}" y2="{n(y)}" stroke="{GRID}"/>')
        parts.append(text(left - 6, y + 4, tick_label(v), anchor="end", cls="tick"))
    if x_ticks is not None:
        ticks = list(x_ticks)
    elif log2_x:
        ticks = [2.0**k for k in range(math.ceil(x0), math.floor(x1) + 1)]
    else:
        ticks = [t for t in nice_ticks(x0, x1, 6) if x0 <= t <= x1]
    labels = list(x_tick_labels) if x_tick_labels is not None else [tick_label(t) for t in ticks]
    for v, lab in zip(ticks, labels, strict=True):
        x = sx(v)
        parts.append(f'<line x1="{n(x)}" x2="{n(x)}" y1="{n(top + ph)}" y2="{n(top + ph + 4)}" stroke="{AXIS}"/>')
        parts.append(text(x, top + ph + 16, lab, anchor="middle", cls="tick"))
    parts.append(f'<line x1="{n(left)}" x2="{n(left + pw)}" y1="{n(top + ph)}" y2="{n(top + ph)}" stroke="{AXIS}"/>')
    parts.append(f'<line x1="{n(left)}" x2="{n(left)}" y1="{n(top)}" y2="{n(top + ph)}" stroke="{AXIS}"/>')
    parts.append(text(left + pw / 2, height - 6, x_label, anchor="middle", cls="axis-label"))
    parts.append(
        text(
            0,
            0,
            y_label,
            anchor="middle",
            cls="axis-label",
            extra=f' transform="translate(13 {n(top + ph / 2)}) rotate(-90)"',
        )
    )
    for s in series:
        dash = ' stroke-dasharray="5 3"' if s.dash else ""
        body = [title(s.name)]
        for seg in _segments(s.points):
            coords = " ".join(f"{n(sx(x))},{n(sy(y))}" for x, y in seg)
            body.append(f'<polyline points="{coords}" fill="none" stroke="{s.color}" stroke-width="1.8"{dash}/>')
            if len(s.points) <= max_dots:
                body += [
                    f'<circle cx="{n(sx(x))}" cy="{n(sy(y))}" r="2.6" fill="{s.color}">'
                    f"{title(f'{s.name}: {fmt(y)} {s.unit} at {tick_label(x)}'.replace('  ', ' '))}</circle>"
                    for x, y in seg
                ]
        parts.append(f'<g class="series" data-name="{esc(s.name)}">{"".join(body)}</g>')
    if not pts:
        parts.append(text(left + pw / 2, top + ph / 2, "no data", anchor="middle", cls="tick"))
    return svg(width, height, "".join(parts), label=f"{y_label} against {x_label}")


def legend(items: Sequence[tuple[str, str]] | Sequence[Series], *, swatch: str = "line") -> str:
    """An HTML legend: (name, colour) pairs or the series of a chart (dashed ones drawn dashed)."""
    out = []
    for it in items:
        name, color, dash = (it.name, it.color, it.dash) if isinstance(it, Series) else (it[0], it[1], False)
        if swatch == "line":
            dashed = ' stroke-dasharray="5 3"' if dash else ""
            mark = (
                f'<svg width="22" height="10" aria-hidden="true"><line x1="1" x2="21" y1="5" y2="5" '
                f'stroke="{color}" stroke-width="2.5"{dashed}/></svg>'
            )
        else:
            mark = (
                f'<svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" rx="2" '
                f'fill="{color}"/></svg>'
            )
        out.append(f"<li>{mark}{esc(name)}</li>")
    return f'<ul class="legend">{"".join(out)}</ul>'


def figure(caption: str, chart: str, legend_html: str = "") -> str:
    return f'<figure class="chart"><figcaption>{esc(caption)}</figcaption>{chart}{legend_html}</figure>'


# -- bars ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Segment:
    """A part of a stacked bar: its amount (in the bar's unit), colour and hover text."""

    label: str
    value: float
    color: str
    tip: str


def stacked_bar(
    segments: Sequence[Segment], capacity: float, *, width: float = 640, height: float = 26, label: str = ""
) -> str:
    """A horizontal bar whose full length is the capacity (or the total, when it overflows), the
    segments laid left to right in proportion to their values; the free rest drawn empty, and
    a red mark at the capacity when the total exceeds it."""
    total = sum(max(0.0, s.value) for s in segments)
    full = max(capacity, total, 1e-9)
    scale = width / full
    parts, x = [], 0.0
    for s in segments:
        w = max(0.0, s.value) * scale
        inner = text(x + 4, height / 2 + 4, s.label, cls="seg-label", size=10) if w >= 6.2 * len(s.label) + 8 else ""
        parts.append(
            f'<g class="seg" data-what="{esc(s.label)}" data-value="{s.value:.6g}">{title(s.tip)}'
            f'<rect x="{x:.3f}" y="0" width="{w:.3f}" height="{n(height)}" fill="{s.color}" stroke="#fff" '
            f'stroke-width="0.6"/>{inner}</g>'
        )
        x += w
    if capacity > total:
        parts.append(
            f'<rect class="free" x="{x:.3f}" y="0.5" width="{capacity * scale - x:.3f}" '
            f'height="{n(height - 1)}" fill="#fff" stroke="#cbd5e1"/>'
        )
    else:
        cx = capacity * scale
        parts.append(
            f'<line class="over" x1="{cx:.3f}" x2="{cx:.3f}" y1="0" y2="{n(height)}" stroke="#dc2626" '
            'stroke-width="2"/>'
        )
    return svg(width, height, "".join(parts), label=label or "memory", cls="bar")


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """A median and its confidence interval, drawn as a bar with a whisker."""

    label: str
    median: float
    low: float
    high: float
    color: str


def interval_bars(rows: Sequence[Interval], *, unit: str, width: float = 600, label_w: float = 150) -> str:
    """Horizontal bars from 0 to each median with its interval as a whisker; the axis in ``unit``."""
    bar_h, gap, top, bottom = 16.0, 8.0, 6.0, 34.0
    height = top + len(rows) * (bar_h + gap) + bottom
    hi = max([r.high for r in rows] + [r.median for r in rows] + [1e-9])
    ticks = nice_ticks(0.0, hi, 5)
    sx = Linear(0.0, ticks[-1], label_w, width - 60)
    parts = []
    base = top + len(rows) * (bar_h + gap)
    for v in ticks:
        x = sx(v)
        parts.append(f'<line x1="{n(x)}" x2="{n(x)}" y1="{n(top)}" y2="{n(base)}" stroke="{GRID}"/>')
        parts.append(text(x, base + 14, tick_label(v), anchor="middle", cls="tick"))
    for i, r in enumerate(rows):
        y = top + i * (bar_h + gap)
        ym = y + bar_h / 2
        tip = f"{r.label}: {fmt(r.median)} {unit} [{fmt(r.low)}, {fmt(r.high)}]"
        parts.append(f"<g>{title(tip)}" + text(label_w - 8, ym + 4, clip(r.label, label_w - 12), anchor="end") + "</g>")
        parts.append(
            f'<g class="ibar">{title(tip)}<rect x="{n(sx(0))}" y="{n(y)}" width="{n(sx(r.median) - sx(0))}" '
            f'height="{n(bar_h)}" fill="{r.color}" fill-opacity="0.75"/>'
            f'<line x1="{n(sx(r.low))}" x2="{n(sx(r.high))}" y1="{n(ym)}" y2="{n(ym)}" stroke="#111827" '
            'stroke-width="1.4"/>'
            + "".join(
                f'<line x1="{n(sx(v))}" x2="{n(sx(v))}" y1="{n(ym - 5)}" y2="{n(ym + 5)}" '
                'stroke="#111827" stroke-width="1.4"/>'
                for v in (r.low, r.high)
            )
            + text(sx(max(r.high, r.median)) + 6, ym + 4, fmt(r.median), cls="value")
            + "</g>"
        )
    parts.append(f'<line x1="{n(label_w)}" x2="{n(width - 60)}" y1="{n(base)}" y2="{n(base)}" stroke="{AXIS}"/>')
    parts.append(text((label_w + width - 60) / 2, height - 4, unit, anchor="middle", cls="axis-label"))
    return svg(width, height, "".join(parts), label=f"medians with confidence intervals, {unit}")
