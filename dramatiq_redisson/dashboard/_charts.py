"""The dashboard's activity charts: a queue's history (processed, retried and failed
messages per minute or per hour) as a stacked bar chart in inline SVG, drawn on the
server: no script, no stylesheet of its own, nothing from another origin.

Pure functions of the buckets (:class:`dramatiq_redisson.Bucket`, oldest first): no I/O,
no clock. Every text that goes into the SVG is XML-escaped here (the page inserts it as
is). Each series differs by more than its colour: processed bars are solid, retried ones
striped, failed ones cross-hatched, and the legend names each with its total; the SVG
has a ``<title>`` and a ``<desc>`` (its totals and busiest period) for screen readers,
each bar a ``<title>`` with its exact counts (a tooltip), and :func:`rows` gives the
page a data table of the same numbers.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

#: A bucket: ``start_ms`` and the counts of :data:`SERIES` (a :class:`~dramatiq_redisson.Bucket`).
BucketLike = Mapping[str, Any]

MINUTE_MS = 60_000
HOUR_MS = 3_600_000

#: The SVG's default size in user units (the page scales it to its width).
WIDTH = 600
HEIGHT = 210
#: The plot area's margins: y labels on the left, the legend on top, x labels below.
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 30, 24
#: The least height (user units) of a non-zero bar segment, so that one small count
#: beside a huge one still shows (its tooltip and the data table give its number).
MIN_SEGMENT = 1.5
#: The least room (user units) per label on the time axis.
TIME_LABEL_ROOM = 70

_MUTED = "#5d6878"
_GRID = "#dfe3ea"
_FONT = "system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif"


class Series(NamedTuple):
    """One of the stacked series: a bucket's field, drawn from the bottom up in
    :data:`SERIES` order."""

    key: str
    label: str
    #: The outline and pattern colour; ``fill`` the body's.
    colour: str
    fill: str
    #: What the pattern tile draws over the fill ("" for a solid fill).
    marks: str
    description: str


SERIES = (
    Series("processed", "Processed", "#2457c5", "#2457c5", "", "solid blue"),
    Series(
        "retried",
        "Retried",
        "#9a5b00",
        "#f3c77d",
        '<path d="M-1 1l2-2M0 6l6-6M5 7l2-2" stroke="#9a5b00" stroke-width="1.6"/>',
        "orange, striped",
    ),
    Series(
        "failed",
        "Failed",
        "#b3261e",
        "#f4b9b4",
        '<path d="M0 0l6 6M6 0l-6 6" stroke="#b3261e" stroke-width="1.3"/>',
        "red, cross-hatched",
    ),
)


class Row(NamedTuple):
    """A line of a chart's data table."""

    period: str
    processed: int
    retried: int
    failed: int


def nice_ceiling(value: int) -> int:
    """The least of 1, 2, 5, 10, 20, 50, ... that is at least ``value`` (1 for 0)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if factor * step >= value:
                return factor * step
        step *= 10


def y_ticks(top: int) -> list[int]:
    """The y axis' labelled values from 0 to ``top`` (a :func:`nice_ceiling`), whole
    numbers only."""
    if top >= 5 and top % 5 == 0:
        step = top // 5
    elif top % 2 == 0:
        step = top // 2
    else:
        step = top
    return list(range(0, top + 1, step))


def compact(n: int) -> str:
    """A count for an axis label: ``950``, ``9,500``, ``12k``, ``1.5M``, ``4.3G``."""
    if n < 10_000:
        return f"{n:,}"
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            value = n / size
            text = f"{value:.1f}" if value < 10 else f"{value:.0f}"
            return text.removesuffix(".0") + suffix
    raise AssertionError("unreachable")  # pragma: no cover


def _utc(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.timezone.utc)


def period_label(start_ms: int, width_ms: int) -> str:
    """A bucket's period for people: ``2026-11-25 14:05 UTC`` (a minute),
    ``2026-11-25 14:00–15:00 UTC`` (an hour)."""
    start = _utc(start_ms)
    if width_ms >= HOUR_MS:
        end = _utc(start_ms + width_ms)
        return f"{start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC"
    return f"{start:%Y-%m-%d %H:%M} UTC"


def _label_step(count: int, width_ms: int, width: int) -> int:
    """Every how many buckets the time axis gets a label (aligned to the clock)."""
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 240) if width_ms < HOUR_MS else (1, 2, 3, 6, 12, 24, 48, 72, 168)
    for step in steps:
        if count / step <= max(2, width // TIME_LABEL_ROOM):
            return step
    return steps[-1]


def _time_label(start_ms: int, width_ms: int, step: int) -> str:
    start = _utc(start_ms)
    if width_ms >= HOUR_MS and step >= 24:
        return f"{start:%b %d}"
    return f"{start:%H:%M}"


def _total(bucket: BucketLike) -> int:
    return sum(int(bucket[series.key]) for series in SERIES)


def totals(buckets: Sequence[BucketLike]) -> dict[str, int]:
    """Each series' sum over ``buckets``."""
    return {series.key: sum(int(b[series.key]) for b in buckets) for series in SERIES}


def _heights(bucket: BucketLike, scale: float, room: float) -> list[float]:
    """The heights of a bucket's segments, bottom up: proportional, at least
    :data:`MIN_SEGMENT` when not zero, and together at most ``room``."""
    heights = [max(int(bucket[s.key]) * scale, MIN_SEGMENT) if bucket[s.key] else 0.0 for s in SERIES]
    over = sum(heights) - room
    if over > 0:
        largest = heights.index(max(heights))
        heights[largest] = max(0.0, heights[largest] - over)
    return heights


def _fill(series: Series, chart_id: str) -> str:
    return f"url(#{chart_id}-{series.key})" if series.marks else series.fill


def _n(value: float) -> str:
    """A coordinate, short."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _counts_text(bucket: BucketLike) -> str:
    return ", ".join(f"{int(bucket[s.key]):,} {s.label.lower()}" for s in SERIES)


def describe(buckets: Sequence[BucketLike], width_ms: int) -> str:
    """What the chart shows, in words (its ``<desc>``): the totals and the busiest period."""
    sums = totals(buckets)
    if not any(sums.values()):
        text = "No message was processed, retried or failed in this period."
    else:
        busiest = max(reversed(buckets), key=_total)  # the latest of equals
        text = (
            "In total " + _counts_text(sums) + ". The busiest "
            f"{'hour' if width_ms >= HOUR_MS else 'minute'}, {period_label(int(busiest['start_ms']), width_ms)}, "
            f"had {_total(busiest):,}."
        )
    kinds = "; ".join(f"{s.label.lower()} {s.description}" for s in SERIES)
    return f"{text} Bars stack, from the bottom: {kinds}."


def bar_chart(buckets: Sequence[BucketLike], *, width_ms: int, chart_id: str, title: str, width: int = WIDTH) -> str:
    """The SVG of ``buckets`` (oldest first; each with ``start_ms`` and the counts of
    :data:`SERIES`), ``width_ms`` long each; ``chart_id`` names its elements (unique on
    the page, made of letters, digits and dashes), ``title`` is its accessible name,
    ``width`` its width in user units (about the CSS pixels it is shown at, so that its
    text shows at its font size).

    Raises:
      ValueError: A bad ``chart_id``, or a width too narrow for the plot.
    """
    if not chart_id.replace("-", "").isascii() or not chart_id.replace("-", "").isalnum():
        raise ValueError(f"chart_id must be ASCII letters, digits and dashes, got {chart_id!r}")
    if width < LEFT + RIGHT + 100:
        raise ValueError(f"width must be at least {LEFT + RIGHT + 100}, got {width!r}")
    count = max(1, len(buckets))
    plot_w, plot_h = width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    base = TOP + plot_h
    top = nice_ceiling(max((_total(b) for b in buckets), default=0))
    scale = plot_h / top
    slot = plot_w / count
    bar_w = max(slot * 0.78, min(slot, 1.0))
    esc = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {HEIGHT}" width="{width}" '
        f'height="{HEIGHT}" role="img" aria-labelledby="{chart_id}-title {chart_id}-desc" id="{chart_id}" '
        f'class="chart-svg" font-family="{_FONT}" font-size="11">',
        f'<title id="{chart_id}-title">{esc(title)}</title>',
        f'<desc id="{chart_id}-desc">{esc(describe(buckets, width_ms))}</desc>',
        "<defs>",
    ]
    for s in SERIES:
        if s.marks:
            out.append(
                f'<pattern id="{chart_id}-{s.key}" width="6" height="6" patternUnits="userSpaceOnUse">'
                f'<rect width="6" height="6" fill="{s.fill}"/>{s.marks}</pattern>'
            )
    out.append("</defs>")
    # The legend, above the plot: a swatch in the series' pattern, its name and total.
    sums = totals(buckets)
    x = float(LEFT)
    for s in SERIES:
        out.append(
            f'<g class="legend" data-series="{s.key}"><rect x="{_n(x)}" y="8" width="12" height="12" '
            f'fill="{_fill(s, chart_id)}" stroke="{s.colour}"/>'
            f'<text x="{_n(x + 17)}" y="18" fill="#1d2430">{s.label} {sums[s.key]:,}</text></g>'
        )
        x += 24 + 7 * (len(s.label) + len(f"{sums[s.key]:,}")) + 14
    # The y axis: grid lines and labels.
    for value in y_ticks(top):
        y = base - value * scale
        out.append(
            f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{_n(y)}" y2="{_n(y)}" '
            f'stroke="{_MUTED if value == 0 else _GRID}" stroke-width="1"/>'
            f'<text x="{LEFT - 6}" y="{_n(y + 4)}" text-anchor="end" fill="{_MUTED}">{compact(value)}</text>'
        )
    # The time axis: labels at clock-aligned buckets (on the left edge of theirs).
    step = _label_step(count, width_ms, width)
    for i, bucket in enumerate(buckets):
        number = int(bucket["start_ms"]) // width_ms
        if number % step == 0:
            x_tick = LEFT + i * slot
            out.append(
                f'<line x1="{_n(x_tick)}" x2="{_n(x_tick)}" y1="{base}" y2="{base + 4}" stroke="{_MUTED}"/>'
                f'<text x="{_n(x_tick)}" y="{base + 16}" text-anchor="middle" fill="{_MUTED}">'
                f"{_time_label(int(bucket['start_ms']), width_ms, step)}</text>"
            )
    # The bars: one group per period with activity, its counts in its tooltip.
    for i, bucket in enumerate(buckets):
        if not _total(bucket):
            continue
        left = LEFT + i * slot
        out.append(
            f'<g class="bar" data-start="{int(bucket["start_ms"])}"><title>'
            f"{esc(period_label(int(bucket['start_ms']), width_ms))}: {_counts_text(bucket)}</title>"
            f'<rect x="{_n(left)}" y="{TOP}" width="{_n(slot)}" height="{plot_h}" fill="transparent"/>'
        )
        y = float(base)
        for s, h in zip(SERIES, _heights(bucket, scale, plot_h), strict=True):
            if h:
                y -= h
                out.append(
                    f'<rect x="{_n(left + (slot - bar_w) / 2)}" y="{_n(y)}" width="{_n(bar_w)}" height="{_n(h)}" '
                    f'fill="{_fill(s, chart_id)}" data-series="{s.key}"/>'
                )
        out.append("</g>")
    if not any(sums.values()):
        out.append(
            f'<text x="{_n(LEFT + plot_w / 2)}" y="{_n(TOP + plot_h / 2)}" text-anchor="middle" '
            f'fill="{_MUTED}" class="no-activity">No activity</text>'
        )
    out.append("</svg>")
    return "".join(out)


def rows(buckets: Sequence[BucketLike], width_ms: int) -> list[Row]:
    """The data table of a chart: its periods with any activity, newest first."""
    return [
        Row(period_label(int(b["start_ms"]), width_ms), int(b["processed"]), int(b["retried"]), int(b["failed"]))
        for b in reversed(buckets)
        if _total(b)
    ]
