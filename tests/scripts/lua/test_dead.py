"""dead.lua: requeue (to the tail of the ready queue, same id, the data it died with, waking
an idle consumer) or remove a queue's dead letters, by id or the oldest ``batch``; each id
leaves the dead letters in the same step, so it runs once per requeue."""

from __future__ import annotations

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .pubsub import listening
from .state import Lua


def dead_keys(keys: QueueKeys) -> list[str]:
    return [keys.xq, keys.xq_msgs, keys.ready, keys.ready_msgs, keys.idle, keys.channel]


def buried(client: redis.Redis, keys: QueueKeys, **died_at: int) -> None:
    """Dead letters ``id=time of death``, each with data ``dead-<id>``."""
    client.zadd(keys.xq, died_at)
    client.hset(keys.xq_msgs, mapping={i: f"dead-{i}".encode() for i in died_at})


def test_dead_requeue_by_id_moves_it_to_the_tail_of_the_ready_queue(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    buried(redis_client, keys, d1=100, d2=200)
    redis_client.rpush(keys.ready, "m0")
    redis_client.hset(keys.ready_msgs, "m0", b"zero")

    assert lua("dead")(keys=dead_keys(keys), args=["requeue", 10, "d2"]) == 1

    assert redis_client.lrange(keys.ready, 0, -1) == [b"m0", b"d2"]
    assert redis_client.hgetall(keys.ready_msgs) == {b"m0": b"zero", b"d2": b"dead-d2"}
    assert redis_client.zrange(keys.xq, 0, -1, withscores=True) == [(b"d1", 100.0)]
    assert redis_client.hgetall(keys.xq_msgs) == {b"d1": b"dead-d1"}


def test_dead_requeue_without_ids_takes_the_oldest_batch_in_order_of_death(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    buried(redis_client, keys, young=300, oldest=100, middle=200)

    assert lua("dead")(keys=dead_keys(keys), args=["requeue", 2]) == 2

    assert redis_client.lrange(keys.ready, 0, -1) == [b"oldest", b"middle"]
    assert redis_client.zrange(keys.xq, 0, -1) == [b"young"]


def test_dead_requeue_repeated_finds_the_id_gone_and_pushes_it_once(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    buried(redis_client, keys, d1=100)
    dead = lua("dead")

    assert dead(keys=dead_keys(keys), args=["requeue", 10, "d1"]) == 1
    assert dead(keys=dead_keys(keys), args=["requeue", 10, "d1"]) == 0

    assert redis_client.lrange(keys.ready, 0, -1) == [b"d1"]


def test_dead_requeue_of_an_id_already_queued_or_in_flight_only_drops_the_dead_letter(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    buried(redis_client, keys, d1=100)
    redis_client.hset(keys.ready_msgs, "d1", b"in flight")

    assert lua("dead")(keys=dead_keys(keys), args=["requeue", 10, "d1"]) == 1

    assert not redis_client.exists(keys.ready, keys.xq, keys.xq_msgs)
    assert redis_client.hgetall(keys.ready_msgs) == {b"d1": b"in flight"}


def test_dead_requeue_skips_ids_that_are_not_dead_letters(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    buried(redis_client, keys, d1=100)

    assert lua("dead")(keys=dead_keys(keys), args=["requeue", 10, "nope", "d1"]) == 1

    assert redis_client.lrange(keys.ready, 0, -1) == [b"d1"]
    assert not redis_client.hexists(keys.ready_msgs, "nope")


def test_dead_remove_by_id_and_by_batch_drops_the_dead_letters_only(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    buried(redis_client, keys, d1=100, d2=200, d3=300, d4=400)
    dead = lua("dead")

    assert dead(keys=dead_keys(keys), args=["remove", 10, "d3", "nope"]) == 1
    assert dead(keys=dead_keys(keys), args=["remove", 2]) == 2

    assert redis_client.zrange(keys.xq, 0, -1) == [b"d4"]
    assert redis_client.hgetall(keys.xq_msgs) == {b"d4": b"dead-d4"}
    assert not redis_client.exists(keys.ready, keys.ready_msgs)


def test_dead_with_no_dead_letters_returns_0_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    dead = lua("dead")
    assert dead(keys=dead_keys(keys), args=["requeue", 10]) == 0
    assert dead(keys=dead_keys(keys), args=["remove", 10, "d1"]) == 0
    assert redis_client.keys("*") == []


def test_dead_with_an_unknown_action_fails_with_nothing_written(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    buried(redis_client, keys, d1=100)

    with pytest.raises(redis.ResponseError, match="dead: unknown action purge"):
        lua("dead")(keys=dead_keys(keys), args=["purge", 10, "d1"])

    assert redis_client.zrange(keys.xq, 0, -1) == [b"d1"]
    assert redis_client.hgetall(keys.xq_msgs) == {b"d1": b"dead-d1"}
    assert not redis_client.exists(keys.ready, keys.ready_msgs)


def test_dead_requeue_wakes_an_idle_consumer_and_remove_wakes_none(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    buried(redis_client, keys, d1=100, d2=200)
    redis_client.zadd(keys.idle, {"a": 1, "b": 1})
    dead = lua("dead")

    with listening(redis_client, keys.wake_channel("a"), keys.wake_channel("b")) as received:
        dead(keys=dead_keys(keys), args=["remove", 10, "d2"])
        assert received() == []
        dead(keys=dead_keys(keys), args=["requeue", 10, "d1"])
        woken = received()

    assert len(woken) == 1 and woken[0][1] == b"0"
    assert redis_client.zcard(keys.idle) == 1
