"""``state``: where one message is, found by its message id (``broker.message_state``)."""

from __future__ import annotations

import argparse
from typing import Any

from .._format import ago, call_text, iso, last_error, message_doc
from ..admin._message_state import MessageState
from ._base import EXIT_NOT_FOUND, EXIT_OK, Command, Context
from ._live import percent
from ._output import Block, Cell, Output

#: What each state says, after the message id.
_SAYS = {
    "scheduled": "scheduled",
    "failed": "failed; a retry is scheduled",
    "ready": "ready, waiting for a worker",
    "running": "running",
    "done": "done",
    "dead": "dead (in the dead letters)",
    "unknown": "not found",
}

#: The times of a state, by field, in the order they are shown.
_TIMES = ("sent", "due", "started", "reported", "finished")

#: A state's colour in the table.
_STYLE = {"failed": "yellow", "dead": "red", "done": "green", "running": "cyan", "unknown": "dim"}


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("message_id", metavar="ID", help="the message id (send()'s message_id, the one in the logs)")
    parser.add_argument("--queue", "-q", metavar="QUEUE", help="look on this queue only (default: every known queue)")


def state_doc(found: MessageState) -> dict[str, Any]:
    """The JSON document of a message's state: its fields, each time also as ISO 8601, its
    last error, and the message itself (null when its data is not there)."""
    doc: dict[str, Any] = {name: value for name, value in found.items() if name != "message"}
    doc["time"] = iso(found["time_ms"])
    for name in _TIMES:
        doc[name] = iso(doc[f"{name}_ms"])
    message = found["message"]
    doc["error"] = last_error(message) if message is not None else None
    doc["message"] = message_doc(message) if message is not None else None
    return doc


def _when(ms: int, now: int) -> str:
    return f"{iso(ms, precise=False)} ({ago(ms, now)})"


def state_blocks(found: MessageState) -> list[Block]:
    """A message's state for people: a title, then one line per field that applies."""
    state, now = found["state"], found["time_ms"]
    where = f" on {found['queue']!r}" if found["queue"] else ""
    blocks: list[Block] = [Cell(f"Message {found['message_id']}{where}: {_SAYS[state]}", "bold")]
    fields: list[tuple[str, str]] = [("state", state)]
    if found["queue"]:
        fields.append(("queue", found["queue"]))
    message = found["message"]
    if message is not None:
        fields += [("actor", message.actor_name), ("arguments", call_text(message))]
    if found["retries"] is not None:
        fields.append(("retries", str(found["retries"])))
    for name in _TIMES:
        ms = found[f"{name}_ms"]  # type: ignore[literal-required]
        if ms is not None:
            fields.append((name, _when(ms, now)))
    if found["worker_id"]:
        host = f" ({found['host']}, pid {found['pid']})" if found["host"] else ""
        fields.append(("worker", f"{found['worker_id']}{host}"))
    if found["progress"] is not None:
        fields.append(("progress", percent(found["progress"]) + (f"  {found['note']}" if found["note"] else "")))
    error = last_error(message) if message is not None else None
    if error:
        fields.append(("last error", error))
    if found["redis_message_id"] and found["redis_message_id"] != found["message_id"]:
        fields.append(("redis id", found["redis_message_id"]))
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        style = _STYLE.get(state) if name == "state" else None
        blocks.append(Cell(f"  {name.ljust(width)}  {value}", style))
    if state == "unknown":
        blocks.append(Cell(_unknown_hint(found), "dim"))
    return blocks


def _unknown_hint(found: MessageState) -> str:
    hint = (
        "No queue holds it: never sent, cancelled, expired from the dead letters, or done (done messages "
        "are kept only with the broker's done_retention)."
    )
    if not found["complete"]:
        hint += " A search read only part of a long queue: it may wait deep inside one."
    return hint


def cmd_state(ctx: Context) -> int:
    found = ctx.broker.message_state(ctx.args.message_id, ctx.args.queue)
    if ctx.json_mode:
        ctx.out.json(state_doc(found))
    else:
        ctx.out.blocks(state_blocks(found))
    if found["state"] == "unknown":
        if ctx.json_mode:
            Output.note(f"not found: {found['message_id']}")
        return EXIT_NOT_FOUND
    return EXIT_OK


STATE = Command(
    "state",
    "where one message is, by its message id: scheduled, ready, running, done, failed, dead or unknown",
    cmd_state,
    _arguments,
)
