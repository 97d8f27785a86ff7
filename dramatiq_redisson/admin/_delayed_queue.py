"""A handle on one queue's scheduled messages, after Redisson's ``RDelayedQueue``."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dramatiq.message import Message

from .._ids import message_id_of, same_sort_key, sort_key_length
from .._keys import QueueKeys
from .._logs import logger_for
from .._message import decode_scheduled, validate_delay
from .._settings import is_int
from ._paging import BULK_STEP, check_batch, check_limit, in_steps, read_head
from ._stats import OVERDUE_GRACE

if TYPE_CHECKING:
    from ..scripts._calls import ScriptsHost


#: Default entries per server call of :meth:`DelayedQueue.scan`.
SCAN_BATCH = 500


#: Entries :meth:`DelayedQueue.page` examines at most per call when it filters: 20 calls
#: of :data:`SCAN_BATCH`, about 100 ms of server and client time in all (a dashboard
#: search over a million scheduled that matches nothing took 208 ms p50 at 20 000).
SEARCH_BUDGET = 10_000


@dataclass(frozen=True)
class ScheduledPage:
    """A page of :meth:`DelayedQueue.page`."""

    #: ``(due epoch ms, message)``, in due order.
    entries: list[tuple[int, Message[Any]]]
    #: Where the next page starts (pass it as ``after``), or ``None`` after the last one.
    cursor: str | None
    #: How many scheduled entries were read to fill the page (more than its length when
    #: it filtered).
    examined: int


def encode_cursor(cursor: tuple[bytes, bytes]) -> str:
    """A scan position (due time, member) as a URL-safe string."""
    due, member = cursor
    return base64.urlsafe_b64encode(due + b"|" + member).decode().rstrip("=")


def decode_cursor(text: str | None) -> tuple[bytes, bytes] | None:
    """The scan position of :func:`encode_cursor`'s string (``None`` stays ``None``).

    Raises:
      ValueError: Not such a string."""
    if text is None or text == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        due, member = raw.split(b"|", 1)
        int(due)
    except (ValueError, TypeError):
        raise ValueError(f"malformed page cursor {text!r}") from None
    if len(member) <= sort_key_length(member):
        raise ValueError(f"malformed page cursor {text!r}")
    return due, member


def match_needles(match: str | bytes | None) -> tuple[bytes, ...]:
    """The byte strings any one of which an encoded message must contain to match
    ``match``: the text as given, and (for text) as a JSON encoder writes it inside a
    string (Dramatiq's encoder escapes non-ASCII as ``\\uXXXX`` and ``"`` as ``\\"``), so a
    search for what a page shows (``Zürich``, ``say "hi"``) finds the stored message."""
    if not match:
        return ()
    if isinstance(match, bytes):
        return (match,)
    variants = {match.encode(), json.dumps(match)[1:-1].encode(), json.dumps(match, ensure_ascii=False)[1:-1].encode()}
    return tuple(sorted(variants))


def prefilter(actor_name: str | None, match: str | bytes | None) -> Callable[[bytes], bool]:
    """A test on a stored payload's bytes, before decoding: it contains the actor's name
    (confirmed on the decoded message) and one of :func:`match_needles`."""
    needles = match_needles(match)
    actor = actor_name.encode() if actor_name is not None else b""

    def wanted(data: bytes) -> bool:
        return actor in data and (not needles or any(needle in data for needle in needles))

    return wanted


class DelayedQueue:
    """The scheduled (not yet due) messages of one queue.

    Obtain it with :meth:`RedissonBroker.delayed_queue`. Every method is one round
    trip and costs O(log n) or O(returned) on the server. (A queue with shards gets a
    :class:`~dramatiq_redisson.sharding._views.ShardedDelayedQueue`: the same methods
    over all its shards.)

    ``queue_name``: the name its messages are read back with, when it is not the keys'
    own (a shard of a sharded queue: the queue's name).
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
        """The number of scheduled messages."""
        return int(self.broker.client.zcard(self.keys.timeout_zset))

    def contains(self, message_id: str) -> bool:
        """Whether a message (or a pending retry of it) is scheduled."""
        return bool(self.broker.client.hexists(self.keys.payloads, message_id))

    def remove(self, message_id: str) -> bool:
        """Cancel a scheduled message, or the pending retry of one (its dedupe key, if
        any, is released). Returns whether something was cancelled (False if it already
        moved to the ready queue)."""
        return self._cancel([message_id], by_key=False) > 0

    def remove_many(self, message_ids: Iterable[str]) -> int:
        """Cancel several scheduled messages (or pending retries) by id, in one atomic
        server step. Returns how many were cancelled."""
        message_ids = list(message_ids)
        return self._cancel(message_ids, by_key=False) if message_ids else 0

    def _cancel(self, names: list[str], *, by_key: bool) -> int:
        """Cancel by message ids (``by_key``: by dedupe keys); how many were scheduled."""
        return self.broker.redisson_scripts.cancel(self.keys, names, by_key=by_key)

    def clear(self) -> int:
        """Cancel every scheduled message of the queue. Returns how many there were."""
        return int(self.broker.redisson_scripts.clear(self.keys))

    def get(self, message_id: str) -> tuple[int, Message[Any]] | None:
        """A scheduled message (or the pending retry of one) and its due time (epoch ms,
        server clock), or ``None`` if it is not scheduled (it moved, was cancelled, or
        never was). One atomic read."""
        return self._peek(message_id, by_key=False)

    def get_by_key(self, dedupe_key: str) -> tuple[int, Message[Any]] | None:
        """The scheduled message that holds ``dedupe_key`` (sent with
        ``dedupe_key=…``, see :meth:`RedissonBroker.enqueue`) and its due time (epoch
        ms, server clock), or ``None`` when no scheduled message holds it (a throttle
        window left by a message that moved does not count). One atomic read."""
        return self._peek(dedupe_key, by_key=True)

    def remove_by_key(self, dedupe_key: str) -> bool:
        """Cancel the scheduled message that holds ``dedupe_key``; its key is released.
        Returns whether something was cancelled. A throttle window (``dedupe_ttl``) of a
        message that already moved is left to run out."""
        return self._cancel([dedupe_key], by_key=True) > 0

    def _peek(self, name: str, *, by_key: bool) -> tuple[int, Message[Any]] | None:
        found = self.broker.redisson_scripts.peek(self.keys, name, by_key=by_key)
        if found is None:
            return None
        due, stored, message_id = found
        message = self._decode(stored[: sort_key_length(stored)] + message_id.encode(), stored)
        return None if message is None else (due, message)

    def reschedule(self, message_id: str, *, delay: Any = None, at: int | datetime.datetime | None = None) -> bool:
        """Move a scheduled message to a new due time: ``delay`` from now (ms, or a
        :class:`datetime.timedelta`) or ``at`` an absolute time (epoch ms, or an aware
        :class:`datetime.datetime`; a time in the past means now). Times are on the
        server's clock. The message keeps its id. One atomic server step.

        Returns False if the message is no longer scheduled (it moved or was cancelled).

        Raises:
          TypeError, ValueError: Neither or both of ``delay`` and ``at``, a naive datetime,
            or a delay the broker would refuse for a send; nothing is changed.
        """
        if (delay is None) == (at is None):
            raise TypeError("reschedule() takes exactly one of delay= or at=")
        if at is not None:
            return self._reschedule(message_id, "at", self._epoch_ms(at))
        delay_ms = validate_delay(delay.total_seconds() * 1000 if isinstance(delay, datetime.timedelta) else delay)
        return self._reschedule(message_id, "in", delay_ms or 0)

    def promote(self, message_id: str) -> bool:
        """Run a scheduled message now: it becomes due at once and the queue's transfer
        lease holder moves it to the ready queue within a few ms (idle consumers are woken
        as for any ready message). Returns False if it is no longer scheduled."""
        return self._reschedule(message_id, "at", 0)

    def _reschedule(self, message_id: str, mode: str, value_ms: int) -> bool:
        """A new due time (``"in"`` ms from now, or ``"at"`` epoch ms); whether it was scheduled."""
        return self.broker.redisson_scripts.reschedule(self.keys, message_id, mode, value_ms) is not None

    def count(self, *, due_before: int | datetime.datetime | None = None) -> int:
        """How many messages are scheduled; with ``due_before`` (epoch ms or an aware
        datetime), only those due before it."""
        if due_before is None:
            return self._count("all", 0)
        return self._count("before", self._epoch_ms(due_before))

    def overdue(self, *, grace: int = OVERDUE_GRACE) -> int:
        """How many messages were due more than ``grace`` ms ago (server clock) and are still
        scheduled: they should have moved already. Above zero for long, no consumer of the
        queue is running (or none can reach the server): the "stuck" alarm."""
        if not isinstance(grace, int) or grace < 0:
            raise ValueError(f"grace must be a non-negative int of ms, got {grace!r}")
        return self._count("overdue", grace)

    def _count(self, mode: str, value_ms: int) -> int:
        """Scheduled messages: ``"all"``, due ``"before"`` an epoch ms, or ``"overdue"`` by more than ``value_ms``."""
        return self.broker.redisson_scripts.count(self.keys, mode, value_ms)

    def scan(
        self, *, actor_name: str | None = None, match: str | bytes | None = None, batch: int = SCAN_BATCH
    ) -> Iterator[tuple[int, Message[Any]]]:
        """Every scheduled message as ``(due epoch ms, message)``, in due order, read
        ``batch`` at a time (one O(log n + batch) server call per page, never the whole
        set at once). Entries scheduled, moved or rescheduled while the scan runs may or
        may not be seen; none is seen twice unless it was rescheduled later than the
        scan's position.

        Parameters:
          actor_name: Only this actor's messages.
          match: Only messages whose encoded form contains this substring, as
            given or as JSON writes it in a string (``Zürich`` also finds
            ``Z\\u00fcrich``, ``say "hi"`` finds ``say \\"hi\\"``; see :func:`match_needles`).
          batch: Entries per server call (:data:`SCAN_BATCH`, 500: about 1 ms of server
            time with a million scheduled; pages of 1 000 measured up to 10 ms on a
            busy 2-core host).

        Raises:
          ValueError: A batch that is not a positive int.
        """
        for member, due, data in self._scan_raw(batch=batch, actor_name=actor_name, match=match):
            message = self._selected(member, data, actor_name)
            if message is not None:
                yield due, message

    def page(
        self,
        *,
        after: str | None = None,
        size: int = 25,
        actor_name: str | None = None,
        match: str | bytes | None = None,
        budget: int | None = None,
    ) -> ScheduledPage:
        """One page of scheduled messages in due order, for a paged view of any size
        (a dashboard, an API): up to ``size`` entries after the cursor ``after`` (a
        previous page's :attr:`ScheduledPage.cursor`; ``None``: from the head). With a
        filter, at most ``budget`` entries (default :data:`SEARCH_BUDGET`) are examined per call, so a rare match costs
        a bounded time per page; the page may then come back short, with a cursor to go
        on from. Cost: O(log n + examined) on the server, in calls of :data:`SCAN_BATCH`.

        Raises:
          ValueError: A malformed cursor, or a size or budget that is not a positive int.
        """
        check_batch(size, "size")
        budget = check_batch(SEARCH_BUDGET if budget is None else budget, "budget")
        cursor = decode_cursor(after)
        wanted = prefilter(actor_name, match)
        entries: list[tuple[int, Message[Any]]] = []
        examined = 0
        filtered = actor_name is not None or bool(match)
        while True:
            want = min(SCAN_BATCH, budget - examined) if filtered else size - len(entries)
            rows, more = self._scan_page(want, cursor)
            for i, (member, due, data) in enumerate(rows):
                examined += 1
                cursor = (str(due).encode(), member)
                if data is None or not same_sort_key(data, member) or not wanted(data):
                    continue  # moved or cancelled between the reads, or filtered out
                message = self._selected(member, data, actor_name)
                if message is None:
                    continue
                entries.append((due, message))
                if len(entries) == size:
                    rest = i < len(rows) - 1 or more is not None
                    return ScheduledPage(entries, encode_cursor(cursor) if rest else None, examined)
            if more is None:
                return ScheduledPage(entries, None, examined)
            if filtered and examined >= budget:
                return ScheduledPage(entries, encode_cursor(cursor) if cursor else None, examined)

    def _scan_page(
        self, size: int, cursor: tuple[bytes, bytes] | None
    ) -> tuple[list[tuple[bytes, int, bytes | None]], tuple[bytes, bytes] | None]:
        """Up to ``size`` ``(member, due, stored payload or None)`` in due order after
        ``cursor`` (a ``(due, member)`` position), and the next cursor (``None`` at the
        end). A position is one of the order of every scheduled entry (due time, then
        member), so it stands for the same place in any shard of a queue."""
        return self.broker.redisson_scripts.scan(self.keys, size, cursor)

    def _selected(self, member: bytes, data: bytes, actor_name: str | None) -> Message[Any] | None:
        """The message of a stored payload, if it decodes and is ``actor_name``'s (when given)."""
        message = self._decode(member, data)
        if message is None or (actor_name is not None and message.actor_name != actor_name):
            return None
        return message

    def _scan_raw(
        self, *, batch: int, actor_name: str | None = None, match: str | bytes | None = None
    ) -> Iterator[tuple[bytes, int, bytes]]:
        """``(member, due, stored payload)`` of scheduled entries in due order, pre-filtered
        on the encoded bytes (``match``, and the actor name's text when given)."""
        check_batch(batch)
        wanted = prefilter(actor_name, match)
        cursor: tuple[bytes, bytes] | None = None
        while True:
            page, cursor = self._scan_page(batch, cursor)
            for member, due, data in page:
                if data is None or not same_sort_key(data, member):
                    continue  # moved or cancelled between the reads
                if wanted(data):
                    yield member, due, data
            if cursor is None:
                return

    def promote_all(
        self, *, actor_name: str | None = None, match: str | bytes | None = None, limit: int | None = None
    ) -> int:
        """Run scheduled messages now (all, or only ``actor_name``'s and/or those whose
        encoded form contains ``match``, as :meth:`scan` filters; at most ``limit``),
        earliest first, as :meth:`promote` does for one. Works in server steps of at most
        :data:`BULK_STEP` messages, so no single call blocks the server for long; each
        step is atomic, the whole is not (messages scheduled meanwhile may be left).

        Returns how many were promoted."""
        return self._bulk("promote", actor_name, match, limit)

    def remove_all(
        self, *, actor_name: str | None = None, match: str | bytes | None = None, limit: int | None = None
    ) -> int:
        """Cancel scheduled messages (all, or those :meth:`promote_all`'s filters select; at most ``limit``),
        earliest first, in bounded server steps as :meth:`promote_all`. Returns how many
        were removed. (:meth:`clear` removes everything in one call.)"""
        return self._bulk("remove", actor_name, match, limit)

    def _bulk(self, action: str, actor_name: str | None, match: str | bytes | None, limit: int | None) -> int:
        limit = check_limit(limit)
        scripts = self.broker.redisson_scripts
        # Bounded by what is scheduled now: producers sending meanwhile cannot keep it going.
        remaining = self.size() if limit is None else min(limit, self.size())
        if actor_name is None and not match:
            return in_steps(remaining, BULK_STEP, lambda n: scripts.bulk(self.keys, action, n))
        done = 0
        members: list[bytes] = []
        for member, _, data in self._scan_raw(batch=BULK_STEP, actor_name=actor_name, match=match):
            if remaining <= 0:
                break
            if self._selected(member, data, actor_name) is None:
                continue
            members.append(member)
            remaining -= 1
            if len(members) == BULK_STEP:
                done += scripts.bulk(self.keys, action, 0, members)
                members = []
        if members:
            done += scripts.bulk(self.keys, action, 0, members)
        return done

    @staticmethod
    def _epoch_ms(when: int | datetime.datetime) -> int:
        if isinstance(when, datetime.datetime):
            if when.tzinfo is None or when.utcoffset() is None:
                raise ValueError("a datetime must be timezone-aware (e.g. datetime.now(timezone.utc))")
            return int(when.timestamp() * 1000)
        if not is_int(when):
            raise TypeError(f"a time must be epoch ms (int) or an aware datetime, not {type(when).__name__}")
        if when < 0:
            raise ValueError(f"a time must not be negative, got {when!r}")
        return when

    def next_due(self) -> int | None:
        """The earliest due time (epoch ms, server clock), or None when nothing is scheduled."""
        head = self.broker.client.zrange(self.keys.timeout_zset, 0, 0, withscores=True)
        return int(head[0][1]) if head else None

    def read_all(self, limit: int | None = None) -> list[tuple[int, Message[Any]]]:
        """Scheduled messages as ``(due epoch ms, message)`` pairs, earliest first.

        Entries that cannot be decoded are skipped with a logged error.

        Raises:
          ValueError: A negative ``limit``.
        """
        result: list[tuple[int, Message[Any]]] = []
        heads = read_head(self.broker.client, self.keys.timeout_zset, self.keys.payloads, limit, message_id_of)
        for member, due, data in heads:
            # An entry may have moved or been cancelled between the two reads.
            if data is None or not same_sort_key(data, member):
                continue
            message = self._decode(member, data)
            if message is not None:
                result.append((int(due), message))
        return result

    def _decode(self, member: bytes, stored: bytes) -> Message[Any] | None:
        """The message of a stored payload (sort key + payload: see
        :func:`~dramatiq_redisson._message.encode_scheduled`); ``None``, with a logged
        error, if it cannot be decoded."""
        try:
            return decode_scheduled(member, stored, self.queue_name)
        except Exception:
            self.logger.error("Could not decode scheduled entry %r of queue %r.", member, self.queue_name)
            return None

    def __len__(self) -> int:
        return self.size()

    def __contains__(self, message_id: object) -> bool:
        return isinstance(message_id, str) and self.contains(message_id)
