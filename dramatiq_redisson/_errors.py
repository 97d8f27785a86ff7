"""Every exception the package raises: what an enqueue wrote and what it did not, a write
too few replicas acknowledged, a missing ACL permission, and the refusal of a server the
broker cannot run on. All are re-exported by :mod:`dramatiq_redisson`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dramatiq.errors import BrokerError
from dramatiq.message import Message
from redis.exceptions import NoPermissionError


def needs_extra(extra: str) -> str:
    """How to install the package's extra ``extra``, for a message that needs it: the
    package is not on PyPI, so from a clone, or a wheel built from one."""
    return f"install the {extra!r} extra: pip install -e '.[{extra}]' in a clone, or the wheel with [{extra}]"


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
        return _rebuild, (type(self), self.__dict__, self.args)


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
        return _rebuild, (type(self), self.__dict__, self.args)


class NotReplicated(BrokerError):
    """A write went through on the primary, but fewer replicas than the broker's
    ``wait_for_replicas`` acknowledged it within ``wait_timeout`` ms (``WAIT``).

    The write is on the primary: it stays unless a replica that lacks it takes over
    (a failover now may lose it). Doing the same call again is safe (a scheduled
    message id is rescheduled, an immediate message is pushed once).

    Attributes:
      replicas: How many replicas acknowledged it (``None``: unknown, the connection
        failed during the wait; the cause says why).
      wanted: The broker's ``wait_for_replicas``.
      timeout_ms: The broker's ``wait_timeout``.
    """

    def __init__(self, message: str, *, replicas: int | None = None, wanted: int = 0, timeout_ms: int = 0) -> None:
        super().__init__(message)
        self.replicas = replicas
        self.wanted = wanted
        self.timeout_ms = timeout_ms

    @classmethod
    def describe(cls, what: str, replicas: int | None, wanted: int, timeout_ms: int) -> NotReplicated:
        got = "an unknown number" if replicas is None else str(replicas)
        return cls(
            f"{what} went through on the primary, but {got} of the {wanted} replica(s) asked for "
            f"(wait_for_replicas) acknowledged it within {timeout_ms} ms (wait_timeout): a failover "
            f"before the replicas catch up may lose it; doing it again is safe.",
            replicas=replicas,
            wanted=wanted,
            timeout_ms=timeout_ms,
        )

    def __reduce__(self) -> Any:
        return _rebuild, (type(self), self.__dict__, self.args)


class EnqueueNotReplicated(EnqueueError, NotReplicated):
    """An enqueue went through on the primary (its messages are in ``enqueued``), but
    fewer replicas than ``wait_for_replicas`` acknowledged it within ``wait_timeout``:
    a failover before they catch up may lose it. Sending the messages again is safe
    (a scheduled id is rescheduled, an immediate message is pushed once)."""

    def __init__(
        self,
        message: str,
        *,
        enqueued: list[Message[Any]],
        failed: list[Message[Any]],
        unknown: list[Message[Any]],
        replicas: int | None,
        wanted: int,
        timeout_ms: int,
    ) -> None:
        EnqueueError.__init__(self, message, enqueued=enqueued, failed=failed, unknown=unknown)
        self.replicas = replicas
        self.wanted = wanted
        self.timeout_ms = timeout_ms


class MissingPermission(NoPermissionError):
    """The broker's Redis user lacks commands, keys or channels the broker needs.

    A subclass of :class:`redis.exceptions.NoPermissionError` (the class redis-py raises
    for the server's NOPERM reply) rather than of ``dramatiq.errors.BrokerError``: it
    stands for the same refusal, raised earlier and complete, so every handler of the
    refusal it replaces keeps working — ``except redis.ResponseError`` around sends, and
    the consumer, which backs off and retries on server errors (and logs a NOPERM as a
    permission problem) so a worker recovers by itself once an operator fixes the ACL.
    A ``BrokerError`` would be caught by no one and gives Dramatiq no special handling.

    Attributes:
      commands: Missing commands (``"time"``, ``"script|load"``), sorted.
      keys: Key names the user may not access (``"key (read)"``-style notes included).
      channels: Channels the user may not publish to or subscribe to.
      unchecked: Commands the probe could not try until others are granted.
    """

    def __init__(
        self,
        message: str,
        *,
        commands: Sequence[str] = (),
        keys: Sequence[str] = (),
        channels: Sequence[str] = (),
        unchecked: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.commands = tuple(commands)
        self.keys = tuple(keys)
        self.channels = tuple(channels)
        self.unchecked = tuple(unchecked)


def _rebuild(cls: type[BaseException], state: dict[str, Any], args: tuple[Any, ...]) -> BaseException:
    """An error unpickled: its message (``args``) and its attributes, without calling an
    ``__init__`` whose keyword-only arguments pickle's default would not pass."""
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error
