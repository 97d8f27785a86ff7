"""A consumer's error and back-off policy, shared with its transfer duty: one object.

:class:`Failures` is what one consumer (and the transfer duty and subscription working
for it) does when a call fails: what it says (its :class:`._logs.FailureLog`: a server
that is away once per process, anything else per queue and kind), how long it backs off
(one :class:`Backoff` ladder per kind of retry: the consumer's failed calls, failed
transfers, lost subscriptions), and, after a lost connection, the wait that ends as soon
as a server that refused connections accepts them again (:meth:`Failures.failed`). The
consumer never stops: every failure is retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from dramatiq.common import compute_backoff

from ._errors import NotReplicated
from ._logs import CONNECTION_ERRORS, FailureLog, reason
from .connection._client import Probe

if TYPE_CHECKING:
    from .connection._commands import Commands

#: Longest back-off (ms) after a failed call (lost connection, server error) before the
#: consumer tries again; the consumer itself never stops.
MAX_ERROR_BACKOFF = 2000

#: First back-off (ms) after a failure; it doubles (with jitter) up to the maxima.
ERROR_BACKOFF_FACTOR = 100

#: Longest back-off (ms) between two re-subscription attempts after the pub/sub
#: connection was lost. The first attempt is immediate.
MAX_RESUBSCRIBE_BACKOFF = 1000

#: While the server is away, how often (ms) a failing consumer probes whether it is back.
PROBE_INTERVAL = 50

_T = TypeVar("_T")


class Backoff:
    """One ladder of retries: Dramatiq's ``compute_backoff`` (``factor`` ms, doubling with
    jitter, up to ``max_ms``) over the failures in a row."""

    def __init__(self, max_ms: int, factor: int = ERROR_BACKOFF_FACTOR) -> None:
        self.max_ms = max_ms
        self.factor = factor
        #: Failures in a row so far.
        self.attempts = 0

    def step(self) -> int:
        """One more failure: how long (ms) to back off."""
        self.attempts, backoff_ms = compute_backoff(self.attempts, factor=self.factor, max_backoff=self.max_ms)
        return int(backoff_ms)

    def reset(self) -> None:
        self.attempts = 0


class Failures:
    """The error and back-off policy of one consumer of ``queue_name`` (see the module).

    Parameters:
      client: The broker's client: where the server is (for the process's outage log
        and the reconnect probe).
      logger: The consumer's logger.
      queue_name: The queue, for the log lines.
    """

    def __init__(self, client: Commands, logger: logging.Logger, queue_name: str) -> None:
        self.logger = logger
        self.queue_name = queue_name
        #: Logs failed calls: a server that is away once per process (see ``_logs``).
        self.failure_log = FailureLog(client, logger, queue_name)
        self.outage = self.failure_log.outage
        self.probe = Probe(client)
        #: The consumer's failed calls (see :meth:`failed`).
        self.calls = Backoff(MAX_ERROR_BACKOFF)
        #: Failed transfers (a server error, too few replicas): the transfer is retried soon.
        self.transfers = Backoff(MAX_ERROR_BACKOFF)
        #: Lost subscriptions: the first attempt is immediate, then with back-off.
        self.resubscribes = Backoff(MAX_RESUBSCRIBE_BACKOFF)
        #: The last lost subscription went with the server (said once by the outage log).
        self.lost_with_server = False
        #: An interruptible sleep for the back-off (never set).
        self.wakeup = threading.Event()
        self.server_was_down = False  # a probe found the server refusing connections
        self.failing_since: float | None = None

    def log(self, error: Exception) -> None:
        """Say that a call failed (rate-limited; see ``_logs.FailureLog``)."""
        self.failure_log.log(error)

    def guarded(self, task: Callable[..., _T], *args: Any) -> _T | None:
        """Run one of the consumer's side tasks; a server error is logged and gives ``None``."""
        try:
            return task(*args)
        except (redis.ResponseError, NotReplicated) as e:
            self.failure_log.log(e)
            return None

    # -- the consumer's failed calls -------------------------------------------------

    def failed(self, error: Exception) -> bool:
        """A call of the consumer failed: log it and back off (in this thread, so that the
        consumer's ``__next__`` returns afterwards and Dramatiq's consumer thread stays
        responsive). Returns whether the wait ended because a server that refused
        connections accepts them again (then subscribe again at once, too)."""
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self.failure_log.log(error)
        backoff_ms = self.calls.step()
        if isinstance(error, redis.BusyLoadingError):
            # Back, and loading its data: it answers LOADING at once (nothing to run), and
            # serves as soon as the load ends. Ask again soon rather than back off.
            self.wakeup.wait(min(backoff_ms, PROBE_INTERVAL) / 1000)
        elif isinstance(error, CONNECTION_ERRORS):
            return self._wait_for_server(backoff_ms / 1000)
        else:
            self.wakeup.wait(backoff_ms / 1000)
        return False

    def _wait_for_server(self, seconds: float) -> bool:
        """Back off ``seconds`` after a lost connection, but end the wait as soon as a server
        that refused connections accepts them again (probed every :data:`PROBE_INTERVAL`
        ms; a probe is a TCP connect, nothing for the server to run): delivery resumes
        within about that long of a restarted server's return, whatever the back-off."""
        deadline = time.monotonic() + seconds
        while True:
            accepting = self.probe.accepting()
            if accepting and self.server_was_down:
                self.server_was_down = False
                return True
            if accepting is False:
                self.server_was_down = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.wakeup.wait(remaining if accepting is None else min(PROBE_INTERVAL / 1000, remaining))

    def recovered(self) -> None:
        """A call of the consumer worked: if calls had been failing, say so and reset."""
        if self.failing_since is not None:
            self.outage.reached()
            self.logger.debug(
                "Calls on queue %r work again after %.1f s.", self.queue_name, time.monotonic() - self.failing_since
            )
            self.failing_since = None
            self.calls.reset()
            self.server_was_down = False

    # -- the subscription's ----------------------------------------------------------

    def subscription_lost(self, error: Exception, channel: str, *, gone: bool) -> float:
        """The subscription to ``channel`` failed or was lost (``gone``: the server answers
        but no longer holds it): say so once, and return in how many seconds to subscribe
        again (at once the first time, then with back-off)."""
        if isinstance(error, redis.ResponseError):
            self.failure_log.log(error)  # a refused channel: rate-limited, with its reason
        elif isinstance(error, CONNECTION_ERRORS) and not gone:
            # The server is away: the process says so once, for every queue (see _logs).
            self.lost_with_server = True
            self.outage.failed(error)
        elif self.resubscribes.attempts == 0:
            self.logger.warning("Lost the subscription to %r (%s); subscribing again.", channel, reason(error))
        first = self.resubscribes.attempts == 0
        backoff_ms = self.resubscribes.step()
        return 0.0 if first else backoff_ms / 1000

    def subscribed(self, channel: str) -> None:
        """A (re)subscription to ``channel`` worked: the server is there, the ladder starts
        over; a subscription lost without the server is said to be back."""
        self.outage.reached()
        if self.resubscribes.attempts and not self.lost_with_server:
            self.logger.info("Subscribed to %r again.", channel)
        self.resubscribes.reset()
        self.lost_with_server = False
