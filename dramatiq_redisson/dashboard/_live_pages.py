"""The dashboard's live-fleet pages, on the app as ``_context.Pages``: pause and resume a queue
(with a confirmation), the messages running now, and a queue's activity charts (drawn by
:mod:`._charts`)."""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from . import _charts
from ._http import REFRESH_CHOICES, HTTPError, Request, refresh_arg

if TYPE_CHECKING:
    from ._context import Pages

#: The hourly chart's windows a visitor may pick (``?hours=``): a day, a week, 30 days.
HISTORY_HOURS = (24, 168, 720)
#: The per-minute chart's window.
HISTORY_MINUTES = 60
#: The most rows the Running page lists (the oldest: those most likely stuck).
RUNNING_LIMIT = 500
#: A message running longer than this is marked: Dramatiq's default time limit (10 min).
RUNNING_WARN_MS = 600_000

QUEUE_ACTIONS = ("pause", "resume")


@dataclass(frozen=True)
class Chart:
    """One chart of the queue page: its heading, SVG and data table."""

    id: str
    heading: str
    svg: str
    rows: list[_charts.Row]
    unit: str
    #: Drawn across the page's width, not beside the other chart.
    wide: bool


def _window_text(hours: int) -> str:
    return "24 hours" if hours == 24 else f"{hours // 24} days"


def activity(dash: Pages, request: Request, queue: str) -> dict[str, Any]:
    """The queue page's activity charts (``?hours=`` picks the hourly one's window), as
    template context."""
    hours_text = request.arg("hours", str(HISTORY_HOURS[0]))
    if not (hours_text.isascii() and hours_text.isdigit()) or int(hours_text) not in HISTORY_HOURS:
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"hours must be one of {', '.join(map(str, HISTORY_HOURS))}.")
    hours = int(hours_text)
    history = dash.broker.history(queue, minutes=HISTORY_MINUTES, hours=hours)["queues"][queue]
    # Many hourly bars: both charts across the page's width, one above the other.
    wide = hours > 2 * HISTORY_HOURS[0]
    width = 2 * _charts.WIDTH if wide else _charts.WIDTH
    charts = []
    for key, width_ms, unit, window in (
        ("minutes", _charts.MINUTE_MS, "minute", f"{HISTORY_MINUTES} minutes"),
        ("hours", _charts.HOUR_MS, "hour", _window_text(hours)),
    ):
        buckets = history["minutes"] if key == "minutes" else history["hours"]
        title = f"Queue {queue}: messages per {unit}, last {window} (UTC)"
        svg = _charts.bar_chart(buckets, width_ms=width_ms, chart_id=f"chart-{key}", title=title, width=width)
        heading = f"Per {unit}, last {window}"
        charts.append(Chart(f"chart-{key}", heading, svg, _charts.rows(buckets, width_ms), unit, wide))
    return {
        "charts": charts,
        "hours": hours,
        "hours_choices": [(h, _window_text(h)) for h in HISTORY_HOURS],
    }


def queue_action(dash: Pages, request: Request, name: str, action: str) -> str:
    """Pause or resume a queue, once confirmed."""
    queue = dash.known_queue(name)
    if action not in QUEUE_ACTIONS:
        raise HTTPError(HTTPStatus.NOT_FOUND, f"No action {action!r} on a queue.")
    page = request.url(f"queues/{_quote(queue)}")
    if request.field("confirmed") != "yes":
        verb, question = {
            "pause": (
                "Pause",
                f"Pause queue {queue}? Its consumers, on every worker, start none of its messages until it is "
                "resumed; the messages running now finish. Due scheduled messages still move to its ready "
                "queue, and sends are accepted.",
            ),
            "resume": ("Resume", f"Resume queue {queue}? Its consumers start its messages again within a second."),
        }[action]
        back = request.next_page(page)
        return dash.render(
            request,
            "confirm.html",
            title=f"{verb}?",
            question=question,
            action=request.url(f"queues/{_quote(queue)}/{action}"),
            carried=[("next", back)],
            back=back,
            button=f"Yes, {verb.lower()}",
            danger=False,
        )
    try:
        if action == "pause":
            done = dash.broker.pause(queue)
            flash = f"Queue {queue} paused." if done else f"Queue {queue} was already paused: nothing done."
        else:
            done = dash.broker.resume(queue)
            flash = f"Queue {queue} resumed." if done else f"Queue {queue} was not paused: nothing done."
    except ValueError:  # no longer known
        raise HTTPError(HTTPStatus.NOT_FOUND, f"No queue named {queue!r}.") from None
    raise dash.back(request, page, flash)


def running(dash: Pages, request: Request) -> str:
    """The messages in flight, on every queue or on ``?queue=``, oldest first."""
    refresh = refresh_arg(request)
    started = time.perf_counter()
    queue = request.arg("queue")
    if queue:
        dash.known_queue(queue)
    messages = dash.broker.running(queue or None)
    return dash.render(
        request,
        "running.html",
        title=f"{queue}: running" if queue else "Running",
        queue=queue,
        queues=sorted(dash.broker.known_queues()),
        messages=messages[:RUNNING_LIMIT],
        total=len(messages),
        warn_ms=RUNNING_WARN_MS,
        now=dash.now_ms(),
        refresh=refresh,
        refresh_choices=REFRESH_CHOICES,
        elapsed_ms=(time.perf_counter() - started) * 1000,
    )


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")
