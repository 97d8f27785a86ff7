"""fetch.lua: take up to N messages off the head of a ready queue into the worker's ack set,
recording who fetched each one and when, beat the worker's heartbeat, and keep the consumer's
entry in the idle registry (slots left after a short fetch); a paused queue hands out
nothing."""

from __future__ import annotations

from collections.abc import Callable

import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua

CLOCK = 1_700_000_000_000


def fetch_keys(keys: QueueKeys, worker_id: str = "w1") -> list[str]:
    return [
        keys.ready,
        keys.ready_msgs,
        keys.acks(worker_id),
        keys.heartbeats,
        keys.idle,
        keys.paused,
        keys.fetched,
    ]


def queue(client: redis.Redis, keys: QueueKeys, *ids: str) -> None:
    client.rpush(keys.ready, *ids)
    client.hset(keys.ready_msgs, mapping={i: f"data-{i}".encode() for i in ids})


def test_fetch_takes_the_oldest_messages_into_the_ack_set_with_their_records(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    queue(redis_client, keys, "m1", "m2", "m3")

    reply = lua("fetch")(keys=fetch_keys(keys), args=[2, "w1", "tok", "1", "w1|tok", CLOCK])

    assert reply == [b"m1", b"data-m1", b"m2", b"data-m2", b"more"]  # m3 waits
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m3"]
    assert redis_client.smembers(keys.acks("w1")) == {b"m1", b"m2"}
    record = f"{CLOCK}|w1|tok".encode()
    assert redis_client.hgetall(keys.fetched) == {b"m1": record, b"m2": record}
    assert redis_client.zrange(keys.heartbeats, 0, -1, withscores=True) == [(b"w1", CLOCK)]
    # The payloads stay (the ack deletes them).
    assert redis_client.hlen(keys.ready_msgs) == 3


def test_fetch_that_fills_every_slot_lists_the_consumer_as_busy(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # Listed at 0: wake-ups pass it over, and the ack that frees a thread raises it again
    # (ack.lua) without another fetch.
    queue(redis_client, keys, "m1", "m2")
    redis_client.zadd(keys.idle, {"tok": 2, "other": 3})

    lua("fetch")(keys=fetch_keys(keys), args=[2, "w1", "tok", "1", "w1|tok", CLOCK])

    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"tok", 0.0), (b"other", 3.0)]


def test_short_fetch_registers_the_consumer_as_idle_with_the_slots_left(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    queue(redis_client, keys, "m1")

    reply = lua("fetch")(keys=fetch_keys(keys), args=[4, "w1", "tok", "1", "w1|tok", CLOCK])

    assert reply == [b"m1", b"data-m1"]
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"tok", 3.0)]
    assert not redis_client.exists(keys.ready)


def test_fetch_from_an_empty_queue_returns_nothing_and_registers_every_slot_idle(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    reply = lua("fetch")(keys=fetch_keys(keys), args=[4, "w1", "tok", "0", "w1|tok", CLOCK])

    assert reply == []
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"tok", 4.0)]
    # Beat "0": the idle poll wrote nothing else.
    assert sorted(redis_client.keys("*")) == [keys.idle.encode()]


def test_fetch_without_a_token_leaves_the_idle_registry_alone(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    queue(redis_client, keys, "m1")
    redis_client.zadd(keys.idle, {"tok": 7})

    reply = lua("fetch")(keys=fetch_keys(keys), args=[4, "w1", "", "0", "w1|", CLOCK])

    assert reply == [b"m1", b"data-m1"]
    assert redis_client.zrange(keys.idle, 0, -1, withscores=True) == [(b"tok", 7.0)]
    assert redis_client.hget(keys.fetched, "m1") == f"{CLOCK}|w1|".encode()


def test_fetch_with_beat_zero_leaves_the_heartbeat_alone_but_stamps_the_records(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    queue(redis_client, keys, "m1")
    redis_client.zadd(keys.heartbeats, {"w1": 5})

    lua("fetch")(keys=fetch_keys(keys), args=[1, "w1", "tok", "0", "w1|tok", CLOCK])

    assert redis_client.zscore(keys.heartbeats, "w1") == 5
    assert redis_client.hget(keys.fetched, "m1") == f"{CLOCK}|w1|tok".encode()


def test_fetch_without_a_clock_estimate_uses_the_server_clock(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    queue(redis_client, keys, "m1", "m2")
    fetch = lua("fetch")

    before = server_ms()
    fetch(keys=fetch_keys(keys), args=[1, "w1", "tok", "1", "w1|tok", ""])
    fetch(keys=fetch_keys(keys), args=[1, "w1", "tok", "0", "w1|tok"])  # ARGV[6] absent
    after = server_ms()

    beat = redis_client.zscore(keys.heartbeats, "w1")
    assert beat is not None and before <= beat <= after
    for member in (b"m1", b"m2"):
        at, who, token = redis_client.hget(keys.fetched, member).split(b"|")
        assert before <= int(at) <= after
        assert (who, token) == (b"w1", b"tok")


def test_fetch_of_an_id_without_a_message_returns_false_and_does_not_hold_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    queue(redis_client, keys, "m2")
    redis_client.lpush(keys.ready, "lost")  # an id whose payload is gone

    reply = lua("fetch")(keys=fetch_keys(keys), args=[2, "w1", "tok", "1", "w1|tok", CLOCK])

    assert reply == [b"lost", None, b"m2", b"data-m2"]
    assert redis_client.smembers(keys.acks("w1")) == {b"m2"}
    assert list(redis_client.hgetall(keys.fetched)) == [b"m2"]
    assert not redis_client.exists(keys.ready)


def test_fetch_from_a_paused_queue_takes_nothing_and_leaves_the_idle_registry(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    queue(redis_client, keys, "m1")
    redis_client.set(keys.paused, CLOCK)
    redis_client.zadd(keys.idle, {"tok": 4, "other": 1})

    reply = lua("fetch")(keys=fetch_keys(keys), args=[4, "w1", "tok", "1", "w1|tok", CLOCK])

    assert reply is None
    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1"]
    assert not redis_client.exists(keys.acks("w1"), keys.fetched)
    assert redis_client.zrange(keys.idle, 0, -1) == [b"other"]
    assert redis_client.zscore(keys.heartbeats, "w1") == CLOCK  # the beat still counts


def test_fetch_that_took_all_it_asked_for_says_when_more_wait(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    queue(redis_client, keys, "m1", "m2", "m3")
    reply = lua("fetch")(keys=fetch_keys(keys), args=[2, "w1", "", "1", "w1|tok", CLOCK])
    assert reply[-1] == b"more" and len(reply) == 5
    reply = lua("fetch")(keys=fetch_keys(keys), args=[1, "w1", "", "1", "w1|tok", CLOCK])
    assert len(reply) == 2  # the last one: nothing more
