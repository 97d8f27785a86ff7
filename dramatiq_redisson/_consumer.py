"""The consumer returned by :meth:`RedissonBroker.consume`, with the transfer timer inside."""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

import redis
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.common import compute_backoff
from dramatiq.errors import ConnectionClosed
from dramatiq.logging import get_logger
from dramatiq.message import Message

from ._broker import encode_scheduled
from ._limits import COMPACT_SLACK, COMPACT_STEP, TRIM_BUDGET
from ._timer import TransferTimer

if TYPE_CHECKING:
    from ._broker import RedissonBroker

#: Most transfer calls in one tick before the consumer hands back control.
MAX_TRANSFER_CALLS_PER_TICK = 20

#: Legacy ``.DQ`` entries migrated per batch.
MIGRATION_BATCH_SIZE = 100

#: Most dead letters expired per maintenance run.
EXPIRE_LIMIT = 1000

_CONNECTION_ERRORS = (redis.ConnectionError, redis.TimeoutError)


class RedissonConsumer(Consumer):
    """Fetches ready messages and, on the side, runs the queue's transfer timer.

    The timer subscribes to the queue's channel, runs the transfer script on every
    (re)subscription, at the due time it returned, when an earlier due time is
    announced and at least every ``safety_interval`` ms. Idle waits happen on the
    pub/sub connection, so an announcement (a new earliest due time, or a message
    landing in an empty ready queue) ends them at once.
    """

    def __init__(self, broker: RedissonBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        self.logger = get_logger(__name__, type(self))
        self.broker = broker
        self.scripts = broker.redisson_scripts
        self.keys = broker.keys(queue_name)
        self.queue_name = queue_name
        self.worker_id = broker.broker_id
        self.prefetch = prefetch
        self.timeout = timeout

        self.timer = TransferTimer(broker.safety_interval)
        self.message_cache: deque[tuple[str, bytes]] = deque()
        self.in_flight: set[str] = set()
        self.misses = 0
        self.capacity_freed = threading.Event()
        self.pubsub: Any = None
        self.migrate_legacy = True
        self.next_maintenance_at = time.monotonic() + random.uniform(0, broker.maintenance_interval / 1000)
        self.next_housekeeping_at = time.monotonic() + broker.safety_interval / 1000
        self.checked_dead_workers: set[str] = set()

    @property
    def outstanding_message_count(self) -> int:
        return len(self.in_flight) + len(self.message_cache)

    # -- the Consumer interface ------------------------------------------------

    def __next__(self) -> MessageProxy | None:
        try:
            while True:
                if self.message_cache:
                    redis_message_id, data = self.message_cache.popleft()
                    message = self._decode(redis_message_id, data)
                    if message is None:
                        continue
                    self.in_flight.add(redis_message_id)
                    return MessageProxy(message)

                self.tick()
                if self.outstanding_message_count < self.prefetch:
                    fetched = self.scripts.fetch(
                        self.keys, self.worker_id, self.prefetch - self.outstanding_message_count
                    )
                    if fetched:
                        self.misses = 0
                        self._cache(fetched)
                        continue
                    self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
                    self._wait_for_announcement(min(backoff_ms / 1000, self.timer.seconds_until_due()))
                else:
                    # Full: wait for an ack to free a slot, or for the timer.
                    self.capacity_freed.clear()
                    self.capacity_freed.wait(min(self.timeout / 1000, self.timer.seconds_until_due()))
                return None
        except _CONNECTION_ERRORS as e:
            raise ConnectionClosed(e) from None

    def ack(self, message: MessageProxy) -> None:
        self._finish(message, self.scripts.ack)

    def nack(self, message: MessageProxy) -> None:
        self._finish(message, self.scripts.nack)

    def requeue(self, messages: Iterable[MessageProxy]) -> None:
        ids = [message.options["redis_message_id"] for message in messages]
        if ids:
            self.logger.debug("Re-enqueueing %r on queue %r.", ids, self.queue_name)
            try:
                self.scripts.requeue(self.keys, self.worker_id, ids)
            except _CONNECTION_ERRORS as e:
                raise ConnectionClosed(e) from None

    def close(self) -> None:
        try:
            cached = [redis_message_id for redis_message_id, _ in self.message_cache]
            self.message_cache.clear()
            if cached:
                self.scripts.requeue(self.keys, self.worker_id, cached)
        except _CONNECTION_ERRORS:
            self.logger.warning(
                "Could not requeue %d prefetched messages; they return after the heartbeat timeout.", len(cached)
            )
        finally:
            if self.pubsub is not None:
                try:
                    self.pubsub.close()
                except Exception:  # pragma: no cover - closing a broken socket
                    pass
                self.pubsub = None

    # -- one tick of the timer -------------------------------------------------

    def tick(self) -> None:
        """Do the timer's work that is due: subscribe, transfer, migrate, maintain."""
        if self.pubsub is None:
            self.pubsub = self.broker.client.pubsub()
            self.pubsub.subscribe(self.keys.channel)
            self.timer.force()
        self._drain_announcements()
        if self.migrate_legacy:
            self.migrate_legacy = self._migrate_legacy_batch()
        if self.timer.is_due():
            self._transfer()
        now = time.monotonic()
        if now >= self.next_housekeeping_at:
            # Keep this worker's heartbeat fresh while all its threads are busy, and
            # pick up legacy .DQ entries that built-in workers requeued meanwhile.
            self.next_housekeeping_at = now + self.broker.safety_interval / 1000
            if self.timer.server_now_ms():
                self.broker.client.zadd(self.keys.heartbeats, {self.worker_id: self.timer.server_now_ms()})
            self.migrate_legacy = True
        if now >= self.next_maintenance_at:
            self.next_maintenance_at = now + self.broker.maintenance_interval / 1000
            self._maintain()

    def _transfer(self) -> None:
        for _ in range(MAX_TRANSFER_CALLS_PER_TICK):
            result = self.scripts.transfer(
                self.keys,
                limit=self.broker.transfer_batch_size,
                trim_budget=TRIM_BUDGET,
                compact_step=COMPACT_STEP,
                compact_slack=COMPACT_SLACK,
            )
            self.timer.record(result)
            if result.moved:
                self.logger.debug("Moved %d scheduled messages to queue %r.", result.moved, self.queue_name)
            if result.dead:
                self.logger.error(
                    "Moved %d scheduled entries without a message to the dead letters of queue %r.",
                    result.dead,
                    self.queue_name,
                )
            if result.moved + result.dead < self.broker.transfer_batch_size:
                break
        else:
            self.timer.force()

    def _wait_for_announcement(self, seconds: float) -> None:
        self._handle(self.pubsub.get_message(timeout=seconds))
        self._drain_announcements()

    def _drain_announcements(self) -> None:
        for _ in range(1000):
            item = self.pubsub.get_message(timeout=0)
            if item is None:
                return
            self._handle(item)

    def _handle(self, item: dict[str, Any] | None) -> None:
        if item is None:
            return
        kind = item["type"]
        if kind == "subscribe":
            # (Re)subscribed: anything announced while we were away is unknown.
            self.timer.force()
        elif kind == "message":
            try:
                due_ms = int(item["data"])
            except (TypeError, ValueError):
                self.logger.warning("Ignoring malformed announcement %r on %r.", item["data"], self.keys.channel)
                self.timer.force()
                return
            self.misses = 0
            if due_ms > 0:  # 0: a message is ready (enqueue.lua); fetching is enough
                self.timer.announce(due_ms)

    # -- messages ----------------------------------------------------------------

    def _cache(self, fetched: list[tuple[str, bytes | None]]) -> None:
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
            self.scripts.nack(self.keys, self.worker_id, redis_message_id)
            return None
        # The ack must name the entry this message was fetched as.
        if message.options.get("redis_message_id") != redis_message_id:
            message.options["redis_message_id"] = redis_message_id
        return message

    def _finish(self, message: MessageProxy, script: Any) -> None:
        redis_message_id = message.options["redis_message_id"]
        try:
            script(self.keys, self.worker_id, redis_message_id)
        except _CONNECTION_ERRORS as e:
            raise ConnectionClosed(e) from None
        finally:
            self.in_flight.discard(redis_message_id)
            self.capacity_freed.set()

    # -- legacy .DQ migration and maintenance ---------------------------------------

    def _migrate_legacy_batch(self) -> bool:
        """Move one batch of the built-in broker's ``.DQ`` messages into the delayed queue
        at their original eta. Returns whether more may remain."""
        client = self.broker.client
        ids = [i.decode() for i in cast("list[bytes]", client.lrange(self.keys.legacy_dq, 0, MIGRATION_BATCH_SIZE - 1))]
        if not ids:
            return False
        datas = cast("list[bytes | None]", client.hmget(self.keys.legacy_dq_msgs, ids))
        entries: list[tuple[int, str, str, bytes, str]] = []
        undecodable: list[str] = []
        for legacy_id, data in zip(ids, datas, strict=True):
            if data is None:
                undecodable.append(legacy_id)  # an id without a message: bury drops it
                continue
            try:
                legacy = Message.decode(data)
            except Exception:
                self.logger.exception(
                    "Could not decode legacy delayed message %r; moving it to the dead letters.", legacy_id
                )
                undecodable.append(legacy_id)
                continue
            eta = legacy.options.get("eta")
            due_ms = int(eta) if isinstance(eta, (int, float)) else 0
            message, sort_key = self.broker.prepare_scheduled(legacy)
            entries.append((due_ms, sort_key, message.message_id, encode_scheduled(message, sort_key), legacy_id))
        if undecodable:
            self.scripts.bury_legacy(self.keys, undecodable)
        if entries:
            dues = self.scripts.offer(self.keys, entries, absolute=True)
            migrated = sum(1 for due in dues if due >= 0)
            self.logger.info(
                "Migrated %d delayed messages from %r to the delayed queue.", migrated, self.keys.legacy_dq
            )
            self.timer.force()
        return len(ids) == MIGRATION_BATCH_SIZE

    def _maintain(self) -> None:
        """Requeue the unacked messages of dead workers; expire old dead letters."""
        client = self.broker.client
        cutoff = self.timer.server_now_ms() - self.broker.heartbeat_timeout
        oldest = cast("list[bytes]", client.zrangebyscore(self.keys.heartbeats, "-inf", cutoff, start=0, num=100))
        dead = [w.decode() for w in oldest]
        dead = [w for w in dead if w != self.worker_id]
        requeued, expired = self.scripts.maintenance(
            self.keys, dead, dead_message_ttl_ms=self.broker.dead_message_ttl, expire_limit=EXPIRE_LIMIT
        )
        if requeued:
            self.logger.warning("Requeued %d unacked messages of dead workers on queue %r.", requeued, self.queue_name)
            self.migrate_legacy = True
        if expired:
            self.logger.debug("Expired %d dead letters of queue %r.", expired, self.queue_name)
        for worker_id in dead:
            if worker_id in self.checked_dead_workers:
                continue
            self.checked_dead_workers.add(worker_id)
            pattern = f"{self.broker.namespace}:__acks__.{worker_id}.*"
            if next(iter(client.scan_iter(match=pattern, count=1000)), None) is None:
                client.zrem(self.keys.heartbeats, worker_id)
