"""offer_one.lua: schedule one fresh message (no dedupe key, claim or retry) delay ms from
the server's now: ZSET member, backup-list entry and payload, the due time announced when
it is the new earliest entry. A resend of the same member moves its due time; a member
that already came due (looked for in "sent", "ready", "both" or nowhere) returns -2; an
id scheduled under another member returns -4. Both write nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._ids import next_sort_key
from dramatiq_redisson._keys import QueueKeys

from .state import Lua, snapshot


def _one_keys(keys: QueueKeys) -> list[str]:
    return [keys.timeout_zset, keys.backup_list, keys.payloads, keys.channel, keys.sent, keys.ready_msgs]


def _offer_one(lua: Lua, keys: QueueKeys, delay: int, sort_key: str, message_id: str, data: bytes, look: str) -> Any:
    return lua("offer_one")(keys=_one_keys(keys), args=[delay, sort_key, message_id, data, look])


def test_offer_one_schedules_a_fresh_message_and_announces_the_new_head(
    lua: Lua,
    keys: QueueKeys,
    redis_client: redis.Redis,
    server_ms: Callable[[], int],
    announced: Callable[[], list[bytes]],
) -> None:
    sort_key = next_sort_key()
    before = server_ms()
    due = _offer_one(lua, keys, 5_000, sort_key, "m1", b'{"a":1}', "both")
    assert before + 5_000 <= due <= server_ms() + 5_000
    member = (sort_key + "m1").encode()
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(member, float(due))]
    assert redis_client.lrange(keys.backup_list, 0, -1) == [member]
    assert redis_client.hgetall(keys.payloads) == {b"m1": sort_key.encode() + b'{"a":1}'}
    assert announced() == [str(due).encode()]


def test_offer_one_behind_an_earlier_head_is_not_announced(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    first = _offer_one(lua, keys, 1_000, next_sort_key(), "m1", b"{}", "both")
    second = _offer_one(lua, keys, 60_000, next_sort_key(), "m2", b"{}", "both")
    assert second > first
    assert announced() == [str(first).encode()]
    assert redis_client.zcard(keys.timeout_zset) == 2
    assert redis_client.llen(keys.backup_list) == 2


def test_offer_one_of_the_same_member_again_moves_its_due_time_and_stays_scheduled_once(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    sort_key = next_sort_key()
    first = _offer_one(lua, keys, 60_000, sort_key, "m1", b"{}", "both")
    again = _offer_one(lua, keys, 1_000, sort_key, "m1", b"{}", "both")
    assert again < first
    member = (sort_key + "m1").encode()
    assert redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True) == [(member, float(again))]
    assert redis_client.lrange(keys.backup_list, 0, -1) == [member]
    assert redis_client.hgetall(keys.payloads) == {b"m1": sort_key.encode() + b"{}"}


def test_offer_one_of_an_id_scheduled_under_another_member_returns_minus_4_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    first = _offer_one(lua, keys, 60_000, next_sort_key(), "m1", b"old", "both")
    announced()
    state = snapshot(redis_client)
    assert _offer_one(lua, keys, 1_000, next_sort_key(), "m1", b"new", "both") == -4
    assert snapshot(redis_client) == state
    assert redis_client.zscore(keys.timeout_zset, redis_client.zrange(keys.timeout_zset, 0, 0)[0]) == first
    assert announced() == []


@pytest.mark.parametrize(
    ("look", "in_sent", "in_ready", "refused"),
    [
        ("sent", True, False, True),
        ("sent", False, True, False),
        ("ready", False, True, True),
        ("ready", True, False, False),
        ("both", True, False, True),
        ("both", False, True, True),
        ("", True, True, False),
    ],
)
def test_offer_one_of_a_member_that_already_came_due_is_looked_for_where_asked(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, look: str, in_sent: bool, in_ready: bool, refused: bool
) -> None:
    sort_key = next_sort_key()
    member = sort_key + "m1"
    if in_sent:
        redis_client.zadd(keys.sent, {member: 1_000})
    if in_ready:
        redis_client.hset(keys.ready_msgs, member, "{}")
    state = snapshot(redis_client)
    reply = _offer_one(lua, keys, 1_000, sort_key, "m1", b"{}", look)
    if refused:
        assert reply == -2
        assert snapshot(redis_client) == state
    else:
        assert reply > 0
        assert redis_client.zrange(keys.timeout_zset, 0, -1) == [member.encode()]
        assert redis_client.hgetall(keys.payloads) == {b"m1": sort_key.encode() + b"{}"}


def test_offer_one_with_a_payload_hash_of_the_wrong_type_fails_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.payloads, "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        _offer_one(lua, keys, 1_000, next_sort_key(), "m1", b"{}", "both")
    assert redis_client.exists(keys.timeout_zset, keys.backup_list) == 0
    assert redis_client.get(keys.payloads) == b"not a hash"


def test_offer_one_with_a_backup_list_of_the_wrong_type_takes_the_payload_back(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.backup_list, "not a list")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        _offer_one(lua, keys, 1_000, next_sort_key(), "m1", b"{}", "both")
    assert redis_client.exists(keys.timeout_zset, keys.payloads) == 0
    assert redis_client.get(keys.backup_list) == b"not a list"


def test_offer_one_with_a_zset_of_the_wrong_type_fails_before_any_write(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.timeout_zset, "not a zset")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        _offer_one(lua, keys, 1_000, next_sort_key(), "m1", b"{}", "both")
    assert redis_client.exists(keys.payloads, keys.backup_list) == 0
