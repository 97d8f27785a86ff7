"""The Lua scripts, registered once per client, each behind one typed wrapper.

Every script's contract (KEYS, ARGV, return value) is the header of its file in
``lua/``. Scripts run through :class:`redis.commands.core.Script` (EVALSHA with a
reload on NOSCRIPT); the producer's scripts (offer, enqueue) resend a call that got
NOSCRIPT as EVAL with the source, which cannot miss (see
:meth:`dramatiq_redisson.scripts._runner.ScriptRunner.stream`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol, cast

import redis

from .._ids import redis_id_message_id
from .._keys import LANES, PLAIN_LANE, QueueKeys, ack_keys, fetch_keys, keys_of, script_keys, transfer_keys
from .._message import queue_json
from .._queue_names import base_queue
from .._settings import DONE_TRIM_INTERVAL
from .._tuning import HEARTBEAT_INTERVAL_MS, PERIODIC_GRACE_MS, PERIODIC_LOW_WATER
from ..connection._commands import Commands
from ..connection._topology import Topology
from ._contract import contract
from ._library import build_library
from ._runner import ScriptRunner, load_source

_NAMES = (
    "offer",
    "offer_one",
    "transfer",
    "cancel",
    "clear",
    "enqueue",
    "fetch",
    "ack",
    "nack",
    "requeue",
    "maintenance",
    "bury",
    "heartbeat",
    "release",
    "peek",
    "reschedule",
    "count",
    "bulk",
    "scan",
    "dead",
    "stats",
    "pending",
    "reap",
    "schedule",
    "pause",
    "limits",
    "history",
    "shards",
    "state",
)


#: The scripts' text (a cluster's topology turns their PUBLISH into SPUBLISH: see
#: :meth:`dramatiq_redisson.connection._topology.Topology.script_source`).
_SOURCES = {name: load_source(name) for name in _NAMES}

#: The hot consumer scripts as one function library, built once like their text (about
#: 7 ms: the files read and expanded again, the text's digest).
_LIBRARY = build_library()


# Every script's KEYS list is made from its header (see ``_keys.script_keys``), once per
# queue: these name the lists of the producer's scripts.


def _offer_keys(keys: QueueKeys) -> tuple[str, ...]:
    return keys_of("offer", keys)


class IdleScore(NamedTuple):
    """A consumer's new score in its queue's idle registry, given with an ack (ack.lua):
    what it can start now."""

    token: str
    score: int
    channel: str


class Fetched(list[tuple[str, "bytes | None"]]):
    """What a fetch took: (redis message id, its data or None) pairs; ``uses_slots``: they
    were taken through lanes and hold slots, which their ack or nack gives back (fetch.lua's
    reply says "slots"); ``wait_ms``:
    a rate limit holds messages back, and this consumer is the one to fetch again in that
    many ms (None: nothing to wait for, or another consumer waits); ``more``: it took all
    it asked for, and more messages are ready."""

    uses_slots: bool = False
    wait_ms: int | None = None
    more: bool = False

    @classmethod
    def from_reply(cls, flat: list[Any]) -> Fetched:
        fetched = cls((flat[i].decode(), flat[i + 1]) for i in range(0, len(flat) - 1, 2))
        if len(flat) % 2:  # a trailing status (fetch.lua): "slots", "wait:<ms>" or both; "more"
            for word in flat[-1].decode().split():
                if word == "slots":
                    fetched.uses_slots = True
                elif word == "more":
                    fetched.more = True
                elif word.startswith("wait:"):
                    fetched.wait_ms = int(word[5:])
        return fetched


def _offer_flow_keys(keys: QueueKeys) -> tuple[str, ...]:
    """offer.lua's KEYS for a call with laned entries (their lanes recorded, flow turned on)."""
    return keys_of("offer", keys, "", LANES)


#: An offer entry without a dedupe key: key, mode, ttl (see offer.lua).
_NO_KEY = ("", "", 0)


def _enqueue_keys(keys: QueueKeys) -> tuple[str, ...]:
    return keys_of("enqueue", keys, "", LANES)


@functools.lru_cache(maxsize=1024)
def _transfer_queue_json(keys: QueueKeys) -> str:
    return queue_json(base_queue(keys.queue_name))  # a shard's messages are its queue's


def _enqueue_args(
    keys: QueueKeys,
    entries: Sequence[tuple[str, bytes] | tuple[str, bytes, str]],
    window_ms: float,
    in_flight: str = "",
    clock_ms: str = "",
) -> list[Any]:
    """enqueue.lua's ARGV with the flow keys: ``(redis message id, data, lane)`` triples
    (a pair's lane is the plain one)."""
    triples: list[Any] = []
    for entry in entries:
        triples.extend(entry if len(entry) == 3 else (*entry, PLAIN_LANE))
    lane_prefix, ring_prefix = keys.flow_affixes
    return _ENQUEUE.argv(
        window_ms=window_ms,
        in_flight=in_flight,
        clock=clock_ms if window_ms else "",
        lane_prefix=lane_prefix,
        ring_prefix=ring_prefix,
        entries=triples,
    )


#: The contracts of the scripts called per message (see ``_contract``), looked up once.
_TRANSFER, _FETCH, _ACK, _ENQUEUE, _OFFER_ONE = (
    contract(name) for name in ("transfer", "fetch", "ack", "enqueue", "offer_one")
)

#: limits.lua's limit arguments (after its op), in its header's order.
_LIMITS = contract("limits").names[1:6]


def _affixes(keys: QueueKeys) -> dict[str, str]:
    """The lanes' and rings' key prefixes, by their ARGV names."""
    lane_prefix, ring_prefix = keys.flow_affixes
    return {"lane_prefix": lane_prefix, "ring_prefix": ring_prefix}


class TransferResult:
    """What one run of the transfer script did: its reply's slots, in the order of the
    ``-- returns:`` line of transfer.lua's header (the parameters up to ``schedules``)."""

    __slots__ = (
        "moved",
        "next_due_ms",
        "server_now_us",
        "dead",
        "lease_until_ms",
        "fetched",
        "registered",
        "lateness_ms",
        "holder",
        "schedules",
        "replicas",
        "replicated",
    )

    def __init__(
        self,
        moved: int,
        next_due_ms: int | None,
        server_now_us: int,
        dead: int,
        lease_until_ms: int | None = None,
        fetched: list[tuple[str, bytes | None]] | None = None,
        registered: bool = False,
        lateness_ms: list[int] | None = None,
        holder: str | None = None,
        schedules: list[str] | None = None,
    ) -> None:
        self.moved = moved
        self.next_due_ms = next_due_ms
        self.server_now_us = server_now_us
        self.dead = dead
        #: ``None`` if the caller holds the transfer lease (it transferred), else when
        #: the other holder's lease ends (server epoch ms; nothing was transferred).
        self.lease_until_ms = lease_until_ms
        #: Moved messages handed straight to the caller (now in its ack set).
        self.fetched = fetched or []
        #: Whether the call registered the caller as idle (it took all there was).
        self.registered = registered
        #: For each moved message, how late it moved (ms after its due time, server clock).
        self.lateness_ms = lateness_ms or []
        #: The token of the consumer holding the lease, when it is another one.
        self.holder = holder
        #: Schedules whose chain stopped or runs low on upcoming ticks (see transfer.lua).
        self.schedules = schedules or []
        #: With ``wait_for_replicas``: how many replicas acknowledged the call's writes
        #: (``None``: unknown, or no WAIT), and whether that is enough.
        self.replicas: int | None = None
        self.replicated = True

    @property
    def owner(self) -> bool:
        """Whether the caller holds the transfer lease."""
        return self.lease_until_ms is None

    def __repr__(self) -> str:
        return (
            f"TransferResult(moved={self.moved}, next_due_ms={self.next_due_ms}, "
            f"server_now_us={self.server_now_us}, dead={self.dead}, lease_until_ms={self.lease_until_ms})"
        )


#: Seconds an estimate of the server clock (see :meth:`Scripts.server_now_ms`) is used
#: for: a consumer transfers at least every third of a lease, so its estimate stays fresh.
CLOCK_ESTIMATE_TTL = 10.0


class ScriptsHost(Protocol):
    """What a part that only runs scripts and reads keys (dead letters, the delayed
    queue's operations) reads of its broker."""

    client: Commands
    redisson_scripts: Scripts


class Scripts(ScriptRunner):
    """One client's registered scripts, each behind one typed wrapper (how they run:
    :class:`dramatiq_redisson.scripts._runner.ScriptRunner`)."""

    def __init__(
        self,
        client: Any,
        *,
        wait_for_replicas: int = 0,
        wait_timeout: int = 1000,
        topology: Topology | None = None,
        beat_interval: float = HEARTBEAT_INTERVAL_MS / 1000,
    ) -> None:
        super().__init__(
            client,
            _SOURCES,
            wait_for_replicas=wait_for_replicas,
            wait_timeout=wait_timeout,
            topology=topology,
            library=_LIBRARY,
        )
        #: Seconds between this process's heartbeat writes to one heartbeat set: fetch
        #: and ack write it only when the last write is older (the broker derives it from
        #: its ``heartbeat_timeout``).
        self.beat_interval = beat_interval
        #: When this process last wrote each key it writes now and then (heartbeats, done trims).
        self._written: dict[str, float] = {}
        #: Seconds between two trims of a queue's done records by this process (ack.lua).
        self.done_trim_interval = DONE_TRIM_INTERVAL
        #: Per queue: the server clock (epoch µs) in the last reply that carried it, and
        #: the monotonic time it was read (see :meth:`server_now_ms`).
        self._clocks: dict[str, tuple[int, float]] = {}

    def server_now_ms(self, queue_name: str) -> str:
        """An estimate of the clock of the server holding ``queue_name`` (epoch ms, as
        text), from the last reply that carried it (a transfer's, or an enqueue's that read
        TIME) and the monotonic clock since; "" when there is none younger than
        :data:`CLOCK_ESTIMATE_TTL` s. The enqueue, fetch and ack take it instead of a TIME
        call (one command less each). It runs a moment behind the server's (by the
        reply's way back), which the history allows for (``lua/include/record_history.lua``)."""
        seen = self._clocks.get(queue_name)
        if seen is None:
            return ""
        elapsed = time.monotonic() - seen[1]
        if elapsed > CLOCK_ESTIMATE_TTL:
            return ""
        return str((seen[0] + int(elapsed * 1_000_000)) // 1000)

    def _beat(self, heartbeats: str) -> str:
        """``"1"`` when this process's heartbeat in ``heartbeats`` is due (then counted as written), else ``"0"``."""
        return "1" if self._due(heartbeats, self.beat_interval) else "0"

    def _due(self, key: str, interval: float) -> bool:
        """Whether ``interval`` s have passed since this process last wrote ``key`` (then it does now)."""
        now = time.monotonic()
        if now - self._written.get(key, -math.inf) < interval:
            return False
        self._written[key] = now
        return True

    def offer(
        self,
        keys: QueueKeys,
        entries: Sequence[tuple[Any, ...]],
        *,
        absolute: bool = False,
        client: Any = None,
        replacing: str = "",
        lanes: Sequence[str] | None = None,
    ) -> Any:
        """Schedule ``(time_ms, sort_key, message_id, data, claim_id)`` entries, each
        optionally followed by ``dedupe_key, dedupe_mode, ttl_ms`` (see offer.lua);
        ``lanes``: each entry's lane (flow control), when one is not the plain lane.

        ``replacing``: the redis id of the in-flight copy of the message being retried,
        whose payload makes room for the retry on a full server (see offer.lua).

        Returns per entry the due time (epoch ms, -1 for a lost claim, -2 for a member
        already moved to the ready queue) or, for an entry its dedupe key kept out,
        ``[due time or -3, member, stored payload]`` of the message holding the key; or
        the pipeline when ``client`` is one."""
        values: list[Any] = []
        laned = lanes is not None and any(lane != PLAIN_LANE for lane in lanes)
        for n, entry in enumerate(entries):
            values.extend(entry)
            if len(entry) == 5:
                values.extend(_NO_KEY)
            if laned:
                values.append(lanes[n])  # type: ignore[index]
        mode = "abs" if absolute else f"move:{replacing}" if replacing else "rel"
        args = contract("offer").argv(mode=mode, entries=values)
        return self._run_resending("offer", _offer_flow_keys(keys) if laned else _offer_keys(keys), args, client)

    def offer_one(self, keys: QueueKeys, delay_ms: int, sort_key: str, message_id: str, data: bytes, look: str) -> int:
        """Schedule one fresh message ``delay_ms`` from now, without a dedupe key (offer_one.lua;
        ``look``: where a resent member that already came due is found, "sent", "ready" or
        "both"). Returns its due time (epoch ms), -2 when it had already moved to the ready
        queue, or -4 when its message id is scheduled under another member (nothing was
        written: reschedule it with :meth:`offer`)."""
        one_keys = keys_of("offer_one", keys)
        args = _OFFER_ONE.argv(delay_ms=delay_ms, sort_key=sort_key, message_id=message_id, data=data, look=look)
        return int(self._run_resending("offer_one", one_keys, args))

    def offer_calls(self, calls: Sequence[tuple[QueueKeys, Sequence[Any], bool]]) -> list[Any]:
        """Offer calls of ``(keys, args, laned)`` (offer.lua's ARGV, mode first; ``laned``:
        each entry ends with its lane), streamed (see :meth:`stream`); returns per call its
        outcome."""
        offer = contract("offer")
        return self.stream(
            "offer",
            [
                (_offer_flow_keys(keys) if laned else _offer_keys(keys), offer.argv(mode=args[0], entries=args[1:]))
                for keys, args, laned in calls
            ],
        )

    def enqueue_bulk(
        self, calls: Sequence[tuple[QueueKeys, Sequence[tuple[str, bytes] | tuple[str, bytes, str]]]], window_ms: float
    ) -> list[Any]:
        """Push ``(redis_message_id, data)`` pairs (or ``(…, lane)`` triples), one script call per ``(keys, pairs)``,
        streamed (see :meth:`stream`; duplicates are skipped as in :meth:`enqueue`).

        Returns per call its outcome; a reply is ``[queue length, ids pushed, server
        clock read or 0]`` (see :meth:`enqueue`)."""
        outcomes = self.stream(
            "enqueue",
            [
                (
                    _enqueue_keys(keys),
                    _enqueue_args(keys, pairs, window_ms, clock_ms=self.server_now_ms(keys.queue_name)),
                )
                for keys, pairs in calls
            ],
        )
        for (keys, _), outcome in zip(calls, outcomes, strict=True):
            self._read_clock(keys.queue_name, outcome)
        return outcomes

    def transfer(
        self,
        keys: QueueKeys,
        *,
        limit: int,
        trim_budget: int,
        compact_step: int,
        compact_slack: int,
        token: str = "",
        lease_ms: int = 0,
        own_slots: int = 0,
        worker_id: str = "",
        listening: bool = False,
        compare: bool = False,
        keep_ties: bool = False,
        window_ms: float = 0,
        upkeep_ms: int = 0,
    ) -> TransferResult:
        """Move due entries if consumer ``token`` holds (or can take) the transfer lease
        for ``lease_ms``; without a token, move them regardless of the lease (see
        transfer.lua). ``own_slots``: how many moved messages the caller (of worker
        ``worker_id``) takes itself, handed off in the reply when the ready queue was
        empty (the rest wake idle consumers); ``listening``: it may be registered as idle;
        ``compare``: some of its threads are busy, so it takes a message only while no idle
        consumer can start more (see transfer.lua's Placement), and ``keep_ties``: it
        takes a message on a tie with that consumer;
        ``window_ms``: how long moved members stay remembered (not offered again);
        ``upkeep_ms``: how often the backup list and those members are tidied (0: every call).

        A call that may hand messages off is not retried after a lost reply (they would
        sit in the ack set, unheld): the caller reconciles instead."""
        call_keys = transfer_keys(keys, worker_id)
        lane_prefix, ring_prefix = keys.flow_affixes
        args = _TRANSFER.argv(
            limit=limit,
            trim_budget=trim_budget,
            compact_step=compact_step,
            compact_slack=compact_slack,
            token=token,
            lease_ms=lease_ms,
            own_slots=own_slots,
            listening=(("3" if keep_ties else "2") if compare else "1") if listening else "",
            window_ms=window_ms,
            queue_json=_transfer_queue_json(keys),
            upkeep_ms=upkeep_ms,
            periodic_grace_ms=PERIODIC_GRACE_MS,
            periodic_low_water=PERIODIC_LOW_WATER,
            caller=f"{worker_id}|{token}",
            lane_prefix=lane_prefix,
            ring_prefix=ring_prefix,
        )
        replicas: int | None = None
        if self.wait_for_replicas:
            try:
                reply, replicas = self._run_waiting("transfer", call_keys, args)
            except redis.ConnectionError:
                if own_slots:
                    raise
                reply, replicas = self._run_waiting("transfer", call_keys, args)
        else:
            run = self._run if own_slots else self._run_idempotent
            reply = run("transfer", call_keys, args)
        got = _TRANSFER.reply(reply)
        now_us, handed, holder = int(got["server_now_us"]), got["fetched"], got["holder"]
        self._clocks[keys.queue_name] = (now_us, time.monotonic())
        result = TransferResult(
            moved=int(got["moved"]),
            next_due_ms=None if int(got["next_due_ms"]) < 0 else int(got["next_due_ms"]),
            server_now_us=now_us,
            dead=int(got["dead"]),
            lease_until_ms=int(got["lease_until_ms"]) or None,
            fetched=[(handed[i].decode(), handed[i + 1]) for i in range(0, len(handed), 2)],
            registered=bool(got["registered"]),
            lateness_ms=[int(late) for late in got["lateness_ms"]],
            holder=(holder.decode() if isinstance(holder, bytes) else str(holder)) or None,
            schedules=[name.decode() for name in got["schedules"]],
        )
        if self.wait_for_replicas:
            result.replicas = replicas
            result.replicated = replicas is not None and replicas >= self.wait_for_replicas
        return result

    def schedule(self, keys: QueueKeys, op: str, name: str, *args: Any) -> Any:
        """Change or read one schedule of the queue's periodic actors (schedule.lua: ``op``
        is "start", "extend", "pause", "remove" or "check", ``args`` its arguments)."""
        schedule_keys = keys_of("schedule", keys)
        argv = contract("schedule").argv(op=op, name=name, rest=args)
        if self.wait_for_replicas and op != "check":
            return self._wait_checked("A schedule change", "schedule", schedule_keys, argv)
        return self._run("schedule", schedule_keys, argv)

    def release(self, keys: QueueKeys, token: str) -> int:
        """A consumer leaves: unregister it, hand its transfer lease over (release.lua)."""
        return int(self._run_idempotent("release", keys_of("release", keys), contract("release").argv(token=token)))

    def cancel(self, keys: QueueKeys, message_ids: Sequence[str], *, by_key: bool = False) -> int:
        """Unschedule messages by id (``by_key``: the messages holding these dedupe keys);
        returns how many were scheduled. With ``wait_for_replicas``, raises
        :class:`NotReplicated` (``reply``: that count) when too few replicas acknowledged
        the cancel in time."""
        cancel_keys = keys_of("cancel", keys, "", ("lane",))
        args = contract("cancel").argv(by="key" if by_key else "id", names=message_ids)
        if self.wait_for_replicas:
            return int(self._wait_checked("Cancel", "cancel", cancel_keys, args))
        return int(self._run("cancel", cancel_keys, args))

    def clear(self, keys: QueueKeys, client: Any = None) -> Any:
        """Returns how many were scheduled, or the pipeline when ``client`` is one."""
        return self._run("clear", keys_of("clear", keys, "", ("dedupe", "lane")), contract("clear").argv(), client)

    def enqueue(
        self,
        keys: QueueKeys,
        entries: Sequence[tuple[str, bytes] | tuple[str, bytes, str]],
        window_ms: float,
        client: Any = None,
        replacing: str = "",
    ) -> Any:
        """Push ``(redis_message_id, data)`` pairs (or ``(…, lane)`` triples), skipping ids already queued, in flight
        or enqueued within the last ``window_ms``; ``replacing`` as for :meth:`offer`.
        Returns ``[queue length, ids pushed, server clock read or 0]``, or the pipeline
        when ``client`` is one."""
        clock_ms = "" if client is not None else self.server_now_ms(keys.queue_name)
        args = _enqueue_args(keys, entries, window_ms, replacing, clock_ms)
        reply = self._run_resending("enqueue", _enqueue_keys(keys), args, client)
        if client is None:
            self._read_clock(keys.queue_name, reply)
        return reply

    def _read_clock(self, queue_name: str, reply: Any) -> None:
        """An enqueue that read the server's clock (TIME, when no estimate was fresh)
        returns it: the next ones take the estimate from it (see :meth:`server_now_ms`),
        so a process that only sends reads TIME about once per :data:`CLOCK_ESTIMATE_TTL`."""
        if isinstance(reply, list) and len(reply) > 2 and int(reply[2]) > 0:
            self._clocks[queue_name] = (int(reply[2]) * 1000, time.monotonic())

    def fetch(self, keys: QueueKeys, worker_id: str, count: int, token: str = "", consumer: str = "") -> Fetched | None:
        """Take up to ``count`` ready messages; with a ``token``, a short fetch registers
        that consumer as idle (woken on its wake channel, see fetch.lua). ``consumer``
        (default: ``token``) is recorded with each message fetched (running now). ``None``:
        the queue is paused (nothing taken)."""
        lane_prefix, ring_prefix = keys.flow_affixes
        args = _FETCH.argv(
            count=count,
            worker_id=worker_id,
            token=token,
            beat=self._beat(keys.heartbeats),
            fetcher=f"{worker_id}|{consumer or token}",
            clock=self.server_now_ms(keys.queue_name),
            lane_prefix=lane_prefix,
            ring_prefix=ring_prefix,
            rate_prefix=keys.rate_prefix,
            wake_prefix=keys.wake_prefix,
        )
        flat = self._run("fetch", fetch_keys(keys, worker_id), args)
        if flat is None:
            return None
        return Fetched.from_reply(flat)

    def ack(
        self,
        keys: QueueKeys,
        worker_id: str,
        redis_message_id: str,
        *,
        retried: bool = False,
        uses_slots: bool = False,
        idle: IdleScore | None = None,
        done_retention: int = 0,
    ) -> int:
        """Forget a processed message; the history counts it as processed, or as retried
        (``retried``: it failed and Retries scheduled a retry). ``uses_slots``: it was fetched
        through lanes (:attr:`Fetched.uses_slots`), and its slots are given back. ``idle``: the
        acking consumer's new score in the idle registry (see ack.lua). ``done_retention`` (ms;
        0: none): a processed message (not ``retried``) leaves a done record kept that long."""
        done = done_retention > 0 and not retried
        call_keys = ack_keys(keys, worker_id, uses_slots, idle is not None, done)
        groups: dict[str, Any] = {}
        if uses_slots:
            groups.update(_affixes(keys), wake_prefix=keys.wake_prefix)
        if idle is not None:
            groups.update(idle="idle", idle_token=idle.token, idle_score=idle.score, idle_channel=idle.channel)
        if done:  # its first ack, then one every done_trim_interval s, trims the records
            trim = done_retention if self._due(keys.done, self.done_trim_interval) else ""
            groups.update(done="done", done_id=redis_id_message_id(redis_message_id), done_trim=trim)
        args = _ACK.argv(
            redis_message_id=redis_message_id,
            worker_id=worker_id,
            beat=self._beat(keys.heartbeats),
            outcome="3" if retried else "1",
            clock=self.server_now_ms(keys.queue_name),
            **groups,
        )
        return int(self._run_idempotent("ack", call_keys, args))

    def nack(
        self,
        keys: QueueKeys,
        worker_id: str,
        redis_message_id: str,
        final: bytes | None = None,
        *,
        uses_slots: bool = False,
    ) -> int:
        """Move a fetched message to the dead letters (``uses_slots``: see :meth:`ack`)."""
        given: dict[str, Any] = {} if final is None else {"final": final}
        if uses_slots:
            lane_prefix, ring_prefix = keys.flow_affixes
            given = {"final": final or "", "lane_prefix": lane_prefix, "ring_prefix": ring_prefix}
            given["wake_prefix"] = keys.wake_prefix
        args = contract("nack").argv(redis_message_id=redis_message_id, worker_id=worker_id, **given)
        groups = ("lane", "slots") if uses_slots else ("lane",)
        return int(self._run_idempotent("nack", keys_of("nack", keys, worker_id, groups), args))

    def requeue(self, keys: QueueKeys, worker_id: str, redis_message_ids: Sequence[str]) -> int:
        return int(
            self._run_idempotent(
                "requeue",
                keys_of("requeue", keys, worker_id, LANES),
                contract("requeue").argv(**_affixes(keys), ids=redis_message_ids),
            )
        )

    def maintenance(
        self, keys: QueueKeys, dead_workers: Sequence[str], *, dead_message_ttl_ms: float, expire_limit: int
    ) -> tuple[int, int]:
        requeued, expired = self._run(
            "maintenance",
            script_keys("maintenance", keys, workers=dead_workers),
            contract("maintenance").argv(
                dead_message_ttl_ms=dead_message_ttl_ms, expire_limit=expire_limit, **_affixes(keys)
            ),
        )
        return int(requeued), int(expired)

    def bury_legacy(self, keys: QueueKeys, ids: Sequence[str]) -> int:
        """Move undecodable entries of the built-in ``.DQ`` queue to the dead letters."""
        return int(self._run("bury", keys_of("bury", keys), contract("bury").argv(ids=ids)))

    def peek(self, keys: QueueKeys, message_id: str, *, by_key: bool = False) -> tuple[int, bytes, str] | None:
        """A scheduled message's due time (epoch ms), stored payload and message id, or
        ``None``; ``by_key``: ``message_id`` is a dedupe key (the message holding it)."""
        args = contract("peek").argv(name=message_id, by="key" if by_key else "id")
        due, stored, found = self._run("peek", keys_of("peek", keys), args)
        return None if int(due) < 0 or stored is None else (int(due), stored, found.decode())

    def reschedule(self, keys: QueueKeys, message_id: str, mode: str, value_ms: int) -> int | None:
        """New due time ``"in"`` ms from the server's now or ``"at"`` epoch ms; returns it,
        or ``None`` when the message is not scheduled."""
        args = contract("reschedule").argv(message_id=message_id, mode=mode, value_ms=value_ms)
        due = int(self._run("reschedule", keys_of("reschedule", keys), args))
        return None if due < 0 else due

    def count(self, keys: QueueKeys, mode: str, value_ms: int = 0) -> int:
        """Scheduled messages: ``"all"``, due ``"before"`` an epoch ms, or ``"overdue"``
        by more than ``value_ms`` on the server clock."""
        return int(self._run("count", keys_of("count", keys), contract("count").argv(mode=mode, value_ms=value_ms)))

    def bulk(self, keys: QueueKeys, action: str, batch: int, members: Sequence[bytes | str] = ()) -> int:
        """``"promote"`` or ``"remove"`` up to ``batch`` of the earliest scheduled entries,
        or those of ``members`` still scheduled (bulk.lua); returns how many."""
        return int(
            self._run(
                "bulk",
                keys_of("bulk", keys, "", ("lane",)),
                contract("bulk").argv(action=action, batch=batch, members=members),
            )
        )

    def scan(
        self, keys: QueueKeys, size: int, after: tuple[bytes, bytes] | None
    ) -> tuple[list[tuple[bytes, int, bytes | None]], tuple[bytes, bytes] | None]:
        """A page of ``(member, due, stored payload or None)`` after the cursor ``after``
        (``(due, member)`` as bytes; ``None``: from the head), and the next cursor
        (``None`` at the end)."""
        due, member = after if after is not None else (b"", b"")
        args = contract("scan").argv(size=size, due=due, member=member)
        flat, next_due, next_member = self._run("scan", keys_of("scan", keys), args)
        page = [(flat[i], int(float(flat[i + 1])), flat[i + 2]) for i in range(0, len(flat), 3)]
        return page, ((next_due, next_member) if next_due else None)

    def dead(self, keys: QueueKeys, action: str, batch: int, ids: Sequence[str] = ()) -> int:
        """``"requeue"`` or ``"remove"`` dead letters, by id or the oldest ``batch``
        (dead.lua); returns how many left the dead letters."""
        return int(
            self._run(
                "dead",
                keys_of("dead", keys, "", LANES),
                contract("dead").argv(action=action, batch=batch, **_affixes(keys), ids=ids),
            )
        )

    def stats(self, keys: QueueKeys, grace_ms: int, live_ms: int, client: Any = None) -> Any:
        """One queue's counts (stats.lua's reply), or the pipeline when ``client`` is one."""
        return self._run(
            "stats",
            keys_of("stats", keys, "", LANES),
            contract("stats").argv(
                grace_ms=grace_ms,
                live_ms=live_ms,
                ring_prefix=keys.ring_prefix,
                rate_prefix=keys.rate_prefix,
                lane_prefix=keys.lane_prefix,
            ),
            client,
        )

    def limits(
        self, keys: QueueKeys, op: str, values: Sequence[int | None] = (), weights: Sequence[str | int] = ()
    ) -> list[int]:
        """``op`` "set" (``values``: concurrency, group concurrency, rate, window ms, group
        rate; None: none), "update" (only the limits given change: see limits.lua), "clear"
        or "get" a queue's limits, or "weights" (``weights``:
        pairs of a group as hex and its weight) (limits.lua). Returns the
        limits (-1: none), slots and groups in use, the lanes that waited for their group's
        slot, the queue's starts in its rate window and the lanes waiting for their group's
        rate."""
        return [
            int(v)
            for v in self._run_idempotent(
                "limits",
                keys_of("limits", keys),
                contract("limits").argv(
                    op=op,
                    **dict(
                        zip(
                            _LIMITS,
                            ("" if v is None else v for v in (*values, *[None] * (5 - len(values)))),
                            strict=True,
                        )
                    ),
                    **_affixes(keys),
                    wake_prefix=keys.wake_prefix,
                    rate_prefix=keys.rate_prefix,
                    weights=weights,
                ),
            )
        ]

    def shards(self, keys: QueueKeys, op: str, *args: Any) -> list[Any]:
        """``op`` ("read", "set", "drop") on a queue's stored shard layout (shards.lua; its
        reply is read by :class:`dramatiq_redisson.sharding._shards.ShardLayouts`)."""
        argv = contract("shards").argv(op=op, rest=args)
        return cast("list[Any]", self._run_idempotent("shards", keys_of("shards", keys), argv))

    def pause(self, keys: QueueKeys, op: str) -> tuple[bool, int | None]:
        """``op`` "pause" or "resume" the queue (pause.lua): whether the state changed, and
        since when the queue is paused (epoch ms, server clock) or None."""
        changed, since = self._run_idempotent("pause", keys_of("pause", keys), contract("pause").argv(op=op))
        return bool(changed), None if int(since) < 0 else int(since)

    def history(self, keys: QueueKeys, minutes: int, hours: int, client: Any = None) -> Any:
        """The last ``minutes`` and ``hours`` of the queue's activity history (history.lua's
        reply, parsed by :mod:`dramatiq_redisson.admin._history`), or the pipeline when ``client`` is one."""
        args = contract("history").argv(minutes=minutes, hours=hours)
        return self._run("history", keys_of("history", keys), args, client)

    def message_state(self, keys: QueueKeys, message_id: str, search: int, client: Any = None) -> Any:
        """state.lua's reply for ``message_id`` on the queue of ``keys``, or the pipeline when ``client`` is one."""
        args = contract("state").argv(message_id=message_id, search=search, lane_prefix=keys.lane_prefix)
        return self._run("state", keys_of("state", keys), args, client)

    def pending(self, keys: QueueKeys) -> int:
        """Scheduled (but periodic ticks) + ready + in flight + built-in delayed messages of a
        queue (pending.lua)."""
        return int(self._run("pending", keys_of("pending", keys, "", ("ticks",)), contract("pending").argv()))

    def heartbeat(self, keys: QueueKeys, worker_id: str) -> int:
        """Mark ``worker_id`` alive (runs on a full server too) and list the queue in the
        namespace's registry; returns the server time, epoch ms. On a cluster the
        registry lives in another slot: it is written by a command of its own."""
        if not keys.reaches_namespace:
            args = contract("heartbeat").argv(worker_id=worker_id)
            now_ms = int(self._run_idempotent("heartbeat", keys_of("heartbeat", keys), args))
            self.client.sadd(keys.registry, keys.queue_name)
            return now_ms
        beat_keys = keys_of("heartbeat", keys, "", ("registry",))
        args = contract("heartbeat").argv(worker_id=worker_id, queue_name=keys.queue_name)
        return int(self._run_idempotent("heartbeat", beat_keys, args))

    def beat(self, keys: QueueKeys, worker_id: str) -> int:
        """Mark the process of ``worker_id`` alive on the queue (its liveness beat; runs
        on a full server too); returns the server time written, epoch ms."""
        args = contract("heartbeat").argv(worker_id=worker_id)
        return int(self._run_idempotent("heartbeat", keys_of("heartbeat", keys, "", ("alive",)), args))

    def reap(
        self,
        keys: QueueKeys,
        by_beat: Sequence[str],
        by_connection: Sequence[str] = (),
        *,
        timeout_ms: int,
        forget_ms: float,
    ) -> tuple[int, int]:
        """Put back the messages of dead workers, waking idle consumers for them: those
        ``by_connection`` (every subscription gone), and those ``by_beat`` (checked again:
        see reap.lua). Returns (messages put back, workers found dead)."""
        workers = [*by_connection, *by_beat]
        requeued, dead = self._run_idempotent(
            "reap",
            script_keys("reap", keys, workers=workers),
            contract("reap").argv(
                timeout_ms=timeout_ms,
                forget_ms=forget_ms,
                confirmed=len(by_connection),
                **_affixes(keys),
                worker_ids=workers,
            ),
        )
        return int(requeued), int(dead)
