"""Scheduled messages: ``list``, ``show``, ``cancel``, ``promote``, ``reschedule``."""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterator
from typing import Any

from .. import DelayedQueue
from .._format import call_text, iso, scheduled_doc, until
from ._base import (
    DEFAULT_LIMIT,
    EXIT_NOT_FOUND,
    EXIT_OK,
    Command,
    Context,
    UsageError,
    duration_arg,
    non_negative_int,
    time_arg,
)
from ._connect import confirm, declined, server_now
from ._output import Block, Cell, Output, Table


def take(items: Iterator[Any], limit: int) -> tuple[list[Any], bool]:
    """At most ``limit`` items (0: all), and whether there were more."""
    if limit == 0:
        return list(items), False
    taken = list(itertools.islice(items, limit + 1))
    return taken[:limit], len(taken) > limit


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue")
    parser.add_argument("--actor", help="only this actor's messages")
    parser.add_argument("--match", metavar="TEXT", help="only messages whose encoded form contains TEXT")
    parser.add_argument(
        "--limit",
        type=non_negative_int,
        default=DEFAULT_LIMIT,
        help=f"show at most N (default {DEFAULT_LIMIT}; 0: all)",
    )


def cmd_list(ctx: Context) -> int:
    args = ctx.args
    dq = ctx.broker.delayed_queue(args.queue)
    now = server_now(ctx.broker)
    total = dq.size()
    batch = 1000 if args.limit == 0 else min(1000, args.limit + 1)
    entries, truncated = take(dq.scan(actor_name=args.actor, match=args.match, batch=batch), args.limit)
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "time_ms": now,
                "time": iso(now),
                "scheduled": total,
                "count": len(entries),
                "truncated": truncated,
                "messages": [scheduled_doc(due, message, now) for due, message in entries],
            }
        )
        return EXIT_OK
    filters = [f"actor {args.actor!r}" if args.actor else "", f"matching {args.match!r}" if args.match else ""]
    what = " and ".join(f for f in filters if f)
    title = f"Scheduled on {args.queue!r}: {total} in all" + (f"; {what}" if what else "")
    title += f" · server time {iso(now, precise=False)}"
    blocks: list[Block] = [Cell(title, "bold")]
    if not entries:
        blocks.append(Cell("Nothing scheduled." if not what else "No scheduled message matches."))
        ctx.out.blocks(blocks)
        return EXIT_OK
    table = Table(["due (UTC)", "when", "message id", "actor", "retries", "arguments"], numeric={4})
    for due, message in entries:
        table.add(
            iso(due, precise=False) or "",
            Cell(until(due, now), "red" if due < now - 1000 else None),
            message.message_id,
            Cell(message.actor_name, "cyan"),
            str(message.options.get("retries", 0)),
            call_text(message),
        )
    blocks.append(table)
    if truncated:
        blocks.append(Cell(f"Showing the first {len(entries)} in due order; --limit 0 lists all.", "dim"))
    ctx.out.blocks(blocks)
    return EXIT_OK


LIST = Command(
    "list",
    "scheduled messages of a queue, in due order",
    cmd_list,
    _list_arguments,
)


def detail_blocks(title: str, fields: list[tuple[str, str]], doc: dict[str, Any]) -> list[Block]:
    """One message in full: a title, its main fields, its options as indented JSON."""
    blocks: list[Block] = [Cell(title, "bold")]
    width = max(len(name) for name, _ in fields + [("options", "")])
    base = [
        ("message id", doc["message_id"]),
        ("queue", doc["queue_name"]),
        ("actor", doc["actor_name"]),
        ("args", json.dumps(doc["args"], ensure_ascii=False, default=str)),
        ("kwargs", json.dumps(doc["kwargs"], ensure_ascii=False, default=str)),
        ("enqueued", f"{doc['enqueued']} ({doc['message_timestamp']})"),
    ]
    width = max(width, *(len(name) for name, _ in base))
    for name, value in fields + base:
        blocks.append(Cell(f"  {name.ljust(width)}  {value}"))
    options = {k: v for k, v in doc["options"].items() if k != "traceback"}
    rendered = json.dumps(options, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    blocks.append(Cell(f"  {'options'.ljust(width)}  " + rendered.replace("\n", "\n  " + " " * (width + 2))))
    traceback = doc["options"].get("traceback")
    if isinstance(traceback, str):
        blocks.append(Cell("  traceback:"))
        blocks.append(Cell("\n".join("    " + line for line in traceback.rstrip().splitlines()), "red"))
    return blocks


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue")
    parser.add_argument("message_id", metavar="ID")


def cmd_show(ctx: Context) -> int:
    args = ctx.args
    now = server_now(ctx.broker)
    found = ctx.broker.delayed_queue(args.queue).get(args.message_id)
    if found is None:
        if ctx.json_mode:
            ctx.out.json({"queue": args.queue, "message_id": args.message_id, "found": False})
        Output.note(
            f"not scheduled: {args.message_id} on queue {args.queue!r} (it moved to the ready queue, "
            "was cancelled, or never was)"
        )
        return EXIT_NOT_FOUND
    due, message = found
    doc = scheduled_doc(due, message, now)
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "message_id": args.message_id,
                "found": True,
                "time_ms": now,
                "time": iso(now),
                "message": doc,
            }
        )
        return EXIT_OK
    fields = [("due", f"{doc['due']} ({until(due, now)})"), ("retries", str(message.options.get("retries", 0)))]
    ctx.out.blocks(detail_blocks(f"Scheduled message {message.message_id} on {args.queue!r}", fields, doc))
    return EXIT_OK


SHOW = Command(
    "show",
    "one scheduled message in full",
    cmd_show,
    _show_arguments,
)


def check_ids_or_all(ctx: Context, verb: str, actor: bool = True) -> None:
    args = ctx.args
    if args.all and args.ids:
        raise UsageError(f"{verb}: give message ids or --all, not both")
    if not args.all and not args.ids:
        raise UsageError(f"{verb}: give one or more message ids, or --all")
    if actor and args.actor and not args.all:
        raise UsageError(f"{verb}: --actor goes with --all")


def report_ids(ctx: Context, key: str, verb: str, done: list[str], missing: list[str], missing_what: str) -> int:
    """Print what an id-addressed command did; exit 1 if any id was not found."""
    if ctx.json_mode:
        ctx.out.json({"queue": ctx.args.queue, "count": len(done), key: done, "not_found": missing})
    else:
        for message_id in done:
            ctx.out.line(f"{verb} {message_id}")
    for message_id in missing:
        Output.note(f"{missing_what}: {message_id} on queue {ctx.args.queue!r}")
    return EXIT_NOT_FOUND if missing else EXIT_OK


def report_all(ctx: Context, count: int, text: str) -> int:
    """Print what an ``--all`` command did."""
    if ctx.json_mode:
        document = {"queue": ctx.args.queue, "count": count, "all": True}
        if "actor" in ctx.args:
            document["actor_name"] = ctx.args.actor
        ctx.out.json(document)
    else:
        ctx.out.line(text)
    return EXIT_OK


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def actor_suffix(actor: str | None) -> str:
    return f" of actor {actor!r}" if actor else ""


def _act_on_scheduled(
    ctx: Context,
    verb: str,
    prompt: str,
    act_all: Callable[..., int],
    act_one: Callable[[DelayedQueue, str], bool],
    summary: str,
    past: str,
    shown: str,
) -> int:
    """``cancel``/``promote``: the ids given, or ``--all`` (``--actor``) after asking.
    ``prompt`` has ``{actor}`` and ``{queue}`` fields, ``summary`` ``{count}`` and
    ``{queue}``; ``act_all``/``act_one``: the :class:`DelayedQueue` methods to call."""
    args = ctx.args
    check_ids_or_all(ctx, verb)
    dq = ctx.broker.delayed_queue(args.queue)
    if args.all:
        if not confirm(args, prompt.format(actor=actor_suffix(args.actor), queue=repr(args.queue))):
            return declined()
        count = act_all(dq, actor_name=args.actor)
        return report_all(ctx, count, summary.format(count=plural(count, "scheduled message"), queue=repr(args.queue)))
    done: list[str] = []
    missing: list[str] = []
    for message_id in dict.fromkeys(args.ids):
        (done if act_one(dq, message_id) else missing).append(message_id)
    return report_ids(ctx, past, shown, done, missing, "not scheduled")


def _scheduled_bulk_arguments(parser: argparse.ArgumentParser) -> None:
    """cancel and promote: message ids, or --all (with an optional --actor)."""
    parser.add_argument("queue")
    parser.add_argument("ids", nargs="*", metavar="ID")
    parser.add_argument("--all", action="store_true", help="every scheduled message of the queue (asks first)")
    parser.add_argument("--actor", help="with --all: only this actor's messages")


def cmd_cancel(ctx: Context) -> int:
    return _act_on_scheduled(
        ctx,
        "cancel",
        "cancel every scheduled message{actor} on queue {queue}",
        lambda dq, **only: dq.remove_all(**only),  # (bound: a sharded queue's view folds its own)
        lambda dq, message_id: dq.remove(message_id),
        "Cancelled {count} on {queue}.",
        "cancelled",
        "cancelled",
    )


CANCEL = Command(
    "cancel",
    "cancel scheduled messages (ids, or --all [--actor A])",
    cmd_cancel,
    _scheduled_bulk_arguments,
    bulk=True,
)


def cmd_promote(ctx: Context) -> int:
    return _act_on_scheduled(
        ctx,
        "promote",
        "run every scheduled message{actor} on queue {queue} now",
        lambda dq, **only: dq.promote_all(**only),
        lambda dq, message_id: dq.promote(message_id),
        "Promoted {count} on {queue}: due now.",
        "promoted",
        "promoted (due now)",
    )


PROMOTE = Command(
    "promote",
    "run scheduled messages now (ids, or --all [--actor A])",
    cmd_promote,
    _scheduled_bulk_arguments,
    bulk=True,
)


def _reschedule_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue")
    parser.add_argument("message_id", metavar="ID")
    when = parser.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--in",
        dest="in_",
        type=duration_arg,
        metavar="DURATION",
        help="due this long from now: 90s, 10m, 1h30m, 2d, 500ms",
    )
    when.add_argument(
        "--at", type=time_arg, metavar="TIME", help="due at an ISO 8601 time with a timezone: 2026-12-01T08:00Z"
    )


def cmd_reschedule(ctx: Context) -> int:
    args = ctx.args
    dq = ctx.broker.delayed_queue(args.queue)
    if args.in_ is not None:
        moved = dq.reschedule(args.message_id, delay=args.in_)
    else:
        moved = dq.reschedule(args.message_id, at=args.at)
    found = dq.get(args.message_id) if moved else None
    now = server_now(ctx.broker)
    if not moved:
        if ctx.json_mode:
            ctx.out.json({"queue": args.queue, "message_id": args.message_id, "rescheduled": False})
        Output.note(f"not scheduled: {args.message_id} on queue {args.queue!r}")
        return EXIT_NOT_FOUND
    due = found[0] if found is not None else None
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "message_id": args.message_id,
                "rescheduled": True,
                "due_ms": due,
                "due": iso(due),
                "due_in_ms": None if due is None else due - now,
            }
        )
    elif due is None:
        ctx.out.line(f"rescheduled {args.message_id}: already due and moved to the ready queue")
    else:
        ctx.out.line(f"rescheduled {args.message_id}: due {iso(due, precise=False)} ({until(due, now)})")
    return EXIT_OK


RESCHEDULE = Command(
    "reschedule",
    "move a scheduled message to a new due time",
    cmd_reschedule,
    _reschedule_arguments,
)
