"""The broker's settings, checked once: :class:`BrokerSettings`, :func:`checked_settings`
and :func:`is_int`.

``RedissonBroker(...)`` builds its settings before anything else (no client, no pool, no
script): a bad value raises one :class:`ValueError` that names every bad value, together
with whatever else is wrong with the constructor's arguments (an unknown name, ``url``
with ``client``: see :func:`checked_settings`), and nothing was made.
The parts read the checked values and never check them again.
Assigning a setting on a built broker (``broker.safety_interval = 1000``) goes through
the same checks (see ``RedissonBroker``'s properties).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import TypeIs

from dramatiq.brokers.redis import DEFAULT_DEAD_MESSAGE_TTL, DEFAULT_HEARTBEAT_TIMEOUT

#: Most scheduled messages one transfer call moves to the ready queue.
DEFAULT_TRANSFER_BATCH_SIZE = 100

#: The most a transfer call may move: transfer.lua hands the moved members to variadic
#: commands, and Lua unpacks at most about 8 000 values at once (a call of 7 999 failed
#: with "too many results to unpack", every call, so nothing moved any more).
MAX_TRANSFER_BATCH_SIZE = 5000

#: Longest time (ms) between two transfers of a consumer, announcements or not.
DEFAULT_SAFETY_INTERVAL = 5000

#: Time (ms) between two maintenance runs of a consumer (dead workers, old dead letters).
DEFAULT_MAINTENANCE_INTERVAL = 30000

#: Default ``transfer_lease`` (ms): how long a queue's transfer owner keeps the lease
#: without renewing it; a killed owner delays transfers by at most about this long.
DEFAULT_TRANSFER_LEASE = 2000

#: Time (ms) during which an immediate message's redis id is remembered per queue after
#: it was enqueued, so that sending it again (a client's automatic retry of a call whose
#: reply was lost, a producer's retry) does not enqueue it twice even once the first
#: copy has been acked. Covers redis-py's default ``Retry`` (10 retries, backoff capped
#: at 1 s, 5 s socket and connect timeouts: at most ~110 s from a call's first run to
#: its last retry); the broker widens it to its client's retry span when that is longer
#: (see :func:`dramatiq_redisson.connection._client.client_retry_span_ms`).
DEFAULT_DEDUPE_WINDOW = 120_000

#: Default ``wait_timeout`` (ms): how long a write waits for ``wait_for_replicas`` replicas.
DEFAULT_WAIT_TIMEOUT = 1000

#: Default ``liveness_timeout`` (ms): see :mod:`._liveness`.
DEFAULT_LIVENESS_TIMEOUT = 6000

#: Default ``workflow_retention`` (ms): a finished workflow is kept a day.
DEFAULT_WORKFLOW_RETENTION = 86_400_000

#: Default ``unknown_actor_grace`` (ms): a message for an actor its worker has not declared
#: waits up to 10 minutes for a worker that has (a rolling deploy's old processes run
#: beside the new ones for about that long), then it is dead-lettered.
DEFAULT_UNKNOWN_ACTOR_GRACE = 600_000

#: Default ``done_retention`` (ms): 0, no record of finished messages is kept (an ack then
#: writes nothing for it).
DEFAULT_DONE_RETENTION = 0

#: Seconds between two trims of a queue's done records by one process: a record costs its
#: ack one ZADD, and the process's first ack after each interval also drops the records
#: older than ``done_retention`` and sets their key to expire (see ``scripts/lua/ack.lua``).
DONE_TRIM_INTERVAL = 1.0

#: What each setting a broker exposes as an attribute means, its unit and its default:
#: the docstrings of those attributes (``RedissonBroker.safety_interval``), which the API
#: reference shows.
SETTING_DOCS = {
    "heartbeat_timeout": (
        "Time (ms) a worker may go without a heartbeat before it counts as dead: the "
        "maintenance of another worker's consumer then requeues the messages it fetched and "
        "did not ack (Dramatiq's meaning). A non-negative number; default 60000 (one "
        "minute); 0 counts every worker as dead at once (Dramatiq's own tests set it)."
    ),
    "dead_message_ttl": (
        "Time (ms) a dead-lettered message (one that failed for good) is kept before "
        "maintenance deletes it. A non-negative number; default 604800000 (seven days, "
        "Dramatiq's)."
    ),
    "transfer_batch_size": (
        "Most due messages one transfer call moves from a queue's delayed queue to its ready "
        "queue (a count): a larger backlog moves in several calls, one after another, so no "
        "single call blocks the server long. An int from 1 to 5000; default 100."
    ),
    "safety_interval": (
        "Longest time (ms) between two transfers of a queue even when no announcement "
        "arrives (a lost announcement or subscription delays messages by at most this), and "
        "the period of each consumer's housekeeping: its heartbeat, the requeue of messages "
        "a lost reply stranded, and a sharded queue's layout read. A positive number; "
        "default 5000."
    ),
    "maintenance_interval": (
        "Time (ms) between two maintenance runs of a consumer, which requeue the unacked "
        "messages of dead workers and delete expired dead letters (the built-in broker "
        "runs it by chance, ``maintenance_chance``). A positive number; default 30000."
    ),
    "dedupe_window": (
        "Time (ms) an immediate message's id stays remembered per queue after its send, so "
        "that sending it again (a client's retry of a call whose reply was lost) pushes "
        "nothing, even once the first copy was acked. The broker widens it to its client's "
        "retry span when that is longer. A non-negative number; default 120000; 0 keeps "
        "only the check against copies still queued or in flight."
    ),
    "transfer_lease": (
        "Time (ms) the consumer that runs a queue's transfers holds its lease: it renews it "
        "at least every third of it, and when it dies another consumer takes over within "
        "about this long, so it bounds how long a killed process delays the queue's "
        "transfers. An int of at least 100; default 2000."
    ),
    "wait_for_replicas": (
        "How many replicas (a count) each write (a send, a retry's re-enqueue, a cancel, a "
        "transfer) waits for (``WAIT``) before it counts as done: replication is "
        "asynchronous, and without it a write the primary acknowledged can be lost when a "
        "replica takes over. A send that too few replicas acknowledged raises "
        "``EnqueueNotReplicated``. A non-negative int; default 0, none."
    ),
    "wait_timeout": (
        "Longest wait (ms) for the ``wait_for_replicas`` replicas, per write. An int of at least 1; default 1000."
    ),
    "workflow_retention": (
        "Time (ms) a finished workflow (done, failed or cancelled) is kept, with its steps' "
        "results, before it is removed (see :mod:`dramatiq_redisson.workflows`). A "
        "non-negative int; default 86400000 (a day); 0 removes it when it finishes."
    ),
    "unknown_actor_grace": (
        "Time (ms) a message whose actor the worker that got it has not declared (a new "
        "actor during a rolling deploy, whose old processes do not know it) is put back on "
        "the server for another worker, a second later each time, before it is "
        "dead-lettered with a reason that names the actor. Counted from its first put-back, "
        "on the server's clock. A non-negative int; default 600000 (ten minutes); 0 "
        "dead-letters it at once, as Dramatiq does."
    ),
    "done_retention": (
        "Time (ms) a record of each processed message is kept, so that "
        ':meth:`~dramatiq_redisson.RedissonBroker.message_state` can answer "done" for it: '
        "its ack adds one (one ZADD of its message id and the time: about 110 bytes per "
        "record; a queue that acks 100 messages a second keeps about 40 MB for an hour's "
        "retention; see docs/operating.md), and drops the records older than this about "
        "once a second per process and queue. A non-negative int; default 0: no record is "
        "kept, and an ack writes nothing for it."
    ),
}


def is_int(value: object) -> TypeIs[int]:
    """An ``int`` that is not a ``bool`` (``True`` is an ``int`` to Python, never a count
    or a duration here)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class BrokerSettings:
    """What ``RedissonBroker`` was told, checked (all times in ms).

    Attributes:
      heartbeat_timeout: Time (ms) without a heartbeat after which a worker is dead
        and its unacked messages are requeued.
      dead_message_ttl: Time (ms) dead-lettered messages are kept.
      transfer_batch_size: Most scheduled messages one transfer call moves.
      safety_interval: Longest time (ms) between two transfers of a consumer.
      maintenance_interval: Time (ms) between two maintenance runs of a consumer.
      transfer_lease: Time (ms) the consumer that runs a queue's transfers holds its
        lease; the holder renews it at least every third of it, and when the holder
        dies another consumer takes over within about this long (see
        :data:`DEFAULT_TRANSFER_LEASE`).
      dedupe_window: Time (ms) an immediate message stays remembered after it was
        enqueued (see :data:`DEFAULT_DEDUPE_WINDOW`); widened to the client's retry
        span. 0 keeps only the check against messages still queued or in flight.
      wait_for_replicas: After each enqueue (``enqueue``, ``enqueue_many``, a retry's
        re-enqueue), cancel (``DelayedQueue.remove``) and transfer, wait (``WAIT``, on
        the connection that wrote) until this many replicas have the write. Replication
        is asynchronous: without it, a write the primary acknowledged can be lost when a
        replica takes over. 0 (the default) waits for none. An enqueue or cancel that
        too few replicas acknowledged in time raises ``EnqueueNotReplicated`` /
        ``NotReplicated`` (the write is on the primary); a consumer's transfer logs it
        and transfers again soon. Needs ``+wait`` in an ACL rule
        (``acl_rule(wait_for_replicas=True)``).
      wait_timeout: Longest wait (ms) for those replicas, per write.
      liveness_timeout: Time (ms) after which a worker process whose liveness beats
        stopped (killed, its host gone) is dead and its unacked messages run again
        elsewhere; each process beats every third of it from a thread of its own, and a
        killed one is found sooner, by its closed connections (see
        :mod:`dramatiq_redisson._liveness` for what can make a live process look dead).
        0 turns it off: then only ``heartbeat_timeout`` recovers them, as in Dramatiq.
      max_priority: The highest ``broker_priority`` a message may have (RabbitMQ's
        ``x-max-priority``: higher runs first; a value above it counts as it); 0 (the
        default) ignores priorities, as a RabbitMQ queue without ``x-max-priority`` does.
      shards: ``(queue name, shard count)`` pairs: each named queue is spread over that
        many hash slots (issue 36, docs/sharding-design.md); a queue not named has one.
      workflow_retention: Time (ms) a finished workflow is kept (see
        :mod:`dramatiq_redisson.workflows`).
      unknown_actor_grace: Time (ms) a message for an actor its worker has not declared
        is put back for another worker before it is dead-lettered (see
        :mod:`dramatiq_redisson._unknown_actors`); 0 dead-letters it at once.
      done_retention: Time (ms) a record of each processed message is kept for
        ``message_state`` (its "done" state); 0 keeps none (see ``scripts/lua/ack.lua``).
    """

    heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT
    dead_message_ttl: float = DEFAULT_DEAD_MESSAGE_TTL
    transfer_batch_size: int = DEFAULT_TRANSFER_BATCH_SIZE
    safety_interval: float = DEFAULT_SAFETY_INTERVAL
    maintenance_interval: float = DEFAULT_MAINTENANCE_INTERVAL
    dedupe_window: float = DEFAULT_DEDUPE_WINDOW
    transfer_lease: int = DEFAULT_TRANSFER_LEASE
    wait_for_replicas: int = 0
    wait_timeout: int = DEFAULT_WAIT_TIMEOUT
    liveness_timeout: int = DEFAULT_LIVENESS_TIMEOUT
    max_priority: int = 0
    shards: tuple[tuple[str, int], ...] = ()
    workflow_retention: int = DEFAULT_WORKFLOW_RETENTION
    unknown_actor_grace: int = DEFAULT_UNKNOWN_ACTOR_GRACE
    done_retention: int = DEFAULT_DONE_RETENTION

    @functools.cached_property
    def _shard_counts(self) -> dict[str, int]:
        return dict(self.shards)

    def shard_count(self, queue_name: str) -> int:
        """How many shards ``queue_name`` has (1: not sharded). Asked on every send: the
        pairs are made a dict once."""
        return self._shard_counts.get(queue_name, 1)

    def __post_init__(self) -> None:
        problems = [problem for problem in (check(self) for check in _CHECKS) if problem]
        if problems:
            raise ValueError("; ".join(problems))

    def replace(self, **changes: Any) -> BrokerSettings:
        """A copy with ``changes``, checked as a new one."""
        return dataclasses.replace(self, **changes)


def checked_settings(other_problems: Sequence[str] = (), **values: Any) -> BrokerSettings:
    """``BrokerSettings(**values)``, refused together with what the broker's constructor
    found wrong in its other arguments (``other_problems``: an unknown name, ``url`` given
    with ``client``): one ValueError names every bad value and every problem, the
    settings' first, so a user fixes them all in one go.

    Raises:
      ValueError: A bad setting or any problem; ``"; "`` separates them.
    """
    problems: list[str] = []
    try:
        settings = BrokerSettings(**values)
    except ValueError as e:
        problems.append(str(e))
    problems += other_problems
    if problems:
        raise ValueError("; ".join(problems))
    return settings


Check = Callable[[BrokerSettings], "str | None"]


def _at_least(name: str, least: int, unit: str = "", *, numbers: bool = False) -> Check:
    """``name`` is an int of at least ``least``; with ``numbers``, a float too (the
    options that took one before they were checked here)."""

    def check(settings: BrokerSettings) -> str | None:
        value = getattr(settings, name)
        if (is_int(value) or (numbers and isinstance(value, float))) and value >= least:
            return None
        kind = "number" if numbers else "int"
        if least > 1:
            what = f"{'a' if numbers else 'an'} {kind} of at least {least}{unit}"
        else:
            what = f"a {'positive' if least else 'non-negative'} {kind}"
        return f"{name} must be {what}, got {value!r}"

    return check


def _transfer_batch_at_most(settings: BrokerSettings) -> str | None:
    value = settings.transfer_batch_size
    if is_int(value) and value > MAX_TRANSFER_BATCH_SIZE:
        return (
            f"transfer_batch_size must be at most {MAX_TRANSFER_BATCH_SIZE}, got {value!r}: one transfer call "
            "unpacks that many messages in Lua (a larger backlog moves in several calls anyway)"
        )
    return None


def _liveness(settings: BrokerSettings) -> str | None:
    value = settings.liveness_timeout
    if is_int(value) and (value == 0 or value >= 100):
        return None
    return f"liveness_timeout must be 0 (off) or an int of at least 100 ms, got {value!r}"


def _max_priority(settings: BrokerSettings) -> str | None:
    value = settings.max_priority
    if is_int(value) and 0 <= value <= 255:
        return None
    return f"max_priority must be an int from 0 (priorities ignored) to 255, got {value!r}"


#: Dramatiq's queue names (``dramatiq.common.q_name`` leaves them as they are).
_QUEUE_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9._-]*")


def _shards(settings: BrokerSettings) -> str | None:
    from ._queue_names import MAX_SHARDS

    for pair in settings.shards:
        name, count = pair if isinstance(pair, tuple) and len(pair) == 2 else (pair, None)
        if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
            return f"shards: {name!r} is not a queue name"
        if not is_int(count) or not 1 <= count <= MAX_SHARDS:
            return f"shards: the shard count of {name!r} must be an int from 1 to {MAX_SHARDS}, got {count!r}"
    return None


_CHECKS: tuple[Check, ...] = (
    _at_least("heartbeat_timeout", 0, numbers=True),  # 0, as Dramatiq's own tests set it: every worker is dead
    _at_least("dead_message_ttl", 0, numbers=True),
    _at_least("transfer_batch_size", 1),
    _transfer_batch_at_most,
    _at_least("safety_interval", 1, numbers=True),
    _at_least("maintenance_interval", 1, numbers=True),
    _at_least("dedupe_window", 0, numbers=True),
    _at_least("transfer_lease", 100, " ms"),
    _at_least("wait_for_replicas", 0),
    # WAIT n 0 would block forever: a producer must never hang on a lost replica.
    _at_least("wait_timeout", 1),
    _liveness,
    _max_priority,
    _shards,
    _at_least("workflow_retention", 0),
    _at_least("unknown_actor_grace", 0),
    _at_least("done_retention", 0),
)
