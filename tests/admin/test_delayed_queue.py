"""broker.delayed_queue(): Redisson's RDelayedQueue operations."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker
from dramatiq.message import Message
from dramatiq.middleware import Retries

from dramatiq_redisson import RedissonBroker
from tests.helpers import record, records, wait_for


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


def test_get_returns_the_due_time_and_message_until_it_moves(
    broker: RedissonBroker,
    noop: dramatiq.Actor,  # type: ignore[type-arg]
    redis_client: redis.Redis,
) -> None:
    dq = broker.delayed_queue("dq")
    sent = noop.send_with_options(args=(5,), delay=60_000)
    found = dq.get(sent.message_id)
    assert found is not None
    due, message = found
    keys = broker.keys("dq")
    assert due == redis_client.zscore(keys.timeout_zset, sent.options["redis_message_id"]) == sent.options["eta"]
    assert (message.message_id, message.args, message.queue_name) == (sent.message_id, (5,), "dq")
    assert message.options["redis_message_id"] == sent.options["redis_message_id"]
    assert dq.get("unknown") is None
    assert dq.remove(sent.message_id) and dq.get(sent.message_id) is None


def test_reschedule_moves_the_due_time_on_the_server_clock_and_keeps_the_id(
    broker: RedissonBroker,
    noop: dramatiq.Actor,  # type: ignore[type-arg]
    redis_client: redis.Redis,
) -> None:
    import datetime

    from tests.helpers import server_ms

    dq = broker.delayed_queue("dq")
    first = noop.send_with_options(args=(1,), delay=60_000)
    second = noop.send_with_options(args=(2,), delay=120_000)
    # Later, by a delay from now (ms or timedelta)
    before = server_ms(redis_client)
    assert dq.reschedule(first.message_id, delay=datetime.timedelta(minutes=5))
    found = dq.get(first.message_id)
    assert found is not None and before + 300_000 <= found[0] <= server_ms(redis_client) + 300_000
    assert found[1].options["redis_message_id"] == first.options["redis_message_id"]
    assert [m.message_id for _, m in dq.read_all()] == [second.message_id, first.message_id]
    # At an absolute time (epoch ms or an aware datetime)
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    assert dq.reschedule(second.message_id, at=at)
    assert dq.get(second.message_id)[0] == int(at.timestamp() * 1000)  # type: ignore[index]
    assert dq.reschedule(second.message_id, at=before + 10_000)
    assert dq.next_due() == before + 10_000
    # Nothing to reschedule, and bad input changes nothing
    assert not dq.reschedule("unknown", delay=1000)
    for kwargs in ({}, {"delay": 1, "at": 1}):
        with pytest.raises(TypeError):
            dq.reschedule(first.message_id, **kwargs)
    with pytest.raises(ValueError):
        dq.reschedule(first.message_id, delay=float("nan"))
    with pytest.raises(ValueError, match="timezone-aware"):
        dq.reschedule(first.message_id, at=datetime.datetime.now())
    assert dq.get(second.message_id)[0] == before + 10_000  # type: ignore[index]


@pytest.fixture
def far_message(broker: RedissonBroker, redis_client: redis.Redis, worker: Worker) -> Message[Any]:
    """A message that records its run, scheduled 10 minutes ahead on a running worker
    whose transfer holder has settled on that due time."""

    @dramatiq.actor
    def stamp() -> None:
        record(redis_client, i=1)

    message = stamp.send_with_options(delay=600_000)
    time.sleep(0.2)  # the transfer holder now waits for the next safety check, not 10 minutes
    return message


def test_reschedule_to_earlier_is_announced_and_runs_on_time(
    broker: RedissonBroker, redis_client: redis.Redis, far_message: Message[Any]
) -> None:
    from tests.helpers import server_ms

    due = server_ms(redis_client) + 300
    assert broker.delayed_queue("default").reschedule(far_message.message_id, at=due)
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
    # at its new time, not early; not in an hour (how late is the benchmarks' to measure)
    assert due <= records(redis_client)[0]["at_ms"] <= due + 1000


def test_promote_runs_a_scheduled_message_now(
    broker: RedissonBroker, redis_client: redis.Redis, far_message: Message[Any]
) -> None:
    from tests.helpers import server_ms

    promoted_at = server_ms(redis_client)
    assert broker.delayed_queue("default").promote(far_message.message_id)
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
    assert records(redis_client)[0]["at_ms"] - promoted_at <= 1000  # now, not in an hour
    assert not broker.delayed_queue("default").promote(far_message.message_id)  # no longer scheduled


def test_count_and_overdue(broker: RedissonBroker, noop: dramatiq.Actor, redis_client: redis.Redis) -> None:  # type: ignore[type-arg]
    from tests.helpers import server_ms

    dq = broker.delayed_queue("dq")
    now = server_ms(redis_client)
    broker.enqueue_many([noop.message(i) for i in range(3)], delay=10_000)
    broker.enqueue_many([noop.message(i) for i in range(2)], delay=100_000)
    assert dq.count() == 5
    assert dq.count(due_before=now + 50_000) == 3
    assert dq.count(due_before=now) == 0
    # No consumer runs on "dq": a message past its due time stays, and is overdue
    assert dq.overdue() == 0
    stuck = noop.send_with_options(delay=1)
    time.sleep(0.05)
    assert dq.overdue(grace=0) == 1 and dq.overdue() == 0
    assert dq.get(stuck.message_id) is not None
    with pytest.raises(ValueError):
        dq.overdue(grace=-1)
    with pytest.raises(ValueError):
        dq.read_all(limit=-1)
