"""A handle on one queue's dead letters, in the built-in broker's ``.XQ`` layout."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from dramatiq import get_encoder
from dramatiq.encoder import JSONEncoder, PickleEncoder
from dramatiq.message import Message

from .._ids import sort_key_length
from .._keys import QueueKeys
from .._logs import logger_for
from .._message import _plain
from .._settings import is_int
from ._paging import BULK_STEP, check_batch, check_limit, in_steps, read_head

if TYPE_CHECKING:
    from ..scripts._calls import ScriptsHost

#: Dead letters searched, newest first, for a message id that is no dead letter's redis id
#: (see :meth:`DeadLetters.find`).
SEARCH_LIMIT = 10_000

#: Dead letters read per server call of that search.
SEARCH_STEP = 1_000

#: A redis id that names nothing about its message: a retry's fresh ``uuid4`` (an
#: immediate send's is its message id, a Dramatiq ``uuid4`` too).
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


class AmbiguousDeadLetter(LookupError):
    """A message id that names several dead letters where one is needed
    (:meth:`DeadLetters.get`, :meth:`DeadLetters.requeue`): give one of their redis ids.

    Attributes:
      queue_name: The queue.
      message_id: The message id given.
      redis_message_ids: The redis ids of its dead letters, newest first.
    """

    def __init__(self, queue_name: str, message_id: str, redis_message_ids: Sequence[str]) -> None:
        self.queue_name = queue_name
        self.message_id = message_id
        self.redis_message_ids = list(redis_message_ids)
        super().__init__(
            f"message id {message_id} names {len(self.redis_message_ids)} dead letters on queue {queue_name!r} "
            f"(redis ids {', '.join(self.redis_message_ids)}): give one of their redis ids"
        )

    def __reduce__(self) -> Any:
        return type(self), (self.queue_name, self.message_id, self.redis_message_ids)


class DeadLetters:
    """The dead-lettered messages of one queue: messages that failed for good (Dramatiq's
    ``Retries`` gave up, or an actor raised with retries off) and entries that could not
    be delivered. They are kept for the broker's ``dead_message_ttl`` and then expire.

    Obtain it with :meth:`RedissonBroker.dead_letters`. A dead letter is named by its
    redis message id (``message.options["redis_message_id"]``: the message id for an
    immediate send, its sort key and message id for a scheduled one, a fresh uuid for
    a retry sent without a delay), and :meth:`find`, :meth:`get`, :meth:`requeue` and
    :meth:`remove` also take the Dramatiq message id (``send()``'s ``message_id``, the
    one in the logs): a redis id wins; else the dead letters holding that message id
    are looked for among the newest :data:`SEARCH_LIMIT`. One message id can name
    several dead letters (a message sent again after it died, a scheduled one twice):
    :meth:`find` lists them, :meth:`remove` deletes them all, and :meth:`get` and
    :meth:`requeue` raise :class:`AmbiguousDeadLetter` (requeuing each would run the
    message more than once: requeue the one wanted by its redis id).

    A requeued dead letter goes to the tail of the ready queue and runs once: it leaves
    the dead letters in the same atomic step, so a second requeue of the same id finds
    nothing. If it fails again it dies again (its ``retries`` count is kept).

    A queue with shards gets a :class:`~dramatiq_redisson.sharding._views.ShardedDeadLetters`:
    the same methods over all its shards (a requeued dead letter goes back to its shard).
    ``queue_name``: the name of the queue, when it is not the keys' own (a shard's).
    """

    def __init__(self, broker: ScriptsHost, keys: QueueKeys, *, queue_name: str | None = None) -> None:
        self.logger = logger_for(type(self))
        self.broker = broker
        self.keys = keys
        self._queue_name = keys.queue_name if queue_name is None else queue_name

    @property
    def queue_name(self) -> str:
        return self._queue_name

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
        return self.load(self.newest(start, size))

    def newest(self, start: int = 0, size: int = 25) -> list[tuple[str, int]]:
        """The entries of :meth:`page`'s dead letters, without their messages: ``(redis
        id, time of death in epoch ms)``, newest first. One read, O(log n + start + size).
        With :meth:`load`, a page read in two steps: entries first, then only the messages
        kept (a sharded queue's view merges its shards' entries in between).

        Raises:
          ValueError: A negative ``start``, or a size that is not a positive int.
        """
        check_page(start, size)
        # Ranks counted from the end, so the newest are read without knowing the size.
        entries = cast(
            "list[tuple[bytes, float]]",
            self.broker.client.zrange(self.keys.xq, -(start + size), -(start + 1), withscores=True),
        )
        return [(member.decode(), int(died)) for member, died in reversed(entries)]

    def oldest(self, count: int) -> list[tuple[str, int]]:
        """The entries of the oldest ``count`` dead letters (those :meth:`requeue_all`
        takes first), as :meth:`newest` gives them, oldest first. One read."""
        if count <= 0:
            return []
        entries = cast(
            "list[tuple[bytes, float]]", self.broker.client.zrange(self.keys.xq, 0, count - 1, withscores=True)
        )
        return [(member.decode(), int(died)) for member, died in entries]

    def load(self, entries: Sequence[tuple[str, int]]) -> list[tuple[int, Message[Any]]]:
        """The dead letters of these ``(redis id, time of death)`` entries (as
        :meth:`newest` and :meth:`oldest` give them), in their order, as ``(time of death,
        message)``; those gone meanwhile, or that cannot be decoded (logged), are left
        out. One read."""
        if not entries:
            return []
        stored = cast("list[bytes | None]", self.broker.client.hmget(self.keys.xq_msgs, [m for m, _ in entries]))
        result = []
        for (member, died), data in zip(entries, stored, strict=True):
            message = None if data is None else self._decode(member, data)
            if message is not None:
                result.append((died, message))
        return result

    def existing(self, redis_message_ids: Sequence[str]) -> list[str]:
        """Those of these redis ids that are dead letters now, in their order (no search
        by message id). One round trip."""
        if not redis_message_ids:
            return []
        with self.broker.client.pipeline(transaction=False) as pipe:
            for redis_id in redis_message_ids:
                pipe.zscore(self.keys.xq, redis_id)
            deaths = pipe.execute()
        return [redis_id for redis_id, died in zip(redis_message_ids, deaths, strict=True) if died is not None]

    def get(self, id: str) -> tuple[int, Message[Any]] | None:
        """A dead letter and its time of death (epoch ms), or ``None``. ``id``: its redis
        id, or the message id of exactly one dead letter (see :meth:`find`).

        Raises:
          AmbiguousDeadLetter: ``id`` is the message id of several dead letters.
        """
        found = self._exact(id)
        if found is not None:
            return found
        letters = self._by_message_id(id, SEARCH_LIMIT)
        if len(letters) > 1:
            raise AmbiguousDeadLetter(self.queue_name, id, [_redis_id(m) for _, m in letters])
        return letters[0] if letters else None

    def find(self, id: str, *, limit: int | None = SEARCH_LIMIT) -> list[tuple[int, Message[Any]]]:
        """The dead letters ``id`` names, newest first, as ``(time of death in epoch ms,
        message)``: the one whose redis id it is, if any; else every one holding that
        message id, looked for among the newest ``limit`` dead letters (``None``: all;
        ``0``: none, the redis id only).

        A redis id is one read. A message id is searched a step of :data:`SEARCH_STEP`
        at a time: its members alone tell a scheduled message's (sort key + message id),
        and the data is read only of those a fresh uuid names (an immediate send, a
        retry sent without a delay). Two reads per step, not one atomic step.

        Raises:
          ValueError: A ``limit`` that is not None or a non-negative int.
        """
        limit = check_limit(limit)
        found = self._exact(id)
        if found is not None:
            return [found]
        return self._by_message_id(id, limit)

    def requeue(self, id: str) -> bool:
        """Put a dead letter back on the ready queue (idle consumers wake at once).
        ``id``: its redis id, or the message id of exactly one dead letter (see
        :meth:`find`). Returns False if there is no such dead letter.

        Raises:
          AmbiguousDeadLetter: ``id`` is the message id of several dead letters (nothing
            is requeued: requeuing them all would run the message more than once).
        """
        if self.act("requeue", [id]):
            return True
        letters = self._by_message_id(id, SEARCH_LIMIT)
        if len(letters) > 1:
            raise AmbiguousDeadLetter(self.queue_name, id, [_redis_id(m) for _, m in letters])
        return bool(letters) and self.act("requeue", [_redis_id(letters[0][1])]) > 0

    def remove(self, id: str) -> bool:
        """Delete a dead letter: the one ``id`` is the redis id of, else every one holding
        that message id (see :meth:`find`). Returns False if there is no such dead letter."""
        if self.act("remove", [id]):
            return True
        letters = self._by_message_id(id, SEARCH_LIMIT)
        return bool(letters) and self.act("remove", [_redis_id(m) for _, m in letters]) > 0

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

    def act(self, action: str, redis_message_ids: Sequence[str]) -> int:
        """``"requeue"`` or ``"remove"`` the dead letters of these redis ids only (no
        search by message id; one atomic step); returns how many there were.

        Raises:
          ValueError: Another action; nothing is changed.
        """
        check_action(action)
        if not redis_message_ids:
            return 0
        return self.broker.redisson_scripts.dead(self.keys, action, 0, list(redis_message_ids))

    def _exact(self, redis_message_id: str) -> tuple[int, Message[Any]] | None:
        """The dead letter of this redis id, or None."""
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

    def _by_message_id(self, message_id: str, limit: int | None) -> list[tuple[int, Message[Any]]]:
        """The dead letters holding ``message_id`` among the newest ``limit``, newest
        first, but the one whose redis id it is (the caller looked for it first)."""
        client, xq, xq_msgs = self.broker.client, self.keys.xq, self.keys.xq_msgs
        needle = _needle(message_id)
        # redis id -> time of death, and the data when it was read
        found: dict[str, tuple[int, bytes | None]] = {}
        seen: set[bytes] = set()
        searched = 0
        while limit is None or searched < limit:
            step = SEARCH_STEP if limit is None else min(SEARCH_STEP, limit - searched)
            # Ranks counted from the end: newest first without knowing the size. A death
            # in between shifts them by one: a member read twice is skipped.
            entries = cast(
                "list[tuple[bytes, float]]", client.zrange(xq, -(searched + step), -(searched + 1), withscores=True)
            )
            unread: list[tuple[str, float]] = []
            for member, died in reversed(entries):
                if member in seen:
                    continue
                seen.add(member)
                text = member.decode(errors="replace")
                if _scheduled_member_of(text, message_id):
                    found[text] = (int(died), None)  # its data is read once it is found
                elif _UUID.match(text) and text != message_id:
                    unread.append((text, died))  # an immediate send's or a retry's: its data tells
            if unread:
                stored = cast("list[bytes | None]", client.hmget(xq_msgs, [text for text, _ in unread]))
                for (text, died), data in zip(unread, stored, strict=True):
                    if data is not None and (needle is None or needle in data):
                        found[text] = (int(died), data)
            searched += len(entries)
            if len(entries) < step:
                break
        missing = [redis_id for redis_id, (_, data) in found.items() if data is None]
        if missing:
            stored = cast("list[bytes | None]", client.hmget(xq_msgs, missing))
            for redis_id, data in zip(missing, stored, strict=True):
                found[redis_id] = (found[redis_id][0], data)
        result = []
        for redis_id, (died, data) in found.items():
            message = None if data is None else self._decode(redis_id, data)
            if message is not None and message.message_id == message_id:
                result.append((died, message))
        result.sort(key=lambda letter: -letter[0])
        return result

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


def check_page(start: object, size: object) -> None:
    """:meth:`DeadLetters.page`'s arguments, or a ValueError."""
    check_batch(size, "size")
    if not is_int(start) or start < 0:
        raise ValueError(f"start must be a non-negative int, got {start!r}")


def check_action(action: object) -> None:
    if action not in ("requeue", "remove"):
        raise ValueError(f"action must be 'requeue' or 'remove', got {action!r}")


def _redis_id(message: Message[Any]) -> str:
    return str(message.options["redis_message_id"])


def _scheduled_member_of(member: str, message_id: str) -> bool:
    """Whether ``member`` is a scheduled message's redis id (its sort key and message id)
    for ``message_id``."""
    rest = len(member) - len(message_id)
    return rest > 0 and member.endswith(message_id) and rest == sort_key_length(member)


def _needle(message_id: str) -> bytes | None:
    """Bytes every encoded message of ``message_id`` holds, for the encoders that write it
    as it is (Dramatiq's JSON and pickle encoders, for an id that JSON writes as itself);
    None: decode each to tell."""
    if type(get_encoder()) in (JSONEncoder, PickleEncoder) and _plain(message_id) and message_id:
        return message_id.encode()
    return None
