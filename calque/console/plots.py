"""Plots over time as inline SVG, drawn on the server: no script, no library, nothing fetched.

``line_plot`` draws named series of (time, value) points with both axes labelled in their
units, a legend, and dashed lines for the series named in ``dashed`` (the idle line).
Everything written into the SVG is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from html import escape

from calque.console.snapshot import Sample, UsageView

WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 150, 14, 40
# Colours people tell apart (Okabe-Ito), one per series in order.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
SLICE_COLOURS = {
    "free": "#009E73",
    "held": "#0072B2",
    "draining": "#E69F00",
    "reclaiming": "#56B4E9",
    "failed": "#D55E00",
    "pending": "#999999",
}

Point = tuple[datetime, float]


def _ticks(high: float) -> list[float]:
    """0 and round steps (1, 2 or 5 times a power of ten) up to at least ``high``."""
    if high <= 0:
        return [0.0, 1.0]
    rough = high / 4
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= rough)
    return [i * step for i in range(math.ceil(high / step - 1e-9) + 1)]


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.3f}".rstrip("0").rstrip(".")


def line_plot(
    title: str,
    series: Mapping[str, Sequence[Point]],
    *,
    y_label: str,
    x_label: str = "time (UTC)",
    time_format: str = "%H:%M:%S",
    dashed: frozenset[str] = frozenset(),
    colours: Mapping[str, str] | None = None,
    step: bool = False,
) -> str:
    points = [p for pts in series.values() for p in pts]
    parts = [
        f'<svg class="plot" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
    ]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    if not points:
        parts.append(f'<text x="{LEFT}" y="{TOP + plot_h / 2}" class="empty">no data yet</text></svg>')
        return "".join(parts)
    t0 = min(p[0] for p in points)
    t1 = max(p[0] for p in points)
    span = max((t1 - t0).total_seconds(), 1.0)
    ticks = _ticks(max(p[1] for p in points))
    y_max = ticks[-1]

    def x(t: datetime) -> float:
        return LEFT + (t - t0).total_seconds() / span * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - v / y_max * plot_h

    parts.append(
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" class="axis"/>'
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" class="axis"/>'
    )
    for v in ticks:
        parts.append(
            f'<text x="{LEFT - 4}" y="{y(v) + 4:.1f}" text-anchor="end" class="tick">{_number(v)}</text>'
            f'<line x1="{LEFT}" y1="{y(v):.1f}" x2="{LEFT + plot_w}" y2="{y(v):.1f}" class="grid"/>'
        )
    for i in range(3):
        t = t0 + timedelta(seconds=span * i / 2)
        anchor = ("start", "middle", "end")[i]
        parts.append(
            f'<text x="{x(t):.1f}" y="{TOP + plot_h + 14}" text-anchor="{anchor}" class="tick">'
            f"{escape(t.strftime(time_format))}</text>"
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle" class="label">'
        f"{escape(x_label)}</text>"
        f'<text x="12" y="{TOP + plot_h / 2}" text-anchor="middle" class="label" '
        f'transform="rotate(-90 12 {TOP + plot_h / 2})">{escape(y_label)}</text>'
    )
    for i, (name, pts) in enumerate(series.items()):
        colour = (colours or {}).get(name) or PALETTE[i % len(PALETTE)]
        coords: list[str] = []
        for j, (t, v) in enumerate(sorted(pts)):
            if step and j:
                coords.append(f"{x(t):.1f},{float(coords[-1].split(',')[1]):.1f}")
            coords.append(f"{x(t):.1f},{y(v):.1f}")
        dash = ' stroke-dasharray="5 3"' if name in dashed else ""
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dash} points="{" ".join(coords)}">'
            f"<title>{escape(name)}</title></polyline>"
        )
        if len(coords) == 1:  # a line of one point draws nothing: the first refresh's sample as a dot
            cx, cy = coords[0].split(",")
            parts.append(
                f'<circle cx="{cx}" cy="{cy}" r="3" fill="{colour}"><title>{escape(name)}</title></circle>'
            )
        ly = TOP + 10 + i * 16
        parts.append(
            f'<line x1="{WIDTH - RIGHT + 10}" y1="{ly}" x2="{WIDTH - RIGHT + 28}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
            f'<text x="{WIDTH - RIGHT + 32}" y="{ly + 4}" class="legend">{escape(name[:22])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def slices_over_time(history: Sequence[Sample]) -> str:
    read = [(s.at, s.slices) for s in history if s.slices is not None]  # an outage is a gap, not 0
    seen = {"free", "held"} | {k for _at, slices in read for k in slices}
    looks = [k for k in SLICE_COLOURS if k in seen] + sorted(seen - set(SLICE_COLOURS))
    series = {k: [(at, float(slices.get(k, 0))) for at, slices in read] for k in looks}
    return line_plot("slices by state", series, y_label="slices", colours=SLICE_COLOURS, step=True)


def pool_over_time(history: Sequence[Sample], pool: str) -> str:
    seen = [s for s in history if pool in s.pools]
    series = {
        "backlog": [(s.at, float(s.pools[pool][0])) for s in seen],
        "workers": [(s.at, float(s.pools[pool][1])) for s in seen],
    }
    return line_plot(f"pool {pool}", series, y_label="claims / workers", step=True)


def usage_over_month(usage: UsageView) -> str:
    """Each group's cost so far this period, day by day (a charge spread evenly over its
    time), and the idle line dashed: what the instances cost with nobody on them."""
    start = usage.period.since
    end = min(usage.as_of, usage.period.until)
    days: list[datetime] = []
    day = start
    while day < end:
        day = min(day + timedelta(days=1), end)
        days.append(day)
    names = sorted({line.series for line in usage.lines}, key=lambda n: (n == "(idle)", n))
    series: dict[str, list[Point]] = {}
    for name in names:
        points: list[Point] = [(start, 0.0)]
        for cut in days:
            total = Decimal(0)
            for line in usage.lines:
                if line.series != name or line.start >= cut:
                    continue
                length = (line.end - line.start).total_seconds()
                done = (min(line.end, cut) - line.start).total_seconds()
                total += line.amount if length <= 0 else line.amount * Decimal(done / length)
            points.append((cut, float(total)))
        series[name] = points
    return line_plot(
        f"cost so far in {usage.period.month or 'the period'}",
        series,
        y_label="USD (cumulative)",
        x_label="day (UTC)",
        time_format="%b %d",
        dashed=frozenset({"(idle)"}),
    )
