"""shards.lua: the stored shard layout of a queue changes only if it is still what the
caller read (compare and set), and only to a well-formed one."""

from __future__ import annotations

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua, snapshot


def _set(lua: Lua, keys: QueueKeys, expected: str, active: str, retired: str = "") -> list[object]:
    return lua("shards")(keys=[keys.shards], args=["set", expected, active, retired])


def test_a_first_layout_is_written_and_a_second_writer_reading_none_is_refused(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert _set(lua, keys, "", "0,17,42") == [1, b"0,17,42", b""]
    assert redis_client.hgetall(keys.shards) == {b"active": b"0,17,42"}
    # Another process read "no layout" before the first wrote: it is told the layout now
    assert _set(lua, keys, "", "0,5,9") == [0, b"0,17,42", b""]
    assert redis_client.hgetall(keys.shards) == {b"active": b"0,17,42"}


def test_a_layout_changes_from_what_was_read_and_retired_shards_are_kept_apart(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _set(lua, keys, "", "0,17,42")
    assert _set(lua, keys, "0,17,42", "0,17", "42") == [1, b"0,17", b"42"]
    stored = redis_client.hgetall(keys.shards)
    assert stored.pop(b"r42").isdigit()  # when it was retired (server clock)
    assert stored == {b"active": b"0,17", b"retired": b"42"}
    # Taken back: active again, its stamp gone.
    assert _set(lua, keys, "0,17", "0,17,42", "") == [1, b"0,17,42", b""]
    assert redis_client.hgetall(keys.shards) == {b"active": b"0,17,42"}


def _drop(lua: Lua, keys: QueueKeys, suffix: int, age_ms: int) -> list[object]:
    return lua("shards")(keys=[keys.shards], args=["drop", suffix, age_ms])


def test_a_retired_shard_is_dropped_only_once_retired_long_enough(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _set(lua, keys, "", "0,17,42,8")
    _set(lua, keys, "0,17,42,8", "0,17", "42,8")
    assert _drop(lua, keys, 42, 60_000) == [0, b"0,17", b"42,8"]  # retired just now
    assert _drop(lua, keys, 17, 0) == [0, b"0,17", b"42,8"]  # active: never dropped
    redis_client.hset(keys.shards, "r42", 1)  # retired long ago
    assert _drop(lua, keys, 42, 60_000) == [1, b"0,17", b"8"]
    assert b"r42" not in redis_client.hgetall(keys.shards)
    assert _drop(lua, keys, 42, 60_000) == [1, b"0,17", b"8"]  # a retried drop: done already
    redis_client.hset(keys.shards, "r8", 1)
    assert _drop(lua, keys, 8, 1000) == [1, b"0,17", b""]
    assert redis_client.hgetall(keys.shards) == {b"active": b"0,17"}


@pytest.mark.parametrize(
    ("active", "retired"), [("17,0", ""), ("0,x", ""), ("", ""), ("0,,3", ""), ("0,3", "4,y"), ("0, 3", "")]
)
def test_a_malformed_layout_is_refused_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, active: str, retired: str
) -> None:
    _set(lua, keys, "", "0,17")
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="layout"):
        _set(lua, keys, "0,17", active, retired)
    assert snapshot(redis_client) == before


def test_shards_added_to_a_layout_that_existed_are_fresh_for_a_while_and_reading_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    def read(age_ms: int) -> list[object]:
        return lua("shards")(keys=[keys.shards], args=["read", age_ms])

    assert read(1000) == [b"", b"", b""]  # no layout
    _set(lua, keys, "", "0,17")
    assert read(60_000) == [b"0,17", b"", b""]  # a first layout: nothing to wait for
    _set(lua, keys, "0,17", "0,17,42,8")
    before = snapshot(redis_client)
    assert read(60_000) == [b"0,17,42,8", b"", b"42,8"]  # consumers may not read them yet
    assert snapshot(redis_client) == before
    assert read(0) == [b"0,17,42,8", b"", b""]
    # Retired and taken back: consumers never stopped reading it, so it is not fresh.
    _set(lua, keys, "0,17,42,8", "0,17,42", "8")
    _set(lua, keys, "0,17,42", "0,17,42,8", "")
    redis_client.hdel(keys.shards, "a42")
    assert read(60_000) == [b"0,17,42,8", b"", b""]
