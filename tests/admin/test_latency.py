"""Queue latency (issue 58): ``latency_ms`` in a queue's stats is how long its oldest ready
message has waited, on the server's clock, 0 when none is ready; the metric
``dramatiq_redisson_queue_latency_seconds`` exports it. Nothing consumes in these tests:
ready messages stay ready."""

from __future__ import annotations

import time
from collections.abc import Iterator

import dramatiq
import pytest
import redis
from dramatiq import Actor

from dramatiq_redisson import RedissonBroker
from tests.helpers import server_ms

#: How far the latency may be from the wait it measures (ms): the goal of issue 58.
WITHIN_MS = 50


@pytest.fixture
def job(broker: RedissonBroker) -> Iterator[Actor[..., None]]:
    @dramatiq.actor(queue_name="waits", max_retries=0)
    def waiting(n: int) -> None: ...

    yield waiting


def _latency(broker: RedissonBroker, queue_name: str = "waits") -> tuple[int, int]:
    """(the queue's latency, the server's clock when the stats were read), ms."""
    stats = broker.stats(queue_name)
    return stats["queues"][queue_name]["latency_ms"], stats["time_ms"]


def _transfer(broker: RedissonBroker, queue_name: str = "waits") -> int:
    """Move what is due to the ready queue, as a consumer's timer does (nobody fetches; its
    window: moved members are recorded for the broker's dedupe window)."""
    keys = broker.keys(queue_name)
    window = broker.settings.dedupe_window
    scripts = broker.redisson_scripts
    return scripts.transfer(keys, limit=1000, trim_budget=0, compact_step=0, compact_slack=0, window_ms=window).moved


def test_an_empty_queue_has_no_latency(broker: RedissonBroker, job: Actor[..., None]) -> None:
    job.send_with_options(args=(0,), delay=3_600_000)  # scheduled, not ready
    assert _latency(broker)[0] == 0


def test_the_latency_is_the_oldest_ready_message_s_wait_among_10000(
    broker: RedissonBroker, redis_client: redis.Redis, job: Actor[..., None]
) -> None:
    # Given 10 000 ready messages, the first enqueued at a known server time
    first = server_ms(redis_client)
    broker.enqueue_many([job.message(0)])
    broker.enqueue_many([job.message(n) for n in range(1, 10_000)])
    # When they have waited a while
    time.sleep(0.4)
    latency, now = _latency(broker)
    # Then the latency is the first one's wait (it became ready at or a moment after `first`)
    assert now - first - WITHIN_MS <= latency <= now - first, (latency, now - first)


def test_a_delayed_message_waits_from_its_move_not_from_its_send(
    broker: RedissonBroker, redis_client: redis.Redis, job: Actor[..., None]
) -> None:
    # Given a message delayed 300 ms, moved to the ready queue once due
    job.send_with_options(args=(1,), delay=300)
    time.sleep(0.35)
    moved_at = server_ms(redis_client)
    assert _transfer(broker) == 1
    # When it has been ready for 300 ms more
    time.sleep(0.3)
    latency, now = _latency(broker)
    # Then its latency counts from the move, not from the send (about 650 ms ago)
    assert now - moved_at - WITHIN_MS <= latency <= now - moved_at + WITHIN_MS, (latency, now - moved_at)


def test_a_delayed_message_moved_without_a_record_is_timed_from_its_send(
    broker: RedissonBroker, redis_client: redis.Redis, job: Actor[..., None]
) -> None:
    # Given a delayed message whose move was not recorded (no dedupe window: as one moved
    # longer than the window ago), ready for 200 ms after a delay of 300 ms
    sent = job.send_with_options(args=(1,), delay=300)
    time.sleep(0.3)
    keys = broker.keys("waits")
    assert broker.redisson_scripts.transfer(keys, limit=10, trim_budget=0, compact_step=0, compact_slack=0).moved == 1
    time.sleep(0.2)
    latency, now = _latency(broker)
    # Then it is timed from its send (its sort key: the producer's clock), an upper bound
    assert abs(latency - (now - sent.message_timestamp)) <= WITHIN_MS, (latency, now - sent.message_timestamp)


def test_prioritised_messages_in_lanes_count_too(
    broker: RedissonBroker, redis_client: redis.Redis, job: Actor[..., None]
) -> None:
    # Given messages in lanes (a priority, groups) and none in the plain ready list
    first = server_ms(redis_client)
    job.send_with_options(args=(1,), broker_priority=5, group_key="acme")
    time.sleep(0.2)
    job.send_with_options(args=(2,), broker_priority=9, group_key="zeta")
    time.sleep(0.2)
    latency, now = _latency(broker)
    # Then the oldest lane's head gives the latency
    assert now - first - WITHIN_MS <= latency <= now - first, (latency, now - first)


def test_without_a_dedupe_window_a_message_is_timed_from_its_send(redis_url: str, redis_client: redis.Redis) -> None:
    broker = RedissonBroker(url=redis_url, dedupe_window=0)
    try:

        @dramatiq.actor(broker=broker, queue_name="unrecorded")
        def unrecorded() -> None: ...

        sent = unrecorded.send()
        time.sleep(0.3)
        stats = broker.stats("unrecorded")
        latency = stats["queues"]["unrecorded"]["latency_ms"]
        # The producer's clock (this host's, as the server's here)
        assert abs(latency - (stats["time_ms"] - sent.message_timestamp)) <= WITHIN_MS, latency
    finally:
        broker.close()


def test_the_metric_exports_it_in_seconds(broker: RedissonBroker, job: Actor[..., None]) -> None:
    from prometheus_client.exposition import generate_latest

    from dramatiq_redisson import metrics

    job.send(1)
    time.sleep(0.2)
    registry = metrics.make_registry(broker)
    text = generate_latest(registry).decode()
    line = next(
        line
        for line in text.splitlines()
        if line.startswith('dramatiq_redisson_queue_latency_seconds{queue_name="waits"}')
    )
    exported = float(line.split()[-1])
    latency, _ = _latency(broker)
    assert 0.15 <= exported <= latency / 1000 + 0.05, (exported, latency)
