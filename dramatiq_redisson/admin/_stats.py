"""What :meth:`RedissonBroker.stats` returns: plain, JSON-ready dicts."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ._history import Counts

#: Default ``grace`` (ms) of :meth:`DelayedQueue.overdue`: a due message normally moves
#: within a few ms; one still scheduled a second after its due time is stuck.
OVERDUE_GRACE = 1000


class QueueStats(TypedDict):
    """One queue's counts, read in one atomic server step."""

    #: Messages waiting in the ready queue (in all its lanes when priorities or groups
    #: are used).
    ready: int
    #: Ready messages per priority, highest first, on a queue whose messages go through
    #: lanes (a ``broker_priority`` or ``group_key`` was sent to it); empty otherwise.
    ready_by_priority: dict[int, int]
    #: Lanes with ready messages: each (priority, group) pair counts once, and so do a
    #: priority's messages without a group (the plain ready list, priority 0 without a
    #: group, does not count), those held back by their group's limits included. 0 on a
    #: queue without lanes. Per-group counts: :meth:`RedissonBroker.waiting_groups`.
    lanes_waiting: int
    #: Messages fetched by workers and not yet acked (prefetched or running).
    in_flight: int
    #: Messages scheduled for later (delays and retry back-offs).
    scheduled: int
    #: Scheduled messages due more than the overdue grace ago: they should have moved.
    overdue: int
    #: The earliest due time (epoch ms, server clock), or None when nothing is scheduled.
    next_due_ms: int | None
    #: Dead-lettered messages.
    dead: int
    #: Consumers of the queue seen within three transfer leases.
    consumers: int
    #: The consumer token (``host:pid:broker-id:n``) of the transfer lease holder, or None.
    transfer_holder: str | None
    #: Messages still in the built-in broker's ``.DQ`` delay queue (not yet migrated).
    legacy_delayed: int
    #: Whether the queue is paused (:meth:`RedissonBroker.pause`), and since when (epoch
    #: ms, server clock) or None.
    paused: bool
    paused_since_ms: int | None
    #: How long the oldest ready message has waited (ms, server clock; 0 when none is
    #: ready): the queue latency that autoscalers read (KEDA, HPA; see docs/scaling.md).
    #: Exact for the dedupe window (120 s by default) after a message became ready; past
    #: it, timed from when the message was sent (its producer's clock), which for a
    #: delayed message counts its delay too.
    latency_ms: int
    #: Messages put back because the worker that got them had not declared their actor (a
    #: new actor while a rolling deploy's old processes still run), counted at each put-back
    #: since the queue's first (or its last flush): see :mod:`dramatiq_redisson._unknown_actors`.
    unknown_actor: int
    #: Processed, failed and retried messages in the last 60 minutes (the current one
    #: included), and in the last 24 hours (whole hours, the current one included).
    last_hour: Counts
    last_day: Counts
    #: A sharded queue's counts per shard (internal name -> its counts), beside the
    #: queue's sums above; absent for a queue without shards.
    shards: NotRequired[dict[str, QueueStats]]


class WaitingLane(TypedDict):
    """One lane with ready messages (:meth:`RedissonBroker.waiting_groups`)."""

    priority: int
    #: The ``group_key``, or None for the priority's messages without a group.
    group: str | None
    ready: int
    #: Held back by the group's concurrency limit until one of its messages ends, or by
    #: its rate limit until it may start another.
    blocked: bool
    #: Held back by its group's rate limit: when the group may start again (epoch ms,
    #: server clock); None otherwise.
    until_ms: int | None


class Stats(TypedDict):
    """Counts of a namespace's queues, and its live workers."""

    #: The server's clock when the counts were read (epoch ms).
    time_ms: int
    #: Worker processes whose heartbeat is within the broker's heartbeat timeout.
    workers: int
    queues: dict[str, QueueStats]
