"""Priorities and groups through the broker (flow control, issue 35; branch `flow`): with
``max_priority``, a ready message with a higher ``broker_priority`` starts first, FIFO within
one priority, delayed ones keep theirs when they come due, an actor can set a default; the
groups of one priority take turns; bad options raise and write nothing; without
``max_priority`` priorities are ignored, as on a RabbitMQ queue without ``x-max-priority``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Worker
from dramatiq.middleware import default_middleware

from dramatiq_redisson import RedissonBroker
from tests.helpers import record, records, wait_for


@pytest.fixture
def prio_broker(redis_url: str, redis_client: redis.Redis) -> Iterator[RedissonBroker]:
    broker = RedissonBroker(url=redis_url, middleware=[m() for m in default_middleware], max_priority=9)
    broker.safety_interval = 1000
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


def _one_at_a_time(broker: RedissonBroker) -> Worker:
    worker = Worker(broker, worker_timeout=100, worker_threads=1)
    worker.start()
    return worker


def _order(client: redis.Redis) -> list[Any]:
    return [r["i"] for r in records(client)]


def _recorder(client: redis.Redis, **options: Any) -> Callable[..., Any]:
    @dramatiq.actor(max_retries=0, **options)
    def job(i: Any) -> None:
        record(client, i=i)

    return job


def test_higher_priority_ready_messages_start_first_and_fifo_within_a_priority(
    prio_broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _recorder(redis_client)
    for n in range(6):
        job.send_with_options(args=(f"low-{n}",))
    for n in range(3):
        job.send_with_options(args=(f"high-{n}",), broker_priority=7)
    job.send_with_options(args=("top",), broker_priority=200)  # above max_priority: counts as 9
    worker = _one_at_a_time(prio_broker)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 10, timeout=10)
    finally:
        worker.stop()
    order = _order(redis_client)
    assert order[:4] == ["top", "high-0", "high-1", "high-2"], order
    assert order[4:] == [f"low-{n}" for n in range(6)], order


def test_delayed_messages_keep_their_priority_when_they_come_due(
    prio_broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _recorder(redis_client)
    for n in range(4):
        job.send_with_options(args=(f"low-{n}",), delay=500)
    job.send_with_options(args=("high",), delay=500, broker_priority=5)
    time.sleep(0.8)  # all due before a worker exists: the first fetch sees them all
    worker = _one_at_a_time(prio_broker)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 5, timeout=10)
    finally:
        worker.stop()
    assert _order(redis_client)[0] == "high"


def test_a_retry_keeps_its_priority_and_group(prio_broker: RedissonBroker, redis_client: redis.Redis) -> None:
    failed: set[str] = set()

    @dramatiq.actor(max_retries=1, min_backoff=200, max_backoff=200)
    def flaky(i: Any) -> None:
        if i == "high" and i not in failed:
            failed.add(i)
            raise RuntimeError("the first run fails")
        record(redis_client, i=i)
        time.sleep(0.05)

    # Given a high-priority message of a group that fails once, sent behind 30 low ones
    flaky.send_with_options(args=("high",), broker_priority=8, group_key="g")
    for n in range(30):
        flaky.send_with_options(args=(f"low-{n}",))
    worker = _one_at_a_time(prio_broker)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 31, timeout=20)
    finally:
        worker.stop()
    # Then its retry, due 200 ms later, ran before most of the low ones (a few were prefetched)
    order = _order(redis_client)
    assert "high" in order[:10], order
    assert failed == {"high"}


def test_an_actor_sets_a_default_priority_and_a_message_option_overrides_it(
    prio_broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    urgent = _recorder(redis_client, broker_priority=8)
    for n in range(3):
        urgent.send_with_options(args=(f"demoted-{n}",), broker_priority=0)
    urgent.send("default-8")
    worker = _one_at_a_time(prio_broker)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 4, timeout=10)
    finally:
        worker.stop()
    assert _order(redis_client)[0] == "default-8"


def test_the_groups_of_one_priority_take_turns(prio_broker: RedissonBroker, redis_client: redis.Redis) -> None:
    job = _recorder(redis_client)
    for n in range(30):
        job.send_with_options(args=(f"big-{n}",), group_key="tenant-big")
    for n in range(3):
        job.send_with_options(args=(f"small-{n}",), group_key="tenant-small")
    worker = _one_at_a_time(prio_broker)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 33, timeout=20)
    finally:
        worker.stop()
    order = _order(redis_client)
    last_small = max(order.index(f"small-{n}") for n in range(3))
    assert last_small < 8, order  # not behind the 30 of the other group
    assert [i for i in order if i.startswith("big")] == [f"big-{n}" for n in range(30)]  # FIFO in a group


def test_weighted_groups_take_as_many_messages_per_turn_as_their_weight(prio_broker: RedissonBroker) -> None:
    job = _recorder(prio_broker.client)
    prio_broker.declare_queue("default")
    assert prio_broker.limits.set_weights("default", {"gold": 3, "bronze": 1}) == {"gold": 3}
    assert prio_broker.limits.weights("default") == {"gold": 3}
    for n in range(12):
        for group in ("gold", "bronze"):
            job.send_with_options(args=(f"{group}-{n}",), group_key=group)
    # One message per fetch (prefetch 1): the order the fetches take them in
    consumer = prio_broker.consume("default", prefetch=1, timeout=100)
    taken = []
    try:
        while len(taken) < 12:
            message = next(consumer)
            if message is not None:
                taken.append(message.args[0].split("-")[0])
                consumer.ack(message)
    finally:
        consumer.close()
    assert taken == ["gold"] * 3 + ["bronze"] + ["gold"] * 3 + ["bronze"] + ["gold"] * 3 + ["bronze"]
    # Weights are replaced as a whole; {} or None: every group weighs 1 again
    assert prio_broker.limits.set_weights("default", {"bronze": 2}) == {"bronze": 2}
    assert prio_broker.limits.set_weights("default", None) == {}


@pytest.mark.parametrize(
    "weights",
    [{"gold": 0}, {"gold": 1001}, {"gold": 2.0}, {"gold": True}, {"": 2}, {"x" * 257: 2}, {7: 2}],
)
def test_a_bad_weight_or_group_raises_and_writes_nothing(
    prio_broker: RedissonBroker, redis_client: redis.Redis, weights: dict[Any, Any]
) -> None:
    prio_broker.declare_queue("default")
    before = redis_client.dbsize()
    with pytest.raises(ValueError, match="weight|group"):
        prio_broker.limits.set_weights("default", weights)
    with pytest.raises(ValueError, match="not a known queue"):
        prio_broker.limits.set_weights("nowhere", {"gold": 2})
    assert redis_client.dbsize() == before


@pytest.mark.parametrize(
    "options",
    [{"broker_priority": -1}, {"broker_priority": 1.5}, {"broker_priority": True}, {"group_key": ""}, {"group_key": 7}],
)
def test_a_bad_priority_or_group_raises_and_writes_nothing(
    prio_broker: RedissonBroker, redis_client: redis.Redis, options: dict[str, Any]
) -> None:
    job = _recorder(redis_client)
    before = redis_client.dbsize()
    with pytest.raises(ValueError, match="broker_priority|group_key"):
        job.send_with_options(args=(1,), **options)
    with pytest.raises(ValueError, match="broker_priority|group_key"):
        job.send_with_options(args=(1,), delay=1000, **options)
    assert redis_client.dbsize() == before


def test_without_max_priority_priorities_are_ignored_and_the_queue_stays_plain(
    broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _recorder(redis_client)
    job.send_with_options(args=("first",))
    job.send_with_options(args=("second",), broker_priority=9)
    assert redis_client.exists(broker.keys("default").flow) == 0
    worker = _one_at_a_time(broker)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 2, timeout=10)
    finally:
        worker.stop()
    assert _order(redis_client) == ["first", "second"]


@pytest.mark.parametrize("delay", [None, 300])
def test_enqueue_many_keeps_each_messages_priority_and_group(
    prio_broker: RedissonBroker, redis_client: redis.Redis, delay: int | None
) -> None:
    job = _recorder(redis_client)
    messages = [job.message_with_options(args=(f"low-{n}",)) for n in range(5)]
    messages += [job.message_with_options(args=("high",), broker_priority=4)]
    messages += [job.message_with_options(args=(f"g-{n}",), group_key="g") for n in range(2)]
    prio_broker.enqueue_many(messages, delay=delay)
    if delay:
        time.sleep(0.6)
    worker = _one_at_a_time(prio_broker)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 8, timeout=10)
    finally:
        worker.stop()
    order = _order(redis_client)
    assert order[0] == "high", order
    assert order.index("g-0") < order.index("low-2"), order  # the group takes turns with the plain lane


def test_stats_count_ready_messages_per_priority_and_the_lanes_waiting_and_list_the_groups(
    prio_broker: RedissonBroker, redis_client: redis.Redis
) -> None:
    job = _recorder(redis_client)
    # A plain queue: no breakdown
    job.send_with_options(args=("plain",))
    plain = prio_broker.stats("default")["queues"]["default"]
    assert (plain["ready"], plain["ready_by_priority"], plain["lanes_waiting"]) == (1, {}, 0)
    assert prio_broker.waiting_groups("default") == []
    # Given messages at three priorities, two groups at priority 0 and one at priority 5
    for n in range(3):
        job.send_with_options(args=(n,), broker_priority=7)
    for n in range(4):
        job.send_with_options(args=(n,), group_key="tenant-a")
    job.send_with_options(args=(0,), group_key="tenant-b")
    job.send_with_options(args=(0,), group_key="tenant-é}{", broker_priority=5)
    stats = prio_broker.stats("default")["queues"]["default"]
    assert stats["ready_by_priority"] == {7: 3, 5: 1, 0: 6}
    assert (stats["ready"], stats["in_flight"], stats["lanes_waiting"]) == (10, 0, 4)
    assert prio_broker.waiting_groups("default") == [
        {"priority": 7, "group": None, "ready": 3, "blocked": False, "until_ms": None},
        {"priority": 5, "group": "tenant-é}{", "ready": 1, "blocked": False, "until_ms": None},
        {"priority": 0, "group": "tenant-a", "ready": 4, "blocked": False, "until_ms": None},
        {"priority": 0, "group": "tenant-b", "ready": 1, "blocked": False, "until_ms": None},
    ]
    assert len(prio_broker.waiting_groups("default", limit=2)) == 2
    with pytest.raises(ValueError, match="limit"):
        prio_broker.waiting_groups("default", limit=0)
    # When a worker runs them all, every count goes back to 0
    worker = _one_at_a_time(prio_broker)
    try:
        assert wait_for(lambda: len(records(redis_client)) == 10, timeout=10)
        prio_broker.join("default", timeout=10_000)
    finally:
        worker.stop()
    done = prio_broker.stats("default")["queues"]["default"]
    assert (done["ready"], done["in_flight"], done["lanes_waiting"]) == (0, 0, 0)
    assert done["ready_by_priority"] == {}
    assert prio_broker.waiting_groups("default") == []
