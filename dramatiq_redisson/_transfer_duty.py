"""A consumer's transfer duty: the lease, the transfer timer's ticks, the transfers.

:class:`TransferDuty` moves the queue's due messages to its ready queue. Of all consumers
of a queue, the one holding the transfer lease (see transfer.lua) listens to the queue's
channel and transfers at the due time the last transfer returned, when an earlier due
time is announced, and at least every third of the lease (which renews it); the others
stand by and take the lease over when it lapses. Its pub/sub (the consumer's wake channel,
and the queue's channel while it holds the lease) is its ``_subscription.Subscription``,
whose every call returns what it heard, which the duty acts on (:meth:`TransferDuty.act`).

It works for one consumer, given as a :class:`Sink`: what the consumer can start, where the
messages a transfer hands off go, and what it hears (wake-ups, announcements). Its
failures follow the consumer's policy (``_backoff.Failures``); what it uses of the broker
is its :class:`DutyHost`. It imports nothing of the consumer.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import redis

from ._errors import NotReplicated
from ._logs import CONNECTION_ERRORS
from ._subscription import ANNOUNCED, DROPPED, FORCE, WOKEN, Subscription
from ._timer import TransferTimer
from ._tuning import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET, UPKEEP_INTERVAL_MS

if TYPE_CHECKING:
    from ._backoff import Failures
    from ._held import HeldMessages
    from ._keys import QueueKeys
    from ._liveness import Liveness
    from ._settings import BrokerSettings
    from ._start_gate import StartGate
    from .connection._topology import Topology
    from .scripts._calls import Scripts, TransferResult

#: Most transfer calls in one tick before the consumer hands back control.
MAX_TRANSFER_CALLS_PER_TICK = 20

#: How often the lease holder keeps a message on a tie with the idlest other consumer
#: (see transfer.lua's Placement). Below one half: a process that runs jobs runs its timer
#: later (its threads share one interpreter lock with it), so the holder leans on the
#: others, and yet no process runs most of the work.
KEEP_TIES = 0.3


def lapsed_renewal(lease_until_ms: int, taken_at_ms: int, lease_ms: int) -> int | None:
    """When the holder of a lease that ended at ``lease_until_ms`` last renewed it, if a
    consumer that took it over at ``taken_at_ms`` (server epoch ms) found it lapsed: taken
    at or after its end, within half a lease. ``None`` for a lease released early (a clean
    stop) or taken over long after its end (the server was away)."""
    if 0 <= taken_at_ms - lease_until_ms <= lease_ms // 2:
        return lease_until_ms - lease_ms
    return None


class Sink(Protocol):
    """The consumer a transfer duty works for, as the duty sees it: what it can take,
    where the messages a transfer hands off go, and what it hears. Nothing else
    (``tests/test_shape.py`` checks it)."""

    @property
    def long_jobs(self) -> bool:
        """Whether its jobs take time (transfers then place messages by idle threads)."""
        ...

    def handoff_slots(self) -> int:
        """How many moved messages a transfer may hand off to it now (what it can start,
        or none: see ``RedissonConsumer.handoff_slots``)."""
        ...

    def transferred(self, result: TransferResult, own_slots: int) -> None:
        """A transfer call ran, asked to hand off up to ``own_slots``: take what it handed
        off, note its listing in the idle registry, attend its schedules."""
        ...

    def lost_reply(self) -> None:
        """A transfer's reply was lost: it may have handed messages into the ack set."""
        ...

    def note_idle(self, registered: bool, score: int = 0) -> None:
        """Its listing in the idle registry (here: dropped with the subscription)."""
        ...

    def woken(self) -> None:
        """A wake-up came (or the wake channel was subscribed): fetch now."""
        ...

    def reset_backoff(self) -> None:
        """Something was announced on the queue: a short fetch backs off from scratch."""
        ...


class DutyHost(Protocol):
    """What a transfer duty and its subscription use of the broker: the scripts, the held
    ids, the transfer listeners, and (its subscription's) topology, liveness and start
    gate; and its six settings (``transfer_lease``, ``safety_interval``,
    ``transfer_batch_size``, ``dedupe_window``, ``wait_for_replicas``, ``wait_timeout``).
    Nothing else (``tests/test_shape.py`` checks it)."""

    held: HeldMessages
    liveness: Liveness
    redisson_scripts: Scripts
    start_gate: StartGate
    topology: Topology

    @property
    def settings(self) -> BrokerSettings: ...

    def notify_transfer(self, queue_name: str, lateness_ms: list[int]) -> None: ...


class TransferDuty:
    """The transfers and lease of one consumer, and its subscription (see the module).

    Parameters:
      host: The broker (see :class:`DutyHost`).
      sink: The consumer it works for.
      failures: The consumer's error and back-off policy.
      keys: The consumer's queue.
      queue_name: Its name.
      token: The consumer's name in the lease and the registries.
      wake_channel: The consumer's wake channel.
      worker_id: The consumer's worker (its ack set).
      lapsed: Called ``lapsed(holder_token, renewed_ms=...)`` when the duty took over a
        lease whose holder stopped renewing it (the queue's reaper).
      logger_name: The consumer's logger (one logger per consumer).
    """

    def __init__(
        self,
        host: DutyHost,
        sink: Sink,
        failures: Failures,
        keys: QueueKeys,
        *,
        queue_name: str,
        token: str,
        wake_channel: str,
        worker_id: str,
        lapsed: Callable[..., None],
        logger_name: str,
    ) -> None:
        self.host = host
        self.sink = sink
        self.failures = failures
        self.keys = keys
        self.queue_name = queue_name
        self.token = token
        self.worker_id = worker_id
        self.lapsed = lapsed
        self.logger = logging.getLogger(logger_name)
        self.timer = TransferTimer(host.settings.safety_interval, lease_ms=host.settings.transfer_lease)
        #: The consumer's pub/sub (see ``_subscription``).
        self.subscription = Subscription(
            host, failures, keys, token=token, wake_channel=wake_channel, worker_id=worker_id, logger_name=logger_name
        )
        #: How often (ms) a transfer also does the backup list's upkeep (a sharded queue's
        #: shards take turns: see ``sharding._consumer``).
        self.upkeep_ms = UPKEEP_INTERVAL_MS
        #: While standing by: the holder's token and when its lease ends (server epoch
        #: ms), as the last transfer call saw them over a connection that has not failed
        #: since (see :meth:`_took_over`).
        self.standing_by: tuple[str, int] | None = None

    # -- what the subscription heard -------------------------------------------------

    def act(self, heard: int) -> None:
        """Act on what the subscription heard (the bits of ``_subscription``)."""
        if not heard:
            return
        if heard & DROPPED:
            self.standing_by = None  # the server may have restarted: a lapse says nothing
            self.sink.note_idle(False)
        if heard & WOKEN:
            self.sink.woken()
        if heard & ANNOUNCED:
            self.sink.reset_backoff()
            due_ms = self.subscription.take_announced()
            if due_ms > 0:  # 0: a message is ready (enqueue.lua); fetching is enough
                self.timer.announce(due_ms)
        if heard & FORCE:
            self.timer.force()

    @property
    def wake_ready(self) -> bool:
        """The wake channel's subscription is confirmed: fetches may register as idle."""
        return self.subscription.wake_ready

    @property
    def listening(self) -> bool:
        """Subscribed: an announcement or a wake-up ends an idle wait."""
        return self.subscription.pubsub is not None

    def listen(self, now: float) -> None:
        """(Re)subscribe when due, poll while unsubscribed, and act on what was heard."""
        self.act(self.subscription.listen(now, self.timer.owner))

    def wait(self, seconds: float) -> None:
        """Wait up to ``seconds`` for an announcement or a wake-up, and act on it (see
        ``Subscription.wait``)."""
        self.act(self.subscription.wait(seconds, self.timer.seconds_until_due()))

    def drain(self) -> None:
        """Act on every pub/sub item already received."""
        self.act(self.subscription.drain())

    def handle(self, item: dict[str, Any] | None) -> None:
        """Act on one pub/sub item."""
        self.act(self.subscription.handle(item))

    def check_subscription_if_due(self, now: float) -> None:
        """Is the subscription still listed where our commands go? (Upkeep: run off the
        due path; see ``Subscription.check_if_due``.)"""
        self.act(self.subscription.check_if_due(now))

    def resubscribe_now(self) -> None:
        """The server is back: subscribe at the next tick, whatever the back-off."""
        self.subscription.resubscribe_now()

    def close(self) -> None:
        self.subscription.close()

    def share_upkeep(self, shards: int) -> None:
        """The duty is one of a sharded queue's ``shards``, which take turns at the backup
        list's upkeep (trim and compaction, in the transfer script): it does it every
        ``shards`` upkeep intervals, so that together they do it as often as one queue."""
        self.upkeep_ms = UPKEEP_INTERVAL_MS * shards

    # -- the transfers ---------------------------------------------------------------

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
            self.failures.log(e)
            self.timer.retry_in(self.failures.transfers.step())
        else:
            self.failures.transfers.reset()

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
        renewed_ms = lapsed_renewal(lease_until, result.server_now_us // 1000, self.host.settings.transfer_lease)
        if holder != self.token and renewed_ms is not None:
            self.lapsed(holder, renewed_ms=renewed_ms)

    def transfer(self) -> None:
        """Run the transfer script until no full batch moves (or another consumer holds
        the lease), then follow the lease: listen for announcements while holding it.

        With ``wait_for_replicas``, a transfer too few replicas acknowledged in time is
        still taken as done (its messages are on the primary's ready queue; holding them
        back would only delay them); :class:`NotReplicated` is raised at the end, so the
        caller transfers, and waits, again soon."""
        unreplicated: TransferResult | None = None
        held = self.host.held
        for _ in range(MAX_TRANSFER_CALLS_PER_TICK):
            settings = self.host.settings  # (read at use: a broker's settings can be set)
            # What its Worker's idle threads can start now, within its free prefetch (none
            # while a message it put back for an unknown actor comes due).
            own_slots = self.sink.handoff_slots()
            compare = own_slots > 0 and self.sink.long_jobs
            # A tie with the idlest other consumer goes either way, at random (KEEP_TIES): a
            # share for both when both are idle at every due time (say, CPU-bound jobs
            # shorter than the gap between them).
            keep_ties = compare and random.random() < KEEP_TIES
            with held.lock(self.queue_name):
                started = self.timer.clock()
                try:
                    result = self.host.redisson_scripts.transfer(
                        self.keys,
                        limit=settings.transfer_batch_size,
                        trim_budget=TRIM_BUDGET,
                        compact_step=COMPACT_STEP,
                        compact_slack=COMPACT_SLACK,
                        token=self.token,
                        lease_ms=settings.transfer_lease,
                        own_slots=own_slots,
                        worker_id=self.worker_id,
                        listening=self.subscription.wake_ready,
                        compare=compare,
                        keep_ties=keep_ties,
                        window_ms=settings.dedupe_window,
                        upkeep_ms=self.upkeep_ms,
                    )
                except CONNECTION_ERRORS:
                    # It may have run and handed messages off into our ack set.
                    self.sink.lost_reply()
                    self.standing_by = None
                    raise
                held.add(self.queue_name, (i for i, data in result.fetched if data is not None))
            self.timer.record(result, started)
            self._took_over(result)
            if not result.replicated:
                unreplicated = result
            # What it handed off, the idle registry's listing, the schedules it chained.
            self.sink.transferred(result, own_slots)
            if result.moved:
                self.logger.debug("Moved %d scheduled messages to queue %r.", result.moved, self.queue_name)
                self.host.notify_transfer(self.queue_name, result.lateness_ms)
            if result.dead:
                self.logger.error(
                    "Moved %d scheduled entries without a message to the dead letters of queue %r.",
                    result.dead,
                    self.queue_name,
                )
            if result.moved + result.dead < settings.transfer_batch_size:
                break
        else:
            self.timer.force()
        self.act(self.subscription.follow_lease(self.timer.owner, self.queue_name))
        if unreplicated is not None:
            raise NotReplicated.describe(
                "A transfer",
                unreplicated.replicas,
                settings.wait_for_replicas,
                settings.wait_timeout,
            )
