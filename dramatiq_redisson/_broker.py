"""RedissonBroker: Dramatiq's Redis broker with delays on Redisson's delayed-queue scheme."""

from __future__ import annotations

import functools
import inspect
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import redis
from dramatiq.actor import Actor
from dramatiq.broker import Consumer
from dramatiq.brokers.redis import DEFAULT_DEAD_MESSAGE_TTL, DEFAULT_HEARTBEAT_TIMEOUT, RedisBroker
from dramatiq.common import q_name
from dramatiq.errors import QueueJoinTimeout
from dramatiq.message import Message
from dramatiq.middleware import Middleware
from redis.cluster import RedisCluster

from ._held import HeldMessages
from ._keys import QueueKeys
from ._liveness import Liveness
from ._logs import logger_for
from ._message import prepare_scheduled
from ._producer import Producer
from ._progress import add_long_jobs
from ._settings import (
    DEFAULT_DEDUPE_WINDOW,
    DEFAULT_DONE_RETENTION,
    DEFAULT_LIVENESS_TIMEOUT,
    DEFAULT_MAINTENANCE_INTERVAL,
    DEFAULT_SAFETY_INTERVAL,
    DEFAULT_TRANSFER_BATCH_SIZE,
    DEFAULT_TRANSFER_LEASE,
    DEFAULT_UNKNOWN_ACTOR_GRACE,
    DEFAULT_WAIT_TIMEOUT,
    DEFAULT_WORKFLOW_RETENTION,
    SETTING_DOCS,
    BrokerSettings,
    checked_settings,
)
from ._start_gate import StartGate
from ._tuning import HEARTBEAT_INTERVAL_MS
from ._worker_threads import WorkerRegistry
from .admin._dead_letters import DeadLetters
from .admin._delayed_queue import DelayedQueue
from .admin._history import History
from .admin._message_state import message_state as _message_state
from .admin._queue_admin import QueueAdmin
from .admin._running import RunningMessage
from .admin._stats import OVERDUE_GRACE, Stats, WaitingLane
from .connection._client import argument_problems, connect
from .connection._permissions import acl_rule
from .connection._primary_watch import PrimaryWatch
from .connection._server import check_server
from .connection._topology import topology_for
from .flow._lanes import FLOW_OPTIONS, flow_option_problems
from .flow._queue_limits import Limits
from .periodic._schedules import Schedules
from .scripts._calls import IdleScore, Scripts
from .sharding._shards import ShardRouter, shard_pairs
from .sharding._views import ShardedDeadLetters, ShardedDelayedQueue
from .workflows._middleware import add_workflow_steps
from .workflows._store import Workflows


def _setting(name: str, *, settable: bool = True) -> Any:
    """A broker attribute backed by its :class:`BrokerSettings`, documented by its
    :data:`SETTING_DOCS` entry (the API reference shows it): assigning it checks the value
    as the constructor does. ``settable=False``: fixed once the broker is built (its
    scripts' runner took it)."""

    def get(broker: RedissonBroker) -> Any:
        return getattr(broker._settings, name)

    def set_(broker: RedissonBroker, value: Any) -> None:
        broker._settings = broker._settings.replace(**{name: value})

    # The reference shows the setting's type (the field's annotation) rather than Any.
    get.__annotations__["return"] = BrokerSettings.__annotations__[name]
    doc = SETTING_DOCS[name]
    if settable:
        doc += " Assigning it checks the new value as the constructor does (ValueError, the old value kept)."
    else:
        doc += " Read-only: fixed once the broker is built."
    return property(get, set_ if settable else None, doc=doc)


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
      client: A redis client to use.
      heartbeat_timeout: Time (ms) without a heartbeat after which a worker is dead and
        its unacked messages are requeued; default 60000.
      dead_message_ttl: Time (ms) a dead letter is kept; default 604800000 (seven days).
      transfer_batch_size: Most due messages (a count) one transfer call moves; default 100.
      safety_interval: Longest time (ms) between two transfers of a queue; default 5000.
      maintenance_interval: Time (ms) between two maintenance runs; default 30000.
      dedupe_window: Time (ms) a sent immediate message is remembered; default 120000.
      transfer_lease: Time (ms) a queue's transfer lease lasts; default 2000.
      wait_for_replicas: Replicas (a count) each write waits for; default 0, none.
      wait_timeout: Longest wait (ms) for those replicas, per write; default 1000.
      liveness_timeout: Time (ms) without a liveness beat after which a worker process is
        dead and its unacked messages run elsewhere; default 6000, 0 turns it off (see
        :mod:`dramatiq_redisson._liveness`).
      cluster: Connect to a Redis/Valkey Cluster: ``url`` (or the ``host``/``port``
        parameters) names one of its nodes and a :class:`redis.cluster.RedisCluster`
        client is made. A ``RedisCluster`` passed as ``client`` implies it. Keys then
        follow the cluster layout, where every key of a queue hashes to one slot
        (see :mod:`dramatiq_redisson._keys`), and announcements use sharded pub/sub.
      max_priority: The highest ``broker_priority`` a message may have, an int up to 255
        (higher runs first; a higher value counts as it); default None or 0: priorities
        are ignored (see :mod:`dramatiq_redisson.flow._lanes`).
      shards: ``{queue name: shard count}``: spread each named queue over that many hash
        slots of a cluster (see :mod:`dramatiq_redisson.sharding._shards`); on one server it works
        but gains nothing, and the broker logs a warning saying so.
      workflow_retention: Time (ms) a finished workflow is kept; default 86400000 (a day).
      unknown_actor_grace: Time (ms) a message for an actor its worker has not declared waits
        for one that has, then is dead-lettered; default 600000 (10 min), 0: at once.
      done_retention: Time (ms) a done record is kept (:meth:`message_state`); default 0, none.
      **parameters: Connection parameters passed to :class:`redis.Redis` (or to
        :class:`redis.cluster.RedisCluster`). A name neither the broker nor redis-py
        takes is refused with the settings, with the closest known name ("unknown
        argument transfer_batch_szie: did you mean transfer_batch_size?"); so are ``url``
        with ``client`` and connection parameters with ``client`` (the client passed in
        would be used as it is, the others ignored), and a bad value of a timeout,
        interval, count, switch, ``db``, ``port`` or ``retry`` (``socket_timeout="abc"``).

    Each setting is described by the attribute of its name below. Settings and connection
    parameters are checked before anything is made: one ValueError names every bad value.

    ``cluster=True`` against a server without cluster mode raises a ValueError that says
    so. Actor options this broker adds (``broker_priority``, ``group_key``) are checked
    when the actor is declared (see :meth:`declare_actor`).

    One message id is enqueued at most once per queue: an immediate message is pushed
    under its message id as redis message id and is not pushed again while it is
    queued, in flight or within ``dedupe_window`` of its first send (a message being
    processed, re-enqueued by ``Retries``, gets a fresh redis id); a delayed message
    id is scheduled at most once (offering it again reschedules it).
    """

    # The settings, read from the checked ones; assigning one checks it (see _settings).
    heartbeat_timeout = _setting("heartbeat_timeout")
    dead_message_ttl = _setting("dead_message_ttl")
    transfer_batch_size = _setting("transfer_batch_size")
    safety_interval = _setting("safety_interval")
    maintenance_interval = _setting("maintenance_interval")
    dedupe_window = _setting("dedupe_window")
    transfer_lease = _setting("transfer_lease")
    wait_for_replicas = _setting("wait_for_replicas", settable=False)
    wait_timeout = _setting("wait_timeout", settable=False)
    workflow_retention = _setting("workflow_retention")
    unknown_actor_grace = _setting("unknown_actor_grace")
    done_retention = _setting("done_retention")

    @property
    def settings(self) -> BrokerSettings:
        """The broker's settings, as checked (and ``dedupe_window`` as widened)."""
        return self._settings

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
        liveness_timeout: int = DEFAULT_LIVENESS_TIMEOUT,
        max_priority: int | None = None,
        shards: Mapping[str, int] | None = None,
        workflow_retention: int = DEFAULT_WORKFLOW_RETENTION,
        unknown_actor_grace: int = DEFAULT_UNKNOWN_ACTOR_GRACE,
        done_retention: int = DEFAULT_DONE_RETENTION,
        **parameters: Any,
    ) -> None:
        # Checked before anything is made: a bad value, an unknown name or url= with
        # client= makes no client, and one ValueError names them all (see _settings).
        cluster = cluster or isinstance(client, RedisCluster)
        self._settings = checked_settings(
            argument_problems(parameters, _OWN_ARGUMENTS, url=url, client=client, cluster=cluster),
            heartbeat_timeout=heartbeat_timeout,
            dead_message_ttl=dead_message_ttl,
            transfer_batch_size=transfer_batch_size,
            safety_interval=safety_interval,
            maintenance_interval=maintenance_interval,
            dedupe_window=dedupe_window,
            transfer_lease=transfer_lease,
            wait_for_replicas=wait_for_replicas,
            wait_timeout=wait_timeout,
            liveness_timeout=liveness_timeout,
            max_priority=0 if max_priority is None else max_priority,
            shards=shard_pairs(shards),
            workflow_retention=workflow_retention,
            unknown_actor_grace=unknown_actor_grace,
            done_retention=done_retention,
        )
        owns_client = client is None
        client, parameters = connect(url, client, cluster, namespace, parameters)
        super().__init__(
            middleware=middleware,
            namespace=namespace,
            maintenance_chance=maintenance_chance,
            heartbeat_timeout=heartbeat_timeout,
            dead_message_ttl=dead_message_ttl,
            client=client,
            **parameters,
        )
        # Named after the public class, as Dramatiq's loggers are (see _logs).
        self.logger = logger_for(type(self))
        # broker_priority and group_key are actor options too (flow control, see _lanes).
        self.actor_options |= FLOW_OPTIONS
        #: What differs between one server and a cluster (see :mod:`dramatiq_redisson.connection._topology`).
        self.topology = topology_for(self.client)
        _warn_of_shards_on_one_server(self._settings, self.topology, self.logger)
        self._settings, span = _widened_dedupe_window(self._settings, self.topology, self.logger)
        # Build order: the settings (above), the connection (client, topology), the
        # state the parts share, then the parts. Each part takes the broker as the
        # Protocol of what it reads (ProducerHost, LivenessHost, PeriodicHost, AdminHost,
        # and ConsumerHost for the consumers), all of which exists by then.
        #: Where a resent offer finds a member that already came due (offer_one.lua): the
        #: dedupe window's record covers every resend when it spans the client's retries.
        self.resend_lookup = "ready" if not self._settings.dedupe_window else "both" if span is None else "sent"
        #: The longest time (ms) from an offer's first run to the client's last automatic
        #: retry of it (None: unbounded). An offer delayed by more than this (and a margin)
        #: cannot have come due before a resend of it runs, so it skips that lookup.
        self.client_retry_span = span
        self.redisson_scripts = Scripts(
            self.client,
            wait_for_replicas=wait_for_replicas,
            wait_timeout=wait_timeout,
            topology=self.topology,
            beat_interval=min(HEARTBEAT_INTERVAL_MS, self.heartbeat_timeout / 10) / 1000,
        )
        self._owns_client = owns_client
        #: With a Sentinel client: every connection follows a switch (:mod:`.connection._primary_watch`).
        self.primary_watch = PrimaryWatch(self.client)
        #: The servers' names and versions once :meth:`check_server` has run (None: not yet).
        self.server_versions: dict[str, tuple[str, tuple[int, int, int]]] | None = None
        #: Fetched ids this process's consumers still hold (see :mod:`._held`).
        self.held = HeldMessages()
        #: This process's Workers: how many threads each has free (see :mod:`._worker_threads`).
        self.workers = WorkerRegistry()
        #: A consumer's checks before its first subscription: server, permissions (see :mod:`._start_gate`).
        self.start_gate = StartGate(self)
        #: Called as ``listener(queue_name, lateness_ms)`` after each transfer this
        #: process's consumers run that moved messages: for each moved message, how late
        #: it moved (ms after its due time, server clock). Metrics hook in here.
        self.transfer_listeners: list[Callable[[str, list[int]], None]] = []
        #: The periodic actors' schedules (see :mod:`dramatiq_redisson.periodic._schedules`).
        self.schedules = Schedules(self)
        #: This process's liveness beats (see :mod:`._liveness`).
        self.liveness = Liveness(self, self._settings.liveness_timeout)
        #: The shards of the queues named in ``shards`` (see :mod:`dramatiq_redisson.sharding._shards`).
        self.shard_router = ShardRouter(self)
        #: The producer side: enqueue, enqueue_many, a retry's re-enqueue.
        self.producer = self._build_producer()
        #: The read and admin side: counts, history, running now, pause, flush (see
        #: :mod:`dramatiq_redisson.admin._queue_admin`; the broker's methods of those names delegate to it).
        self.admin = QueueAdmin(self)
        #: Concurrency limits per queue and per group (see :mod:`dramatiq_redisson.flow._queue_limits`).
        self.limits = Limits(self)
        #: Chains and groups of messages run as workflows (see :mod:`dramatiq_redisson.workflows`).
        self.workflows = Workflows(self)

    def _build_producer(self) -> Producer:
        """The producer, given what it uses: its sends go where the shard router says (it
        knows nothing of sharding), and it reads the rest of the broker as a
        ``_producer.ProducerHost``."""
        return Producer(
            self,
            scripts=self.redisson_scripts,
            client=self.client,
            held=self.held,
            keys=self.keys,
            route=self.shard_router.target,
            route_many=self.shard_router.targets,
            check_server=self.check_server_if_reachable,
            emit_before=self.emit_before,
            emit_after=self.emit_after,
            worker_id=self.broker_id,
            retry_span=self.client_retry_span,
            resend_lookup=self.resend_lookup,
            logger_name=self.logger.name,
        )

    @property
    def cluster(self) -> bool:
        """Whether the client is a Redis Cluster client (the cluster key layout)."""
        return self.topology.cluster

    def check_server(self) -> dict[str, tuple[str, tuple[int, int, int]]]:
        """Check, once per broker, that the server (every node of a cluster) is one the
        broker runs on: Redis >= 6.2 or Valkey, and >= 7.0 on a cluster (see
        :mod:`dramatiq_redisson.connection._server` for why). Consumers run it when they start and
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
        dramatiq_prometheus = sys.modules.get("dramatiq.middleware.prometheus")
        if dramatiq_prometheus is not None and type(middleware) is dramatiq_prometheus.Prometheus:
            # Only then: the optional metrics module is loaded by who uses it, never by
            # ``import dramatiq_redisson`` (the one import of it outside the CLI).
            from .metrics import adopt_middleware

            middleware = adopt_middleware(middleware)
        super().add_middleware(middleware, before=before, after=after)

    def emit_before(self, signal: str, *args: Any, **kwargs: Any) -> None:
        if signal == "worker_boot" and args:
            self.workers.booted(args[0])  # before its consumers are built
            # A worker moves workflows on and tracks long jobs (added now: the list given stays as given till then).
            add_workflow_steps(self)
            add_long_jobs(self)
        super().emit_before(signal, *args, **kwargs)

    def emit_after(self, signal: str, *args: Any, **kwargs: Any) -> None:
        super().emit_after(signal, *args, **kwargs)
        if signal == "worker_shutdown" and args:
            self.workers.stopped(args[0])

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
        self.liveness.close()
        self.primary_watch.close()
        self.redisson_scripts.close()
        if self._owns_client:
            self.topology.close()

    @property
    def consumer_class(self) -> Any:
        """Builds a queue's consumer (Dramatiq's ``consume()`` calls it): a sharded queue's
        is a :class:`dramatiq_redisson.sharding._consumer.ShardedConsumer` over its shards."""
        from ._consumer import RedissonConsumer
        from .sharding._consumer import ShardedConsumer

        def make(broker: RedissonBroker, queue_name: str, prefetch: int, timeout: int) -> Consumer:
            # Built in the Worker's consumer thread: its Worker's threads, if it has one.
            threads = broker.workers.of_current_thread()
            if broker.shard_router.sharded(queue_name):
                return ShardedConsumer(broker, queue_name, prefetch, timeout, threads=threads)
            return RedissonConsumer(broker, queue_name, prefetch, timeout, threads=threads)

        return make

    def do_ack(self, queue_name: str, redis_message_id: str, idle: IdleScore | None = None) -> int:
        """Ack a message this worker fetched from ``queue_name`` (the consumer's ack goes
        through here, as the built-in consumer's does). Returns 1 if it was held.

        A message whose retry could not be re-enqueued (see ``_redeliver``) is not acked:
        it stays in the ack set, unheld, and the consumer's next reconciliation requeues it.
        ``idle``: the consumer's new score in the idle registry (a thread is free again)."""
        retried, ttl = self.held.was_retried(redis_message_id), self._settings.done_retention
        if self.held.was_released(queue_name, redis_message_id):
            return 0
        slots, keys = self.held.holds_slots(queue_name, redis_message_id), self.keys(queue_name)
        try:
            acked = self.redisson_scripts.ack(
                keys, self.broker_id, redis_message_id, retried=retried, uses_slots=slots, idle=idle, done_retention=ttl
            )
        except BaseException:
            if retried:
                self.held.mark_retried(redis_message_id)  # the consumer tries the ack again
            raise
        self.held.discard(queue_name, (redis_message_id,))
        return acked

    def do_nack(self, queue_name: str, redis_message_id: str, final: bytes | None = None) -> int:
        """Move a message this worker fetched from ``queue_name`` to its dead letters;
        ``final`` (its encoding as it failed, with the traceback Dramatiq recorded) is
        stored in place of the copy fetched. Returns 1 if it was moved.

        A message released meanwhile (a workflow step whose record failed) stays in the
        ack set, unheld: the consumer's next reconciliation requeues it."""
        self.held.was_retried(redis_message_id)  # counted as failed, not retried
        if self.held.was_released(queue_name, redis_message_id):
            return 0
        if final is None:
            final = self.held.failed(redis_message_id)
        uses_slots = self.held.holds_slots(queue_name, redis_message_id)
        nacked = self.redisson_scripts.nack(
            self.keys(queue_name), self.broker_id, redis_message_id, final, uses_slots=uses_slots
        )
        self.held.discard(queue_name, (redis_message_id,))
        return nacked

    def _dispatch(self, command: str) -> Callable[..., Any]:
        """The built-in broker's ``do_<command>`` methods (``do_qsize``, ``do_purge``, ...),
        which run its dispatch script: on a cluster that script reaches keys of several
        slots, so they raise a clear error there instead of the server's."""
        if self.topology.runs_dispatch_script:
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
        return self.topology.keys(self.namespace, q_name(queue_name))

    def declare_actor(self, actor: Actor[Any, Any]) -> None:
        """Declare an actor (Dramatiq's ``Actor`` calls this when it is made), after checking
        the actor options this broker adds (``broker_priority``, ``group_key``: see
        :mod:`dramatiq_redisson.flow._lanes`) with the check every send runs, so that a bad default is refused
        where it is written instead of failing every send. A message's own options are
        checked when it is sent.

        Raises:
          ValueError: An option the sends would refuse, naming the actor, the option and
            its value; the actor is not declared.
        """
        problems = flow_option_problems(actor.options)
        if problems:
            raise ValueError(f"actor {actor.actor_name!r}: {'; '.join(problems)}")
        super().declare_actor(actor)

    def declare_queue(self, queue_name: str) -> None:
        """Declare a queue. Unlike the built-in broker, no ``.DQ`` delay queue is declared:
        the timer in each queue's consumer moves delayed messages. The queue is listed in
        the namespace's queue registry, so every process knows it (one command, once; a
        server that cannot be reached now does not fail the declaration: see
        ``admin._queue_admin.QueueAdmin.list_declared``)."""
        if queue_name not in self.queues:
            self.emit_before("declare_queue", queue_name)
            self.admin.list_declared(queue_name)
            self.queues.add(queue_name)
            self.emit_after("declare_queue", queue_name)

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
        self.primary_watch.start()
        return self.producer.enqueue(message, delay)

    def enqueue_many(self, messages: Iterable[Message[Any]], *, delay: int | None = None) -> list[Message[Any]]:
        """Enqueue many messages with one delay, pipelined in chunks of :data:`._producer.BULK_CHUNK_SIZE`.

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
        self.primary_watch.start()
        return self.producer.enqueue_many(messages, delay)

    def prepare_scheduled(self, message: Message[Any], sort_key: str | None = None) -> tuple[Message[Any], str]:
        """A copy of ``message`` ready to be offered to its delayed queue, and its sort key
        (see :func:`._message.prepare_scheduled`)."""
        return prepare_scheduled(message, sort_key)

    def delayed_queue(self, queue_name: str) -> DelayedQueue:
        """A handle on the scheduled messages of ``queue_name`` (Redisson's ``RDelayedQueue``);
        of a queue with shards, one over all of them (see :mod:`dramatiq_redisson.sharding._views`).
        ValueError if ``queue_name`` is not a known queue (:meth:`QueueAdmin.known`)."""
        name = self.admin.known(queue_name)
        shards = self.shards_of(name)
        if len(shards) == 1:
            return DelayedQueue(self, self.keys(name))
        return ShardedDelayedQueue(
            [DelayedQueue(self, self.keys(shard), queue_name=name) for shard in shards],
            functools.partial(self.shard_router.key_shard, name),
        )

    def dead_letters(self, queue_name: str) -> DeadLetters:
        """A handle on the dead letters of ``queue_name`` (the built-in ``.XQ`` layout); of
        a queue with shards, one over all of them (see :mod:`dramatiq_redisson.sharding._views`).
        ValueError if ``queue_name`` is not a known queue (:meth:`QueueAdmin.known`)."""
        name = self.admin.known(queue_name)
        shards = self.shards_of(name)
        if len(shards) == 1:
            return DeadLetters(self, self.keys(name))
        return ShardedDeadLetters([DeadLetters(self, self.keys(shard), queue_name=name) for shard in shards])

    # -- the read and admin side: thin delegates (see _queue_admin) ---------------------

    def known_queues(self) -> list[str]:
        return self.admin.known_queues()

    def stats(self, queue_name: str | None = None, *, overdue_grace: int = OVERDUE_GRACE) -> Stats:
        return self.admin.stats(queue_name, overdue_grace=overdue_grace)

    def history(self, queue_name: str | None = None, *, minutes: int = 60, hours: int = 24) -> History:
        return self.admin.history(queue_name, minutes=minutes, hours=hours)

    def running(self, queue_name: str | None = None) -> list[RunningMessage]:
        return self.admin.running(queue_name)

    def waiting_groups(self, queue_name: str, *, limit: int = 100) -> list[WaitingLane]:
        return self.admin.waiting_groups(queue_name, limit=limit)

    message_state = _message_state  # the broker is its StateHost: broker.message_state(message_id, queue_name)

    def pause(self, queue_name: str) -> bool:
        return self.admin.pause(queue_name)

    def resume(self, queue_name: str) -> bool:
        return self.admin.resume(queue_name)

    def flush(self, queue_name: str) -> None:
        for internal in self.shards_of(queue_name):  # a sharded queue's shards
            self.producer.forget_queue(internal)  # its next send lists it again
            self.admin.flush(internal)

    def flush_all(self) -> None:
        """Drop all messages from all declared queues."""
        for queue_name in self.queues:
            self.flush(queue_name)

    def shards_of(self, queue_name: str) -> list[str]:
        """The internal queues holding ``queue_name``'s messages: its shards (itself
        first), or itself for a queue without shards."""
        name = q_name(queue_name)
        return self.admin.internal_names([name])[name]

    def pending(self, queue_name: str) -> int:
        """Messages of a queue not yet processed: scheduled, ready, in flight, legacy ``.DQ``."""
        return sum(self.redisson_scripts.pending(self.keys(n)) for n in self.shards_of(queue_name))

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


def _widened_dedupe_window(settings: BrokerSettings, topology: Any, logger: Any) -> tuple[BrokerSettings, int | None]:
    """The settings with ``dedupe_window`` widened to the client's retry span when that is
    longer, and the span (None: unbounded, which is logged: a resend after the window is
    not recognised)."""
    span: int | None = topology.retry_span_ms()
    if span is None:
        logger.warning(
            "Cannot bound how long the redis client retries a command; immediate sends "
            "are deduplicated within dedupe_window=%d ms.",
            settings.dedupe_window,
        )
    elif settings.dedupe_window and span > settings.dedupe_window:
        settings = settings.replace(dedupe_window=span)
    return settings, span


def _warn_of_shards_on_one_server(settings: BrokerSettings, topology: Any, logger: Any) -> None:
    """Shards on one server work but gain nothing (docs/sharding-design.md): say so, once,
    when the broker is built."""
    if not topology.spreads_shards and any(count > 1 for _, count in settings.shards):
        logger.warning(
            "shards=%s on a single server gains nothing: every shard of a queue lives on this "
            "one server, whose throughput and memory bound the queue as without shards, and "
            "the shards cost a few more commands per message. Shards spread a queue over a "
            "Redis Cluster's masters (cluster=True); the queues are sharded as asked.",
            dict(settings.shards),
        )


#: The keyword arguments of ``RedissonBroker`` itself (the others are redis-py's), which an
#: unknown name is matched against for a suggestion.
_OWN_ARGUMENTS = frozenset(inspect.signature(RedissonBroker.__init__).parameters) - {"self", "parameters"}

# The delegates carry their QueueAdmin method's documentation (help(broker.stats)).
for _name in ("known_queues", "stats", "history", "running", "waiting_groups", "pause", "resume", "flush"):
    getattr(RedissonBroker, _name).__doc__ = getattr(QueueAdmin, _name).__doc__
del _name

if TYPE_CHECKING:
    from ._consumer import ConsumerHost

    def _consumer_host(broker: RedissonBroker) -> ConsumerHost:
        """Dramatiq's ``consume()`` builds the consumer through :attr:`consumer_class`,
        which mypy cannot follow: this checks that the broker is its ``ConsumerHost``."""
        return broker
