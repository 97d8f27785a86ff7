"""Periodic actors' schedules: ``schedules [list]``, ``schedules pause``, ``schedules
resume``, ``schedules run``, ``schedules remove`` (see :class:`..Schedules`).

A schedule is named, not addressed by queue: each action takes the schedule's name (the
``name`` column of ``schedules list``) and finds its queue itself."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .. import ScheduleInfo
from .._format import ago, iso, message_doc, until
from ._base import EXIT_NOT_FOUND, EXIT_OK, PROG, Command, Context
from ._connect import confirm, declined, server_now
from ._output import Block, Cell, Output, Table


def schedule_doc(info: ScheduleInfo, now_ms: int) -> dict[str, Any]:
    """A stored schedule, JSON-ready: its fields, and each time also as ISO 8601 and
    relative to the server's time."""
    doc = info.as_dict()
    doc.update(
        next_due=iso(info.next_due_ms),
        next_due_in_ms=None if info.next_due_ms is None else info.next_due_ms - now_ms,
        last_run=iso(info.last_run_ms),
        last_run_ago_ms=None if info.last_run_ms is None else now_ms - info.last_run_ms,
        waiting_since=iso(info.waiting_since_ms),
        start=iso(info.start_ms),
        end=iso(info.end_ms),
        policy=info.policy_text(),
        ending=info.ending() or None,
    )
    return doc


def next_due_cell(info: ScheduleInfo, now_ms: int) -> Cell:
    """When its next tick is due; why there is none while paused or waiting."""
    if info.next_due_ms is not None:
        due = info.next_due_ms
        return Cell(f"{iso(due, precise=False)} ({until(due, now_ms)})", "red" if due < now_ms - 1000 else None)
    if info.paused:
        return Cell("- (paused)", "yellow")
    if info.ended:
        return Cell("- (ended)", "dim")
    if info.waiting_since_ms is not None:
        # The chain stopped at a tick (every worker was down): a worker of the queue resumes it.
        since = info.waiting_since_ms
        return Cell(f"waiting since {iso(since, precise=False)} ({ago(since, now_ms)})", "bold red")
    return Cell("-", "dim")


def _ending_cell(info: ScheduleInfo) -> Cell:
    """Whether and when the schedule ends (its window, its limit)."""
    text = info.ending()
    if not text:
        return Cell("-", "dim")
    return Cell(text, "yellow" if info.ended else None)


def _list_blocks(infos: list[ScheduleInfo], now_ms: int) -> list[Block]:
    title = f"Schedules: {len(infos)} · server time {iso(now_ms, precise=False)}"
    blocks: list[Block] = [Cell(title, "bold")]
    if not infos:
        blocks.append(
            Cell(
                "No schedules stored: a worker stores the schedules of its queues' periodic actors "
                "(@periodic) when it starts."
            )
        )
        return blocks
    table = Table(
        [
            "name",
            "actor",
            "queue",
            "spec",
            "tz",
            "next due (UTC)",
            "last run (UTC)",
            "last lateness (ms)",
            "paused",
            "catch-up",
            "policy",
            "skipped",
            "dropped",
            "ends",
        ],
        numeric={7, 11, 12},
    )
    for info in infos:
        last = info.last_run_ms
        table.add(
            Cell(info.name, "bold"),
            Cell(info.actor_name, "cyan"),
            info.queue_name,
            info.spec,
            info.tz,
            next_due_cell(info, now_ms),
            Cell("-", "dim") if last is None else f"{iso(last, precise=False)} ({ago(last, now_ms)})",
            Cell("-", "dim") if info.last_lateness_ms is None else str(info.last_lateness_ms),
            Cell("yes", "yellow") if info.paused else "no",
            info.catch_up,
            Cell(info.policy_text(), "dim") if info.policy_text() == "-" else info.policy_text(),
            str(info.skipped),
            Cell(str(info.dropped), "yellow") if info.dropped else "0",
            _ending_cell(info),
        )
    blocks.append(table)
    return blocks


def cmd_schedules_list(ctx: Context) -> int:
    infos = ctx.broker.schedules.list()
    now = server_now(ctx.broker)
    if ctx.json_mode:
        ctx.out.json(
            {
                "namespace": ctx.broker.namespace,
                "time_ms": now,
                "time": iso(now),
                "count": len(infos),
                "schedules": [schedule_doc(info, now) for info in infos],
            }
        )
        return EXIT_OK
    ctx.out.blocks(_list_blocks(infos, now))
    return EXIT_OK


def _find(ctx: Context) -> ScheduleInfo | None:
    """The schedule the command names, or None after saying it is not stored."""
    name = ctx.args.name
    try:
        return ctx.broker.schedules.get(name, ctx.args.queue)
    except KeyError:
        _not_found(ctx)
        return None
    except ValueError as e:  # stored on several queues
        if ctx.json_mode:
            ctx.out.json({"name": name, "found": True, "ambiguous": True, "error": str(e)})
        Output.note(f"{e} (--queue QUEUE)")
        return None


def _not_found(ctx: Context) -> None:
    name = ctx.args.name
    if ctx.json_mode:
        ctx.out.json({"name": name, "found": False})
    Output.note(f"no schedule named {name!r} (`{PROG} schedules list` lists them)")


def _report(ctx: Context, info: ScheduleInfo, changed: bool, done: str, unchanged: str) -> int:
    """What pause and resume did: the schedule as it is now."""
    now = server_now(ctx.broker)
    if ctx.json_mode:
        ctx.out.json(
            {
                "name": info.name,
                "queue": info.queue_name,
                "found": True,
                "changed": changed,
                "paused": info.paused,
                "time_ms": now,
                "time": iso(now),
                "schedule": schedule_doc(info, now),
            }
        )
        return EXIT_OK
    text = done if changed else unchanged
    next_due = "" if info.paused else f"; next tick {next_due_cell(info, now).text}"
    ctx.out.line(f"{text.format(name=repr(info.name), queue=repr(info.queue_name))}{next_due}")
    return EXIT_OK


def _name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the schedule's name (see schedules list)")
    parser.add_argument(
        "--queue", metavar="QUEUE", help="the schedule's queue, when the name is stored on several (an actor moved)"
    )


def _switch(ctx: Context, change: Callable[[str, str], bool], done: str, unchanged: str) -> int:
    """Pause or resume the named schedule (``change``: the broker's call), then report."""
    found = _find(ctx)
    if found is None:
        return EXIT_NOT_FOUND
    try:
        changed = change(found.name, found.queue_name)
        info = ctx.broker.schedules.get(found.name, found.queue_name)
    except KeyError:  # removed meanwhile
        _not_found(ctx)
        return EXIT_NOT_FOUND
    return _report(ctx, info, changed, done, unchanged)


def cmd_schedules_pause(ctx: Context) -> int:
    return _switch(
        ctx,
        ctx.broker.schedules.pause,
        "paused {name} (queue {queue})",
        "{name} (queue {queue}) was already paused: nothing changed",
    )


def cmd_schedules_resume(ctx: Context) -> int:
    return _switch(
        ctx,
        ctx.broker.schedules.resume,
        "resumed {name} (queue {queue})",
        "{name} (queue {queue}) was not paused: nothing changed",
    )


def cmd_schedules_run(ctx: Context) -> int:
    found = _find(ctx)
    if found is None:
        return EXIT_NOT_FOUND
    try:
        message = ctx.broker.schedules.run_now(found.name, found.queue_name)
    except KeyError:
        _not_found(ctx)
        return EXIT_NOT_FOUND
    if ctx.json_mode:
        ctx.out.json({"name": found.name, "queue": found.queue_name, "found": True, "message": message_doc(message)})
    else:
        ctx.out.line(
            f"sent {found.name!r} to run now: message {message.message_id} "
            f"(actor {message.actor_name!r}) on the ready queue of {found.queue_name!r}"
        )
    return EXIT_OK


def cmd_schedules_remove(ctx: Context) -> int:
    found = _find(ctx)
    if found is None:
        return EXIT_NOT_FOUND
    if not confirm(ctx.args, f"remove schedule {found.name!r} of queue {found.queue_name!r}"):
        return declined()
    try:
        removed = ctx.broker.schedules.remove(found.name, found.queue_name)
    except KeyError:
        removed = False
    if not removed:
        _not_found(ctx)
        return EXIT_NOT_FOUND
    if ctx.json_mode:
        ctx.out.json({"name": found.name, "queue": found.queue_name, "found": True, "removed": True})
    else:
        ctx.out.blocks(
            [
                Cell(f"removed schedule {found.name!r} of queue {found.queue_name!r}"),
                Cell("A worker that still declares it (@periodic) stores it again when it starts.", "dim"),
            ]
        )
    return EXIT_OK


SCHEDULES_LIST = Command("list", "every stored schedule (the default action)", cmd_schedules_list)
SCHEDULES_PAUSE = Command(
    "pause", "stop a schedule's ticks until resumed (kept across restarts)", cmd_schedules_pause, _name_argument
)
SCHEDULES_RESUME = Command(
    "resume", "go on with a paused schedule from its next tick", cmd_schedules_resume, _name_argument
)
SCHEDULES_RUN = Command(
    "run", "run a schedule's actor now, once (its ticks go on as before)", cmd_schedules_run, _name_argument
)
SCHEDULES_REMOVE = Command(
    "remove", "forget a schedule and cancel its tick (asks first)", cmd_schedules_remove, _name_argument, bulk=True
)

#: The actions of ``schedules``, in the order ``schedules --help`` lists them.
ACTIONS: tuple[Command, ...] = (SCHEDULES_LIST, SCHEDULES_PAUSE, SCHEDULES_RESUME, SCHEDULES_RUN, SCHEDULES_REMOVE)

_HANDLERS: dict[str, Callable[[Context], int]] = {
    action.name: action.handler for action in ACTIONS if action.handler is not None
}


def _schedules_arguments(parser: argparse.ArgumentParser) -> None:
    """The actions, each with ``--json`` (and ``--yes`` when it asks first); none: list.
    Unlike the other groups' actions they take a schedule's name, not a queue."""
    parser.usage = "%(prog)s [-h] [--json] [ACTION] ..."
    actions = parser.add_subparsers(
        dest="schedules_command",
        metavar="ACTION",
        required=False,
        parser_class=type(parser),
        prog=f"{PROG} schedules",
    )
    for action in ACTIONS:
        sub = actions.add_parser(action.name, help=action.help, description=action.help)
        sub.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document on stdout"
        )
        if action.bulk:
            sub.add_argument(
                "--yes", "-y", action="store_true", help="do it without asking (required without a terminal)"
            )
        action.arguments(sub)


def cmd_schedules(ctx: Context) -> int:
    return _HANDLERS[getattr(ctx.args, "schedules_command", None) or "list"](ctx)


SCHEDULES = Command(
    "schedules",
    "periodic actors' schedules: list, pause, resume, run, remove",
    cmd_schedules,
    _schedules_arguments,
)
