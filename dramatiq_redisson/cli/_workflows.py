"""Workflows: ``workflows [list]``, ``workflows show``, ``workflows cancel`` (see
:class:`..workflows.Workflows`).

A workflow is named by its id (the ``id`` column of ``workflows list``), not by a queue:
its steps may run on several. Only the workflows still kept are found: running ones, and
finished ones for ``workflow_retention`` ms (a broker setting, a day by default)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any, get_args

from .._format import ago, iso, shorten, span
from ..workflows import NodeState, StepState, WorkflowState, WorkflowSummary
from ..workflows._states import WorkflowStateName
from ._base import DEFAULT_LIMIT, EXIT_NOT_FOUND, EXIT_OK, PROG, Command, Context, non_negative_int
from ._connect import server_now
from ._output import Block, Cell, Output, Table

#: The states ``workflows list --state`` takes.
STATES: tuple[str, ...] = get_args(WorkflowStateName)

#: How each state is coloured on a terminal (workflows and steps).
STATE_STYLES = {
    "running": "cyan",
    "sent": "cyan",
    "done": "green",
    "failed": "bold red",
    "skipped": "dim",
    "waiting": "dim",
    "cancelled": "yellow",
}

#: Widest the ``result`` line of ``workflows show`` gets before it is cut with "…".
RESULT_WIDTH = 200

#: The times of a workflow, a step or a node given as epoch ms; JSON adds each as ISO
#: 8601 too, under the name without ``_ms`` (``delay_ms`` is a length of time: not one).
TIME_FIELDS = ("created_ms", "finished_ms", "sent_ms", "started_ms")


def _with_iso(document: Any) -> Any:
    """``document`` (a dict of :meth:`WorkflowState.as_dict` or one of its parts) with each
    time of :data:`TIME_FIELDS` also as an ISO 8601 string, at every depth."""
    if isinstance(document, list):
        return [_with_iso(item) for item in document]
    if not isinstance(document, dict):
        return document
    out: dict[str, Any] = {}
    for key, value in document.items():
        out[key] = value if key == "result" else _with_iso(value)
        if key in TIME_FIELDS:
            out[key.removesuffix("_ms")] = iso(value)
    return out


def summary_doc(summary: WorkflowSummary) -> dict[str, Any]:
    """A line of ``workflows list --json``."""
    fields = {
        "id": summary.id,
        "state": summary.state,
        "steps": summary.steps,
        "created_ms": summary.created_ms,
        "finished_ms": summary.finished_ms,
    }
    document: dict[str, Any] = _with_iso(fields)
    return document


def state_doc(state: WorkflowState) -> dict[str, Any]:
    """``workflows show --json``: :meth:`WorkflowState.as_dict`, each time also as ISO 8601."""
    document: dict[str, Any] = _with_iso(state.as_dict())
    return document


def _state_cell(state: str) -> Cell:
    return Cell(state, STATE_STYLES.get(state))


def _not_found(ctx: Context, **extra: Any) -> int:
    """Say that the workflow named is not kept; exit 1."""
    workflow_id = ctx.args.workflow_id
    if ctx.json_mode:
        ctx.out.json({"id": workflow_id, "found": False, **extra})
    Output.note(f"no workflow {workflow_id} (never run, or its retention ended; `{PROG} workflows list` lists them)")
    return EXIT_NOT_FOUND


def _took(start_ms: int | None, end_ms: int | None) -> str:
    return "" if start_ms is None or end_ms is None else span(end_ms - start_ms)


# -- list ---------------------------------------------------------------------------------


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", choices=STATES, help="only the workflows in this state")
    parser.add_argument(
        "--limit",
        type=non_negative_int,
        default=DEFAULT_LIMIT,
        help=f"show at most N (default {DEFAULT_LIMIT}; 0: all)",
    )


def cmd_workflows_list(ctx: Context) -> int:
    args = ctx.args
    workflows = ctx.broker.workflows
    state = getattr(args, "state", None)
    limit = getattr(args, "limit", DEFAULT_LIMIT)
    if limit == 0:
        # Every workflow the index holds (running and kept ones); none is missed.
        summaries = workflows.list(state=state, limit=max(1, int(ctx.broker.client.zcard(workflows.keys.index))))
        truncated = False
    else:
        summaries = workflows.list(state=state, limit=limit + 1)
        truncated = len(summaries) > limit
        summaries = summaries[:limit]
    if ctx.json_mode:
        ctx.out.json([summary_doc(summary) for summary in summaries])
        return EXIT_OK
    now = server_now(ctx.broker)
    which = f"{state} workflows" if state else "Workflows"
    blocks: list[Block] = [
        Cell(
            f"{which[0].upper()}{which[1:]}: {len(summaries)}, newest first · server time {iso(now, precise=False)}",
            "bold",
        )
    ]
    if not summaries:
        blocks.append(Cell(f"No {state} workflows." if state else "No workflows."))
        blocks.append(
            Cell("Finished workflows are kept for the broker's workflow_retention (a day by default).", "dim")
        )
        ctx.out.blocks(blocks)
        return EXIT_OK
    table = Table(["id", "state", "steps", "created (UTC)", "age", "finished (UTC)", "took"], numeric={2})
    for summary in summaries:
        finished = summary.finished_ms
        table.add(
            Cell(summary.id, "bold"),
            _state_cell(summary.state),
            str(summary.steps),
            iso(summary.created_ms, precise=False) or "",
            ago(summary.created_ms, now),
            Cell("-", "dim") if finished is None else iso(finished, precise=False) or "",
            Cell("-", "dim") if finished is None else _took(summary.created_ms, finished),
        )
    blocks.append(table)
    if truncated:
        blocks.append(Cell(f"Showing the newest {len(summaries)}; --limit 0 lists all.", "dim"))
    ctx.out.blocks(blocks)
    return EXIT_OK


# -- show ---------------------------------------------------------------------------------


def _id_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workflow_id", metavar="ID", help="the workflow's id (see workflows list)")


def cmd_workflows_show(ctx: Context) -> int:
    state = ctx.broker.workflows.get(ctx.args.workflow_id)
    if state is None:
        return _not_found(ctx)
    if ctx.json_mode:
        ctx.out.json(state_doc(state))
        return EXIT_OK
    ctx.out.blocks(show_blocks(state, server_now(ctx.broker)))
    return EXIT_OK


def _counts(steps: tuple[StepState, ...]) -> str:
    """``3: 1 done, 1 failed, 1 skipped``: the steps, by state in the order they come."""
    by_state: dict[str, int] = {}
    for step in steps:
        by_state[step.state] = by_state.get(step.state, 0) + 1
    return f"{len(steps)}: " + ", ".join(f"{count} {name}" for name, count in by_state.items())


def show_blocks(state: WorkflowState, now_ms: int) -> list[Block]:
    """A workflow for people: its fields, then its tree, one node a row, indented by depth."""
    created, finished = state.created_ms, state.finished_ms
    ended = (
        "-"
        if finished is None
        else f"{iso(finished, precise=False)} ({ago(finished, now_ms)}, after {_took(created, finished)})"
    )
    result = "-" if state.state != "done" else shorten(json.dumps(state.result, ensure_ascii=False), RESULT_WIDTH)
    fields = [
        ("state", state.state),
        ("created", f"{iso(created, precise=False)} ({ago(created, now_ms)})"),
        ("finished", ended),
        ("steps", _counts(state.steps)),
        ("result", result),
    ]
    width = max(len(name) for name, _ in fields)
    blocks: list[Block] = [
        Cell(f"Workflow {state.id}: {state.state} · server time {iso(now_ms, precise=False)}", "bold")
    ]
    blocks += [Cell(f"  {name.ljust(width)}  {value}") for name, value in fields]
    blocks.append(Cell(""))
    table = Table(["path", "node", "state", "queue", "message id", "sent", "started", "finished"])
    _add_node(table, state.tree, 0, now_ms)
    blocks.append(table)
    failed = [step for step in state.steps if step.state == "failed"]
    if failed:
        step = failed[0]
        blocks.append(
            Cell(
                "A step that failed for good is dead-lettered with its traceback: "
                f"{PROG} dead show {step.queue} {step.message_id}",
                "dim",
            )
        )
    return blocks


def _when(ms: int | None, now_ms: int) -> Cell:
    return Cell("-", "dim") if ms is None else Cell(ago(ms, now_ms))


def _add_node(table: Table, node: NodeState, depth: int, now_ms: int) -> None:
    """``node`` as a row of ``table``, then its members one level deeper."""
    indent = "  " * depth
    path = Cell(node.path or "-", None if node.path else "dim")
    step = node.step
    if step is None:
        label = node.kind if node.on_failure is None else f"{node.kind} (on_failure={node.on_failure})"
        table.add(
            path,
            Cell(indent + label, "bold"),
            _state_cell(node.state),
            "",
            "",
            "",
            "",
            "" if node.finished_ms is None else ago(node.finished_ms, now_ms),
        )
        for child in node.children:
            _add_node(table, child, depth + 1, now_ms)
        return
    sent = _when(step.sent_ms, now_ms)
    if step.delay_ms:
        sent = Cell(f"{sent.text} (delay {span(step.delay_ms)})", sent.style)
    ended = _when(step.finished_ms, now_ms)
    took = _took(step.started_ms, step.finished_ms)
    if took:
        ended = Cell(f"{ended.text} (took {took})")
    table.add(
        path,
        Cell(indent + step.actor, "cyan"),
        _state_cell(step.state),
        step.queue,
        step.message_id,
        sent,
        _when(step.started_ms, now_ms),
        ended,
    )


# -- cancel -------------------------------------------------------------------------------


def cmd_workflows_cancel(ctx: Context) -> int:
    workflow_id = ctx.args.workflow_id
    workflows = ctx.broker.workflows
    try:
        cancelled = workflows.cancel(workflow_id)
    except LookupError:
        return _not_found(ctx, cancelled=False)
    after = workflows.get(workflow_id)
    state = None if after is None else after.state
    if ctx.json_mode:
        ctx.out.json({"id": workflow_id, "found": True, "cancelled": cancelled, "state": state})
    elif cancelled:
        ctx.out.line(
            f"cancelled workflow {workflow_id}: its steps not started yet never run "
            "(scheduled ones leave their queue); those running finish, and nothing after them is sent"
        )
    else:
        ctx.out.line(f"workflow {workflow_id} had already finished ({state or 'and is gone'}): nothing changed")
    return EXIT_OK


WORKFLOWS_LIST = Command(
    "list", "workflows kept, newest first (the default action)", cmd_workflows_list, _list_arguments
)
WORKFLOWS_SHOW = Command("show", "a workflow's state, result and tree of steps", cmd_workflows_show, _id_argument)
WORKFLOWS_CANCEL = Command(
    "cancel", "cancel a running workflow: steps not started never run", cmd_workflows_cancel, _id_argument
)

#: The actions of ``workflows``, in the order ``workflows --help`` lists them.
ACTIONS: tuple[Command, ...] = (WORKFLOWS_LIST, WORKFLOWS_SHOW, WORKFLOWS_CANCEL)

_HANDLERS: dict[str, Callable[[Context], int]] = {
    action.name: action.handler for action in ACTIONS if action.handler is not None
}


def _workflows_arguments(parser: argparse.ArgumentParser) -> None:
    """The actions, each with ``--json`` and ``--plain``; none: list. Like those of
    ``schedules`` they take no queue: a workflow is named by its id."""
    parser.usage = "%(prog)s [-h] [--json] [ACTION] ..."
    actions = parser.add_subparsers(
        dest="workflows_command",
        metavar="ACTION",
        required=False,
        parser_class=type(parser),
        prog=f"{PROG} workflows",
    )
    for action in ACTIONS:
        sub = actions.add_parser(action.name, help=action.help, description=action.help)
        sub.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document on stdout"
        )
        sub.add_argument(
            "--plain",
            action="store_true",
            default=argparse.SUPPRESS,
            help="plain text tables, even with rich installed",
        )
        action.arguments(sub)


def cmd_workflows(ctx: Context) -> int:
    return _HANDLERS[getattr(ctx.args, "workflows_command", None) or "list"](ctx)


WORKFLOWS = Command(
    "workflows",
    "chains and groups of steps run as workflows: list, show, cancel",
    cmd_workflows,
    _workflows_arguments,
)
