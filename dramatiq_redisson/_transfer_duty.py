"""A consumer's transfer duty: the lease, the subscription, the transfer timer's ticks.

:class:`TransferDuty` moves the queue's due messages to its ready queue. Of all consumers
of a queue, the one holding the transfer lease (see transfer.lua) listens to the queue's
channel and transfers at the due time the last transfer returned, when an earlier due
time is announced, and at least every third of the lease (which renews it); the others
stand by and take the lease over when it lapses. Each consumer also listens on its own
wake channel, which ends its idle wait when an enqueue or transfer makes messages ready
for it. Subscriptions are re-made with back-off when lost; while unsubscribed, the duty
polls.

It works for one :class:`._consumer.RedissonConsumer` (its host): messages a transfer
hands off go into the host's cache (:meth:`RedissonConsumer.take`), wake-ups end its idle
wait (:meth:`RedissonConsumer.woken`), failures go to its log (:class:`._logs.FailureLog`).
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import redis
from dramatiq.common import compute_backoff

from ._errors import MissingPermission, NotReplicated
from ._logs import CONNECTION_ERRORS, FailureLog, reason
from ._timer import TransferTimer
from ._tuning import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET, UPKEEP_INTERVAL_MS
from .connection._permissions import check_permissions

if TYPE_CHECKING:
    from ._consumer import ConsumerHost
    from ._keys import QueueKeys
    from ._liveness import Reaper
    from .scripts._calls import Scripts, TransferResult

#: Most transfer calls in one tick before the consumer hands back control.
MAX_TRANSFER_CALLS_PER_TICK = 20

#: How often the lease holder keeps a message on a tie with the idlest other consumer
#: (see transfer.lua's Placement). Below one half: a process that runs jobs runs its timer
#: later (its threads share one interpreter lock with it), so the holder leans on the
#: others, and yet no process runs most of the work.
KEEP_TIES = 0.3

#: Longest back-off (ms) between two re-subscription attempts after the pub/sub
#: connection was lost. The first attempt is immediate.
MAX_RESUBSCRIBE_BACKOFF = 1000

#: While not subscribed, a consumer hears no announcements, so it transfers at least
#: this often (ms) instead of every ``safety_interval``.
UNSUBSCRIBED_TRANSFER_INTERVAL = 250

#: Longest back-off (ms) after a failed call (lost connection, server error) before the
#: consumer tries again; the consumer itself never stops.
MAX_ERROR_BACKOFF = 2000

#: First back-off (ms) after a failure; it doubles (with jitter) up to the maxima above.
ERROR_BACKOFF_FACTOR = 100

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
#: many ms before it, then sleeps the rest (see TransferDuty.wait).
POLL_MARGIN_MS = 1


class SubscriptionGone(redis.ConnectionError):
    """The server answers, but no longer holds this consumer's subscription (it was moved
    by a failover, or the server dropped it): logged per queue, unlike a server that is
    away (see :mod:`._logs`)."""


def lapsed_renewal(lease_until_ms: int, taken_at_ms: int, lease_ms: int) -> int | None:
    """When the holder of a lease that ended at ``lease_until_ms`` last renewed it, if a
    consumer that took it over at ``taken_at_ms`` (server epoch ms) found it lapsed: taken
    at or after its end, within half a lease. ``None`` for a lease released early (a clean
    stop) or taken over long after its end (the server was away)."""
    if 0 <= taken_at_ms - lease_until_ms <= lease_ms // 2:
        return lease_until_ms - lease_ms
    return None


_T = TypeVar("_T")


class DutyOwner(Protocol):
    """What a transfer duty reads of the consumer it works for: its names and keys, how
    it takes fetched messages and counts what it can start, its idle registration and back-off,
    its failure log and its queue's reaper (and, through ``broker``, the
    :class:`._consumer.ConsumerHost`). Nothing else (``tests/test_shape.py`` checks it)."""

    broker: ConsumerHost
    keys: QueueKeys
    failure_log: FailureLog
    logger: Any
    queue_name: str
    reaper: Reaper
    scripts: Scripts
    token: str
    wake_channel: str
    worker_id: str

    @property
    def long_jobs(self) -> bool: ...

    def can_start(self, finishing: int = 0) -> int: ...

    def take(self, fetched: list[tuple[str, bytes | None]]) -> None: ...

    def note_idle(self, registered: bool, score: int = 0) -> None: ...

    def woken(self) -> None: ...

    def lost_reply(self) -> None: ...

    def reset_backoff(self) -> None: ...

    def guarded(self, task: Callable[..., _T], *args: Any) -> _T | None: ...


class TransferDuty:
    """The transfers, lease and subscriptions of one consumer (see the module)."""

    def __init__(self, consumer: DutyOwner) -> None:
        self.consumer = consumer
        self.broker = consumer.broker
        self.logger = consumer.logger  # one logger per consumer, as before the split
        self.scripts = consumer.scripts
        self.keys = consumer.keys
        self.queue_name = consumer.queue_name
        self.token = consumer.token
        self.wake_channel = consumer.wake_channel
        self.timer = TransferTimer(self.broker.settings.safety_interval, lease_ms=self.broker.settings.transfer_lease)
        self.pubsub: Any = None
        #: The wake channel's subscription is confirmed: fetches may register as idle.
        self.wake_ready = False
        #: Subscribed to the queue's channel (while holding the transfer lease).
        self.announcements = False
        self.resubscribe_attempts = 0
        self.lost_with_server = False  # the last lost subscription went with the server
        self.resubscribe_at = 0.0
        self.next_poll_transfer_at = 0.0
        self.next_subscription_check_at = 0.0
        #: How often (ms) a transfer also does the backup list's upkeep (a sharded queue's
        #: shards take turns: see _sharded_consumer).
        self.upkeep_ms = UPKEEP_INTERVAL_MS
        #: Consecutive checks that found the subscription missing on the server.
        self.subscription_missing = 0
        self.failures = 0
        self.pause = threading.Event()  # never set: an interruptible sleep
        #: While standing by: the holder's token and when its lease ends (server epoch
        #: ms), as the last transfer call saw them over a connection that has not failed
        #: since (see :meth:`_took_over`).
        self.standing_by: tuple[str, int] | None = None

    def listen(self, now: float) -> None:
        """(Re)subscribe when due, poll while unsubscribed, and act on what was announced."""
        if self.pubsub is None and now >= self.resubscribe_at:
            self.subscribe()
        if self.pubsub is None and now >= self.next_poll_transfer_at:
            # No announcements reach us while unsubscribed: poll instead.
            self.next_poll_transfer_at = now + UNSUBSCRIBED_TRANSFER_INTERVAL / 1000
            self.timer.force()
        self.drain()

    def check_subscription_if_due(self, now: float) -> None:
        """Every :data:`SUBSCRIPTION_CHECK_INTERVAL`, while subscribed: is the subscription
        still listed where our commands go? (Upkeep: run off the due path.)"""
        if self.pubsub is not None and self.wake_ready and now >= self.next_subscription_check_at:
            self.next_subscription_check_at = now + SUBSCRIPTION_CHECK_INTERVAL
            self._check_subscription()

    def _check_subscription(self) -> None:
        """Ask the server the consumer's commands go to whether it lists our subscription
        (see :data:`SUBSCRIPTION_CHECK_INTERVAL`); subscribe again where it is now when it
        was missing at two checks in a row. Errors are left to the other calls."""
        channels = [self.wake_channel, self.keys.channel] if self.announcements else [self.wake_channel]
        try:
            counts = self.broker.liveness.subscriptions(self.keys, channels, SHARED_COUNTS_FOR)
        except (*CONNECTION_ERRORS, redis.ResponseError):
            return
        if all(counts.get(channel, 0) > 0 for channel in channels):
            self.subscription_missing = 0
            return
        self.subscription_missing += 1
        if self.subscription_missing >= 2:
            self.subscription_failed(
                SubscriptionGone("the server lists no subscription of this consumer (moved by a failover?)")
            )

    def transfer_if_due(self) -> None:
        """Transfer when the timer says so; a server error (or too few replicas) is logged
        and the transfer retried soon, with back-off. A lost connection is raised."""
        if not self.timer.is_due():
            return
        try:
            self.transfer()
        except (redis.ResponseError, NotReplicated) as e:
            # NotReplicated: the transfer went through, but too few replicas have it
            # yet: transfer (and wait) again soon rather than at the next due time.
            self.consumer.failure_log.log(e)
            self.failures, backoff_ms = compute_backoff(
                self.failures, factor=ERROR_BACKOFF_FACTOR, max_backoff=MAX_ERROR_BACKOFF
            )
            self.timer.retry_in(backoff_ms)
        else:
            self.failures = 0

    def close(self) -> None:
        if self.pubsub is not None:
            _close_quietly(self.pubsub)
            self.pubsub = None

    def subscribe(self) -> None:
        """Subscribe to the consumer's wake channel, and to the queue's channel while
        holding the lease; on failure, try again later (see :meth:`subscription_failed`).

        The first subscription checks the server and the user's permissions first."""
        # Refuse a server the broker cannot run on before anything is written: the first
        # tick subscribes before the first fetch. Once per broker (again while the server
        # cannot be asked); UnsupportedServer stops this consumer. Not in __init__, which
        # Dramatiq's consumer thread runs before it publishes the consumer: it stays free
        # of network calls, as the built-in consumer's.
        self.broker.check_server_if_reachable()
        if not self.broker.permissions_checked_for(self.queue_name):
            self._check_permissions()
        channels = [self.wake_channel]
        if self.timer.owner:
            channels.append(self.keys.channel)
        pubsub: Any = None
        topology = self.broker.topology
        try:
            # On a cluster: sharded pub/sub, on the node that owns the queue's slot (its
            # channels share the queue's hash tag).
            pubsub = topology.pubsub(self.keys.channel)
            topology.subscribe(pubsub, *channels)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            if pubsub is not None:
                _close_quietly(pubsub)
            self.subscription_failed(e)
            return
        self.pubsub = pubsub
        self.announcements = self.timer.owner
        # Listed while subscribed: a process that dies drops the subscription (see _liveness).
        self.broker.liveness.subscribed(self.keys, self.token)
        self.consumer.failure_log.outage.reached()
        if self.resubscribe_attempts and not self.lost_with_server:
            self.logger.info("Subscribed to %r again.", self.keys.channel)
        self.resubscribe_attempts = 0
        self.lost_with_server = False
        self.subscription_missing = 0  # a miss counts against this subscription only
        self.timer.force()  # anything announced while we were away is unknown

    def _check_permissions(self) -> None:
        """Once per queue and broker, before the first subscription: name everything the
        Redis user may not do, in one error, instead of failing call by call."""
        try:
            check_permissions(
                self.broker.client,
                self.keys,
                worker_id=self.consumer.worker_id,
                wait_for_replicas=bool(self.broker.settings.wait_for_replicas),
                server_version=self.broker.server_version,
            )
        except MissingPermission as e:
            self.logger.error("%s", e)
        except (*CONNECTION_ERRORS, redis.ResponseError):
            return  # unknown yet: checked again at the next subscription
        self.broker.note_permissions_checked(self.queue_name)

    def subscription_failed(self, error: Exception) -> None:
        """Drop the subscription only; fetching goes on, and the timer polls until a
        re-subscription (immediate, then with back-off) succeeds."""
        if self.pubsub is not None:
            _close_quietly(self.pubsub)
            self.pubsub = None
        # Wake-ups no longer reach us: fetch (and back off) as without a subscription.
        self.wake_ready = self.announcements = False
        self.standing_by = None  # the server may have restarted: a lapse says nothing
        self.consumer.note_idle(False)
        # On a cluster the slot may have moved (failover, migration): subscribe where it is now.
        self.broker.topology.follow(error)
        if isinstance(error, redis.ResponseError):
            self.consumer.failure_log.log(error)  # a refused channel: rate-limited, with its reason
        elif isinstance(error, CONNECTION_ERRORS) and not isinstance(error, SubscriptionGone):
            # The server is away: the process says so once, for every queue (see _logs).
            self.lost_with_server = True
            self.consumer.failure_log.outage.failed(error)
        elif self.resubscribe_attempts == 0:
            self.logger.warning(
                "Lost the subscription to %r (%s); subscribing again.", self.keys.channel, reason(error)
            )
        attempts, backoff_ms = compute_backoff(
            self.resubscribe_attempts, factor=ERROR_BACKOFF_FACTOR, max_backoff=MAX_RESUBSCRIBE_BACKOFF
        )
        self.resubscribe_at = time.monotonic() + (backoff_ms / 1000 if self.resubscribe_attempts else 0)
        self.resubscribe_attempts = attempts
        self.timer.force()

    def _took_over(self, result: TransferResult) -> None:
        """Remember the holder while standing by; on taking over a lease that lapsed (its
        holder stopped renewing it), tell the reaper: a lapsed holder whose subscriptions
        are gone too is dead now, not after the connection grace (see ``Reaper.lapsed``).

        Only a lapse seen over connections that never failed meanwhile, taken over within
        half a lease of its end, counts: after a server restart every consumer is
        resubscribing, and a lease released by a clean stop ends early."""
        if result.lease_until_ms is not None:
            self.standing_by = (result.holder, result.lease_until_ms) if result.holder else None
            return
        if self.standing_by is None:
            return
        holder, lease_until = self.standing_by
        self.standing_by = None
        renewed_ms = lapsed_renewal(lease_until, result.server_now_us // 1000, self.broker.settings.transfer_lease)
        if holder != self.token and renewed_ms is not None:
            self.consumer.reaper.lapsed(holder, renewed_ms=renewed_ms)

    def _follow_lease(self) -> None:
        """Subscribe to the queue's announcements on taking the lease, unsubscribe on
        losing it (only the holder times transfers, so only it needs them)."""
        if self.pubsub is None or self.announcements == self.timer.owner:
            return
        topology = self.broker.topology
        try:
            if self.timer.owner:
                # Its confirmation forces a transfer.
                topology.subscribe(self.pubsub, self.keys.channel)
                self.logger.debug("Took the transfer lease of queue %r.", self.queue_name)
            else:
                topology.unsubscribe(self.pubsub, self.keys.channel)
                self.logger.debug("Another consumer holds the transfer lease of queue %r.", self.queue_name)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            self.subscription_failed(e)
            return
        self.announcements = self.timer.owner

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for an announcement or a wake-up (sleep while unsubscribed,
        no longer than until the next re-subscription or poll).

        A wait that ends at the timer's deadline ends on time: a socket's timeout is
        rounded up to whole milliseconds (``poll``), which woke the timer 0.6-0.9 ms late
        here. So it listens until :data:`POLL_MARGIN_MS` before the deadline and sleeps
        the rest (a sleep is precise to about 0.1 ms); what arrives meanwhile is handled
        right after."""
        if self.pubsub is None:
            now = time.monotonic()
            self.pause.wait(max(0.0, min(seconds, self.resubscribe_at - now, self.next_poll_transfer_at - now)))
            return
        deadline = time.monotonic() + seconds
        timed = seconds > 0 and seconds >= self.timer.seconds_until_due() - 0.0001
        listen = math.floor(seconds * 1000 - POLL_MARGIN_MS) / 1000 if timed else seconds
        try:
            item = self.pubsub.get_message(timeout=listen) if listen > 0 else None
            self.handle(item)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            self.subscription_failed(e)
            return
        if timed and item is None:
            remaining = deadline - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
        self.drain()

    def drain(self) -> None:
        """Handle every pub/sub item already received."""
        if self.pubsub is None:
            return
        try:
            for _ in range(1000):
                if self.pubsub is None:
                    return  # dropped by the server while draining (see _handle)
                item = self.pubsub.get_message(timeout=0)
                if item is None:
                    return
                self.handle(item)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            self.subscription_failed(e)

    def handle(self, item: dict[str, Any] | None) -> None:
        """Act on one pub/sub item: a (lost) subscription, a wake-up, an announcement."""
        if item is None:
            return
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
            self.subscription_failed(SubscriptionGone(f"the server unsubscribed {channel!r}"))
            return
        if kind == "subscribe":
            if channel == self.wake_channel:
                self.wake_ready = True  # from now on a wake-up cannot be missed
                self.consumer.woken()  # fetch (and register) again
            # (Re)subscribed: anything announced while we were away is unknown.
            self.timer.force()
        elif kind == "message" and channel == self.wake_channel:
            if item["data"] == b"-1":
                self.timer.force()  # the lease holder left: take the lease over
            else:
                self.consumer.woken()
        elif kind == "message":
            try:
                due_ms = int(item["data"])
            except (TypeError, ValueError):
                self.logger.warning("Ignoring malformed announcement %r on %r.", item["data"], self.keys.channel)
                self.timer.force()
                return
            self.consumer.reset_backoff()
            if due_ms > 0:  # 0: a message is ready (enqueue.lua); fetching is enough
                self.timer.announce(due_ms)

    def transfer(self) -> None:
        """Run the transfer script until no full batch moves (or another consumer holds
        the lease), then follow the lease: listen for announcements while holding it.

        With ``wait_for_replicas``, a transfer too few replicas acknowledged in time is
        still taken as done (its messages are on the primary's ready queue; holding them
        back would only delay them); :class:`NotReplicated` is raised at the end, so the
        caller transfers, and waits, again soon."""
        unreplicated: TransferResult | None = None
        for _ in range(MAX_TRANSFER_CALLS_PER_TICK):
            # What its Worker's idle threads can start now, within its free prefetch.
            own_slots = self.consumer.can_start()
            compare = own_slots > 0 and self.consumer.long_jobs
            # A tie with the idlest other consumer goes either way, at random (KEEP_TIES): a
            # share for both when both are idle at every due time (say, CPU-bound jobs
            # shorter than the gap between them).
            keep_ties = compare and random.random() < KEEP_TIES
            with self.broker.held.lock(self.queue_name):
                started = self.timer.clock()
                try:
                    result = self.scripts.transfer(
                        self.keys,
                        limit=self.broker.settings.transfer_batch_size,
                        trim_budget=TRIM_BUDGET,
                        compact_step=COMPACT_STEP,
                        compact_slack=COMPACT_SLACK,
                        token=self.token,
                        lease_ms=self.broker.settings.transfer_lease,
                        own_slots=own_slots,
                        worker_id=self.consumer.worker_id,
                        listening=self.wake_ready,
                        compare=compare,
                        keep_ties=keep_ties,
                        window_ms=self.broker.settings.dedupe_window,
                        upkeep_ms=self.upkeep_ms,
                    )
                except CONNECTION_ERRORS:
                    # It may have run and handed messages off into our ack set.
                    self.consumer.lost_reply()
                    self.standing_by = None
                    raise
                self.broker.held.add(self.queue_name, (i for i, data in result.fetched if data is not None))
            self.timer.record(result, started)
            self._took_over(result)
            if not result.replicated:
                unreplicated = result
            if result.fetched:
                self.consumer.take(result.fetched)
            if result.moved and own_slots:
                # Out of the idle registry (we fetch what moved), or listed in it with
                # what we can start still.
                self.consumer.note_idle(result.registered, own_slots - len(result.fetched))
            if result.moved:
                self.logger.debug("Moved %d scheduled messages to queue %r.", result.moved, self.queue_name)
                self.broker.notify_transfer(self.queue_name, result.lateness_ms)
            if result.schedules:
                self.consumer.guarded(self.broker.schedules.attend, self.keys, result.schedules)
            if result.dead:
                self.logger.error(
                    "Moved %d scheduled entries without a message to the dead letters of queue %r.",
                    result.dead,
                    self.queue_name,
                )
            if result.moved + result.dead < self.broker.settings.transfer_batch_size:
                break
        else:
            self.timer.force()
        self._follow_lease()
        if unreplicated is not None:
            raise NotReplicated.describe(
                "A transfer",
                unreplicated.replicas,
                self.broker.settings.wait_for_replicas,
                self.broker.settings.wait_timeout,
            )


def _close_quietly(pubsub: Any) -> None:
    try:
        pubsub.close()
    except Exception:  # pragma: no cover - closing a broken socket
        pass
