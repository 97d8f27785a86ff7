"""A test-only RedissonBroker that also speaks the StubBroker test API.

Dramatiq's actor, worker, composition and callback tests drive a ``stub_broker``; the
peer suite hands them a :class:`PeerBroker` instead, so the same tests push real
messages through Redis and RedissonBroker's scripts. It adds only what those tests
call on a StubBroker:

* ``join(queue, *, fail_fast=None, timeout=None)``: wait for the queue like
  RedissonBroker, then (``fail_fast``, on by default as on a StubBroker) re-raise the
  exception of a message that was dead-lettered on that queue;
* ``dead_letters``: the dead-lettered messages, read from each queue's ``.XQ``
  (``keys(queue).xq``: ``<ns>:<queue>.XQ``, or ``{<ns>:<queue>}.XQ`` on a cluster).

Delivery, retries, delays, acks and dead-lettering are RedissonBroker's own.
"""

from __future__ import annotations

import threading
from typing import Any, cast

from dramatiq.broker import Consumer, MessageProxy

# StubBroker's proxy keeps the actor's exception after the worker is done with the
# message (its clear_exception does nothing), which is what lets join() re-raise it.
# Using that very class also keeps tests that patch its clear_exception meaningful.
from dramatiq.brokers.stub import _StubMessageProxy
from dramatiq.message import Message

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._consumer import RedissonConsumer

#: Option RedissonBroker adds to every message it enqueues (the Redis entry's id).
REDIS_ID_OPTION = "redis_message_id"


class PeerConsumer(RedissonConsumer):
    """RedissonConsumer whose messages keep their exception, and which tells its
    broker about every message it dead-letters."""

    broker: PeerBroker

    def __next__(self) -> MessageProxy | None:
        proxy = super().__next__()
        if proxy is None:
            return None
        return _StubMessageProxy(proxy._message)

    def nack(self, message: MessageProxy) -> None:
        self.broker.record_failure(message)
        super().nack(message)


class PeerBroker(RedissonBroker):
    """RedissonBroker plus StubBroker's ``join(fail_fast=...)`` and ``dead_letters``.

    Parameters:
      fail_fast_default: What ``join`` does when ``fail_fast`` is not given (as on
        :class:`dramatiq.brokers.stub.StubBroker`, re-raise by default).
      **options: Passed to :class:`RedissonBroker`.
    """

    def __init__(self, *, fail_fast_default: bool = True, **options: Any) -> None:
        super().__init__(**options)
        self.fail_fast_default = fail_fast_default
        self._failures: dict[str, MessageProxy] = {}
        self._failures_lock = threading.Lock()

    @property
    def consumer_class(self) -> type[Consumer]:
        return PeerConsumer

    def record_failure(self, message: MessageProxy) -> None:
        """Remember a message about to be dead-lettered, by its Redis entry id."""
        with self._failures_lock:
            self._failures[message.options[REDIS_ID_OPTION]] = message

    def dead_letter_ids(self, queue_name: str) -> list[str]:
        """Redis entry ids of the dead letters of ``queue_name``, oldest first."""
        members = cast("list[bytes]", self.client.zrange(self.keys(queue_name).xq, 0, -1))
        return [member.decode() for member in members]

    @property
    def dead_letters(self) -> list[Message[Any]]:
        """The dead-lettered messages of every declared queue, oldest first.

        Each is the message as it was sent: the ``redis_message_id`` option, which only
        records where RedissonBroker stored it, is left out.
        """
        scored: list[tuple[float, Message[Any]]] = []
        for queue_name in sorted(self.queues):
            keys = self.keys(queue_name)
            entries = cast("list[tuple[bytes, float]]", self.client.zrange(keys.xq, 0, -1, withscores=True))
            if not entries:
                continue
            datas = cast("list[bytes | None]", self.client.hmget(keys.xq_msgs, [member for member, _ in entries]))
            for (_, died_at), data in zip(entries, datas, strict=True):
                if data is None:
                    continue
                message = Message.decode(data)
                message.options.pop(REDIS_ID_OPTION, None)
                scored.append((died_at, message))
        scored.sort(key=lambda pair: pair[0])
        return [message for _, message in scored]

    def join(
        self,
        queue_name: str,
        *,
        interval: int = 100,
        timeout: int | None = None,
        fail_fast: bool | None = None,
    ) -> None:
        """Wait until every message of ``queue_name`` has been processed.

        Raises:
          QueueJoinTimeout: When ``timeout`` (ms) elapses.
          BaseException: With ``fail_fast`` (default: ``fail_fast_default``), the
            exception of the oldest message dead-lettered on the queue, or a plain
            Exception when that message failed without one.
        """
        super().join(queue_name, interval=interval, timeout=timeout)
        if not (self.fail_fast_default if fail_fast is None else fail_fast):
            return
        dead = self.dead_letter_ids(queue_name)
        if not dead:
            return
        with self._failures_lock:
            failed = self._failures.get(dead[0])
        exception = failed._exception if failed is not None else None
        raise (exception or Exception("Message failed with unknown error")) from None
