"""Prometheus metrics for :class:`~dramatiq_redisson.RedissonBroker` (needs ``prometheus-client``).

Three kinds of metrics, all prefixed ``dramatiq_redisson_``:

* queue gauges (scheduled, overdue, oldest overdue, ready and ready per priority, lanes
  waiting, in flight, dead, consumers, legacy delayed, paused; live workers), and the
  counter of messages put back for an actor their worker had not declared, read at
  scrape time by :class:`StatsCollector` with one :meth:`RedissonBroker.stats` call: a
  fixed number of O(1)/O(log n) commands per queue, one round trip for all queues;
* schedule gauges (each periodic actor's schedule: when its next tick is due, how late
  its last tick moved, whether it is paused), read at the same scrape by the same
  collector from :meth:`Schedules.list` (a few reads per queue that has schedules);
* transfer metrics (messages moved, and how late each moved after its due time on the
  server clock), counted in the worker processes by :class:`TransferMetrics`, a
  :attr:`RedissonBroker.transfer_listeners` entry;
* the workflow counter (workflows started, done, failed and cancelled), counted by
  :class:`WorkflowMetrics`, a ``broker.workflows.listeners`` entry, in each process for
  the events it caused (a worker process counts those its steps ended).

With Dramatiq's ``Prometheus`` middleware, use :data:`Prometheus` from this module (the
broker may also adopt Dramatiq's own, see :func:`adopt_middleware`): its exposition
server, forked once by the ``dramatiq`` command as Dramatiq's is, serves Dramatiq's
multiprocess metrics plus these on the same host and port (``dramatiq_prom_host``,
``dramatiq_prom_port``); worker processes write the transfer metrics and the workflow
counter to the multiprocess directory (``dramatiq_prom_db``). Without it, :func:`make_wsgi_app` and :func:`serve`
(``dramatiq-redisson metrics``) serve the queue gauges.

Importing this module imports neither ``prometheus_client`` nor Dramatiq's prometheus
module (which creates its directory on import); both are imported when first needed.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from dramatiq.middleware import Middleware

from ._errors import needs_extra
from ._logs import CONNECTION_ERRORS
from ._wsgi import Reachability, serve_wsgi
from .admin._stats import OVERDUE_GRACE

if TYPE_CHECKING:
    # At run time ``Prometheus`` is this package's subclass of it, made on first access
    # (see ``__getattr__`` below and :func:`prometheus_middleware_class`).
    from dramatiq.middleware.prometheus import Prometheus as Prometheus
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from .admin._stats import Stats
    from .flow._queue_limits import QueueLimits
    from .periodic._schedules import ScheduleInfo

__all__ = [
    "LATENESS_BUCKETS",
    "WORKFLOW_EVENTS",
    "MetricsBroker",
    "Prometheus",
    "StatsCollector",
    "TransferMetrics",
    "WorkflowBroker",
    "WorkflowMetrics",
    "adopt_middleware",
    "exposition_server",
    "instrument_transfers",
    "instrument_workflows",
    "make_registry",
    "make_wsgi_app",
    "prometheus_middleware_class",
    "serve",
]


class _ScheduleReader(Protocol):
    def list(self) -> list[ScheduleInfo]: ...


class _LimitReader(Protocol):
    def get(self, queue_name: str) -> QueueLimits: ...


class _WorkflowListeners(Protocol):
    @property
    def listeners(self) -> list[Callable[[str], None]]: ...


class WorkflowBroker(Protocol):
    """What :func:`instrument_workflows` uses of a broker: its workflows' listeners."""

    @property
    def workflows(self) -> _WorkflowListeners: ...


class MetricsBroker(Protocol):
    """What the exporters read of a :class:`~dramatiq_redisson.RedissonBroker` (every
    ``broker`` parameter of this module is one): its stats, known queues, schedules and
    limits at scrape time, its transfer listeners, and its client (where it connects, and
    a PING at start). A Protocol, so that this optional module does not import the broker
    back (the broker loads this module only to adopt Dramatiq's own ``Prometheus``)."""

    @property
    def client(self) -> Any: ...

    @property
    def transfer_listeners(self) -> list[Callable[[str, list[int]], None]]: ...

    @property
    def schedules(self) -> _ScheduleReader: ...

    @property
    def limits(self) -> _LimitReader: ...

    def known_queues(self) -> list[str]: ...

    def stats(self, queue_name: str | None = None, *, overdue_grace: int = OVERDUE_GRACE) -> Stats: ...

    def close(self) -> None: ...


logger = logging.getLogger(__name__)

#: Upper bounds (seconds) of the transfer lateness histogram's buckets: 1 ms to 60 s.
LATENESS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: Environment variable naming the broker (``module:attribute``, as given to the
#: ``dramatiq`` command) that :func:`exposition_server` loads; by default it takes the
#: one the ``dramatiq`` command that forked it was given.
BROKER_ENV = "dramatiq_redisson_broker"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: What the metrics export while the server is away (said after "Cannot reach …").
_AWAY = "The metrics export dramatiq_redisson_stats_up 0 until it answers."

# name, help, QueueStats field (None: computed), per queue
_QUEUE_GAUGES: tuple[tuple[str, str, str | None], ...] = (
    ("dramatiq_redisson_ready_messages", "Messages waiting in the ready queue.", "ready"),
    (
        "dramatiq_redisson_queue_latency_seconds",
        "How long the oldest ready message has waited (server clock), 0 when none is ready: the signal to "
        "autoscale workers on.",
        "latency_ms",
    ),
    ("dramatiq_redisson_in_flight_messages", "Messages fetched by workers and not yet acked.", "in_flight"),
    ("dramatiq_redisson_scheduled_messages", "Messages scheduled for later (delays, retry back-offs).", "scheduled"),
    (
        "dramatiq_redisson_overdue_messages",
        "Scheduled messages due more than the overdue grace ago and not yet moved to the ready queue.",
        "overdue",
    ),
    (
        "dramatiq_redisson_oldest_overdue_seconds",
        "Server time minus the earliest due time when that message is overdue, else 0.",
        None,
    ),
    ("dramatiq_redisson_dead_messages", "Dead-lettered messages.", "dead"),
    ("dramatiq_redisson_consumers", "Consumers of the queue seen within three transfer leases.", "consumers"),
    (
        "dramatiq_redisson_legacy_delayed_messages",
        "Messages still in the built-in broker's .DQ delay queue (not yet migrated).",
        "legacy_delayed",
    ),
    (
        "dramatiq_redisson_queue_paused",
        "1 while the queue is paused (no consumer starts its messages), else 0.",
        "paused",
    ),
)


# name, help; labels: the schedule's name, its queue and its actor
_SCHEDULE_LABELS = ["schedule_name", "queue_name", "actor_name"]
_SCHEDULE_GAUGES: tuple[tuple[str, str], ...] = (
    (
        "dramatiq_redisson_schedule_next_due_timestamp_seconds",
        "When the schedule's next tick is due (server clock, epoch seconds); while its chain waits to be "
        "resumed (every worker was down), the tick it waits at. Absent while paused.",
    ),
    (
        "dramatiq_redisson_schedule_last_lateness_seconds",
        "How late the schedule's last tick moved to its ready queue (server clock). Absent before its first tick.",
    ),
    ("dramatiq_redisson_schedule_paused", "1 while the schedule is paused, else 0."),
    (
        "dramatiq_redisson_schedule_skipped_ticks",
        "Ticks the schedule skipped while its previous run was still scheduled, queued or running "
        '(overlap="skip"), since it was stored.',
    ),
    (
        "dramatiq_redisson_schedule_dropped_ticks",
        "Ticks of the schedule dropped because they did not start within its start deadline, since it was stored.",
    ),
    (
        "dramatiq_redisson_schedule_overlap_skip",
        '1 when the schedule skips overlapping ticks (overlap="skip"), else 0.',
    ),
    ("dramatiq_redisson_schedule_jitter_seconds", "The bound of the schedule's jitter. Absent without one."),
    ("dramatiq_redisson_schedule_start_deadline_seconds", "The schedule's start deadline. Absent without one."),
    (
        "dramatiq_redisson_schedule_window_end_timestamp_seconds",
        "When the schedule's window ends (epoch seconds): no tick after it. Absent without an end.",
    ),
    ("dramatiq_redisson_schedule_runs_left", "Runs left before the schedule's limit. Absent without a limit."),
    ("dramatiq_redisson_schedule_ended", "1 once the schedule has ended (its window is over or it ran its limit)."),
)


def _require_prometheus_client() -> None:
    """Raise a helpful ImportError when prometheus-client is not installed."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise ImportError(f"dramatiq_redisson.metrics needs prometheus-client: {needs_extra('metrics')}") from e


class StatsCollector:
    """A prometheus_client collector that reads :meth:`RedissonBroker.stats` at every scrape.

    Parameters:
      broker: The broker whose namespace is read (its own connection pool is used).
      queues: The queues to export; by default :meth:`RedissonBroker.known_queues` (the
        queues declared in this process and those that have ever had consumers). A queue
        named here is exported once it is known.
      overdue_grace: Scheduled messages due more than this many ms ago count as overdue.

    It also exports the schedule gauges of the periodic actors' schedules stored on those
    queues (:meth:`Schedules.list`).

    A failed read exports only ``dramatiq_redisson_stats_up 0``, so the rest of the
    registry is still served. A server that is away is said once per outage, naming it
    (its :attr:`reachability`), and once more when a read works again; any other failed
    read is logged with its traceback. A failed read of the schedules or the limits alone
    exports the queue gauges without them.
    """

    def __init__(
        self,
        broker: MetricsBroker,
        *,
        queues: Sequence[str] | None = None,
        overdue_grace: int = OVERDUE_GRACE,
    ) -> None:
        self.broker = broker
        if queues is not None and (isinstance(queues, str) or not queues):
            raise ValueError("queues must be a non-empty list of queue names, or None for every known queue")
        self.queues = list(queues) if queues is not None else None
        self.overdue_grace = overdue_grace
        #: Says when the server is away and when it is back (see :meth:`check`).
        self.reachability = Reachability(broker.client, logger, _AWAY)

    def check(self) -> bool:
        """PING the server (when serving starts): if it does not answer, say so now, once,
        rather than at the first scrape; whether it answered."""
        return self.reachability.check()

    def read(self) -> Stats:
        """The stats exported: of every known queue (one call), or of the given queues."""
        if self.queues is None:
            return self.broker.stats(overdue_grace=self.overdue_grace)
        # A queue named here that is not known yet (nothing sent to or consumed from it)
        # has no series until it is: the broker refuses to read an unknown queue.
        known = set(self.broker.known_queues())
        names = [name for name in self.queues if name in known]
        stats = self.broker.stats(names[0] if names else None, overdue_grace=self.overdue_grace)
        if not names:
            stats["queues"].clear()
        for name in names[1:]:
            stats["queues"].update(self.broker.stats(name, overdue_grace=self.overdue_grace)["queues"])
        return stats

    def read_schedules(self) -> list[ScheduleInfo]:
        """The schedules exported: those stored on the exported queues."""
        schedules = self.broker.schedules.list()
        if self.queues is None:
            return schedules
        return [info for info in schedules if info.queue_name in self.queues]

    def describe(self) -> list[Metric]:
        # Names only: registering the collector must not read the server.
        return [self._up(None), *self._families(None), *self._limit_families({}), *self._schedule_families([])]

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self.read()
        except CONNECTION_ERRORS as e:
            self.reachability.failed(e)
            yield self._up(0.0)
            return
        except Exception:
            logger.exception("Could not read the queue stats for the metrics.")
            yield self._up(0.0)
            return
        self.reachability.reached()
        try:
            schedules = self.read_schedules()
        except CONNECTION_ERRORS as e:
            self.reachability.failed(e)
            schedules = []
        except Exception:
            logger.exception("Could not read the schedules for the metrics.")
            schedules = []
        try:
            limits = {name: self.broker.limits.get(name) for name in stats["queues"]}
        except CONNECTION_ERRORS as e:
            self.reachability.failed(e)
            limits = {}
        except Exception:
            logger.exception("Could not read the limits for the metrics.")
            limits = {}
        yield self._up(1.0)
        yield from self._families(stats)
        yield from self._limit_families(limits)
        yield from self._schedule_families(schedules)

    @staticmethod
    def _limit_families(limits: Mapping[str, QueueLimits]) -> list[Metric]:
        """The concurrency and rate limits (set ones only) and what is in use, per queue."""
        from prometheus_client.core import GaugeMetricFamily

        limit = GaugeMetricFamily(
            "dramatiq_redisson_concurrency_limit",
            "A queue's concurrency limit (scope=queue) or each group's (scope=group), where one is set.",
            labels=["queue_name", "scope"],
        )
        in_use = GaugeMetricFamily(
            "dramatiq_redisson_slots_in_use",
            "Messages holding a slot of the queue's limits now.",
            labels=["queue_name"],
        )
        groups = GaugeMetricFamily(
            "dramatiq_redisson_groups_in_use", "Groups with messages holding a slot now.", labels=["queue_name"]
        )
        blocked = GaugeMetricFamily(
            "dramatiq_redisson_lanes_blocked",
            "Lanes (a group at a priority) with ready messages held back by their group's limit.",
            labels=["queue_name"],
        )
        rate = GaugeMetricFamily(
            "dramatiq_redisson_rate_limit",
            "A queue's rate limit (scope=queue) or each group's (scope=group): starts per rate window.",
            labels=["queue_name", "scope"],
        )
        window = GaugeMetricFamily(
            "dramatiq_redisson_rate_window_seconds", "The window of a queue's rate limits.", labels=["queue_name"]
        )
        started = GaugeMetricFamily(
            "dramatiq_redisson_rate_started",
            "The queue's messages started in the current window of its rate limit.",
            labels=["queue_name"],
        )
        deferred = GaugeMetricFamily(
            "dramatiq_redisson_lanes_deferred",
            "Lanes (a group at a priority) with ready messages held back by their group's rate limit.",
            labels=["queue_name"],
        )
        for name, now in limits.items():
            for family, per_queue, per_group in (
                (limit, now["concurrency"], now["group_concurrency"]),
                (rate, now["rate"], now["group_rate"]),
            ):
                for scope, value in (("queue", per_queue), ("group", per_group)):
                    if value is not None:
                        family.add_metric([name, scope], float(value))
            if now["per_ms"] is not None:
                window.add_metric([name], now["per_ms"] / 1000)
            if now["started_in_window"] is not None:
                started.add_metric([name], float(now["started_in_window"]))
            in_use.add_metric([name], float(now["in_use"]))
            groups.add_metric([name], float(now["groups_in_use"]))
            blocked.add_metric([name], float(now["lanes_blocked"]))
            deferred.add_metric([name], float(now["lanes_deferred"]))
        return [limit, in_use, groups, blocked, rate, window, started, deferred]

    @staticmethod
    def _up(value: float | None) -> Metric:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("dramatiq_redisson_stats_up", "1 when this scrape read the queue stats, else 0.")
        if value is not None:
            up.add_metric([], value)
        return up

    def _families(self, stats: Stats | None) -> list[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        queues: dict[str, Mapping[str, Any]] = dict(stats["queues"]) if stats else {}
        now_ms = stats["time_ms"] if stats else 0
        families: list[Metric] = []
        for name, documentation, field in _QUEUE_GAUGES:
            family = GaugeMetricFamily(name, documentation, labels=["queue_name"])
            for queue_name, queue in queues.items():
                if field is not None:
                    value = float(queue[field]) / (1000 if field.endswith("_ms") else 1)
                elif queue["overdue"] > 0 and queue["next_due_ms"] is not None:
                    value = max(0.0, (now_ms - queue["next_due_ms"]) / 1000)
                else:
                    value = 0.0
                family.add_metric([queue_name], value)
            families.append(family)
        by_priority = GaugeMetricFamily(
            "dramatiq_redisson_ready_messages_by_priority",
            "Ready messages per broker_priority, on queues whose messages go through lanes.",
            labels=["queue_name", "priority"],
        )
        lanes = GaugeMetricFamily(
            "dramatiq_redisson_lanes_waiting",
            "Lanes (priority and group_key pairs) with ready messages, the plain ready list not counted.",
            labels=["queue_name"],
        )
        for queue_name, queue in queues.items():
            for priority, count in queue["ready_by_priority"].items():
                by_priority.add_metric([queue_name, str(priority)], float(count))
            lanes.add_metric([queue_name], float(queue["lanes_waiting"]))
        families += [by_priority, lanes]
        # A count the server keeps (from the queue's first put-back, or its last flush): a
        # counter, for rate() (a flush resets it, as a restart resets a process's counters).
        unknown = CounterMetricFamily(
            "dramatiq_redisson_unknown_actor_put_backs",
            "Messages put back because the worker that got them had not declared their actor (a new actor "
            "while a rolling deploy's old processes still run); dead-lettered after unknown_actor_grace.",
            labels=["queue_name"],
        )
        for queue_name, queue in queues.items():
            unknown.add_metric([queue_name], float(queue["unknown_actor"]))
        families.append(unknown)
        shards = GaugeMetricFamily(
            "dramatiq_redisson_shard_messages",
            "A sharded queue's messages per shard (state: ready, scheduled, in_flight); the queue's "
            "own gauges are their sums.",
            labels=["queue_name", "shard", "state"],
        )
        for queue_name, queue in queues.items():
            for shard, counts in (queue.get("shards") or {}).items():
                for state in ("ready", "scheduled", "in_flight"):
                    shards.add_metric([queue_name, shard, state], float(counts[state]))
        families.append(shards)
        workers = GaugeMetricFamily(
            "dramatiq_redisson_workers", "Worker processes of the namespace whose heartbeat is recent."
        )
        if stats:
            workers.add_metric([], float(stats["workers"]))
        families.append(workers)
        return families

    @staticmethod
    def _schedule_families(schedules: Sequence[ScheduleInfo]) -> list[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        families = [
            GaugeMetricFamily(name, documentation, labels=_SCHEDULE_LABELS) for name, documentation in _SCHEDULE_GAUGES
        ]
        next_due, lateness, paused, skipped, dropped, overlap, jitter, deadline, window_end, runs_left, ended = families
        for info in schedules:
            labels = [info.name, info.queue_name, info.actor_name]
            due = info.next_due_ms if info.next_due_ms is not None or info.paused else info.waiting_since_ms
            if due is not None:
                next_due.add_metric(labels, due / 1000)
            if info.last_lateness_ms is not None:
                lateness.add_metric(labels, max(0, info.last_lateness_ms) / 1000)
            paused.add_metric(labels, 1.0 if info.paused else 0.0)
            skipped.add_metric(labels, float(info.skipped))
            dropped.add_metric(labels, float(info.dropped))
            overlap.add_metric(labels, 1.0 if info.overlap == "skip" else 0.0)
            for family, ms in ((jitter, info.jitter_ms), (deadline, info.start_deadline_ms), (window_end, info.end_ms)):
                if ms is not None:
                    family.add_metric(labels, ms / 1000)
            if info.runs_left is not None:
                runs_left.add_metric(labels, float(info.runs_left))
            ended.add_metric(labels, 1.0 if info.ended else 0.0)
        return list(families)


class TransferMetrics:
    """A :attr:`RedissonBroker.transfer_listeners` entry: counts the messages each transfer
    moved and observes how late each moved (moved-at minus due time, server clock).

    Parameters:
      registry: Where the counter and histogram are registered (default: prometheus_client's
        global registry). In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR`` set before
        prometheus_client was first imported in the process) the values are written to
        that directory, whatever the registry, for an exporter's ``MultiProcessCollector``.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        _require_prometheus_client()
        import prometheus_client as prom

        if registry is None:
            registry = prom.REGISTRY
        self.transferred = prom.Counter(
            "dramatiq_redisson_transferred_messages",
            "Scheduled messages moved to their ready queue.",
            ["queue_name"],
            registry=registry,
        )
        self.lateness = prom.Histogram(
            "dramatiq_redisson_transfer_lateness_seconds",
            "How long after its due time each scheduled message moved to its ready queue (server clock).",
            ["queue_name"],
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )

    def __call__(self, queue_name: str, lateness_ms: list[int]) -> None:
        if not lateness_ms:
            return
        self.transferred.labels(queue_name).inc(len(lateness_ms))
        histogram = self.lateness.labels(queue_name)
        for ms in lateness_ms:
            histogram.observe(max(0, ms) / 1000)


def instrument_transfers(broker: MetricsBroker, registry: CollectorRegistry | None = None) -> TransferMetrics:
    """Count ``broker``'s transfers in this process (see :class:`TransferMetrics`); once per
    broker: a second call returns the listener already added."""
    for listener in broker.transfer_listeners:
        if isinstance(listener, TransferMetrics):
            return listener
    metrics = TransferMetrics(registry)
    broker.transfer_listeners.append(metrics)
    return metrics


#: The events the workflow counter counts, its ``event`` label.
WORKFLOW_EVENTS = ("started", "done", "failed", "cancelled")


class WorkflowMetrics:
    """A ``broker.workflows.listeners`` entry: counts workflows by event
    (``dramatiq_redisson_workflows_total{event=...}``).

    Each process counts the events it caused: "started" where ``.run()`` was called, "done"
    and "failed" in the worker process whose step ended the workflow, "cancelled" where
    ``cancel()`` was called. Prometheus sums them over the processes (``sum by (event)``).

    Parameters:
      registry: As for :class:`TransferMetrics` (multiprocess mode writes the values to
        the multiprocess directory whatever the registry).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        _require_prometheus_client()
        import prometheus_client as prom

        if registry is None:
            registry = prom.REGISTRY
        self.workflows = prom.Counter(
            "dramatiq_redisson_workflows",
            "Workflows this process started, ended (done or failed: its step ended them) or cancelled.",
            ["event"],
            registry=registry,
        )
        # Every event has a series from the start, so that rate() sees the first one.
        for event in WORKFLOW_EVENTS:
            self.workflows.labels(event)

    def __call__(self, event: str) -> None:
        if event in WORKFLOW_EVENTS:
            self.workflows.labels(event).inc()


def instrument_workflows(broker: WorkflowBroker, registry: CollectorRegistry | None = None) -> WorkflowMetrics:
    """Count ``broker``'s workflow events in this process (see :class:`WorkflowMetrics`);
    once per broker: a second call returns the listener already added."""
    listeners = broker.workflows.listeners
    for listener in listeners:
        if isinstance(listener, WorkflowMetrics):
            return listener
    metrics = WorkflowMetrics(registry)
    listeners.append(metrics)
    return metrics


# -- Dramatiq's Prometheus middleware -------------------------------------------------

_prometheus_class: type[Middleware] | None = None


def prometheus_middleware_class() -> type[Middleware]:
    """This package's subclass of ``dramatiq.middleware.prometheus.Prometheus``, made on
    first use (importing Dramatiq's module creates its multiprocess directory).

    It is Dramatiq's middleware with two changes: each worker process also counts the
    transfers (:class:`TransferMetrics`) and the workflows its steps end
    (:class:`WorkflowMetrics`), in multiprocess mode, and its fork is
    :func:`exposition_server`, which serves Dramatiq's metrics and the queue gauges.
    """
    global _prometheus_class
    if _prometheus_class is None:
        from dramatiq.middleware.prometheus import Prometheus as DramatiqPrometheus

        class Prometheus(DramatiqPrometheus):
            __doc__ = prometheus_middleware_class.__doc__

            @property
            def forks(self) -> list[Callable[[], int]]:
                return [exposition_server]

            def after_process_boot(self, broker: Any) -> None:
                super().after_process_boot(broker)  # sets PROMETHEUS_MULTIPROC_DIR first
                from prometheus_client import CollectorRegistry

                if isinstance(getattr(broker, "transfer_listeners", None), list):
                    instrument_transfers(broker, CollectorRegistry())
                if isinstance(getattr(getattr(broker, "workflows", None), "listeners", None), list):
                    instrument_workflows(broker, CollectorRegistry())

        Prometheus.__module__ = __name__
        Prometheus.__qualname__ = "Prometheus"
        _prometheus_class = Prometheus
    return _prometheus_class


def adopt_middleware(middleware: Middleware) -> Middleware:
    """Turn an instance of Dramatiq's own ``Prometheus`` middleware into this package's
    (the same object, its class swapped for the subclass, which adds only behaviour);
    return any other middleware unchanged. Meant for ``RedissonBroker.add_middleware``,
    so that ``broker.add_middleware(Prometheus())`` exports these metrics too."""
    dramatiq_prometheus = sys.modules.get("dramatiq.middleware.prometheus")
    if dramatiq_prometheus is not None and type(middleware) is dramatiq_prometheus.Prometheus:
        middleware.__class__ = prometheus_middleware_class()
    return middleware


def __getattr__(name: str) -> Any:
    if name == "Prometheus":
        return prometheus_middleware_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _dramatiq_cli_broker_path() -> str | None:
    """The broker argument of the ``dramatiq`` command whose ``fork_process`` runs us."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "fork_process" and frame.f_globals.get("__name__") == "dramatiq.cli":
            path = getattr(frame.f_locals.get("args"), "broker", None)
            return path if isinstance(path, str) else None
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _load_broker() -> MetricsBroker:
    from dramatiq.cli import import_broker

    path = os.environ.get(BROKER_ENV) or _dramatiq_cli_broker_path()
    if not path:
        raise RuntimeError(
            f"Cannot tell which broker to read: not run by the dramatiq command's fork_process; set {BROKER_ENV}."
        )
    _, broker = import_broker(path)
    # The broker module imports this one (for adopt_middleware, when it is given Dramatiq's
    # own Prometheus), so this one does not import it back: a RedissonBroker cannot exist
    # unless its module has been loaded.
    broker_module = sys.modules.get(f"{__package__}._broker")
    if broker_module is None or not isinstance(broker, broker_module.RedissonBroker):
        raise RuntimeError(f"{path!r} is a {type(broker).__name__}, not a RedissonBroker.")
    return cast("MetricsBroker", broker)


def exposition_server() -> int:
    """The fork function of :data:`Prometheus`: Dramatiq's exposition server plus the
    queue gauges, on ``dramatiq_prom_host``:``dramatiq_prom_port``.

    The ``dramatiq`` command forks it once (not per worker process). It loads the broker
    the command was given (or ``$dramatiq_redisson_broker``), so its redis connections
    are made in this process, after the fork, and reads the stats at each scrape (a
    server that does not answer is said once, once the port is bound). If the broker
    cannot be loaded the error is logged and Dramatiq's metrics are served alone.
    """
    from dramatiq.middleware.prometheus import DB_PATH, HTTP_HOST, HTTP_PORT

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = DB_PATH
    os.environ["prometheus_multiproc_dir"] = DB_PATH
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=DB_PATH)
    broker = None
    collector = None
    try:
        broker = _load_broker()
        collector = StatsCollector(broker)
        registry.register(collector)
    except Exception:
        logger.exception("Serving Dramatiq's metrics without the dramatiq_redisson ones.")
    try:
        _serve_registry(registry, HTTP_HOST, HTTP_PORT, collector=collector)
    finally:
        if broker is not None:
            broker.close()
    return 0


# -- without Dramatiq's middleware ----------------------------------------------------


def make_registry(
    broker: MetricsBroker,
    *,
    queues: Sequence[str] | None = None,
    overdue_grace: int = OVERDUE_GRACE,
    multiprocess_dir: str | None = None,
) -> CollectorRegistry:
    """A registry holding a :class:`StatsCollector` of ``broker`` and, given
    ``multiprocess_dir``, the multiprocess metrics written there (Dramatiq's and the
    transfer metrics of worker processes).

    Raises:
      ImportError: prometheus-client is not installed.
    """
    registry, _ = _registry_and_collector(broker, queues, overdue_grace, multiprocess_dir)
    return registry


def _registry_and_collector(
    broker: MetricsBroker, queues: Sequence[str] | None, overdue_grace: int, multiprocess_dir: str | None
) -> tuple[CollectorRegistry, StatsCollector]:
    """:func:`make_registry`'s registry, and the StatsCollector it holds."""
    _require_prometheus_client()
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    if multiprocess_dir is not None:
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(registry, path=multiprocess_dir)
    collector = StatsCollector(broker, queues=queues, overdue_grace=overdue_grace)
    registry.register(collector)
    return registry, collector


def make_wsgi_app(
    broker: MetricsBroker,
    *,
    queues: Sequence[str] | None = None,
    overdue_grace: int = OVERDUE_GRACE,
    multiprocess_dir: str | None = None,
) -> WSGIApp:
    """A WSGI app serving :func:`make_registry`'s metrics (the queue gauges read at each
    request), to mount in a web app or serve with any WSGI server."""
    from prometheus_client import make_wsgi_app as prometheus_wsgi_app

    registry = make_registry(broker, queues=queues, overdue_grace=overdue_grace, multiprocess_dir=multiprocess_dir)
    app: WSGIApp = prometheus_wsgi_app(registry)
    return app


def serve(
    broker: MetricsBroker,
    host: str = "127.0.0.1",
    port: int = 9191,
    *,
    queues: Sequence[str] | None = None,
    overdue_grace: int = OVERDUE_GRACE,
    multiprocess_dir: str | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve :func:`make_registry`'s metrics over HTTP on ``host``:``port`` until
    KeyboardInterrupt (then close the socket and return). ``dramatiq-redisson metrics``.

    ``ready`` is called with the metrics URL once the port is bound (so nothing says it
    serves on a port that is taken). Then the server is PINGed: one that does not answer
    is said once, naming it, and the scrapes export ``dramatiq_redisson_stats_up 0`` until
    it does (see :class:`StatsCollector`).

    Raises:
      ImportError: prometheus-client is not installed.
      OSError: The address cannot be bound.
    """
    registry, collector = _registry_and_collector(broker, queues, overdue_grace, multiprocess_dir)
    try:
        _serve_registry(registry, host, port, collector=collector, ready=ready)
    except KeyboardInterrupt:
        pass


def _serve_registry(
    registry: CollectorRegistry,
    host: str,
    port: int,
    *,
    collector: StatsCollector | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``registry`` over HTTP until an exception leaves the server (see serve_wsgi);
    once the port is bound, call ``ready`` and let ``collector`` check its server."""
    from prometheus_client import make_wsgi_app as prometheus_wsgi_app

    def bound(url: str) -> None:
        if ready is not None:
            ready(url)
        if collector is not None:
            collector.check()

    serve_wsgi(prometheus_wsgi_app(registry), host, port, logger=logger, path="/metrics", ready=bound)
