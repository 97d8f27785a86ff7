"""The dashboard's workflow pages, on the app as ``_context.Pages``: the newest workflows
(filtered by state), one workflow with the tree of its chains, groups and steps, and
cancelling a running one (with a confirmation). What they read is ``broker.workflows``
(:mod:`..workflows._store`)."""

from __future__ import annotations

import time
import urllib.parse
from http import HTTPStatus
from typing import TYPE_CHECKING, get_args

from ..workflows._states import WorkflowStateName
from ._http import REFRESH_CHOICES, HTTPError, Request, refresh_arg

if TYPE_CHECKING:
    from ..workflows import WorkflowState
    from ._context import Pages

#: The states a visitor may filter the list by (``?state=``).
WORKFLOW_STATES: tuple[str, ...] = get_args(WorkflowStateName)
#: How many workflows the list shows (``?n=``), the first by default. A filter by state
#: reads through the index of kept workflows until it has found that many.
LIST_SIZES = (50, 200, 1000)

#: A step's states that mean it has not started (a cancel keeps it from running).
_NOT_STARTED = ("waiting", "sent")


def listing(dash: Pages, request: Request) -> str:
    """The newest workflows, running and finished ones still kept, or those in ``?state=``."""
    refresh = refresh_arg(request)
    started = time.perf_counter()
    state = request.arg("state")
    if state and state not in WORKFLOW_STATES:
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"state must be one of {', '.join(WORKFLOW_STATES)}.")
    size_text = request.arg("n", str(LIST_SIZES[0]))
    if not (size_text.isascii() and size_text.isdigit()) or int(size_text) not in LIST_SIZES:
        raise HTTPError(HTTPStatus.BAD_REQUEST, f"n must be one of {', '.join(map(str, LIST_SIZES))}.")
    size = int(size_text)
    workflows = dash.broker.workflows.list(state=state or None, limit=size)
    return dash.render(
        request,
        "workflows.html",
        title=f"Workflows: {state}" if state else "Workflows",
        workflows=workflows,
        state=state,
        states=WORKFLOW_STATES,
        size=size,
        sizes=LIST_SIZES,
        retention_ms=dash.broker.workflows.retention_ms,
        now=dash.now_ms(),
        refresh=refresh,
        refresh_choices=REFRESH_CHOICES,
        elapsed_ms=(time.perf_counter() - started) * 1000,
    )


def workflow(dash: Pages, request: Request, workflow_id: str) -> str:
    """One workflow: its state, times, result and tree; a 404 if it is not kept."""
    refresh = refresh_arg(request)
    started = time.perf_counter()
    state = _get(dash, workflow_id)
    counts: dict[str, int] = {}
    for step in state.steps:
        counts[step.state] = counts.get(step.state, 0) + 1
    return dash.render(
        request,
        "workflow.html",
        title=f"workflow {workflow_id}",
        wf=state,
        counts=counts,
        now=dash.now_ms(),
        here=request.url(f"workflows/{_quote(workflow_id)}", refresh=refresh or None),
        refresh=refresh,
        refresh_choices=REFRESH_CHOICES,
        elapsed_ms=(time.perf_counter() - started) * 1000,
    )


def cancel(dash: Pages, request: Request, workflow_id: str) -> str:
    """Cancel a running workflow, once confirmed."""
    page = request.url(f"workflows/{_quote(workflow_id)}")
    if request.field("confirmed") != "yes":
        state = _get(dash, workflow_id)
        if state.finished:
            raise dash.back(request, page, f"Workflow {workflow_id} is {state.state} already: nothing done.")
        waiting = sum(1 for step in state.steps if step.state in _NOT_STARTED)
        running = sum(1 for step in state.steps if step.state == "running")
        back = request.next_page(page)
        return dash.render(
            request,
            "confirm.html",
            title="Cancel?",
            question=(
                f"Cancel workflow {workflow_id}? Its {_count(waiting, 'step')} not started never run (scheduled "
                "ones leave their delayed queue, queued ones are skipped when a worker takes them)."
                + (f" The steps running now ({running:,}) finish; nothing after them is sent." if running else "")
            ),
            action=request.url(f"workflows/{_quote(workflow_id)}/cancel"),
            carried=[("next", back)],
            back=back,
            button="Yes, cancel",
            danger=True,
        )
    try:
        done = dash.broker.workflows.cancel(workflow_id)
    except LookupError:
        raise _missing(dash, workflow_id) from None
    flash = f"Workflow {workflow_id} cancelled." if done else f"Workflow {workflow_id} had finished: nothing done."
    raise dash.back(request, page, flash)


def _get(dash: Pages, workflow_id: str) -> WorkflowState:
    state = dash.broker.workflows.get(workflow_id)
    if state is None:
        raise _missing(dash, workflow_id)
    return state


def _missing(dash: Pages, workflow_id: str) -> HTTPError:
    return HTTPError(
        HTTPStatus.NOT_FOUND,
        f"No workflow {workflow_id!r} in namespace {dash.broker.namespace!r}: never run, or its retention ended.",
    )


def _count(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'s' if count != 1 else ''}"


def _quote(part: str) -> str:
    return urllib.parse.quote(part, safe="")
