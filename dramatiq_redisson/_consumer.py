"""The consumer returned by :meth:`RedissonBroker.consume`: fetch, ack, nack, requeue.

:class:`RedissonConsumer` is Dramatiq's consumer interface over the ready queue (fetch.lua,
ack.lua, nack.lua, requeue.lua). It is made of parts, each given what it uses: its
transfer duty (``_transfer_duty.TransferDuty``: the lease, the transfers and its
subscription), which each tick runs first, and which it feeds as its ``Sink``; its upkeep
(``_upkeep.Upkeep``: reconciling its worker's ack set after a lost reply, heartbeats, the
migration of the built-in broker's ``.DQ`` entries, requeueing dead workers' messages);
and the error and back-off policy all of them share (``_backoff.Failures``).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import redis
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message

from ._backoff import Failures
from ._errors import NotReplicated
from ._liveness import LivenessHost, Reaper
from ._logs import CONNECTION_ERRORS, logger_for
from ._pacing import Fetch, Pacing, Wait
from ._transfer_duty import DutyHost, TransferDuty
from ._unknown_actors import UnknownActors, UnknownActorsHost
from ._upkeep import Upkeep, UpkeepHost
from ._worker_threads import relist
from .scripts._calls import IdleScore

if TYPE_CHECKING:
    from ._held import HeldMessages
    from ._keys import QueueKeys
    from ._settings import BrokerSettings
    from ._worker_threads import WorkerThreads
    from .connection._commands import Commands
    from .scripts._calls import Scripts, TransferResult

#: An ack or nack that fails is tried again every FINISH_RETRY_PAUSE s, for up to
#: FINISH_RETRY_FOR s, before it is left to Dramatiq's own retry (every 5 s): see _finish.
FINISH_RETRY_PAUSE = 0.1
FINISH_RETRY_FOR = 30.0

#: After a lost connection or a timeout, the consumer reconciles its ack set (and beats
#: its heartbeat) again this soon (ms) instead of a ``safety_interval`` later.
RECONCILE_AFTER_ERROR = 1000

#: Upkeep (see RedissonConsumer.run_upkeep) waits while a due time is closer than this (ms):
#: its calls take about a round trip each, and would make that transfer late.
UPKEEP_GAP = 3

#: ... but never longer than this (ms) in a row: at high rates gaps are rare.
MAX_UPKEEP_DEFER = 250

#: While every thread of the fleet is busy, a consumer queues up to this many messages per
#: thread of its Worker behind them (the rest wait in the ready queue, for whichever
#: thread frees up first): a thread that frees up starts the next one without a round
#: trip, and the order across processes stays close to first come, first served.
BACKLOG_DEPTH = 1

#: Numbers the consumers of a process, so that each has a token of its own.
_consumer_numbers = itertools.count(1)


class Freed(Protocol):
    """What :attr:`RedissonConsumer.capacity_freed` is: set when a thread frees up, waited
    on while every thread is busy (a ``threading.Event``, or a sharded queue's shared one)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class ConsumerHost(DutyHost, UpkeepHost, LivenessHost, UnknownActorsHost, Protocol):
    """What a consumer reads of its broker: its worker id, a queue's keys, the scripts it
    runs, the held ids, its client (where the server is, for its failure policy), its ack
    and nack, and its settings; the rest of the broker is what its parts use (its
    transfer duty's :class:`._transfer_duty.DutyHost`, its upkeep's
    ``_upkeep.UpkeepHost``, its reaper's ``_liveness.LivenessHost``, what it puts back
    for an actor its process has not declared ``_unknown_actors.UnknownActorsHost``),
    passed on whole.
    Nothing else (``tests/test_shape.py`` checks it)."""

    broker_id: str
    client: Commands
    held: HeldMessages
    redisson_scripts: Scripts

    @property
    def settings(self) -> BrokerSettings: ...

    def keys(self, queue_name: str) -> QueueKeys: ...

    def do_ack(self, queue_name: str, redis_message_id: str, idle: IdleScore | None = None) -> int: ...

    def do_nack(self, queue_name: str, redis_message_id: str, final: bytes | None = None) -> int: ...


class RedissonConsumer(Consumer):
    """Fetches ready messages and, on the side, does its share of the queue's transfers
    (:attr:`duty`).

    Fleet cost stays flat in the number of worker processes:

    - One consumer per queue holds the transfer lease and runs the timer; the others
      stand by (see :mod:`._transfer_duty`).
    - A consumer whose fetch came up short is registered as idle (fetch.lua) and waits
      on its own wake channel; enqueues and transfers wake only as many idle consumers
      as the messages they make ready need (see include/wake.lua), instead of all of them.

    Idle waits happen on the pub/sub connection, so an announcement or a wake-up ends
    them at once.
    """

    #: The class of :attr:`duty` (a benchmark swaps in Redisson's original transfer).
    transfer_duty_class: type[TransferDuty] = TransferDuty

    def __init__(
        self,
        broker: ConsumerHost,
        queue_name: str,
        prefetch: int,
        timeout: int,
        *,
        threads: WorkerThreads | None = None,
        freed: Freed | None = None,
    ) -> None:
        self.logger = logger_for(type(self))
        self.broker = broker
        self.keys = broker.keys(queue_name)
        self.queue_name = queue_name
        self.worker_id = broker.broker_id
        #: This consumer's name in the lease, the registries and its wake channel: host and
        #: pid tell an operator which process holds the lease (forked worker processes
        #: share a broker id, so the pid also keeps their tokens apart).
        self.token = consumer_token(broker.broker_id)
        self.wake_channel = self.keys.wake_channel(self.token)
        self.prefetch = prefetch
        self.timeout = timeout

        self.message_cache: deque[tuple[str, bytes]] = deque()
        #: Messages handed to Dramatiq and not finished: redis message id -> when it was
        #: handed over (monotonic s), oldest first.
        self.in_flight: dict[str, float] = {}
        #: Set by close(): a failing ack or nack is no longer retried here (see _finish).
        self.closing = False
        #: Set when a thread frees up (``freed``: one the consumers of a sharded queue share).
        self.capacity_freed: Freed = threading.Event() if freed is None else freed
        #: When to fetch, how many, and how long to wait otherwise (see ``_pacing``).
        self.pacing = Pacing(timeout, min(timeout, broker.settings.safety_interval))
        #: The threads of the Worker this consumer feeds, when it has one: it takes only
        #: what they can start now (see :mod:`._worker_threads`); None: up to its prefetch.
        self.threads = threads
        #: Since when (monotonic s) upkeep has waited for a gap between due times.
        self.upkeep_deferred_since: float | None = None

        #: What failed calls do: the log, the back-off, the wait for the server (see _failed).
        self.failures = Failures(broker.client, self.logger, queue_name)
        #: Puts back the messages of dead workers while this consumer holds the lease.
        self.reaper = Reaper(broker, queue_name)
        #: The queue's transfers, the lease and the subscriptions (see ``_transfer_duty``).
        self.duty = self.transfer_duty_class(
            broker,
            self,
            self.failures,
            self.keys,
            queue_name=queue_name,
            token=self.token,
            wake_channel=self.wake_channel,
            worker_id=self.worker_id,
            lapsed=self.reaper.lapsed,
            logger_name=self.logger.name,
        )
        self.timer = self.duty.timer
        #: What keeps it sound but delivers nothing now (see ``_upkeep``).
        self.upkeep = Upkeep(
            broker,
            self.failures,
            self.keys,
            queue_name=queue_name,
            worker_id=self.worker_id,
            timer=self.timer,
            reaper=self.reaper,
            logger_name=self.logger.name,
        )
        #: Puts back the messages for actors this process has not declared (see ``_unknown_actors``).
        self.unknown_actors = UnknownActors(broker, self.keys, worker_id=self.worker_id, logger_name=self.logger.name)
        if threads is not None:
            threads.attach(self)

    @property
    def outstanding_message_count(self) -> int:
        return self.holding

    @property
    def free_slots(self) -> int:
        """How many more messages this consumer may hold (its prefetch left)."""
        return max(0, self.prefetch - self.outstanding_message_count)

    @property
    def holding(self) -> int:
        """Messages this consumer holds: handed to Dramatiq and not finished, or fetched and
        not handed over yet (each takes one of the Worker's threads)."""
        return len(self.in_flight) + len(self.message_cache)

    def can_start(self, finishing: int = 0) -> int:
        """How many more messages to take now (``finishing``: as if that many of its
        messages had finished; see :meth:`._worker_threads.WorkerThreads.room`)."""
        free = max(0, self.free_slots + finishing)
        return free if self.threads is None else self.threads.room(free, finishing)

    def handoff_slots(self) -> int:
        """How many messages a transfer may hand off to it now: what it can start, but none
        while a message it put back for an actor its process has not declared comes due
        (it would hand that one back to itself: see :meth:`._unknown_actors.UnknownActors.expects`)."""
        if self.unknown_actors.dues and self.unknown_actors.expects(self.timer.server_now_ms()):
            return 0
        return self.can_start()

    def backlog_room(self) -> int:
        """While every thread is busy and messages wait (``Pacing.backlog``): how many more to
        queue behind its Worker's threads, up to :data:`BACKLOG_DEPTH` each."""
        free = self.free_slots
        return free if self.threads is None else self.threads.room(free, depth=BACKLOG_DEPTH)

    @property
    def long_jobs(self) -> bool:
        """Whether its jobs take time (see :meth:`._worker_threads.WorkerThreads.takes_time`)."""
        return self.threads is not None and self.threads.takes_time(self.in_flight)

    def thread_freed(self) -> None:
        """A thread of its Worker finished a message: it may take another."""
        self.capacity_freed.set()

    @property
    def holds_lease(self) -> bool:
        """Whether it holds its queue's transfer lease (as its last transfer found)."""
        return self.timer.owner

    def lost_reply(self) -> None:
        """A call that may have taken messages into this worker's ack set lost its reply:
        reconcile the ack set at the next upkeep (see ``Upkeep.reconcile``)."""
        self.upkeep.lost_reply()

    def transferred(self, result: TransferResult, own_slots: int) -> None:
        """A transfer call of its duty ran, asked to hand off up to ``own_slots``: cache
        what it handed off, note its listing, and attend the schedules it chained."""
        if result.fetched:
            self.take(result.fetched)
        if result.moved and own_slots:
            # Out of the idle registry (we fetch what moved), or listed in it with
            # what we can start still.
            self.note_idle(result.registered, own_slots - len(result.fetched))
        if result.schedules:
            self.upkeep.attend(result.schedules)
        if self.unknown_actors.dues:
            self.unknown_actors.passed(result.server_now_us // 1000)

    def reset_backoff(self) -> None:
        """Something was announced on the queue: the next short fetch backs off from scratch."""
        self.pacing.announced()

    def woken(self) -> None:
        """A wake-up came (or the wake channel was subscribed): fetch now, and register
        as idle again if the fetch comes up short."""
        self.pacing.woken()

    # -- the Consumer interface ------------------------------------------------

    def __next__(self) -> MessageProxy | None:
        while True:
            try:
                if self.message_cache:
                    redis_message_id, data = self.message_cache.popleft()
                    message = self._decode(redis_message_id, data)
                    if message is None:
                        continue
                    # (A Worker's consumer: one iterated by other code gets every message.)
                    unknown = self.threads is not None and not self.unknown_actors.knows(message.actor_name)
                    if unknown and self._put_back(redis_message_id, message):
                        continue
                    self.in_flight[redis_message_id] = time.monotonic()
                    return MessageProxy(message)

                self.tick()
                if self.message_cache:
                    continue  # the transfer handed messages off to us
                step = self.pacing.next_step(
                    time.monotonic(),
                    can_start=self.can_start(),
                    free_slots=self.free_slots,
                    backlog_room=self.backlog_room,
                    until_due=self.timer.seconds_until_due(),
                    hears_announcements=self.timer.owner and self.duty.listening,
                )
                if isinstance(step, Fetch):
                    got = self._fetch(step.count, listed=step.listed)
                    self.failures.recovered()
                    if got or not step.listed:
                        continue
                    wait = self.pacing.after_short_fetch(time.monotonic(), until_due=self.timer.seconds_until_due())
                    if wait is None:
                        continue  # listed: wait for a wake-up
                    step = wait
                if self._wait(step):
                    return None
            except (*CONNECTION_ERRORS, redis.ResponseError, NotReplicated) as e:
                # Dramatiq would restart the whole consumer after 3 s; instead keep
                # this one, back off briefly and go on with what still works. (A Sentinel
                # failover shows as connection errors: MasterNotFoundError, and a demoted
                # primary's READONLY, which redis-py turns into a ConnectionError.)
                self._failed(e)
            return None

    def _wait(self, step: Wait) -> bool:
        """Carry out a wait of the pacing; returns whether ``__next__`` returns now."""
        self.failures.recovered()
        if step.on == "wake":
            self.duty.wait(step.seconds)
            return step.then == "return" or (step.then == "return_if_listed" and self.pacing.registered)
        # A thread: cleared first, then checked, so that one freed in between is not missed.
        # (The lease holder also hears its announcements every BUSY_LISTEN ms meanwhile.)
        self.capacity_freed.clear()
        if self.can_start() == 0:
            self.capacity_freed.wait(step.seconds)
            self.duty.drain()
        return step.then == "return"

    def ack(self, message: MessageProxy) -> None:
        listed, idle = self.pacing.listing, self._idle_score_after_ack()

        def do_ack(queue_name: str, redis_message_id: str) -> int:
            acked = self.broker.do_ack(queue_name, redis_message_id, idle)
            if idle is not None:
                self.pacing.acked(listed, idle.score)
            return acked

        self._finish(message, do_ack if idle is not None else self.broker.do_ack)

    def _idle_score_after_ack(self) -> IdleScore | None:
        """The score an ack should list this consumer with, its thread free again; None
        when its listing is good enough (see :func:`._worker_threads.relist`)."""
        if not self.pacing.registered or self.threads is None:
            return None
        after = self.can_start(finishing=1)
        if not relist(self.pacing.idle_score, after, holder=self.timer.owner, long_jobs=self.long_jobs):
            return None
        return IdleScore(self.token, after, self.wake_channel)

    def nack(self, message: MessageProxy) -> None:
        # The dead letter keeps the message as it failed: Dramatiq's Retries has recorded
        # the final traceback (and the retry count) in its options by now.
        try:
            final: bytes | None = message.encode()  # (the proxy's message's)
        except Exception:
            self.logger.exception("Could not encode failed message %r; its dead letter keeps it as fetched.", message)
            final = None
        redis_message_id = message.options["redis_message_id"]
        if final is not None:
            self.broker.held.note_failed(redis_message_id, final)
        try:
            self._finish(message, self.broker.do_nack)
        finally:
            self.broker.held.forget_failed(redis_message_id)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        ids = [message.options["redis_message_id"] for message in messages]
        if ids:
            self.logger.debug("Re-enqueueing %r on queue %r.", ids, self.queue_name)
            try:
                self.broker.redisson_scripts.requeue(self.keys, self.worker_id, ids)
            except CONNECTION_ERRORS as e:
                raise ConnectionClosed(e) from None
            finally:
                # Put back, acked meanwhile, or (on a failure) left in the ack set for
                # a reconciliation to put back: no longer held either way.
                self.broker.held.discard(self.queue_name, ids)

    def released(self, messages: Iterable[MessageProxy]) -> None:
        """These messages, handed to Dramatiq, were requeued unprocessed by whoever holds
        them (a sharded queue's consumer): no longer in flight here."""
        for message in messages:
            self.in_flight.pop(message.options["redis_message_id"], None)

    def close(self) -> None:
        self.closing = True
        scripts = self.broker.redisson_scripts
        try:
            # Leave the idle registry and hand the transfer lease to another consumer now,
            # not when it would lapse.
            scripts.release(self.keys, self.token)
        except (*CONNECTION_ERRORS, redis.ResponseError):
            pass  # the lease lapses by itself; a stale idle entry is skipped when woken
        try:
            cached = [redis_message_id for redis_message_id, _ in self.message_cache]
            self.message_cache.clear()
            if cached:
                scripts.requeue(self.keys, self.worker_id, cached)
                self.broker.held.discard(self.queue_name, cached)
        except (*CONNECTION_ERRORS, redis.ResponseError):
            # Unheld, they are requeued by this worker's next consumer on the queue
            # (its first reconciliation), or after the heartbeat timeout if none comes.
            self.broker.held.discard(self.queue_name, cached)
            self.logger.warning("Could not requeue %d prefetched messages on queue %r.", len(cached), self.queue_name)
        finally:
            if self.threads is not None:
                self.threads.detach(self)
            self.duty.close()  # (and off the list of subscribed consumers)
            self.upkeep.stop()

    # -- one tick of the timer -------------------------------------------------

    def tick(self) -> None:
        """Do the timer's work that is due: subscribe, transfer; then, off the due path,
        the upkeep (see :meth:`run_upkeep`)."""
        now = time.monotonic()
        self.duty.listen(now)
        # Not in __init__, which stays free of network calls (see ``_start_gate``).
        self.upkeep.start()
        self.duty.transfer_if_due()
        if self.message_cache or self.timer.seconds_until_due() < UPKEEP_GAP / 1000:
            # Messages to hand to Dramatiq first, or a due time too close: upkeep waits for
            # a gap, but never longer than MAX_UPKEEP_DEFER.
            if self.upkeep_deferred_since is None:
                self.upkeep_deferred_since = now
            if now - self.upkeep_deferred_since < MAX_UPKEEP_DEFER / 1000:
                return
        self.upkeep_deferred_since = None
        self.run_upkeep(now)

    def run_upkeep(self, now: float) -> None:
        """What keeps the consumer sound but delivers nothing now: the subscription check,
        then its :attr:`upkeep` (reconciling, the legacy migration, the dead workers'
        check, the heartbeat and maintenance). Run after the transfer, in a gap between
        due times (see :meth:`tick`), so that none of it stands between a due message and
        its worker thread. A lost connection stops them all (see __next__)."""
        self.duty.check_subscription_if_due(now)
        self.upkeep.run(now)

    def _fetch(self, count: int, *, listed: bool = True) -> bool:
        """Fetch up to ``count`` ready messages into the cache; returns whether any came.
        ``listed``: the fetch lists this consumer in the idle registry with what it can
        start still; else (filling its prefetch while every thread of the fleet is busy,
        see :attr:`backlog`) it leaves the listing alone.

        While its wake channel is subscribed, a short fetch registers this consumer as
        idle (``registered``): it then waits for a wake-up instead of polling with
        back-off, and polls only once per ``timeout`` (the Worker's ``worker_timeout``),
        as an idle built-in consumer does: a wake-up may be lost, and messages pushed by
        something that wakes nobody (the built-in broker's producers during a migration,
        a script of an older version) must not wait longer than they used to."""
        token = self.token if self.duty.wake_ready and listed else ""
        held = self.broker.held
        with held.lock(self.queue_name):
            try:
                fetched = self.broker.redisson_scripts.fetch(self.keys, self.worker_id, count, token, self.token)
            except CONNECTION_ERRORS:
                # The script may have run: its ids would be stranded in our ack set.
                self.upkeep.lost_reply()
                raise
            if fetched is None:
                self._note_paused(True)
                self.pacing.fetched_paused()
                return False
            held.add(self.queue_name, (i for i, data in fetched if data is not None), slots=fetched.uses_slots)
        self._note_paused(False)
        # Listed (when ``listed``) with what it can start still (0 when it took all it
        # asked for); a rate limit's wait_ms: this consumer is the one that sleeps until
        # the next start is allowed (fetch.lua), and fetches again then.
        self.pacing.fetched(
            time.monotonic(),
            more=fetched.more,
            listed=listed,
            registered=bool(token),
            score=count - len(fetched),
            wait_ms=fetched.wait_ms,
        )
        if not fetched:
            return False
        self.take(fetched)
        return True

    def _note_paused(self, paused: bool) -> None:
        if paused != self.pacing.paused:
            if paused:
                self.logger.info(
                    "Queue %r is paused: starting none of its messages until it is resumed.", self.queue_name
                )
            else:
                self.logger.info("Queue %r is resumed.", self.queue_name)

    def note_idle(self, registered: bool, score: int = 0) -> None:
        """A script listed this consumer in the idle registry with ``score`` (what it can
        start still), or took it out."""
        self.pacing.listed(time.monotonic(), registered, score)

    # -- failures ---------------------------------------------------------------------

    def _failed(self, error: Exception) -> None:
        """A call failed: log it, back off, and let ``__next__`` return so Dramatiq's
        consumer thread stays responsive (see ``Failures.failed``)."""
        if isinstance(error, CONNECTION_ERRORS):
            # A call whose reply was lost may run on the server after the first
            # reconciliation that follows (a stalled server works off its buffered
            # commands in its own order): reconcile again soon, not a safety interval later.
            self.upkeep.soon(RECONCILE_AFTER_ERROR / 1000)
        if self.failures.failed(error):
            self.duty.resubscribe_now()  # the server is back: subscribe again at once, too

    # -- messages ----------------------------------------------------------------

    def take(self, fetched: list[tuple[str, bytes | None]]) -> None:
        """Cache fetched messages (a fetch's, or those a transfer handed off to us)."""
        self.pacing.took()
        for redis_message_id, data in fetched:
            if data is None:
                self.logger.warning(
                    "Message id %r on queue %r has no message data; dropping it.", redis_message_id, self.queue_name
                )
            else:
                self.message_cache.append((redis_message_id, data))

    def _decode(self, redis_message_id: str, data: bytes) -> Message[Any] | None:
        try:
            message = Message.decode(data)
        except Exception:
            self.logger.exception(
                "Could not decode message %r on queue %r; moving it to the dead letters.",
                redis_message_id,
                self.queue_name,
            )
            try:
                self.broker.do_nack(self.queue_name, redis_message_id)
            except (*CONNECTION_ERRORS, redis.ResponseError):
                # Unheld, the next reconciliation requeues it (and it is nacked then).
                self.broker.held.discard(self.queue_name, (redis_message_id,))
                self.upkeep.lost_reply()
                raise
            return None
        # The ack must name the entry this message was fetched as.
        if message.options.get("redis_message_id") != redis_message_id:
            message.options["redis_message_id"] = redis_message_id
        return message

    def _put_back(self, redis_message_id: str, message: Message[Any]) -> bool:
        """A message for an actor this process has not declared: put it back for another
        worker (True), or, its grace over, let Dramatiq dead-letter it (False; see
        :mod:`._unknown_actors`). A failed call leaves the copy in flight to the next
        reconciliation, which puts it back on the ready queue, or drops it if the
        put-back had replaced it already."""
        try:
            return self.unknown_actors.put_back(redis_message_id, message)
        except (*CONNECTION_ERRORS, redis.ResponseError, NotReplicated):
            self.broker.held.discard(self.queue_name, (redis_message_id,))
            self.upkeep.lost_reply()
            raise

    def _finish(self, message: MessageProxy, operation: Callable[[str, str], int]) -> None:
        """Ack or nack, retried every :data:`FINISH_RETRY_PAUSE` s for up to
        :data:`FINISH_RETRY_FOR` s while the server is away or refuses.

        Dramatiq retries a ConnectionClosed ack/nack until it goes through, but sleeps 5 s
        between tries in the worker thread itself: after a server restart that thread, and
        the messages waiting for it, would sit idle for up to 5 s. Both operations are
        idempotent (a repeat of one whose reply was lost changes nothing). A server error
        (a full server, a missing permission, a failover) is as transient as a lost
        connection, and giving up would strand the message."""
        redis_message_id = message.options["redis_message_id"]
        ended = time.monotonic()
        deadline = ended + FINISH_RETRY_FOR
        refused = False
        try:
            while True:
                try:
                    operation(self.queue_name, redis_message_id)
                    return
                except (*CONNECTION_ERRORS, redis.ResponseError) as e:
                    if isinstance(e, redis.ResponseError) and not refused:
                        refused = True
                        self.logger.error("Redis refused to finish message %r: %s", message.message_id, e)
                    if self.closing or time.monotonic() + FINISH_RETRY_PAUSE >= deadline:
                        raise ConnectionClosed(e) from None
                    time.sleep(FINISH_RETRY_PAUSE)
        finally:
            handed_at = self.in_flight.pop(redis_message_id, None)
            if self.threads is not None:
                # A thread is free: every queue's consumer (this one too) may start more.
                self.threads.freed(None if handed_at is None else ended - handed_at)
            else:
                self.capacity_freed.set()


def consumer_token(broker_id: str) -> str:
    """``host:pid:broker:n``, unique per consumer; never holds a space, ``{`` or ``}``
    (the lease value and the wake channel's hash tag depend on it)."""
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-._") or "host"
    return f"{host}:{os.getpid()}:{broker_id[:8]}:{next(_consumer_numbers)}"
