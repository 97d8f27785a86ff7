"""Liveness: a killed worker process's messages run again elsewhere within seconds.

Dramatiq's heartbeat (``heartbeat_timeout``, 60 s by default, checked by maintenance every
30 s) makes the unacked messages of a process killed with ``kill -9`` wait up to about 90
s. Here two signals tell sooner that a process consuming a queue is gone:

- **Its connections close.** Each consumer stays subscribed to its own wake channel and
  lists itself in the queue's ``redisson_delay_queue_subscribers:{N}`` (consumer token ->
  worker id). A killed process's sockets are closed by its kernel, so the server drops
  its subscriptions at once. A worker all of whose listed consumers have had no
  subscription for :data:`CONNECTION_GRACE` ms is dead. This costs nothing while all is
  well: only the check below reads it.
- **Its beats stop.** A host that vanishes (power, network) closes nothing. Each process
  beats on the queue's ``redisson_delay_queue_alive:{N}`` (worker id -> last beat, server
  clock) from a thread of its own, every third of ``liveness_timeout`` (6 s by default:
  every 2 s); a worker more than ``liveness_timeout`` behind the newest beat, and still
  so with the same beat a beat interval later (:func:`confirm_behind`), is dead.

The consumer holding the queue's transfer lease checks both every :data:`CHECK_INTERVAL`
ms and puts back the ack sets of dead workers (reap.lua), waking idle consumers for them.

What can make a live process look dead, and what it costs: a consumer whose subscription
is down for :data:`CONNECTION_GRACE` (it re-subscribes at once after a lost connection,
within 50 ms of a restarted server's return), or a process whose beat thread cannot run
for ``liveness_timeout`` — stopped (SIGSTOP, a debugger) or held by an actor keeping the
GIL that long inside one C call. Its messages then run again elsewhere (at-least-once, as
after any redelivery) and it goes on. Dead is relative to the newest beat, not to the
server clock: when no process could beat (the server stopped or unreachable), nobody is
dead by its beats. ``liveness_timeout=0`` turns both off (Dramatiq's heartbeat alone).

A dead worker stays in the beat set for ``heartbeat_timeout``, and its consumers in the
subscriber list, so a message that lands in its ack set later (a fetch it sent before
dying, run by a server that was stopped) is put back by the next check. A process that
stops cleanly leaves both. Processes of an older release or of the built-in broker never
join them: their messages are recovered by the heartbeat, as before.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

import redis

from ._logs import CONNECTION_ERRORS, logger_for, outage_of, reason
from ._message import epoch_ms
from .connection._topology import numsub_counts

if TYPE_CHECKING:
    from ._keys import QueueKeys
    from ._settings import BrokerSettings
    from .connection._commands import Commands
    from .connection._topology import Topology
    from .scripts._calls import Scripts

#: Beats per ``liveness_timeout``: a process misses several beats before it looks dead.
BEATS_PER_TIMEOUT = 3

#: Least time (ms) between two checks of one queue by its lease holder.
CHECK_INTERVAL = 500

#: How long (ms) all the wake-channel subscriptions of a worker's consumers must be gone
#: before it is dead.
CONNECTION_GRACE = 2000

#: Seconds between tries while beats fail (at most the beat interval): once the server is
#: back, every live process beats again within this.
BEAT_RETRY = 0.5

#: Errors of a beat that the thread logs and outlives (the server away, full, refusing).
_BEAT_ERRORS = (redis.RedisError, OSError)

#: The beat errors that mean the server is away (reported by the process's Outage).
_AWAY_ERRORS = (*CONNECTION_ERRORS, OSError)


def confirm_behind(
    behind: list[str],
    entries: Iterable[tuple[bytes | str, float]],
    suspects: dict[str, tuple[float, int]],
    now_ms: int,
    confirm_ms: float,
) -> tuple[list[str], dict[str, tuple[float, int]]]:
    """Which of the workers found ``behind`` (see :func:`dead_workers`) are dead: those that
    were already behind, with the same last beat, ``confirm_ms`` (server ms) before
    ``now_ms``. ``suspects`` (worker -> its last beat, first seen behind) is the previous
    check's; returns the dead and the suspects for the next check.

    One look is not enough after the server stalled (SIGSTOP, ``DEBUG SLEEP``, a long
    fork): the first beat that runs when it is back is seconds ahead of every other,
    although each live process beats again within a fraction of an interval (its beat was
    waiting on its socket, or is retried every :data:`BEAT_RETRY` s)."""
    last = {(w.decode() if isinstance(w, bytes) else w): float(ms) for w, ms in entries}
    kept: dict[str, tuple[float, int]] = {}
    for worker in behind:
        beat_ms, since = suspects.get(worker, (None, now_ms))
        kept[worker] = (last[worker], since if beat_ms == last[worker] else now_ms)
    return [w for w, (_, since) in kept.items() if now_ms - since >= confirm_ms], kept


def dead_workers(entries: Iterable[tuple[bytes | str, float]], timeout_ms: int, *, own: str) -> list[str]:
    """The workers of a liveness set (``(worker id, last beat ms)``, as ZRANGE WITHSCORES
    gives them) whose last beat is more than ``timeout_ms`` older than the newest, but
    ``own``."""
    beats = [(w.decode() if isinstance(w, bytes) else w, float(ms)) for w, ms in entries]
    if not beats:
        return []
    newest = max(ms for _, ms in beats)
    return [w for w, ms in beats if newest - ms > timeout_ms and w != own]


class LivenessHost(Protocol):
    """What the liveness beats and a queue's reaper read of their broker."""

    broker_id: str
    client: Commands
    liveness: Liveness
    redisson_scripts: Scripts
    topology: Topology

    @property
    def settings(self) -> BrokerSettings: ...

    def keys(self, queue_name: str) -> QueueKeys: ...


class Liveness:
    """The liveness beats of one process (one broker): a daemon thread that beats for
    every queue a consumer of this process consumes, started by the first one."""

    def __init__(self, broker: LivenessHost, timeout_ms: int) -> None:
        self.broker = broker
        self.logger = logger_for(type(self))
        #: 0: liveness off.
        self.timeout_ms = timeout_ms
        self.interval = timeout_ms / BEATS_PER_TIMEOUT / 1000
        self._queues: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._away = False  # the failing beats met a server that is away
        self.counts = SubscriptionCounts(broker.topology)

    @property
    def enabled(self) -> bool:
        return self.timeout_ms > 0

    def join(self, queue_name: str) -> None:
        """A consumer of ``queue_name`` starts: beat for it now, and from the thread."""
        if not self.enabled:
            return
        with self._lock:
            self._queues[queue_name] += 1
            first = self._queues[queue_name] == 1
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="dramatiq-redisson-liveness", daemon=True)
                self._thread.start()
        if first:
            self._beat(queue_name)

    def leave(self, queue_name: str) -> None:
        """A consumer of ``queue_name`` stops; when it was the last, leave the queue's set
        (a clean stop is not a death)."""
        if not self.enabled:
            return
        with self._lock:
            if not self._queues[queue_name]:
                return
            self._queues[queue_name] -= 1
            if self._queues[queue_name]:
                return
            del self._queues[queue_name]
            if not self._queues:
                self._stop.set()
        try:
            self.broker.client.zrem(self.broker.keys(queue_name).alive, self.broker.broker_id)
        except _BEAT_ERRORS as e:
            self.logger.debug("Could not leave the liveness set of queue %r: %s", queue_name, e)

    def close(self) -> None:
        self._stop.set()

    def subscriptions(self, keys: QueueKeys, channels: list[str], fresh_s: float = 0.0) -> dict[str, int]:
        """Channel -> subscribers, as the server of ``keys`` counts them (PUBSUB NUMSUB; on
        a cluster SHARDNUMSUB on the node of the queue's slot). Counts taken on that server
        less than ``fresh_s`` ago serve again (see :class:`SubscriptionCounts`)."""
        return self.counts.get(keys.channel, channels, fresh_s)

    def subscribed(self, keys: QueueKeys, token: str) -> None:
        """Consumer ``token`` subscribed to its wake channel: list it (see the module)."""
        if self.enabled:
            try:
                self.broker.client.hset(keys.subscribers, token, self.broker.broker_id)
            except _BEAT_ERRORS as e:
                self.logger.debug("Could not list consumer %r in %r: %s", token, keys.subscribers, e)

    def unsubscribed(self, keys: QueueKeys, token: str) -> None:
        """Consumer ``token`` stops cleanly: take it off the list."""
        if self.enabled:
            try:
                self.broker.client.hdel(keys.subscribers, token)
            except _BEAT_ERRORS as e:
                self.logger.debug("Could not take consumer %r off %r: %s", token, keys.subscribers, e)

    def _run(self) -> None:
        while not self._stop.wait(min(self.interval, BEAT_RETRY) if self._failing else self.interval):
            with self._lock:
                queues = list(self._queues)
            ok = True
            for queue_name in queues:
                if self._stop.is_set() or sys.is_finalizing():
                    return
                ok = self._beat(queue_name) and ok
            if ok and self._failing:
                self._failing = False
                if self._away:  # the server was away: the process says it is back (see _logs)
                    self._away = False
                    outage_of(self.broker.client).reached()
                else:
                    self.logger.info("Liveness beats work again.")

    def _beat(self, queue_name: str) -> bool:
        """Beat for ``queue_name``; whether it worked. Never raises: the thread outlives any
        failure (while beats fail, it tries again every :data:`BEAT_RETRY` s)."""
        try:
            self.broker.redisson_scripts.beat(self.broker.keys(queue_name), self.broker.broker_id)
        except _AWAY_ERRORS as e:
            # The server is away: the process says so once, for every part (see _logs).
            self._failing = self._away = True
            outage_of(self.broker.client).failed(e)
            return False
        except _BEAT_ERRORS as e:
            if not self._failing:
                self._failing = True
                self.logger.warning("Liveness beat on queue %r failed (%s); retrying.", queue_name, reason(e))
            return False
        except Exception:
            # Not a server error: the broker closing under the thread, or a bug. Logged with
            # its traceback, once per failing spell, unless the process is going away.
            if self._stop.is_set() or sys.is_finalizing():
                return False
            if not self._failing:
                self._failing = True
                self.logger.exception("Liveness beat on queue %r failed; retrying.", queue_name)
            return False
        return True


class SubscriptionCounts:
    """The subscription checks of one process, one call per server: a check asks a server
    for the subscribers of every channel checked there lately (the last
    :data:`ASKED_FOR` s), so the checks of its other consumers on that server (the shards
    of a queue, the queues of a worker) find their counts taken less than their
    ``fresh_s`` ago and make no call of their own. A consumer's next check (a check
    interval later) never reuses the counts of its own last one: pass a ``fresh_s``
    below that interval."""

    #: Seconds a channel stays in a server's calls after it was last checked.
    ASKED_FOR = 5.0

    def __init__(self, topology: Topology, clock: Callable[[], float] = time.monotonic) -> None:
        self.topology = topology
        self.clock = clock
        self._lock = threading.Lock()
        #: server -> channel -> last checked (this clock)
        self._asked: dict[str, dict[str, float]] = {}
        #: server -> (taken at, channel -> subscribers)
        self._taken: dict[str, tuple[float, dict[str, int]]] = {}

    def get(self, key: str, channels: list[str], fresh_s: float) -> dict[str, int]:
        """Subscribers of ``channels`` on the server of ``key``'s slot."""
        server = self.topology.node_name(key)
        now = self.clock()
        with self._lock:
            asked = self._asked.setdefault(server, {})
            for channel in channels:
                asked[channel] = now
            taken = self._taken.get(server)
            if taken is not None and now - taken[0] < fresh_s and all(c in taken[1] for c in channels):
                return {channel: taken[1][channel] for channel in channels}
            for channel in [c for c, at in asked.items() if now - at > self.ASKED_FOR]:
                del asked[channel]
            wanted = list(asked)
        counts = self.topology.numsub(key, wanted)
        with self._lock:
            self._taken[server] = (now, counts)
        return {channel: counts.get(channel, 0) for channel in channels}


class Reaper:
    """One consumer's check of its queue's dead workers (run while it holds the lease).

    A consumer found without its subscription is marked in the subscriber list
    (``"<worker id> <since, epoch ms>"``, server clock), so that whichever consumer holds
    the lease next goes on counting the grace from the same moment."""

    def __init__(self, broker: LivenessHost, queue_name: str) -> None:
        self.broker = broker
        self.keys = broker.keys(queue_name)
        self.queue_name = queue_name
        self.logger = logger_for(type(self))
        self.next_check_at = 0.0
        #: The consumer whose transfer lease lapsed as this one took it over, and when it
        #: last renewed it (server epoch ms); for the next check only.
        self._lapsed: tuple[str, int] | None = None
        #: Workers found behind by their beats at the last check (see :func:`confirm_behind`).
        self._suspects: dict[str, tuple[float, int]] = {}
        #: The other workers' consumers listed at the last check (their subscriptions are
        #: counted in the next check's round trip).
        self._listed: list[str] = []

    def lapsed(self, token: str, *, renewed_ms: int) -> None:
        """This consumer took over the transfer lease of consumer ``token``, which stopped
        renewing it at ``renewed_ms``: check now. If its subscription is gone too, its
        grace counts from ``renewed_ms`` (a holder renews every third of a lease: one that
        neither renews nor listens is dead), so a killed lease holder's messages run again
        about one lease after the kill rather than a lease plus the grace."""
        self._lapsed = (token, renewed_ms)
        self.next_check_at = 0.0

    def check(self, now: float) -> int:
        """Put back the messages of the queue's dead workers, at most every
        :data:`CHECK_INTERVAL`; returns how many were put back."""
        liveness = self.broker.liveness
        if not liveness.enabled or now < self.next_check_at:
            return 0
        self.next_check_at = now + CHECK_INTERVAL / 1000
        own = self.broker.broker_id
        topology = self.broker.topology
        # On a cluster, through the node of the queue's slot (TIME has no key to route by).
        # The subscriptions of the consumers the last check found listed are counted in
        # the same round trip; those listed since, by a call of their own.
        expected = [self.keys.wake_channel(token) for token in self._listed]
        with topology.node(self.keys.channel).pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.subscribers)
            pipe.zrange(self.keys.alive, 0, -1, withscores=True)
            pipe.time()
            if expected:
                topology.numsub_in(pipe, expected)
            listed, entries, server_time, *counted = pipe.execute()
        counts = numsub_counts(counted[0]) if counted else {}
        now_ms = epoch_ms(server_time)
        consumers = {t.decode(): _listing(v.decode()) for t, v in listed.items()}
        by_beat, self._suspects = confirm_behind(
            dead_workers(entries, liveness.timeout_ms, own=own),
            entries,
            self._suspects,
            now_ms,
            confirm_ms=liveness.timeout_ms / BEATS_PER_TIMEOUT,
        )
        others = {t: c for t, c in consumers.items() if c[0] != own}
        self._listed = list(others)
        new = [self.keys.wake_channel(t) for t in others if self.keys.wake_channel(t) not in counts]
        if new:
            counts.update(self.broker.liveness.subscriptions(self.keys, new))
        lapsed, self._lapsed = self._lapsed, None
        by_connection = self._gone(now_ms, others, counts, lapsed)  # updates the marks in others
        by_beat = [w for w in by_beat if w not in by_connection]
        requeued = self._reap(by_beat, by_connection) if by_beat or by_connection else 0
        self._forget(others, now_ms)
        return requeued

    def _reap(self, by_beat: list[str], by_connection: list[str]) -> int:
        liveness = self.broker.liveness
        started = time.monotonic()
        requeued, found = self.broker.redisson_scripts.reap(
            self.keys,
            by_beat,
            by_connection,
            timeout_ms=liveness.timeout_ms,
            forget_ms=max(self.broker.settings.heartbeat_timeout, 2 * liveness.timeout_ms),
        )
        if requeued:
            self.logger.warning(
                "Requeued %d messages of %d dead worker(s) on queue %r (%s) in %.1f ms.",
                requeued,
                found,
                self.queue_name,
                ", ".join(
                    [f"{w}: connections closed" for w in by_connection]
                    + [f"{w}: no beat for liveness_timeout={liveness.timeout_ms} ms" for w in by_beat]
                ),
                (time.monotonic() - started) * 1000,
            )
        return requeued

    def _gone(
        self,
        now_ms: int,
        others: dict[str, tuple[str, int | None]],
        counts: dict[str, int],
        lapsed: tuple[str, int] | None = None,
    ) -> list[str]:
        """The workers all of whose listed consumers (``others``: token -> worker id, and
        since when it is marked without a subscription) have had no wake-channel
        subscription (``counts``: channel -> subscribers) for :data:`CONNECTION_GRACE`;
        marks and unmarks them on the way (the consumer whose lease ``lapsed`` is marked
        from its last renewal)."""
        marks: dict[str, str] = {}
        for token, (worker, since) in list(others.items()):
            subscribed = counts.get(self.keys.wake_channel(token), 0) > 0
            if subscribed and since is not None:
                marks[token] = worker
                others[token] = (worker, None)
            elif not subscribed and since is None:
                since = min(now_ms, lapsed[1]) if lapsed is not None and lapsed[0] == token else now_ms
                marks[token] = f"{worker} {since}"
                others[token] = (worker, since)
        if marks:
            self.broker.client.hset(self.keys.subscribers, mapping=cast("dict[Any, Any]", marks))
        tokens_of: dict[str, list[int | None]] = {}
        for worker, since in others.values():
            tokens_of.setdefault(worker, []).append(since)
        return [
            worker
            for worker, sinces in tokens_of.items()
            if all(since is not None and now_ms - since >= CONNECTION_GRACE for since in sinces)
        ]

    def _forget(self, others: dict[str, tuple[str, int | None]], now_ms: int) -> None:
        """Take off the list the consumers marked without a subscription for longer than
        the broker's ``heartbeat_timeout`` (until then, a message that lands in their
        worker's ack set is put back at each check)."""
        forget_ms = max(self.broker.settings.heartbeat_timeout, 2 * self.broker.liveness.timeout_ms)
        stale = [t for t, (_, since) in others.items() if since is not None and now_ms - since > forget_ms]
        if stale:
            self.broker.client.hdel(self.keys.subscribers, *stale)


def _listing(value: str) -> tuple[str, int | None]:
    """A subscriber list entry: the worker id, and since when (epoch ms) the consumer is
    marked without a subscription (None: not marked)."""
    worker, _, since = value.partition(" ")
    return worker, int(since) if since else None
