"""count.lua: how many messages are scheduled on a queue, in all, due before an epoch ms
(exclusive), or overdue by more than some ms on the server clock. Reads only."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua, snapshot


def _schedule(client: redis.Redis, keys: QueueKeys, dues: dict[str, int]) -> None:
    client.zadd(keys.timeout_zset, {member: due for member, due in dues.items()})


def test_count_of_an_empty_queue_is_zero_in_every_mode(lua: Lua, keys: QueueKeys) -> None:
    count = lua("count")
    assert count(keys=[keys.timeout_zset], args=["all", 0]) == 0
    assert count(keys=[keys.timeout_zset], args=["before", 2**40]) == 0
    assert count(keys=[keys.timeout_zset], args=["overdue", 0]) == 0


def test_count_all_counts_every_scheduled_member(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    _schedule(redis_client, keys, {"a": 1_000, "b": 2_000, "c": 3_000})
    assert lua("count")(keys=[keys.timeout_zset], args=["all", 0]) == 3


def test_count_before_excludes_entries_due_exactly_at_the_bound(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _schedule(redis_client, keys, {"a": 1_000, "b": 2_000, "c": 2_000, "d": 3_000})
    count = lua("count")
    assert count(keys=[keys.timeout_zset], args=["before", 2_000]) == 1
    assert count(keys=[keys.timeout_zset], args=["before", 2_001]) == 3
    assert count(keys=[keys.timeout_zset], args=["before", 1_000]) == 0


def test_count_overdue_counts_entries_due_before_the_server_now_minus_the_grace(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    # Two entries an hour late, one a second late, one in the future.
    _schedule(redis_client, keys, {"a": now - 3_600_000, "b": now - 3_500_000, "c": now - 1_000, "d": now + 60_000})
    count = lua("count")
    assert count(keys=[keys.timeout_zset], args=["overdue", 60_000]) == 2
    assert count(keys=[keys.timeout_zset], args=["overdue", 0]) == 3


def test_count_writes_nothing(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    _schedule(redis_client, keys, {"a": 1_000, "b": 2_000})
    before = snapshot(redis_client)
    for mode, value in (("all", 0), ("before", 1_500), ("overdue", 10)):
        lua("count")(keys=[keys.timeout_zset], args=[mode, value])
    assert snapshot(redis_client) == before


def test_count_refuses_an_unknown_mode(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    _schedule(redis_client, keys, {"a": 1_000})
    with pytest.raises(redis.ResponseError, match="count: unknown mode since"):
        lua("count")(keys=[keys.timeout_zset], args=["since", 0])
