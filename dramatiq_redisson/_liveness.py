"""Liveness: a killed worker process's messages run again elsewhere within seconds.

Dramatiq's heartbeat (``heartbeat_timeout``, 60 s by default, checked by maintenance every
30 s) makes the unacked messages of a process killed with ``kill -9`` wait up to about 90
s. Here each process that consumes a queue also beats on the queue's liveness set
(``redisson_delay_queue_alive:{N}``, worker id -> last beat, server clock) from a thread
of its own, every fifth of ``liveness_timeout`` (1.5 s by default: every 300 ms). The
consumer that holds the queue's transfer lease checks that set at each of its ticks (at
least every third of the lease) and puts back the ack set of every worker whose last beat
is more than ``liveness_timeout`` older than the newest beat (reap.lua), waking idle
consumers for them.

Why a thread, and what makes a live process look dead:

- The beats do not wait on actors: the thread runs between the actors' bytecodes (Python
  switches threads every 5 ms) and during their I/O. A process looks dead only when the
  thread cannot run for ``liveness_timeout``: the whole process stopped (SIGSTOP, a
  debugger) or an actor holding the GIL that long inside one C call. Its messages then
  run again elsewhere (at-least-once, as after any redelivery) and it goes on beating.
  Raise ``liveness_timeout`` for such workloads; ``liveness_timeout=0`` turns liveness off
  (Dramatiq's heartbeat alone, as before).
- Dead is relative to the newest beat of the queue's set, not to the server clock: after a
  server stop or outage no process could beat, every entry is equally old, and nobody is
  declared dead; the live ones beat again within a beat interval of the server's return.
- A dead worker stays in the set for ``heartbeat_timeout``, so a message that lands in its
  ack set later (a fetch it sent before dying, run by a server that was stopped) is put
  back by the next check instead of waiting for the heartbeat timeout.

A process that stops cleanly leaves the set (its consumers requeue what they held first).
Processes of an older version, or of the built-in broker, never join the set: their
messages are recovered by the heartbeat, as before.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

import redis
from dramatiq.logging import get_logger

if TYPE_CHECKING:
    from ._broker import RedissonBroker

#: Default ``liveness_timeout`` (ms).
DEFAULT_LIVENESS_TIMEOUT = 1500

#: Beats per ``liveness_timeout``: a process misses several beats before it looks dead.
BEATS_PER_TIMEOUT = 5

#: Least time (ms) between two checks of one queue by its lease holder.
MIN_CHECK_INTERVAL = 250

#: Errors of a beat that the thread logs and outlives (the server away, full, refusing).
_BEAT_ERRORS = (redis.RedisError, OSError)


def dead_workers(entries: Iterable[tuple[bytes | str, float]], timeout_ms: int, *, own: str) -> list[str]:
    """The workers of a liveness set (``(worker id, last beat ms)``, as ZRANGE WITHSCORES
    gives them) whose last beat is more than ``timeout_ms`` older than the newest, but
    ``own``."""
    beats = [(w.decode() if isinstance(w, bytes) else w, float(ms)) for w, ms in entries]
    if not beats:
        return []
    newest = max(ms for _, ms in beats)
    return [w for w, ms in beats if newest - ms > timeout_ms and w != own]


class Liveness:
    """The liveness beats of one process (one broker): a daemon thread that beats for
    every queue a consumer of this process consumes, started by the first one."""

    def __init__(self, broker: RedissonBroker, timeout_ms: int) -> None:
        self.broker = broker
        self.logger = get_logger(__name__, type(self))
        #: 0: liveness off.
        self.timeout_ms = timeout_ms
        self.interval = timeout_ms / BEATS_PER_TIMEOUT / 1000
        self._queues: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

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

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                queues = list(self._queues)
            for queue_name in queues:
                self._beat(queue_name)

    def _beat(self, queue_name: str) -> None:
        try:
            self.broker.redisson_scripts.beat(self.broker.keys(queue_name), self.broker.broker_id)
        except _BEAT_ERRORS as e:
            if not self._failing:
                self._failing = True
                self.logger.warning("Liveness beat on queue %r failed (%s); retrying.", queue_name, e)
            return
        if self._failing:
            self._failing = False
            self.logger.info("Liveness beats work again.")


class Reaper:
    """One consumer's check of its queue's liveness set (run while it holds the lease)."""

    def __init__(self, broker: RedissonBroker, queue_name: str) -> None:
        self.broker = broker
        self.keys = broker.keys(queue_name)
        self.queue_name = queue_name
        self.logger = get_logger(__name__, type(self))
        self.next_check_at = 0.0

    def check(self, now: float) -> int:
        """Put back the messages of the queue's dead workers, at most every
        :data:`MIN_CHECK_INTERVAL`; returns how many were put back."""
        liveness = self.broker.liveness
        if not liveness.enabled or now < self.next_check_at:
            return 0
        self.next_check_at = now + MIN_CHECK_INTERVAL / 1000
        entries = self.broker.client.zrange(self.keys.alive, 0, -1, withscores=True)
        dead = dead_workers(entries, liveness.timeout_ms, own=self.broker.broker_id)  # type: ignore[arg-type]
        if not dead:
            return 0
        started = time.monotonic()
        requeued, found = self.broker.redisson_scripts.reap(
            self.keys, dead, timeout_ms=liveness.timeout_ms, forget_ms=self.broker.heartbeat_timeout
        )
        if requeued:
            self.logger.warning(
                "Requeued %d messages of %d worker(s) on queue %r that stopped beating (liveness_timeout=%d ms) "
                "in %.1f ms.",
                requeued,
                found,
                self.queue_name,
                liveness.timeout_ms,
                (time.monotonic() - started) * 1000,
            )
        return requeued
