"""Live-fleet operations: ``pause`` and ``resume`` a queue, what is ``running`` now, and the
activity ``history`` (see :meth:`RedissonBroker.pause`, :meth:`~RedissonBroker.running` and
:meth:`~RedissonBroker.history`).

Every command here refuses a queue that is not known (exit 2, one line on stderr naming
the known queues: the broker's one check, ``QueueAdmin.known``): pausing a misspelt name
would otherwise look like it worked, and reading one like an idle queue."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .. import Bucket, Counts, History, QueueStats, RunningMessage
from .._format import ago, iso, shorten, span
from ..admin._history import KEPT_HOURS, KEPT_MINUTES, totals
from ._base import EXIT_OK, Command, Context
from ._connect import server_now
from ._output import Block, Cell, Table

#: The most marks a sparkline gets; a longer history is summed into groups of buckets.
SPARK_WIDTH = 60

#: The marks of a sparkline, lowest to highest; a period without any count is ``ZERO``.
SPARK_MARKS = "▁▂▃▄▅▆▇█"
ZERO = "·"

#: The series of a history, in the order they are shown.
SERIES = ("processed", "failed", "retried")


# -- pause / resume ---------------------------------------------------------------------


def _queue_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE", help="a known queue (stats lists them)")


def _queue_stats(ctx: Context, name: str) -> tuple[int, QueueStats]:
    """The server time and the counts of one queue."""
    stats = ctx.broker.stats(name)
    [counts] = stats["queues"].values()
    return stats["time_ms"], counts


def _switch(ctx: Context, pause: bool) -> int:
    """Pause or resume the queue named, then say what changed and how the queue stands."""
    name = ctx.args.queue
    since_before = None if pause else _queue_stats(ctx, name)[1]["paused_since_ms"]
    changed = ctx.broker.pause(name) if pause else ctx.broker.resume(name)
    now, q = _queue_stats(ctx, name)
    since = q["paused_since_ms"]
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": name,
                "changed": changed,
                "paused": q["paused"],
                "paused_since_ms": since,
                "paused_since": iso(since),
                "ready": q["ready"],
                "in_flight": q["in_flight"],
                "consumers": q["consumers"],
                "time_ms": now,
                "time": iso(now),
            }
        )
        return EXIT_OK
    waiting = f"{q['in_flight']} in flight, {q['ready']} ready"
    if pause and changed:
        text = (
            f"paused {name!r}: no consumer takes another of its messages until it is resumed "
            f"(those in flight finish; sends and due messages queue up); {waiting}"
        )
    elif pause:
        paused_since = "" if since is None else f" since {iso(since, precise=False)} ({ago(since, now)})"
        text = f"{name!r} was already paused{paused_since}: nothing changed; {waiting}"
    elif changed:
        paused_for = "" if since_before is None else f" (paused for {span(now - since_before)})"
        text = f"resumed {name!r}{paused_for}: its consumers take its messages again within a second; {waiting}"
        if q["consumers"] == 0:
            text += f"; no consumer of {name!r} is running"
    else:
        text = f"{name!r} was not paused: nothing changed; {waiting}"
    ctx.out.line(text)
    return EXIT_OK


def cmd_pause(ctx: Context) -> int:
    return _switch(ctx, True)


def cmd_resume(ctx: Context) -> int:
    return _switch(ctx, False)


PAUSE = Command(
    "pause",
    "pause a queue fleet-wide: its consumers take none of its messages until resumed",
    cmd_pause,
    _queue_argument,
)

RESUME = Command(
    "resume",
    "resume a paused queue",
    cmd_resume,
    _queue_argument,
)


# -- running ----------------------------------------------------------------------------


def _one_or_all_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", nargs="?", metavar="QUEUE", help="only this queue (default: every known queue)")


#: The most characters of a progress note the ``running`` table shows (``--json`` has it whole).
NOTE_WIDTH = 60


def running_doc(entry: RunningMessage) -> dict[str, Any]:
    doc: dict[str, Any] = dict(entry)
    doc["fetched"] = iso(entry["fetched_ms"])
    doc["reported"] = iso(entry["reported_ms"])
    return doc


def percent(fraction: float | None) -> str:
    """A reported progress as a whole percentage, rounded down (99.9 % is not done), or "-"."""
    return "-" if fraction is None else f"{int(fraction * 100)}%"


def worker_text(entry: RunningMessage) -> str:
    """The worker process: ``host:pid``, else its consumer token or broker id."""
    if entry["host"] is not None and entry["pid"] is not None:
        return f"{entry['host']}:{entry['pid']}"
    return entry["consumer"] or entry["worker_id"]


def cmd_running(ctx: Context) -> int:
    name = ctx.args.queue
    entries = ctx.broker.running(name)
    now = server_now(ctx.broker)
    if ctx.json_mode:
        ctx.out.json(
            {
                "queue": name,
                "time_ms": now,
                "time": iso(now),
                "count": len(entries),
                "messages": [running_doc(entry) for entry in entries],
            }
        )
        return EXIT_OK
    where = f" on {name!r}" if name is not None else ""
    blocks: list[Block] = [Cell(f"Running{where}: {len(entries)} · server time {iso(now, precise=False)}", "bold")]
    if not entries:
        blocks.append(Cell(f"Nothing running{where}."))
        ctx.out.blocks(blocks)
        return EXIT_OK
    table = Table(
        ["message id", "actor", "queue", "worker", "fetched (UTC)", "age", "progress", "note"], numeric={5, 6}
    )
    for entry in entries:
        actor = entry["actor"]
        table.add(
            entry["message_id"],
            Cell(actor, "cyan") if actor is not None else Cell("(undecodable)", "red"),
            entry["queue"],
            worker_text(entry),
            iso(entry["fetched_ms"], precise=False) or "",
            span(entry["age_ms"]),
            percent(entry["progress"]),
            shorten(entry["note"], NOTE_WIDTH) if entry["note"] else "-",
        )
    blocks.append(table)
    ctx.out.blocks(blocks)
    return EXIT_OK


RUNNING = Command(
    "running",
    "messages in flight now, oldest first, with their worker, age and reported progress",
    cmd_running,
    _one_or_all_arguments,
)


# -- history ----------------------------------------------------------------------------


def _bounded(name: str, most: int) -> Callable[[str], int]:
    """An argparse type: a whole number of ``name`` from 1 to ``most``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number of {name}, got {text!r}") from None
        if not 1 <= value <= most:
            raise argparse.ArgumentTypeError(f"expected 1 to {most} {name}, got {value}")
        return value

    return parse


def _history_arguments(parser: argparse.ArgumentParser) -> None:
    _one_or_all_arguments(parser)
    parser.add_argument(
        "--minutes",
        type=_bounded("minutes", KEPT_MINUTES),
        default=60,
        metavar="N",
        help=f"per-minute counts of the last N minutes, the current one included (default 60; at most {KEPT_MINUTES})",
    )
    parser.add_argument(
        "--hours",
        type=_bounded("hours", KEPT_HOURS),
        default=24,
        metavar="N",
        help=f"per-hour counts of the last N hours, the current one included (default 24; at most {KEPT_HOURS})",
    )


def sparkline(values: list[int], width: int = SPARK_WIDTH) -> str:
    """``values`` as marks from ``▁`` (above zero) to ``█`` (the highest), ``·`` for zero;
    more than ``width`` values are summed in groups (the last group ends with the last
    value). See :func:`group_size`."""
    size = group_size(len(values), width)
    sums: list[int] = []
    end = len(values)
    while end > 0:
        sums.append(sum(values[max(0, end - size) : end]))
        end -= size
    sums.reverse()
    peak = max(sums, default=0)
    top = len(SPARK_MARKS)
    return "".join(ZERO if v <= 0 else SPARK_MARKS[min(top, (v * top + peak - 1) // peak) - 1] for v in sums)


def group_size(count: int, width: int = SPARK_WIDTH) -> int:
    """How many buckets one mark of a sparkline of ``count`` buckets sums."""
    return max(1, -(-count // width))


def _per(unit: str, count: int) -> str:
    size = group_size(count)
    return f"per {unit}" if size == 1 else f"per {size} {unit}s"


def _bucket_doc(bucket: Bucket) -> dict[str, Any]:
    doc: dict[str, Any] = dict(bucket)
    doc["start"] = iso(bucket["start_ms"])
    return doc


def history_doc(history: History, namespace: str, minutes: int, hours: int) -> dict[str, Any]:
    """:meth:`RedissonBroker.history` as ``history --json`` prints it: each bucket's start
    also as ISO 8601, and each queue's totals over both windows."""
    now = history["time_ms"]
    queues: dict[str, dict[str, Any]] = {}
    for name, q in history["queues"].items():
        queues[name] = {
            "minutes_total": totals(q["minutes"]),
            "hours_total": totals(q["hours"]),
            "minutes": [_bucket_doc(b) for b in q["minutes"]],
            "hours": [_bucket_doc(b) for b in q["hours"]],
        }
    return {
        "namespace": namespace,
        "time_ms": now,
        "time": iso(now),
        "minutes": minutes,
        "hours": hours,
        "queues": queues,
    }


def _counts(counts: Counts | Bucket) -> tuple[int, int, int]:
    """Processed, failed, retried (the order of :data:`SERIES`)."""
    return counts["processed"], counts["failed"], counts["retried"]


def _active(counts: Counts | Bucket) -> bool:
    return any(_counts(counts))


def queue_history_blocks(name: str, minutes: list[Bucket], hours: list[Bucket], now: int) -> list[Block]:
    """One queue's history: totals and a sparkline per series over both windows, then the
    minutes that had any activity."""
    minute_window, hour_window = span(len(minutes) * 60_000), span(len(hours) * 3_600_000)
    blocks: list[Block] = [Cell(name, "bold")]
    by_minute, by_hour = _counts(totals(minutes)), _counts(totals(hours))
    if not any(by_minute) and not any(by_hour):
        blocks.append(Cell(f"No activity in the last {hour_window}.", "dim"))
        return blocks
    series = Table(
        [
            "",
            f"last {minute_window}",
            f"last {hour_window}",
            f"{_per('minute', len(minutes))}, oldest → now",
            f"{_per('hour', len(hours))}, oldest → now",
        ],
        numeric={1, 2},
    )
    for i, (label, style) in enumerate(zip(SERIES, (None, "red", "yellow"), strict=True)):
        series.add(
            label,
            str(by_minute[i]),
            str(by_hour[i]),
            Cell(sparkline([_counts(b)[i] for b in minutes]), style),
            Cell(sparkline([_counts(b)[i] for b in hours]), style),
        )
    blocks += [series, Cell("")]
    active = [b for b in minutes if _active(b)]
    if not active:
        blocks.append(Cell(f"No activity in the last {minute_window}.", "dim"))
        return blocks
    current = minutes[-1]["start_ms"]
    table = Table(["minute (UTC)", "when", *SERIES], numeric={2, 3, 4})
    for b in active:
        start = b["start_ms"]
        table.add(
            iso(start, precise=False) or "",
            "this minute" if start == current else ago(start, now),
            str(b["processed"]),
            Cell(str(b["failed"]), "red" if b["failed"] else None),
            Cell(str(b["retried"]), "yellow" if b["retried"] else None),
        )
    blocks.append(table)
    return blocks


def history_blocks(history: History, namespace: str) -> list[Block]:
    now = history["time_ms"]
    blocks: list[Block] = [
        Cell(f"Activity history · server time {iso(now, precise=False)} · namespace {namespace!r}", "bold")
    ]
    if not history["queues"]:
        blocks.append(
            Cell(
                "No known queues: name one (history QUEUE), or give the app's broker import path to "
                "declare its queues; a queue also becomes known once a process of the app declares it, "
                "sends to it or consumes it."
            )
        )
        return blocks
    for name, q in history["queues"].items():
        blocks.append(Cell(""))
        blocks.extend(queue_history_blocks(name, q["minutes"], q["hours"], now))
    return blocks


def cmd_history(ctx: Context) -> int:
    args = ctx.args
    history = ctx.broker.history(args.queue, minutes=args.minutes, hours=args.hours)
    if ctx.json_mode:
        ctx.out.json(history_doc(history, ctx.broker.namespace, args.minutes, args.hours))
        return EXIT_OK
    ctx.out.blocks(history_blocks(history, ctx.broker.namespace))
    return EXIT_OK


HISTORY = Command(
    "history",
    "processed, failed and retried counts per minute and per hour",
    cmd_history,
    _history_arguments,
)
