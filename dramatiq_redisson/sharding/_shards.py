"""Where the shards of a queue live (issue 36; see docs/sharding-design.md): which hash
slots a queue spread over several Cluster masters uses.

Shard 0 of queue ``Q`` is the queue itself (its keys carry ``{ns:Q}``, as without shards);
shard ``j`` > 0 carries ``{ns:Q~j}`` (the names are the core's: ``_queue_names``). The
suffixes are chosen once, against the cluster's slot map as it is then (the broker's
``Topology.slot_ranges``), and stored (a later slot migration moves a shard with its
slot, like any key): each new shard goes to the master that holds the fewest shards of
the queue, on the slot farthest from the queue's other shards.
Fixed suffixes spread badly: ``Q~1`` … ``Q~5`` beside ``Q`` put 3/1/2 or 4/1/1 shards
on the three masters of a default split, for common queue names.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import redis
from redis.crc import key_slot

from .._logs import logger_for
from .._queue_names import MAX_SHARDS, base_queue, shard_name

if TYPE_CHECKING:
    from .._held import HeldMessages
    from .._keys import QueueKeys
    from .._settings import BrokerSettings
    from ..connection._topology import Topology
    from ..scripts._calls import Scripts

#: A layout read again that fails so (the server of shard 0 away: a failover of its
#: master, a restart) keeps the layout known (see :meth:`ShardRouter.layout`).
UNREACHABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)

#: How many suffixes the choice looks at (the first ones): with 16 384 slots over a few
#: masters, each master owns some of them many times over.
CANDIDATES = 4096

SLOTS = 16384


def shard_slot(namespace: str, queue_name: str, suffix: int) -> int:
    """The hash slot of a shard's keys (their tag is ``{namespace:shard name}``)."""
    return int(key_slot(f"{namespace}:{shard_name(queue_name, suffix)}".encode()))


def _distance(a: int, b: int) -> int:
    """Slots between ``a`` and ``b`` around the slot ring."""
    d = abs(a - b)
    return min(d, SLOTS - d)


def choose_suffixes(
    namespace: str,
    queue_name: str,
    existing: Sequence[int],
    count: int,
    owner: Callable[[int], str],
) -> list[int]:
    """Suffixes for ``count`` more shards of ``queue_name``, beside its ``existing`` ones
    (0 is the queue itself, and is always a shard). Each new shard in turn goes to a
    master (``owner(slot)``: the node that serves a slot) holding the fewest of the queue's
    shards so far, on the candidate slot farthest from every shard's slot so far; ties go
    to the smallest suffix, so the choice is the same in every process.

    Raises:
      ValueError: more than :data:`MAX_SHARDS` shards in all, or no candidate left.
    """
    taken = list(dict.fromkeys([0, *existing]))
    if count < 0 or len(taken) + count > MAX_SHARDS:
        raise ValueError(f"a queue has 1 to {MAX_SHARDS} shards; asked for {len(taken) + count}")
    candidates = [(j, shard_slot(namespace, queue_name, j)) for j in range(1, CANDIDATES + 1) if j not in taken]
    owners = {slot: owner(slot) for _, slot in candidates}
    slots = [shard_slot(namespace, queue_name, j) for j in taken]
    masters = Counter(owner(slot) for slot in slots)
    for name in set(owners.values()):
        masters.setdefault(name, 0)
    chosen: list[int] = []
    for _ in range(count):
        fewest = min(masters.values())
        best: tuple[int, int, int] | None = None  # (-distance, suffix, slot)
        for j, slot in candidates:
            if j in chosen or masters[owners[slot]] != fewest:
                continue
            distance = min(_distance(slot, other) for other in slots)
            key = (-distance, j, slot)
            if best is None or key < best:
                best = key
        if best is None:
            raise ValueError(f"no slot left for another shard of {queue_name!r} among {CANDIDATES} candidates")
        _, j, slot = best
        chosen.append(j)
        slots.append(slot)
        masters[owners[slot]] += 1
    return chosen


def slot_owner(ranges: Sequence[tuple[int, int, str]]) -> Callable[[int], str]:
    """``owner(slot)`` from ``(first slot, last slot, node)`` ranges (CLUSTER SLOTS); a slot
    in no range belongs to ``""`` (the choice then spreads over the others)."""
    ordered = sorted(ranges)

    def owner(slot: int) -> str:
        for first, last, node in ordered:
            if first <= slot <= last:
                return node
        return ""

    return owner


@dataclass(frozen=True)
class Layout:
    """A sharded queue's stored layout: the suffixes producers send to (``active``, 0
    first) and those being drained (``retired``)."""

    active: tuple[int, ...]
    retired: tuple[int, ...] = ()
    #: Active shards added to the layout less than a safety interval ago: consumers may
    #: not consume them yet, so producers do not send to them yet.
    fresh: tuple[int, ...] = ()

    @property
    def sending(self) -> tuple[int, ...]:
        """The shards producers send to: the active ones, but the fresh."""
        return tuple(j for j in self.active if j not in self.fresh) if self.fresh else self.active

    def names(self, queue_name: str) -> list[str]:
        """Every shard's internal queue name, active ones first (consumers read them all)."""
        return [shard_name(queue_name, j) for j in (*self.active, *self.retired)]

    def encode(self) -> tuple[str, str]:
        return ",".join(map(str, self.active)), ",".join(map(str, self.retired))


def _suffixes(value: bytes | str | None) -> tuple[int, ...]:
    text = value.decode() if isinstance(value, bytes) else (value or "")
    return tuple(int(part) for part in text.split(",") if part)


def plan(namespace: str, queue_name: str, current: Layout | None, count: int, owner: Callable[[int], str]) -> Layout:
    """The layout of ``count`` active shards from ``current`` (None: no layout yet): growing
    takes retired shards back first (they still hold messages), then new suffixes chosen by
    :func:`choose_suffixes`; shrinking retires the last active ones (their messages still run,
    at their due times, and a drained one is dropped later)."""
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"a queue has 1 to {MAX_SHARDS} shards; asked for {count}")
    active = list(current.active) if current else [0]
    retired = list(current.retired) if current else []
    if count > len(active):
        back = retired[: count - len(active)]
        active += back
        retired = retired[len(back) :]
        if count > len(active):
            active += choose_suffixes(namespace, queue_name, [*active, *retired], count - len(active), owner)
    elif count < len(active):
        retired = active[count:] + retired
        active = active[:count]
    return Layout(tuple(active), tuple(retired))


class ShardLayouts:
    """Reads and changes the stored layouts (shards.lua, compare and set: every process
    that starts with ``shards={...}`` calls :meth:`ensure`, and all end with one layout)."""

    #: A write that lost a race is read and decided again this many times.
    ATTEMPTS = 5

    def __init__(self, scripts: Any, keys_of: Callable[[str], Any], owner: Callable[[], Any], fresh_ms: int) -> None:
        self.scripts, self.keys_of, self.owner, self.fresh_ms = scripts, keys_of, owner, fresh_ms

    def read(self, queue_name: str) -> Layout | None:
        active, retired, fresh = self.scripts.shards(self.keys_of(queue_name), "read", self.fresh_ms)
        return Layout(_suffixes(active), _suffixes(retired), _suffixes(fresh)) if active else None

    def ensure(self, namespace: str, queue_name: str, count: int) -> Layout:
        """The stored layout of ``queue_name`` with ``count`` active shards, changed (or made)
        if it has another count."""
        keys = self.keys_of(queue_name)
        for _ in range(self.ATTEMPTS):
            current = self.read(queue_name)
            if current is not None and len(current.active) == count:
                return current
            wanted = plan(namespace, queue_name, current, count, self.owner())
            expected = current.encode()[0] if current else ""
            written, active, retired = self.scripts.shards(keys, "set", expected, *wanted.encode())
            if written:
                return self.read(queue_name) or wanted  # (with the shards just added as fresh)
        raise RuntimeError(f"the shard layout of {queue_name!r} kept changing under {self.ATTEMPTS} attempts")

    def drop(self, queue_name: str, suffix: int, min_age_ms: int) -> bool:
        """Take the retired shard ``suffix`` out of the layout if it was retired at least
        ``min_age_ms`` ago (the caller checked it holds nothing); whether it is out."""
        return bool(self.scripts.shards(self.keys_of(queue_name), "drop", suffix, min_age_ms)[0])

    def retire(self, queue_name: str, suffix: int) -> None:
        """List ``suffix`` among the retired shards again (a dropped shard that received a
        message after all: it is drained, then dropped, again)."""
        keys = self.keys_of(queue_name)
        for _ in range(self.ATTEMPTS):
            current = self.read(queue_name)
            if current is None or suffix in (*current.active, *current.retired):
                return
            wanted = Layout(current.active, (*current.retired, suffix))
            if self.scripts.shards(keys, "set", current.encode()[0], *wanted.encode())[0]:
                return


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping and Veach, 2014): a bucket in ``range(buckets)`` for a
    64-bit ``key``; growing from n to n + 1 buckets moves 1/(n + 1) of the keys, all to
    the new bucket."""
    bucket, jump = -1, 0
    while jump < buckets:
        bucket = jump
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        jump = int((bucket + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return bucket


def key_hash(text: str) -> int:
    """A stable 64-bit hash of a dedupe or group key (the same in every process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def key_suffix(active: Sequence[int], key: str) -> int:
    """The suffix, among a layout's ``active`` ones, of the shard a key's messages go to."""
    return active[jump_hash(key_hash(key), len(active))]


class RouterHost(Protocol):
    """What :class:`ShardRouter` reads of its broker."""

    @property
    def namespace(self) -> str: ...

    @property
    def settings(self) -> BrokerSettings: ...

    @property
    def redisson_scripts(self) -> Scripts: ...

    @property
    def held(self) -> HeldMessages: ...

    @property
    def topology(self) -> Topology: ...

    def keys(self, queue_name: str) -> QueueKeys: ...


class ShardRouter:
    """Which shard a send goes to, and which shards a consumer consumes, for the queues
    named in the broker's ``shards`` setting (a queue not named costs nothing: no read).

    The layout is read from the server (made or changed to the broker's count the first
    time, :meth:`ShardLayouts.ensure`) and read again every ``safety_interval``, so a
    change of the count by another process reaches this one within about that long.
    While shard 0's server cannot be reached, the layout known is kept: sends to the
    other shards go on (nobody can change the layout meanwhile: it is written there)."""

    def __init__(self, broker: RouterHost) -> None:
        self.broker = broker
        self.logger = logger_for(type(self))
        #: The last read again failed (logged once per failing spell).
        self._stale: set[str] = set()
        self.layouts = ShardLayouts(
            broker.redisson_scripts, broker.keys, self._owner, int(broker.settings.safety_interval)
        )
        self._cache: dict[str, tuple[Layout, float]] = {}
        self._turn = itertools.count(random.randrange(1 << 16))
        self._lock = threading.Lock()

    def sharded(self, queue_name: str) -> bool:
        return bool(self.broker.settings.shard_count(queue_name) > 1)

    def layout(self, queue_name: str) -> Layout:
        """The queue's layout (made or changed to this broker's count on first use)."""
        now = time.monotonic()
        cached = self._cache.get(queue_name)
        if cached is not None and now < cached[1]:
            return cached[0]
        with self._lock:
            if cached is None:
                count = self.broker.settings.shard_count(queue_name)
                layout = self.layouts.ensure(self.broker.namespace, queue_name, count)
            else:
                layout = self._read_again(queue_name, cached[0])
            self._cache[queue_name] = (layout, now + self.broker.settings.safety_interval / 1000)
            return layout

    def forget(self, queue_name: str) -> None:
        """Read the queue's layout again at its next use (it was changed here)."""
        cached = self._cache.get(queue_name)
        if cached is not None:
            self._cache[queue_name] = (cached[0], 0.0)

    def _read_again(self, queue_name: str, known: Layout) -> Layout:
        """The stored layout, or ``known`` when it cannot be read now (see the class)."""
        try:
            layout = self.layouts.read(queue_name) or known
        except UNREACHABLE as e:
            if queue_name not in self._stale:
                self._stale.add(queue_name)
                self.logger.warning(
                    "Could not read the shard layout of queue %r (%s); sending by the layout known until it can be.",
                    queue_name,
                    e,
                )
            return known
        if queue_name in self._stale:
            self._stale.discard(queue_name)
            self.logger.info("The shard layout of queue %r can be read again.", queue_name)
        return layout

    def consumed(self, queue_name: str) -> list[str]:
        """The internal queue names a consumer of ``queue_name`` reads: every shard, active
        and retired (``[queue_name]`` when the queue is not sharded)."""
        if not self.sharded(queue_name):
            return [queue_name]
        return self.layout(queue_name).names(queue_name)

    def target(self, queue_name: str, options: dict[str, Any], in_flight: str = "") -> str:
        """The internal queue name a send of a message of ``queue_name`` goes to: a retry
        to the shard its copy runs from (``in_flight``); a message with a ``dedupe_key`` or
        a ``group_key`` to the shard its key hashes to (so that its key's guarantees stay
        in one slot); any other in turn over the active shards."""
        if not self.sharded(queue_name):
            return queue_name
        if in_flight:
            holder = self.broker.held.queue_of(in_flight)
            if holder is not None and base_queue(holder) == queue_name:
                return str(holder)
        active = self.layout(queue_name).sending
        key = _key_of(options)
        if key:
            suffix = key_suffix(active, key)
        else:
            suffix = active[next(self._turn) % len(active)]
        return shard_name(queue_name, suffix)

    def targets(self, sends: Sequence[tuple[str, dict[str, Any]]], run: int) -> list[str]:
        """The internal queue names of a batch of sends (``(queue name, options)`` each),
        routed as :meth:`target` routes them, but for the messages any shard may take:
        those go in runs of ``run`` to one shard each, the shards in turn, so that a
        batch of ``run`` is one call to one shard rather than a call to every shard, and
        the shards still get as many messages each over the batches."""
        out: list[str] = []
        runs: dict[str, tuple[int, int]] = {}  # queue -> (first turn, messages so far)
        for queue_name, options in sends:
            if not self.sharded(queue_name) or _key_of(options):
                out.append(self.target(queue_name, options))
                continue
            active = self.layout(queue_name).sending
            first, count = runs.get(queue_name) or (next(self._turn), 0)
            out.append(shard_name(queue_name, active[(first + count // run) % len(active)]))
            runs[queue_name] = (first, count + 1)
        return out

    def stored_names(self, queue_name: str) -> list[str] | None:
        """Every shard's internal queue name by the stored layout, active ones first, read
        and never written (``None``: the queue has no layout)."""
        stored = self.layouts.read(queue_name)
        return None if stored is None else stored.names(queue_name)

    def key_shard(self, queue_name: str, key: str) -> str:
        """The internal queue name a dedupe or group ``key``'s messages of ``queue_name``
        go to (as :meth:`target` routes them): by this broker's layout when it has the
        queue in its ``shards``, else by the stored one, read and never written (an
        operator's broker, without ``shards``, of the CLI or the dashboard); the queue
        itself when it has no layout."""
        if self.sharded(queue_name):
            active = self.layout(queue_name).sending
        else:
            stored = self.layouts.read(queue_name)
            if stored is None:
                return queue_name
            active = stored.sending
        return shard_name(queue_name, key_suffix(active, key))

    def _owner(self) -> Callable[[int], str]:
        """Who serves each slot now: a cluster's masters, or the one server."""
        return slot_owner(self.broker.topology.slot_ranges())


def _key_of(options: dict[str, Any]) -> str:
    """A send's dedupe or group key (its shard's key), or ""."""
    key = options.get("dedupe_key") or options.get("group_key")
    return key if isinstance(key, str) else ""


def shard_pairs(shards: Any) -> tuple[tuple[str, int], ...]:
    """The broker's ``shards`` argument as the settings keep it (checked there)."""
    if shards is None:
        return ()
    if not hasattr(shards, "items"):
        raise ValueError(f"shards must be a mapping of queue name to shard count, got {shards!r}")
    return tuple(sorted(shards.items(), key=lambda pair: str(pair[0])))
