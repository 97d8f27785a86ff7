"""The dashboard's Schedules page and its actions (pause, resume, run now, remove), on
the app as ``_context.Pages``."""

from __future__ import annotations

import time
from collections.abc import Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, TypeVar

from .. import _format
from ._http import HTTPError, Request

if TYPE_CHECKING:
    from ._context import Pages

SCHEDULE_ACTIONS = ("pause", "resume", "run", "remove")

_T = TypeVar("_T")


def _read(read: Callable[[], _T]) -> _T:
    """``read()`` of the stored schedules; one that cannot be read (a definition this
    version cannot parse) is an error page saying so, not a failed request."""
    try:
        return read()
    except ValueError as e:  # InvalidSchedule, malformed JSON
        raise HTTPError(
            HTTPStatus.INTERNAL_SERVER_ERROR, f"A stored schedule cannot be read: {_format.one_line(e)}"
        ) from None


def page(dash: Pages, request: Request) -> str:
    started = time.perf_counter()
    schedules = _read(dash.broker.schedules.list)
    return dash.render(
        request,
        "schedules.html",
        title="Schedules",
        schedules=schedules,
        now=dash.now_ms(),
        here=request.url("schedules"),
        elapsed_ms=(time.perf_counter() - started) * 1000,
    )


def action(dash: Pages, request: Request, action: str) -> str:
    """Pause, resume, run now or remove the schedule the form names, once confirmed."""
    if action not in SCHEDULE_ACTIONS:
        raise HTTPError(HTTPStatus.NOT_FOUND, f"No action {action!r} on a schedule.")
    named = request.field("name")
    # "queue/name" (a schedule's name has no "/"; the same name may be on two queues)
    queue, _, name = named.rpartition("/")
    if not name:
        raise HTTPError(HTTPStatus.BAD_REQUEST, "The form names no schedule.")
    schedules = dash.broker.schedules
    page = request.url("schedules")
    try:
        info = _read(lambda: schedules.get(name, queue or None))
    except (KeyError, ValueError):
        raise dash.back(request, page, f"No schedule named {name}: nothing done.") from None
    if request.field("confirmed") != "yes":
        verb, question = {
            "pause": (
                "Pause",
                f"Pause schedule {name} ({info.spec}, actor {info.actor_name}) of queue "
                f"{info.queue_name}? Its ticks stop until it is resumed.",
            ),
            "resume": (
                "Resume",
                f"Resume schedule {name} ({info.spec}) of queue {info.queue_name}? It goes on "
                "from its next tick; the ticks missed while it was paused do not run.",
            ),
            "run": (
                "Run now",
                f"Run schedule {name}'s actor {info.actor_name} on queue {info.queue_name} now, "
                "once, with its arguments? Its ticks go on as before.",
            ),
            "remove": (
                "Remove",
                f"Remove schedule {name} ({info.spec}, actor {info.actor_name}) of queue "
                f"{info.queue_name}, and cancel its next tick? A worker that still declares it "
                "stores it again when it starts.",
            ),
        }[action]
        back = request.next_page(page)
        carried = [("name", named), ("next", back)]
        return dash.render(
            request,
            "confirm.html",
            title=f"{verb}?",
            question=question,
            action=request.url(f"schedules/{action}"),
            carried=carried,
            back=back,
            button=f"Yes, {verb.lower()}",
            danger=action == "remove",
        )

    def act() -> str:
        """Do it; what the page then says."""
        if action == "pause":
            done = schedules.pause(name, info.queue_name)
            return f"Schedule {name} paused." if done else f"Schedule {name} was already paused: nothing done."
        if action == "resume":
            done = schedules.resume(name, info.queue_name)
            return f"Schedule {name} resumed." if done else f"Schedule {name} was not paused: nothing done."
        if action == "run":
            message = schedules.run_now(name, info.queue_name)
            return f"Schedule {name} sent to run now: message {message.message_id} on queue {info.queue_name}."
        done = schedules.remove(name, info.queue_name)
        return f"Schedule {name} removed." if done else f"No schedule named {name}: nothing done."

    try:
        flash = _read(act)
    except KeyError:  # removed meanwhile
        flash = f"No schedule named {name}: nothing done."
    raise dash.back(request, page, flash)
