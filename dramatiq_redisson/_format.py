"""Formatting shared by the command line and the dashboard: a message's call and last error,
and the JSON documents both print; times and lengths of time as text are ``_times``'s,
re-exported here for them. A leaf: it imports nothing of the CLI or the dashboard."""

from __future__ import annotations

import json
from typing import Any

from dramatiq.message import Message

from ._times import ago as ago
from ._times import iso as iso
from ._times import parse_duration as parse_duration
from ._times import parse_time as parse_time
from ._times import span as span
from ._times import until as until
from .admin._stats import Stats

#: Widest the arguments column of a table gets before it is cut with "…".
ARGS_WIDTH = 60


def message_doc(message: Message[Any]) -> dict[str, Any]:
    """A message's fields, JSON-ready."""
    return {
        "message_id": message.message_id,
        "queue_name": message.queue_name,
        "actor_name": message.actor_name,
        "args": list(message.args),
        "kwargs": dict(message.kwargs),
        "options": dict(message.options),
        "message_timestamp": message.message_timestamp,
        "enqueued": iso(message.message_timestamp),
    }


def scheduled_doc(due_ms: int, message: Message[Any], now_ms: int) -> dict[str, Any]:
    """A scheduled message: its fields and its due time."""
    doc = message_doc(message)
    doc.update(due_ms=due_ms, due=iso(due_ms), due_in_ms=due_ms - now_ms)
    return doc


def dead_doc(died_ms: int, message: Message[Any], now_ms: int) -> dict[str, Any]:
    """A dead letter: its fields, its redis message id and its time of death."""
    doc = message_doc(message)
    doc.update(
        redis_message_id=message.options.get("redis_message_id"),
        died_ms=died_ms,
        died=iso(died_ms),
        died_ago_ms=now_ms - died_ms,
        error=last_error(message),
    )
    return doc


def stats_doc(stats: Stats, namespace: str) -> dict[str, Any]:
    """:meth:`RedissonBroker.stats` with ISO times and relative due times added."""
    now = stats["time_ms"]
    queues: dict[str, dict[str, Any]] = {}
    for name, counts in stats["queues"].items():
        entry: dict[str, Any] = dict(counts)
        due = counts["next_due_ms"]
        entry["next_due"] = iso(due)
        entry["next_due_in_ms"] = None if due is None else due - now
        entry["paused_since"] = iso(counts["paused_since_ms"])
        queues[name] = entry
    return {"namespace": namespace, "time_ms": now, "time": iso(now), "workers": stats["workers"], "queues": queues}


def last_error(message: Message[Any]) -> str | None:
    """The last line of the traceback Dramatiq's ``Retries`` stored, if any."""
    text = message.options.get("traceback")
    if not isinstance(text, str):
        return None
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else None


def call_text(message: Message[Any], width: int = ARGS_WIDTH) -> str:
    """A message's arguments as in a call, cut to ``width``: ``1, "x", tag="a"``."""

    def value(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False, default=str, separators=(",", ":"))

    parts = [value(a) for a in message.args] + [f"{k}={value(v)}" for k, v in message.kwargs.items()]
    return shorten(", ".join(parts), width)


def shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def one_line(error: BaseException | str) -> str:
    return " ".join(str(error).split()) or type(error).__name__
