"""cancel.lua: remove scheduled messages by message id, or by the dedupe key they hold:
their ZSET member and payload go (the backup list keeps the member for transfer to trim),
their dedupe keys are released, throttle windows are left alone. Returns how many."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua, schedule_entry


def _cancel(lua: Lua, keys: QueueKeys, mode: str, *names: str) -> Any:
    return lua("cancel")(keys=[keys.timeout_zset, keys.payloads, keys.dedupe, keys.keyed], args=[mode, *names])


def test_cancel_by_id_removes_the_member_and_payload_and_keeps_the_backup_entry(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    m1 = schedule_entry(redis_client, keys, "m1", 1_000).member
    m2 = schedule_entry(redis_client, keys, "m2", 2_000).member
    m3 = schedule_entry(redis_client, keys, "m3", 3_000).member
    assert _cancel(lua, keys, "id", "m1", "m3") == 2
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [m2]
    assert list(redis_client.hgetall(keys.payloads)) == [b"m2"]
    assert redis_client.lrange(keys.backup_list, 0, -1) == [m1, m2, m3]


def test_cancel_counts_only_messages_still_scheduled_and_again_is_zero(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    schedule_entry(redis_client, keys, "m1", 1_000)
    m2 = schedule_entry(redis_client, keys, "m2", 2_000).member
    assert _cancel(lua, keys, "id", "m1", "unknown") == 1
    assert _cancel(lua, keys, "id", "m1") == 0
    assert _cancel(lua, keys, "id") == 0
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [m2]


def test_cancel_by_key_removes_the_message_holding_it_and_releases_the_key(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    schedule_entry(redis_client, keys, "m1", 1_000, key="report", ttl=60_000)
    m2 = schedule_entry(redis_client, keys, "m2", 2_000, key="digest").member
    assert _cancel(lua, keys, "key", "report", "no-such-key") == 1
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [m2]
    assert redis_client.hgetall(keys.dedupe) == {b"digest": b"m2"}
    assert redis_client.hgetall(keys.keyed) == {b"m2": b"0:digest"}


def test_cancel_by_id_releases_the_key_the_message_held(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    schedule_entry(redis_client, keys, "m1", 1_000, key="report", ttl=5_000)
    assert _cancel(lua, keys, "id", "m1") == 1
    assert redis_client.exists(keys.dedupe, keys.keyed, keys.timeout_zset, keys.payloads) == 0


def test_cancel_by_key_is_not_a_message_id(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    m1 = schedule_entry(redis_client, keys, "m1", 1_000, key="report").member
    assert _cancel(lua, keys, "key", "m1") == 0
    assert _cancel(lua, keys, "id", "report") == 0
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [m1]
    assert redis_client.hgetall(keys.dedupe) == {b"report": b"m1"}


def test_cancel_leaves_a_key_whose_index_names_another_message(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    schedule_entry(redis_client, keys, "m1", 1_000)
    schedule_entry(redis_client, keys, "m2", 2_000, key="report")
    redis_client.hset(keys.keyed, "m1", "0:report")  # m1 claims the key the index gives m2
    assert _cancel(lua, keys, "id", "m1") == 1
    assert redis_client.hgetall(keys.dedupe) == {b"report": b"m2"}
    assert redis_client.hgetall(keys.keyed) == {b"m2": b"0:report"}


def test_cancel_leaves_throttle_windows_alone(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    schedule_entry(redis_client, keys, "m1", 1_000, key="report", ttl=5_000)
    redis_client.zadd(keys.holds, {"digest": 9_000_000_000_000})
    redis_client.hset(keys.throttle_copies, "digest", "{}")
    assert _cancel(lua, keys, "key", "report", "digest") == 1
    assert redis_client.zrange(keys.holds, 0, -1) == [b"digest"]
    assert redis_client.hgetall(keys.throttle_copies) == {b"digest": b"{}"}


def test_cancel_refuses_an_unknown_mode_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    schedule_entry(redis_client, keys, "m1", 1_000, key="report")
    before = {key: redis_client.dump(key) for key in redis_client.keys("*")}
    with pytest.raises(redis.ResponseError, match="cancel: unknown mode ids"):
        _cancel(lua, keys, "ids", "m1")
    assert {key: redis_client.dump(key) for key in redis_client.keys("*")} == before


def test_a_cancelled_message_loses_its_lane_record_when_the_lanes_key_is_given(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    schedule_entry(redis_client, keys, "a", 5_000)
    schedule_entry(redis_client, keys, "b", 5_000)
    redis_client.hset(keys.lane_of, mapping={"a": "2:", "b": "3:"})
    removed = lua("cancel")(
        keys=[keys.timeout_zset, keys.payloads, keys.dedupe, keys.keyed, keys.lane_of], args=["id", "a"]
    )
    assert removed == 1
    assert redis_client.hgetall(keys.lane_of) == {b"b": b"3:"}
