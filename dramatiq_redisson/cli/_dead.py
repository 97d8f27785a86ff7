"""Dead letters: ``dead list``, ``dead show``, ``dead requeue``, ``dead purge``.

``show``, ``requeue`` and ``purge`` take a dead letter's redis id or its message id (see
:meth:`DeadLetters.find`). A message id that names several dead letters is listed by
``show``, refused by ``requeue`` (requeuing each would run the message more than once:
it names their redis ids), and purged whole by ``purge`` (which asks first, counting
them)."""

from __future__ import annotations

import argparse
from typing import Any

from dramatiq.message import Message

from .._format import ago, call_text, dead_doc, iso, last_error, shorten
from ..admin._dead_letters import SEARCH_LIMIT, DeadLetters
from ._base import DEFAULT_LIMIT, EXIT_NOT_FOUND, EXIT_OK, Command, Context, non_negative_int
from ._connect import confirm, declined, server_now
from ._output import Block, Cell, Output, Table
from ._scheduled import check_ids_or_all, detail_blocks, plural, report_all

#: What an id argument is.
ID_HELP = "a message id, or a redis id (dead list shows both)"


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
    blocks.append(_table(entries, now))
    if truncated:
        blocks.append(Cell(f"Showing the oldest {len(entries)}; --limit 0 lists all.", "dim"))
    ctx.out.blocks(blocks)
    return EXIT_OK


def _table(entries: list[tuple[int, Message[Any]]], now: int) -> Table:
    """Dead letters as ``dead list`` shows them: the message id first, then the redis id."""
    table = Table(
        ["message id", "redis id", "died (UTC)", "when", "actor", "retries", "last error", "arguments"], numeric={5}
    )
    for died, message in entries:
        table.add(
            str(message.message_id),
            str(message.options.get("redis_message_id", message.message_id)),
            iso(died, precise=False) or "",
            ago(died, now),
            Cell(message.actor_name, "cyan"),
            str(message.options.get("retries", 0)),
            Cell(shorten(last_error(message) or "-", 50), "red"),
            call_text(message, 40),
        )
    return table


def _redis_id(message: Message[Any]) -> str:
    return str(message.options["redis_message_id"])


def _not_found(dl: DeadLetters, given: str) -> str:
    """The note for an id that names no dead letter; when the search for its message id
    did not reach every dead letter, how far it went."""
    note = f"no dead letter {given} on queue {dl.queue_name!r}"
    total = dl.size()
    if total > SEARCH_LIMIT:
        note += (
            f" (looked for as a message id among the newest {SEARCH_LIMIT:,} of {total:,} dead letters; "
            "an older one answers to its redis id: dead list --limit 0)"
        )
    return note


DEAD_LIST = Command(
    "list",
    "dead letters of a queue, oldest first",
    cmd_dead_list,
    _dead_list_arguments,
)


def _dead_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("message_id", metavar="ID", help=ID_HELP)


def cmd_dead_show(ctx: Context) -> int:
    args = ctx.args
    now = server_now(ctx.broker)
    dl = ctx.broker.dead_letters(args.queue)
    letters = dl.find(args.message_id)
    if not letters:
        if ctx.json_mode:
            ctx.out.json({"queue": args.queue, "message_id": args.message_id, "found": False})
        Output.note(_not_found(dl, args.message_id))
        return EXIT_NOT_FOUND
    docs = [dead_doc(died, message, now) for died, message in letters]
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": args.queue,
                "message_id": args.message_id,
                "found": True,
                "time_ms": now,
                "time": iso(now),
                "count": len(docs),
                "message": docs[0] if len(docs) == 1 else None,
                "messages": docs,
            }
        )
        return EXIT_OK
    if len(letters) > 1:
        title = (
            f"Message id {args.message_id} names {len(letters)} dead letters on {args.queue!r}, newest first; "
            "give a redis id to show, requeue or purge one:"
        )
        ctx.out.blocks([Cell(title, "bold"), _table(letters, now)])
        return EXIT_OK
    [(died, message)], [doc] = letters, docs
    fields = [
        ("redis id", str(doc["redis_message_id"])),
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
    parser.add_argument("ids", nargs="*", metavar="ID", help=ID_HELP)
    parser.add_argument("--all", action="store_true", help="every dead letter of the queue")


def _resolve(dl: DeadLetters, ids: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """The redis ids each given id names (in order, each id once), and the ids that name
    no dead letter."""
    named: dict[str, list[str]] = {}
    missing: list[str] = []
    for given in dict.fromkeys(ids):
        letters = dl.find(given)
        if letters:
            named[given] = [_redis_id(message) for _, message in letters]
        else:
            missing.append(given)
    return named, missing


def _act(dl: DeadLetters, action: str, redis_id: str) -> bool:
    """Requeue or remove one dead letter by its redis id alone (it may have left since it
    was found: then False, and no search by message id)."""
    return dl.act(action, [redis_id]) > 0


def _report(
    ctx: Context,
    dl: DeadLetters,
    key: str,
    verb: str,
    done: list[tuple[str, str]],
    missing: list[str],
    extra: dict[str, Any],
) -> int:
    """Print what ``dead requeue``/``dead purge`` did (``done``: given id and redis id
    pairs); exit 1 if an id was not found (or, for requeue, named several)."""
    if ctx.json_mode:
        document = {"queue": ctx.args.queue, "count": len(done), key: [rid for _, rid in done], "not_found": missing}
        ctx.out.json({**document, **extra})
    else:
        for given, rid in done:
            ctx.out.line(f"{verb} {given}" + ("" if rid == given else f" (redis id {rid})"))
    for given in missing:
        Output.note(_not_found(dl, given))
    return EXIT_NOT_FOUND if missing or any(extra.values()) else EXIT_OK


def cmd_dead_requeue(ctx: Context) -> int:
    args = ctx.args
    check_ids_or_all(ctx, "dead requeue", actor=False)
    dl = ctx.broker.dead_letters(args.queue)
    if args.all:
        if not confirm(args, f"requeue every dead letter of queue {args.queue!r}"):
            return declined()
        count = dl.requeue_all()
        return report_all(ctx, count, f"Requeued {plural(count, 'dead letter')} of {args.queue!r}.")
    named, missing = _resolve(dl, args.ids)
    done: list[tuple[str, str]] = []
    ambiguous: dict[str, list[str]] = {}
    for given, rids in named.items():
        if len(rids) > 1:
            # Requeuing each would run the message once per dead letter: the operator picks.
            ambiguous[given] = rids
        elif _act(dl, "requeue", rids[0]):
            done.append((given, rids[0]))
        else:
            missing.append(given)
    status = _report(ctx, dl, "requeued", "requeued", done, missing, {"ambiguous": ambiguous})
    for given, rids in ambiguous.items():
        Output.note(
            f"not requeued: message id {given} names {len(rids)} dead letters on queue {args.queue!r} "
            f"(redis ids, newest first: {', '.join(rids)}); requeue one by its redis id"
        )
    return status


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
    if args.all:
        if not confirm(args, f"delete every dead letter of queue {args.queue!r} for good"):
            return declined()
        count = dl.clear()
        return report_all(ctx, count, f"Deleted {plural(count, 'dead letter')} of {args.queue!r}.")
    # Every dead letter a message id names goes: deleting them cannot run it twice.
    named, missing = _resolve(dl, args.ids)
    pairs = list({rid: (given, rid) for given, rids in named.items() for rid in rids}.values())
    if pairs and not confirm(args, f"delete {len(pairs)} dead letter(s) of queue {args.queue!r} for good"):
        return declined()
    done: list[tuple[str, str]] = []
    for given, rid in pairs:
        if _act(dl, "remove", rid):
            done.append((given, rid))
        elif given not in missing:
            missing.append(given)
    return _report(ctx, dl, "removed", "deleted", done, missing, {})


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
