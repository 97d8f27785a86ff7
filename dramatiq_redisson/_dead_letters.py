"""A handle on one queue's dead letters, in the built-in broker's ``.XQ`` layout."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from dramatiq.logging import get_logger
from dramatiq.message import Message

from ._keys import QueueKeys
from ._paging import BULK_STEP, check_batch, check_limit, in_steps, read_head

if TYPE_CHECKING:
    from ._broker import RedissonBroker


class DeadLetters:
    """The dead-lettered messages of one queue: messages that failed for good (Dramatiq's
    ``Retries`` gave up, or an actor raised with retries off) and entries that could not
    be delivered. They are kept for the broker's ``dead_message_ttl`` and then expire.

    Obtain it with :meth:`RedissonBroker.dead_letters`. Dead letters are named by their
    redis message id (``message.options["redis_message_id"]``). A requeued dead letter
    goes to the tail of the ready queue and runs once: it leaves the dead letters in the
    same atomic step, so a second requeue of the same id finds nothing. If it fails
    again it dies again (its ``retries`` count is kept).
    """

    def __init__(self, broker: RedissonBroker, keys: QueueKeys) -> None:
        self.logger = get_logger(__name__, type(self))
        self.broker = broker
        self.keys = keys

    @property
    def queue_name(self) -> str:
        return self.keys.queue_name

    def size(self) -> int:
        """The number of dead letters."""
        return int(self.broker.client.zcard(self.keys.xq))

    def read_all(self, limit: int | None = None) -> list[tuple[int, Message[Any]]]:
        """Dead letters as ``(time of death in epoch ms, message)``, oldest first; at most
        ``limit``. Entries that cannot be decoded are skipped with a logged error.

        Raises:
          ValueError: A negative ``limit``.
        """
        result = []
        for member, died, data in read_head(self.broker.client, self.keys.xq, self.keys.xq_msgs, limit):
            message = None if data is None else self._decode(member.decode(), data)
            if message is not None:
                result.append((int(died), message))
        return result

    def page(self, start: int = 0, size: int = 25) -> list[tuple[int, Message[Any]]]:
        """Dead letters newest first, ``size`` of them from position ``start`` (0: the
        latest death): a paged view's page. O(log n + start + size) on the server.
        Entries that cannot be decoded are skipped with a logged error.

        Raises:
          ValueError: A negative ``start``, or a size that is not a positive int.
        """
        check_batch(size, "size")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start must be a non-negative int, got {start!r}")
        client = self.broker.client
        # Ranks counted from the end, so the newest are read without knowing the size.
        entries = cast(
            "list[tuple[bytes, float]]", client.zrange(self.keys.xq, -(start + size), -(start + 1), withscores=True)
        )
        if not entries:
            return []
        stored = cast("list[bytes | None]", client.hmget(self.keys.xq_msgs, [member for member, _ in entries]))
        result = []
        for (member, died), data in zip(reversed(entries), reversed(stored), strict=True):
            message = None if data is None else self._decode(member.decode(), data)
            if message is not None:
                result.append((int(died), message))
        return result

    def get(self, redis_message_id: str) -> tuple[int, Message[Any]] | None:
        """A dead letter and its time of death (epoch ms), or ``None``."""
        # Not in a MULTI: Redis before 7.4 and Valkey 7.2 refuse every command queued in
        # one on a full server. Read apart, a dead letter requeued or removed in between
        # is missing either way, and one buried in between is not dead yet: None.
        with self.broker.client.pipeline(transaction=False) as pipe:
            pipe.zscore(self.keys.xq, redis_message_id)
            pipe.hget(self.keys.xq_msgs, redis_message_id)
            died, data = pipe.execute()
        if died is None or data is None:
            return None
        message = self._decode(redis_message_id, data)
        return None if message is None else (int(died), message)

    def requeue(self, redis_message_id: str) -> bool:
        """Put a dead letter back on the ready queue (idle consumers wake at once).
        Returns False if there is no such dead letter."""
        return self.broker.redisson_scripts.dead(self.keys, "requeue", 0, [redis_message_id]) > 0

    def remove(self, redis_message_id: str) -> bool:
        """Delete a dead letter. Returns False if there is no such dead letter."""
        return self.broker.redisson_scripts.dead(self.keys, "remove", 0, [redis_message_id]) > 0

    def requeue_all(self, *, limit: int | None = None) -> int:
        """Requeue dead letters, oldest first (at most ``limit``), in atomic server steps
        of at most :data:`BULK_STEP`. Returns how many were requeued."""
        return self._bulk("requeue", limit)

    def clear(self) -> int:
        """Delete every dead letter, in bounded server steps. Returns how many."""
        return self._bulk("remove", None)

    def _bulk(self, action: str, limit: int | None) -> int:
        limit = check_limit(limit)
        total = self.size() if limit is None else min(limit, self.size())
        return in_steps(total, BULK_STEP, lambda n: self.broker.redisson_scripts.dead(self.keys, action, n))

    def _decode(self, redis_message_id: str, data: bytes) -> Message[Any] | None:
        try:
            message = Message.decode(data)
        except Exception:
            self.logger.error("Could not decode dead letter %r of queue %r.", redis_message_id, self.queue_name)
            return None
        message.options["redis_message_id"] = redis_message_id
        return message

    def __len__(self) -> int:
        return self.size()
