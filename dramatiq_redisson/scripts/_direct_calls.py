"""Script calls on the client's connections without redis-py's per-command layers.

Every command a :class:`redis.Redis` client runs passes through its connection pool's
checkout and release, a deprecation-argument check, an event dispatch and its
observability hooks before and after the round trip. Measured here (redis-py 8.1,
hiredis): a script call costs ~86 µs of client CPU that way, ~30 µs sent and read on a
connection directly. The broker's hot calls (transfer, fetch, ack, offer) hold the GIL
of the process that runs the actors for that long per message, so :class:`DirectCalls`
keeps a few connections of its own, made by the client's pool (same address, options,
credentials, Sentinel master lookup) and kept apart from it, and runs the scripts on
them with the same automatic retry the client would apply (the connection's
``Retry``: what is retried, how often, and the back-off are the client's).

Only for a plain single-connection-pool client: a cluster client, a pipeline or a
single-connection client keeps redis-py's own path.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any

import redis
from redis.client import Pipeline


class DirectCalls:
    """Runs ``EVALSHA``/``EVAL`` on connections of its own, made by ``client``'s pool.

    Idle connections wait in a LIFO stack: a thread takes one for a call and gives it
    back, so there are never more than the calls in flight at once (as with redis-py's
    pool), whatever the number of threads that ever called. A fork leaves the parent's
    connections to the parent; :meth:`close` disconnects them all."""

    def __init__(self, client: redis.Redis) -> None:
        self.pool = client.connection_pool
        self.idle: deque[Any] = deque()
        self.made: list[Any] = []
        self.lock = threading.Lock()
        self.pid = os.getpid()

    @staticmethod
    def suits(client: Any) -> bool:
        """Whether ``client`` is a plain pooled client (not a cluster, a pipeline or a
        single-connection client)."""
        return (
            isinstance(client, redis.Redis)
            and not isinstance(client, Pipeline)
            and getattr(client, "connection", None) is None
        )

    def call(self, *command: Any) -> Any:
        """Send ``command`` and return its reply, retried as the client would retry it.

        A reply error is raised as redis-py raises it (the connection stays usable); a
        connection that failed in any other way is disconnected, so no late reply is
        ever read as the answer to a later call."""
        conn = self._take()
        try:
            return conn.retry.call_with_retry(lambda: self._round_trip(conn, command), lambda _error: conn.disconnect())
        except redis.ResponseError:
            raise
        except BaseException:
            conn.disconnect()
            raise
        finally:
            if not self.pool.owns_connection(conn):
                # A Sentinel pool disowns a connection to a master that is no longer the
                # master (redis-py's pool drops those on release too): connect anew.
                conn.disconnect()
            self.idle.append(conn)

    @staticmethod
    def _round_trip(conn: Any, command: tuple[Any, ...]) -> Any:
        if getattr(conn, "_sock", None) is None:
            # Connect as the pool's checkout does: a Sentinel connection asks the
            # sentinels for the master here (sending alone would connect to its last
            # address, or to the default one).
            conn.connect()
        conn.send_command(*command)
        return conn.read_response()

    def _take(self) -> Any:
        if os.getpid() != self.pid:
            self._forked()
        try:
            return self.idle.pop()
        except IndexError:
            conn = self.pool.make_connection()
            with self.lock:
                self.made.append(conn)
            return conn

    def _forked(self) -> None:
        """In a forked child: forget the parent's connections (their sockets are the
        parent's to use and close), as redis-py's pool does."""
        with self.lock:
            if os.getpid() != self.pid:
                self.idle = deque()
                self.made = []
                self.pid = os.getpid()

    def close(self) -> None:
        """Disconnect every connection made here (a later call connects again)."""
        with self.lock:
            made = list(self.made) if os.getpid() == self.pid else []
        for conn in made:
            try:
                conn.disconnect()
            except Exception:  # pragma: no cover - closing a broken socket
                pass
