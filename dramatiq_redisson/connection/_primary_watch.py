"""Following a Sentinel switch within a second, on every connection of the process.

redis-py's ``master_for`` pool asks the sentinels for the primary only when it opens a
connection. The connections it already holds stay with the server they were opened to,
and nothing re-checks them. That is harmless when the old primary died: its connections
fail, and the new ones go to the new primary. It is not when the old primary is alive:
the sentinels took it for down (a stall longer than ``down-after-milliseconds``, a
partition, a loaded host) and promoted a replica, or they failed over a second time, back
to a restarted server. The old primary then goes on taking writes as a primary until the
sentinels turn it into a replica, about ten seconds later on Redis and Valkey, and its
conversion discards them: sends accepted on it are lost, and acks done on it are undone
(those messages run again). Seen in our Sentinel failover tests: 49 of 400 messages ran
twice after such a second failover.

:class:`PrimaryWatch` asks the sentinels once per :data:`CHECK_INTERVAL` from a daemon
thread (``SENTINEL MASTERS`` on the first sentinel that answers; nothing on the data
servers). When they name another primary, redis-py's pool drops its idle connections at
once and each busy one when it is handed back (``get_master_address`` and
``owns_connection``), so every call of the process goes to the new primary within about
that interval. A pub/sub connection stays where it is until the consumer's subscription
check moves it (see ``_transfer_duty``).

Only for a ``master_for`` client; a process that neither sends nor consumes starts no
thread (the first send or consumer starts it, again after a fork).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import redis
from dramatiq.logging import get_logger
from redis.sentinel import SentinelConnectionPool

#: Seconds between two questions to the sentinels.
CHECK_INTERVAL = 0.5


class PrimaryWatch:
    """Keeps the connections of ``client`` (a Sentinel ``master_for`` client) on the
    primary the sentinels name; for any other client, :meth:`start` does nothing."""

    def __init__(self, client: Any) -> None:
        # dramatiq_redisson.<class>, as _logs.logger_for names it (connection/ is below _logs).
        self.logger = get_logger("dramatiq_redisson", type(self))
        pool = getattr(client, "connection_pool", None)
        following = isinstance(pool, SentinelConnectionPool) and pool.is_master
        #: The pool to keep on the named primary (None: not a Sentinel client).
        self.pool: Any = pool if following else None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pid = 0
        self._closed = False

    def start(self) -> None:
        """Start the watch, once per process (cheap to call on every send)."""
        if self.pool is None or self._closed or self._pid == os.getpid():
            return
        with self._lock:
            if self._closed or self._pid == os.getpid():
                return
            self._pid = os.getpid()
            threading.Thread(target=self._run, name="dramatiq-redisson-primary-watch", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        self._stop.set()

    def check(self) -> None:
        """Ask the sentinels once; when they name another primary than before, the pool
        drops its connections to the old one (and this logs it)."""
        before = self.pool.master_address
        after = self.pool.get_master_address()
        if before is None or tuple(after) == tuple(before):
            return
        self.logger.warning(
            "The sentinels name a new primary for %r: %s:%s (was %s:%s); moving this process's connections there.",
            self.pool.service_name,
            after[0],
            after[1],
            before[0],
            before[1],
        )

    def _run(self) -> None:
        while not self._stop.wait(CHECK_INTERVAL):
            try:
                self.check()
            except (redis.RedisError, OSError) as e:
                # No sentinel answered (MasterNotFoundError during a failover, or the
                # sentinels unreachable): the calls themselves fail and retry meanwhile.
                self.logger.debug("Could not ask the sentinels for the primary: %s", e)
