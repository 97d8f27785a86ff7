"""reschedule.lua: give one scheduled message a new due time on the server clock ("in" ms
from now, or "at" an epoch ms, a past time meaning now), keeping its member; announce the
due time on the channel when it becomes the earliest entry. -1 when not scheduled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._ids import next_sort_key
from dramatiq_redisson._keys import QueueKeys

from .state import Lua, schedule_entry


def _reschedule(lua: Lua, keys: QueueKeys, message_id: str, mode: str, value: int) -> Any:
    return lua("reschedule")(keys=[keys.timeout_zset, keys.payloads, keys.channel], args=[message_id, mode, value])


def test_reschedule_in_moves_the_due_time_from_the_server_now_and_keeps_the_member(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    member = schedule_entry(redis_client, keys, "m1", now + 60_000).member
    backup = redis_client.lrange(keys.backup_list, 0, -1)
    payloads = redis_client.hgetall(keys.payloads)
    before = server_ms()
    due = _reschedule(lua, keys, "m1", "in", 5_000)
    after = server_ms()
    assert before + 5_000 <= due <= after + 5_000
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(member, float(due))]
    assert redis_client.lrange(keys.backup_list, 0, -1) == backup
    assert redis_client.hgetall(keys.payloads) == payloads


def test_reschedule_at_sets_the_given_epoch_ms(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    member = schedule_entry(redis_client, keys, "m1", 9_000_000_000_000).member
    assert _reschedule(lua, keys, "m1", "at", 8_000_000_000_123) == 8_000_000_000_123
    assert redis_client.zscore(keys.timeout_zset, member) == 8_000_000_000_123


def test_reschedule_at_a_past_time_means_now(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    member = schedule_entry(redis_client, keys, "m1", 9_000_000_000_000).member
    before = server_ms()
    due = _reschedule(lua, keys, "m1", "at", 1_000)
    assert before <= due <= server_ms()
    assert redis_client.zscore(keys.timeout_zset, member) == due


def test_reschedule_to_the_head_announces_its_due_time(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    schedule_entry(redis_client, keys, "m1", 9_000_000_000_000)
    schedule_entry(redis_client, keys, "m2", 9_000_000_000_500)
    assert _reschedule(lua, keys, "m2", "at", 8_000_000_000_000) == 8_000_000_000_000
    assert announced() == [b"8000000000000"]


def test_reschedule_that_stays_behind_the_head_announces_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    schedule_entry(redis_client, keys, "m1", 9_000_000_000_000)
    m2 = schedule_entry(redis_client, keys, "m2", 9_000_000_000_500).member
    assert _reschedule(lua, keys, "m2", "at", 9_100_000_000_000) == 9_100_000_000_000
    assert redis_client.zscore(keys.timeout_zset, m2) == 9_100_000_000_000
    assert announced() == []


def test_reschedule_of_a_message_that_is_not_scheduled_returns_minus_one_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    member = schedule_entry(redis_client, keys, "m1", 9_000_000_000_000).member
    # A payload whose member is no longer in the ZSET (it moved) is not scheduled either.
    redis_client.hset(keys.payloads, "moved", next_sort_key() + "{}")
    assert _reschedule(lua, keys, "unknown", "in", 0) == -1
    assert _reschedule(lua, keys, "moved", "in", 0) == -1
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(member, 9_000_000_000_000.0)]
    assert announced() == []


def test_reschedule_refuses_an_unknown_mode_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    member = schedule_entry(redis_client, keys, "m1", 9_000_000_000_000).member
    with pytest.raises(redis.ResponseError, match="reschedule: unknown mode later"):
        _reschedule(lua, keys, "m1", "later", 0)
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(member, 9_000_000_000_000.0)]
    assert announced() == []
