"""heartbeat.lua: mark a worker alive on the server clock (ZREM then ZADD, so it runs on a
full server) and, with a second key, list the queue in the namespace's registry."""

from __future__ import annotations

from collections.abc import Callable

import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua


def test_heartbeat_writes_the_server_time_it_returns_and_lists_the_queue(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    before = server_ms()
    now = lua("heartbeat")(keys=[keys.heartbeats, keys.registry], args=["w1", "default"])
    after = server_ms()

    assert before <= now <= after
    assert redis_client.zrange(keys.heartbeats, 0, -1, withscores=True) == [(b"w1", float(now))]
    assert redis_client.smembers(keys.registry) == {b"default"}


def test_heartbeat_replaces_the_workers_previous_beat_and_leaves_the_others(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    far_future = 9_000_000_000_000
    redis_client.zadd(keys.heartbeats, {"w1": far_future, "w2": 1234})

    now = lua("heartbeat")(keys=[keys.heartbeats, keys.registry], args=["w1", "default"])

    assert now < far_future
    assert redis_client.zscore(keys.heartbeats, "w1") == now
    assert redis_client.zscore(keys.heartbeats, "w2") == 1234
    assert redis_client.zcard(keys.heartbeats) == 2


def test_heartbeat_repeated_keeps_one_entry_per_worker_and_one_registry_entry(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    heartbeat = lua("heartbeat")
    first = heartbeat(keys=[keys.heartbeats, keys.registry], args=["w1", "default"])
    second = heartbeat(keys=[keys.heartbeats, keys.registry], args=["w1", "default"])

    assert second >= first
    assert redis_client.zrange(keys.heartbeats, 0, -1, withscores=True) == [(b"w1", float(second))]
    assert redis_client.smembers(keys.registry) == {b"default"}


def test_heartbeat_with_only_the_alive_key_writes_no_registry(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    before = server_ms()
    now = lua("heartbeat")(keys=[keys.alive], args=["w1"])

    assert now >= before
    assert redis_client.zrange(keys.alive, 0, -1, withscores=True) == [(b"w1", float(now))]
    assert sorted(redis_client.keys("*")) == [keys.alive.encode()]


def test_heartbeat_adds_a_second_queue_to_the_registry(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    other = QueueKeys("dramatiq", "other")
    lua("heartbeat")(keys=[keys.heartbeats, keys.registry], args=["w1", "default"])
    lua("heartbeat")(keys=[other.heartbeats, other.registry], args=["w1", "other"])

    assert redis_client.smembers(keys.registry) == {b"default", b"other"}
    assert redis_client.zcard(keys.heartbeats) == 1
