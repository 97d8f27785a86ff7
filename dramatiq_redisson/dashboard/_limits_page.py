"""The dashboard's Limits page, on the app as ``_context.Pages``: every queue's concurrency and
rate limits and what is in use now, a queue's waiting groups, and setting or clearing a
queue's limits (with a confirmation; see docs/flow-control.md)."""

from __future__ import annotations

import time
import urllib.parse
from http import HTTPStatus
from typing import TYPE_CHECKING

from ..flow._queue_limits import MAX_LIMIT, MAX_RATE, MAX_WINDOW_MS, QueueLimits, check_window
from ._http import REFRESH_CHOICES, HTTPError, Request, refresh_arg

if TYPE_CHECKING:
    from ._context import Pages

#: The most waiting lanes the page lists for one queue (``waiting_groups``' default).
WAITING_LIMIT = 100

LIMIT_OPS = ("set", "clear")


def page(dash: Pages, request: Request) -> str:
    """Every known queue's limits and slots in use; with ``?queue=``, that queue's, its
    waiting groups and (unless read-only) the form that changes its limits."""
    refresh = refresh_arg(request)
    started = time.perf_counter()
    queue = request.arg("queue")
    if queue:
        dash.known_queue(queue)
    queues = sorted(dash.broker.known_queues())
    stats = dash.broker.stats(queue or None)
    names = [queue] if queue else sorted(stats["queues"])
    limits = {name: dash.broker.limits.get(name) for name in names}
    waiting = dash.broker.waiting_groups(queue, limit=WAITING_LIMIT) if queue else []
    weights = dash.broker.limits.weights(queue) if queue else {}
    return dash.render(
        request,
        "limits.html",
        title=f"{queue}: limits" if queue else "Limits",
        queue=queue,
        queues=queues,
        names=names,
        limits=limits,
        counts=stats["queues"],
        waiting=waiting,
        weights=weights,
        max_limit=MAX_LIMIT,
        max_rate=MAX_RATE,
        now=stats["time_ms"],
        here=request.url("limits", queue=queue, refresh=refresh or None),
        refresh=refresh,
        refresh_choices=REFRESH_CHOICES,
        elapsed_ms=(time.perf_counter() - started) * 1000,
    )


def action(dash: Pages, request: Request, name: str) -> str:
    """Set (``op=set``, with ``concurrency``, ``group_concurrency``, ``rate``,
    ``group_rate`` and ``per_ms``; empty: no limit of that kind) or clear (``op=clear``) a
    queue's limits, once confirmed."""
    queue = dash.known_queue(name)
    op = request.field("op")
    if op not in LIMIT_OPS:
        raise HTTPError(HTTPStatus.BAD_REQUEST, "Choose to set or to clear the limits.")
    wanted: dict[str, int | None] = dict.fromkeys(FORM_FIELDS)
    if op == "set":
        wanted = {field: _limit_field(request, field, label, most) for field, (label, most) in FORM_FIELDS.items()}
        if all(value is None for value in wanted.values()):
            raise HTTPError(
                HTTPStatus.BAD_REQUEST,
                "Give at least one limit (to remove them all, clear the limits).",
            )
        try:
            check_window(wanted["rate"], wanted["group_rate"], wanted["per_ms"])
        except ValueError as e:
            raise HTTPError(HTTPStatus.BAD_REQUEST, f"A rate needs its window, and a window a rate: {e}") from None
    page = request.url("limits", queue=queue)
    before = dash.broker.limits.get(queue)
    if request.field("confirmed") != "yes":
        back = request.next_page(page)
        if op == "set":
            verb = "Set limits"
            question = (
                f"Set the limits of queue {queue} to {_describe(wanted)} (now {_describe(before)})? "
                "It applies to every worker at once: a raised or removed limit at once, a lowered one at "
                "their next fetches. The messages running now finish; "
                f"{before['in_use']:,} of its messages hold a slot now."
            )
            carried = [("op", op), *((field, _text(value)) for field, value in wanted.items())]
        else:
            verb = "Clear limits"
            question = (
                f"Clear the limits of queue {queue} (now {_describe(before)})? "
                "It applies to every worker at once: any of its waiting messages may start, in every group; "
                "priorities and fair share between groups still apply. The messages running now finish."
            )
            carried = [("op", op)]
        return dash.render(
            request,
            "confirm.html",
            title=f"{verb}?",
            question=question,
            action=request.url(f"queues/{_quote(queue)}/limits"),
            carried=[*carried, ("next", back)],
            back=back,
            button=f"Yes, {verb.lower()}",
            danger=False,
        )
    try:
        if op == "set":
            dash.broker.limits.set(queue, **wanted)
            flash = f"Limits of queue {queue} set: {_describe(wanted)}."
        elif all(before[field] is None for field in FORM_FIELDS):  # type: ignore[literal-required]
            dash.broker.limits.clear(queue)  # still puts any waiting lane back on its ring
            flash = f"Queue {queue} had no limits: nothing changed."
        else:
            dash.broker.limits.clear(queue)
            flash = f"Limits of queue {queue} cleared: {_describe(dict.fromkeys(FORM_FIELDS))}."
    except ValueError as e:  # checked above: not expected
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"Cannot set the limits: {e}") from None
    raise dash.back(request, page, flash)


#: The form's limits: field -> (label, highest value).
FORM_FIELDS: dict[str, tuple[str, int]] = {
    "concurrency": ("The concurrency limit", MAX_LIMIT),
    "group_concurrency": ("The group limit", MAX_LIMIT),
    "rate": ("The rate", MAX_RATE),
    "group_rate": ("The group rate", MAX_RATE),
    "per_ms": ("The rate window", MAX_WINDOW_MS),
}


def _limit_field(request: Request, name: str, label: str, most: int) -> int | None:
    """The form's limit ``name``: None when empty, else a whole number from 1 to ``most``.

    Raises:
      HTTPError: 400, anything else (nothing is written).
    """
    text = request.field(name)
    if not text:
        return None
    # ASCII digits only: str.isdigit() and int() take other scripts' digits too.
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= most:
        raise HTTPError(
            HTTPStatus.BAD_REQUEST,
            f"{label} must be a whole number from 1 to {most:,}, or empty for no limit; got {text!r}. "
            "Nothing was changed.",
        )
    return int(text)


def _describe(limits: QueueLimits | dict[str, int | None]) -> str:
    """``at most 8 running at once, 1 per group, 100 starts per 60,000 ms``; ``no limit``."""
    concurrency, group = limits["concurrency"], limits["group_concurrency"]
    rate, group_rate, window = limits["rate"], limits["group_rate"], limits["per_ms"]
    parts = [
        f"at most {concurrency:,} running at once" if concurrency is not None else "no concurrency limit",
        f"{group:,} per group" if group is not None else "no group limit",
    ]
    if window is None:
        parts.append("no rate limit")
    else:
        if rate is not None:
            parts.append(f"{rate:,} starts per {window:,} ms")
        if group_rate is not None:
            parts.append(f"{group_rate:,} starts per group per {window:,} ms")
    return ", ".join(parts)


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")
