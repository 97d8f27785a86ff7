"""Which fetched messages a broker's consumers still hold, per queue.

A fetch moves ids from the ready queue into this worker's ack set in one script. When
the reply to that script is lost (a timeout, a killed connection), the ids sit in the
ack set with no consumer to run or ack them; the built-in broker leaves them there
until the whole process dies and its heartbeat times out. Consumers register every id
they fetch here and forget it once it is acked, nacked or requeued, so an id in the
ack set that is not held is stranded and can be requeued at once (see
``_upkeep.Upkeep.reconcile``).

The registry lives on the broker, not the consumer: when Dramatiq restarts a consumer
after an error, the messages the old one handed out are still running in worker
threads, and their acks arrive through the new consumer.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable


class HeldMessages:
    """Thread-safe sets of held redis message ids, one per queue.

    ``lock(queue)`` serializes a fetch with its registration and a reconciliation's
    read of the ack set with its requeue, so neither sees the other half done. Acks
    need no lock: requeue.lua puts an id back only if it removes it from the ack set,
    so an ack that wins the race leaves nothing to duplicate.
    """

    def __init__(self) -> None:
        self._ids: defaultdict[str, set[str]] = defaultdict(set)
        self._released: set[tuple[str, str]] = set()
        self._retried: set[str] = set()
        #: redis message id -> the message as it failed (encoded): noted by the consumer's
        #: nack for the broker's ``do_nack``, whose built-in signature (queue_name,
        #: message_id) has no room for it.
        self._failed: dict[str, bytes] = {}
        #: (queue, redis message id) of held messages fetched through lanes: they hold
        #: slots, which their ack or nack gives back (fetch.lua).
        self._slots: set[tuple[str, str]] = set()
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()

    def lock(self, queue_name: str) -> threading.Lock:
        with self._guard:
            return self._locks[queue_name]

    def add(self, queue_name: str, redis_message_ids: Iterable[str], *, slots: bool = False) -> None:
        """Hold ids; ``slots``: they were fetched through lanes (see :meth:`holds_slots`)."""
        with self._guard:
            ids = set(redis_message_ids)
            self._ids[queue_name].update(ids)
            if slots:
                self._slots.update((queue_name, i) for i in ids)

    def holds_slots(self, queue_name: str, redis_message_id: str) -> bool:
        """Whether a held id was fetched through lanes: its ack or nack gives its slots back."""
        with self._guard:
            return (queue_name, redis_message_id) in self._slots

    def discard(self, queue_name: str, redis_message_ids: Iterable[str]) -> None:
        with self._guard:
            ids = set(redis_message_ids)
            self._ids[queue_name].difference_update(ids)
            self._slots.difference_update((queue_name, i) for i in ids)

    def queue_of(self, redis_message_id: str) -> str | None:
        """The queue (a sharded queue's shard) whose consumer holds ``redis_message_id``."""
        with self._guard:
            for queue_name, ids in self._ids.items():
                if redis_message_id in ids:
                    return queue_name
        return None

    def snapshot(self, queue_name: str) -> frozenset[str]:
        with self._guard:
            return frozenset(self._ids[queue_name])

    def release(self, queue_name: str, redis_message_id: str) -> None:
        """Give up a held id without finishing it: it is not to be acked (see
        :meth:`was_released`) but requeued by the next reconciliation."""
        with self._guard:
            self._ids[queue_name].discard(redis_message_id)
            self._slots.discard((queue_name, redis_message_id))
            self._released.add((queue_name, redis_message_id))

    def was_released(self, queue_name: str, redis_message_id: str) -> bool:
        """Whether the id was released (once: the answer is forgotten)."""
        with self._guard:
            try:
                self._released.remove((queue_name, redis_message_id))
            except KeyError:
                return False
            return True

    def mark_retried(self, redis_message_id: str) -> None:
        """A retry of the held message was enqueued: its ack counts it as retried."""
        with self._guard:
            self._retried.add(redis_message_id)

    def was_retried(self, redis_message_id: str) -> bool:
        """Whether a retry of the message was enqueued (once: the answer is forgotten)."""
        with self._guard:
            try:
                self._retried.remove(redis_message_id)
            except KeyError:
                return False
            return True

    def note_failed(self, redis_message_id: str, encoded: bytes) -> None:
        """The held message failed for good, as ``encoded`` (see :meth:`failed`)."""
        with self._guard:
            self._failed[redis_message_id] = encoded

    def failed(self, redis_message_id: str) -> bytes | None:
        """The message as it failed, while its nack runs (else None)."""
        with self._guard:
            return self._failed.get(redis_message_id)

    def forget_failed(self, redis_message_id: str) -> None:
        with self._guard:
            self._failed.pop(redis_message_id, None)
