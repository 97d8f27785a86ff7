"""Errors the producer side raises (which messages were enqueued, which were not), and
the refusal of a server the broker cannot run on."""

from __future__ import annotations

from typing import Any

from dramatiq.errors import BrokerError
from dramatiq.message import Message


class EnqueueError(BrokerError):
    """Some messages of an enqueue were not enqueued, or may not have been.

    The original error is the ``__cause__``. Every message given to the call is in
    exactly one of the lists (as the prepared copy the call returns on success):

    Attributes:
      enqueued: In Redis: scheduled, or on the ready queue (or already there from an
        earlier send of the same message).
      failed: Certainly not written: the server refused the call (an error reply,
        NOSCRIPT included), or the call was never sent.
      unknown: Sent, but the connection failed before the reply was read: each may or
        may not be in Redis. Sending them again is safe: a message id already
        scheduled is rescheduled, and an immediate message already enqueued (queued,
        in flight or sent within the broker's ``dedupe_window``) is not pushed again.
    """

    def __init__(
        self,
        message: str,
        *,
        enqueued: list[Message[Any]],
        failed: list[Message[Any]],
        unknown: list[Message[Any]],
    ) -> None:
        super().__init__(message)
        self.enqueued = enqueued
        self.failed = failed
        self.unknown = unknown

    def __reduce__(self) -> Any:
        return _rebuild, (type(self), self.__dict__)


class ServerMemoryFull(EnqueueError):
    """The Redis server refused to enqueue: it is at its ``maxmemory`` limit and its
    ``maxmemory-policy`` evicts nothing. A refused call wrote nothing.

    Attributes:
      queue_names: The queues whose messages were refused.
      maxmemory: The server's limit in bytes (None if it could not be read).
      used_memory: The server's used memory in bytes (None if it could not be read).
    """

    def __init__(
        self,
        message: str,
        *,
        enqueued: list[Message[Any]],
        failed: list[Message[Any]],
        unknown: list[Message[Any]],
        queue_names: list[str],
        maxmemory: int | None = None,
        used_memory: int | None = None,
    ) -> None:
        super().__init__(message, enqueued=enqueued, failed=failed, unknown=unknown)
        self.queue_names = queue_names
        self.maxmemory = maxmemory
        self.used_memory = used_memory


class UnsupportedServer(BrokerError):
    """The Redis server lacks something the broker needs (it is too old, or too old for a
    cluster). Raised when the broker starts to use it, before anything is written: at a
    consumer's start and at the first send.

    Attributes:
      server: The server's name as it reports it (``"redis"``, ``"valkey"``).
      version: Its version, ``(major, minor, patch)``; ``(0, 0, 0)`` for a server older
        than 6.2 (which does not say).
    """

    def __init__(self, message: str, *, server: str, version: tuple[int, int, int]) -> None:
        super().__init__(message)
        self.server = server
        self.version = version

    def __reduce__(self) -> Any:
        return _rebuild, (type(self), self.__dict__)


def _rebuild(cls: type[BrokerError], state: dict[str, Any]) -> BrokerError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    return error
