"""A handle on one queue's scheduled messages, after Redisson's ``RDelayedQueue``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from dramatiq.logging import get_logger
from dramatiq.message import Message

from ._keys import QueueKeys

if TYPE_CHECKING:
    from ._broker import RedissonBroker


class DelayedQueue:
    """The scheduled (not yet due) messages of one queue.

    Obtain it with :meth:`RedissonBroker.delayed_queue`. Every method is one round
    trip and costs O(log n) or O(returned) on the server.
    """

    def __init__(self, broker: RedissonBroker, keys: QueueKeys) -> None:
        self.logger = get_logger(__name__, type(self))
        self.broker = broker
        self.keys = keys

    @property
    def queue_name(self) -> str:
        return self.keys.queue_name

    def size(self) -> int:
        """The number of scheduled messages."""
        return int(self.broker.client.zcard(self.keys.timeout_zset))

    def contains(self, message_id: str) -> bool:
        """Whether a message (or a pending retry of it) is scheduled."""
        return bool(self.broker.client.hexists(self.keys.payloads, message_id))

    def remove(self, message_id: str) -> bool:
        """Cancel a scheduled message, or the pending retry of one. Returns whether
        something was cancelled (False if it already moved to the ready queue)."""
        return self.broker.redisson_scripts.cancel(self.keys, [message_id]) > 0

    def clear(self) -> int:
        """Cancel every scheduled message of the queue. Returns how many there were."""
        return int(self.broker.redisson_scripts.clear(self.keys))

    def next_due(self) -> int | None:
        """The earliest due time (epoch ms, server clock), or None when nothing is scheduled."""
        head = self.broker.client.zrange(self.keys.timeout_zset, 0, 0, withscores=True)
        return int(head[0][1]) if head else None

    def read_all(self, limit: int | None = None) -> list[tuple[int, Message[Any]]]:
        """Scheduled messages as ``(due epoch ms, message)`` pairs, earliest first.

        Entries that cannot be decoded are skipped with a logged error.
        """
        if limit is not None and limit <= 0:
            return []
        client = self.broker.client
        entries = cast(
            "list[tuple[bytes, float]]",
            client.zrange(self.keys.timeout_zset, 0, -1 if limit is None else limit - 1, withscores=True),
        )
        if not entries:
            return []
        message_ids = [member[16:].decode() for member, _ in entries]
        stored = cast("list[bytes | None]", client.hmget(self.keys.payloads, message_ids))
        result: list[tuple[int, Message[Any]]] = []
        for (member, due), data in zip(entries, stored, strict=True):
            # An entry may have moved or been cancelled between the two reads.
            if data is None or data[:16] != member[:16]:
                continue
            try:
                message = Message.decode(data[16:])
            except Exception:
                self.logger.error("Could not decode scheduled entry %r of queue %r.", member, self.queue_name)
                continue
            # A compact payload leaves redis_message_id out (see encode_scheduled).
            message.options["redis_message_id"] = member.decode()
            result.append((int(due), message))
        return result

    def __len__(self) -> int:
        return self.size()

    def __contains__(self, message_id: object) -> bool:
        return isinstance(message_id, str) and self.contains(message_id)
