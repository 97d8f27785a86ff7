"""Dead letters: ``dead list``, ``dead show``, ``dead requeue``, ``dead purge``."""

from __future__ import annotations

import argparse

from .._format import ago, call_text, dead_doc, iso, last_error, shorten
from ._base import DEFAULT_LIMIT, EXIT_NOT_FOUND, EXIT_OK, Command, Context, non_negative_int
from ._connect import confirm, declined, server_now
from ._output import Block, Cell, Output, Table
from ._scheduled import check_ids_or_all, detail_blocks, plural, report_all, report_ids


def _dead_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=non_negative_int,
        default=DEFAULT_LIMIT,
        help=f"show at most N (default {DEFAULT_LIMIT}; 0: all)",
    )


def cmd_dead_list(ctx: Context) -> int:
    args = ctx.args
    dl = ctx.broker.dead_letters(args.queue)
    now = server_now(ctx.broker)
    total = dl.size()
    entries = dl.read_all(None if args.limit == 0 else args.limit + 1)
    truncated = args.limit != 0 and len(entries) > args.limit
    if truncated:
        entries = entries[: args.limit]
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "time_ms": now,
                "time": iso(now),
                "dead": total,
                "count": len(entries),
                "truncated": truncated,
                "messages": [dead_doc(died, message, now) for died, message in entries],
            }
        )
        return EXIT_OK
    blocks: list[Block] = [
        Cell(f"Dead letters of {args.queue!r}: {total} · server time {iso(now, precise=False)}", "bold")
    ]
    if not entries:
        blocks.append(Cell("No dead letters."))
        ctx.out.blocks(blocks)
        return EXIT_OK
    table = Table(["died (UTC)", "when", "id", "actor", "retries", "last error", "arguments"], numeric={4})
    for died, message in entries:
        table.add(
            iso(died, precise=False) or "",
            ago(died, now),
            str(message.options.get("redis_message_id", message.message_id)),
            Cell(message.actor_name, "cyan"),
            str(message.options.get("retries", 0)),
            Cell(shorten(last_error(message) or "-", 50), "red"),
            call_text(message, 40),
        )
    blocks.append(table)
    if truncated:
        blocks.append(Cell(f"Showing the oldest {len(entries)}; --limit 0 lists all.", "dim"))
    ctx.out.blocks(blocks)
    return EXIT_OK


DEAD_LIST = Command(
    "list",
    "dead letters of a queue, oldest first",
    cmd_dead_list,
    _dead_list_arguments,
)


def _dead_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("message_id", metavar="ID", help="its redis message id (the id column of dead list)")


def cmd_dead_show(ctx: Context) -> int:
    args = ctx.args
    now = server_now(ctx.broker)
    found = ctx.broker.dead_letters(args.queue).get(args.message_id)
    if found is None:
        if ctx.json_mode:
            ctx.out.json({"queue": args.queue, "message_id": args.message_id, "found": False})
        Output.note(f"no dead letter {args.message_id} on queue {args.queue!r}")
        return EXIT_NOT_FOUND
    died, message = found
    doc = dead_doc(died, message, now)
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
    fields = [
        ("id", str(doc["redis_message_id"])),
        ("died", f"{doc['died']} ({ago(died, now)})"),
        ("retries", str(message.options.get("retries", 0))),
        ("last error", doc["error"] or "-"),
    ]
    ctx.out.blocks(detail_blocks(f"Dead letter {args.message_id} on {args.queue!r}", fields, doc))
    return EXIT_OK


DEAD_SHOW = Command(
    "show",
    "one dead letter in full, with its traceback",
    cmd_dead_show,
    _dead_show_arguments,
)


def _dead_bulk_arguments(parser: argparse.ArgumentParser) -> None:
    """dead requeue and dead purge: dead letter ids, or --all."""
    parser.add_argument("ids", nargs="*", metavar="ID")
    parser.add_argument("--all", action="store_true", help="every dead letter of the queue")


def cmd_dead_requeue(ctx: Context) -> int:
    args = ctx.args
    check_ids_or_all(ctx, "dead requeue", actor=False)
    dl = ctx.broker.dead_letters(args.queue)
    if args.all:
        if not confirm(args, f"requeue every dead letter of queue {args.queue!r}"):
            return declined()
        count = dl.requeue_all()
        return report_all(ctx, count, f"Requeued {plural(count, 'dead letter')} of {args.queue!r}.")
    done: list[str] = []
    missing: list[str] = []
    for message_id in dict.fromkeys(args.ids):
        (done if dl.requeue(message_id) else missing).append(message_id)
    return report_ids(ctx, "requeued", "requeued", done, missing, "no dead letter")


DEAD_REQUEUE = Command(
    "requeue",
    "put dead letters back on the ready queue (ids, or --all)",
    cmd_dead_requeue,
    _dead_bulk_arguments,
    bulk=True,
)


def cmd_dead_purge(ctx: Context) -> int:
    args = ctx.args
    check_ids_or_all(ctx, "dead purge", actor=False)
    dl = ctx.broker.dead_letters(args.queue)
    what = "every dead letter" if args.all else f"{len(set(args.ids))} dead letter(s)"
    if not confirm(args, f"delete {what} of queue {args.queue!r} for good"):
        return declined()
    if args.all:
        count = dl.clear()
        return report_all(ctx, count, f"Deleted {plural(count, 'dead letter')} of {args.queue!r}.")
    done: list[str] = []
    missing: list[str] = []
    for message_id in dict.fromkeys(args.ids):
        (done if dl.remove(message_id) else missing).append(message_id)
    return report_ids(ctx, "removed", "deleted", done, missing, "no dead letter")


DEAD_PURGE = Command(
    "purge",
    "delete dead letters for good (ids, or --all; always asks)",
    cmd_dead_purge,
    _dead_bulk_arguments,
    bulk=True,
)

DEAD = Command(
    "dead",
    "dead letters: list, show, requeue, purge",
    actions=(DEAD_LIST, DEAD_SHOW, DEAD_REQUEUE, DEAD_PURGE),
    description="Dead letters of a queue.",
)
