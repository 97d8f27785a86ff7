"""Bad input gets a clear error and writes nothing; bad entries never stop a consumer."""

from __future__ import annotations

import math
from datetime import timedelta

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker

from dramatiq_redisson import MAX_DELAY, RedissonBroker, validate_delay

from .helpers import records, server_ms, wait_for


@pytest.mark.parametrize(
    ("delay", "error"),
    [
        (-1, ValueError),
        (math.nan, ValueError),
        (math.inf, ValueError),
        (1.5, ValueError),
        (MAX_DELAY + 1, ValueError),
        (10**30, ValueError),
        ("1000", TypeError),
        (True, TypeError),
        ([1], TypeError),
        (timedelta(milliseconds=-5), ValueError),
    ],
)
def test_enqueue_rejects_bad_delays_before_writing_anything(
    broker: RedissonBroker, redis_client: redis.Redis, delay: object, error: type[Exception]
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    with pytest.raises(error):
        noop.send_with_options(delay=delay)
    with pytest.raises(error):
        broker.enqueue_many([noop.message(), noop.message()], delay=delay)  # type: ignore[arg-type]
    assert redis_client.dbsize() == 0


def test_validate_delay_accepts_ints_integral_floats_and_timedeltas() -> None:
    assert validate_delay(None) is None
    assert validate_delay(0) == 0
    assert validate_delay(1500.0) == 1500
    assert validate_delay(timedelta(seconds=2)) == 2000
    assert validate_delay(MAX_DELAY) == MAX_DELAY


def test_scheduled_entry_without_a_message_goes_to_dead_letters_and_the_queue_keeps_moving(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    # Given a broken entry (a member with no payload, and a malformed member) due first
    now = server_ms(redis_client)
    redis_client.zadd("redisson_delay_queue_timeout:{dramatiq:default}", {"0" * 16 + "ghost": now, "junk": now})
    redis_client.publish("redisson_delay_queue_channel:{dramatiq:default}", now)
    # When a good message is due right after
    stamp.send_with_options(args=(1,), delay=200)
    # Then the good one runs and the broken ones are dead letters
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
    assert set(redis_client.zrange("dramatiq:default.XQ", 0, -1)) == {b"0" * 16 + b"ghost", b"junk"}
    assert all(t.is_alive() for t in worker.consumers.values())


def test_undecodable_ready_message_goes_to_dead_letters_without_crashing_the_consumer(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    redis_client.hset("dramatiq:default.msgs", "bad", b"\x00not json")
    redis_client.rpush("dramatiq:default", "bad")
    stamp.send(1)
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
    assert wait_for(lambda: redis_client.zscore("dramatiq:default.XQ", "bad") is not None, timeout=5)
    assert redis_client.hget("dramatiq:default.XQ.msgs", "bad") == b"\x00not json"
    assert all(t.is_alive() for t in worker.consumers.values())


def test_undecodable_scheduled_message_goes_to_dead_letters(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis
) -> None:
    # A payload that decodes as nothing Dramatiq knows, moved to the ready queue,
    # is dead-lettered by the consumer that fetches it.
    broker.declare_queue("default")
    sort_key = "0" * 16
    now = server_ms(redis_client)
    redis_client.zadd("redisson_delay_queue_timeout:{dramatiq:default}", {sort_key + "m1": now})
    redis_client.hset("redisson_delay_queue_msgs:{dramatiq:default}", "m1", sort_key.encode() + b"{broken")
    redis_client.publish("redisson_delay_queue_channel:{dramatiq:default}", now)
    assert wait_for(lambda: redis_client.zscore("dramatiq:default.XQ", sort_key + "m1") is not None, timeout=5)
    assert redis_client.hget("dramatiq:default.XQ.msgs", sort_key + "m1") == b"{broken"
    assert all(t.is_alive() for t in worker.consumers.values())


def test_malformed_announcement_is_ignored(
    broker: RedissonBroker, worker: Worker, redis_client: redis.Redis, stamp: Actor[[int | None], None]
) -> None:
    redis_client.publish("redisson_delay_queue_channel:{dramatiq:default}", "not-a-number")
    stamp.send_with_options(delay=100)
    assert wait_for(lambda: len(records(redis_client)) == 1, timeout=5)
