"""Two small inline SVG charts, drawn by hand (no plotting library, no external assets)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from extproc.tools.toolkit.stats import histogram

WIDTH = 560
HEIGHT = 220
MARGIN_LEFT = 48
MARGIN_RIGHT = 16
MARGIN_TOP = 28
MARGIN_BOTTOM = 40
COLOURS = ("#4e79a7", "#f28e2b")
THRESHOLD_COLOUR = "#e15759"
MAX_BAR_WIDTH = 90.0


def _open(title: str) -> list[str]:
    return [
        f'<svg width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{WIDTH / 2:.0f}" y="16" text-anchor="middle" font-size="13" '
        f'font-weight="bold">{escape(title)}</text>',
    ]


def histogram_range(values: Sequence[float], threshold: float) -> tuple[float, float]:
    """x range for a cosine histogram: from below both the smallest value and the
    threshold, up to 1 (or the largest value)."""
    lo = min([threshold, *values])
    hi = max([1.0, *values])
    pad = (hi - lo) * 0.05 or 1e-4
    return lo - pad, hi


def cosine_histogram(values: Sequence[float], threshold: float, title: str, bins: int = 20) -> str:
    """Histogram of cosines with the threshold as a dashed red line."""
    parts = _open(title)
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    base_y = MARGIN_TOP + plot_h
    parts.append(
        f'<line x1="{MARGIN_LEFT}" y1="{base_y}" x2="{WIDTH - MARGIN_RIGHT}" y2="{base_y}" '
        'stroke="#333"/>'
    )
    if not values:
        parts.append(
            f'<text x="{WIDTH / 2:.0f}" y="{HEIGHT / 2:.0f}" text-anchor="middle" '
            'font-size="12">no values</text></svg>'
        )
        return "\n".join(parts)
    lo, hi = histogram_range(values, threshold)
    counts = histogram(values, lo, hi, bins)
    top = max(counts) * 1.1
    bar_w = plot_w / bins
    for i, count in enumerate(counts):
        if not count:
            continue
        h = plot_h * count / top
        x = MARGIN_LEFT + i * bar_w
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{base_y - h:.1f}" width="{bar_w - 2:.1f}" '
            f'height="{h:.1f}" fill="{COLOURS[0]}"><title>{count}</title></rect>'
        )
        parts.append(
            f'<text x="{x + bar_w / 2:.1f}" y="{base_y - h - 3:.1f}" text-anchor="middle" '
            f'font-size="10">{count}</text>'
        )
    tx = MARGIN_LEFT + plot_w * (threshold - lo) / (hi - lo)
    parts.append(
        f'<line x1="{tx:.1f}" y1="{MARGIN_TOP}" x2="{tx:.1f}" y2="{base_y}" '
        f'stroke="{THRESHOLD_COLOUR}" stroke-dasharray="4 3"/>'
    )
    t_anchor = "start" if tx < MARGIN_LEFT + 60 else ("end" if tx > WIDTH - 80 else "middle")
    parts.append(
        f'<text x="{tx:.1f}" y="{MARGIN_TOP - 2}" text-anchor="{t_anchor}" font-size="10" '
        f'fill="{THRESHOLD_COLOUR}">threshold {threshold}</text>'
    )
    for x_value, anchor, x in (
        (lo, "start", MARGIN_LEFT),
        ((lo + hi) / 2, "middle", MARGIN_LEFT + plot_w / 2),
        (hi, "end", WIDTH - MARGIN_RIGHT),
    ):
        parts.append(
            f'<text x="{x:.1f}" y="{base_y + 16}" text-anchor="{anchor}" '
            f'font-size="11">{x_value:.5f}</text>'
        )
    parts.append(
        f'<text x="{WIDTH / 2:.0f}" y="{HEIGHT - 6}" text-anchor="middle" font-size="11">'
        f"cosine (n={len(values)})</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


def grouped_bars(
    groups: Sequence[str],
    series: Sequence[tuple[str, Sequence[float | None]]],
    title: str,
    unit: str,
) -> str:
    """Bars per group, one bar per series (at most two series); missing values are gaps."""
    parts = _open(title)
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM - 14
    base_y = MARGIN_TOP + 14 + plot_h
    values = [v for _, vs in series for v in vs if v is not None]
    top = max(values) * 1.12 if values else 1.0  # room for the value labels
    top = top if top > 0 else 1.0
    parts.append(
        f'<line x1="{MARGIN_LEFT}" y1="{base_y}" x2="{WIDTH - MARGIN_RIGHT}" y2="{base_y}" '
        'stroke="#333"/>'
    )
    for s, (name, _) in enumerate(series[: len(COLOURS)]):
        lx = MARGIN_LEFT + s * 120
        parts.append(
            f'<rect x="{lx}" y="{MARGIN_TOP - 4}" width="10" height="10" fill="{COLOURS[s]}"/>'
        )
        parts.append(
            f'<text x="{lx + 14}" y="{MARGIN_TOP + 5}" font-size="11">{escape(name)}</text>'
        )
    group_w = plot_w / max(len(groups), 1)
    bar_w = min(group_w * 0.8 / max(len(series), 1), MAX_BAR_WIDTH)
    for g, label in enumerate(groups):
        gx = MARGIN_LEFT + g * group_w + (group_w - bar_w * len(series)) / 2
        for s, (_, vs) in enumerate(series[: len(COLOURS)]):
            value = vs[g] if g < len(vs) else None
            if value is None:
                continue
            h = plot_h * value / top
            x = gx + s * bar_w
            parts.append(
                f'<rect x="{x:.1f}" y="{base_y - h:.1f}" width="{bar_w - 2:.1f}" '
                f'height="{h:.1f}" fill="{COLOURS[s]}"><title>{value:.1f} {escape(unit)}'
                "</title></rect>"
            )
            parts.append(
                f'<text x="{x + bar_w / 2 - 1:.1f}" y="{base_y - h - 3:.1f}" '
                f'text-anchor="middle" font-size="10">{value:.1f}</text>'
            )
        parts.append(
            f'<text x="{gx + bar_w * len(series) / 2:.1f}" y="{base_y + 16}" text-anchor="middle" '
            f'font-size="11">{escape(label)}</text>'
        )
    parts.append(
        f'<text x="12" y="{MARGIN_TOP + 14 + plot_h / 2:.0f}" font-size="11" '
        f'transform="rotate(-90 12 {MARGIN_TOP + 14 + plot_h / 2:.0f})" '
        f'text-anchor="middle">{escape(unit)}</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts)
