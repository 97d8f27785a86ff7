"""peek.lua: read one scheduled message (by message id, or by the dedupe key it holds)
with its due time, in one call: {due, stored payload, message id}, or {-1, nil, nil}
when it is not scheduled. Reads only."""

from __future__ import annotations

import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua, schedule_entry

NOT_SCHEDULED = [-1, None, None]


def _peek_keys(keys: QueueKeys) -> list[str]:
    return [keys.timeout_zset, keys.payloads, keys.dedupe]


def test_peek_by_id_returns_due_time_stored_payload_and_id(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    sort_key = schedule_entry(redis_client, keys, "m1", 1_700_000_000_123, data=b'{"x":1}').sort_key
    schedule_entry(redis_client, keys, "m2", 1_700_000_000_999)
    reply = lua("peek")(keys=_peek_keys(keys), args=["m1", "id"])
    assert reply == [1_700_000_000_123, sort_key.encode() + b'{"x":1}', b"m1"]


def test_peek_without_a_mode_reads_a_message_id(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    sort_key = schedule_entry(redis_client, keys, "m1", 5_000).sort_key
    assert lua("peek")(keys=_peek_keys(keys), args=["m1"]) == [5_000, sort_key.encode() + b"{}", b"m1"]


def test_peek_of_an_unknown_id_is_not_scheduled(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    schedule_entry(redis_client, keys, "m1", 5_000)
    assert lua("peek")(keys=_peek_keys(keys), args=["nope", "id"]) == NOT_SCHEDULED


def test_peek_of_a_payload_whose_member_left_the_zset_is_not_scheduled(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # The payload is still there but its member moved (or was rescheduled under another key).
    sort_key = schedule_entry(redis_client, keys, "m1", 5_000).sort_key
    redis_client.zrem(keys.timeout_zset, sort_key + "m1")
    assert lua("peek")(keys=_peek_keys(keys), args=["m1", "id"]) == NOT_SCHEDULED


def test_peek_by_key_returns_the_message_holding_the_key(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    schedule_entry(redis_client, keys, "m1", 5_000)
    sort_key = schedule_entry(redis_client, keys, "m2", 7_000, data=b"two").sort_key
    redis_client.hset(keys.dedupe, "report", "m2")
    redis_client.hset(keys.keyed, "m2", "0:report")
    assert lua("peek")(keys=_peek_keys(keys), args=["report", "key"]) == [7_000, sort_key.encode() + b"two", b"m2"]


def test_peek_by_key_that_nothing_holds_is_not_scheduled(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    schedule_entry(redis_client, keys, "m1", 5_000)
    peek = lua("peek")
    # No message holds the key; and "m1" is a message id, not a key.
    assert peek(keys=_peek_keys(keys), args=["report", "key"]) == NOT_SCHEDULED
    assert peek(keys=_peek_keys(keys), args=["m1", "key"]) == NOT_SCHEDULED


def test_peek_by_key_whose_holder_is_gone_is_not_scheduled(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.dedupe, "report", "ghost")
    assert lua("peek")(keys=_peek_keys(keys), args=["report", "key"]) == NOT_SCHEDULED


def test_peek_writes_nothing(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    schedule_entry(redis_client, keys, "m1", 5_000)
    redis_client.hset(keys.dedupe, "report", "m1")
    before = {key: redis_client.dump(key) for key in redis_client.keys("*")}
    peek = lua("peek")
    peek(keys=_peek_keys(keys), args=["m1", "id"])
    peek(keys=_peek_keys(keys), args=["report", "key"])
    peek(keys=_peek_keys(keys), args=["nope", "id"])
    assert {key: redis_client.dump(key) for key in redis_client.keys("*")} == before
