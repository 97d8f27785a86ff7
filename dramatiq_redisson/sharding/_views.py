"""A sharded queue's scheduled messages and dead letters seen as one queue's (issue 36;
docs/sharding-design.md): :meth:`RedissonBroker.delayed_queue` and
:meth:`RedissonBroker.dead_letters` of a queue with shards return these, with the public
methods of :class:`DelayedQueue` and :class:`DeadLetters`, over one view per shard.

A sharded queue is a list of queues: each view here holds one one-shard view per shard
(each built on its own shard's keys) and has no keys of its own. Every public method
folds over the list through the shard views' public methods only: listings are a k-way
merge of the shards' (by due time, or time of death); counts add up; an operation on one
message asks the shards in turn (a queue has few) and acts on the one that holds it; a
dedupe key is looked for first in the shard it hashes to. Each shard's step is atomic,
as it is on a queue without shards; a step over the whole queue is not (as a bulk step
over many messages is not either).

The views are still instances of :class:`DelayedQueue` and :class:`DeadLetters` (what
the broker's methods return), but they define every public method themselves and do
not run the one-shard ``__init__``: a public method added to a one-shard view and not
folded here fails on a sharded one (no ``keys``), instead of reading one shard, and
tests/sharding/test_sharded_views.py names it.
"""

from __future__ import annotations

import datetime
import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from dramatiq.message import Message

from ..admin._dead_letters import SEARCH_LIMIT, AmbiguousDeadLetter, DeadLetters, check_action, check_page
from ..admin._delayed_queue import SCAN_BATCH, DelayedQueue, ScheduledPage, decode_cursor, encode_cursor
from ..admin._paging import BULK_STEP, check_batch, check_limit
from ..admin._stats import OVERDUE_GRACE

#: A place in the order of every scheduled entry: (due epoch ms, member).
_Position = tuple[int, bytes]


def _redis_id(message: Message[Any]) -> str:
    return str(message.options.get("redis_message_id", ""))


def _message_order(letter: tuple[int, Message[Any]]) -> tuple[int, str]:
    """Messages by due time (dead letters: time of death), then redis id (a scheduled
    entry's member: the order of a shard's ZSET)."""
    return letter[0], _redis_id(letter[1])


def _position(entry: tuple[int, Message[Any]]) -> _Position:
    return entry[0], _redis_id(entry[1]).encode()


def _cursor_position(cursor: str) -> _Position:
    due, member = decode_cursor(cursor) or (b"0", b"")
    return int(due), member


def _two_or_more(shards: Sequence[Any]) -> None:
    if len(shards) < 2:
        raise ValueError("a sharded view needs two shards or more")


class ShardedDelayedQueue(DelayedQueue):
    """The scheduled messages of a queue with shards, as one queue's (see the module).

    ``shards``: one view per shard, shard 0 (the queue's own keys) first. ``key_shard``:
    the internal name of the shard a dedupe key hashes to. Paging (:meth:`page`) takes
    the same cursor as on one queue: a position in the order of every entry, which stands
    for the same place in each shard; a page reads each shard's page of ``size`` entries
    after it (with a filter, up to ``budget`` entries of each shard).
    """

    def __init__(self, shards: Sequence[DelayedQueue], key_shard: Callable[[str], str]) -> None:
        # Not DelayedQueue.__init__: this view has no keys, and no broker, of its own.
        _two_or_more(shards)
        self.shards = list(shards)
        self.key_shard = key_shard

    @property
    def queue_name(self) -> str:
        return self.shards[0].queue_name

    def _by_key_first(self, key: str) -> list[DelayedQueue]:
        """The shards, the one ``key`` hashes to first. A key can be in another shard
        when the layout changed since it was sent (the queue grew or shrank: its shard
        moved), so the others are asked after it."""
        home = self.key_shard(key)
        return sorted(self.shards, key=lambda shard: shard.keys.queue_name != home)

    def size(self) -> int:
        return sum(shard.size() for shard in self.shards)

    def contains(self, message_id: str) -> bool:
        return any(shard.contains(message_id) for shard in self.shards)

    def remove(self, message_id: str) -> bool:
        return self.remove_many([message_id]) > 0

    def remove_many(self, message_ids: Iterable[str]) -> int:
        # A message id is in one shard; cancelling in each costs a call per shard.
        ids = list(message_ids)
        return sum(shard.remove_many(ids) for shard in self.shards) if ids else 0

    def clear(self) -> int:
        return sum(shard.clear() for shard in self.shards)

    def get(self, message_id: str) -> tuple[int, Message[Any]] | None:
        for shard in self.shards:
            found = shard.get(message_id)
            if found is not None:
                return found
        return None

    def get_by_key(self, dedupe_key: str) -> tuple[int, Message[Any]] | None:
        for shard in self._by_key_first(dedupe_key):
            found = shard.get_by_key(dedupe_key)
            if found is not None:
                return found
        return None

    def remove_by_key(self, dedupe_key: str) -> bool:
        return any(shard.remove_by_key(dedupe_key) for shard in self._by_key_first(dedupe_key))

    def reschedule(self, message_id: str, *, delay: Any = None, at: int | datetime.datetime | None = None) -> bool:
        # The first shard checks the arguments (and raises) before anything is changed.
        return any(shard.reschedule(message_id, delay=delay, at=at) for shard in self.shards)

    def promote(self, message_id: str) -> bool:
        return any(shard.promote(message_id) for shard in self.shards)

    def count(self, *, due_before: int | datetime.datetime | None = None) -> int:
        return sum(shard.count(due_before=due_before) for shard in self.shards)

    def overdue(self, *, grace: int = OVERDUE_GRACE) -> int:
        return sum(shard.overdue(grace=grace) for shard in self.shards)

    def next_due(self) -> int | None:
        dues = [due for due in (shard.next_due() for shard in self.shards) if due is not None]
        return min(dues) if dues else None

    def read_all(self, limit: int | None = None) -> list[tuple[int, Message[Any]]]:
        limit = check_limit(limit)
        merged = heapq.merge(*(shard.read_all(limit) for shard in self.shards), key=_message_order)
        return list(itertools.islice(merged, limit))

    def scan(
        self, *, actor_name: str | None = None, match: str | bytes | None = None, batch: int = SCAN_BATCH
    ) -> Iterator[tuple[int, Message[Any]]]:
        scans = (shard.scan(actor_name=actor_name, match=match, batch=batch) for shard in self.shards)
        yield from heapq.merge(*scans, key=_message_order)

    def page(
        self,
        *,
        after: str | None = None,
        size: int = 25,
        actor_name: str | None = None,
        match: str | bytes | None = None,
        budget: int | None = None,
    ) -> ScheduledPage:
        check_batch(size, "size")
        decode_cursor(after)  # a malformed cursor is refused before a shard is read
        pages = [
            shard.page(after=after, size=size, actor_name=actor_name, match=match, budget=budget)
            for shard in self.shards
        ]
        examined = sum(page.examined for page in pages)
        # Each shard's page holds every entry of it up to the page's cursor that the
        # filters select (all of them, without a cursor): the merged page is complete up
        # to the nearest of those cursors.
        ends = [_cursor_position(page.cursor) for page in pages if page.cursor is not None]
        end = min(ends) if ends else None
        entries = sorted(
            (entry for page in pages for entry in page.entries if end is None or _position(entry) <= end),
            key=_message_order,
        )
        if len(entries) > size:
            entries = entries[:size]
            due, member = _position(entries[-1])
            return ScheduledPage(entries, encode_cursor((str(due).encode(), member)), examined)
        if end is None:
            return ScheduledPage(entries, None, examined)
        return ScheduledPage(entries, encode_cursor((str(end[0]).encode(), end[1])), examined)

    def promote_all(
        self, *, actor_name: str | None = None, match: str | bytes | None = None, limit: int | None = None
    ) -> int:
        return sum(
            shard.promote_all(actor_name=actor_name, match=match, limit=quota)
            for shard, quota in self._shares(actor_name, match, limit)
        )

    def remove_all(
        self, *, actor_name: str | None = None, match: str | bytes | None = None, limit: int | None = None
    ) -> int:
        return sum(
            shard.remove_all(actor_name=actor_name, match=match, limit=quota)
            for shard, quota in self._shares(actor_name, match, limit)
        )

    def _shares(
        self, actor_name: str | None, match: str | bytes | None, limit: int | None
    ) -> list[tuple[DelayedQueue, int | None]]:
        """Each shard with the limit of its part of a bulk step: without ``limit``, every
        shard and no limit; with one, how many of the earliest ``limit`` selected entries
        of the whole queue fall in each shard (each then acts on its earliest that many:
        the same ones, unless they moved meanwhile)."""
        limit = check_limit(limit)
        if limit is None:
            return [(shard, None) for shard in self.shards]

        def tagged(index: int, shard: DelayedQueue) -> Iterator[tuple[tuple[int, str], int]]:
            for entry in shard.scan(actor_name=actor_name, match=match, batch=BULK_STEP):
                yield _message_order(entry), index

        merged = heapq.merge(*(tagged(index, shard) for index, shard in enumerate(self.shards)))
        quotas = Counter(index for _, index in itertools.islice(merged, limit))
        return [(self.shards[index], quota) for index, quota in quotas.items()]

    def __len__(self) -> int:
        return self.size()

    def __contains__(self, message_id: object) -> bool:
        return isinstance(message_id, str) and self.contains(message_id)


class ShardedDeadLetters(DeadLetters):
    """The dead letters of a queue with shards, as one queue's (see the module).

    ``shards``: one view per shard, shard 0 first. A page of :meth:`page` from ``start``
    reads the entries of at most ``start + size`` dead letters of each shard, and the
    messages of the page's only. A search by message id (:meth:`find`) looks among the
    newest ``limit`` of each shard.
    """

    def __init__(self, shards: Sequence[DeadLetters]) -> None:
        # Not DeadLetters.__init__: this view has no keys, and no broker, of its own.
        _two_or_more(shards)
        self.shards = list(shards)

    @property
    def queue_name(self) -> str:
        return self.shards[0].queue_name

    def size(self) -> int:
        return sum(shard.size() for shard in self.shards)

    def read_all(self, limit: int | None = None) -> list[tuple[int, Message[Any]]]:
        limit = check_limit(limit)
        merged = heapq.merge(*(shard.read_all(limit) for shard in self.shards), key=_message_order)
        return list(itertools.islice(merged, limit))

    def _newest_tagged(self, start: int, size: int) -> list[tuple[int, tuple[str, int]]]:
        """``(shard index, entry)`` of ``size`` dead letters of the whole queue from
        position ``start``, newest first: they are among the newest ``start + size`` of
        each shard."""
        check_page(start, size)
        tagged = [(index, entry) for index, shard in enumerate(self.shards) for entry in shard.newest(0, start + size)]
        tagged.sort(key=lambda item: (item[1][1], item[1][0]), reverse=True)
        return tagged[start : start + size]

    def newest(self, start: int = 0, size: int = 25) -> list[tuple[str, int]]:
        return [entry for _, entry in self._newest_tagged(start, size)]

    def oldest(self, count: int) -> list[tuple[str, int]]:
        entries = [entry for shard in self.shards for entry in shard.oldest(count)]
        return sorted(entries, key=lambda entry: (entry[1], entry[0]))[: max(count, 0)]

    def page(self, start: int = 0, size: int = 25) -> list[tuple[int, Message[Any]]]:
        # Each shard's messages are read for its own entries of the page only.
        by_shard: dict[int, list[tuple[str, int]]] = {}
        for index, entry in self._newest_tagged(start, size):
            by_shard.setdefault(index, []).append(entry)
        letters = [letter for index, entries in by_shard.items() for letter in self.shards[index].load(entries)]
        return sorted(letters, key=_message_order, reverse=True)

    def load(self, entries: Sequence[tuple[str, int]]) -> list[tuple[int, Message[Any]]]:
        # An entry names no shard: each is read from the first shard that holds it.
        found: dict[str, tuple[int, Message[Any]]] = {}
        for shard in self.shards:
            wanted = [entry for entry in entries if entry[0] not in found]
            if not wanted:
                break
            for letter in shard.load(wanted):
                found.setdefault(_redis_id(letter[1]), letter)
        return [found[redis_id] for redis_id, _ in entries if redis_id in found]

    def existing(self, redis_message_ids: Sequence[str]) -> list[str]:
        present = {redis_id for shard in self.shards for redis_id in shard.existing(redis_message_ids)}
        return [redis_id for redis_id in redis_message_ids if redis_id in present]

    def _exact(self, redis_message_id: str) -> tuple[int, Message[Any]] | None:
        """The dead letter of this redis id in the first shard that holds it, or None."""
        for shard in self.shards:
            found = shard.find(redis_message_id, limit=0)  # the redis id only: one read
            if found:
                return found[0]
        return None

    def _search(self, message_id: str, limit: int | None) -> list[tuple[int, Message[Any]]]:
        """The dead letters holding ``message_id`` among the newest ``limit`` of each
        shard, newest first (the caller found no dead letter of that redis id)."""
        letters = [letter for shard in self.shards for letter in shard.find(message_id, limit=limit)]
        return sorted(letters, key=_message_order, reverse=True)

    def get(self, id: str) -> tuple[int, Message[Any]] | None:
        found = self._exact(id)
        if found is not None:
            return found
        letters = self._search(id, SEARCH_LIMIT)
        if len(letters) > 1:
            raise AmbiguousDeadLetter(self.queue_name, id, [_redis_id(m) for _, m in letters])
        return letters[0] if letters else None

    def find(self, id: str, *, limit: int | None = SEARCH_LIMIT) -> list[tuple[int, Message[Any]]]:
        limit = check_limit(limit)
        found = self._exact(id)
        if found is not None:
            return [found]
        return self._search(id, limit) if limit != 0 else []

    def requeue(self, id: str) -> bool:
        if self.act("requeue", [id]):
            return True
        letters = self._search(id, SEARCH_LIMIT)
        if len(letters) > 1:
            raise AmbiguousDeadLetter(self.queue_name, id, [_redis_id(m) for _, m in letters])
        return bool(letters) and self.act("requeue", [_redis_id(letters[0][1])]) > 0

    def remove(self, id: str) -> bool:
        if self.act("remove", [id]):
            return True
        letters = self._search(id, SEARCH_LIMIT)
        return bool(letters) and self.act("remove", [_redis_id(m) for _, m in letters]) > 0

    def requeue_all(self, *, limit: int | None = None) -> int:
        limit = check_limit(limit)
        if limit is None:
            return sum(shard.requeue_all() for shard in self.shards)
        # The oldest `limit` of the whole queue: how many fall in each shard, then each
        # shard requeues its oldest that many.
        oldest = [
            (died, redis_id, index) for index, shard in enumerate(self.shards) for redis_id, died in shard.oldest(limit)
        ]
        quotas = Counter(index for _, _, index in sorted(oldest)[:limit])
        return sum(self.shards[index].requeue_all(limit=quota) for index, quota in quotas.items())

    def clear(self) -> int:
        return sum(shard.clear() for shard in self.shards)

    def act(self, action: str, redis_message_ids: Sequence[str]) -> int:
        check_action(action)
        ids = list(dict.fromkeys(redis_message_ids))
        if action == "remove":
            return sum(shard.act("remove", ids) for shard in self.shards)
        # A requeue runs the message again: each id is requeued from one shard only, the
        # first that holds it (a message sent again after it died can have died in two).
        done = 0
        for shard in self.shards:
            if not ids:
                break
            present = shard.existing(ids)
            if present:
                done += shard.act("requeue", present)
                ids = [redis_id for redis_id in ids if redis_id not in present]
        return done

    def __len__(self) -> int:
        return self.size()
