"""bulk.lua: promote (due now, same member, announced) or remove scheduled messages in one
bounded step: the earliest `batch` of them (for promote: of those not yet due), or the
given members still scheduled. Removal releases dedupe keys; promotion keeps them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._ids import next_sort_key
from dramatiq_redisson._keys import QueueKeys

from .state import Lua, schedule_entry

FAR = 9_000_000_000_000


def _bulk(lua: Lua, keys: QueueKeys, action: str, batch: int, *members: Any) -> Any:
    return lua("bulk")(
        keys=[keys.timeout_zset, keys.payloads, keys.channel, keys.dedupe, keys.keyed], args=[action, batch, *members]
    )


def test_bulk_promote_makes_the_earliest_not_yet_due_entries_due_now(
    lua: Lua,
    keys: QueueKeys,
    redis_client: redis.Redis,
    server_ms: Callable[[], int],
    announced: Callable[[], list[bytes]],
) -> None:
    overdue = schedule_entry(redis_client, keys, "late", 1_000).member
    a = schedule_entry(redis_client, keys, "a", FAR + 3).member
    b = schedule_entry(redis_client, keys, "b", FAR + 1).member
    c = schedule_entry(redis_client, keys, "c", FAR + 2).member
    before = server_ms()
    assert _bulk(lua, keys, "promote", 2) == 2
    after = server_ms()
    scores = dict(redis_client.zrange(keys.timeout_zset, 0, -1, withscores=True))
    assert scores[overdue] == 1_000  # already due: left as it is
    assert before <= scores[b] == scores[c] <= after
    assert scores[a] == FAR + 3
    assert announced() == [str(int(scores[b])).encode()]
    # Members and payloads are unchanged.
    assert set(scores) == {overdue, a, b, c}
    assert redis_client.hlen(keys.payloads) == 4


def test_bulk_promote_of_given_members_skips_those_gone_or_already_due(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    overdue = schedule_entry(redis_client, keys, "late", 1_000).member
    a = schedule_entry(redis_client, keys, "a", FAR).member
    b = schedule_entry(redis_client, keys, "b", FAR).member
    assert _bulk(lua, keys, "promote", 100, a, overdue, next_sort_key() + "gone") == 1
    assert redis_client.zscore(keys.timeout_zset, a) <= server_ms()
    assert redis_client.zscore(keys.timeout_zset, b) == FAR
    assert redis_client.zscore(keys.timeout_zset, overdue) == 1_000


def test_bulk_promote_keeps_the_dedupe_key(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    schedule_entry(redis_client, keys, "a", FAR, key="report", ttl=1_000)
    assert _bulk(lua, keys, "promote", 10) == 1
    assert redis_client.hgetall(keys.dedupe) == {b"report": b"a"}
    assert redis_client.hgetall(keys.keyed) == {b"a": b"1000:report"}


def test_bulk_remove_drops_the_earliest_entries_due_or_not_and_releases_their_keys(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    overdue = schedule_entry(redis_client, keys, "late", 1_000, key="k1", ttl=1_000).member
    a = schedule_entry(redis_client, keys, "a", FAR + 1, key="k2", ttl=1_000).member
    b = schedule_entry(redis_client, keys, "b", FAR + 2, key="k3", ttl=1_000).member
    assert _bulk(lua, keys, "remove", 2) == 2
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [b]
    assert list(redis_client.hgetall(keys.payloads)) == [b"b"]
    assert redis_client.hgetall(keys.dedupe) == {b"k3": b"b"}
    assert redis_client.hgetall(keys.keyed) == {b"b": b"1000:k3"}
    # The backup list keeps the members for transfer's trimming; nothing is announced.
    assert redis_client.lrange(keys.backup_list, 0, -1) == [overdue, a, b]
    assert announced() == []


def test_bulk_remove_of_given_members_skips_one_rescheduled_under_a_new_sort_key(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    a = schedule_entry(redis_client, keys, "a", FAR).member
    b = schedule_entry(redis_client, keys, "b", FAR).member
    # "b" was offered again since the scan: a new member (new sort key), the old one is gone.
    redis_client.zrem(keys.timeout_zset, b)
    b_new = schedule_entry(redis_client, keys, "b", FAR).member
    assert _bulk(lua, keys, "remove", 100, a, b) == 1
    assert redis_client.zrange(keys.timeout_zset, 0, -1) == [b_new]
    assert list(redis_client.hgetall(keys.payloads)) == [b"b"]


def test_bulk_with_nothing_to_act_on_returns_zero_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, announced: Callable[[], list[bytes]]
) -> None:
    assert _bulk(lua, keys, "remove", 10) == 0
    assert _bulk(lua, keys, "promote", 10) == 0
    schedule_entry(redis_client, keys, "late", 1_000)
    before = {key: redis_client.dump(key) for key in redis_client.keys("*")}
    assert _bulk(lua, keys, "promote", 10) == 0  # only due entries: nothing to promote
    assert _bulk(lua, keys, "remove", 10, next_sort_key() + "gone") == 0
    assert {key: redis_client.dump(key) for key in redis_client.keys("*")} == before
    assert announced() == []


def test_bulk_refuses_an_unknown_action_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    schedule_entry(redis_client, keys, "a", FAR)
    before = {key: redis_client.dump(key) for key in redis_client.keys("*")}
    with pytest.raises(redis.ResponseError, match="bulk: unknown action purge"):
        _bulk(lua, keys, "purge", 10)
    assert {key: redis_client.dump(key) for key in redis_client.keys("*")} == before


def test_bulk_remove_drops_the_lane_records_of_the_removed_messages_when_given_their_key(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    a = schedule_entry(redis_client, keys, "a", FAR + 1).member
    schedule_entry(redis_client, keys, "b", FAR + 2)
    redis_client.hset(keys.lane_of, mapping={"a": "1:", "b": "2:"})
    bulk_keys = [keys.timeout_zset, keys.payloads, keys.channel, keys.dedupe, keys.keyed, keys.lane_of]
    assert lua("bulk")(keys=bulk_keys, args=["remove", 10, a]) == 1
    assert redis_client.hgetall(keys.lane_of) == {b"b": b"2:"}
