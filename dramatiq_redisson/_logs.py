"""How the package names its loggers, and what a process says while its server is away.

**Names.** Every logger is named after a class under the public package name, as
Dramatiq's are (``dramatiq.worker.Worker``): ``dramatiq_redisson.RedissonBroker``,
``dramatiq_redisson.RedissonConsumer``, ``dramatiq_redisson.Liveness``… never after the
private module a class lives in, which can move. ``logging.getLogger("dramatiq_redisson")``
is the parent of them all.

**A consumer's failed calls** go to its :class:`FailureLog`: a server that is away to the
process's :class:`Outage`, anything else (a refused call, a missing permission, too few
replicas) as a line naming the queue, once per kind and :data:`ERROR_LOG_INTERVAL`.

**A server that is away.** Every consumer, its subscription and the liveness thread of a
process meet the same refused connection. Instead of a line from each of them per queue,
the process says it once, naming the address (:class:`Outage`): *Cannot reach
redis://127.0.0.1:6379/0* when it never reached that server, *Lost the connection to …*
when it had; then at most one *Still cannot reach …* per back-off step (after 2, 4, 8, 16
s away, then every :data:`REMINDER_CAP` s), and one line when it is back. The callers go on
retrying as before: this only decides what is written.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

import redis
from dramatiq.logging import get_logger

from .connection._client import server_address
from .connection._permissions import DOCS, is_permission_error

#: The prefix of every logger's name: the public package.
PACKAGE = "dramatiq_redisson"

#: Seconds away before the first "still cannot reach" line; each next one waits twice as
#: long, up to :data:`REMINDER_CAP`.
FIRST_REMINDER = 2.0

#: Longest time (s) between two "still cannot reach" lines.
REMINDER_CAP = 30.0

#: Least time (ms) between two log lines of a consumer about the same kind of failure.
ERROR_LOG_INTERVAL = 30_000

#: The errors that mean the server is away, or moved: a failed connection, or (on a
#: cluster) redis-py's cluster client giving up on a slot that keeps moving
#: (``ClusterError: TTL exhausted``). The parts back off and try again.
CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError)


def logger_for(owner: type | str) -> logging.Logger:
    """The logger of ``owner`` (a class, or a name): ``dramatiq_redisson.<name>``."""
    return get_logger(PACKAGE, owner) if isinstance(owner, type) else logging.getLogger(f"{PACKAGE}.{owner}")


def reason(error: BaseException) -> str:
    """``error``'s text as a clause: without the closing period redis-py's messages end
    with (``"… Connection refused."``), so that a sentence can go on after it."""
    return str(error).strip().rstrip(".") or type(error).__name__


class Outage:
    """One process's account of one server being away (see the module docstring).

    :meth:`failed` is called by every part that met a connection error, :meth:`reached`
    by a part whose call worked; both are safe from any thread, and :meth:`reached` costs
    two attribute reads while nothing is wrong."""

    def __init__(self, address: str, logger: logging.Logger) -> None:
        self.address = address
        self.logger = logger
        self.lock = threading.Lock()
        #: Whether a call to this server ever worked in this process.
        self.reached_once = False
        #: When (monotonic s) the server went away; ``None`` while it is there.
        self.since: float | None = None
        self.next_line_at = 0.0
        self.step = FIRST_REMINDER

    @property
    def away(self) -> bool:
        return self.since is not None

    def failed(self, error: BaseException) -> bool:
        """A call could not reach the server: say so if it is news, or if a back-off step
        passed since the last line; whether a line was written."""
        now = time.monotonic()
        with self.lock:
            if self.since is None:
                self.since, self.step = now, FIRST_REMINDER
                self.next_line_at = now + self.step
                if self.reached_once:
                    self.logger.warning("Lost the connection to %s: %s. Retrying.", self.address, reason(error))
                else:
                    self.logger.warning(
                        "Cannot reach %s: %s. Retrying until it answers.",
                        self.address,
                        reason(error),
                    )
                return True
            if now < self.next_line_at:
                return False
            self.step = min(self.step * 2, REMINDER_CAP)
            self.next_line_at = now + self.step
            self.logger.warning(
                "Still cannot reach %s after %d s: %s. Retrying.", self.address, round(now - self.since), reason(error)
            )
            return True

    def reached(self) -> None:
        """A call to the server worked: if it had been away, say it is back."""
        if self.since is None and self.reached_once:
            return
        with self.lock:
            since, self.since, self.reached_once = self.since, None, True
            if since is not None:
                self.logger.info("Reached %s again after %.1f s.", self.address, time.monotonic() - since)


_outages: dict[str, Outage] = {}
_outages_lock = threading.Lock()


def outage_of(client: Any, logger: logging.Logger | None = None) -> Outage:
    """The process's :class:`Outage` of ``client``'s server (one per address, shared by
    every broker of the process that connects there)."""
    address = server_address(client)
    with _outages_lock:
        outage = _outages.get(address)
        if outage is None:
            outage = _outages[address] = Outage(address, logger or logger_for("RedissonBroker"))
        return outage


class FailureLog:
    """What one consumer says about its failed calls (see the module docstring)."""

    def __init__(self, client: Any, logger: logging.Logger, queue_name: str) -> None:
        self.outage = outage_of(client)
        self.logger = logger
        self.queue_name = queue_name
        self.last_line: dict[str, float] = {}

    def log(self, error: Exception) -> None:
        if isinstance(error, CONNECTION_ERRORS):
            self.outage.failed(error)
            return
        now = time.monotonic()
        kind = f"{type(error).__name__}: {str(error).split(' ', 1)[0]}"
        if now - self.last_line.get(kind, -math.inf) < ERROR_LOG_INTERVAL / 1000:
            return
        self.last_line[kind] = now
        if is_permission_error(error):
            self.logger.error(
                "The Redis user lacks a permission on queue %r (see %s): %s", self.queue_name, DOCS, error
            )
        elif isinstance(error, redis.ResponseError):
            self.logger.error("Redis refused a call on queue %r: %s. Retrying.", self.queue_name, reason(error))
        else:
            self.logger.warning("On queue %r: %s. Retrying.", self.queue_name, reason(error))
