"""SVG charts for the HTML report: small, dependency-free, readable without JavaScript."""

from __future__ import annotations

import html
import math
from collections.abc import Callable

# SVG charts: small, dependency-free, readable without JavaScript.
_PALETTE = ("#2563eb", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#64748b")
_W, _H, _L, _R, _T, _B = 560, 260, 70, 16, 28, 58

# A value's label on an axis or a tooltip; the series of a chart, (name, one value per label).
Fmt = Callable[[float], str]
Series = list[tuple[str, list[float | None]]]


def _nice_max(value: float) -> float:
    """Top of an axis with four ticks at round numbers."""
    if value <= 0:
        return 1.0
    step = value / 4
    exp = 10 ** math.floor(math.log10(step))
    for m in (1, 2, 2.5, 5, 10):
        if step <= m * exp * (1 + 1e-12):
            return 4 * m * exp
    return 40 * exp


def _axis(ymax: float, fmt: Fmt) -> list[str]:
    parts = []
    for k in range(5):
        v = ymax * k / 4
        y = _T + (_H - _T - _B) * (1 - k / 4)
        parts.append(f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        parts.append(
            f'<text x="{_L - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{html.escape(fmt(v))}</text>'
        )
    return parts


def _xlabels(labels: list[str], xs: list[float]) -> list[str]:
    step = max(1, math.ceil(len(labels) / 12))
    out = []
    for i, (label, x) in enumerate(zip(labels, xs, strict=True)):
        if i % step == 0:
            short = label if len(label) <= 14 else label[:13] + "…"
            out.append(
                f'<text x="{x:.1f}" y="{_H - _B + 14}" class="tick" text-anchor="end" '
                f'transform="rotate(-30 {x:.1f} {_H - _B + 14})">{html.escape(short)}</text>'
            )
    return out


def _legend(names: list[str]) -> list[str]:
    out = []
    x = _L
    for i, name in enumerate(names):
        out.append(
            f'<rect x="{x}" y="8" width="10" height="10" fill="{_PALETTE[i % len(_PALETTE)]}"/>'
        )
        out.append(f'<text x="{x + 14}" y="17" class="tick">{html.escape(name)}</text>')
        x += 24 + 7 * len(name)
    return out


def _svg(chart_id: str, title: str, body: list[str], empty: bool) -> str:
    if empty:
        body = [f'<text x="{_W / 2}" y="{_H / 2}" text-anchor="middle" class="tick">no data</text>']
    return (
        f'<figure class="chart" id="{chart_id}"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img" aria-label="{html.escape(title)}">'
        + "".join(body)
        + "</svg></figure>"
    )


def bar_chart(chart_id: str, title: str, labels: list[str], series: Series, fmt: Fmt) -> str:
    """Grouped vertical bars, one group per label, one bar per series."""
    values = [v or 0.0 for _, vs in series for v in vs]
    ymax = _nice_max(max(values, default=0.0))
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    slot = plot_w / max(len(labels), 1)
    bar = max(2.0, slot * 0.8 / max(len(series), 1))
    body = _axis(ymax, fmt) + (_legend([n for n, _ in series]) if len(series) > 1 else [])
    centers = []
    for i, label in enumerate(labels):
        x0 = _L + i * slot + slot * 0.1
        centers.append(x0 + slot * 0.4)
        for j, (name, vs) in enumerate(series):
            v = vs[i] or 0.0
            h = plot_h * v / ymax
            body.append(
                f'<rect class="bar" x="{x0 + j * bar:.1f}" y="{_T + plot_h - h:.1f}" width="{bar - 1:.1f}" '
                f'height="{h:.1f}" fill="{_PALETTE[j % len(_PALETTE)]}"><title>{html.escape(f"{label} {name}: {fmt(v)}")}'
                "</title></rect>"
            )
    body += _xlabels(labels, centers)
    return _svg(chart_id, title, body, not labels)


def line_chart(chart_id: str, title: str, labels: list[str], series: Series, fmt: Fmt) -> str:
    """Lines with a dot per point; a missing value breaks the line."""
    values = [v for _, vs in series for v in vs if v is not None]
    ymax = _nice_max(max(values, default=0.0))
    plot_w, plot_h = _W - _L - _R, _H - _T - _B
    xs = [_L + plot_w * (i + 0.5) / max(len(labels), 1) for i in range(len(labels))]
    body = _axis(ymax, fmt) + _legend([n for n, _ in series])
    for j, (name, vs) in enumerate(series):
        color = _PALETTE[j % len(_PALETTE)]
        points = [
            (x, _T + plot_h * (1 - v / ymax), v, label)
            for x, v, label in zip(xs, vs, labels, strict=True)
            if v is not None
        ]
        if len(points) > 1:
            d = " ".join(
                f"{'M' if k == 0 else 'L'}{x:.1f},{y:.1f}" for k, (x, y, _, _) in enumerate(points)
            )
            body.append(
                f'<path class="line" d="{d}" fill="none" stroke="{color}" stroke-width="2"/>'
            )
        for x, y, v, label in points:
            body.append(
                f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
                f"<title>{html.escape(f'{label} {name}: {fmt(v)}')}</title></circle>"
            )
    body += _xlabels(labels, xs)
    return _svg(chart_id, title, body, not values)


def hbar_chart(chart_id: str, title: str, labels: list[str], values: list[float], fmt: Fmt) -> str:
    """Horizontal bars, largest first (for categories such as tenants)."""
    pairs = sorted(zip(labels, values, strict=True), key=lambda kv: -kv[1])[:15]
    h_row = 22
    height = max(_T + 12 + h_row * len(pairs), 80)
    left = 130
    vmax = _nice_max(max((v for _, v in pairs), default=0.0))
    body = []
    for i, (label, v) in enumerate(pairs):
        y = _T + i * h_row
        w = (_W - left - 90) * v / vmax
        short = label if len(label) <= 18 else label[:17] + "…"
        body.append(
            f'<text x="{left - 6}" y="{y + 15}" class="tick" text-anchor="end">{html.escape(short)}</text>'
        )
        body.append(
            f'<rect class="bar" x="{left}" y="{y + 3}" width="{max(w, 1):.1f}" height="{h_row - 6}" '
            f'fill="{_PALETTE[0]}"><title>{html.escape(f"{label}: {fmt(v)}")}</title></rect>'
        )
        body.append(
            f'<text x="{left + w + 6:.1f}" y="{y + 15}" class="tick">{html.escape(fmt(v))}</text>'
        )
    if not pairs:
        body = [f'<text x="{_W / 2}" y="40" text-anchor="middle" class="tick">no data</text>']
    return (
        f'<figure class="chart" id="{chart_id}"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg viewBox="0 0 {_W} {height}" width="{_W}" height="{height}" role="img" aria-label="{html.escape(title)}">'
        + "".join(body)
        + "</svg></figure>"
    )
