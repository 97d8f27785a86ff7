"""The consumer stays up through faults: a lost subscription, lost fetch replies, server
errors and a full server. Each test uses the real server; the faults are real too
(killed connections, a paused server, maxmemory with noeviction)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.errors import ConnectionClosed, Retry
from dramatiq.middleware import Retries

from dramatiq_redisson import RedissonBroker, _producer
from dramatiq_redisson.embedded import redis_url as embedded_redis_url
from tests.helpers import fill_to_maxmemory, records, server_ms, wait_for


def _no_restart(worker: Worker, queue_name: str = "default") -> object:
    """The consumer object a worker's consumer thread runs (Dramatiq replaces it on a restart).
    The thread makes it after `worker.start()` returns, so this waits until there is one."""
    thread = worker.consumers[queue_name]
    assert wait_for(lambda: thread.consumer is not None, timeout=5), "the consumer thread made no consumer"
    return thread.consumer


def test_killing_the_subscription_repeatedly_delays_nothing_and_restarts_nothing(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    # Given a running worker whose pub/sub connections are killed every 100 ms
    assert wait_for(lambda: redis_client.pubsub_numsub(broker.keys("default").channel)[0][1] == 1)
    consumer = _no_restart(worker)
    stop = threading.Event()

    def kill_subscriptions() -> None:
        while not stop.wait(0.1):
            redis_client.client_kill_filter(_type="pubsub")

    killer = threading.Thread(target=kill_subscriptions, daemon=True)
    killer.start()
    try:
        # When delayed and immediate messages are sent meanwhile
        dues = {}
        for i in range(20):
            delay = 0 if i % 4 == 0 else 200 + 40 * i
            dues[i] = server_ms(redis_client) + delay
            stamp.send_with_options(args=(i,), delay=delay)
            time.sleep(0.05)
        assert wait_for(lambda: len(records(redis_client)) == 20, timeout=15)
    finally:
        stop.set()
        killer.join()
    # Then every message ran once, none early, none more than 1 s late
    runs = records(redis_client)
    assert Counter(r["i"] for r in runs) == Counter(range(20))
    lateness = [r["at_ms"] - dues[r["i"]] for r in runs]
    assert min(lateness) >= 0
    assert max(lateness) < 1000
    # And the consumer was never restarted (Dramatiq would have waited 3 s)
    assert _no_restart(worker) is consumer


@pytest.fixture
def own_server() -> Iterator[tuple[str, int]]:
    """A server of this test's own (embedded, whatever REDIS_URL says), so it can be paused:
    its URL and pid."""
    with embedded_redis_url(env_var="_DRAMATIQ_REDISSON_NEVER_SET") as url:
        client = redis.Redis.from_url(url)
        pid = int(client.info("server")["process_id"])
        client.close()
        try:
            yield url, pid
        finally:
            os.kill(pid, signal.SIGCONT)


def test_fetch_reply_lost_to_a_stopped_server_is_requeued_not_stranded(
    own_server: tuple[str, int], make_broker: object
) -> None:
    # Given an idle consumer whose socket timeout is shorter than a server stop, and
    # nothing else due (no transfer, housekeeping or maintenance in the next minute)
    url, pid = own_server
    broker = make_broker(url=f"{url}?socket_timeout=0.3", safety_interval=60_000, maintenance_interval=60_000)  # type: ignore[operator]
    dramatiq.set_broker(broker)

    @dramatiq.actor
    def work(i: int) -> None: ...

    consumer = broker.consume("default", prefetch=10, timeout=100)
    next(consumer)
    for i in range(10):
        work.send(i)
    # When the server stops (SIGSTOP) as the consumer fetches: the fetch runs when the
    # server continues, after the client gave up on its reply
    os.kill(pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (pid, signal.SIGCONT)).start()
    got: list[int] = []
    deadline = time.monotonic() + 10
    while len(got) < 10 and time.monotonic() < deadline:
        try:
            message = next(consumer)
        except ConnectionClosed:
            continue  # what Dramatiq does: go on with this worker's broker
        if message is not None:
            got.append(message.args[0])
            consumer.ack(message)
    consumer.close()
    # Then every message is handed out exactly once and nothing stays pending
    assert sorted(got) == list(range(10))
    assert broker.pending("default") == 0
    assert broker.client.scard(broker.keys("default").acks(broker.broker_id)) == 0


def test_ids_stranded_in_a_live_workers_ack_set_are_requeued(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    # Given a running worker (reconciling every safety interval: 1 s here)
    keys = broker.keys("default")
    assert wait_for(lambda: redis_client.pubsub_numsub(keys.channel)[0][1] == 1)
    worker.pause()
    for i in range(5):
        stamp.send(i)
    # When a fetch under the worker's id moves messages into its ack set and the reply is lost
    lost = broker.redisson_scripts.fetch(keys, broker.broker_id, 5)
    assert len(lost) == 5
    worker.resume()
    # Then they run, once each, and join() returns
    broker.join("default", timeout=10_000)
    assert sorted(r["i"] for r in records(redis_client)) == list(range(5))


def test_a_server_error_on_fetch_backs_off_without_restarting_the_consumer(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    # Given a ready queue key of the wrong type: every fetch fails with WRONGTYPE
    keys = broker.keys("default")
    consumer = _no_restart(worker)
    redis_client.set(keys.ready, "not a list")
    time.sleep(0.5)
    # When the key is fixed and a message is sent
    redis_client.delete(keys.ready)
    stamp.send(1)
    # Then it runs, on the same consumer
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
    assert _no_restart(worker) is consumer


def test_a_failing_transfer_backs_off_while_ready_messages_keep_running(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    # Given a delayed-queue ZSET of the wrong type: every transfer fails with WRONGTYPE
    keys = broker.keys("default")
    consumer = _no_restart(worker)
    scripts = broker.redisson_scripts
    transfer = scripts.transfer
    attempts: list[float] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        attempts.append(time.monotonic())
        return transfer(*args, **kwargs)

    scripts.transfer = counted  # type: ignore[method-assign]
    redis_client.set(keys.timeout_zset, "not a zset")
    # When ready messages are sent meanwhile
    started = time.monotonic()
    for i in range(5):
        stamp.send(i)
    # Then they run, on the same consumer, and the failing transfer is retried with
    # back-off (100, 200, 400 ms, ... up to 2 s, with jitter), not in a loop
    assert wait_for(lambda: len(records(redis_client)) == 5, timeout=5)
    time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
    assert 1 <= len(attempts) <= 8, attempts
    assert _no_restart(worker) is consumer
    redis_client.delete(keys.timeout_zset)


def test_heartbeat_runs_on_a_full_server(broker: RedissonBroker, redis_client: redis.Redis, full_server: None) -> None:
    # Given a full server
    fill_to_maxmemory(redis_client)
    keys = broker.keys("default")
    # When a busy worker (nothing to fetch or ack) beats its heartbeat
    written = broker.redisson_scripts.heartbeat(keys, broker.broker_id)
    # Then it goes through: the worker is not taken for dead and its messages not requeued
    assert redis_client.zscore(keys.heartbeats, broker.broker_id) == written


@pytest.fixture
def full_server(redis_client: redis.Redis) -> Iterator[None]:
    """Restores ``maxmemory`` (and the policy) whatever the test did."""
    policy = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    try:
        yield
    finally:
        redis_client.config_set("maxmemory", 0)
        redis_client.config_set("maxmemory-policy", policy)
        redis_client.delete(*[f"ballast:{i}" for i in range(4096)])


def test_a_full_server_keeps_draining_due_and_ready_messages(
    broker: RedissonBroker, redis_client: redis.Redis, make_worker: object, full_server: None
) -> None:
    ran: list[int] = []  # in-process: the full server would refuse records

    @dramatiq.actor(max_retries=0)
    def remember(i: int) -> None:
        ran.append(i)

    # Given ready and soon-due messages, then a server filled to its maxmemory limit
    for i in range(20):
        remember.send_with_options(args=(i,), delay=0 if i < 10 else 500)
    fill_to_maxmemory(redis_client)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        redis_client.set("one-more", b"x" * 65536)
    # When a worker starts on the full server
    worker = make_worker()  # type: ignore[operator]
    consumer = _no_restart(worker)
    # Then every message is moved, fetched, run and acked, and nothing stays pending
    assert wait_for(lambda: len(ran) == 20 and broker.pending("default") == 0, timeout=15)
    assert sorted(ran) == list(range(20))
    keys = broker.keys("default")
    assert redis_client.scard(keys.acks(broker.broker_id)) == 0
    assert redis_client.zcard(keys.xq) == 0
    assert _no_restart(worker) is consumer


@pytest.mark.parametrize("retry_time_ms", [30_000, 300], ids=["re-enqueued-when-back", "requeued-after-giving-up"])
def test_a_retry_scheduled_while_the_server_is_stopped_is_not_lost(
    own_server: tuple[str, int], make_broker: object, monkeypatch: pytest.MonkeyPatch, retry_time_ms: int
) -> None:
    # Given a worker on a server of our own, and an actor that fails once with a short retry
    monkeypatch.setattr(_producer, "REDELIVERY_RETRY_TIME", retry_time_ms)
    url, pid = own_server
    broker = make_broker(url=f"{url}?socket_timeout=0.5", middleware=[Retries()], safety_interval=1000)  # type: ignore[operator]
    dramatiq.set_broker(broker)
    runs: list[int] = []

    @dramatiq.actor(max_retries=1)
    def flaky() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            # When the server stops (1.5 s) just as the Retries middleware re-enqueues it:
            # either the re-enqueue is retried until the server is back, or (a shorter
            # retry time) the worker gives up and leaves the copy in flight unacked
            os.kill(pid, signal.SIGSTOP)
            threading.Timer(1.5, os.kill, (pid, signal.SIGCONT)).start()
            raise Retry(delay=200)

    flaky.send()
    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    try:
        # Then the message runs again, once, and nothing stays pending
        assert wait_for(lambda: len(runs) == 2, timeout=15)
        assert wait_for(lambda: broker.pending("default") == 0, timeout=5)
        time.sleep(0.5)
        assert runs == [0, 1]
    finally:
        worker.stop()
