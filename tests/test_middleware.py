"""The standard middleware works unchanged on RedissonBroker, delays included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker, group, pipeline
from dramatiq.middleware import AgeLimit, CurrentMessage, GroupCallbacks, TimeLimit
from dramatiq.rate_limits.backends import RedisBackend as RateLimiterBackend
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend as ResultsBackend

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.embedded import free_loopback_port
from tests.helpers import record, records, wait_for


def test_retries_back_off_through_the_delayed_queue(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(max_retries=3, min_backoff=200, max_backoff=400)
    def flaky() -> None:
        record(redis_client)
        if len(records(redis_client)) < 3:
            raise RuntimeError("not yet")

    flaky.send()
    # The retry waits in the ZSET (and nowhere else) during its back-off
    assert wait_for(lambda: broker.delayed_queue("default").size() == 1, timeout=5)
    assert not redis_client.exists("dramatiq:default.DQ")
    broker.join("default", timeout=10_000)
    worker.join()
    runs = records(redis_client)
    assert len(runs) == 3
    assert runs[1]["at_ms"] - runs[0]["at_ms"] >= 100  # back-off is min_backoff with jitter in [0.5, 1]


def test_time_limit_and_failure_end_in_dead_letters(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis
) -> None:
    [time_limit] = [m for m in broker.middleware if isinstance(m, TimeLimit)]
    time_limit.interval = 50
    time_limit.after_process_boot(broker)  # what the dramatiq CLI does in each worker process

    @dramatiq.actor(max_retries=0, time_limit=200)
    def slow() -> None:
        for _ in range(40):
            time.sleep(0.05)

    message = slow.send_with_options(delay=100)
    broker.join("default", timeout=10_000)
    worker.join()
    assert redis_client.zscore("dramatiq:default.XQ", message.options["redis_message_id"]) is not None


def test_age_limit_skips_a_message_that_waited_too_long(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis
) -> None:
    assert any(isinstance(m, AgeLimit) for m in broker.middleware)

    @dramatiq.actor(max_age=100)
    def stale() -> None:
        record(redis_client)

    stale.send_with_options(delay=400)
    broker.join("default", timeout=5_000)
    worker.join()
    assert records(redis_client) == []


def test_callbacks_run_for_delayed_messages(broker: RedissonBroker, worker: Worker, redis_client: redis.Redis) -> None:
    @dramatiq.actor
    def ok() -> int:
        return 1

    @dramatiq.actor(max_retries=0)
    def bad() -> None:
        raise RuntimeError("boom")

    @dramatiq.actor
    def on_success(message: dict[str, object], result: int) -> None:
        record(redis_client, kind="success", result=result)

    @dramatiq.actor
    def on_failure(message: dict[str, object], exception: dict[str, str]) -> None:
        record(redis_client, kind="failure", type=exception["type"])

    ok.send_with_options(delay=100, on_success=on_success)
    bad.send_with_options(delay=100, on_failure=on_failure)
    assert wait_for(lambda: len(records(redis_client)) == 2, timeout=5)
    kinds = sorted((r["kind"], r.get("result", r.get("type"))) for r in records(redis_client))
    assert kinds == [("failure", "RuntimeError"), ("success", 1)]


def test_pipelines_with_delays(broker: RedissonBroker, worker: Worker, redis_client: redis.Redis) -> None:
    @dramatiq.actor
    def step(name: str) -> None:
        record(redis_client, name=name)

    start = time.monotonic()
    pipeline(
        [
            step.message("a"),
            step.message_with_options(args=("b",), delay=300, pipe_ignore=True),
            step.message_with_options(args=("c",), pipe_ignore=True),
        ]
    ).run(delay=200)
    assert wait_for(lambda: len(records(redis_client)) == 3, timeout=5)
    runs = records(redis_client)
    assert [r["name"] for r in runs] == ["a", "b", "c"]
    assert runs[1]["at_ms"] - runs[0]["at_ms"] >= 300
    assert time.monotonic() - start >= 0.5


def test_group_callbacks_and_results(broker: RedissonBroker, redis_client: redis.Redis, redis_url: str) -> None:
    broker.add_middleware(Results(backend=ResultsBackend(client=redis_client)))
    broker.add_middleware(GroupCallbacks(RateLimiterBackend(client=redis_client)))

    @dramatiq.actor(store_results=True)
    def square(x: int) -> int:
        return x * x

    @dramatiq.actor
    def done() -> None:
        record(redis_client, name="done")

    worker = Worker(broker, worker_timeout=100, worker_threads=4)
    worker.start()
    try:
        g = group(square.message(i) for i in range(5))
        g.add_completion_callback(done.message())
        g.run(delay=200)
        assert sorted(g.get_results(block=True, timeout=10_000)) == [0, 1, 4, 9, 16]
        assert wait_for(lambda: [r["name"] for r in records(redis_client)] == ["done"], timeout=5)
        message = square.send_with_options(args=(7,), delay=100)
        assert message.get_result(block=True, timeout=5_000) == 49
    finally:
        worker.stop()


def test_current_message_is_the_transferred_message(broker: RedissonBroker, redis_client: redis.Redis) -> None:
    broker.add_middleware(CurrentMessage())

    @dramatiq.actor
    def whoami() -> None:
        current = CurrentMessage.get_current_message()
        record(redis_client, message_id=current.message_id, options=current.options)

    worker = Worker(broker, worker_timeout=100)
    worker.start()
    try:
        message = whoami.send_with_options(delay=100)
        assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
        [run] = records(redis_client)
        assert run["message_id"] == message.message_id
        assert "eta" not in run["options"]
        assert run["options"]["redis_message_id"] == message.options["redis_message_id"]
    finally:
        worker.stop()


def test_prometheus_counts_delayed_messages(
    redis_url: str, redis_client: redis.Redis, tmp_path: Path, make_broker: Callable[..., Any]
) -> None:
    # Given a worker started by the dramatiq CLI with the Prometheus middleware
    (tmp_path / "promapp.py").write_text(
        textwrap.dedent(
            """
            import os, dramatiq
            from dramatiq.middleware.prometheus import Prometheus
            from dramatiq_redisson import RedissonBroker

            broker = RedissonBroker(url=os.environ["REDIS_URL"])
            broker.add_middleware(Prometheus())
            dramatiq.set_broker(broker)

            @dramatiq.actor
            def counted():
                pass
            """
        )
    )
    port = free_loopback_port()
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "PYTHONPATH": str(tmp_path),
        "dramatiq_prom_host": "127.0.0.1",
        "dramatiq_prom_port": str(port),
        "dramatiq_prom_db": str(tmp_path / "prom"),
    }
    command = [sys.executable, "-m", "dramatiq", "promapp:broker", "--processes", "1", "--threads", "2"]
    proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # When three delayed messages run
        sender = make_broker(url=redis_url)
        for _ in range(3):
            sender.enqueue(dramatiq.Message("default", "counted", (), {}, {}), delay=100)

        # Then the exporter counts them
        def scraped_total() -> float:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    text = response.read().decode()
            except OSError:
                return 0.0
            for line in text.splitlines():
                if line.startswith("dramatiq_messages_total{") and 'actor_name="counted"' in line:
                    return float(line.rsplit(" ", 1)[1])
            return 0.0

        assert wait_for(lambda: scraped_total() == 3.0, timeout=30, interval=0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr.decode()[-2000:]


@pytest.mark.parametrize("delay", [200.5, -5])
def test_retry_with_a_fractional_or_negative_delay_is_retried_not_lost(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, delay: float
) -> None:
    # Retry(delay=...) comes from user code; the built-in broker accepts these
    @dramatiq.actor(max_retries=1)
    def retry_once() -> None:
        record(redis_client)
        if len(records(redis_client)) == 1:
            raise dramatiq.Retry(delay=delay)  # type: ignore[arg-type]

    retry_once.send()
    broker.join("default", timeout=5_000)
    worker.join()
    assert len(records(redis_client)) == 2


def test_retry_with_an_impossible_delay_ends_in_dead_letters(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(max_retries=1)
    def retry_nan() -> None:
        raise dramatiq.Retry(delay=float("nan"))  # type: ignore[arg-type]

    message = retry_nan.send()
    broker.join("default", timeout=5_000)
    worker.join()
    assert redis_client.zscore("dramatiq:default.XQ", message.options["redis_message_id"]) is not None
