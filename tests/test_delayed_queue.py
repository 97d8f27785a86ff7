"""broker.delayed_queue(): Redisson's RDelayedQueue operations."""

from __future__ import annotations

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.middleware import Retries

from dramatiq_redisson import RedissonBroker

from .helpers import record, records, wait_for


@pytest.fixture
def noop(broker: RedissonBroker) -> dramatiq.Actor:  # type: ignore[type-arg]
    @dramatiq.actor(queue_name="dq")
    def noop(i: int = 0) -> None: ...

    return noop


def test_delayed_queue_size_contains_next_due_and_read_all(broker: RedissonBroker, noop: dramatiq.Actor) -> None:  # type: ignore[type-arg]
    dq = broker.delayed_queue("dq")
    assert dq.size() == 0 and dq.next_due() is None and dq.read_all() == []

    late = noop.send_with_options(args=(2,), delay=20_000)
    early = noop.send_with_options(args=(1,), delay=10_000)

    assert dq.size() == len(dq) == 2
    assert dq.contains(early.message_id) and early.message_id in dq
    assert not dq.contains("nope")
    entries = dq.read_all()
    assert [m.message_id for _, m in entries] == [early.message_id, late.message_id]
    assert entries[1][0] - entries[0][0] >= 9_000
    assert dq.next_due() == entries[0][0]
    assert [m.args for _, m in dq.read_all(limit=1)] == [(1,)]
    assert dq.read_all(limit=0) == []


def test_delayed_queue_remove_cancels_and_reports_whether_it_did(
    broker: RedissonBroker,
    noop: dramatiq.Actor,
    redis_client: redis.Redis,  # type: ignore[type-arg]
) -> None:
    dq = broker.delayed_queue("dq")
    message = noop.send_with_options(delay=10_000)
    other = noop.send_with_options(delay=10_000)

    assert dq.remove(message.message_id) is True
    assert dq.remove(message.message_id) is False
    assert dq.size() == 1 and not dq.contains(message.message_id) and dq.contains(other.message_id)
    assert (
        redis_client.zscore("redisson_delay_queue_timeout:{dramatiq:dq}", message.options["redis_message_id"]) is None
    )


def test_delayed_queue_removed_message_never_runs(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    cancelled = stamp.send_with_options(args=(1,), delay=300)
    stamp.send_with_options(args=(2,), delay=400)
    assert broker.delayed_queue("default").remove(cancelled.message_id)
    broker.join("default", timeout=5_000)
    worker.join()
    assert [r["i"] for r in records(redis_client)] == [2]


def test_delayed_queue_remove_cancels_a_pending_retry(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis
) -> None:
    @dramatiq.actor(max_retries=5, min_backoff=3_000, max_backoff=3_000)
    def flaky() -> None:
        record(redis_client)
        raise RuntimeError("fails")

    message = flaky.send()
    dq = broker.delayed_queue("default")
    # Once the first attempt failed, its retry is scheduled under the same message id
    assert wait_for(lambda: dq.contains(message.message_id), timeout=5)
    assert dq.remove(message.message_id)
    broker.join("default", timeout=5_000)
    worker.join()
    assert len(records(redis_client)) == 1
    assert any(isinstance(m, Retries) for m in broker.middleware)


def test_delayed_queue_clear_drops_everything_and_counts(
    broker: RedissonBroker,
    noop: dramatiq.Actor,
    redis_client: redis.Redis,  # type: ignore[type-arg]
) -> None:
    broker.enqueue_many([noop.message(i) for i in range(50)], delay=10_000)
    assert broker.delayed_queue("dq").clear() == 50
    assert broker.delayed_queue("dq").size() == 0
    assert not redis_client.exists(
        "redisson_delay_queue_timeout:{dramatiq:dq}",
        "redisson_delay_queue:{dramatiq:dq}",
        "redisson_delay_queue_msgs:{dramatiq:dq}",
    )
    assert broker.delayed_queue("dq").clear() == 0


def test_offering_a_scheduled_message_again_reschedules_it(
    broker: RedissonBroker,
    noop: dramatiq.Actor,  # type: ignore[type-arg]
) -> None:
    message = noop.message()
    broker.enqueue(message, delay=60_000)
    first_due = broker.delayed_queue("dq").next_due()
    broker.enqueue(message, delay=1_000)
    dq = broker.delayed_queue("dq")
    assert dq.size() == 1
    assert dq.next_due() < first_due  # type: ignore[operator]
