"""A sharded queue's scheduled messages and dead letters seen as one queue's (issue 36;
docs/sharding-design.md): :meth:`RedissonBroker.delayed_queue` and
:meth:`RedissonBroker.dead_letters` of a queue with shards return these, with the public
methods of :class:`DelayedQueue` and :class:`DeadLetters`, over one handle per shard.

They inherit every public method and replace the steps under them that read or change
the keys: listings are a k-way merge of the shards' (by due time, or time of death);
counts add up; an operation on one message asks the shards in turn (a queue has few)
and acts on the one that holds it; a dedupe key is looked for first in the shard it
hashes to. Each shard's step is atomic, as it is on a queue without shards; a step over
the whole queue is not (as a bulk step over many messages is not either).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dramatiq.message import Message

from ..admin._dead_letters import DeadLetters, check_action, check_page
from ..admin._delayed_queue import DelayedQueue
from ..admin._paging import BULK_STEP, check_limit

if TYPE_CHECKING:
    from ..scripts._calls import ScriptsHost

#: A scheduled entry as the shards' scans give it: (member, due epoch ms, stored payload).
_Row = tuple[bytes, int, bytes | None]


def _due_order(row: _Row) -> tuple[int, bytes]:
    """The order of the scheduled entries: due time, then member (a shard's ZSET order)."""
    return row[1], row[0]


def _message_order(letter: tuple[int, Message[Any]]) -> tuple[int, str]:
    """Messages by due time (dead letters: time of death), then redis id."""
    return letter[0], str(letter[1].options.get("redis_message_id", ""))


class ShardedDelayedQueue(DelayedQueue):
    """The scheduled messages of a queue with shards, as one queue's (see the module).

    ``shards``: one handle per shard, shard 0 (the queue's own keys) first; ``keys`` is
    shard 0's. ``key_shard``: the internal name of the shard a dedupe key hashes to.
    Paging (:meth:`page`) takes the same cursor as on one queue: a position in the
    order of every entry, which stands for the same place in each shard; a page of
    ``size`` reads at most ``size`` entries of each shard.
    """

    def __init__(self, broker: ScriptsHost, shards: Sequence[DelayedQueue], key_shard: Callable[[str], str]) -> None:
        if len(shards) < 2:
            raise ValueError("a sharded view needs two shards or more")
        super().__init__(broker, shards[0].keys, queue_name=shards[0].queue_name)
        self.shards = list(shards)
        self.key_shard = key_shard

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

    def clear(self) -> int:
        return sum(shard.clear() for shard in self.shards)

    def next_due(self) -> int | None:
        dues = [due for due in (shard.next_due() for shard in self.shards) if due is not None]
        return min(dues) if dues else None

    def read_all(self, limit: int | None = None) -> list[tuple[int, Message[Any]]]:
        limit = check_limit(limit)
        merged = heapq.merge(*(shard.read_all(limit) for shard in self.shards), key=_message_order)
        return list(itertools.islice(merged, limit))

    def _cancel(self, names: list[str], *, by_key: bool) -> int:
        if not by_key:
            # A message id is in one shard; cancelling in each costs a call per shard.
            return sum(shard._cancel(names, by_key=False) for shard in self.shards)
        done = 0
        for key in names:
            for shard in self._by_key_first(key):
                if shard._cancel([key], by_key=True):
                    done += 1
                    break
        return done

    def _peek(self, name: str, *, by_key: bool) -> tuple[int, Message[Any]] | None:
        for shard in self._by_key_first(name) if by_key else self.shards:
            found = shard._peek(name, by_key=by_key)
            if found is not None:
                return found
        return None

    def _reschedule(self, message_id: str, mode: str, value_ms: int) -> bool:
        return any(shard._reschedule(message_id, mode, value_ms) for shard in self.shards)

    def _count(self, mode: str, value_ms: int) -> int:
        return sum(shard._count(mode, value_ms) for shard in self.shards)

    def _scan_page(
        self, size: int, cursor: tuple[bytes, bytes] | None
    ) -> tuple[list[_Row], tuple[bytes, bytes] | None]:
        # The first `size` entries after the cursor are among each shard's first `size`.
        rows: list[_Row] = []
        more = False
        for shard in self.shards:
            part, after = shard._scan_page(size, cursor)
            rows += part
            more = more or after is not None
        rows.sort(key=_due_order)
        if len(rows) > size:
            rows, more = rows[:size], True
        if not more or not rows:
            return rows, None
        member, due, _ = rows[-1]
        return rows, (str(due).encode(), member)

    def _tagged(
        self, batch: int, actor_name: str | None, match: str | bytes | None
    ) -> Iterator[tuple[int, tuple[bytes, int, bytes]]]:
        """``(shard index, (member, due, stored payload))`` of every shard's entries, in
        due order (each shard read ``batch`` at a time, as its :meth:`scan` reads)."""

        def tag(index: int, shard: DelayedQueue) -> Iterator[tuple[int, tuple[bytes, int, bytes]]]:
            for row in shard._scan_raw(batch=batch, actor_name=actor_name, match=match):
                yield index, row

        streams = [tag(index, shard) for index, shard in enumerate(self.shards)]
        return heapq.merge(*streams, key=lambda tagged: _due_order(tagged[1]))

    def _scan_raw(
        self, *, batch: int, actor_name: str | None = None, match: str | bytes | None = None
    ) -> Iterator[tuple[bytes, int, bytes]]:
        for _, row in self._tagged(batch, actor_name, match):
            yield row

    def _bulk(self, action: str, actor_name: str | None, match: str | bytes | None, limit: int | None) -> int:
        limit = check_limit(limit)
        if limit is None:
            return sum(shard._bulk(action, actor_name, match, None) for shard in self.shards)
        # The earliest `limit` over the whole queue: how many fall in each shard, then each
        # shard acts on its earliest that many (the same ones, unless they moved meanwhile).
        quotas: Counter[int] = Counter()
        picked = 0
        for index, (member, _, data) in self._tagged(BULK_STEP, actor_name, match):
            if picked >= limit:
                break
            if self._selected(member, data, actor_name) is not None:
                quotas[index] += 1
                picked += 1
        return sum(self.shards[index]._bulk(action, actor_name, match, quota) for index, quota in quotas.items())


class ShardedDeadLetters(DeadLetters):
    """The dead letters of a queue with shards, as one queue's (see the module).

    ``shards``: one handle per shard, shard 0 first; ``keys`` is shard 0's. A page of
    :meth:`page` from ``start`` reads at most ``start + size`` entries of each shard. A
    search by message id (:meth:`find`) looks among the newest ``limit`` of each shard.
    """

    def __init__(self, broker: ScriptsHost, shards: Sequence[DeadLetters]) -> None:
        if len(shards) < 2:
            raise ValueError("a sharded view needs two shards or more")
        super().__init__(broker, shards[0].keys, queue_name=shards[0].queue_name)
        self.shards = list(shards)

    def size(self) -> int:
        return sum(shard.size() for shard in self.shards)

    def read_all(self, limit: int | None = None) -> list[tuple[int, Message[Any]]]:
        limit = check_limit(limit)
        merged = heapq.merge(*(shard.read_all(limit) for shard in self.shards), key=_message_order)
        return list(itertools.islice(merged, limit))

    def page(self, start: int = 0, size: int = 25) -> list[tuple[int, Message[Any]]]:
        check_page(start, size)
        # The page is among the newest `start + size` of each shard; each shard's data
        # is read for its own entries of the page only.
        newest = [(index, entry) for index, shard in enumerate(self.shards) for entry in shard._newest(0, start + size)]
        newest.sort(key=lambda tagged: (tagged[1][1], tagged[1][0]), reverse=True)
        by_shard: dict[int, list[tuple[bytes, float]]] = {}
        for index, entry in newest[start : start + size]:
            by_shard.setdefault(index, []).append(entry)
        letters = [letter for index, entries in by_shard.items() for letter in self.shards[index]._load(entries)]
        return sorted(letters, key=_message_order, reverse=True)

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
            with shard.broker.client.pipeline(transaction=False) as pipe:
                for redis_id in ids:
                    pipe.zscore(shard.keys.xq, redis_id)
                held = [redis_id for redis_id, died in zip(ids, pipe.execute(), strict=True) if died is not None]
            if held:
                done += shard.act("requeue", held)
                ids = [redis_id for redis_id in ids if redis_id not in held]
        return done

    def _exact(self, redis_message_id: str) -> tuple[int, Message[Any]] | None:
        for shard in self.shards:
            found = shard._exact(redis_message_id)
            if found is not None:
                return found
        return None

    def _by_message_id(self, message_id: str, limit: int | None) -> list[tuple[int, Message[Any]]]:
        letters = [letter for shard in self.shards for letter in shard._by_message_id(message_id, limit)]
        return sorted(letters, key=_message_order, reverse=True)

    def _bulk(self, action: str, limit: int | None) -> int:
        limit = check_limit(limit)
        if limit is None:
            return sum(shard._bulk(action, None) for shard in self.shards)
        # The oldest `limit` of the whole queue: how many fall in each shard, then each
        # shard acts on its oldest that many.
        oldest = [
            (entry[1], entry[0], index) for index, shard in enumerate(self.shards) for entry in shard._oldest(limit)
        ]
        quotas = Counter(index for _, _, index in sorted(oldest)[:limit])
        return sum(self.shards[index]._bulk(action, quota) for index, quota in quotas.items())
