"""limits.lua: set or clear a queue's concurrency limits: the flow goes on (the ready list's
ids join ring 0), the limits are written as given, lanes waiting for their group's slot go
back on their rings, and idle consumers are woken."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys, lane_id

from .state import Lua, snapshot


def _limits(
    lua: Lua,
    keys: QueueKeys,
    op: str,
    concurrency: Any = "",
    group: Any = "",
    rate: Any = "",
    per_ms: Any = "",
    group_rate: Any = "",
) -> list[int]:
    return lua("limits")(
        keys=[keys.flow, keys.ready, keys.levels, keys.idle],
        args=[op, concurrency, group, rate, per_ms, group_rate, *keys.flow_affixes, keys.wake_prefix, keys.rate_prefix],
    )


#: limits.lua's reply past the concurrency part without rates: no rate, no window, no group
#: rate, no count of starts, no lane waiting for its group's rate.
NO_RATES = [-1, -1, -1, -1, 0]


def test_set_turns_the_flow_on_and_writes_the_limits(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    redis_client.rpush(keys.ready, "r1")
    assert _limits(lua, keys, "set", 4, "") == [4, -1, 0, 0, 0, *NO_RATES]
    assert redis_client.hgetall(keys.flow) == {b"concurrency": b"4"}
    assert redis_client.get(keys.flow_flag) == b"1"
    assert redis_client.lrange(keys.ready, 0, -1) == [b"r1"]  # the fetch takes it in turn
    # set again: exactly what is given ("" removes one)
    assert _limits(lua, keys, "set", "", 1) == [-1, 1, 0, 0, 0, *NO_RATES]
    assert redis_client.hgetall(keys.flow) == {b"group_concurrency": b"1"}


def test_clear_frees_blocked_lanes_wakes_idle_consumers_and_keeps_the_flow_on(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, listen: Callable[[str], Callable[[], list[bytes]]]
) -> None:
    a, b = lane_id(0, "a"), lane_id(3, "a")
    redis_client.hset(
        keys.flow,
        mapping={"on": 1, "group_concurrency": 1, "inuse": 1, "groups": 1, "g61": 1, "blocked": 2, "b61": f"{a} {b}"},
    )
    redis_client.rpush(keys.lane(a), "a1")
    redis_client.rpush(keys.lane(b), "b1")
    redis_client.zadd(keys.idle, {"tok-1": 2, "tok-2": 1})
    woken = [listen(keys.wake_channel("tok-1")), listen(keys.wake_channel("tok-2"))]
    assert _limits(lua, keys, "clear") == [-1, -1, 1, 1, 2, *NO_RATES]
    assert redis_client.hgetall(keys.flow) == {b"on": b"1", b"inuse": b"1", b"groups": b"1", b"g61": b"1"}
    assert redis_client.lrange(keys.ring(0), 0, -1) == [a.encode()]
    assert redis_client.lrange(keys.ring(3), 0, -1) == [b.encode()]
    assert redis_client.zrange(keys.levels, 0, -1) == [b"0", b"3"]
    assert [w() for w in woken] == [[b"0"], [b"0"]]
    assert redis_client.zcard(keys.idle) == 0


def test_update_keeps_the_limits_not_given_and_removes_those_given_as_minus_1(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # On a queue without flow: the flow goes on, as with "set"
    redis_client.rpush(keys.ready, "r1")
    assert _limits(lua, keys, "update", 8, 1) == [8, 1, 0, 0, 0, *NO_RATES]
    assert redis_client.hgetall(keys.flow) == {b"concurrency": b"8", b"group_concurrency": b"1"}
    # "" keeps a limit: only the queue limit changes
    assert _limits(lua, keys, "update", 4) == [4, 1, 0, 0, 0, *NO_RATES]
    # a rate with its window joins them; -1 removes the group limit only
    assert _limits(lua, keys, "update", "", -1, 10, 1000) == [4, -1, 0, 0, 0, 10, 1000, -1, 0, 0]
    assert redis_client.hgetall(keys.flow) == {b"concurrency": b"4", b"rate": b"10", b"per_ms": b"1000"}
    # a group rate uses the window kept
    assert _limits(lua, keys, "update", "", "", "", "", 3)[5:8] == [10, 1000, 3]


@pytest.mark.parametrize("args", [("", "", "", -1), ("", "", -1)], ids=["window-removed", "rate-removed"])
def test_update_to_a_rate_without_its_window_or_a_window_without_a_rate_is_refused_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, args: tuple[Any, ...]
) -> None:
    redis_client.hset(keys.flow, mapping={"on": 1, "concurrency": 4, "rate": 10, "per_ms": 1000})
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="a rate needs its window"):
        _limits(lua, keys, "update", *args)
    assert snapshot(redis_client) == before


def test_clear_of_a_queue_without_flow_writes_nothing(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    assert _limits(lua, keys, "clear") == [-1, -1, 0, 0, 0, *NO_RATES]
    assert redis_client.keys("*") == []


@pytest.mark.parametrize("op", ["reset", ""])
def test_an_unknown_operation_is_refused_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, op: str
) -> None:
    redis_client.rpush(keys.ready, "r1")
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="unknown operation"):
        _limits(lua, keys, op, 1, 1)
    assert snapshot(redis_client) == before


def test_set_writes_rates_and_get_counts_the_starts_in_the_window_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.rpush(keys.ready, "r1")
    assert _limits(lua, keys, "set", "", "", 5, 60_000, 2) == [-1, -1, 0, 0, 0, 5, 60_000, 2, 0, 0]
    assert redis_client.hgetall(keys.flow) == {b"rate": b"5", b"per_ms": b"60000", b"group_rate": b"2"}
    now = server_ms()
    redis_client.rpush(keys.rate_log(), now - 10, now - 20, now - 70_000)  # the last one left the window
    redis_client.zadd(keys.deferred, {lane_id(0, "a"): now + 5_000})
    before = snapshot(redis_client)
    assert _limits(lua, keys, "get") == [-1, -1, 0, 0, 0, 5, 60_000, 2, 2, 1]
    assert snapshot(redis_client) == before


def test_clear_puts_the_lanes_waiting_for_their_groups_rate_back_in_turn(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    a, b = lane_id(0, "a"), lane_id(0, "b")
    redis_client.hset(keys.flow, mapping={"on": 1, "group_rate": 1, "per_ms": 60_000, "deferred_at": 5, "rate_at": 5})
    redis_client.rpush(keys.lane(a), "a1")
    redis_client.zadd(keys.deferred, {a: 5, b: 6})  # b emptied meanwhile: not put back
    assert _limits(lua, keys, "clear") == [-1, -1, 0, 0, 0, *NO_RATES]
    assert redis_client.lrange(keys.ring(0), 0, -1) == [a.encode()]
    assert redis_client.exists(keys.deferred) == 0
    assert redis_client.hgetall(keys.flow) == {b"on": b"1"}
