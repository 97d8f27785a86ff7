"""enqueue.lua: push (redis message id, encoded message) pairs on a ready queue, each id at
most once (skipped when already queued or in flight, recorded within the dedupe window, or
repeated in the call), optionally dropping an in-flight copy first, and wake idle consumers
for the ids pushed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .pubsub import listening
from .state import Lua


def enqueue_keys(keys: QueueKeys) -> list[str]:
    return [keys.ready, keys.ready_msgs, keys.channel, keys.sent, keys.idle]


def test_enqueue_pushes_new_ids_in_order_with_their_payloads(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    reply = lua("enqueue")(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"one", "m2", b"two"])

    assert reply == [2, 2, 0]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1", b"m2"]
    assert redis_client.hgetall(keys.ready_msgs) == {b"m1": b"one", b"m2": b"two"}
    assert not redis_client.exists(keys.sent)  # no window: nothing recorded


def test_enqueue_appends_after_what_is_queued_and_returns_the_new_length(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.rpush(keys.ready, "m0")
    redis_client.hset(keys.ready_msgs, "m0", b"zero")

    reply = lua("enqueue")(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"one"])

    assert reply == [2, 1, 0]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m0", b"m1"]


def test_enqueue_of_an_id_already_queued_or_in_flight_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    enqueue = lua("enqueue")
    enqueue(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"one"])
    redis_client.hset(keys.ready_msgs, "m2", b"in flight")  # fetched: in the hash, not in the list

    reply = enqueue(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"changed", "m2", b"changed"])

    assert reply == [1, 0, 0]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1"]
    assert redis_client.hgetall(keys.ready_msgs) == {b"m1": b"one", b"m2": b"in flight"}


def test_enqueue_of_an_id_repeated_in_one_call_pushes_it_once_with_its_first_payload(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    reply = lua("enqueue")(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"first", "m1", b"second"])

    assert reply == [1, 1, 0]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1"]
    assert redis_client.hget(keys.ready_msgs, "m1") == b"first"


def test_enqueue_with_a_window_and_a_clock_estimate_records_the_ids_at_that_time(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    clock = server_ms()
    reply = lua("enqueue")(keys=enqueue_keys(keys), args=[60_000, "", clock, "m1", b"one", "m2", b"two"])

    assert reply == [2, 2, 0]  # the estimate was taken: no TIME read
    assert redis_client.zrange(keys.sent, 0, -1, withscores=True) == [(b"m1", clock), (b"m2", clock)]
    assert 59_000 < redis_client.pttl(keys.sent) <= 60_000


def test_enqueue_with_a_window_and_no_estimate_reads_the_server_clock_and_returns_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    before = server_ms()
    length, pushed, read_ms = lua("enqueue")(keys=enqueue_keys(keys), args=[60_000, "", "", "m1", b"one"])
    after = server_ms()

    assert (length, pushed) == (1, 1)
    assert before <= read_ms <= after
    assert redis_client.zscore(keys.sent, "m1") == read_ms


def test_enqueue_skips_an_id_recorded_within_the_window_even_after_its_ack(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    clock, window = 1_700_000_000_001, 1000
    # m1 was enqueued and acked (its payload is gone); m_edge exactly a window ago; m_old before.
    redis_client.zadd(keys.sent, {"m1": clock - 500, "m_edge": clock - window, "m_old": clock - window - 1})

    reply = lua("enqueue")(
        keys=enqueue_keys(keys),
        args=[window, "", clock, "m1", b"again", "m_edge", b"again", "m_old", b"again"],
    )

    assert reply == [1, 1, 0]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m_old"]
    assert redis_client.hgetall(keys.ready_msgs) == {b"m_old": b"again"}
    assert redis_client.zscore(keys.sent, "m_old") == clock  # recorded again, at this call's time
    assert redis_client.zscore(keys.sent, "m1") == clock - 500


@pytest.mark.parametrize(("clock", "trimmed"), [(1_700_000_000_000, True), (1_700_000_000_003, False)])
def test_enqueue_trims_records_older_than_the_window_on_one_millisecond_in_eight(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, clock: int, trimmed: bool
) -> None:
    assert (clock % 8 == 0) is trimmed
    window = 1000
    redis_client.zadd(keys.sent, {"stale": clock - window - 1, "recent": clock - window})

    lua("enqueue")(keys=enqueue_keys(keys), args=[window, "", clock, "m1", b"one"])

    expected = {b"recent", b"m1"} | (set() if trimmed else {b"stale"})
    assert set(redis_client.zrange(keys.sent, 0, -1)) == expected


def test_enqueue_of_a_retry_drops_its_in_flight_copy_first(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.ready_msgs, "old", b"in flight")

    reply = lua("enqueue")(keys=enqueue_keys(keys), args=[0, "old", "", "new", b"retry"])

    assert reply == [1, 1, 0]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"new"]
    assert redis_client.hgetall(keys.ready_msgs) == {b"new": b"retry"}


def test_enqueue_of_a_retry_whose_ids_are_all_duplicates_keeps_the_in_flight_copy(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.ready_msgs, mapping={"old": b"in flight", "new": b"queued"})
    redis_client.rpush(keys.ready, "new")

    reply = lua("enqueue")(keys=enqueue_keys(keys), args=[0, "old", "", "new", b"retry"])

    assert reply == [1, 0, 0]
    assert redis_client.hgetall(keys.ready_msgs) == {b"old": b"in flight", b"new": b"queued"}


def test_enqueue_onto_a_payload_hash_of_the_wrong_type_fails_with_nothing_written(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.set(keys.ready_msgs, "not a hash")

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        lua("enqueue")(keys=enqueue_keys(keys), args=[60_000, "", server_ms(), "m1", b"one"])

    assert sorted(redis_client.keys("*")) == [keys.ready_msgs.encode()]
    assert redis_client.get(keys.ready_msgs) == b"not a hash"


def test_enqueue_onto_a_ready_queue_of_the_wrong_type_takes_its_payloads_back(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.set(keys.ready, "not a list")

    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        lua("enqueue")(keys=enqueue_keys(keys), args=[60_000, "", server_ms(), "m1", b"one", "m2", b"two"])

    assert sorted(redis_client.keys("*")) == [keys.ready.encode()]


def test_enqueue_wakes_the_idle_consumer_with_the_most_free_slots_only(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.idle, {"small": 1, "big": 5})

    with listening(redis_client, keys.wake_channel("small"), keys.wake_channel("big")) as received:
        lua("enqueue")(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"one", "m2", b"two"])
        assert received() == [(keys.wake_channel("big"), b"0")]

    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"small", 1.0)]


def test_enqueue_wakes_consumers_until_their_slots_cover_the_ids_pushed(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.idle, {"a": 1, "b": 1, "c": 1})

    with listening(redis_client, *(keys.wake_channel(t) for t in "abc")) as received:
        lua("enqueue")(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"one", "m2", b"two"])
        woken = received()

    assert len(woken) == 2 and all(data == b"0" for _, data in woken)
    assert redis_client.zcard(keys.idle) == 1
    left = redis_client.zrange(keys.idle, 0, -1)[0].decode()
    assert keys.wake_channel(left) not in {channel for channel, _ in woken}


def test_enqueue_drops_an_idle_entry_nobody_listens_for_and_wakes_the_next(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.idle, {"gone": 9, "here": 1})

    with listening(redis_client, keys.wake_channel("here")) as received:
        lua("enqueue")(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"one"])
        assert received() == [(keys.wake_channel("here"), b"0")]

    assert not redis_client.exists(keys.idle)


def test_enqueue_of_duplicates_only_wakes_nobody(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    redis_client.hset(keys.ready_msgs, "m1", b"one")
    redis_client.zadd(keys.idle, {"a": 1})

    with listening(redis_client, keys.wake_channel("a")) as received:
        reply = lua("enqueue")(keys=enqueue_keys(keys), args=[0, "", "", "m1", b"one"])
        assert received() == []

    assert reply == [0, 0, 0]
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"a", 1.0)]
