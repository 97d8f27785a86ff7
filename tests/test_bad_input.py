"""Bad input gets a clear error and writes nothing; bad entries never stop a consumer."""

from __future__ import annotations

import math
from datetime import timedelta

import dramatiq
import pytest
import redis
from dramatiq import Actor, Worker

from dramatiq_redisson import MAX_DELAY, RedissonBroker, validate_delay
from tests.helpers import records, server_ms, wait_for


@pytest.mark.parametrize(
    ("delay", "error"),
    [
        (math.nan, ValueError),
        (math.inf, ValueError),
        (-math.inf, ValueError),
        (MAX_DELAY + 1, ValueError),
        (MAX_DELAY + 0.5, ValueError),
        (10**30, ValueError),
        ("1000", TypeError),
        (True, TypeError),
        ([1], TypeError),
        (timedelta(days=4000), ValueError),
    ],
)
def test_enqueue_rejects_bad_delays_before_writing_anything(
    broker: RedissonBroker, redis_client: redis.Redis, delay: object, error: type[Exception]
) -> None:
    @dramatiq.actor
    def noop() -> None: ...

    declared = set(redis_client.keys("*"))  # the queue registry: the actor's queue was declared
    with pytest.raises(error):
        noop.send_with_options(delay=delay)
    with pytest.raises(error):
        broker.enqueue_many([noop.message(), noop.message()], delay=delay)  # type: ignore[arg-type]
    assert set(redis_client.keys("*")) == declared


def test_validate_delay_accepts_numbers_and_timedeltas() -> None:
    assert validate_delay(None) is None
    assert validate_delay(0) == 0
    assert validate_delay(1500.0) == 1500
    assert validate_delay(timedelta(seconds=2)) == 2000
    assert validate_delay(MAX_DELAY) == MAX_DELAY
    # A fractional delay rounds up (never earlier than asked)
    assert validate_delay(1.2) == 2
    assert validate_delay(0.001) == 1
    assert validate_delay(timedelta(microseconds=1500)) == 2
    # A negative delay means already due: now
    assert validate_delay(-1) == 0
    assert validate_delay(-0.5) == 0
    assert validate_delay(-(10**30)) == 0
    assert validate_delay(timedelta(milliseconds=-5)) == 0


def test_a_negative_delay_runs_now_and_a_fractional_one_rounds_up(
    broker: RedissonBroker, redis_client: redis.Redis, worker: Worker, stamp: Actor[[int | None], None]
) -> None:
    # Producer code computes delay = due - now; a due time in the past means "run it now"
    started = server_ms(redis_client)
    stamp.send_with_options(args=(1,), delay=-60_000)
    broker.enqueue_many([stamp.message(2), stamp.message(3)], delay=-5)
    assert wait_for(lambda: len(records(redis_client)) == 3, timeout=5)
    assert max(r["at_ms"] for r in records(redis_client)) - started < 500
    # A fractional delay is stored rounded up
    message = stamp.send_with_options(args=(4,), delay=60_000.2)
    due = broker.delayed_queue("default").get(message.message_id)
    assert due is not None and due[0] - message.options["eta"] == 0
    assert due[0] - server_ms(redis_client) > 60_000 - 100


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
    # The payload first: a transfer between the two writes must not find a bare member.
    redis_client.hset("redisson_delay_queue_msgs:{dramatiq:default}", "m1", sort_key.encode() + b"{broken")
    redis_client.zadd("redisson_delay_queue_timeout:{dramatiq:default}", {sort_key + "m1": now})
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
