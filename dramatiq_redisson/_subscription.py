"""A consumer's pub/sub subscription: its wake channel, and its queue's channel while it
holds the transfer lease.

Each consumer listens on its own wake channel, which ends its idle wait when an enqueue or
transfer makes messages ready for it; the lease holder also listens to the queue's channel,
where offers announce earlier due times. A subscription is re-made with back-off when lost
(the policy is the consumer's :class:`._backoff.Failures`); while unsubscribed, the
transfer duty polls. Every second a subscribed consumer also checks that the server its
commands go to still lists the subscription (one lost without an error, after a failover,
is made again there).

:class:`Subscription` does no transfer and knows no consumer: each of its calls returns
what it heard (:data:`FORCE`, :data:`WOKEN`, :data:`ANNOUNCED`, :data:`DROPPED` as bits of
an ``int``), and the transfer duty that owns it acts on that (see
``_transfer_duty.TransferDuty.act``).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import redis

from ._logs import CONNECTION_ERRORS

if TYPE_CHECKING:
    from ._keys import QueueKeys
    from ._liveness import Liveness
    from .connection._topology import Topology

#: What a call heard, as bits of its ``int`` result: transfer now (anything announced
#: meanwhile is unknown, or the lease holder left) ...
FORCE = 1
#: ... a wake-up came, or the wake channel was subscribed: fetch now ...
WOKEN = 2
#: ... an offer announced a due time (the earliest in :attr:`Subscription.announced_ms`;
#: 0: a message is ready) ...
ANNOUNCED = 4
#: ... the subscription was dropped: wake-ups no longer reach the consumer.
DROPPED = 8

#: While not subscribed, a consumer hears no announcements, so it transfers at least
#: this often (ms) instead of every ``safety_interval``.
UNSUBSCRIBED_TRANSFER_INTERVAL = 250

#: How often (s) a subscribed consumer asks the server it sends its commands to whether it
#: lists the subscription (PUBSUB NUMSUB of its wake channel, and of the queue's channel
#: while it holds the lease): one that is missing twice in a row is made again there. A
#: subscription can be lost without an error on its connection (after a failover it may
#: sit on a node that is no longer the primary), and then announcements never arrive.
SUBSCRIPTION_CHECK_INTERVAL = 1.0

#: A check finds counts another consumer of this process took on the same server less
#: than this long ago (s) good enough (one call per server per check interval, not one
#: per consumer; see _liveness.SubscriptionCounts); below the interval, so that a
#: consumer's two checks in a row never read the same counts.
SHARED_COUNTS_FOR = 0.9 * SUBSCRIPTION_CHECK_INTERVAL

#: A wait that ends at the transfer timer's deadline listens on its subscription until this
#: many ms before it, then sleeps the rest (see Subscription.wait).
POLL_MARGIN_MS = 1


class SubscriptionGone(redis.ConnectionError):
    """The server answers, but no longer holds this consumer's subscription (it was moved
    by a failover, or the server dropped it): logged per queue, unlike a server that is
    away (see ``_logs``)."""


class SubscriptionHost(Protocol):
    """What a subscription uses of its broker: where pub/sub goes (topology), the list of
    subscribed consumers (liveness), and the checks before the first subscription."""

    liveness: Liveness
    topology: Topology

    @property
    def start_gate(self) -> Gate: ...


class Gate(Protocol):
    """The checks before a consumer's first subscription (``_start_gate.StartGate``)."""

    def check(self, keys: QueueKeys, worker_id: str, logger: Any) -> None: ...


class FailurePolicy(Protocol):
    """What a subscription's failures do (``_backoff.Failures``)."""

    def subscription_lost(self, error: Exception, channel: str, *, gone: bool) -> float: ...

    def subscribed(self, channel: str) -> None: ...


class Subscription:
    """The pub/sub subscription of one consumer (see the module).

    Parameters:
      host: The broker (see :class:`SubscriptionHost`).
      failures: The consumer's error and back-off policy.
      keys: The consumer's queue.
      token: The consumer's name (listed while subscribed).
      wake_channel: The consumer's wake channel.
      worker_id: The consumer's worker (for the permission probe).
      logger_name: The consumer's logger.
    """

    def __init__(
        self,
        host: SubscriptionHost,
        failures: FailurePolicy,
        keys: QueueKeys,
        *,
        token: str,
        wake_channel: str,
        worker_id: str,
        logger_name: str,
    ) -> None:
        self.host = host
        self.failures = failures
        self.keys = keys
        self.token = token
        self.wake_channel = wake_channel
        self.worker_id = worker_id
        self.logger = logging.getLogger(logger_name)  # the consumer's
        self.pubsub: Any = None
        #: The wake channel's subscription is confirmed: fetches may register as idle.
        self.wake_ready = False
        #: Subscribed to the queue's channel (while holding the transfer lease).
        self.announcements = False
        self.resubscribe_at = 0.0
        self.next_poll_transfer_at = 0.0
        self.next_subscription_check_at = 0.0
        #: Consecutive checks that found the subscription missing on the server.
        self.subscription_missing = 0
        #: The earliest due time announced since the duty last acted (see :data:`ANNOUNCED`).
        self.announced_ms = 0
        self.pause = threading.Event()  # never set: an interruptible sleep

    def listen(self, now: float, owner: bool) -> int:
        """(Re)subscribe when due, poll while unsubscribed, and hear what was received.
        ``owner``: the consumer holds the transfer lease (listens to its queue's channel)."""
        heard = 0
        if self.pubsub is None and now >= self.resubscribe_at:
            heard = self.subscribe(owner)
        if self.pubsub is None and now >= self.next_poll_transfer_at:
            # No announcements reach us while unsubscribed: poll instead.
            self.next_poll_transfer_at = now + UNSUBSCRIBED_TRANSFER_INTERVAL / 1000
            heard |= FORCE
        return heard | self.drain()

    def subscribe(self, owner: bool) -> int:
        """Subscribe to the wake channel, and to the queue's channel when ``owner``; on
        failure, try again later (see :meth:`lost`).

        The first subscription checks the server and the user's permissions first (the
        broker's start gate, once per broker and queue)."""
        # Refuse a server the broker cannot run on before anything is written: the first
        # tick subscribes before the first fetch (UnsupportedServer stops this consumer).
        self.host.start_gate.check(self.keys, self.worker_id, self.logger)
        channels = [self.wake_channel]
        if owner:
            channels.append(self.keys.channel)
        pubsub: Any = None
        topology = self.host.topology
        try:
            # On a cluster: sharded pub/sub, on the node that owns the queue's slot (its
            # channels share the queue's hash tag).
            pubsub = topology.pubsub(self.keys.channel)
            topology.subscribe(pubsub, *channels)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            if pubsub is not None:
                _close_quietly(pubsub)
            return self.lost(e)
        self.pubsub = pubsub
        self.announcements = owner
        # Listed while subscribed: a process that dies drops the subscription (see _liveness).
        self.host.liveness.subscribed(self.keys, self.token)
        self.failures.subscribed(self.keys.channel)
        self.subscription_missing = 0  # a miss counts against this subscription only
        return FORCE  # anything announced while we were away is unknown

    def lost(self, error: Exception) -> int:
        """Drop the subscription only; fetching goes on, and the timer polls until a
        re-subscription (immediate, then with back-off) succeeds."""
        if self.pubsub is not None:
            _close_quietly(self.pubsub)
            self.pubsub = None
        # Wake-ups no longer reach us: fetch (and back off) as without a subscription.
        self.wake_ready = self.announcements = False
        # On a cluster the slot may have moved (failover, migration): subscribe where it is now.
        self.host.topology.follow(error)
        gone = isinstance(error, SubscriptionGone)
        self.resubscribe_at = time.monotonic() + self.failures.subscription_lost(error, self.keys.channel, gone=gone)
        return DROPPED | FORCE

    def resubscribe_now(self) -> None:
        """The server is back (a probe found it accepting again): subscribe at once."""
        self.resubscribe_at = 0.0

    def check_if_due(self, now: float) -> int:
        """Every :data:`SUBSCRIPTION_CHECK_INTERVAL`, while subscribed: is the subscription
        still listed where our commands go? Subscribe again where it is now when it was
        missing at two checks in a row. Errors are left to the other calls."""
        if self.pubsub is None or not self.wake_ready or now < self.next_subscription_check_at:
            return 0
        self.next_subscription_check_at = now + SUBSCRIPTION_CHECK_INTERVAL
        channels = [self.wake_channel, self.keys.channel] if self.announcements else [self.wake_channel]
        try:
            counts = self.host.liveness.subscriptions(self.keys, channels, SHARED_COUNTS_FOR)
        except (*CONNECTION_ERRORS, redis.ResponseError):
            return 0
        if all(counts.get(channel, 0) > 0 for channel in channels):
            self.subscription_missing = 0
            return 0
        self.subscription_missing += 1
        if self.subscription_missing >= 2:
            return self.lost(
                SubscriptionGone("the server lists no subscription of this consumer (moved by a failover?)")
            )
        return 0

    def follow_lease(self, owner: bool, queue_name: str) -> int:
        """Subscribe to the queue's announcements on taking the lease (``owner``),
        unsubscribe on losing it (only the holder times transfers, so only it needs them)."""
        if self.pubsub is None or self.announcements == owner:
            return 0
        topology = self.host.topology
        try:
            if owner:
                # Its confirmation forces a transfer.
                topology.subscribe(self.pubsub, self.keys.channel)
                self.logger.debug("Took the transfer lease of queue %r.", queue_name)
            else:
                topology.unsubscribe(self.pubsub, self.keys.channel)
                self.logger.debug("Another consumer holds the transfer lease of queue %r.", queue_name)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            return self.lost(e)
        self.announcements = owner
        return 0

    def wait(self, seconds: float, until_due: float) -> int:
        """Wait up to ``seconds`` for an announcement or a wake-up (sleep while unsubscribed,
        no longer than until the next re-subscription or poll); ``until_due``: the transfer
        timer's next deadline (s from now).

        A wait that ends at the timer's deadline ends on time: a socket's timeout is
        rounded up to whole milliseconds (``poll``), which woke the timer 0.6-0.9 ms late
        here. So it listens until :data:`POLL_MARGIN_MS` before the deadline and sleeps
        the rest (a sleep is precise to about 0.1 ms); what arrives meanwhile is handled
        right after."""
        if self.pubsub is None:
            now = time.monotonic()
            self.pause.wait(max(0.0, min(seconds, self.resubscribe_at - now, self.next_poll_transfer_at - now)))
            return 0
        deadline = time.monotonic() + seconds
        timed = seconds > 0 and seconds >= until_due - 0.0001
        listen = math.floor(seconds * 1000 - POLL_MARGIN_MS) / 1000 if timed else seconds
        try:
            item = self.pubsub.get_message(timeout=listen) if listen > 0 else None
            heard = self.handle(item)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            return self.lost(e)
        if timed and item is None:
            remaining = deadline - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
        return heard | self.drain()

    def drain(self) -> int:
        """Hear every pub/sub item already received."""
        heard = 0
        if self.pubsub is None:
            return heard
        try:
            for _ in range(1000):
                if self.pubsub is None:
                    return heard  # dropped by the server while draining (see handle)
                item = self.pubsub.get_message(timeout=0)
                if item is None:
                    return heard
                heard |= self.handle(item)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            heard |= self.lost(e)
        return heard

    def handle(self, item: dict[str, Any] | None) -> int:
        """Hear one pub/sub item: a (lost) subscription, a wake-up, an announcement."""
        if item is None:
            return 0
        kind = item["type"]
        if isinstance(kind, bytes):
            kind = kind.decode()
        if kind in ("ssubscribe", "smessage", "sunsubscribe"):
            kind = kind[1:]  # sharded pub/sub (cluster): the same meaning
        channel = item.get("channel")
        if isinstance(channel, bytes):
            channel = channel.decode()
        if kind == "unsubscribe" and (channel == self.wake_channel or self.announcements):
            # Not asked for: the server dropped the subscription (on a cluster, the
            # queue's slot moved to another node). Subscribe again where it is now.
            return self.lost(SubscriptionGone(f"the server unsubscribed {channel!r}"))
        if kind == "subscribe":
            if channel == self.wake_channel:
                self.wake_ready = True  # from now on a wake-up cannot be missed
                return WOKEN | FORCE  # fetch (and register) again
            # (Re)subscribed: anything announced while we were away is unknown.
            return FORCE
        if kind == "message" and channel == self.wake_channel:
            return FORCE if item["data"] == b"-1" else WOKEN  # -1: the lease holder left
        if kind == "message":
            try:
                due_ms = int(item["data"])
            except (TypeError, ValueError):
                self.logger.warning("Ignoring malformed announcement %r on %r.", item["data"], self.keys.channel)
                return FORCE
            if due_ms > 0 and (self.announced_ms == 0 or due_ms < self.announced_ms):
                self.announced_ms = due_ms  # 0: a message is ready (enqueue.lua); fetching is enough
            return ANNOUNCED
        return 0

    def take_announced(self) -> int:
        """The earliest due time announced since the last call (0: none)."""
        due_ms, self.announced_ms = self.announced_ms, 0
        return due_ms

    def close(self) -> None:
        """Close the pub/sub connection and take the consumer off the subscribed list (a
        clean stop)."""
        if self.pubsub is not None:
            _close_quietly(self.pubsub)
            self.pubsub = None
        self.host.liveness.unsubscribed(self.keys, self.token)


def _close_quietly(pubsub: Any) -> None:
    try:
        pubsub.close()
    except Exception:  # pragma: no cover - closing a broken socket
        pass
