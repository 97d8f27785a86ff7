"""The transfer timer's bookkeeping, free of I/O so tests can drive it tick by tick."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from .scripts._calls import TransferResult

#: How fast (µs per s) the error of a server-clock sample is taken to grow with its age:
#: the server's clock and this host's monotonic clock drift apart (NTP slews by at most
#: 500 ppm), so a fresh sample eventually beats an old, tighter one.
DRIFT_US_PER_S = 500


#: The part of a server-clock sample's error added to each deadline (see TransferTimer._local).
ERROR_MARGIN = 0.5


class TransferTimer:
    """Decides when a consumer runs the transfer script next.

    Server times (epoch ms on the Redis server's clock) are turned into local
    deadlines through the monotonic clock, using the server time each transfer
    returns; the local wall clock is never read, so its skew moves nothing.

    The server read its clock somewhere between the call's start and its reply: the
    sample is taken at the midpoint, with half the call's length as its error, and the
    tightest sample is kept (its error growing with age by :data:`DRIFT_US_PER_S`) until a
    tighter one comes or one disagrees with it beyond both errors (the server's clock was
    stepped, or it is another server). Taking the reply's arrival as the server's "now", as
    before, made every deadline late by the reply's way back (about half a call: 0.3-0.5 ms
    here, more when the process is busy).

    A consumer either holds its queue's transfer lease (the owner: it transfers at each
    due time, and at least every third of the lease to renew it) or stands by: it
    only checks the lease when the holder's lease would end (plus a little jitter,
    so that a fleet of standbys does not check all at once), and takes it over if
    it lapsed.

    Parameters:
      safety_interval_ms: Longest time between two transfers, whatever was
        announced: covers a missed announcement or a lost subscription.
      clock: Monotonic clock in seconds.
      lease_ms: The transfer lease's length (``None``: no lease, every consumer
        transfers on its own timer).
      jitter: Returns a number in [0, 1); a standby checks up to
        :data:`STANDBY_JITTER` of the lease after the lease's end.
    """

    #: Largest part of the lease a standby waits after the lease's end (spreads a fleet).
    STANDBY_JITTER = 0.1

    def __init__(
        self,
        safety_interval_ms: float,
        clock: Callable[[], float] = time.monotonic,
        lease_ms: int | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.safety_interval_ms = safety_interval_ms
        self.clock = clock
        self.lease_ms = lease_ms
        self.jitter = jitter
        #: Whether the last transfer found this consumer holding the lease.
        self.owner = False
        self._forced = True
        self._next_at: float | None = None
        self._safety_at = clock()
        #: Server clock minus the monotonic clock (µs), from the best sample so far; its
        #: error (µs) and when it was taken (monotonic s).
        self._offset_us: float | None = None
        self._offset_error_us = 0.0
        self._offset_at = 0.0

    def is_due(self) -> bool:
        """Whether the transfer script should run now."""
        now = self.clock()
        return self._forced or now >= self._safety_at or (self._next_at is not None and now >= self._next_at)

    def force(self) -> None:
        """Run the transfer at the next tick (subscription (re)established, more to move)."""
        self._forced = True

    def retry_in(self, delay_ms: int) -> None:
        """The transfer failed: try again in ``delay_ms`` (not at once, which would spin)."""
        self._forced = False
        self._next_at = self.clock() + delay_ms / 1000
        self._safety_at = max(self._safety_at, self._next_at)

    def record(self, result: TransferResult, started: float | None = None) -> None:
        """Take the outcome of a transfer run: the next due time and the server clock,
        or, if another consumer holds the lease, when to check the lease again.
        ``started``: when the call was sent (this timer's clock; default: now)."""
        now = self.clock()
        self._forced = False
        self._sample(result.server_now_us, now if started is None else min(started, now), now)
        self.owner = result.lease_until_ms is None
        if result.lease_until_ms is not None:
            # Standing by: nothing to time but the holder's lease.
            assert self.lease_ms is not None
            self._next_at = None
            until_end = max(0.0, self._local(result.lease_until_ms * 1000) - now)
            self._safety_at = now + until_end + self.jitter() * self.STANDBY_JITTER * self.lease_ms / 1000
            return
        interval_ms = self.safety_interval_ms
        if self.lease_ms is not None:
            interval_ms = min(interval_ms, self.lease_ms // 3)
        self._safety_at = now + interval_ms / 1000
        if result.next_due_ms is None:
            self._next_at = None
        else:
            # Microseconds: an entry due at D moves once the server clock reads D.000 ms,
            # so scheduling from a truncated millisecond would add up to 1 ms.
            self._next_at = max(now, self._local(result.next_due_ms * 1000))

    def announce(self, due_ms: int) -> None:
        """An offer made ``due_ms`` (server epoch ms) the earliest due time."""
        if self._offset_us is None:
            self._forced = True
            return
        at = max(self.clock(), self._local(due_ms * 1000))
        if self._next_at is None or at < self._next_at:
            self._next_at = at

    def server_now_ms(self) -> int:
        """Estimate of the server's clock now (0 before the first transfer)."""
        if self._offset_us is None:
            return 0
        return int(self.clock() * 1_000_000 + self._offset_us) // 1000

    def _local(self, server_us: float) -> float:
        """The monotonic time at which the server's clock reads ``server_us``, plus half the
        sample's error (:data:`ERROR_MARGIN`): a transfer sent at the middle estimate arrived
        before its due time often enough (about one in seven here) to cost a second call
        each time; the whole error would delay every transfer by up to half a call."""
        assert self._offset_us is not None
        return (server_us - self._offset_us + ERROR_MARGIN * self._offset_error_us) / 1_000_000

    def _sample(self, server_us: int, started: float, ended: float) -> None:
        """A call sent at ``started`` and answered at ``ended`` read the server's clock as
        ``server_us``: keep it if it is the tightest sample (see the class)."""
        mid = (started + ended) / 2
        error = (ended - started) / 2 * 1_000_000
        offset = server_us - mid * 1_000_000
        if self._offset_us is not None:
            kept_error = self._offset_error_us + (ended - self._offset_at) * DRIFT_US_PER_S
            agrees = abs(offset - self._offset_us) <= kept_error + error
            if agrees and kept_error <= error:
                return
        self._offset_us, self._offset_error_us, self._offset_at = offset, error, ended

    def seconds_until_due(self) -> float:
        """Seconds until the transfer should run (0 if it should run now)."""
        if self._forced:
            return 0.0
        deadline = self._safety_at if self._next_at is None else min(self._next_at, self._safety_at)
        return max(0.0, deadline - self.clock())
