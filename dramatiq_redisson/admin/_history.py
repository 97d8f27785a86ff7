"""The activity history of a queue: processed, failed and retried counts per minute and
per hour, kept on the server by the ack and nack scripts (layout:
``scripts/lua/include/record_history.lua``).

- processed: acked (ran to the end, or failed with an exception the actor ``throws``);
- failed: dead-lettered (nacked: out of retries, or undecodable);
- retried: acked after it failed and the Retries middleware scheduled a retry.

Minutes are kept for the last :data:`KEPT_MINUTES` (24 h), hours for the last
:data:`KEPT_HOURS` (30 days), in two fixed-size rings per queue: the memory is bounded
whatever the traffic (see :data:`MAX_BYTES`).
"""

from __future__ import annotations

import struct
from typing import Any, TypedDict

from .._settings import is_int

#: How many minutes and hours the rings hold (include/history_minute_at.lua and
#: history_hour_at.lua); a little more than kept.
RING_MINUTES = 1500
RING_HOURS = 744

#: The longest history that can be asked for: 24 h of minutes, 30 days of hours.
KEPT_MINUTES = 24 * 60
KEPT_HOURS = 30 * 24

#: The most memory the two rings of one queue take (string bytes, without the keys'
#: own overhead).
MAX_BYTES = 16 + 16 * RING_MINUTES + 16 * RING_HOURS

_SLOT = struct.Struct(">IIII")


class Counts(TypedDict):
    """Counts of one period."""

    processed: int
    failed: int
    retried: int


class Bucket(TypedDict):
    """One minute or hour of a queue's history."""

    #: When the minute (hour) starts, epoch ms, server clock.
    start_ms: int
    processed: int
    failed: int
    retried: int


class QueueHistory(TypedDict):
    """A queue's history, oldest bucket first; the current minute (hour) is the last one."""

    minutes: list[Bucket]
    hours: list[Bucket]


class History(TypedDict):
    """The history of a namespace's queues."""

    #: The server's clock when it was read (epoch ms).
    time_ms: int
    queues: dict[str, QueueHistory]


def check_window(minutes: Any, hours: Any) -> tuple[int, int]:
    """``minutes`` and ``hours`` as asked for a history read.

    Raises:
      ValueError: Either is not an int in 1..KEPT_MINUTES (1..KEPT_HOURS).
    """
    for name, value, most in (("minutes", minutes, KEPT_MINUTES), ("hours", hours, KEPT_HOURS)):
        if not is_int(value) or not 1 <= value <= most:
            raise ValueError(f"{name} must be an int from 1 to {most}, got {value!r}")
    return minutes, hours


def parse(reply: Any) -> tuple[int, QueueHistory]:
    """history.lua's reply as the server time and the queue's buckets (zeros where a slot
    belongs to another lap of the ring, or was never written)."""
    now_ms, minute_bytes, hour_bytes, pending, pending_slot = reply
    now_ms, pending = int(now_ms), int(pending)
    stamp, *pending_counts = _SLOT.unpack(pending_slot)
    if stamp != pending:
        pending, pending_counts = 0, [0, 0, 0]

    def buckets(data: bytes, last: int, width_ms: int, add_pending: bool) -> list[Bucket]:
        n = len(data) // _SLOT.size
        out: list[Bucket] = []
        for i, (stamp, processed, failed, retried) in enumerate(_SLOT.iter_unpack(data)):
            number = last - n + 1 + i
            if stamp != number:
                processed = failed = retried = 0
            if add_pending and pending and pending // 60 == number:
                processed += pending_counts[0]
                failed += pending_counts[1]
                retried += pending_counts[2]
            out.append(Bucket(start_ms=number * width_ms, processed=processed, failed=failed, retried=retried))
        return out

    minute = now_ms // 60_000
    return now_ms, QueueHistory(
        minutes=buckets(minute_bytes, minute, 60_000, False),
        hours=buckets(hour_bytes, minute // 60, 3_600_000, True),
    )


def totals(buckets: list[Bucket]) -> Counts:
    """The sum of ``buckets``."""
    return Counts(
        processed=sum(b["processed"] for b in buckets),
        failed=sum(b["failed"] for b in buckets),
        retried=sum(b["retried"] for b in buckets),
    )
