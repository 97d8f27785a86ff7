"""The read and admin side of a broker: :class:`QueueAdmin`.

Counts, the activity history, the messages running now, pause and resume, flushing a
queue and the list of known queues, in one object (as BullMQ's ``QueueGetters`` keeps a
queue's reads apart from its workers): the broker's public methods of the same names are
thin delegates. It reads only what :class:`AdminHost` names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import redis
from dramatiq.common import q_name
from redis.exceptions import RedisClusterException

from .._errors import UnsupportedServer
from .._keys import PLAIN_LANE, QueueKeys, heartbeats_key, registry_key
from .._logs import logger_for, reason
from .._message import epoch_ms
from .._queue_names import base_queue
from .._settings import BrokerSettings, is_int
from ..connection._commands import Commands
from ._history import Counts, History, QueueHistory, check_window, parse, totals
from ._running import RunningMessage, running
from ._stats import OVERDUE_GRACE, QueueStats, Stats, WaitingLane

if TYPE_CHECKING:
    from ..connection._topology import Topology
    from ..scripts._calls import Scripts

#: After a declaration could not list its queue in the registry (the server could not be
#: reached, as when an app is imported while it is down), the declarations that follow do
#: not try again for this long (seconds): each try may wait for a connection timeout.
RELIST_AFTER_S = 10.0

#: The history windows ``stats()`` reads with the counts (minutes, hours): each queue's
#: last 60 minutes and last 24 hours.
_STATS_HISTORY = (60, 24)


def _lanes(client: Any, keys: QueueKeys, limit: int | None) -> tuple[list[str], list[str], dict[str, int]]:
    """The lanes of a queue but the plain one: those in their rings (highest priority
    first, each ring in turn order; up to ``limit`` + 1 per ring, or all), and those waiting
    off their rings for their group's slot (the flow hash's ``b<group>`` fields) or rate
    (:attr:`QueueKeys.deferred`, the soonest to go first)."""
    priorities = [int(p) for p in reversed(cast("list[bytes]", client.zrange(keys.levels, 0, -1)))]
    with client.pipeline(transaction=False) as pipe:
        for priority in priorities:
            pipe.lrange(keys.ring(priority), 0, -1 if limit is None else limit)  # the plain lane may be one
        pipe.hgetall(keys.flow)
        pipe.zrange(keys.deferred, 0, -1 if limit is None else limit, withscores=True)
        *rings, flow, deferred = pipe.execute()
    in_turn = [lane.decode() for ring in rings for lane in ring if lane.decode() != PLAIN_LANE]
    blocked = [
        lane
        for field, value in cast("dict[bytes, bytes]", flow).items()
        if field.startswith(b"b") and field != b"blocked"
        for lane in value.decode().split()
    ]
    return in_turn, blocked, {lane.decode(): int(at) for lane, at in deferred}


def _waiting(plain: int, flow: list[Any]) -> tuple[dict[int, int], int]:
    """Ready messages per priority (highest first) and the lanes waiting, from stats.lua's
    tail (lanes held back by their group's limit, lanes in the rings, then pairs of
    priority and ids waiting in its lanes but the plain one); ``({}, 0)`` on a queue that
    does not use lanes. The plain lane (the ready list) counts at priority 0, and is not
    counted as a lane: it is in ring 0 while it holds ids."""
    if not flow:
        return {}, 0
    blocked, in_rings, counts = int(flow[0]), int(flow[1]), flow[2:]
    by_priority: dict[int, int] = {0: plain}
    for i in range(0, len(counts), 2):
        priority, waiting = int(counts[i]), int(counts[i + 1])
        by_priority[priority] = by_priority.get(priority, 0) + waiting
    lanes = blocked + in_rings
    return {p: n for p, n in sorted(by_priority.items(), reverse=True) if n}, max(0, lanes)


def _on(method: Callable[..., Any], *args: Any) -> Callable[[Any], Any]:
    """``method(*args, client=...)`` as one call of :meth:`Topology.each`."""
    return lambda client: method(*args, client=client)


class QueueShards(Protocol):
    """Which internal queues hold a queue's messages (the sharding package's router is
    one): what :class:`QueueAdmin` folds over."""

    def sharded(self, queue_name: str) -> bool:
        """Whether this broker spreads ``queue_name`` over shards (its ``shards`` setting)."""

    def consumed(self, queue_name: str) -> list[str]:
        """Every shard's internal name by this broker's layout, shard 0 first."""

    def stored_names(self, queue_name: str) -> list[str] | None:
        """Every shard's internal name by the stored layout, read only (``None``: none)."""


class AdminHost(Protocol):
    """What :class:`QueueAdmin` reads of its broker."""

    client: Commands
    topology: Topology
    namespace: str
    broker_id: str
    queues: Mapping[str, Any]
    redisson_scripts: Scripts

    @property
    def shard_router(self) -> QueueShards: ...

    @property
    def settings(self) -> BrokerSettings: ...

    def keys(self, queue_name: str) -> QueueKeys: ...

    def check_server(self) -> Any: ...


class QueueAdmin:
    """The read and admin side of one broker (see the module)."""

    def __init__(self, host: AdminHost) -> None:
        self.host = host
        self.logger = logger_for(type(self))
        #: Queues this process declared that the registry may not list yet (see :meth:`list_declared`).
        self._unlisted: set[str] = set()
        #: Until when (``time.monotonic()``) declarations do not try to list them.
        self._quiet_until = 0.0

    def list_declared(self, queue_name: str) -> None:
        """List a queue this process declares in the namespace's queue registry, so that
        every process of the namespace knows it (the command line, the dashboard, another
        process's limits) before anything is sent to it or consumes it. It is the
        ``SADD`` a send runs for its queue, run once per queue per process at the
        declaration (the broker's ``declare_queue``), never at a send.

        Declaring never fails because of the server: Dramatiq declares a queue when an
        actor is made, often while the app is imported, maybe while the server is down.
        A queue that cannot be listed then is kept, and the next declaration at least
        :data:`RELIST_AFTER_S` after the failed try lists it with every other one kept
        (so an import with the server down waits for one connection timeout at most, not
        one per queue). Its first send, its consumer's heartbeat and a limit set on it
        list it too.

        Raises:
          ValueError: On a cluster, a queue name that holds ``{`` or ``}`` (nothing is
            written).
        """
        keys = self.host.keys(queue_name)
        self._unlisted.add(keys.queue_name)
        if time.monotonic() < self._quiet_until:
            return
        names = sorted(self._unlisted)
        try:
            self.host.check_server()  # (once per broker) nothing is written to a server it refuses
            self.host.client.sadd(keys.registry, *names)
        except UnsupportedServer:
            self._quiet_until = float("inf")  # a send or a consumer says why, as it raises
            return
        except (redis.RedisError, RedisClusterException) as e:
            self._quiet_until = time.monotonic() + RELIST_AFTER_S
            self.logger.debug(
                "Could not list the declared queues %s in %r (%s); the next declaration after %s s tries again.",
                ", ".join(map(repr, names)),
                keys.registry,
                reason(e),
                RELIST_AFTER_S,
            )
            return
        self._unlisted.difference_update(names)

    def known_queues(self) -> list[str]:
        """The queues this broker declared and those any process of its namespace
        declared, sent to or consumed (the namespace's queue registry lists them: see
        ``list_declared``), sorted. A sharded queue is listed once, by its name (its
        shards' internal names are not queues)."""
        names = {base_queue(name) for name in self._registered()}
        names.update(q for q in self.host.queues if q_name(q) == q)  # not the .DQ/.XQ names
        return sorted(names)

    def known(self, queue_name: str, *, among: list[str] | None = None) -> str:
        """``queue_name`` as the broker names it (``q_name``: without a ``.DQ``/``.XQ``
        suffix) if it is a known queue (:meth:`known_queues`), else ValueError: the one check
        every operations call that names a queue makes first (stats, history, running,
        waiting_groups, pause, resume, limits, a delayed queue's or dead letters' handle),
        so that a misspelt name is refused instead of reading as an empty queue, and
        nothing is written to it. A queue this broker declared costs nothing; any other
        one a read of the queue registry (``among``: :meth:`known_queues` already read).

        Raises:
          ValueError: ``queue_name`` is not a string, or not a known queue; the message
            names it and lists the known queues.
        """
        name = q_name(queue_name) if isinstance(queue_name, str) else None
        if name is not None and among is None and name in self.host.queues and base_queue(name) == name:
            return name
        known = self.known_queues() if among is None else among
        if name is not None and name in known:
            return name
        listed = f"known: {', '.join(known)}" if known else "no queue is known yet"
        raise ValueError(
            f"unknown queue {queue_name!r}: not a known queue in namespace {self.host.namespace!r} ({listed}); "
            "a queue is known once declared, sent to or consumed. Nothing was done."
        )

    def _registered(self) -> set[str]:
        listed = cast("set[bytes]", self.host.client.smembers(registry_key(self.host.namespace)))
        return {name.decode() for name in listed}

    def internal_names(self, queue_names: list[str]) -> dict[str, list[str]]:
        """Each of ``queue_names`` with the internal queues that hold its messages: a
        sharded queue's shards (its own name first: shard 0), as this broker's layout names
        them, or (a broker without the queue in its ``shards``: the CLI's, the dashboard's)
        as the stored layout does when the registry lists shards of it; any other queue,
        itself. (The registry may still list a shard dropped from the layout, written by a
        process that stopped before it read the layout again: the layout decides.)"""
        registered = self._registered()
        return {name: self._shards(name, registered) for name in queue_names}

    def _shards(self, name: str, registered: set[str]) -> list[str]:
        """The internal queues of ``name`` (see :meth:`internal_names`): the one list every
        read and operation of the queue folds over."""
        router = self.host.shard_router
        if router.sharded(name):
            return router.consumed(name)
        listed = sorted(i for i in registered if i != name and base_queue(i) == name)
        stored = router.stored_names(name) if listed else None
        return stored if stored is not None else [name, *listed]

    def stats(self, queue_name: str | None = None, *, overdue_grace: int = OVERDUE_GRACE) -> Stats:
        """Counts of one queue, or of every known queue (:meth:`known_queues`): ready, in
        flight, scheduled, overdue (due more than ``overdue_grace`` ms ago and not yet
        moved), next due time, dead, live consumers and the transfer lease holder; plus
        the namespace's live workers. Each queue's counts are one atomic read on the
        server clock, O(log n); all queues go in one round trip.

        Raises:
          ValueError: A negative ``overdue_grace``, or ``queue_name`` is not a known queue
            (:meth:`known`).
        """
        if not is_int(overdue_grace) or overdue_grace < 0:
            raise ValueError(f"overdue_grace must be a non-negative int of ms, got {overdue_grace!r}")
        known = self.known_queues()
        bases = [self.known(queue_name, among=known)] if queue_name is not None else known
        every = self.internal_names(known)  # the known queues' shards: one registry read
        shards_of = {base: every[base] for base in bases}
        names = [internal for base in bases for internal in shards_of[base]]
        settings = self.host.settings
        live_ms = 3 * settings.transfer_lease
        scripts = self.host.redisson_scripts
        all_keys = [self.host.keys(name) for name in names]
        # Each queue's counts and its history's last hour and day, and the server's
        # clock: one round trip on one server; on a cluster a call per queue, each on
        # the node of its slot.
        out = self.host.topology.each(
            [
                *(_on(scripts.stats, keys, overdue_grace, live_ms) for keys in all_keys),
                *(_on(scripts.history, keys, *_STATS_HISTORY) for keys in all_keys),
                self._time,
            ]
        )
        now_ms = epoch_ms(out.pop())
        replies = out[: len(names)]
        histories = {name: parse(reply)[1] for name, reply in zip(names, out[len(names) :], strict=True)}
        # Live workers: over the heartbeat sets of every known queue (one set per
        # namespace on one server, one per queue on a cluster).
        beat_keys = sorted(
            {self.host.keys(name).heartbeats for shards in every.values() for name in shards}
            or {heartbeats_key(self.host.namespace)}
        )
        with self.host.client.pipeline(transaction=False) as pipe:
            for key in beat_keys:
                pipe.zrangebyscore(key, now_ms - settings.heartbeat_timeout, "+inf")
            beats = cast("list[list[bytes]]", pipe.execute())
        workers = len(set().union(*beats))
        queues: dict[str, QueueStats] = {}
        for name, reply in zip(names, replies, strict=True):
            _, plain, with_data, scheduled, overdue, next_due, dead, holder, consumers, legacy, paused = reply[:11]
            latency, unknown_actor = reply[11:13]
            by_priority, lanes = _waiting(int(plain), reply[13:])
            ready = sum(by_priority.values()) if by_priority else int(plain)
            history = histories[name]
            queues[name] = QueueStats(
                ready=ready,
                ready_by_priority=by_priority,
                lanes_waiting=lanes,
                in_flight=max(0, int(with_data) - ready),
                scheduled=int(scheduled),
                overdue=int(overdue),
                next_due_ms=None if int(next_due) < 0 else int(next_due),
                dead=int(dead),
                consumers=int(consumers),
                transfer_holder=holder.decode() or None,
                legacy_delayed=int(legacy),
                paused=int(paused) >= 0,
                paused_since_ms=int(paused) if int(paused) > 0 else None,
                latency_ms=int(latency),
                unknown_actor=int(unknown_actor),
                last_hour=totals(history["minutes"]),
                last_day=totals(history["hours"]),
            )
        folded = {base: _fold([queues[name] for name in shards_of[base]]) for base in bases}
        for base in bases:
            if len(shards_of[base]) > 1:
                folded[base]["shards"] = {name: queues[name] for name in shards_of[base]}
        return Stats(time_ms=now_ms, workers=workers, queues=folded)

    def _queue_names(self, queue_name: str | None) -> list[str]:
        return [self.known(queue_name)] if queue_name is not None else self.known_queues()

    def _histories(self, names: list[str], minutes: int, hours: int) -> tuple[int | None, dict[str, QueueHistory]]:
        """The history of each of ``names`` (one round trip on a single server), and the
        server time the first was read at (None without names)."""
        scripts = self.host.redisson_scripts
        replies = self.host.topology.each(
            [_on(scripts.history, self.host.keys(name), minutes, hours) for name in names]
        )
        parsed = [parse(reply) for reply in replies]
        return (parsed[0][0] if parsed else None), {
            name: history for name, (_, history) in zip(names, parsed, strict=True)
        }

    def history(self, queue_name: str | None = None, *, minutes: int = 60, hours: int = 24) -> History:
        """The activity history of one queue, or of every known queue: processed, failed
        (dead-lettered) and retried messages per minute for the last ``minutes`` (at most
        1 440: 24 h) and per hour for the last ``hours`` (at most 720: 30 days), oldest
        first, the current minute (hour) last. Counted by the ack and nack scripts on the
        server clock (see :mod:`dramatiq_redisson.admin._history`).

        Raises:
          ValueError: ``minutes`` or ``hours`` out of range, or ``queue_name`` is not a
            known queue (:meth:`known`).
        """
        minutes, hours = check_window(minutes, hours)
        shards_of = self.internal_names(self._queue_names(queue_name))
        names = [internal for shards in shards_of.values() for internal in shards]
        read_at, per_shard = self._histories(names, minutes, hours)
        histories = {base: _sum_histories([per_shard[n] for n in shards]) for base, shards in shards_of.items()}
        # The time the buckets were cut at (the current minute is the last one).
        return History(time_ms=read_at if read_at is not None else self.server_ms(), queues=histories)

    def running(self, queue_name: str | None = None) -> list[RunningMessage]:
        """The messages in flight on one queue, or on every known queue, oldest fetch
        first: message id, actor, worker (id, host, pid) and when it was fetched (server
        clock) and how long ago. A message waiting in a worker's prefetch counts too (see
        :mod:`dramatiq_redisson.admin._running`).

        Raises:
          ValueError: ``queue_name`` is not a known queue (:meth:`known`).
        """
        shards_of = self.internal_names(self._queue_names(queue_name))
        names = [internal for shards in shards_of.values() for internal in shards]
        found = running(self.host.client, self.host.keys, names)
        for message in found:
            message["queue"] = base_queue(message["queue"])
        return found

    def waiting_groups(self, queue_name: str, *, limit: int = 100) -> list[WaitingLane]:
        """The lanes of ``queue_name`` with ready messages (priorities and groups; see
        ``ready_by_priority`` in :meth:`stats`), highest priority first and, within one
        priority, in the order the fetch takes them, then those waiting for their group's
        slot or rate (``blocked``, see :attr:`RedissonBroker.limits`; ``until_ms``: when a
        group over its rate may start again, server clock): up to ``limit`` entries of
        priority, group (None for a priority's messages without a group), ready messages,
        blocked and until_ms. The plain lane (priority 0 without a group) is left out: its
        count is the rest of ``ready``. Three round trips, and a command per lane listed.

        Raises:
          ValueError: ``limit`` is not a positive int, or ``queue_name`` is not a known
            queue (:meth:`known`).
        """
        if not is_int(limit) or limit <= 0:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        keys = self.host.keys(self.known(queue_name))
        client = self.host.client
        in_turn, blocked, deferred = _lanes(client, keys, limit)
        listed = [(lane, False) for lane in in_turn] + [(lane, True) for lane in [*blocked, *deferred]]
        listed = sorted(listed, key=lambda item: -int(item[0].partition(":")[0]))[:limit]  # stable: turn order kept
        with client.pipeline(transaction=False) as pipe:
            for lane, _ in listed:
                pipe.llen(keys.lane(lane))
            counts = cast("list[int]", pipe.execute())
        out: list[WaitingLane] = []
        for (lane, held_back), count in zip(listed, counts, strict=True):
            level, _, group = lane.partition(":")
            if count:
                name = bytes.fromhex(group).decode() if group else None
                out.append(
                    WaitingLane(
                        priority=int(level), group=name, ready=count, blocked=held_back, until_ms=deferred.get(lane)
                    )
                )
        return out

    def pause(self, queue_name: str) -> bool:
        """Pause ``queue_name`` fleet-wide: within a second no consumer of it starts another
        message (those in flight finish); due delayed messages still move to the ready
        queue, and sends are accepted. The state is kept in Redis: it survives worker
        restarts. Returns False if the queue was paused already.

        Raises:
          ValueError: ``queue_name`` is not a known queue (:meth:`known`).
        """
        return self._pause(queue_name, "pause")

    def resume(self, queue_name: str) -> bool:
        """Resume a paused queue: consumers start its messages again within a second.
        Returns False if the queue was not paused.

        Raises:
          ValueError: ``queue_name`` is not a known queue (:meth:`known`).
        """
        return self._pause(queue_name, "resume")

    def _pause(self, queue_name: str, op: str) -> bool:
        """``op`` every shard of the queue; whether any changed."""
        name = self.known(queue_name)
        scripts = self.host.redisson_scripts
        return any([scripts.pause(self.host.keys(shard), op)[0] for shard in self.internal_names([name])[name]])

    def server_ms(self) -> int:
        """The server's clock (on a cluster, any node's), epoch ms."""
        return epoch_ms(cast("tuple[int, int]", self._time(None)))

    def _time(self, client: Any) -> Any:
        """TIME on ``client`` (a pipeline of :meth:`Topology.each`), or on the broker's."""
        return (client or self.host.client).time()

    def flush(self, queue_name: str) -> None:
        """Drop all messages of a queue: ready, scheduled, dead-lettered and legacy ``.DQ``,
        with its pause, fetch records and activity history; the queue leaves the
        namespace's queue registry (its next send or consumer lists it again)."""
        keys = self.host.keys(queue_name)
        # One UNLINK drops every key of the queue at once; the registry (on a cluster in
        # another slot) goes first, by a command of its own. No MULTI: on a full server
        # Redis before 7.4 and Valkey 7.2 refuse commands queued in one, and a flush is
        # how memory is freed.
        self.host.client.srem(keys.registry, keys.queue_name)
        client = self.host.client
        # Lanes (flow control): each ring names its lanes with ids, the flow hash those
        # waiting for their group's slot, the deferred ZSET those waiting for its rate;
        # the plain lane is the ready list (unlinked below).
        rings = [keys.ring(int(p)) for p in client.zrange(keys.levels, 0, -1)]
        in_turn, blocked, deferred = _lanes(client, keys, None)
        laned = [keys.lane(lane) for lane in {*in_turn, *blocked, *deferred}]
        if rings or laned:
            client.unlink(*rings, *laned)
        client.unlink(
            keys.flow,
            keys.flow_flag,
            keys.deferred,
            keys.rate_log(),  # (a group's start log expires a rate window after its last start)
            keys.shards,
            keys.levels,
            keys.ready,
            keys.ready_msgs,
            keys.acks(self.host.broker_id),
            keys.xq,
            keys.xq_msgs,
            keys.legacy_dq,
            keys.legacy_dq_msgs,
            keys.legacy_dq_acks(self.host.broker_id),
            keys.sent,
            *keys.scheduled_keys,
            keys.holds,
            keys.throttle_copies,
            *keys.schedule_keys,
            keys.paused,
            keys.fetched,
            keys.done,
            keys.counts,
            keys.progress,
            keys.checkpoints,
            *keys.history_keys,
        )


def _fold(shards: list[QueueStats]) -> QueueStats:
    """One queue's counts from its shards' (a queue without shards: its own)."""
    if len(shards) == 1:
        return shards[0]
    first = shards[0]
    by_priority: dict[int, int] = {}
    for shard in shards:
        for priority, count in shard["ready_by_priority"].items():
            by_priority[priority] = by_priority.get(priority, 0) + count
    dues = [s["next_due_ms"] for s in shards if s["next_due_ms"] is not None]
    paused_since = [s["paused_since_ms"] for s in shards if s["paused_since_ms"] is not None]

    def total(field: str) -> int:
        return sum(int(s[field]) for s in shards)  # type: ignore[literal-required, misc]

    def counts(field: str) -> Counts:
        return Counts(
            processed=sum(s[field]["processed"] for s in shards),  # type: ignore[literal-required]
            failed=sum(s[field]["failed"] for s in shards),  # type: ignore[literal-required]
            retried=sum(s[field]["retried"] for s in shards),  # type: ignore[literal-required]
        )

    return QueueStats(
        ready=total("ready"),
        ready_by_priority=dict(sorted(by_priority.items(), reverse=True)),
        lanes_waiting=total("lanes_waiting"),
        in_flight=total("in_flight"),
        scheduled=total("scheduled"),
        overdue=total("overdue"),
        next_due_ms=min(dues) if dues else None,
        dead=total("dead"),
        consumers=max(s["consumers"] for s in shards),
        transfer_holder=first["transfer_holder"],
        legacy_delayed=total("legacy_delayed"),
        paused=all(s["paused"] for s in shards),
        paused_since_ms=min(paused_since) if paused_since else None,
        latency_ms=max(s["latency_ms"] for s in shards),
        unknown_actor=total("unknown_actor"),
        last_hour=counts("last_hour"),
        last_day=counts("last_day"),
    )


def _sum_histories(histories: list[QueueHistory]) -> QueueHistory:
    """One queue's history from its shards' (the same buckets in each)."""
    if len(histories) == 1:
        return histories[0]

    def merged(kind: str) -> list[Any]:
        out: list[Any] = []
        for buckets in zip(*(h[kind] for h in histories), strict=False):  # type: ignore[literal-required]
            bucket = dict(buckets[0])
            for other in buckets[1:]:
                for field in ("processed", "failed", "retried"):
                    bucket[field] += other[field]
            out.append(bucket)
        return out

    return QueueHistory(minutes=merged("minutes"), hours=merged("hours"))
