"""``stats`` and ``watch``: the counts of the queues, once or refreshed."""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from typing import Any

import redis

from .. import QueueStats, Stats
from .._format import iso, one_line, span, stats_doc, until
from ._base import EXIT_OK, Command, Context, non_negative_int, positive_float
from ._output import Block, Cell, Output, Table


def stats_blocks(stats: Stats, namespace: str) -> list[Block]:
    now = stats["time_ms"]
    workers = stats["workers"]
    paused = sum(q["paused"] for q in stats["queues"].values())
    header = Cell(
        f"Server time {iso(now, precise=False)} · namespace {namespace!r} · "
        f"{workers} live worker{'s' if workers != 1 else ''}" + (f" · {paused} paused" if paused else ""),
        "bold",
    )
    if not stats["queues"]:
        return [
            header,
            Cell(
                "No known queues: a queue becomes known once a process of the app declares it (an "
                "actor on it), sends to it or consumes it; or give the app's broker import path."
            ),
        ]
    legacy = any(q["legacy_delayed"] for q in stats["queues"].values())
    headers = [
        "queue",
        "ready",
        "latency",
        "in flight",
        "scheduled",
        "overdue",
        "next due",
        "dead",
        "processed 1h",
        "failed 1h",
        "retried 1h",
        "consumers",
        "paused",
        "lease holder",
    ]
    if legacy:
        headers.append("legacy .DQ")
    table = Table(headers, numeric={1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 14})
    for name, q in stats["queues"].items():
        table.add(*queue_row(name, q, now, legacy))
    blocks: list[Block] = [header, table]
    # A sharded queue's row is the sum of its shards: each shard's counts below it.
    for name, q in stats["queues"].items():
        shards = q.get("shards")
        if not shards:
            continue
        per_shard = Table(["shard", *headers[1:]], numeric=table.numeric)
        for shard, counts in shards.items():
            per_shard.add(*queue_row(shard, counts, now, legacy))
        blocks += [Cell(""), Cell(f"Shards of {name!r}: {len(shards)} (the row above is their sum)", "bold"), per_shard]
    return blocks


def queue_row(name: str, q: QueueStats, now: int, legacy: bool) -> list[Cell]:
    due = q["next_due_ms"]
    if due is None:
        next_due = Cell("-", "dim")
    else:
        next_due = Cell(f"{iso(due, precise=False)} ({until(due, now)})", "red" if due < now - 1000 else None)
    stuck = q["overdue"] > 0 and q["consumers"] == 0
    hour = q["last_hour"]
    since = q["paused_since_ms"]
    if q["paused"]:
        paused = Cell("yes" if since is None else f"yes ({span(now - since)})", "bold yellow")
    else:
        paused = Cell("no")
    row = [
        Cell(name, "bold"),
        Cell(str(q["ready"])),
        Cell(span(q["latency_ms"]) if q["latency_ms"] else "-", None if q["latency_ms"] < 60_000 else "bold yellow"),
        Cell(str(q["in_flight"])),
        Cell(str(q["scheduled"])),
        Cell(str(q["overdue"]), "bold red" if q["overdue"] else None),
        next_due,
        Cell(str(q["dead"]), "yellow" if q["dead"] else None),
        Cell(str(hour["processed"])),
        Cell(str(hour["failed"]), "red" if hour["failed"] else None),
        Cell(str(hour["retried"]), "yellow" if hour["retried"] else None),
        Cell(str(q["consumers"]), "bold red" if stuck else None),
        paused,
        Cell(q["transfer_holder"] or "-", None if q["transfer_holder"] else "dim"),
    ]
    if legacy:
        row.append(Cell(str(q["legacy_delayed"]), "yellow" if q["legacy_delayed"] else None))
    return row


def _stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", nargs="?", help="only this queue")


def cmd_stats(ctx: Context) -> int:
    stats = ctx.broker.stats(ctx.args.queue)
    if ctx.json_mode:
        ctx.out.json(stats_doc(stats, ctx.broker.namespace))
    else:
        ctx.out.blocks(stats_blocks(stats, ctx.broker.namespace))
    return EXIT_OK


STATS = Command(
    "stats",
    "counts of every known queue (or one) and the live workers",
    cmd_stats,
    _stats_arguments,
)


def _watch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", nargs="?", help="only this queue")
    parser.add_argument(
        "--interval", type=positive_float, default=2.0, metavar="S", help="seconds between refreshes (default 2)"
    )
    parser.add_argument(
        "--count", type=non_negative_int, default=0, metavar="N", help="stop after N refreshes (default 0: never)"
    )


def cmd_watch(ctx: Context) -> int:
    args = ctx.args
    broker = ctx.broker
    refreshes = itertools.count(1) if args.count == 0 else iter(range(1, args.count + 1))
    live: Any = None
    if not ctx.json_mode and ctx.out.console is not None and sys.stdout.isatty():
        from rich.live import Live

        live = Live(console=ctx.out.console, auto_refresh=False)
        live.start()
    try:
        failing = False
        for refresh in refreshes:
            if refresh > 1:
                time.sleep(args.interval)
            try:
                stats = broker.stats(args.queue)
            except (redis.ConnectionError, redis.TimeoutError) as e:
                if refresh == 1 or isinstance(e, redis.AuthenticationError):
                    raise
                if not failing:  # keep watching across a server restart
                    Output.note(f"lost the server ({one_line(e)}); retrying every {args.interval:g}s")
                failing = True
                continue
            failing = False
            if ctx.json_mode:
                ctx.out.json(stats_doc(stats, broker.namespace))
                continue
            footer = Cell(f"refresh {refresh} · every {args.interval:g}s · Ctrl-C exits", "dim")
            blocks = stats_blocks(stats, broker.namespace) + [footer]
            if live is not None:
                live.update(ctx.out.renderable(blocks), refresh=True)
            else:
                ctx.out.blocks(blocks + ([Cell("")] if args.count != refresh else []))
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return EXIT_OK


WATCH = Command(
    "watch",
    "stats, refreshed until Ctrl-C",
    cmd_watch,
    _watch_arguments,
)
