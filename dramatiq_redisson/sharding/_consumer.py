"""The consumer of a sharded queue (issue 36; see docs/sharding-design.md): one
:class:`._consumer.RedissonConsumer` per shard, each driven by a thread of its own, handing
its messages to the one consumer Dramatiq's Worker sees.

Dramatiq's Worker sends every ack and nack to the consumer of ``message.queue_name``, so a
sharded queue must be one consumer to it; each message is acked by the shard consumer that
fetched it. The shard consumers share the queue's prefetch: together they hold at most
``prefetch`` messages (fetched and not yet finished), whichever shards they come from, and
an ack in any shard lets every shard fetch again.

Each shard consumer keeps its own waits (its wake channel, its transfer timer) in a thread
of its own: idle, a process has one thread per shard waiting on its pub/sub connection.
Idle polls stay flat in the number of shards: shard 0 (the queue's own keys, where older
producers and the built-in broker's requeues land) polls once per worker timeout as an
unsharded queue does, and the other shards take turns, each every ``N - 1`` timeouts, so
a process sends two idle polls per timeout whatever N. A wake-up lost in transit (wake-ups
are the way a message reaches an idle consumer; a poll only covers a lost one) then waits
up to ``N - 1`` timeouts on those shards.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

import redis
from dramatiq.broker import Consumer, MessageProxy

from .._consumer import ConsumerHost, RedissonConsumer
from .._logs import CONNECTION_ERRORS, logger_for
from .._queue_names import shard_name
from .._worker_threads import WorkerThreads

if TYPE_CHECKING:
    from .._keys import QueueKeys
    from .._settings import BrokerSettings
    from ..admin._queue_admin import QueueAdmin
    from ..connection._commands import Commands
    from ..flow._queue_limits import Limits
    from ..scripts._calls import Scripts
    from ._shards import ShardRouter

#: After an unexpected error in a shard's thread, it waits this long (s) before going on.
ERROR_PAUSE = 1.0

#: A retired shard is dropped from the layout no sooner than this many safety intervals
#: after it was retired: every producer reads the layout again every safety interval, so
#: none sends to it any more.
DROP_AFTER = 3


class ShardedHost(ConsumerHost, Protocol):
    """What a sharded queue's consumer reads of its broker, besides what its shards'
    consumers do (:class:`.ConsumerHost`, passed on whole): the shard layout, the queue's
    limits, the admin side's flush (a drained shard's keys), and whether a shard holds
    anything (its keys, a script, a count). Nothing else (``tests/test_shape.py``
    checks it)."""

    admin: QueueAdmin
    client: Commands
    limits: Limits
    redisson_scripts: Scripts
    shard_router: ShardRouter

    @property
    def settings(self) -> BrokerSettings: ...

    def keys(self, queue_name: str) -> QueueKeys: ...


def _holds(broker: ShardedHost, name: str) -> bool:
    """Whether the shard ``name`` holds a message: scheduled, ready, in flight or dead."""
    keys = broker.keys(name)
    return bool(broker.redisson_scripts.pending(keys) or broker.client.zcard(keys.xq))


class _Freed:
    """What :attr:`RedissonConsumer.capacity_freed` is to the shard consumers of one queue:
    an ack in any shard wakes every shard waiting for room.

    A shared ``threading.Event`` would lose wake-ups: a shard that clears it before waiting
    can clear a ``set()`` another shard has not seen yet, which then waits a whole worker
    timeout with room free and its messages ready. Here each waiter wakes on any ``set()``
    after its own ``clear()``."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.generation = 0
        self.seen = threading.local()

    def set(self) -> None:
        with self.changed:
            self.generation += 1
            self.changed.notify_all()

    def clear(self) -> None:
        self.seen.generation = self.generation

    def wait(self, timeout: float | None = None) -> bool:
        seen = getattr(self.seen, "generation", self.generation)
        with self.changed:
            return self.changed.wait_for(lambda: self.generation != seen, timeout)


class _Budget:
    """The prefetch the shard consumers of one queue share."""

    def __init__(self) -> None:
        self.members: list[ShardConsumer] = []
        self.freed = _Freed()

    def join(self, member: ShardConsumer) -> None:
        self.members.append(member)

    def leave(self, member: ShardConsumer) -> None:
        self.members.remove(member)

    def outstanding(self) -> int:
        return sum(c.holding for c in self.members)


class ShardConsumer(RedissonConsumer):
    """One shard's consumer: counts the queue's messages in all its shards against the
    prefetch, and wakes with any shard's ack."""

    def __init__(
        self,
        broker: ConsumerHost,
        queue_name: str,
        prefetch: int,
        timeout: int,
        budget: _Budget,
        turns: int = 1,
        *,
        threads: WorkerThreads | None = None,
    ) -> None:
        super().__init__(broker, queue_name, prefetch, timeout, threads=threads, freed=budget.freed)
        self.budget = budget
        self.turns = 1
        self.take_turns(turns)
        budget.join(self)

    def take_turns(self, turns: int) -> None:
        """Idle, this shard polls once every ``turns`` timeouts (see the module): the poll
        of shard i of n falls in its turn, (i - 1) timeouts apart from the others', one
        every timeout in all."""
        self.turns = turns
        self.pacing.poll_interval = turns * min(self.timeout, self.broker.settings.safety_interval) / 1000

    def spread(self, index: int, count: int) -> None:
        """This is shard ``index`` of ``count``: its share of the queue's periodic work.

        * Idle polls: shard 0 every worker timeout, the others in turn (see the module).
        * The backup list's upkeep (trim and compaction, in the transfer script): every
          ``count`` upkeep intervals, so a queue's shards together do it as often as one
          unsharded queue (each moves 1/count of the messages, so a tick has as much to
          do as an unsharded queue's)."""
        self.take_turns(1 if index == 0 else count - 1)
        self.duty.share_upkeep(count)

    @property
    def free_slots(self) -> int:
        """Room left in the shared prefetch (what a transfer may hand this shard off)."""
        return max(0, self.prefetch - self.budget.outstanding())

    @property
    def outstanding_message_count(self) -> int:
        """The shared prefetch's messages, as the fetch loop sees them: while the process
        still holds at least half its prefetch, room for fewer than a quarter of it counts
        as none, so that the shards fetch several messages a call instead of racing for
        each slot an ack frees (each ack wakes every shard waiting for room)."""
        held = self.budget.outstanding()
        room = self.prefetch - held
        if 0 < room < self.prefetch // 4 and held >= self.prefetch // 2:
            return self.prefetch
        return held


class ShardedConsumer(Consumer):
    """Dramatiq's consumer of a sharded queue.

    It follows the queue's stored layout (read again every ``safety_interval``): a shard
    added by a process started with a higher count gets its consumer and thread here
    within about that long; a retired shard keeps its consumer until it holds nothing,
    and the process holding its transfer lease then takes it out of the layout (see
    :meth:`_drop_drained`)."""

    def __init__(
        self,
        broker: ShardedHost,
        queue_name: str,
        prefetch: int,
        timeout: int,
        *,
        threads: WorkerThreads | None = None,
    ) -> None:
        self.logger = logger_for(type(self))
        self.broker = broker
        #: The Worker's threads, which every shard's consumer fills (see :mod:`._worker_threads`).
        self.worker_threads = threads
        self.queue_name = queue_name
        self.prefetch = prefetch
        self.timeout = timeout
        self.budget = _Budget()
        self.ready: queue.Queue[MessageProxy] = queue.Queue()
        self.owner: dict[str, ShardConsumer] = {}
        self.stopping = threading.Event()
        self.shards: dict[str, ShardConsumer] = {}
        self.threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self.next_layout_at = 0.0
        #: The shards last given the queue's limits (:meth:`_limit`).
        self.limited: list[str] = []
        self._follow_layout()

    def _follow_layout(self) -> None:
        """Start a consumer for each shard the layout names and this one does not consume
        yet; stop those of shards it no longer names (dropped: they held nothing)."""
        interval = self.broker.settings.safety_interval / 1000
        self.next_layout_at = time.monotonic() + interval
        layout = self.broker.shard_router.layout(self.queue_name)
        names = layout.names(self.queue_name)
        following = bool(self.shards)
        for index, name in enumerate(names):
            if name not in self.shards:
                shard = ShardConsumer(
                    self.broker, name, self.prefetch, self.timeout, self.budget, threads=self.worker_threads
                )
                self.shards[name] = shard
                stop = threading.Event()
                thread = threading.Thread(target=self._pump, args=(shard, stop), name=f"shard:{name}", daemon=True)
                self.threads[name] = (thread, stop)
                thread.start()
                if following:
                    self.logger.info("Consuming shard %r of queue %r too.", name, self.queue_name)
            self.shards[name].spread(index, len(names))
        for name in [n for n in self.shards if n not in names]:
            self.logger.info(
                "Shard %r of queue %r was drained and dropped: not consuming it any more.", name, self.queue_name
            )
            self.threads.pop(name)[1].set()  # its thread closes it
            shard = self.shards.pop(name)
            self.budget.leave(shard)
        self._limit(names)
        self._drop_drained(layout.retired)

    def _limit(self, names: list[str]) -> None:
        """The shards followed changed (or were just read): every shard gets its share of
        the queue's limits and its group weights (:meth:`.Limits.reapply`; reads only,
        when it has them). Tried again at the next reading of the layout if it fails."""
        if names == self.limited:
            return
        try:
            self.broker.limits.reapply(self.queue_name, names)
        except (*CONNECTION_ERRORS, redis.ResponseError) as e:
            self.logger.warning("Could not give the shards of queue %r their limits: %s", self.queue_name, e)
            return
        self.limited = names

    def _drop_drained(self, retired: tuple[int, ...]) -> None:
        """Take the retired shards whose transfer lease a consumer here holds out of the
        layout once they hold nothing (scheduled, ready, in flight or dead) and were
        retired long enough for every producer to have stopped sending to them
        (:data:`DROP_AFTER` safety intervals); then drop their keys."""
        broker = self.broker
        min_age = int(DROP_AFTER * broker.settings.safety_interval)
        for suffix in retired:
            name = shard_name(self.queue_name, suffix)
            shard = self.shards.get(name)
            if shard is None or not shard.holds_lease:
                continue
            try:
                if _holds(broker, name) or not broker.shard_router.layouts.drop(self.queue_name, suffix, min_age):
                    continue
                if _holds(broker, name):
                    # Something came in between the check and the drop (a dead letter
                    # requeued to it): retired again, to be drained first.
                    broker.shard_router.layouts.retire(self.queue_name, suffix)
                    continue
                broker.admin.flush(name)
            except (*CONNECTION_ERRORS, redis.ResponseError) as e:
                shard.failures.log(e)
                continue
            self.logger.info("Dropped the drained shard %r of queue %r.", name, self.queue_name)
            broker.shard_router.forget(self.queue_name)  # read the layout again at once
            self.next_layout_at = 0.0

    def _pump(self, shard: ShardConsumer, stop: threading.Event) -> None:
        while not (self.stopping.is_set() or stop.is_set()):
            try:
                message = next(shard)
            except Exception:
                self.logger.exception("The consumer of shard %r failed; going on.", shard.queue_name)
                self.stopping.wait(ERROR_PAUSE)
                continue
            if message is not None:
                self.owner[message.options["redis_message_id"]] = shard
                self.ready.put(message)
        if stop.is_set():
            # Dropped from the layout (it held nothing): until this process read the
            # layout again, this consumer kept beating and listing the shard; drop what
            # that wrote, as the process that dropped it did.
            shard.close()
            try:
                self.broker.admin.flush(shard.queue_name)
            except (*CONNECTION_ERRORS, redis.ResponseError) as e:
                self.logger.warning("Could not drop the keys of the dropped shard %r: %s", shard.queue_name, e)

    @property
    def outstanding_message_count(self) -> int:
        return self.budget.outstanding()

    def __next__(self) -> MessageProxy | None:
        if time.monotonic() >= self.next_layout_at:
            try:
                self._follow_layout()
            except (*CONNECTION_ERRORS, redis.ResponseError) as e:
                self.logger.warning("Could not read the shard layout of queue %r: %s", self.queue_name, e)
                self.next_layout_at = time.monotonic() + ERROR_PAUSE
        try:
            return self.ready.get(timeout=min(self.timeout, 1000) / 1000)
        except queue.Empty:
            return None

    def _shard_of(self, message: MessageProxy) -> ShardConsumer:
        return self.owner.pop(message.options["redis_message_id"])

    def ack(self, message: MessageProxy) -> None:
        self._shard_of(message).ack(message)

    def nack(self, message: MessageProxy) -> None:
        self._shard_of(message).nack(message)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        by_shard: dict[int, list[MessageProxy]] = {}
        for message in messages:
            shard = self.owner.pop(message.options["redis_message_id"], None)
            if shard is not None:
                by_shard.setdefault(id(shard), []).append(message)
        for shard in self.shards.values():
            mine = by_shard.get(id(shard))
            if mine:
                shard.requeue(mine)
                shard.released(mine)

    def close(self) -> None:
        self.stopping.set()
        deadline = time.monotonic() + max(2.0, self.timeout / 1000 + 1)
        for thread, _ in self.threads.values():
            thread.join(max(0.0, deadline - time.monotonic()))
        # Handed over but never given to Dramatiq: back to their shards.
        left: list[MessageProxy] = []
        while True:
            try:
                left.append(self.ready.get_nowait())
            except queue.Empty:
                break
        if left:
            self.requeue(left)
        for shard in self.shards.values():
            shard.close()
