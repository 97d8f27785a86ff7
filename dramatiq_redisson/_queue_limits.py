"""Concurrency limits per queue and per group, fleet-wide and live (flow control; see
docs/flow-control.md): ``broker.limits``.

The limits are stored with the queue on the server and read by every fetch (fetch.lua
through ``_flow.lua``): a queue at its limit hands out nothing more, and a group at its
limit waits off its ring while the other groups run. A message holds its slots from its
fetch to its ack or nack; a worker that dies gives them back when the liveness requeues
its messages.
"""

from __future__ import annotations

from typing import Any, Protocol, TypedDict, cast

from dramatiq.common import q_name

from ._keys import QueueKeys
from ._scripts import Scripts
from ._settings import is_int


class QueueLimits(TypedDict):
    """A queue's concurrency limits and what is in use now (:meth:`Limits.get`)."""

    #: At most this many of the queue's messages run at once, fleet-wide (None: no limit).
    concurrency: int | None
    #: At most this many messages of one ``group_key`` run at once (None: no limit).
    group_concurrency: int | None
    #: Messages of the queue holding a slot now (fetched through lanes and not yet acked).
    in_use: int
    #: Groups with messages holding a slot now.
    groups_in_use: int
    #: Lanes (a group at a priority) with ready messages held back by their group's limit.
    lanes_blocked: int


class LimitsHost(Protocol):
    """What :class:`Limits` reads of its broker."""

    client: Any
    redisson_scripts: Scripts

    def keys(self, queue_name: str) -> QueueKeys: ...

    def known_queues(self) -> list[str]: ...


#: The highest limit accepted (a Lua number holds it exactly; above it, say None).
MAX_LIMIT = 1_000_000_000


def _limit(name: str, value: int | None) -> int | None:
    if value is not None and (not is_int(value) or not 1 <= value <= MAX_LIMIT):
        raise ValueError(f"{name} must be an int from 1 to {MAX_LIMIT:,}, or None for no limit; got {value!r}")
    return value


def _info(reply: list[int], blocked: int) -> QueueLimits:
    concurrency, group, in_use, groups = reply[:4]
    return QueueLimits(
        concurrency=None if concurrency < 0 else concurrency,
        group_concurrency=None if group < 0 else group,
        in_use=max(0, in_use),
        groups_in_use=max(0, groups),
        lanes_blocked=max(0, blocked),
    )


class Limits:
    """``broker.limits``: set, read and clear a queue's concurrency limits."""

    def __init__(self, host: LimitsHost) -> None:
        self.host = host

    def set(
        self, queue_name: str, *, concurrency: int | None = None, group_concurrency: int | None = None
    ) -> QueueLimits:
        """Make ``queue_name``'s limits exactly these (None: no limit of that kind): at most
        ``concurrency`` of its messages run at once across every worker, and at most
        ``group_concurrency`` of each ``group_key``'s (1: a group's messages one at a time,
        in order). Live: workers pick a raised limit up at once, a lowered one at their
        next fetches (messages already running finish). The queue's messages go through
        lanes from now on (see docs/flow-control.md).

        Raises:
          ValueError: A limit that is not an int from 1 to :data:`MAX_LIMIT` or None, or
            ``queue_name`` is not a known queue (``known_queues()``; a typo would
            otherwise limit a queue nobody consumes). Nothing is written.
        """
        concurrency = _limit("concurrency", concurrency)
        group_concurrency = _limit("group_concurrency", group_concurrency)
        name = q_name(queue_name)
        known = self.host.known_queues()
        if name not in known:
            listed = ", ".join(known) if known else "none yet"
            raise ValueError(f"{name!r} is not a known queue (known: {listed}); nothing was written")
        keys = self.host.keys(name)
        reply = self.host.redisson_scripts.limits(keys, "set", concurrency, group_concurrency)
        return _info(reply, 0)

    def get(self, queue_name: str) -> QueueLimits:
        """``queue_name``'s limits and what is in use now (one read)."""
        keys = self.host.keys(q_name(queue_name))
        raw = cast(
            "list[bytes | None]",
            self.host.client.hmget(keys.flow, "concurrency", "group_concurrency", "inuse", "groups", "blocked"),
        )
        values = [int(v) if v is not None else None for v in raw]
        return QueueLimits(
            concurrency=values[0],
            group_concurrency=values[1],
            in_use=max(0, values[2] or 0),
            groups_in_use=max(0, values[3] or 0),
            lanes_blocked=max(0, values[4] or 0),
        )

    def clear(self, queue_name: str) -> QueueLimits:
        """Remove ``queue_name``'s limits: every message waiting for a slot may run. The
        queue's messages keep going through lanes (priorities and groups still apply)."""
        keys = self.host.keys(q_name(queue_name))
        return _info(self.host.redisson_scripts.limits(keys, "clear"), 0)
