"""bury.lua: move entries that cannot be decoded from a list + hash pair (the built-in
broker's ``.DQ`` queue, as the broker calls it) to the queue's dead letters, scored by the
time they were buried."""

from __future__ import annotations

from collections.abc import Callable

import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua


def bury_keys(keys: QueueKeys) -> list[str]:
    return [keys.legacy_dq, keys.legacy_dq_msgs, keys.xq, keys.xq_msgs]


def legacy(client: redis.Redis, keys: QueueKeys, *ids: str) -> None:
    client.rpush(keys.legacy_dq, *ids)
    client.hset(keys.legacy_dq_msgs, mapping={i: f"bad-{i}".encode() for i in ids})


def test_bury_moves_the_entries_to_the_dead_letters_with_their_data(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    legacy(redis_client, keys, "a", "b", "c")

    before = server_ms()
    assert lua("bury")(keys=bury_keys(keys), args=["a", "b"]) == 2
    after = server_ms()

    assert redis_client.lrange(keys.legacy_dq, 0, -1) == [b"c"]
    assert redis_client.hgetall(keys.legacy_dq_msgs) == {b"c": b"bad-c"}
    dead = redis_client.zrange(keys.xq, 0, -1, withscores=True)
    assert [member for member, _ in dead] == [b"a", b"b"]
    assert all(before <= died <= after for _, died in dead)
    assert redis_client.hgetall(keys.xq_msgs) == {b"a": b"bad-a", b"b": b"bad-b"}


def test_bury_of_a_listed_id_without_data_only_drops_it_from_the_list(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    legacy(redis_client, keys, "b")
    redis_client.lpush(keys.legacy_dq, "orphan")

    assert lua("bury")(keys=bury_keys(keys), args=["orphan", "b"]) == 1

    assert not redis_client.exists(keys.legacy_dq, keys.legacy_dq_msgs)
    assert redis_client.zrange(keys.xq, 0, -1) == [b"b"]


def test_bury_of_unknown_ids_returns_0_and_writes_nothing(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    legacy(redis_client, keys, "a")

    assert lua("bury")(keys=bury_keys(keys), args=["x", "y"]) == 0

    assert redis_client.lrange(keys.legacy_dq, 0, -1) == [b"a"]
    assert not redis_client.exists(keys.xq, keys.xq_msgs)


def test_bury_repeated_moves_nothing_more(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    legacy(redis_client, keys, "a")
    bury = lua("bury")

    assert bury(keys=bury_keys(keys), args=["a"]) == 1
    died = redis_client.zscore(keys.xq, "a")
    assert bury(keys=bury_keys(keys), args=["a"]) == 0

    assert redis_client.zscore(keys.xq, "a") == died
    assert redis_client.hgetall(keys.xq_msgs) == {b"a": b"bad-a"}


def test_bury_takes_one_occurrence_of_an_id_from_the_head_of_the_list(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    legacy(redis_client, keys, "a", "b")
    redis_client.rpush(keys.legacy_dq, "a")  # listed twice

    assert lua("bury")(keys=bury_keys(keys), args=["a"]) == 1

    assert redis_client.lrange(keys.legacy_dq, 0, -1) == [b"b", b"a"]


def test_bury_of_nothing_returns_0(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    assert lua("bury")(keys=bury_keys(keys), args=[]) == 0
    assert redis_client.keys("*") == []
