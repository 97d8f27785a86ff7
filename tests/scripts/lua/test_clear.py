"""clear.lua: drop every scheduled message of a queue at once (its ZSET, backup list,
payloads, compaction list and cursor, and the dedupe-key index of those messages), and
return how many were scheduled. Throttle windows of moved messages outlive it."""

from __future__ import annotations

import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua


def _clear_keys(keys: QueueKeys) -> list[str]:
    return [
        keys.timeout_zset,
        keys.backup_list,
        keys.payloads,
        keys.compact_list,
        keys.compact_cursor,
        keys.dedupe,
        keys.keyed,
        keys.lane_of,
    ]


def _fill(client: redis.Redis, keys: QueueKeys) -> None:
    client.hset(keys.lane_of, "c", "1:")
    client.zadd(keys.timeout_zset, {"g0000000000001a": 1_000, "g0000000000002b": 2_000, "g0000000000003c": 3_000})
    client.rpush(keys.backup_list, "g0000000000000z", "g0000000000001a", "g0000000000002b", "g0000000000003c")
    client.hset(keys.payloads, mapping={"a": "g000000000001x", "b": "g000000000002y", "c": "g000000000003z"})
    client.rpush(keys.compact_list, "g0000000000001a")
    client.set(keys.compact_cursor, 1)
    client.hset(keys.dedupe, "k", "a")
    client.hset(keys.keyed, "a", "5000:k")


def test_clear_keys_are_the_brokers_scheduled_keys(keys: QueueKeys) -> None:
    assert tuple(_clear_keys(keys)) == keys.scheduled_keys


def test_clear_drops_every_scheduled_key_and_returns_the_count(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _fill(redis_client, keys)
    assert lua("clear")(keys=_clear_keys(keys)) == 3
    assert redis_client.exists(*_clear_keys(keys)) == 0


def test_clear_of_an_empty_queue_returns_zero(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    assert lua("clear")(keys=_clear_keys(keys)) == 0
    assert redis_client.dbsize() == 0


def test_clear_again_returns_zero(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    _fill(redis_client, keys)
    clear = lua("clear")
    assert clear(keys=_clear_keys(keys)) == 3
    assert clear(keys=_clear_keys(keys)) == 0


def test_clear_leaves_throttle_windows_and_the_ready_queue(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _fill(redis_client, keys)
    redis_client.zadd(keys.holds, {"held-key": 9_999_999_999_999})
    redis_client.hset(keys.throttle_copies, "held-key", "{}")
    redis_client.rpush(keys.ready, "g0000000000009r")
    redis_client.hset(keys.ready_msgs, "g0000000000009r", "{}")
    redis_client.zadd(keys.sent, {"g0000000000008s": 1})
    lua("clear")(keys=_clear_keys(keys))
    assert redis_client.zrange(keys.holds, 0, -1, withscores=True) == [(b"held-key", 9_999_999_999_999.0)]
    assert redis_client.hgetall(keys.throttle_copies) == {b"held-key": b"{}"}
    assert redis_client.lrange(keys.ready, 0, -1) == [b"g0000000000009r"]
    assert redis_client.hgetall(keys.ready_msgs) == {b"g0000000000009r": b"{}"}
    assert redis_client.zcard(keys.sent) == 1


def test_clear_of_another_queue_leaves_this_one(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    _fill(redis_client, keys)
    other = QueueKeys("dramatiq", "other")
    assert lua("clear")(keys=_clear_keys(other)) == 0
    assert redis_client.zcard(keys.timeout_zset) == 3
    assert redis_client.llen(keys.backup_list) == 4
    assert redis_client.hlen(keys.payloads) == 3
