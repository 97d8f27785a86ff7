"""Prometheus metrics: the queue gauges read at scrape time and the transfer metrics, served
by a real ``dramatiq`` command with the Prometheus middleware, by the WSGI app and by
``serve`` without it."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

import dramatiq
import pytest
import redis
from dramatiq.middleware import AgeLimit
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from redis.backoff import NoBackoff
from redis.retry import Retry

from dramatiq_redisson import QueueStats, RedissonBroker
from dramatiq_redisson import metrics as m
from dramatiq_redisson._keys import registry_key
from dramatiq_redisson.embedded import free_loopback_port
from tests.helpers import records, sigint_as_in_a_terminal, wait_for

ROOT = Path(__file__).resolve().parent.parent

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

#: Exported gauge -> the ``broker.stats()`` field it must equal.
GAUGE_FIELDS = {
    "dramatiq_redisson_ready_messages": "ready",
    "dramatiq_redisson_in_flight_messages": "in_flight",
    "dramatiq_redisson_scheduled_messages": "scheduled",
    "dramatiq_redisson_overdue_messages": "overdue",
    "dramatiq_redisson_dead_messages": "dead",
    "dramatiq_redisson_consumers": "consumers",
    "dramatiq_redisson_legacy_delayed_messages": "legacy_delayed",
    "dramatiq_redisson_queue_paused": "paused",
    "dramatiq_redisson_lanes_waiting": "lanes_waiting",
}


def parse(text: str) -> Samples:
    """Every sample of an exposition, keyed by name and labels; a series exported twice fails."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"series exported twice: {key}"
            samples[key] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape(url: str) -> Samples | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return parse(response.read().decode())
    except OSError:
        return None


def call_wsgi(app: m.WSGIApp) -> Samples:
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ["PATH_INFO"] = "/metrics"
    statuses: list[str] = []
    body = b"".join(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
    assert statuses == ["200 OK"]
    return parse(body.decode())


def queue_labels(samples: Samples) -> set[str]:
    return {dict(labels)["queue_name"] for name, labels in samples if name == "dramatiq_redisson_scheduled_messages"}


def mismatches(samples: Samples, queues: Mapping[str, QueueStats], time_ms: int) -> list[str]:
    """How the scraped gauges differ from ``broker.stats()`` (oldest overdue: within 2 s)."""
    wrong = []
    if queue_labels(samples) != set(queues):
        wrong.append(f"queues {sorted(queue_labels(samples))} != {sorted(queues)}")
    for queue_name, queue in queues.items():
        for name, field in GAUGE_FIELDS.items():
            got = value(samples, name, queue_name=queue_name)
            if got != queue[field]:  # type: ignore[literal-required]
                wrong.append(f"{name}{{{queue_name}}} = {got}, stats {field} = {queue[field]}")  # type: ignore[literal-required]
        oldest = value(samples, "dramatiq_redisson_oldest_overdue_seconds", queue_name=queue_name)
        due = queue["next_due_ms"]
        expected = (time_ms - due) / 1000 if queue["overdue"] and due is not None else 0.0
        if oldest is None or abs(oldest - expected) > 2.0 or (expected == 0.0) != (oldest == 0.0):
            wrong.append(f"oldest overdue {{{queue_name}}} = {oldest}, expected about {expected}")
    return wrong


def message(queue_name: str, actor_name: str, *args: Any, **options: Any) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=queue_name, actor_name=actor_name, args=args, kwargs={}, options=options)


def stop(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal ``proc`` (by pid) and wait for it; if it does not exit in time, SIGKILL its
    process group (it was started in a session of its own) and wait."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_dramatiq_exporter_serves_queue_gauges_and_transfer_metrics_of_worker_processes(
    broker: RedissonBroker, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given the dramatiq command running 2 worker processes of "default" (not "idle") with
    # this package's Prometheus middleware
    port = free_loopback_port()
    env = {k: v for k, v in os.environ.items() if k.lower() != "prometheus_multiproc_dir"}
    env.update(
        REDIS_URL=redis_url,
        PYTHONPATH=str(ROOT),
        dramatiq_prom_host="127.0.0.1",
        dramatiq_prom_port=str(port),
        dramatiq_prom_db=str(tmp_path / "prom"),
    )
    command = [sys.executable, "-m", "dramatiq", "tests.metrics_app:broker", "-p", "2", "-t", "2", "-Q", "default"]
    url = f"http://127.0.0.1:{port}/metrics"
    log_path = tmp_path / "dramatiq.log"

    def stats(queue_name: str) -> QueueStats:
        return broker.stats(queue_name)["queues"][queue_name]

    def consumed(queue_name: str) -> int:
        """The queue's live consumers (0 before a consumer made it known)."""
        return stats(queue_name)["consumers"] if queue_name in broker.known_queues() else 0

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            assert wait_for(lambda: scrape(url) is not None and consumed("default") == 2, 30, 0.1), (
                log_path.read_text()[-3000:]
            )

            # When messages are scheduled on both queues: 6 on "default", which the workers
            # move and run (one fails for good), and on "idle" 3 that go overdue, 2 due in an
            # hour and 2 ready ones
            for i in range(5):
                broker.enqueue(message("default", "stamp", i), delay=300)
            broker.enqueue(message("default", "fail"), delay=300)
            for delay in (1, 1, 1, 3_600_000, 3_600_000, None, None):
                broker.enqueue(message("idle", "idle"), delay=delay)

            def settled() -> bool:
                default, idle = stats("default"), stats("idle")
                return (
                    len(records(redis_client)) == 5
                    and (default["scheduled"], default["ready"], default["in_flight"], default["dead"]) == (0, 0, 0, 1)
                    and (idle["scheduled"], idle["overdue"], idle["ready"]) == (5, 3, 2)
                )

            assert wait_for(settled, timeout=15), (stats("default"), stats("idle"))

            # Then one scrape of the dramatiq exporter shows the gauges broker.stats() reads,
            # each series once (a single process exports them)
            last: list[Any] = []

            def gauges_match() -> bool:
                samples = scrape(url)
                now = broker.stats("default")
                queues = {q: stats(q) for q in ("default", "idle")}
                last[:] = [samples, queues, now]
                return (
                    samples is not None
                    and not mismatches(samples, queues, now["time_ms"])
                    and value(samples, "dramatiq_redisson_workers") == now["workers"] == 2
                )

            assert wait_for(gauges_match, timeout=5, interval=0.2), (
                mismatches(last[0], last[1], last[2]["time_ms"]) if last[0] else "no scrape"
            )
            samples = last[0]
            assert value(samples, "dramatiq_redisson_stats_up") == 1.0
            assert value(samples, "dramatiq_redisson_overdue_messages", queue_name="idle") == 3.0
            oldest = value(samples, "dramatiq_redisson_oldest_overdue_seconds", queue_name="idle")
            assert oldest is not None and 1.0 <= oldest < 30.0

            # and the worker processes' transfer metrics: 6 moved, each well within a second
            assert value(samples, "dramatiq_redisson_transferred_messages_total", queue_name="default") == 6.0
            hist = "dramatiq_redisson_transfer_lateness_seconds"
            assert value(samples, f"{hist}_count", queue_name="default") == 6.0
            lateness_sum = value(samples, f"{hist}_sum", queue_name="default")
            assert lateness_sum is not None and 0.0 <= lateness_sum < 6 * 1.0
            assert value(samples, f"{hist}_bucket", queue_name="default", le="1.0") == 6.0
            assert value(samples, f"{hist}_bucket", queue_name="default", le="+Inf") == 6.0
            assert value(samples, f"{hist}_count", queue_name="idle") is None
            # and Dramatiq's own metrics, as its exporter serves them
            assert value(samples, "dramatiq_messages_total", queue_name="default", actor_name="stamp") == 5.0
            assert value(samples, "dramatiq_message_errors_total", queue_name="default", actor_name="fail") == 1.0
        finally:
            stop(proc, signal.SIGTERM)
    output = log_path.read_text()
    assert proc.returncode == 0, output[-3000:]
    assert "without the dramatiq_redisson ones" not in output
    # The exporter fork went with the dramatiq command.
    assert wait_for(lambda: scrape(url) is None, timeout=5)


def test_wsgi_app_serves_the_gauges_of_broker_stats(broker: RedissonBroker) -> None:
    # Given scheduled messages on a declared queue nobody consumes: 2 past due, 1 in an hour, 1 ready;
    # the queue paused
    broker.declare_queue("wsgi")
    broker.pause("wsgi")
    for delay in (1, 1, 3_600_000, None):
        broker.enqueue(message("wsgi", "nobody"), delay=delay)
    assert wait_for(lambda: broker.stats("wsgi", overdue_grace=0)["queues"]["wsgi"]["overdue"] == 2)

    # When the WSGI app (no Dramatiq middleware) is called
    samples = call_wsgi(m.make_wsgi_app(broker, overdue_grace=0))

    # Then its gauges are broker.stats()'s
    stats = broker.stats(overdue_grace=0)
    assert set(stats["queues"]) == {"wsgi"}
    assert mismatches(samples, stats["queues"], stats["time_ms"]) == []
    assert value(samples, "dramatiq_redisson_overdue_messages", queue_name="wsgi") == 2.0
    assert value(samples, "dramatiq_redisson_ready_messages", queue_name="wsgi") == 1.0
    assert value(samples, "dramatiq_redisson_queue_paused", queue_name="wsgi") == 1.0
    oldest = value(samples, "dramatiq_redisson_oldest_overdue_seconds", queue_name="wsgi")
    assert oldest is not None and 0.0 < oldest < 5.0
    assert value(samples, "dramatiq_redisson_workers") == 0.0
    assert value(samples, "dramatiq_redisson_stats_up") == 1.0
    # Nothing of Dramatiq's or of the transfers without a multiprocess directory.
    assert not [name for name, _ in samples if not name.startswith("dramatiq_redisson_")]

    # and a list of queues exports just those, read one by one (each a known queue)
    broker.declare_queue("other")
    only = call_wsgi(m.make_wsgi_app(broker, queues=["wsgi", "other"]))
    assert queue_labels(only) == {"wsgi", "other"}
    assert value(only, "dramatiq_redisson_scheduled_messages", queue_name="wsgi") == 3.0
    assert value(only, "dramatiq_redisson_scheduled_messages", queue_name="other") == 0.0
    with pytest.raises(ValueError):
        m.make_wsgi_app(broker, queues=[])

    # and a queue named before it is known has no series until it is: the scrape still works
    later = m.make_wsgi_app(broker, queues=["wsgi", "later"])
    assert queue_labels(call_wsgi(later)) == {"wsgi"}
    only_later = call_wsgi(m.make_wsgi_app(broker, queues=["later"]))
    assert queue_labels(only_later) == set() and value(only_later, "dramatiq_redisson_stats_up") == 1.0
    broker.declare_queue("later")
    assert queue_labels(call_wsgi(later)) == {"wsgi", "later"}


def test_wsgi_app_serves_ready_messages_per_priority_and_the_lanes_waiting(
    make_broker: Callable[..., Any], redis_url: str
) -> None:
    broker = make_broker(url=redis_url, max_priority=9)
    # Given a plain queue, and one with messages at priorities 0 and 7, two groups at 0
    broker.declare_queue("plain")
    broker.enqueue(message("plain", "nobody"))
    broker.declare_queue("laned")
    for options in ({}, {"broker_priority": 7}, {"broker_priority": 7}, {"group_key": "a"}, {"group_key": "b"}):
        broker.enqueue(message("laned", "nobody", **options))
    # When the WSGI app is called
    samples = call_wsgi(m.make_wsgi_app(broker))
    # Then the laned queue has a series per priority, the plain one none
    name = "dramatiq_redisson_ready_messages_by_priority"
    assert value(samples, name, queue_name="laned", priority="7") == 2.0
    assert value(samples, name, queue_name="laned", priority="0") == 3.0
    assert [labels for n, labels in samples if n == name and dict(labels)["queue_name"] == "plain"] == []
    assert value(samples, "dramatiq_redisson_lanes_waiting", queue_name="laned") == 3.0
    assert value(samples, "dramatiq_redisson_lanes_waiting", queue_name="plain") == 0.0
    assert value(samples, "dramatiq_redisson_ready_messages", queue_name="laned") == 5.0
    # and the concurrency limits, where one is set, with what is in use
    assert [n for n, _ in samples if n == "dramatiq_redisson_concurrency_limit"] == []
    broker.limits.set("laned", concurrency=4, group_concurrency=1)
    limited = call_wsgi(m.make_wsgi_app(broker))
    assert value(limited, "dramatiq_redisson_concurrency_limit", queue_name="laned", scope="queue") == 4.0
    assert value(limited, "dramatiq_redisson_concurrency_limit", queue_name="laned", scope="group") == 1.0
    assert value(limited, "dramatiq_redisson_concurrency_limit", queue_name="plain", scope="queue") is None
    for name in ("slots_in_use", "groups_in_use", "lanes_blocked"):
        assert value(limited, f"dramatiq_redisson_{name}", queue_name="laned") == 0.0
    # and the rate limits, where one is set, with the starts in the window
    assert [n for n, _ in limited if n == "dramatiq_redisson_rate_limit"] == []
    broker.limits.set("laned", rate=50, group_rate=5, per_ms=2000)
    rated = call_wsgi(m.make_wsgi_app(broker))
    assert value(rated, "dramatiq_redisson_rate_limit", queue_name="laned", scope="queue") == 50.0
    assert value(rated, "dramatiq_redisson_rate_limit", queue_name="laned", scope="group") == 5.0
    assert value(rated, "dramatiq_redisson_rate_window_seconds", queue_name="laned") == 2.0
    assert value(rated, "dramatiq_redisson_rate_started", queue_name="laned") == 0.0
    assert value(rated, "dramatiq_redisson_lanes_deferred", queue_name="laned") == 0.0
    assert value(rated, "dramatiq_redisson_rate_started", queue_name="plain") is None


def test_wsgi_app_reports_a_failed_read_instead_of_failing(make_broker: Callable[..., Any]) -> None:
    client = redis.Redis(port=free_loopback_port(), socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    unreachable = make_broker(client=client)
    samples = call_wsgi(m.make_wsgi_app(unreachable, queues=["default"]))
    assert value(samples, "dramatiq_redisson_stats_up") == 0.0
    assert queue_labels(samples) == set()


SERVE = """
import os, sys
from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.metrics import serve

broker = RedissonBroker(url=os.environ["REDIS_URL"])
serve(broker, host="127.0.0.1", port=int(sys.argv[1]))
print("serve returned", flush=True)
"""


def test_serve_blocks_serving_the_gauges_until_keyboard_interrupt(
    broker: RedissonBroker, redis_url: str, redis_client: redis.Redis
) -> None:
    # Given a queue that has had consumers (their heartbeats list it), 2 scheduled on it
    redis_client.sadd(registry_key("dramatiq"), "served")
    for delay in (3_600_000, 7_200_000):
        broker.enqueue(message("served", "nobody"), delay=delay)

    # When `serve` runs in its own process, as `dramatiq-redisson metrics` runs it
    port = free_loopback_port()
    env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", SERVE, str(port)]
    with subprocess.Popen(
        command,
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=sigint_as_in_a_terminal,  # stopped by SIGINT, as an interactive one by Ctrl-C
    ) as proc:
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            assert wait_for(lambda: scrape(url) is not None, timeout=15, interval=0.1)
            samples = scrape(url)
            stats = broker.stats()
            # Then it serves broker.stats()'s gauges of the known queues
            assert samples is not None and set(stats["queues"]) == {"served"}
            assert mismatches(samples, stats["queues"], stats["time_ms"]) == []
            assert value(samples, "dramatiq_redisson_scheduled_messages", queue_name="served") == 2.0
        finally:
            # and returns on KeyboardInterrupt
            stop(proc, signal.SIGINT)
        out, err = proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert out.decode().strip() == "serve returned"


def test_importing_the_package_or_the_metrics_module_does_not_import_prometheus() -> None:
    probe = (
        "import sys, dramatiq_redisson, dramatiq_redisson.metrics;"
        "print('prometheus_client' in sys.modules, 'dramatiq.middleware.prometheus' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False"]


def test_transfer_metrics_count_moved_messages_and_their_lateness(broker: RedissonBroker) -> None:
    registry = CollectorRegistry()
    listener = m.instrument_transfers(broker, registry)
    assert m.instrument_transfers(broker, registry) is listener
    assert broker.transfer_listeners.count(listener) == 1

    broker.notify_transfer("q", [0, 3, 2_500, -1])
    broker.notify_transfer("q", [])

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"queue_name": "q", **labels})

    assert sample("dramatiq_redisson_transferred_messages_total") == 4.0
    assert sample("dramatiq_redisson_transfer_lateness_seconds_count") == 4.0
    assert sample("dramatiq_redisson_transfer_lateness_seconds_sum") == pytest.approx(2.503)
    assert sample("dramatiq_redisson_transfer_lateness_seconds_bucket", le="0.001") == 2.0
    assert sample("dramatiq_redisson_transfer_lateness_seconds_bucket", le="0.005") == 3.0
    assert sample("dramatiq_redisson_transfer_lateness_seconds_bucket", le="2.5") == 4.0
    assert m.LATENESS_BUCKETS[0] == 0.001 and m.LATENESS_BUCKETS[-1] == 60.0


def test_dramatiqs_prometheus_middleware_is_adopted_with_the_exporter_swapped() -> None:
    from dramatiq.cli import fork_process, import_broker
    from dramatiq.middleware.prometheus import Prometheus as DramatiqPrometheus
    from dramatiq.middleware.prometheus import _run_exposition_server

    # What the exporter relies on in dramatiq: its fork function, and the CLI's
    # fork_process(args, ...) that calls fork functions with `args.broker` at hand.
    assert DramatiqPrometheus().forks == [_run_exposition_server]
    assert list(inspect.signature(fork_process).parameters)[0] == "args"
    assert callable(import_broker)

    middleware = DramatiqPrometheus()
    assert m.adopt_middleware(middleware) is middleware
    assert isinstance(middleware, m.Prometheus) and isinstance(middleware, DramatiqPrometheus)
    assert middleware.forks == [m.exposition_server]
    assert m.Prometheus().forks == [m.exposition_server]

    other = AgeLimit()
    assert m.adopt_middleware(other) is other and type(other) is AgeLimit


def test_redisson_broker_adopts_dramatiqs_prometheus_middleware(make_broker: Callable[..., Any]) -> None:
    from dramatiq.middleware.prometheus import Prometheus as DramatiqPrometheus

    passed = make_broker(middleware=[DramatiqPrometheus()])
    added = make_broker(middleware=[])
    added.add_middleware(DramatiqPrometheus())
    for broker in (passed, added):
        # (with the workflows' middleware, which the broker adds by itself)
        [middleware] = [mw for mw in broker.middleware if type(mw).__name__ != "WorkflowSteps"]
        assert isinstance(middleware, m.Prometheus)
        assert middleware.forks == [m.exposition_server]


def test_a_sharded_queue_is_one_queue_with_a_gauge_per_shard(make_broker: Callable[..., Any], redis_url: str) -> None:
    """Issue 36: the queue's gauges are the sums over its shards; each shard's ready,
    scheduled and in-flight counts are a series of dramatiq_redisson_shard_messages."""
    broker = make_broker(url=redis_url, shards={"sharded": 3})
    broker.declare_queue("sharded")
    for i in range(6):
        broker.enqueue(message("sharded", "nobody"), delay=3_600_000 if i % 2 else None)
    samples = call_wsgi(m.make_wsgi_app(broker))
    assert queue_labels(samples) == {"sharded"}
    assert value(samples, "dramatiq_redisson_ready_messages", queue_name="sharded") == 3.0
    assert value(samples, "dramatiq_redisson_scheduled_messages", queue_name="sharded") == 3.0
    shards = broker.shards_of("sharded")
    assert len(shards) == 3
    per_shard = {
        (shard, state): value(
            samples, "dramatiq_redisson_shard_messages", queue_name="sharded", shard=shard, state=state
        )
        for shard in shards
        for state in ("ready", "scheduled", "in_flight")
    }
    assert sum(v or 0 for (_, state), v in per_shard.items() if state == "ready") == 3.0
    assert sum(v or 0 for (_, state), v in per_shard.items() if state == "scheduled") == 3.0
    assert all(v is not None for v in per_shard.values())  # every shard, every state
    broker.flush("sharded")
