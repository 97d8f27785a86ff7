"""Delivery after a server restart: how soon, after the server accepts connections again,
immediate and delayed messages run (measured and printed; the assertion only bounds it
far above, since these machines are noisy)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
import redis
from dramatiq import Worker

from dramatiq_redisson import RedissonBroker
from dramatiq_redisson.connection._client import Probe
from dramatiq_redisson.embedded import redis_url as embedded_url
from tests.harness.faults.procs import ValkeyProcess
from tests.helpers import records, wait_for

#: Loading slowed to 100 µs per key (a server-side test setting): with the ballast of
#: :func:`test_delivery_resumes_soon_after_a_server_restart`'s ``loading`` case, the
#: restarted server answers LOADING for about a second before it serves.
SLOW_LOAD = {"key-load-delay": "100"}


@pytest.fixture
def restartable(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ValkeyProcess]:
    extra = SLOW_LOAD if "loading" in request.node.name else {}
    server = ValkeyProcess("restarted", tmp_path / "server", {"appendonly": "yes", "appendfsync": "always", **extra})
    server.start()
    try:
        yield server
    finally:
        if server.pid is not None:
            server.signal(signal.SIGKILL)
            server.wait_exit()


@pytest.mark.parametrize("made_by", ["url", "client", "url-loading"])
def test_delivery_resumes_soon_after_a_server_restart(
    restartable: ValkeyProcess, redis_client: redis.Redis, made_by: str
) -> None:
    """``url``: the broker's own client (redis-py does not retry a URL client's calls);
    ``client``: ``redis.Redis(host=…, port=…)`` passed in, whose calls redis-py retries
    with pauses of up to 1 s (its default ``Retry``), which the consumer cannot shorten;
    ``url-loading``: the restarted server loads its data for about a second first,
    answering LOADING meanwhile (the consumers ask again every 50 ms, not after a
    back-off)."""
    if made_by == "url-loading":
        admin = redis.Redis(host="127.0.0.1", port=restartable.port)
        with admin.pipeline(transaction=False) as pipe:
            for i in range(10_000):
                pipe.set(f"ballast:{i}", "x")
            pipe.execute()
        admin.bgrewriteaof()  # the keys go to the AOF's base file, loaded key by key
        assert wait_for(lambda: admin.info("persistence")["aof_rewrite_in_progress"] == 0, timeout=20)
        admin.close()
    if made_by.startswith("url"):
        broker = RedissonBroker(url=restartable.url)
    else:
        broker = RedissonBroker(client=redis.Redis(host="127.0.0.1", port=restartable.port))
    dramatiq.set_broker(broker)

    @dramatiq.actor(max_retries=0)
    def stamp(i: int) -> None:
        from tests.helpers import record

        record(redis_client, i=i)

    worker = Worker(broker, worker_timeout=100, worker_threads=2)
    worker.start()
    producer = RedissonBroker(url=restartable.url)
    try:
        stamp.send(0)
        assert wait_for(lambda: len(records(redis_client)) == 1, timeout=10)
        # When the server stops cleanly and comes back a second later
        restartable.signal(signal.SIGTERM)
        restartable.wait_exit()
        time.sleep(1.0)
        restartable.start()  # returns once it answers PING
        accepting_ms = time.time() * 1000
        # Then an immediate and a delayed (100 ms) message sent right away run soon
        producer.enqueue(stamp.message(1))
        producer.enqueue(stamp.message(2), delay=100)
        assert wait_for(lambda: len(records(redis_client)) == 3, timeout=20)
    finally:
        worker.stop()
        broker.close()
        producer.close()
    runs = {r["i"]: r["at_ms"] for r in records(redis_client)}
    immediate, delayed = runs[1] - accepting_ms, runs[2] - accepting_ms - 100
    print(f"\n{made_by}: after the restart: immediate ran {immediate:.0f} ms after accepting, ", end="")
    print(f"delayed {delayed:.0f} ms late")
    assert immediate < 15_000 and delayed < 15_000
    # How soon is printed, not asserted: a timed bound here (700 ms for url-loading) failed
    # CI at 1.6 s with other tests beside it (25 ms alone). That a LOADING reply is asked
    # again within PROBE_INTERVAL rather than backed off is tested in test_backoff.py.


def test_the_probe_tells_a_refusing_server_from_an_accepting_one(restartable: ValkeyProcess) -> None:
    client = redis.Redis.from_url(restartable.url)
    probe = Probe(client)
    assert probe.address == ("127.0.0.1", restartable.port)
    assert probe.accepting() is True
    restartable.signal(signal.SIGTERM)
    restartable.wait_exit()
    assert probe.accepting() is False
    restartable.start()
    assert probe.accepting() is True
    client.close()
    # A client whose server cannot be told (a unix socket path aside: Sentinel, a custom
    # connection class) is never probed
    assert Probe(redis.Redis(connection_pool=redis.ConnectionPool(connection_class=_Custom))).accepting() is None


class _Custom(redis.Connection):
    pass


def test_a_loading_server_is_asked_again_soon_not_after_a_back_off(broker: RedissonBroker) -> None:
    """A server that answers LOADING is back: the consumer asks again within the probe
    interval, whatever its back-off has grown to; a lost connection to a server that
    still accepts connections waits the back-off."""
    consumer = broker.consume("default")
    try:
        consumer.failures.calls.attempts = 6  # a back-off of seconds by now
        began = time.monotonic()
        consumer._failed(redis.BusyLoadingError("Valkey is loading the dataset in memory"))
        assert time.monotonic() - began < 0.3
        consumer.failures.calls.attempts = 6
        began = time.monotonic()
        consumer._failed(redis.ConnectionError("Connection reset by peer"))
        assert time.monotonic() - began >= 0.5
    finally:
        consumer.close()


def test_an_ack_refused_by_a_restarting_server_goes_through_as_soon_as_it_is_back(
    restartable: ValkeyProcess,
) -> None:
    """Dramatiq retries a failed ack every 5 s, sleeping in the worker thread itself (the
    full-size fault suite saw the messages queued behind such threads run 5 s after a
    crash, 3.9 s after the server was back). The consumer retries every 100 ms instead."""
    broker = RedissonBroker(url=restartable.url)
    dramatiq.set_broker(broker)

    @dramatiq.actor
    def work() -> None: ...

    consumer = broker.consume("default", prefetch=1, timeout=100)
    try:
        work.send()
        message = None
        deadline = time.monotonic() + 10
        while message is None and time.monotonic() < deadline:
            message = next(consumer)
        assert message is not None
        # Given the server gone when the message is acked, and back 1 s later
        restartable.signal(signal.SIGTERM)
        restartable.wait_exit()
        restart = threading.Timer(1.0, restartable.start)
        restart.start()
        began = time.monotonic()
        # When the worker thread acks
        consumer.ack(message)
        took = time.monotonic() - began
        restart.join()
        # Then the ack went through soon after the server came back (not 5 s later, and
        # without raising to Dramatiq), and nothing is left in flight
        print(f"\nack went through {took:.2f} s after it was first tried (server away ~1 s + its start)")
        assert took < 4.0
        assert broker.pending("default") == 0
        assert broker.client.scard(broker.keys("default").acks(broker.broker_id)) == 0
    finally:
        consumer.close()
        broker.close()


def test_a_subscription_the_server_does_not_list_is_made_again_there_within_seconds(
    broker: RedissonBroker, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A subscription can be lost with no error on its connection: after a failover it may
    sit on a node that is no longer the primary, where no announcement arrives. The
    consumer asks its server every second; missing twice in a row, it subscribes again."""
    consumer = broker.consume("default", timeout=100)
    duty = consumer.duty.subscription  # its pub/sub
    keys = broker.keys("default")

    def listed() -> dict[str, int]:
        return dict(redis_client.pubsub_numsub(duty.wake_channel, keys.channel))  # type: ignore[arg-type]

    try:
        # Given a consumer subscribed to its wake channel and, holding the lease, to the
        # queue's channel
        assert wait_for(lambda: next(consumer) is None and duty.wake_ready and duty.announcements, timeout=10)
        assert listed() == {duty.wake_channel.encode(): 1, keys.channel.encode(): 1}
        # When its subscription moves, unnoticed, to another server
        with embedded_url() as other_url:
            other = redis.Redis.from_url(other_url)
            elsewhere = other.pubsub()
            elsewhere.subscribe(duty.wake_channel, keys.channel)
            duty.pubsub.close()
            duty.pubsub = elsewhere
            assert wait_for(lambda: listed() == {duty.wake_channel.encode(): 0, keys.channel.encode(): 0})
            caplog.set_level(logging.WARNING)
            began = time.monotonic()
            # Then within about two checks it is made again on the consumer's server
            assert wait_for(
                lambda: next(consumer) is None and duty.pubsub is not elsewhere and duty.announcements, timeout=5
            )
            assert wait_for(
                lambda: (
                    next(consumer) is None and listed() == {duty.wake_channel.encode(): 1, keys.channel.encode(): 1}
                ),
                timeout=5,
            )
            assert time.monotonic() - began < 4.0
            elsewhere.close()
            other.close()
        assert [r for r in caplog.records if "lists no subscription" in r.getMessage()]
    finally:
        consumer.close()
