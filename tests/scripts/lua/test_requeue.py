"""requeue.lua: give a worker's fetched, unprocessed messages back to the head of the ready
queue, in the order they were fetched, only those this call removed from the ack set (never a
duplicate), dropping their fetch records and waking idle consumers for them."""

from __future__ import annotations

import redis

from dramatiq_redisson._keys import QueueKeys

from .pubsub import listening
from .state import Lua


def requeue_keys(keys: QueueKeys, worker_id: str = "w1") -> list[str]:
    return [keys.acks(worker_id), keys.ready_msgs, keys.ready, keys.idle, keys.channel, keys.fetched]


def fetched(client: redis.Redis, keys: QueueKeys, *ids: str, worker_id: str = "w1") -> None:
    """``ids`` as a fetch leaves them: in the ack set, with their payload and fetch record."""
    client.sadd(keys.acks(worker_id), *ids)
    client.hset(keys.ready_msgs, mapping={i: f"data-{i}".encode() for i in ids})
    client.hset(keys.fetched, mapping={i: f"1|{worker_id}|tok" for i in ids})


def test_requeue_puts_messages_back_at_the_head_in_fetch_order(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1", "m2", "m3")
    redis_client.rpush(keys.ready, "later")
    redis_client.hset(keys.ready_msgs, "later", b"data-later")

    assert lua("requeue")(keys=requeue_keys(keys), args=["m1", "m2"]) == 2

    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1", b"m2", b"later"]
    assert redis_client.smembers(keys.acks("w1")) == {b"m3"}
    assert list(redis_client.hgetall(keys.fetched)) == [b"m3"]
    assert redis_client.hget(keys.ready_msgs, "m1") == b"data-m1"  # payloads stay


def test_requeue_leaves_an_id_no_longer_in_the_ack_set_alone(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1")
    redis_client.hset(keys.ready_msgs, "acked", b"other copy")  # e.g. queued again by a reap

    assert lua("requeue")(keys=requeue_keys(keys), args=["acked", "m1"]) == 1

    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1"]
    assert redis_client.hget(keys.ready_msgs, "acked") == b"other copy"


def test_requeue_repeated_puts_nothing_back_twice(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    fetched(redis_client, keys, "m1", "m2")
    requeue = lua("requeue")

    assert requeue(keys=requeue_keys(keys), args=["m1", "m2"]) == 2
    assert requeue(keys=requeue_keys(keys), args=["m1", "m2"]) == 0

    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1", b"m2"]


def test_requeue_of_a_held_id_without_a_payload_drops_it_without_pushing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1")
    redis_client.sadd(keys.acks("w1"), "lost")
    redis_client.hset(keys.fetched, "lost", "1|w1|tok")

    assert lua("requeue")(keys=requeue_keys(keys), args=["lost", "m1"]) == 1

    assert redis_client.lrange(keys.ready, 0, -1) == [b"m1"]
    assert not redis_client.exists(keys.acks("w1"), keys.fetched)


def test_requeue_of_nothing_returns_0_and_writes_nothing(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    assert lua("requeue")(keys=requeue_keys(keys), args=[]) == 0
    assert lua("requeue")(keys=requeue_keys(keys), args=["m1"]) == 0
    assert redis_client.keys("*") == []


def test_requeue_wakes_as_many_idle_consumers_as_messages_put_back(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1", "m2")
    redis_client.zadd(keys.idle, {"a": 1, "b": 1, "c": 1})

    with listening(redis_client, *(keys.wake_channel(t) for t in "abc")) as received:
        assert lua("requeue")(keys=requeue_keys(keys), args=["m1", "m2"]) == 2
        woken = received()

    assert len(woken) == 2 and all(data == b"0" for _, data in woken)
    [left] = redis_client.zrange(keys.idle, 0, -1)
    assert keys.wake_channel(left.decode()) not in {channel for channel, _ in woken}


def test_requeue_that_puts_nothing_back_wakes_nobody(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    redis_client.zadd(keys.idle, {"a": 1})

    with listening(redis_client, keys.wake_channel("a")) as received:
        assert lua("requeue")(keys=requeue_keys(keys), args=["m1"]) == 0
        assert received() == []

    assert redis_client.zrange(keys.idle, 0, -1) == [b"a"]
