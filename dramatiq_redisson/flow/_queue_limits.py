"""Concurrency and rate limits per queue and per group, fleet-wide and live (flow control;
see docs/flow-control.md): ``broker.limits``.

The limits are stored with the queue on the server and read by every fetch (fetch.lua
through ``include/flow_take.lua``): a queue at its limit hands out nothing more, and a
group at its limit waits off its ring while the other groups run. A message holds its slots from its
fetch to its ack or nack; a worker that dies gives them back when the liveness requeues
its messages.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

import redis
from dramatiq.common import q_name

from .._keys import QueueKeys
from .._logs import logger_for
from .._settings import is_int
from ..connection._commands import Commands
from ..scripts._calls import Scripts
from ._lanes import check_group

if TYPE_CHECKING:
    from ..admin._queue_admin import QueueAdmin


class QueueLimits(TypedDict):
    """A queue's limits and what is in use now (:meth:`Limits.get`)."""

    #: At most this many of the queue's messages run at once, fleet-wide (None: no limit).
    concurrency: int | None
    #: At most this many messages start in any window of ``per_ms`` ms (None: no limit).
    rate: int | None
    #: The rate window (ms) of ``rate`` and ``group_rate`` (None: no rate).
    per_ms: int | None
    #: At most this many messages of one ``group_key`` run at once (None: no limit).
    group_concurrency: int | None
    #: At most this many messages of one ``group_key`` start per window (None: no limit).
    group_rate: int | None
    #: Messages of the queue holding a slot now (fetched through lanes and not yet acked).
    in_use: int
    #: Groups with messages holding a slot now.
    groups_in_use: int
    #: Lanes (a group at a priority) with ready messages held back by their group's
    #: concurrency limit.
    lanes_blocked: int
    #: The queue's messages started in the current rate window (None: no queue rate).
    started_in_window: int | None
    #: Lanes with ready messages held back by their group's rate until it may start again.
    lanes_deferred: int


class LimitsHost(Protocol):
    """What :class:`Limits` reads of its broker."""

    client: Commands
    redisson_scripts: Scripts
    admin: QueueAdmin

    def keys(self, queue_name: str) -> QueueKeys: ...

    def shards_of(self, queue_name: str) -> list[str]: ...


#: The highest concurrency limit accepted (a Lua number holds it exactly; above it, say None).
MAX_LIMIT = 1_000_000_000

#: The highest rate accepted: the start log of a queue or group keeps one time per start
#: in the window (about 10 bytes each), so a rate of a million is about 10 MB per log.
MAX_RATE = 1_000_000

#: The longest rate window (ms): 30 days.
MAX_WINDOW_MS = 30 * 24 * 3600 * 1000

#: The highest group weight: a group of weight w takes up to w messages per turn, so the
#: other groups of its priority wait for up to that many of its messages.
MAX_WEIGHT = 1000

#: The most groups with a weight per queue (each is a field of the queue's flow hash).
MAX_WEIGHTED_GROUPS = 10_000


def _limit(name: str, value: int | None, most: int = MAX_LIMIT) -> int | None:
    if value is not None and (not is_int(value) or not 1 <= value <= most):
        raise ValueError(f"{name} must be an int from 1 to {most:,}, or None for no limit; got {value!r}")
    return value


def check_window(rate: int | None, group_rate: int | None, per_ms: int | None) -> None:
    """A rate needs its window, and a window a rate: else ValueError."""
    if (rate is not None or group_rate is not None) != (per_ms is not None):
        raise ValueError(
            "rate and group_rate need their window, per_ms (and per_ms a rate): "
            f"got rate={rate!r}, group_rate={group_rate!r}, per_ms={per_ms!r}; nothing was written"
        )


#: The limits, in limits.lua's order ("set" and "update"; the command line shows and
#: takes them in it too; the fields of what is asked for a whole sharded queue, kept
#: beside its layout), and the most each may be.
LIMIT_NAMES = ("concurrency", "group_concurrency", "rate", "per_ms", "group_rate")
_MOST = {
    "concurrency": MAX_LIMIT,
    "group_concurrency": MAX_LIMIT,
    "rate": MAX_RATE,
    "per_ms": MAX_WINDOW_MS,
    "group_rate": MAX_RATE,
}

#: How limits.lua's "update" refuses a rate without its window (or a window without a rate).
_WINDOW_ERROR = "a rate needs its window"


def _share(limit: int | None, shards: int) -> int | None:
    """One shard's part of a queue-wide limit, ``shards`` counting the retired ones still
    drained: the whole queue may run (start) up to ``shards - 1`` more than ``limit`` at
    once (per window), never fewer."""
    return None if limit is None else -(-limit // shards)


def _shares(asked: Mapping[str, Any], shards: int) -> tuple[int | None, ...]:
    """limits.lua's "set" arguments for one of ``shards`` shards of a queue whose limits
    are ``asked`` (a group lives in one shard: its limits hold whole)."""
    return (
        _share(asked["concurrency"], shards),
        asked["group_concurrency"],
        _share(asked["rate"], shards),
        asked["per_ms"],
        asked["group_rate"],
    )


def _weight_pairs(weights: Mapping[str, int]) -> list[str | int]:
    """limits.lua's "weights" arguments: (group as hex, weight) of the groups weighing more than 1."""
    pairs: list[str | int] = []
    for group, weight in weights.items():
        if weight > 1:
            pairs += [group.encode().hex(), weight]
    return pairs


def _none(value: int) -> int | None:
    return None if value < 0 else value


def _info(reply: list[int], blocked: int | None = None) -> QueueLimits:
    """limits.lua's reply as a :class:`QueueLimits`."""
    concurrency, group, in_use, groups, was_blocked, rate, per_ms, group_rate, started, deferred = reply[:10]
    return QueueLimits(
        concurrency=_none(concurrency),
        rate=_none(rate),
        per_ms=_none(per_ms),
        group_concurrency=_none(group),
        group_rate=_none(group_rate),
        in_use=max(0, in_use),
        groups_in_use=max(0, groups),
        lanes_blocked=max(0, was_blocked if blocked is None else blocked),
        started_in_window=_none(started),
        lanes_deferred=max(0, deferred),
    )


class Limits:
    """``broker.limits``: set, read and clear a queue's concurrency and rate limits.

    Each write (:meth:`set`, :meth:`update`, :meth:`clear`, :meth:`set_weights`) also lists
    the queue in the namespace's queue registry, so that every process knows the queue
    whose limits it sees in force (the command line's ``limits get`` shows them); the
    reads write nothing."""

    def __init__(self, host: LimitsHost) -> None:
        self.host = host
        self.logger = logger_for(type(self))

    def set(
        self,
        queue_name: str,
        *,
        concurrency: int | None = None,
        rate: int | None = None,
        per_ms: int | None = None,
        group_concurrency: int | None = None,
        group_rate: int | None = None,
    ) -> QueueLimits:
        """Make ``queue_name``'s limits exactly these (None: no limit of that kind):

        * at most ``concurrency`` of its messages run at once across every worker, and at
          most ``group_concurrency`` of each ``group_key``'s (1: a group's messages one at
          a time, in order);
        * at most ``rate`` of its messages start in any window of ``per_ms`` ms, and at
          most ``group_rate`` of each group's (server clock; a start is a fetch). Messages
          over a rate stay queued and burn no retry; workers sleep until the next start
          is allowed (see docs/flow-control.md).

        Live: workers pick a raised limit up at once, a lowered one at their next fetches
        (messages already running finish). The queue's messages go through lanes from now
        on (see docs/flow-control.md).

        Raises:
          ValueError: A concurrency limit that is not an int from 1 to :data:`MAX_LIMIT`
            or None, a rate not from 1 to :data:`MAX_RATE`, a ``per_ms`` not from 1 to
            :data:`MAX_WINDOW_MS`, a rate without its window or a window without a rate,
            or ``queue_name`` is not a known queue (``known_queues()``; a typo would
            otherwise limit a queue nobody consumes). Nothing is written.
        """
        concurrency = _limit("concurrency", concurrency)
        group_concurrency = _limit("group_concurrency", group_concurrency)
        rate = _limit("rate", rate, MAX_RATE)
        group_rate = _limit("group_rate", group_rate, MAX_RATE)
        per_ms = _limit("per_ms", per_ms, MAX_WINDOW_MS)
        check_window(rate, group_rate, per_ms)
        name = self.host.admin.known(queue_name)
        return self._set(
            name, dict(zip(LIMIT_NAMES, (concurrency, group_concurrency, rate, per_ms, group_rate), strict=True))
        )

    def update(self, queue_name: str, **changes: int | None) -> QueueLimits:
        """Change only the limits named (``concurrency=4``; ``None``: no limit of that kind)
        and keep the others as they are, in one atomic step on the server (the limits are
        ``concurrency``, ``group_concurrency``, ``rate``, ``per_ms`` and ``group_rate``,
        as :meth:`set` takes them). Returns the limits now, as :meth:`get`. A sharded
        queue's are merged with the limits asked for the whole queue, then set on every
        shard as :meth:`set` does.

        Raises:
          ValueError: No limit named, a name that is not a limit, a value :meth:`set`
            would refuse, a result with a rate without its window or a window without a
            rate, or ``queue_name`` is not a known queue. Nothing is written.
        """
        unknown = sorted(set(changes) - set(LIMIT_NAMES))
        if unknown or not changes:
            raise ValueError(
                f"update takes the limits to change, of {', '.join(LIMIT_NAMES)}; "
                + (f"got {', '.join(map(repr, unknown))}" if unknown else "got none")
                + "; nothing was written"
            )
        for field, value in changes.items():
            _limit(field, value, _MOST[field])
        name = self.host.admin.known(queue_name)
        current = self._get(name)
        merged = {field: changes.get(field, current[field]) for field in LIMIT_NAMES}  # type: ignore[literal-required]
        check_window(merged["rate"], merged["group_rate"], merged["per_ms"])
        if len(self.host.shards_of(name)) > 1:
            return self._set(name, merged)
        # One queue: limits.lua merges on the server ("" keeps a limit, -1 removes it) and
        # checks the window again, against the limits as they are then.
        values = tuple((-1 if changes[f] is None else changes[f]) if f in changes else None for f in LIMIT_NAMES)
        try:
            reply = self.host.redisson_scripts.limits(self.host.keys(name), "update", values)
        except redis.ResponseError as e:
            if _WINDOW_ERROR not in str(e):
                raise
            raise ValueError(f"{e}: the limits changed meanwhile; nothing was written") from None
        self._list(name, [name])
        return _info(reply, 0)

    def _list(self, name: str, shards: Sequence[str]) -> None:
        """List the queue whose limits were just written (its internal queues, ``shards``)
        in the namespace's queue registry, as a send lists the queue it sends to: a queue
        this process declared but the registry does not list (declared while the server
        was down, or flushed since) would otherwise keep its limits out of sight of every
        other process (the command line refuses it as unknown). One ``SADD``."""
        self.host.client.sadd(self.host.keys(name).registry, *shards)

    def _set(self, name: str, asked: dict[str, int | None]) -> QueueLimits:
        """Make the known queue ``name``'s limits exactly ``asked`` (checked already)."""
        shards = self.host.shards_of(name)
        if len(shards) == 1:
            values = tuple(asked[field] for field in LIMIT_NAMES)
            reply = self.host.redisson_scripts.limits(self.host.keys(name), "set", values)
            self._list(name, shards)
            return _info(reply, 0)
        # A sharded queue (issue 36): what was asked is kept beside the layout (first: a
        # consumer that reapplies meanwhile applies this), and each shard gets its share.
        self.host.client.hset(self.host.keys(name).shards, "limits", json.dumps(asked))
        for shard in shards:
            self.host.redisson_scripts.limits(self.host.keys(shard), "set", _shares(asked, len(shards)))
        self._list(name, shards)
        return self._get(name)

    def reapply(self, queue_name: str, shards: Sequence[str]) -> int:
        """Give each of a sharded queue's ``shards`` (its layout's internal names, shard 0
        first) its share of the queue's limits and shard 0's group weights, where it has
        other ones: called by every consumer of the queue whenever the layout it follows
        changes, so a shard added later is limited like the others, and the shares follow
        the number of shards. Reads only, when every shard has them already. Returns how
        many shards were written.

        The limits asked for the whole queue are those kept beside its layout; a queue
        limited before it had shards has none kept there, and shard 0's are the whole
        queue's (kept there from now on)."""
        name = q_name(queue_name)
        scripts, keys = self.host.redisson_scripts, self.host.keys
        have = {shard: _info(scripts.limits(keys(shard), "get")) for shard in shards}
        stored = self.host.client.hget(keys(name).shards, "limits")
        if stored:
            asked = json.loads(stored)
        else:
            asked = {field: have[name][field] for field in LIMIT_NAMES}  # type: ignore[literal-required]
            if all(value is None for value in asked.values()):
                asked = {}
            else:
                self.host.client.hset(keys(name).shards, "limits", json.dumps(asked))
        written: set[str] = set()
        if asked:
            wanted = _shares(asked, len(shards))
            for shard, info in have.items():
                if _shares(info, 1) != wanted:
                    scripts.limits(keys(shard), "set", wanted)
                    written.add(shard)
        weights = self._weights(name)
        pairs = _weight_pairs(weights)
        for shard in shards[1:]:
            if self._weights(shard) != weights:
                scripts.limits(keys(shard), "weights", (), pairs)
                written.add(shard)
        if written:
            self.logger.info("Gave %d shard(s) of queue %r the queue's limits and weights.", len(written), name)
        return len(written)

    def set_weights(self, queue_name: str, weights: Mapping[str, int] | None) -> dict[str, int]:
        """Make ``queue_name``'s group weights exactly these (``{group_key: weight}``; a group
        not named, and every group with ``None`` or ``{}``, has weight 1): within a priority,
        a group of weight w takes up to w messages per turn of the round-robin, a group of
        weight 1 one. Live, fleet-wide, stored with the queue; a turn under way starts over.
        Returns the weights now set.

        Raises:
          ValueError: a group that is not a non-empty string of at most
            :data:`~dramatiq_redisson.flow._lanes.MAX_GROUP_LENGTH` characters, a weight that is not an int from
            1 to :data:`MAX_WEIGHT`, more than :data:`MAX_WEIGHTED_GROUPS` groups, or
            ``queue_name`` is not a known queue. Nothing is written.
        """
        weights = dict(weights or {})
        if len(weights) > MAX_WEIGHTED_GROUPS:
            raise ValueError(f"at most {MAX_WEIGHTED_GROUPS:,} groups may have a weight; got {len(weights):,}")
        for group, weight in weights.items():
            check_group(group, "a group")
            if not is_int(weight) or not 1 <= weight <= MAX_WEIGHT:
                raise ValueError(f"the weight of group {group!r} must be an int from 1 to {MAX_WEIGHT}, got {weight!r}")
        pairs = _weight_pairs(weights)
        name = self.host.admin.known(queue_name)
        shards = self.host.shards_of(name)
        for shard in shards:  # a group's shard has its weight
            self.host.redisson_scripts.limits(self.host.keys(shard), "weights", (), pairs)
        self._list(name, shards)
        return self._weights(name)

    def weights(self, queue_name: str) -> dict[str, int]:
        """``queue_name``'s group weights (groups of weight 1 are not listed).

        Raises:
          ValueError: ``queue_name`` is not a known queue.
        """
        return self._weights(self.host.admin.known(queue_name))

    def _weights(self, name: str) -> dict[str, int]:
        """The group weights of ``name`` (a queue or a shard's internal name)."""
        flow = cast("dict[bytes, bytes]", self.host.client.hgetall(self.host.keys(name).flow))
        out: dict[str, int] = {}
        for field, value in flow.items():
            if field.startswith(b"w") and field != b"weights":
                out[bytes.fromhex(field[1:].decode()).decode()] = int(value)
        return dict(sorted(out.items()))

    def get(self, queue_name: str) -> QueueLimits:
        """``queue_name``'s limits and what is in use now (one read per shard; writes
        nothing). A sharded queue's are the limits asked for the whole queue, and the sums
        of what is in use in its shards.

        Raises:
          ValueError: ``queue_name`` is not a known queue.
        """
        return self._get(self.host.admin.known(queue_name))

    def _get(self, name: str) -> QueueLimits:
        """The limits of the known queue ``name`` (see :meth:`get`)."""
        shards = self.host.shards_of(name)
        each = [_info(self.host.redisson_scripts.limits(self.host.keys(shard), "get")) for shard in shards]
        if len(each) == 1:
            return each[0]
        stored = self.host.client.hget(self.host.keys(name).shards, "limits")
        asked = json.loads(stored) if stored else dict.fromkeys(LIMIT_NAMES)
        started = [e["started_in_window"] for e in each if e["started_in_window"] is not None]
        return QueueLimits(
            concurrency=asked["concurrency"],
            rate=asked["rate"],
            per_ms=asked["per_ms"],
            group_concurrency=asked["group_concurrency"],
            group_rate=asked["group_rate"],
            in_use=sum(e["in_use"] for e in each),
            groups_in_use=sum(e["groups_in_use"] for e in each),
            lanes_blocked=sum(e["lanes_blocked"] for e in each),
            started_in_window=sum(started) if started else None,
            lanes_deferred=sum(e["lanes_deferred"] for e in each),
        )

    def clear(self, queue_name: str) -> QueueLimits:
        """Remove ``queue_name``'s limits: every message waiting for a slot or a rate may run.
        The queue's messages keep going through lanes (priorities and groups still apply).

        Raises:
          ValueError: ``queue_name`` is not a known queue; nothing is written.
        """
        name = self.host.admin.known(queue_name)
        shards = self.host.shards_of(name)
        if len(shards) > 1:  # first: a consumer that reapplies meanwhile clears too
            self.host.client.hset(self.host.keys(name).shards, "limits", json.dumps(dict.fromkeys(LIMIT_NAMES)))
        replies = [self.host.redisson_scripts.limits(self.host.keys(shard), "clear") for shard in shards]
        self._list(name, shards)
        if len(shards) == 1:
            return _info(replies[0], 0)
        return self._get(name)
