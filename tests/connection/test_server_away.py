"""A worker whose server is away says so once per process, naming the address, then at
most one line per back-off step (not one per queue and part); it says once when the
server is back, and delivery resumes. Loggers are named after public classes."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import dramatiq
import pytest
from dramatiq import Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson._logs import FIRST_REMINDER, Outage, reason
from dramatiq_redisson.connection._client import server_address
from tests.harness.faults.procs import ValkeyProcess
from tests.helpers import wait_for

QUEUES = ("a", "b", "c", "d", "e", "f", "g")


def _ours(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("dramatiq_redisson") and r.levelno >= level]


def test_a_worker_that_cannot_reach_its_server_says_so_once_and_then_once_per_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = ValkeyProcess("away", tmp_path / "server", {})  # its port is picked, the server not started yet
    url = server.url
    caplog.set_level(logging.DEBUG, logger="dramatiq_redisson")
    broker = RedissonBroker(url=url)
    ran: list[str] = []
    for queue in QUEUES:

        @dramatiq.actor(broker=broker, queue_name=queue, actor_name=f"away_{queue}")
        def job(queue: str = queue) -> None:
            ran.append(queue)

    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    try:
        time.sleep(FIRST_REMINDER + 2.5)  # the first line, and one reminder at most
        away = [r for r in _ours(caplog, logging.WARNING)]
        messages = [r.getMessage() for r in away]
        assert len(away) in (2, 3), messages
        assert messages[0].startswith(f"Cannot reach {url}: "), messages
        assert all(m.startswith(f"Still cannot reach {url} after ") for m in messages[1:]), messages
        assert all(r.name == "dramatiq_redisson.RedissonBroker" for r in away)
        assert not any(".." in m or "on queue" in m for m in messages), messages

        server.start()  # the server comes: delivery starts, and one line says so
        for queue in QUEUES:
            broker.get_actor(f"away_{queue}").send()
        assert wait_for(lambda: sorted(ran) == sorted(QUEUES), timeout=20), ran
        back = [r.getMessage() for r in _ours(caplog) if r.getMessage().startswith("Reached ")]
        assert len(back) == 1 and back[0].startswith(f"Reached {url} again after "), back

        # Lost once it was there: "Lost the connection", once, for every queue. (Every
        # message acked first: an ack the kill cuts off is retried for up to 30 s, which
        # would hold up the worker's stop.)
        for queue in QUEUES:
            broker.join(queue, timeout=10_000)
        caplog.clear()
        server.signal(signal.SIGKILL)
        server.wait_exit()
        time.sleep(1.5)
        lost = [r.getMessage() for r in _ours(caplog, logging.WARNING)]
        assert len(lost) == 1 and lost[0].startswith(f"Lost the connection to {url}: "), lost
    finally:
        worker.stop()
        broker.close()
        if server.pid is not None:
            server.signal(signal.SIGKILL)
            server.wait_exit()


def test_the_outage_lines_come_at_doubling_steps(caplog: pytest.LogCaptureFixture) -> None:
    """The reminders' schedule itself (monotonic time moved by hand): 2, 4, 8… s apart,
    however many parts report the failure meanwhile."""
    outage = Outage("redis://127.0.0.1:1/0", logging.getLogger("dramatiq_redisson.test"))
    caplog.set_level(logging.INFO, logger="dramatiq_redisson.test")
    error = ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    clock = [1000.0]
    real = time.monotonic
    time.monotonic = lambda: clock[0]  # type: ignore[assignment]
    try:
        logged_at = []
        for tenth in range(0, 400):  # 40 s of failures, 10 parts each time
            clock[0] = 1000.0 + tenth / 10
            if any([outage.failed(error) for _ in range(10)]):
                logged_at.append(round(clock[0] - 1000.0, 1))
        outage.reached()
        outage.reached()
    finally:
        time.monotonic = real  # type: ignore[assignment]
    assert logged_at == [0.0, 2.0, 6.0, 14.0, 30.0], logged_at
    messages = [r.getMessage() for r in caplog.records]
    first = "Cannot reach redis://127.0.0.1:1/0: Error 111 connecting to 127.0.0.1:1. Connection refused."
    assert messages[0] == f"{first} Retrying until it answers."
    assert messages[-1].startswith("Reached redis://127.0.0.1:1/0 again after 39.9 s")
    assert len(messages) == 6


def test_addresses_and_reasons_read_well() -> None:
    import redis

    assert server_address(redis.Redis.from_url("redis://:secret@example.com:6380/3")) == "redis://example.com:6380/3"
    assert server_address(redis.Redis.from_url("rediss://example.com")) == "rediss://example.com:6379/0"
    assert server_address(redis.Redis(unix_socket_path="/tmp/v.sock")) == "unix:///tmp/v.sock?db=0"
    assert reason(ConnectionError("Connection refused.")) == "Connection refused"
    assert reason(TimeoutError()) == "TimeoutError"


def test_loggers_are_named_after_public_classes(redis_url: str) -> None:
    broker = RedissonBroker(url=redis_url)

    @dramatiq.actor(broker=broker, queue_name="named", actor_name="named_job")
    def named_job() -> None:
        pass

    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        named_job.send_with_options(delay=10)
        broker.join("named")
        worker.join()
    finally:
        worker.stop()
        broker.close()
    assert broker.logger.name == "dramatiq_redisson.RedissonBroker"
    names = [name for name in logging.root.manager.loggerDict if name.startswith("dramatiq_redisson")]
    assert "dramatiq_redisson.RedissonConsumer" in names
    private = [name for name in names if "._" in name]
    assert not private, private
