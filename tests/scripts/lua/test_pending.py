"""pending.lua: how many messages of a queue are not yet processed, read at one moment:
scheduled (but each periodic actor's next tick) + ready + in flight + the built-in broker's
delayed messages not yet migrated. Reads only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua, snapshot


def _keys(keys: QueueKeys) -> list[str]:
    """pending.lua's KEYS, as scripts._calls.Scripts.pending passes them."""
    return [keys.timeout_zset, keys.ready_msgs, keys.legacy_dq_msgs, keys.chains]


@pytest.fixture
def pending(lua: Lua, keys: QueueKeys) -> Callable[[], Any]:
    script = lua("pending")
    return lambda: script(keys=_keys(keys))


def test_pending_of_an_empty_queue_is_zero(pending: Callable[[], Any], redis_client: redis.Redis) -> None:
    assert pending() == 0
    assert redis_client.keys("*") == []


def test_pending_adds_scheduled_ready_in_flight_and_built_in_delayed_messages(
    pending: Callable[[], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.timeout_zset, {"s1": 1, "s2": 2, "s3": 3})
    # Ready and in flight: both have their data in the ready queue's hash.
    redis_client.hset(keys.ready_msgs, mapping={"ready": "x", "flight": "x"})
    redis_client.rpush(keys.ready, "ready")
    redis_client.hset(keys.legacy_dq_msgs, "old", "x")
    assert pending() == 3 + 2 + 1


def test_pending_does_not_count_the_periodic_ticks(
    pending: Callable[[], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.timeout_zset, {"tick-a": 1, "tick-b": 2, "message": 3})
    redis_client.hset(keys.chains, mapping={"a": "tick-a", "b": "tick-b"})
    assert pending() == 1
    redis_client.hset(keys.ready_msgs, "ran", "x")
    assert pending() == 2


def test_pending_never_subtracts_more_ticks_than_are_scheduled(
    pending: Callable[[], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # Chains whose ticks were cleared by an operator: the scheduled count floors at 0.
    redis_client.zadd(keys.timeout_zset, {"message": 3})
    redis_client.hset(keys.chains, mapping={"a": "tick-a", "b": "tick-b", "c": "tick-c"})
    redis_client.hset(keys.ready_msgs, mapping={"r1": "x", "r2": "x"})
    assert pending() == 2


def test_pending_without_the_chains_key_counts_every_scheduled_entry(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.timeout_zset, {"tick-a": 1, "message": 2})
    redis_client.hset(keys.chains, "a", "tick-a")
    assert lua("pending")(keys=_keys(keys)[:3]) == 2


def test_pending_writes_nothing(pending: Callable[[], Any], keys: QueueKeys, redis_client: redis.Redis) -> None:
    redis_client.zadd(keys.timeout_zset, {"s": 1})
    redis_client.hset(keys.chains, "a", "s")
    redis_client.hset(keys.ready_msgs, "r", "x")
    redis_client.hset(keys.legacy_dq_msgs, "d", "x")
    before = snapshot(redis_client)
    assert pending() == 2
    assert snapshot(redis_client) == before
