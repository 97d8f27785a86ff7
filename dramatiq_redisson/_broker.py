"""RedissonBroker: Dramatiq's Redis broker with delays on Redisson's delayed-queue scheme."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, cast
from uuid import uuid4

import redis
from dramatiq import get_encoder
from dramatiq.broker import Consumer, MessageProxy
from dramatiq.brokers.redis import DEFAULT_DEAD_MESSAGE_TTL, DEFAULT_HEARTBEAT_TIMEOUT, RedisBroker
from dramatiq.common import compute_backoff, q_name
from dramatiq.errors import QueueJoinTimeout
from dramatiq.message import Message
from dramatiq.middleware import Middleware
from redis.cluster import RedisCluster

from ._dead_letters import DeadLetters
from ._delayed_queue import OVERDUE_GRACE, DelayedQueue
from ._errors import EnqueueError, ServerMemoryFull
from ._held import HeldMessages
from ._ids import next_sort_key, next_sort_keys
from ._keys import QueueKeys, check_cluster_name, heartbeats_key, registry_key
from ._permissions import MissingPermission, acl_rule, check_permissions, is_permission_error
from ._scripts import NotReplicated, Outcomes, Scripts, Unanswered
from ._server import check_server
from ._stats import QueueStats, Stats
from .metrics import adopt_middleware

#: Most scheduled messages one transfer call moves to the ready queue.
DEFAULT_TRANSFER_BATCH_SIZE = 100

#: Longest time (ms) between two transfers of a consumer, announcements or not.
DEFAULT_SAFETY_INTERVAL = 5000

#: Time (ms) between two maintenance runs of a consumer (dead workers, old dead letters).
DEFAULT_MAINTENANCE_INTERVAL = 30000

#: Default ``transfer_lease`` (ms): how long a queue's transfer owner keeps the lease
#: without renewing it; a killed owner delays transfers by at most about this long.
DEFAULT_TRANSFER_LEASE = 2000

#: Longest delay (ms) accepted: ten years. Anything longer is taken for a unit mistake.
MAX_DELAY = 10 * 366 * 86_400_000

#: Most messages one script call of :meth:`RedissonBroker.enqueue_many` carries (keeps
#: each call to a few ms even with a million scheduled).
BULK_CHUNK_SIZE = 100

#: Time (ms) during which an immediate message's redis id is remembered per queue after
#: it was enqueued, so that sending it again (a client's automatic retry of a call whose
#: reply was lost, a producer's retry) does not enqueue it twice even once the first
#: copy has been acked. Covers redis-py's default ``Retry`` (10 retries, backoff capped
#: at 1 s, 5 s socket and connect timeouts: at most ~110 s from a call's first run to
#: its last retry); the broker widens it to its client's retry span when that is longer
#: (see :func:`client_retry_span_ms`).
DEFAULT_DEDUPE_WINDOW = 120_000

#: Longest time (ms) a worker keeps retrying the re-enqueue of a message it is processing
#: (a retry scheduled by the Retries middleware) while the server is unreachable or
#: loading; the message's copy in flight is not acked meanwhile. Past it, that copy is
#: left unacked and requeued by the consumer, so the message is never lost.
REDELIVERY_RETRY_TIME = 30_000

#: Longest pause (ms) between two of those attempts; the first pause is 100 ms.
MAX_REDELIVERY_BACKOFF = 2000


#: Default ``wait_timeout`` (ms): how long a write waits for ``wait_for_replicas`` replicas.
DEFAULT_WAIT_TIMEOUT = 1000


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


#: The fields of a message, in the order ``Message.asdict`` gives them.
_MESSAGE_FIELDS = tuple(field.name for field in dataclasses.fields(Message))
_KNOWN_MESSAGE_FIELDS = ("queue_name", "actor_name", "args", "kwargs", "options", "message_id", "message_timestamp")


def _encode(message: Message[Any]) -> bytes:
    """``message.encode()`` without looking up the dataclass fields on every call."""
    return get_encoder().encode({name: getattr(message, name) for name in _MESSAGE_FIELDS})


def encode_scheduled(message: Message[Any], sort_key: str) -> bytes:
    """Encode a prepared scheduled message for the payload hash, compactly when possible.

    The member (sort key + message id) is the message's ``redis_message_id``. With a JSON
    encoder the stored copy leaves that option out, about 37 bytes less per scheduled
    message; transfer.lua writes it back, right after ``"options":{``, when it moves the
    message, so what reaches the ready queue names the member as any ready message does.
    The full encoding is stored instead when that insertion could go wrong: another
    encoder, ``"options":{`` or ``"redis_message_id":"`` showing up in an argument, or a
    member that would need escaping inside a JSON string.
    """
    member = message.options.pop("redis_message_id")
    try:
        data = _encode(message)
    finally:
        message.options["redis_message_id"] = member
    if (
        b'"redis_message_id":"' not in data
        and data.count(b'"options":{') == 1
        and '"' not in member
        and "\\" not in member
        and member.isprintable()
    ):
        return data
    return _encode(message)


def _epoch_ms(time_reply: tuple[Any, Any]) -> int:
    """A ``TIME`` reply as epoch ms."""
    seconds, micros = time_reply
    return int(seconds) * 1000 + int(micros) // 1000


def client_retry_span_ms(client: redis.Redis | RedisCluster) -> int | None:
    """The longest time (ms) from a command's first run to the last automatic retry of it
    by ``client`` (redis-py retries a command on a connection error or timeout, and the
    first attempt may have run before its reply was lost), estimated from the client's
    ``Retry`` (retries, backoff cap) and socket timeouts; ``None`` when it retries
    forever or its settings cannot be read. A socket timeout of ``None`` counts as 0:
    such a client waits for a reply instead of retrying.

    A cluster client retries a command on top of its node connection's own retries:
    each of its attempts may take a node connection's whole span.
    """
    try:
        if isinstance(client, RedisCluster):
            node = client.get_redis_connection(client.get_default_node())
            per_node = client_retry_span_ms(node)
            retries = int(client.retry.get_retries())
            if per_node is None or retries < 0:
                return None
            return (retries + 1) * per_node + _backoff_total_ms(client.retry._backoff, retries)
        pool = client.connection_pool
        connection = pool.connection_class(**pool.connection_kwargs)  # not connected
        retry = connection.retry
        retries = int(retry.get_retries())
        socket_timeout = float(connection.socket_timeout or 0)
        connect_timeout = float(connection.socket_connect_timeout or 0)
        backoff = retry._backoff
    except Exception:
        return None
    if retries < 0:
        return None
    if retries == 0:
        return 0
    timeouts = 1000 * (socket_timeout + retries * (connect_timeout + socket_timeout))
    return math.ceil(timeouts) + _backoff_total_ms(backoff, retries)


def _backoff_total_ms(backoff: Any, retries: int) -> int:
    """The longest total pause (ms) of ``retries`` retries with ``backoff``."""
    cap = getattr(backoff, "_cap", None)
    base = getattr(backoff, "_base", None)
    total = 0.0
    for failures in range(1, retries + 1):
        if type(backoff).__name__ == "DecorrelatedJitterBackoff" and cap is not None:
            total += float(cap)
        elif cap is not None and base is not None:  # exponential ones, with or without jitter
            total += min(float(cap), float(base) * 2**failures)
        else:  # constant (or unknown): its value
            total += float(backoff.compute(failures))
    return math.ceil(1000 * total)


def _eta_estimate(delay_ms: int | None) -> int | None:
    """For a delayed send, the ``eta`` the built-in broker would give it (now + delay on
    this process's clock, epoch ms), handed to ``before_enqueue``; else ``None``."""
    if not delay_ms:
        return None
    return int(time.time() * 1000) + delay_ms


def validate_delay(delay: Any) -> int | None:
    """Return ``delay`` as whole milliseconds, or ``None`` for no delay.

    A fractional delay is rounded up (never earlier than asked); a negative one means
    "already due" and becomes 0 (run now), as with the built-in broker, Sidekiq, BullMQ
    and Celery, where producers compute ``delay = due - now``.

    Raises:
      TypeError: If ``delay`` is not a number of milliseconds or a timedelta (a bool is not).
      ValueError: If ``delay`` is NaN, infinite or longer than :data:`MAX_DELAY`.
    """
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        delay = delay.total_seconds() * 1000
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        raise TypeError(f"delay must be a number of milliseconds or a timedelta, not {type(delay).__name__}")
    if isinstance(delay, float):
        if not math.isfinite(delay):
            raise ValueError(f"delay must be finite, got {delay!r}")
        delay = math.ceil(delay)
    if delay > MAX_DELAY:
        raise ValueError(f"delay must be at most {MAX_DELAY} ms (ten years), got {delay!r}")
    return max(0, int(delay))


#: The ``dedupe`` option's values: what a send does while another message holds its
#: ``dedupe_key`` (see :meth:`RedissonBroker.enqueue`).
DEDUPE_MODES = ("keep", "replace")

#: The message options of a keyed send.
DEDUPE_OPTIONS = ("dedupe_key", "dedupe", "dedupe_ttl")


def dedupe_options(options: dict[str, Any], delay_ms: int | None) -> tuple[str, str, int] | None:
    """A send's dedupe key, mode and throttle ttl (ms, 0 for none) from its message
    options (``dedupe_key``, ``dedupe``, ``dedupe_ttl``), or ``None`` when it has none.

    Raises:
      ValueError: A ``dedupe``/``dedupe_ttl`` without a ``dedupe_key``, a key that is not
        a non-empty str, an unknown mode, a ttl that is not a non-negative int of ms up to
        :data:`MAX_DELAY` (the options travel in the encoded message), or any of them on a send without a delay.
    """
    if not any(options.get(name) is not None for name in DEDUPE_OPTIONS):
        return None
    key, mode, ttl = (options.get(name) for name in DEDUPE_OPTIONS)
    if key is None:
        raise ValueError("dedupe= and dedupe_ttl= need a dedupe_key=")
    if not isinstance(key, str) or not key:
        raise ValueError(f"dedupe_key must be a non-empty str, got {key!r}")
    if mode is None:
        mode = "keep"
    if mode not in DEDUPE_MODES:
        raise ValueError(f"dedupe must be one of {', '.join(map(repr, DEDUPE_MODES))}, got {mode!r}")
    if ttl is None:
        ttl = 0
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 0 <= ttl <= MAX_DELAY:
        raise ValueError(f"dedupe_ttl must be a non-negative int of ms (at most {MAX_DELAY}), got {ttl!r}")
    if not delay_ms:
        raise ValueError(
            f"dedupe_key, dedupe and dedupe_ttl apply to scheduled messages: send with a delay (delay={delay_ms!r})"
        )
    return key, mode, ttl


def _kept_message(reply: list[Any]) -> Message[Any]:
    """The message that kept a keyed send out (offer.lua's ``[due or -3, member, stored
    payload]``): the scheduled one (with its ``eta``) or the one that moved in the
    key's throttle window."""
    due, member, stored = int(reply[0]), reply[1], reply[2]
    if due == -3:
        return Message.decode(stored)
    message = Message.decode(stored[16:])
    message.options["redis_message_id"] = member.decode()
    if due >= 0:
        message.options["eta"] = due
    return message


class RedissonBroker(RedisBroker):
    """A Redis broker whose delayed messages live in Redisson's delayed-queue structures.

    Accepts everything :class:`dramatiq.brokers.redis.RedisBroker` accepts. Immediate
    messages use the built-in ready-queue layout, so both brokers can share a Redis
    during a migration; delayed messages (``send_with_options(delay=…)``, retries,
    delayed pipelines) go to a ZSET scored by due time on the *server's* clock and are
    moved to the ready queue by a timer that runs inside each worker's consumer.

    Parameters:
      url: An optional connection URL; its query options win over connection parameters,
        which apply too (unlike the built-in broker, which drops them when given a url).
      middleware: The middleware to add to this broker.
      namespace: The prefix of every Dramatiq key.
      maintenance_chance: Accepted for compatibility; maintenance runs every
        ``maintenance_interval`` ms instead of by chance.
      heartbeat_timeout: Time (ms) without a heartbeat after which a worker is dead
        and its unacked messages are requeued.
      dead_message_ttl: Time (ms) dead-lettered messages are kept.
      client: A redis client to use.
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
        too few replicas acknowledged in time raises :class:`EnqueueNotReplicated` /
        :class:`NotReplicated` (the write is on the primary); a consumer's transfer logs
        it and transfers again soon. Needs ``+wait`` in an ACL rule
        (``acl_rule(wait_for_replicas=True)``).
      wait_timeout: Longest wait (ms) for those replicas, per write.
      cluster: Connect to a Redis/Valkey Cluster: ``url`` (or the ``host``/``port``
        parameters) names one of its nodes and a :class:`redis.cluster.RedisCluster`
        client is made. A ``RedisCluster`` passed as ``client`` implies it. Keys then
        follow the cluster layout, where every key of a queue hashes to one slot
        (see :mod:`dramatiq_redisson._keys`), and announcements use sharded pub/sub.
      **parameters: Connection parameters passed to :class:`redis.Redis` (or to
        :class:`redis.cluster.RedisCluster`).

    One message id is enqueued at most once per queue: an immediate message is pushed
    under its message id as redis message id and is not pushed again while it is
    queued, in flight or within ``dedupe_window`` of its first send (a message being
    processed, re-enqueued by ``Retries``, gets a fresh redis id); a delayed message
    id is scheduled at most once (offering it again reschedules it).
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        middleware: list[Middleware] | None = None,
        namespace: str = "dramatiq",
        maintenance_chance: int = 1000,
        heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT,
        dead_message_ttl: int = DEFAULT_DEAD_MESSAGE_TTL,
        client: redis.Redis | RedisCluster | None = None,
        transfer_batch_size: int = DEFAULT_TRANSFER_BATCH_SIZE,
        safety_interval: int = DEFAULT_SAFETY_INTERVAL,
        maintenance_interval: int = DEFAULT_MAINTENANCE_INTERVAL,
        dedupe_window: int = DEFAULT_DEDUPE_WINDOW,
        transfer_lease: int = DEFAULT_TRANSFER_LEASE,
        wait_for_replicas: int = 0,
        wait_timeout: int = DEFAULT_WAIT_TIMEOUT,
        cluster: bool = False,
        **parameters: Any,
    ) -> None:
        owns_client = client is None
        if isinstance(client, RedisCluster):
            cluster = True
        elif client is not None and cluster:
            raise TypeError(f"cluster=True needs a redis.cluster.RedisCluster client, got {type(client).__name__}")
        if cluster:
            check_cluster_name("namespace", namespace)
        if client is None and (url or cluster):
            # The built-in broker drops every connection parameter when a url is given;
            # here they apply too (url query options still win), so ``url="rediss://…",
            # ssl_ca_certs=…`` verifies against that CA instead of failing.
            if cluster:
                client = RedisCluster.from_url(url, **parameters) if url else RedisCluster(**parameters)
            else:
                client = redis.Redis.from_url(cast(str, url), **parameters)
            parameters = {}
        super().__init__(
            middleware=middleware,
            namespace=namespace,
            maintenance_chance=maintenance_chance,
            heartbeat_timeout=heartbeat_timeout,
            dead_message_ttl=dead_message_ttl,
            client=client,
            **parameters,
        )
        if transfer_batch_size < 1:
            raise ValueError("transfer_batch_size must be at least 1")
        if safety_interval < 1 or maintenance_interval < 1:
            raise ValueError("safety_interval and maintenance_interval must be positive")
        if dedupe_window < 0:
            raise ValueError("dedupe_window must not be negative")
        if not isinstance(transfer_lease, int) or transfer_lease < 100:
            raise ValueError(f"transfer_lease must be an int of at least 100 ms, got {transfer_lease!r}")
        if isinstance(wait_for_replicas, bool) or not isinstance(wait_for_replicas, int) or wait_for_replicas < 0:
            raise ValueError(f"wait_for_replicas must be a non-negative int, got {wait_for_replicas!r}")
        if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, int) or wait_timeout < 1:
            # WAIT n 0 would block forever: a producer must never hang on a lost replica.
            raise ValueError(f"wait_timeout must be a positive int of ms, got {wait_timeout!r}")
        #: Whether the client is a Redis Cluster client (the cluster key layout).
        self.cluster = cluster
        span = client_retry_span_ms(self.client)
        if span is None:
            self.logger.warning(
                "Cannot bound how long the redis client retries a command; immediate sends "
                "are deduplicated within dedupe_window=%d ms.",
                dedupe_window,
            )
        elif dedupe_window and span > dedupe_window:
            dedupe_window = span
        #: Time (ms) an immediate message's redis id stays remembered after its send.
        self.dedupe_window = dedupe_window
        self.transfer_batch_size = transfer_batch_size
        self.safety_interval = safety_interval
        self.maintenance_interval = maintenance_interval
        self.transfer_lease = transfer_lease
        #: Replicas each write waits for (``WAIT``), and for how long (ms) at most.
        self.wait_for_replicas = wait_for_replicas
        self.wait_timeout = wait_timeout
        self.redisson_scripts = Scripts(
            self.client, wait_for_replicas=wait_for_replicas, wait_timeout=wait_timeout, cluster=cluster
        )
        #: Fetched ids this process's consumers still hold (see :mod:`._held`).
        self.held = HeldMessages()
        #: redis message id -> the message as it failed (encoded), set by the consumer's
        #: nack for do_nack, whose built-in signature (queue_name, message_id) it keeps.
        self.failed_payloads: dict[str, bytes] = {}
        #: Queues whose consumers ran the permission probe (see :mod:`._permissions`).
        self.permissions_checked: set[str] = set()
        self._owns_client = owns_client
        #: Queues this process listed in the queue registry (see :meth:`_register_queue`).
        self._registered: set[str] = set()
        #: The servers' names and versions once :meth:`check_server` has run (None: not yet).
        self.server_versions: dict[str, tuple[str, tuple[int, int, int]]] | None = None
        #: Called as ``listener(queue_name, lateness_ms)`` after each transfer this
        #: process's consumers run that moved messages: for each moved message, how late
        #: it moved (ms after its due time, server clock). Metrics hook in here.
        self.transfer_listeners: list[Callable[[str, list[int]], None]] = []

    def check_server(self) -> dict[str, tuple[str, tuple[int, int, int]]]:
        """Check, once per broker, that the server (every node of a cluster) is one the
        broker runs on: Redis >= 6.2 or Valkey, and >= 7.0 on a cluster (see
        :mod:`dramatiq_redisson._server` for why). Consumers run it when they start and
        the first send runs it, so an unsupported server is refused before anything is
        written, with one error that names its version, the missing feature and the
        minimum version.

        Returns:
          Each server's name and version, ``{node: ("redis", (7, 2, 6))}`` (node ``""``
          for a single server).

        Raises:
          UnsupportedServer: The server cannot run the broker.
          redis.ConnectionError, redis.TimeoutError: The server could not be asked (the
            check runs again at the next start or send).
        """
        if self.server_versions is None:
            self.server_versions = check_server(self.client, cluster=self.cluster)
        return self.server_versions

    @property
    def server_version(self) -> tuple[int, int, int] | None:
        """The server's version once :meth:`check_server` ran (on a cluster the oldest
        node's), else None."""
        if not self.server_versions:
            return None
        return min(version for _, version in self.server_versions.values())

    def acl_rule(self, *, wait_for_replicas: bool | None = None) -> str:
        """The least-privilege ACL rule for this broker's Redis user, rendered for the
        server it is connected to (asks the server its version; see
        :func:`dramatiq_redisson.acl_rule`): its namespace, the cluster rule on a cluster,
        ``+wait`` when the broker has ``wait_for_replicas`` (or when asked)."""
        self.check_server()
        return acl_rule(
            self.namespace,
            cluster=self.cluster,
            wait_for_replicas=bool(self.wait_for_replicas) if wait_for_replicas is None else wait_for_replicas,
            server_version=self.server_version,
        )

    def check_server_if_reachable(self) -> None:
        """:meth:`check_server`, unless the server cannot be asked now: then the call that
        follows (a send, a fetch) meets the same connection error and reports it its own
        way, and the check runs again next time."""
        try:
            self.check_server()
        except (redis.ConnectionError, redis.TimeoutError):
            pass

    def add_middleware(
        self, middleware: Middleware, *, before: type[Middleware] | None = None, after: type[Middleware] | None = None
    ) -> None:
        """As Dramatiq's; Dramatiq's own ``Prometheus`` middleware becomes this package's
        (see :mod:`dramatiq_redisson.metrics`), which also exports the queue gauges and
        the transfer metrics."""
        super().add_middleware(adopt_middleware(middleware), before=before, after=after)

    def notify_transfer(self, queue_name: str, lateness_ms: list[int]) -> None:
        """Tell :attr:`transfer_listeners` about a transfer (a failing listener is logged,
        never raised into the consumer)."""
        for listener in self.transfer_listeners:
            try:
                listener(queue_name, lateness_ms)
            except Exception:
                self.logger.exception("Transfer listener %r failed.", listener)

    def close(self) -> None:
        """Close the connections this broker opened (a ``client`` passed in is left alone)."""
        if self._owns_client:
            if self.cluster:
                # RedisCluster.close() leaves its nodes' connection pools open (their
                # sockets close only when collected): disconnect them too.
                for node in cast(RedisCluster, self.client).get_nodes():
                    if node.redis_connection is not None:
                        node.redis_connection.connection_pool.disconnect()
                self.client.close()
            else:
                self.client.connection_pool.disconnect()

    @property
    def consumer_class(self) -> type[Consumer]:
        from ._consumer import RedissonConsumer

        return RedissonConsumer

    def do_ack(self, queue_name: str, redis_message_id: str) -> int:
        """Ack a message this worker fetched from ``queue_name`` (the consumer's ack goes
        through here, as the built-in consumer's does). Returns 1 if it was held.

        A message whose retry could not be re-enqueued (see ``_redeliver``) is not acked:
        it stays in the ack set, unheld, and the consumer's next reconciliation requeues it."""
        if self.held.was_released(queue_name, redis_message_id):
            return 0
        acked = self.redisson_scripts.ack(self.keys(queue_name), self.broker_id, redis_message_id)
        self.held.discard(queue_name, (redis_message_id,))
        return acked

    def do_nack(self, queue_name: str, redis_message_id: str, final: bytes | None = None) -> int:
        """Move a message this worker fetched from ``queue_name`` to its dead letters;
        ``final`` (its encoding as it failed, with the traceback Dramatiq recorded) is
        stored in place of the copy fetched. Returns 1 if it was moved."""
        if final is None:
            final = self.failed_payloads.get(redis_message_id)
        nacked = self.redisson_scripts.nack(self.keys(queue_name), self.broker_id, redis_message_id, final)
        self.held.discard(queue_name, (redis_message_id,))
        return nacked

    def _dispatch(self, command: str) -> Callable[..., Any]:
        """The built-in broker's ``do_<command>`` methods (``do_qsize``, ``do_purge``, ...),
        which run its dispatch script: on a cluster that script reaches keys of several
        slots, so they raise a clear error there instead of the server's."""
        if not self.cluster:
            return cast("Callable[..., Any]", super()._dispatch(command))

        def refuse(*args: Any) -> Any:
            raise NotImplementedError(
                f"do_{command} runs the built-in RedisBroker's dispatch script, whose keys span hash "
                "slots: it cannot run on a Redis Cluster. Use broker.stats(), pending(), flush(), "
                "delayed_queue() or dead_letters() instead."
            )

        return refuse

    def keys(self, queue_name: str) -> QueueKeys:
        """The Redis key names of a queue (see :mod:`dramatiq_redisson._keys`).

        Raises:
          ValueError: On a cluster, a queue name that holds ``{`` or ``}``.
        """
        name = q_name(queue_name)
        if self.cluster:
            check_cluster_name("queue name", name)
        return QueueKeys(self.namespace, name, self.cluster)

    def declare_queue(self, queue_name: str) -> None:
        """Declare a queue. Unlike the built-in broker, no ``.DQ`` delay queue is declared:
        the timer in each queue's consumer moves delayed messages."""
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

    def _prepare(self, message: Message[Any], delay_ms: int | None) -> tuple[Message[Any], str]:
        """Give ``message`` its redis id and canonical queue; drop any ``eta``. Returns the
        message and its sort key ("" if it is not delayed)."""
        if delay_ms:
            return self.prepare_scheduled(message)
        return self._with_redis_id(message, self._ready_id(message)), ""

    @staticmethod
    def _ready_id(message: Message[Any]) -> str:
        """The redis message id of an immediate send: the message id, so that sending
        the same message again is recognised (see enqueue.lua); a fresh one for a
        message being processed (a retry), whose current copy is still in flight."""
        if isinstance(message, MessageProxy):
            return str(uuid4())
        return message.message_id

    def prepare_scheduled(self, message: Message[Any], sort_key: str | None = None) -> tuple[Message[Any], str]:
        """A copy of ``message`` ready to be offered to its delayed queue (``sort_key``, or
        a new one, ``redis_message_id`` = sort key + message id, canonical queue, no
        ``eta``), and its sort key. Used for new offers, bulk offers (with keys reserved
        by ``next_sort_keys``) and messages migrated from ``.DQ``."""
        if sort_key is None:
            sort_key = next_sort_key()
        return self._with_redis_id(message, sort_key + message.message_id), sort_key

    @staticmethod
    def _with_redis_id(message: Message[Any], redis_message_id: str) -> Message[Any]:
        options = {**message.options, "redis_message_id": redis_message_id}
        options.pop("eta", None)
        if _MESSAGE_FIELDS != _KNOWN_MESSAGE_FIELDS:  # a newer Message: let dataclasses copy every field
            return dataclasses.replace(message, queue_name=q_name(message.queue_name), options=options)
        # A third cheaper than dataclasses.replace, which matters for enqueue_many.
        return Message(
            queue_name=q_name(message.queue_name),
            actor_name=message.actor_name,
            args=message.args,
            kwargs=message.kwargs,
            options=options,
            message_id=message.message_id,
            message_timestamp=message.message_timestamp,
        )

    def _hooked(self, signal: str) -> bool:
        """Whether any middleware implements ``signal`` (else emitting it is a no-op): only
        the base class's own no-op method, looked up as ``emit_before`` does, counts as none."""
        base = getattr(Middleware, signal)
        return any(getattr(getattr(m, signal), "__func__", None) is not base for m in self.middleware)

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        """Enqueue a message, now or after ``delay`` milliseconds.

        A delayed message is offered to the queue's delayed queue (one atomic script);
        its due time is the server's clock plus ``delay``. ``delay=0`` is immediate.

        Parameters:
          message: The message to enqueue.
          delay: The minimum time, in milliseconds, to delay the message by.

        An immediate message is pushed once: sending the same message again while it is
        queued, in flight or within ``dedupe_window`` ms of its first send (a retry after
        a lost reply) pushes nothing and returns it as enqueued.

        A fractional delay is rounded up; a negative one means already due: the message
        is enqueued now (see :func:`validate_delay`).

        Dedupe keys (message options, e.g. ``actor.send_with_options(delay=…,
        dedupe_key="reindex:42")``), per queue, one atomic step on the server clock:

        - ``dedupe="keep"`` (the default): while a message with the same ``dedupe_key``
          is scheduled, nothing is written and that message is returned (its
          ``message_id`` can cancel it);
        - ``dedupe="replace"`` (debounce): the scheduled message is cancelled and this one
          scheduled in its place, due ``delay`` from now;
        - ``dedupe_ttl=ms`` (throttle): after the message moved to the ready queue, its
          key stays taken for that long: sends meanwhile write nothing and return the
          message that moved.

        A retry (``Retries``) of a keyed message holds its key like the original; it is
        dropped when another message holds the key. See
        :meth:`DelayedQueue.get_by_key <dramatiq_redisson.DelayedQueue.get_by_key>`.

        Returns:
          The message as enqueued, or the message holding its dedupe key.

        Raises:
          TypeError: If ``delay`` is not a number of milliseconds or a timedelta.
          ValueError: If ``delay`` is NaN, infinite or over ten years; dedupe options
            that are invalid or come without a delay (see :func:`dedupe_options`).
          ServerMemoryFull: The server is at its ``maxmemory`` limit; nothing was written.
          EnqueueNotReplicated: With ``wait_for_replicas``: written on the primary, but
            too few replicas acknowledged it within ``wait_timeout``.
          redis.RedisError: Any other error of the client (a connection error: the
            message may or may not have been enqueued; sending it again is safe).
        """
        in_flight = ""  # the redis id of the copy being processed, for a retry
        if isinstance(message, MessageProxy):
            delay_ms = self._redelivery_delay(message, delay)
            in_flight = str(message.options.get("redis_message_id") or "")
            dedupe = self._retry_dedupe(message, delay_ms)
        else:
            delay_ms = validate_delay(delay)
            dedupe = dedupe_options(message.options, delay_ms)
        message, sort_key = self._prepare(message, delay_ms)
        keys = self.keys(message.queue_name)
        self.logger.debug(
            "Enqueueing message %r on queue %r (delay %r ms).", message.message_id, keys.queue_name, delay_ms
        )
        estimate = _eta_estimate(delay_ms)
        self.check_server_if_reachable()
        self._emit_before_enqueue(message, delay, estimate)
        due: int | Message[Any] | None = None
        try:
            if in_flight:
                due = self._redeliver(keys, message, sort_key, delay_ms, in_flight, dedupe)
            else:
                due = self._send(keys, message, sort_key, delay_ms, dedupe=dedupe)
        except redis.exceptions.OutOfMemoryError as e:
            if not in_flight:
                raise self._memory_full(e, enqueued=[], failed=[message], unknown=[]) from e
            # A retry refused by a full server would be lost once the worker acks the
            # message: let it take the place of the copy being processed instead.
            try:
                due = self._send(keys, message, sort_key, delay_ms, replacing=in_flight, dedupe=dedupe)
            except redis.exceptions.OutOfMemoryError as again:
                raise self._memory_full(again, enqueued=[], failed=[message], unknown=[]) from again
            self.logger.warning(
                "Server full: the retry of message %r took the place of its copy in flight on queue %r.",
                message.message_id,
                keys.queue_name,
            )
        except redis.ResponseError as e:
            if is_permission_error(e):
                self._explain_permissions(keys, e)
            raise
        except NotReplicated as e:
            self._register_queue(keys)
            raise self._not_replicated(e, enqueued=[message], failed=[], unknown=[]) from e
        self._register_queue(keys)
        if isinstance(due, Message):
            # Kept out by its dedupe key: nothing was written; the message holding the key.
            self.logger.debug(
                "Message %r not scheduled on queue %r: dedupe key %r is held by message %r.",
                message.message_id,
                keys.queue_name,
                message.options.get("dedupe_key"),
                due.message_id,
            )
            return due
        if estimate is not None:
            # The due time the offer stored (server clock), as the built-in broker's eta.
            message.options["eta"] = due if due is not None else estimate
        self.emit_after("enqueue", message, delay)
        return message

    @staticmethod
    def _not_replicated(
        error: NotReplicated,
        *,
        enqueued: list[Message[Any]],
        failed: list[Message[Any]],
        unknown: list[Message[Any]],
    ) -> EnqueueNotReplicated:
        lost = f"; {len(failed)} not enqueued and {len(unknown)} unknown" if failed or unknown else ""
        return EnqueueNotReplicated(
            f"{len(enqueued)} message(s) enqueued{lost}: {error}",
            enqueued=enqueued,
            failed=failed,
            unknown=unknown,
            replicas=error.replicas,
            wanted=error.wanted,
            timeout_ms=error.timeout_ms,
        )

    def _emit_before_enqueue(self, message: Message[Any], delay: Any, eta: int | None) -> None:
        """Emit the ``before_enqueue`` hook on a delayed message with an ``eta`` option, as
        the built-in broker hands it (now + delay; after the send, the stored due time).
        The option is taken off again before the message is encoded: the stored and
        transferred copies carry none (a Worker would delay them again)."""
        if eta is None:
            self.emit_before("enqueue", message, delay)
            return
        message.options["eta"] = eta
        try:
            self.emit_before("enqueue", message, delay)
        finally:
            message.options.pop("eta", None)

    def _retry_dedupe(self, message: MessageProxy, delay_ms: int | None) -> tuple[str, str, int] | None:
        """The dedupe key of a retry (a message being processed, re-enqueued): it holds
        the key like the original (mode "retry", see offer.lua). Never raises (that would
        lose the message): a retry without a delay, or with options another producer set
        wrongly, goes without its key."""
        if not delay_ms:
            return None
        try:
            found = dedupe_options(message.options, delay_ms)
        except ValueError as e:
            self.logger.warning("Retry of message %r is scheduled without its dedupe key: %s", message.message_id, e)
            return None
        return None if found is None else (found[0], "retry", found[2])

    def _redeliver(
        self,
        keys: QueueKeys,
        message: Message[Any],
        sort_key: str,
        delay_ms: int | None,
        in_flight: str,
        dedupe: tuple[str, str, int] | None = None,
    ) -> int | Message[Any] | None:
        """Re-enqueue a message being processed, retrying through a lost connection, a
        restarting or loading server, for up to :data:`REDELIVERY_RETRY_TIME`.

        The worker acks the copy in flight right after this returns, so a retry that
        raised here would be lost (Dramatiq logs the middleware's error and acks). Sending
        the same prepared message again is safe: an offer of the same member schedules it
        once, and an immediate copy is pushed once (enqueue.lua). If the server stays away,
        the copy in flight is released instead: the consumer does not ack it, and requeues
        it from its ack set once the server is back. Returns what :meth:`_send` returns."""
        deadline = time.monotonic() + REDELIVERY_RETRY_TIME / 1000
        attempts = 0
        while True:
            try:
                due = self._send(keys, message, sort_key, delay_ms, dedupe=dedupe)
                if isinstance(due, Message):
                    self.logger.info(
                        "Retry of message %r dropped: its dedupe key %r is held by scheduled message %r.",
                        message.message_id,
                        dedupe[0] if dedupe else None,
                        due.message_id,
                    )
                if attempts:
                    self.logger.info("Re-enqueued message %r after %d attempts.", message.message_id, attempts + 1)
                return due
            except (redis.ConnectionError, redis.TimeoutError, NotReplicated) as e:
                # BusyLoadingError, MasterNotFoundError (a Sentinel failover) are
                # ConnectionErrors. NotReplicated: the retry is on the primary but too few
                # replicas have it; sending it again is safe, and acking the copy in
                # flight before a replica has the retry could lose both in a failover.
                if time.monotonic() >= deadline:
                    self.held.release(keys.queue_name, in_flight)
                    self.logger.error(
                        "Could not re-enqueue message %r on queue %r (%s); its copy in flight will be requeued "
                        "instead of acked.",
                        message.message_id,
                        keys.queue_name,
                        e,
                    )
                    raise
                if not attempts:
                    self.logger.warning(
                        "Re-enqueueing message %r on queue %r failed (%s); retrying.",
                        message.message_id,
                        keys.queue_name,
                        e,
                    )
                attempts, backoff_ms = compute_backoff(attempts, factor=100, max_backoff=MAX_REDELIVERY_BACKOFF)
                time.sleep(min(backoff_ms / 1000, max(0.0, deadline - time.monotonic())))

    def _explain_permissions(self, keys: QueueKeys, error: redis.ResponseError) -> None:
        """A send was refused by ACL: raise one :class:`MissingPermission` naming everything
        the user lacks (returns when the probe finds nothing missing)."""
        try:
            check_permissions(
                self.client,
                keys,
                worker_id=self.broker_id,
                subscribe=False,
                wait_for_replicas=bool(self.wait_for_replicas),
                server_version=self.server_version,
            )
        except MissingPermission as missing:
            raise missing from error
        except redis.RedisError:
            pass

    def _register_queue(self, keys: QueueKeys) -> None:
        """List a queue this process sends to in the namespace's queue registry, once per
        process (consumers' heartbeats list theirs), so that operators' tools and metrics
        see queues nobody consumes yet: their overdue messages are the ones to alert on."""
        if keys.queue_name in self._registered:
            return
        self._registered.add(keys.queue_name)
        try:
            self.client.sadd(keys.registry, keys.queue_name)
        except redis.RedisError as e:
            self.logger.debug("Could not list queue %r in %r: %s", keys.queue_name, keys.registry, e)

    def _send(
        self,
        keys: QueueKeys,
        message: Message[Any],
        sort_key: str,
        delay_ms: int | None,
        replacing: str = "",
        dedupe: tuple[str, str, int] | None = None,
    ) -> int | Message[Any] | None:
        """One prepared message: offered when delayed (with its ``dedupe`` key, mode and
        ttl), else pushed (unless already there). Returns the due time the offer stored
        (epoch ms, server clock), ``None`` (immediate, or a message that had already come
        due and moved), or the message holding its dedupe key (nothing was written)."""
        if delay_ms:
            data = encode_scheduled(message, sort_key)
            entry = (delay_ms, sort_key, message.message_id, data, "", *(dedupe or ("", "", 0)))
            (due,) = self.redisson_scripts.offer(keys, [entry], replacing=replacing)
            if isinstance(due, list):
                return _kept_message(due)
            return int(due) if int(due) >= 0 else None
        redis_id = message.options["redis_message_id"]
        _, pushed = self.redisson_scripts.enqueue(
            keys, [(redis_id, message.encode())], self.dedupe_window, replacing=replacing
        )
        if not pushed:
            self._log_duplicates(keys.queue_name, [redis_id])
        return None

    def _log_duplicates(self, queue_name: str, redis_ids: list[str]) -> None:
        self.logger.info(
            "Not enqueued again on queue %r, already there (queued, in flight or sent within the last %d ms): %s",
            queue_name,
            self.dedupe_window,
            ", ".join(redis_ids),
        )

    def _memory_full(
        self,
        error: redis.exceptions.OutOfMemoryError,
        *,
        enqueued: list[Message[Any]],
        failed: list[Message[Any]],
        unknown: list[Message[Any]],
    ) -> ServerMemoryFull:
        """The error for a server that refused a write at its memory limit."""
        queue_names = sorted({m.queue_name for m in failed})
        maxmemory = used = None
        policy = "?"
        try:
            info = self.client.info("memory")
            maxmemory, used = int(info["maxmemory"]), int(info["used_memory"])
            policy = str(info.get("maxmemory_policy", "?"))
        except Exception:  # INFO may be refused (ACL) or the connection gone: the message says less
            pass
        usage = (
            f"used memory {used} B is over maxmemory {maxmemory} B (maxmemory-policy {policy})"
            if maxmemory is not None
            else "used memory is over maxmemory"
        )
        text = (
            f"Redis refused to enqueue {len(failed)} message(s) on queue(s) {', '.join(map(repr, queue_names))}: "
            f"the server is full ({usage}); nothing of the refused message(s) was written. "
            f"Free memory (let workers drain the queues) or raise maxmemory. Server said: {error}"
        )
        return ServerMemoryFull(
            text,
            enqueued=enqueued,
            failed=failed,
            unknown=unknown,
            queue_names=queue_names,
            maxmemory=maxmemory,
            used_memory=used,
        )

    def _redelivery_delay(self, message: MessageProxy, delay: Any) -> int | None:
        """The delay for re-enqueueing a message that is being processed (Retries does
        this, with ``Retry(delay=…)`` from user code).

        Raising here would lose the message: the middleware logs the error and the
        worker acks it. So a delay that cannot be honoured at all marks the message
        failed, so it ends in the dead letters, and then raises.
        """
        try:
            return validate_delay(delay)
        except (TypeError, ValueError):
            self.logger.error(
                "Cannot re-enqueue message %r with delay %r; moving it to the dead letters.", message.message_id, delay
            )
            message.fail()
            raise

    def enqueue_many(self, messages: Iterable[Message[Any]], *, delay: int | None = None) -> list[Message[Any]]:
        """Enqueue many messages with one delay, pipelined in chunks of :data:`BULK_CHUNK_SIZE`.

        Each chunk is one atomic script call per queue; the ``enqueue`` middleware
        hooks run for every message as with :meth:`enqueue`. The messages of one
        call share a delay but not a due time: each chunk reads the server clock.

        Calls answered NOSCRIPT (the script cache was flushed meanwhile: they did not
        run) are sent again. Immediate messages already enqueued are skipped as in
        :meth:`enqueue`, so sending a batch again after an error enqueues each message
        once.

        Raises:
          TypeError, ValueError: As :meth:`enqueue`, before anything is written.
          ServerMemoryFull: The server refused a call at its ``maxmemory`` limit (an
            :class:`EnqueueError`: its lists say what was written).
          EnqueueNotReplicated: With ``wait_for_replicas``: every message was written on
            the primary (``enqueued``), but too few replicas acknowledged them in time.
          EnqueueError: Any other failure: ``enqueued``, ``failed`` and ``unknown``
            (sent, reply lost) partition the prepared messages; the error is the cause.
        """
        delay_ms = validate_delay(delay)
        messages = list(messages)
        dedupes = [dedupe_options(m.options, delay_ms) for m in messages]
        if delay_ms:
            sort_keys = next_sort_keys(len(messages))
            prepared = [self.prepare_scheduled(m, key)[0] for m, key in zip(messages, sort_keys, strict=True)]
        else:
            sort_keys = [""] * len(messages)
            prepared = [self._prepare(m, None)[0] for m in messages]
        estimate = _eta_estimate(delay_ms)
        self.check_server_if_reachable()
        if self._hooked("before_enqueue"):
            for message in prepared:
                self._emit_before_enqueue(message, delay, estimate)
        by_queue: dict[str, list[int]] = defaultdict(list)
        for index, message in enumerate(prepared):
            by_queue[message.queue_name].append(index)
        # Encode everything before the first write: an argument that cannot be
        # encoded is bad input, and bad input writes nothing.
        scheduled: list[tuple[QueueKeys, list[Any]]] = []
        ready: list[tuple[QueueKeys, list[tuple[str, bytes]]]] = []
        chunks: list[list[int]] = []  # per script call, the indexes of its messages
        keyed_chunks: set[int] = set()  # calls in offer.lua's "rel" mode: per-entry replies
        for queue_name, indexes in by_queue.items():
            keys = self.keys(queue_name)
            for start in range(0, len(indexes), BULK_CHUNK_SIZE):
                chunk = indexes[start : start + BULK_CHUNK_SIZE]
                chunks.append(chunk)
                if delay_ms and any(dedupes[i] for i in chunk):
                    # Messages with dedupe keys: one entry each, in order (a later entry
                    # with the same key finds the earlier one scheduled).
                    keyed_chunks.add(len(chunks) - 1)
                    args: list[Any] = ["rel"]
                    for i in chunk:
                        data = encode_scheduled(prepared[i], sort_keys[i])
                        args.extend((delay_ms, sort_keys[i], prepared[i].message_id, data, ""))
                        args.extend(dedupes[i] or ("", "", 0))
                    scheduled.append((keys, args))
                elif delay_ms:
                    entries: list[Any] = ["bulk", delay_ms]  # flat: fewer objects for the garbage collector
                    for i in chunk:
                        entries.append(prepared[i].message_id)
                        entries.append(sort_keys[i].encode() + encode_scheduled(prepared[i], sort_keys[i]))
                    scheduled.append((keys, entries))
                else:
                    ready.append(
                        (keys, [(prepared[i].options["redis_message_id"], _encode(prepared[i])) for i in chunk])
                    )
        if scheduled:
            outcomes = self.redisson_scripts.offer_calls(scheduled)
        elif ready:
            outcomes = self.redisson_scripts.enqueue_bulk(ready, self.dedupe_window)
        else:
            outcomes = []
        for queue_name in by_queue:
            self._register_queue(self.keys(queue_name))
        enqueued: list[int] = []
        failed: list[int] = []
        unknown: list[int] = []
        errors: list[Exception] = []
        kept: dict[int, Message[Any]] = {}  # kept out by their dedupe key: who holds it
        for n, (chunk, outcome) in enumerate(zip(chunks, outcomes, strict=True)):
            if isinstance(outcome, Unanswered):
                (unknown if outcome.sent else failed).extend(chunk)
                errors.append(outcome.error)
            elif isinstance(outcome, Exception):
                failed.extend(chunk)
                errors.append(outcome)
            elif n in keyed_chunks:
                for i, result in zip(chunk, outcome, strict=True):
                    if isinstance(result, list):
                        kept[i] = _kept_message(result)
                    else:
                        enqueued.append(i)
                        if int(result) >= 0:
                            prepared[i].options["eta"] = int(result)
            else:
                enqueued.extend(chunk)
                if not delay_ms and int(outcome[1]) < len(chunk):
                    self.logger.info(
                        "%d of %d messages were not enqueued again on queue %r, already there "
                        "(queued, in flight or sent within the last %d ms).",
                        len(chunk) - int(outcome[1]),
                        len(chunk),
                        prepared[chunk[0]].queue_name,
                        self.dedupe_window,
                    )
        enqueued.sort()
        if estimate is not None:
            # Each message's eta: the due time its call stored, else (not known to be
            # scheduled) the estimate.
            for message in prepared:
                message.options.setdefault("eta", estimate)
            for n, (chunk, outcome) in enumerate(zip(chunks, outcomes, strict=True)):
                if isinstance(outcome, list) and n not in keyed_chunks and int(outcome[1]) >= 0:
                    for i in chunk:
                        prepared[i].options["eta"] = int(outcome[1])
        if self._hooked("after_enqueue"):
            for i in enqueued:
                self.emit_after("enqueue", prepared[i], delay)
        for i, holder in kept.items():
            prepared[i] = holder
        if errors:
            raise self._enqueue_error(prepared, errors, enqueued, sorted(failed), sorted(unknown))
        replicas = outcomes.replicas if isinstance(outcomes, Outcomes) else None
        if self.wait_for_replicas and outcomes and (replicas is None or replicas < self.wait_for_replicas):
            error = NotReplicated.describe(
                f"Enqueueing {len(prepared)} message(s)", replicas, self.wait_for_replicas, self.wait_timeout
            )
            raise self._not_replicated(error, enqueued=[prepared[i] for i in enqueued], failed=[], unknown=[])
        return prepared

    def _enqueue_error(
        self,
        prepared: list[Message[Any]],
        errors: list[Exception],
        enqueued: list[int],
        failed: list[int],
        unknown: list[int],
    ) -> EnqueueError:
        lists = {
            "enqueued": [prepared[i] for i in enqueued],
            "failed": [prepared[i] for i in failed],
            "unknown": [prepared[i] for i in unknown],
        }
        oom = next((e for e in errors if isinstance(e, redis.exceptions.OutOfMemoryError)), None)
        error: EnqueueError
        if oom is not None:
            error = self._memory_full(oom, **lists)
            error.__cause__ = oom
            return error
        error = EnqueueError(
            f"{len(failed)} of {len(prepared)} messages were not enqueued and {len(unknown)} may or may not "
            f"have been ({len(enqueued)} were): {type(errors[0]).__name__}: {errors[0]}",
            **lists,
        )
        error.__cause__ = errors[0]
        return error

    def delayed_queue(self, queue_name: str) -> DelayedQueue:
        """A handle on the scheduled messages of ``queue_name`` (Redisson's ``RDelayedQueue``)."""
        return DelayedQueue(self, self.keys(queue_name))

    def dead_letters(self, queue_name: str) -> DeadLetters:
        """A handle on the dead letters of ``queue_name`` (the built-in ``.XQ`` layout)."""
        return DeadLetters(self, self.keys(queue_name))

    def known_queues(self) -> list[str]:
        """The queues this broker declared and those that have had consumers anywhere in
        its namespace (each consumer's heartbeat lists its queue), sorted."""
        listed = cast("set[bytes]", self.client.smembers(registry_key(self.namespace)))
        names = {name.decode() for name in listed}
        names.update(q for q in self.queues if not q.endswith((".DQ", ".XQ")))
        return sorted(names)

    def stats(self, queue_name: str | None = None, *, overdue_grace: int = OVERDUE_GRACE) -> Stats:
        """Counts of one queue, or of every known queue (:meth:`known_queues`): ready, in
        flight, scheduled, overdue (due more than ``overdue_grace`` ms ago and not yet
        moved), next due time, dead, live consumers and the transfer lease holder; plus
        the namespace's live workers. Each queue's counts are one atomic read on the
        server clock, O(log n); all queues go in one round trip.

        Raises:
          ValueError: A negative ``overdue_grace``.
        """
        if isinstance(overdue_grace, bool) or not isinstance(overdue_grace, int) or overdue_grace < 0:
            raise ValueError(f"overdue_grace must be a non-negative int of ms, got {overdue_grace!r}")
        known = self.known_queues() if queue_name is None or self.cluster else []
        names = [q_name(queue_name)] if queue_name is not None else known
        live_ms = 3 * self.transfer_lease
        if self.cluster:
            # One call per queue, each on the node of its slot; heartbeats are per queue,
            # so live workers are counted over every known queue's set.
            replies = [self.redisson_scripts.stats(self.keys(name), overdue_grace, live_ms) for name in names]
            now_ms = self._server_ms()
            with self.client.pipeline(transaction=False) as pipe:
                for name in known:
                    pipe.zrangebyscore(self.keys(name).heartbeats, now_ms - self.heartbeat_timeout, "+inf")
                beats = cast("list[list[bytes]]", pipe.execute())
            workers = len(set().union(*beats))
        else:
            with self.client.pipeline(transaction=False) as pipe:
                for name in names:
                    self.redisson_scripts.stats(self.keys(name), overdue_grace, live_ms, client=pipe)
                pipe.time()
                replies = pipe.execute()
            now_ms = _epoch_ms(replies.pop())
            workers = int(self.client.zcount(heartbeats_key(self.namespace), now_ms - self.heartbeat_timeout, "+inf"))
        queues: dict[str, QueueStats] = {}
        for name, reply in zip(names, replies, strict=True):
            _, ready, with_data, scheduled, overdue, next_due, dead, holder, consumers, legacy = reply
            queues[name] = QueueStats(
                ready=int(ready),
                in_flight=max(0, int(with_data) - int(ready)),
                scheduled=int(scheduled),
                overdue=int(overdue),
                next_due_ms=None if int(next_due) < 0 else int(next_due),
                dead=int(dead),
                consumers=int(consumers),
                transfer_holder=holder.decode() or None,
                legacy_delayed=int(legacy),
            )
        return Stats(time_ms=now_ms, workers=workers, queues=queues)

    def _server_ms(self) -> int:
        """The server's clock (on a cluster, any node's), epoch ms."""
        return _epoch_ms(cast("tuple[int, int]", self.client.time()))

    def flush(self, queue_name: str) -> None:
        """Drop all messages of a queue: ready, scheduled, dead-lettered and legacy ``.DQ``;
        the queue leaves the namespace's queue registry (its next send or consumer lists
        it again)."""
        keys = self.keys(queue_name)
        self._registered.discard(keys.queue_name)
        # One UNLINK drops every key of the queue at once; the registry (on a cluster in
        # another slot) goes first, by a command of its own. No MULTI: on a full server
        # Redis before 7.4 and Valkey 7.2 refuse commands queued in one, and a flush is
        # how memory is freed.
        self.client.srem(keys.registry, keys.queue_name)
        self.client.unlink(
            keys.ready,
            keys.ready_msgs,
            keys.acks(self.broker_id),
            keys.xq,
            keys.xq_msgs,
            keys.legacy_dq,
            keys.legacy_dq_msgs,
            keys.legacy_dq_acks(self.broker_id),
            keys.sent,
            *keys.scheduled_keys,
            keys.holds,
            keys.held,
        )

    def flush_all(self) -> None:
        """Drop all messages from all declared queues."""
        for queue_name in self.queues:
            self.flush(queue_name)

    def pending(self, queue_name: str) -> int:
        """Messages of a queue not yet processed: scheduled, ready, in flight, legacy ``.DQ``."""
        return self.redisson_scripts.pending(self.keys(queue_name))

    def join(self, queue_name: str, *, interval: int = 100, timeout: int | None = None) -> None:
        """Wait until every message of a queue, scheduled ones included, has been processed.

        Meant for tests, like the built-in broker's ``join``.

        Raises:
          QueueJoinTimeout: When ``timeout`` (ms) elapses.
        """
        deadline = None if timeout is None else time.monotonic() + timeout / 1000
        while self.pending(queue_name):
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(interval / 1000)
