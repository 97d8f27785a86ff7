"""Every Redis key and channel name the broker uses, in one place.

For a queue ``Q`` in namespace ``ns`` the queue key is ``N = "ns:Q"``.

Ready-queue layout, shared with :class:`dramatiq.brokers.redis.RedisBroker`:

=====================================  ======  ==========================================
``ns:Q``                               LIST    redis message ids ready to run
``ns:Q.msgs``                          HASH    redis message id -> encoded message
``ns:__acks__.<worker id>.Q``          SET     fetched by a worker, not yet acked
``ns:__heartbeats__``                  ZSET    worker id -> last seen (epoch ms)
``ns:__queues__``                      SET     queues declared, sent to, consumed or limited (for
                                               the operators' tools; not in the built-in layout)
``ns:Q.XQ`` / ``ns:Q.XQ.msgs``         ZSET    dead letters (scored by time of death) / data
``ns:Q.DQ`` / ``ns:Q.DQ.msgs``         LIST    the built-in broker's delay queue (migrated)
=====================================  ======  ==========================================

Redisson delayed-queue layout (the ``{N}`` hash tag keeps them in one cluster slot):

=========================================  =======  =====================================
``redisson_delay_queue_timeout:{N}``       ZSET     member -> due time (epoch ms)
``redisson_delay_queue:{N}``               LIST     members in offer order (backup list)
``redisson_delay_queue_channel:{N}``       channel  due time (decimal ms) of a new head; "0": ready
``redisson_delay_queue_msgs:{N}``          HASH     message id -> sort key + payload (compact
                                                    with JSON: see ``lua/include/ready_body.lua``)
``redisson_delay_queue_compact:{N}``       LIST     backup list being rebuilt (compaction)
``redisson_delay_queue_cursor:{N}``        STRING   read position of a compaction pass, or
                                                    "-" (PX) until the next upkeep tick
``redisson_delay_queue_sent:{N}``          ZSET     redis message id -> enqueue time (epoch
                                                    ms) of recent immediate sends (dedupe)
``redisson_delay_queue_dedupe:{N}``        HASH     dedupe key -> id of the scheduled message
                                                    that holds it (``dedupe_key`` option)
``redisson_delay_queue_keyed:{N}``         HASH     message id -> "<ttl ms>:<dedupe key>", for
                                                    each scheduled message that holds a key
``redisson_delay_queue_holds:{N}``         ZSET     dedupe key -> end of its throttle window
                                                    (epoch ms; ``dedupe_ttl``), after its
                                                    message moved
``redisson_delay_queue_held:{N}``          HASH     throttle copies: dedupe key -> the encoded
                                                    message that moved, while its window lasts
``redisson_delay_queue_schedules:{N}``     HASH     schedule name -> its definition (JSON: actor,
                                                    spec, args, kwargs, catch-up policy,
                                                    anchor, version; see ``periodic/_schedules.py``)
``redisson_delay_queue_chains:{N}``        HASH     schedule name -> the member of its next tick,
                                                    scheduled in the ZSET (one per schedule)
``redisson_delay_queue_schedule_state:{N}``  HASH   "<name>|t": the next tick times after the
                                                    chained one (epoch ms, comma-separated);
                                                    "|r" the last tick run, "|l" how late it
                                                    moved (ms), "|s" the first tick not run
                                                    while the chain waits for a worker to
                                                    resume it, "|p" "1" while paused; its
                                                    policies (``lua/schedule.lua``): "|o"
                                                    overlap, "|u" the run last enqueued,
                                                    "|m" limit, "|n" runs, "|k" skipped,
                                                    "|d" dropped, "|e" ended, "|g" the
                                                    latest tick started
``redisson_delay_queue_paused:{N}``        STRING   while the queue is paused: when (epoch ms,
                                                    server clock); fetch.lua hands out nothing
``redisson_delay_queue_fetched:{N}``       HASH     redis message id -> "<fetch time, epoch
                                                    ms>|<worker id>|<consumer token>" of each
                                                    message in flight ("running now")
``redisson_delay_queue_done:{N}``          ZSET     message id -> when its ack finished it
                                                    (epoch ms, server clock): the done
                                                    records, written while ``done_retention``
                                                    is on (see ``lua/ack.lua``, ``lua/state.lua``)
``redisson_delay_queue_counts:{N}``        HASH     counters of rare events: "unknown_actor",
                                                    messages put back because the worker
                                                    that got them had not declared their
                                                    actor (``_unknown_actors.py``)
``redisson_delay_queue_progress:{N}``      HASH     message id -> "<fraction>|<epoch ms>|<note>":
                                                    the last progress a running message
                                                    reported (``progress.report``)
``redisson_delay_queue_checkpoints:{N}``   HASH     message id -> the JSON state a message
                                                    saved to resume from (``progress.checkpoint``);
                                                    both cleared when it succeeds or dies
``redisson_delay_queue_minutes:{N}``       STRING   activity history per minute: a ring of
                                                    u32 slots (see ``lua/include/record_history.lua``)
``redisson_delay_queue_hours:{N}``         STRING   activity history per hour: the same ring
``redisson_delay_queue_lease:{N}``         STRING   "<consumer token> <expiry, epoch ms>":
                                                    the consumer that runs transfers (PX)
``redisson_delay_queue_consumers:{N}``     ZSET     consumer token -> last seen (epoch ms)
``redisson_delay_queue_idle:{N}``          ZSET     consumer token -> messages it can start
                                                    now, for each consumer listening on its
                                                    wake channel (0: all its threads busy)
``redisson_delay_queue_alive:{N}``         ZSET     worker id -> its process's last liveness
                                                    beat (epoch ms, server clock), for each
                                                    process consuming the queue (see
                                                    ``_liveness.py``)
``redisson_delay_queue_subscribers:{N}``   HASH     consumer token -> worker id, for each
                                                    consumer subscribed to its wake channel
``redisson_delay_queue_channel:{N}``       channel  one consumer's wake-ups: "0" messages
``:wake:{<consumer token>}``                        are ready, "-1" take the transfer lease
=========================================  =======  =====================================

Fleet cost (see :mod:`dramatiq_redisson._consumer`): one consumer per queue holds the
transfer lease and alone runs the timer; the others check the lease when it would lapse.
A ready message wakes only as many idle consumers as it needs, through their own wake
channels. A wake channel keeps the queue's ``{N}`` hash tag first (same cluster slot)
and ends in ``}``, so the channel pattern of earlier ACL rules
(``redisson_delay_queue_channel:{ns:*}``) covers it.

Cluster layout (``RedissonBroker(cluster=True)`` or a ``RedisCluster`` client): every
key a script touches must hash to one slot, so every key of queue ``Q`` carries the
queue's hash tag ``{ns:Q}``, and worker heartbeats are kept per queue (Dramatiq's
built-in layout spans slots: its global heartbeat set and per-worker acks are touched
by one script, dramatiq#754). The delayed-queue keys above already carry the tag.

=========================================  ======  ======================================
``{ns:Q}``                                 LIST    redis message ids ready to run
``{ns:Q}.msgs``                            HASH    redis message id -> encoded message
``ns:__acks__.<worker id>.{ns:Q}``         SET     fetched by a worker, not yet acked
``ns:__heartbeats__.{ns:Q}``               ZSET    worker id -> last seen, per queue
``ns:__queues__``                          SET     as above (written outside scripts)
``{ns:Q}.XQ`` / ``{ns:Q}.XQ.msgs``         ZSET    dead letters / their data
``{ns:Q}.DQ`` / ``{ns:Q}.DQ.msgs``         LIST    unused (no built-in broker on Cluster)
=========================================  ======  ======================================

Channels are published with SPUBLISH and subscribed with SSUBSCRIBE (sharded pub/sub),
so a queue's channels live on the node that owns its slot.

A member is a 14-character sort key (offer time and a per-process counter, so that
equal due times keep offer order; earlier releases wrote 16: see ``_ids.py``) followed by
the message id. It doubles as the ``redis_message_id`` of the message once it moves to the
ready queue.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import cast

#: The lane of messages with neither a priority nor a group: the queue's ready list.
PLAIN_LANE = "0:"


def lane_id(priority: int, group: str | None) -> str:
    """The lane of a message: ``"<priority>:<group as hex>"`` (hex: a group name may hold
    any character, and a ``}`` would end the lane's part of its key)."""
    return f"{priority}:{(group or '').encode().hex()}"


def heartbeats_key(namespace: str) -> str:
    """Worker id -> last heartbeat (epoch ms) of every worker of ``namespace``."""
    return f"{namespace}:__heartbeats__"


def registry_key(namespace: str) -> str:
    """The set of queue names of ``namespace`` that a process declared, sent to, consumed
    or gave a limit."""
    return f"{namespace}:__queues__"


def check_cluster_name(kind: str, name: str) -> None:
    """Refuse a namespace or queue name that would break the cluster layout's hash tags.

    Raises:
      ValueError: ``name`` holds ``{`` or ``}``.
    """
    if "{" in name or "}" in name:
        raise ValueError(f"A {kind} on Redis Cluster cannot hold '{{' or '}}' (they delimit hash tags): {name!r}")


def acks_pattern(namespace: str, worker_id: str) -> str:
    """A SCAN pattern matching every ack set of one worker (either layout)."""
    return f"{namespace}:__acks__.{worker_id}.*"


def channels_pattern(namespace_glob: str) -> str:
    """A PSUBSCRIBE/ACL pattern matching the channel of every queue of a namespace (given
    as a glob, escaped by the caller)."""
    return f"redisson_delay_queue_channel:{{{namespace_glob}:*}}"


#: What the two layouts differ in (see the module), by ``QueueKeys.cluster``: the prefix
#: of the queue's own keys, the end of a worker's ack set of the queue, and what follows
#: the name of the namespace's heartbeat set; templates of the namespace ``ns``, the
#: queue ``q`` and the queue's hash tag ``tag`` (``{ns:Q}``).
_LAYOUTS: dict[bool, tuple[str, str, str]] = {
    False: ("{ns}:{q}", "{q}", ""),
    True: ("{tag}", "{tag}", ".{tag}"),
}


@dataclass(frozen=True)
class QueueKeys:
    """The names of every key that belongs to one queue; ``cluster``: the cluster layout."""

    namespace: str
    queue_name: str
    cluster: bool = False
    #: The prefix of the queue's own keys: ``ns:Q``, or its hash tag on a cluster.
    _base: str = field(init=False, repr=False, compare=False)
    _acks_end: str = field(init=False, repr=False, compare=False)
    _heartbeats_end: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        tag = f"{{{self.namespace}:{self.queue_name}}}"
        parts = (t.format(ns=self.namespace, q=self.queue_name, tag=tag) for t in _LAYOUTS[bool(self.cluster)])
        for name, value in zip(("_base", "_acks_end", "_heartbeats_end"), parts, strict=True):
            object.__setattr__(self, name, value)  # frozen: set once, here

    @property
    def name(self) -> str:
        return f"{self.namespace}:{self.queue_name}"

    @property
    def reaches_namespace(self) -> bool:
        """Whether the queue's scripts may touch the namespace's own keys (its registry,
        its heartbeat set): on one server; not in the cluster layout, where a script
        stays in the queue's slot and worker heartbeats are kept per queue."""
        return not self.cluster

    # Ready queue (built-in layout; every key tagged ``{ns:Q}`` on a cluster).
    @property
    def ready(self) -> str:
        return self._base

    @property
    def ready_msgs(self) -> str:
        return f"{self._base}.msgs"

    @property
    def xq(self) -> str:
        return f"{self._base}.XQ"

    @property
    def xq_msgs(self) -> str:
        return f"{self._base}.XQ.msgs"

    @property
    def legacy_dq(self) -> str:
        return f"{self._base}.DQ"

    @property
    def legacy_dq_msgs(self) -> str:
        return f"{self._base}.DQ.msgs"

    def acks(self, worker_id: str) -> str:
        return f"{self.namespace}:__acks__.{worker_id}.{self._acks_end}"

    def legacy_dq_acks(self, worker_id: str) -> str:
        return f"{self.acks(worker_id)}.DQ"

    @property
    def heartbeats(self) -> str:
        """Worker heartbeats: the namespace's set, or on a cluster the queue's own."""
        return f"{heartbeats_key(self.namespace)}{self._heartbeats_end}"

    @property
    def registry(self) -> str:
        """The names of the namespace's known queues (written by a process that declares a
        queue, a first send, each consumer's heartbeat and every limit write; read by
        :meth:`RedissonBroker.stats` and the CLI)."""
        return registry_key(self.namespace)

    # Redisson delayed queue.
    @property
    def timeout_zset(self) -> str:
        return f"redisson_delay_queue_timeout:{{{self.name}}}"

    @property
    def backup_list(self) -> str:
        return f"redisson_delay_queue:{{{self.name}}}"

    @property
    def channel(self) -> str:
        return f"redisson_delay_queue_channel:{{{self.name}}}"

    @property
    def payloads(self) -> str:
        return f"redisson_delay_queue_msgs:{{{self.name}}}"

    @property
    def compact_list(self) -> str:
        return f"redisson_delay_queue_compact:{{{self.name}}}"

    @property
    def compact_cursor(self) -> str:
        return f"redisson_delay_queue_cursor:{{{self.name}}}"

    @property
    def sent(self) -> str:
        """Redis message ids enqueued to the ready queue within the dedupe window."""
        return f"redisson_delay_queue_sent:{{{self.name}}}"

    @property
    def dedupe(self) -> str:
        """Dedupe key -> id of the scheduled message that holds it (see lua/include/dedupe_split.lua)."""
        return f"redisson_delay_queue_dedupe:{{{self.name}}}"

    @property
    def keyed(self) -> str:
        """Message id -> ``"<ttl ms>:<dedupe key>"`` for each scheduled message holding a key."""
        return f"redisson_delay_queue_keyed:{{{self.name}}}"

    @property
    def holds(self) -> str:
        """Dedupe key -> end of its throttle window (epoch ms), after its message moved."""
        return f"redisson_delay_queue_holds:{{{self.name}}}"

    @property
    def throttle_copies(self) -> str:
        """Dedupe key -> a copy of the encoded message that moved, while its throttle window
        lasts (returned to the sends it drops). The key's name on the server stays
        ``redisson_delay_queue_held``: deployed queues keep their data."""
        return f"redisson_delay_queue_held:{{{self.name}}}"

    @property
    def dedupe_keys(self) -> tuple[str, str, str, str]:
        """The dedupe-key index (lua/include/dedupe_split.lua); a script's KEYS come from its
        header (``script_keys``)."""
        return (self.dedupe, self.keyed, self.holds, self.throttle_copies)

    @property
    def schedules(self) -> str:
        """Schedule name -> its definition (JSON), for the queue's periodic actors."""
        return f"redisson_delay_queue_schedules:{{{self.name}}}"

    @property
    def chains(self) -> str:
        """Schedule name -> the member of its next tick (scheduled in :attr:`timeout_zset`)."""
        return f"redisson_delay_queue_chains:{{{self.name}}}"

    @property
    def schedule_state(self) -> str:
        """``<name>|t`` upcoming ticks, ``|r`` last run, ``|l`` its lateness, ``|s`` the
        first tick not run while the chain waits to be resumed, ``|p`` paused; the
        policies' fields ``|o``, ``|u``, ``|m``, ``|n``, ``|k``, ``|d``, ``|e``, ``|g``
        (see lua/schedule.lua's header)."""
        return f"redisson_delay_queue_schedule_state:{{{self.name}}}"

    @property
    def schedule_keys(self) -> tuple[str, str, str]:
        """The keys of the queue's schedules (definitions, chains, state)."""
        return (self.schedules, self.chains, self.schedule_state)

    @property
    def paused(self) -> str:
        """Set while the queue is paused (its value: since when, epoch ms, server clock)."""
        return f"redisson_delay_queue_paused:{{{self.name}}}"

    @property
    def fetched(self) -> str:
        """Redis message id -> ``"<fetch ms>|<worker id>|<consumer token>"`` of each message
        in flight, written by the fetch and deleted by its ack (running now)."""
        return f"redisson_delay_queue_fetched:{{{self.name}}}"

    @property
    def done(self) -> str:
        """Message id -> when its ack finished it (epoch ms, server clock), for messages
        processed within the broker's ``done_retention`` (written by ack.lua while it is on,
        read by state.lua: ``broker.message_state``)."""
        return f"redisson_delay_queue_done:{{{self.name}}}"

    @property
    def counts(self) -> str:
        """Counters of the queue's rare events, field -> count: ``unknown_actor``, the
        messages put back because the worker that got them had not declared their actor
        (written on that path alone, see ``_unknown_actors.py``; read by stats.lua)."""
        return f"redisson_delay_queue_counts:{{{self.name}}}"

    @property
    def progress(self) -> str:
        """Message id -> ``"<fraction>|<epoch ms>|<note>"``: the last progress each running
        message reported, written from Python (see ``_progress.py``)."""
        return f"redisson_delay_queue_progress:{{{self.name}}}"

    @property
    def checkpoints(self) -> str:
        """Message id -> the JSON state the message saved to resume from, written from
        Python (see ``_progress.py``)."""
        return f"redisson_delay_queue_checkpoints:{{{self.name}}}"

    @property
    def minutes(self) -> str:
        """The activity history's ring of per-minute counters (see lua/include/record_history.lua)."""
        return f"redisson_delay_queue_minutes:{{{self.name}}}"

    @property
    def hours(self) -> str:
        """The activity history's ring of per-hour counters (see lua/include/record_history.lua)."""
        return f"redisson_delay_queue_hours:{{{self.name}}}"

    @property
    def history_keys(self) -> tuple[str, str]:
        """The activity history's rings (minutes, hours)."""
        return (self.minutes, self.hours)

    @property
    def lease(self) -> str:
        """Who runs this queue's transfers (a short lease, renewed by every transfer)."""
        return f"redisson_delay_queue_lease:{{{self.name}}}"

    @property
    def consumers(self) -> str:
        """Consumers of this queue, by token, scored by when they last ran a transfer."""
        return f"redisson_delay_queue_consumers:{{{self.name}}}"

    @property
    def idle(self) -> str:
        """Consumers listening for ready messages, by token, scored by how many messages each
        can start now (its Worker's idle threads, within its free prefetch; 0: all busy)."""
        return f"redisson_delay_queue_idle:{{{self.name}}}"

    @property
    def alive(self) -> str:
        """Worker ids of the processes consuming this queue, scored by their last liveness
        beat; a process whose beats stop is dead and its messages run again elsewhere."""
        return f"redisson_delay_queue_alive:{{{self.name}}}"

    @property
    def subscribers(self) -> str:
        """Consumer token -> worker id of each consumer subscribed to its wake channel: a
        consumer whose subscription is gone for good (its process died, its connection
        closed) is dead, and its worker's messages run again elsewhere."""
        return f"redisson_delay_queue_subscribers:{{{self.name}}}"

    # Flow control (priorities, groups, limits; see lua/include/flow_context.lua and docs/flow-control-design.md).
    # A lane is the ready list of one (priority, group); lane (0, no group) is :attr:`ready`.

    @property
    def flow(self) -> str:
        """A HASH that exists while the queue's ready messages go through lanes (a
        priority, a group or a limit was used): the fetch then takes by priority and in
        turn over the groups. Fields: ``on``, and ``p<priority>``, the ids waiting in that
        priority's lanes but the plain one (lua/include/flow_context.lua keeps them)."""
        return f"redisson_delay_queue_flow:{{{self.name}}}"

    @property
    def levels(self) -> str:
        """The priorities whose ring holds a lane (member and score: the priority)."""
        return f"redisson_delay_queue_levels:{{{self.name}}}"

    @property
    def lane_prefix(self) -> str:
        """A lane's list is this prefix, the lane id and ``}`` (:meth:`lane`); the scripts
        build it the same way (a lane id never holds ``}``)."""
        return f"redisson_delay_queue_lane:{{{self.name}}}:{{"

    @property
    def ring_prefix(self) -> str:
        """A priority's ring (the lanes of that priority with messages, in turn) is this
        prefix, the priority and ``}``."""
        return f"redisson_delay_queue_ring:{{{self.name}}}:{{"

    @property
    def flow_flag(self) -> str:
        """A STRING that exists while the queue's messages go through lanes, beside the flow
        HASH: the hot scripts read it in the MGET of their other strings (fetch.lua with the
        pause, transfer.lua with its lease). The scripts build it from :attr:`lane_prefix`
        ("on" is no lane id: those are ``<priority>:<hex>``)."""
        return f"{self.lane_prefix}on}}"

    def lane(self, lane_id: str) -> str:
        """The list of lane ``lane_id`` (``"0:"`` is the ready list itself)."""
        return self.ready if lane_id == PLAIN_LANE else f"{self.lane_prefix}{lane_id}}}"

    def ring(self, priority: int) -> str:
        return f"{self.ring_prefix}{priority}}}"

    @property
    def lane_of(self) -> str:
        """Message id -> lane id, for messages not in the plain lane: kept from the send
        to the end of the run (a retry or a requeue goes back to its lane)."""
        return f"redisson_delay_queue_lane_of:{{{self.name}}}"

    @property
    def shards(self) -> str:
        """A sharded queue's layout (issue 36, ``sharding/_shards.py``): a HASH in the queue's own slot
        (its shard 0), "active" the suffixes of its shards, "retired" those being drained."""
        return f"redisson_delay_queue_shards:{{{self.name}}}"

    @property
    def rate_prefix(self) -> str:
        """Rate limits (``broker.limits``, lua/include/flow_context.lua): the start log of the queue is this
        prefix, ``q`` and ``}`` (:meth:`rate_log`), a group's ``g``, the group as hex and
        ``}``; the lanes waiting for their group's rate are the ZSET :attr:`deferred`. The
        scripts build them from this prefix, passed in ARGV."""
        return f"redisson_delay_queue_rate:{{{self.name}}}:{{"

    def rate_log(self, group: str | None = None) -> str:
        """A LIST of the start times (server clock, epoch ms, newest first) within the
        rate window: the queue's, or one group's (``group``: the group name; it expires a
        window after the group's last start). Never longer than the rate."""
        return f"{self.rate_prefix}{'q' if group is None else 'g' + group.encode().hex()}}}"

    @property
    def deferred(self) -> str:
        """Lane id -> when its group may start a message again (epoch ms, server clock): the
        lanes waiting off their rings for their group's rate limit."""
        return f"{self.rate_prefix}deferred}}"

    @property
    def flow_keys(self) -> tuple[str, str, str]:
        """The flow keys a pushing or fetching script takes (lua/include/flow_context.lua; the
        order of a script's KEYS is its header's, see ``script_keys``)."""
        return (self.flow, self.levels, self.lane_of)

    @property
    def flow_affixes(self) -> tuple[str, str]:
        """The lane and ring prefixes, passed in ARGV: they are not keys (the ACL rule's
        key patterns match the lanes and rings built from them, not the prefixes)."""
        return (self.lane_prefix, self.ring_prefix)

    @property
    def wake_prefix(self) -> str:
        """A consumer's wake channel is this prefix, its token and ``}``."""
        return f"{self.channel}:wake:{{"

    def wake_channel(self, token: str) -> str:
        """The channel on which one consumer (``token``) is woken; the scripts build it
        from :attr:`channel` the same way."""
        return f"{self.wake_prefix}{token}}}"

    def every_name(self, worker_id: str, token: str) -> tuple[str, ...]:
        """Every key and channel of the queue that its scripts touch (and the progress
        hashes, written from Python), with ``worker_id``'s ack sets and consumer
        ``token``'s wake channel (the namespace's registry aside): on a cluster all of
        them hash to the queue's slot."""
        return (
            self.ready,
            self.ready_msgs,
            self.acks(worker_id),
            self.heartbeats,
            self.xq,
            self.xq_msgs,
            self.legacy_dq,
            self.legacy_dq_msgs,
            self.legacy_dq_acks(worker_id),
            *self.scheduled_keys,
            self.holds,
            self.throttle_copies,
            self.sent,
            *self.schedule_keys,
            self.paused,
            self.fetched,
            self.done,
            self.counts,
            self.progress,
            self.checkpoints,
            *self.history_keys,
            self.lease,
            self.consumers,
            self.idle,
            self.alive,
            self.subscribers,
            *self.flow_keys,
            self.flow_flag,
            self.rate_log(),
            self.rate_log("g"),
            self.deferred,
            self.shards,
            self.channel,
            self.wake_channel(token),
        )

    @property
    def scheduled_keys(self) -> tuple[str, str, str, str, str, str, str, str]:
        """The keys that hold scheduled messages and their dedupe-key index: those clear.lua
        drops (throttle windows, :attr:`holds`, outlive a clear)."""
        return (
            self.timeout_zset,
            self.backup_list,
            self.payloads,
            self.compact_list,
            self.compact_cursor,
            self.dedupe,
            self.keyed,
            self.lane_of,
        )


# Each script's KEYS list: its one source is the script's header (``scripts/lua/<script>.lua``,
# the file the script runner loads), one line per key, ``-- KEYS[<n>]  <name>``, the name
# that of a QueueKeys attribute; the lists below are made from it, and the one-script tests'
# lists are checked against it (tests/scripts/test_key_lists.py).

#: A header line of one key: ``-- KEYS[<n>]  <name>[|<other name>...] [+<group>]``, or for a
#: tail repeated per worker ``-- KEYS[<n>..]  <name>[,<name>...]``.
_KEY_LINE = re.compile(r"-- KEYS\[(\d+)(\.\.)?\]\s+([a-z_]+(?:[|,][a-z_]+)*)(?:\s+\+([a-z_]+))?(?=\s|$)")

#: The groups of optional keys a call gives with the flow keys (``+lanes`` in the headers).
LANES = ("lanes",)


@dataclass(frozen=True)
class KeySlot:
    """One key of a script's KEYS list, as its header declares it.

    ``names``: the QueueKeys attribute that gives the key (alternatives after the first:
    another key the same slot may take, e.g. heartbeat.lua's ``heartbeats|alive``; for a
    tail, the keys of one worker, in order); ``group``: the optional group the key belongs
    to ("": always given; a call leaves out a group's keys together, and later keys move
    up); ``per_worker``: the tail, once per worker (the last slot)."""

    number: int
    names: tuple[str, ...]
    group: str = ""
    per_worker: bool = False


def parse_key_slots(header: str, script: str = "script") -> tuple[KeySlot, ...]:
    """The KEYS list a script's text declares in its header (its leading comment lines).

    Raises:
      ValueError: a ``-- KEYS`` line does not follow the grammar of ``_KEY_LINE``, the
        keys are not numbered 1, 2, ... in order, a tail is not last, or the header
        declares no KEYS and does not say ``-- KEYS none``.
    """
    slots: list[KeySlot] = []
    none = False
    for line in header.splitlines():
        if not line.startswith("--"):
            break
        if not line.startswith("-- KEYS"):
            continue
        if re.match(r"-- KEYS none\b", line):
            none = True
            continue
        match = _KEY_LINE.match(line)
        if match is None:
            raise ValueError(f"{script}.lua: a KEYS line that is not '-- KEYS[<n>]  <name> [+<group>]': {line!r}")
        number, tail, names, group = int(match[1]), bool(match[2]), match[3], match[4] or ""
        if number != len(slots) + 1 or (slots and slots[-1].per_worker):
            raise ValueError(f"{script}.lua: KEYS[{number}] is not key {len(slots) + 1}, or follows the tail: {line!r}")
        if ("," in names and not tail) or ("|" in names and tail) or (tail and group):
            raise ValueError(f"{script}.lua: ',' is for a tail, '|' and '+' for one key: {line!r}")
        slots.append(KeySlot(number, tuple(re.split(r"[|,]", names)), group, tail))
    if bool(slots) == none:
        raise ValueError(f"{script}.lua: its header must list its KEYS, or say '-- KEYS none'")
    return tuple(slots)


@functools.cache
def key_slots(script: str) -> tuple[KeySlot, ...]:
    """The KEYS list of ``scripts/lua/<script>.lua``, read from its header once."""
    lua = resources.files(__package__).joinpath("scripts").joinpath("lua")
    return parse_key_slots(lua.joinpath(f"{script}.lua").read_text(encoding="utf-8"), script)


def script_keys(
    script: str, keys: QueueKeys, worker_id: str = "", given: tuple[str, ...] = (), workers: Sequence[str] = ()
) -> tuple[str, ...]:
    """``script``'s KEYS for the queue of ``keys``, in its header's order: every key of no
    group and those of the groups in ``given`` (a slot's alternative named in ``given``
    takes its place), a worker's key (``acks``) of ``worker_id``, and the tail once per
    worker of ``workers``."""
    call_keys: list[str] = []
    for slot in key_slots(script):
        if slot.group and slot.group not in given:
            continue
        if slot.per_worker:
            call_keys.extend(_key(keys, name, worker) for worker in workers for name in slot.names)
        else:
            call_keys.append(_key(keys, next((n for n in slot.names[1:] if n in given), slot.names[0]), worker_id))
    return tuple(call_keys)


def _key(keys: QueueKeys, name: str, worker_id: str) -> str:
    value = getattr(keys, name)
    return value(worker_id) if callable(value) else cast(str, value)


# The built lists, kept per queue (and worker): a QueueKeys builds every name anew on each
# access. The scripts a consumer runs for each message have their own caches.

#: :func:`script_keys` without a tail, built once per queue, worker and groups.
keys_of = functools.lru_cache(maxsize=4096)(script_keys)


@functools.lru_cache(maxsize=1024)
def transfer_keys(keys: QueueKeys, worker_id: str) -> tuple[str, ...]:
    return script_keys("transfer", keys, worker_id, LANES)


@functools.lru_cache(maxsize=1024)
def fetch_keys(keys: QueueKeys, worker_id: str) -> tuple[str, ...]:
    return script_keys("fetch", keys, worker_id, LANES)


@functools.lru_cache(maxsize=1024)
def ack_keys(
    keys: QueueKeys, worker_id: str, uses_slots: bool, idle: bool = False, done: bool = False
) -> tuple[str, ...]:
    """ack.lua's KEYS; ``uses_slots``: the message was fetched through lanes and gives its
    slots back; ``idle``: the acking consumer's new score in the idle registry comes along;
    ``done``: a done record is written (``done_retention``)."""
    return script_keys("ack", keys, worker_id, ("slots",) * uses_slots + ("idle",) * idle + ("done",) * done)
