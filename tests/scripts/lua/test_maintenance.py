"""maintenance.lua: put the unacked messages of dead workers back on the queue they were
fetched from (the ready queue, or the built-in .DQ queue) and expire dead letters older than
their time to live, a bounded number per call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua, snapshot

DAY_MS = 86_400_000


def _keys(keys: QueueKeys, dead_workers: Sequence[str] = ()) -> list[str]:
    """maintenance.lua's KEYS, as scripts._calls.Scripts.maintenance passes them."""
    return [
        keys.ready,
        keys.ready_msgs,
        keys.xq,
        keys.xq_msgs,
        keys.legacy_dq,
        keys.legacy_dq_msgs,
        keys.fetched,
        *keys.flow_keys,
        *(k for w in dead_workers for k in (keys.acks(w), keys.legacy_dq_acks(w))),
    ]


@pytest.fixture
def maintenance(lua: Lua, keys: QueueKeys) -> Callable[..., Any]:
    script = lua("maintenance")

    def run(dead_workers: Sequence[str] = (), ttl_ms: int = DAY_MS, limit: int = 100) -> Any:
        return script(keys=_keys(keys, dead_workers), args=[ttl_ms, limit, *keys.flow_affixes])

    return run


def test_maintenance_with_nothing_to_do_returns_zeros_and_writes_nothing(
    maintenance: Callable[..., Any], redis_client: redis.Redis
) -> None:
    assert maintenance(["w1"]) == [0, 0]
    assert redis_client.keys("*") == []


def test_maintenance_puts_a_dead_workers_unacked_messages_back_and_drops_their_fetch_records(
    maintenance: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.rpush(keys.ready, "queued")
    redis_client.hset(keys.ready_msgs, mapping={"queued": "q", "m1": "one", "m2": "two", "live": "l"})
    redis_client.sadd(keys.acks("dead"), "m1", "m2")
    redis_client.sadd(keys.acks("alive"), "live")
    redis_client.hset(keys.fetched, mapping={"m1": "1|dead|t", "m2": "2|dead|t", "live": "3|alive|u"})

    assert maintenance(["dead"]) == [2, 0]
    ready = redis_client.lrange(keys.ready, 0, -1)
    # LPUSHed: they come back at the tail the consumers pop from (after "queued").
    assert sorted(ready[:2]) == [b"m1", b"m2"]
    assert ready[2:] == [b"queued"]
    assert redis_client.exists(keys.acks("dead")) == 0
    assert redis_client.smembers(keys.acks("alive")) == {b"live"}
    assert redis_client.hgetall(keys.fetched) == {b"live": b"3|alive|u"}
    assert redis_client.hlen(keys.ready_msgs) == 4


def test_maintenance_skips_unacked_ids_whose_message_is_gone_but_empties_their_ack_set(
    maintenance: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.ready_msgs, "kept", "data")
    redis_client.sadd(keys.acks("dead"), "kept", "acked-elsewhere")
    redis_client.hset(keys.fetched, "acked-elsewhere", "1|dead|t")
    assert maintenance(["dead"]) == [1, 0]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"kept"]
    assert redis_client.exists(keys.acks("dead"), keys.fetched) == 0


def test_maintenance_puts_unacked_built_in_delayed_messages_back_on_the_dq_list(
    maintenance: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.legacy_dq_msgs, "d1", "delayed")
    redis_client.sadd(keys.legacy_dq_acks("dead"), "d1", "gone")
    # A fetch record of the same id belongs to the ready queue's flow: left alone.
    redis_client.hset(keys.fetched, "d1", "1|dead|t")
    assert maintenance(["dead"]) == [1, 0]
    assert redis_client.lrange(keys.legacy_dq, 0, -1) == [b"d1"]
    assert redis_client.exists(keys.ready) == 0
    assert redis_client.exists(keys.legacy_dq_acks("dead")) == 0
    assert redis_client.hgetall(keys.fetched) == {b"d1": b"1|dead|t"}


def test_maintenance_recovers_every_dead_worker_given_and_is_idempotent(
    maintenance: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.hset(keys.ready_msgs, mapping={"a": "1", "b": "2", "c": "3"})
    redis_client.sadd(keys.acks("w1"), "a")
    redis_client.sadd(keys.acks("w2"), "b", "c")
    assert maintenance(["w1", "w2"]) == [3, 0]
    assert sorted(redis_client.lrange(keys.ready, 0, -1)) == [b"a", b"b", b"c"]
    before = snapshot(redis_client)
    assert maintenance(["w1", "w2"]) == [0, 0]
    assert snapshot(redis_client) == before


def test_maintenance_expires_dead_letters_older_than_their_time_to_live(
    maintenance: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    redis_client.zadd(keys.xq, {"old": now - 2 * DAY_MS, "older": now - 3 * DAY_MS, "young": now - 1_000})
    redis_client.hset(keys.xq_msgs, mapping={"old": "o", "older": "oo", "young": "y"})
    assert maintenance(ttl_ms=DAY_MS) == [0, 2]
    assert redis_client.zrange(keys.xq, 0, -1) == [b"young"]
    assert redis_client.hgetall(keys.xq_msgs) == {b"young": b"y"}


def test_maintenance_expires_at_most_the_limit_oldest_first(
    maintenance: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    ages = {f"d{i}": now - DAY_MS - i * 1_000 for i in range(5)}  # d4 the oldest
    redis_client.zadd(keys.xq, ages)
    redis_client.hset(keys.xq_msgs, mapping={name: "x" for name in ages})
    assert maintenance(ttl_ms=DAY_MS // 2, limit=2) == [0, 2]
    assert sorted(redis_client.zrange(keys.xq, 0, -1)) == [b"d0", b"d1", b"d2"]
    assert sorted(redis_client.hkeys(keys.xq_msgs)) == [b"d0", b"d1", b"d2"]
    assert maintenance(ttl_ms=DAY_MS // 2, limit=2) == [0, 2]
    assert maintenance(ttl_ms=DAY_MS // 2, limit=2) == [0, 1]
    assert redis_client.exists(keys.xq, keys.xq_msgs) == 0


def test_maintenance_with_a_limit_of_0_expires_nothing(
    maintenance: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.zadd(keys.xq, {"old": server_ms() - 2 * DAY_MS})
    redis_client.hset(keys.xq_msgs, "old", "o")
    assert maintenance(ttl_ms=DAY_MS, limit=0) == [0, 0]
    assert redis_client.zcard(keys.xq) == 1
