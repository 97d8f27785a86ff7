"""stats.lua: one queue's counts read together on the server clock (ready, in flight,
scheduled, overdue, earliest due time, dead letters, the lease holder, live consumers, the
built-in delay queue's length, since when it is paused, the latency, the messages put back
for an unknown actor). Reads only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._ids import sort_key_at
from dramatiq_redisson._keys import QueueKeys

from .state import Lua, snapshot, turn_flow_on


def _keys(keys: QueueKeys) -> list[str]:
    """stats.lua's KEYS, as scripts._calls.Scripts.stats passes them."""
    return [
        keys.ready,
        keys.ready_msgs,
        keys.timeout_zset,
        keys.xq,
        keys.lease,
        keys.consumers,
        keys.legacy_dq,
        keys.paused,
        keys.sent,
        keys.counts,
    ]


@pytest.fixture
def stats(lua: Lua, keys: QueueKeys) -> Callable[[int, int], Any]:
    script = lua("stats")
    return lambda grace_ms, live_ms: script(keys=_keys(keys), args=[grace_ms, live_ms])


def test_stats_of_an_empty_queue(
    stats: Callable[[int, int], Any], redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    before = server_ms()
    reply = stats(1_000, 30_000)
    assert before <= reply[0] <= server_ms()
    assert reply[1:] == [0, 0, 0, 0, -1, 0, b"", 0, 0, -1, 0, 0]
    assert redis_client.keys("*") == []


def test_stats_counts_every_part_of_a_queue(
    stats: Callable[[int, int], Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    redis_client.rpush(keys.ready, "r1", "r2")
    redis_client.hset(keys.ready_msgs, mapping={"r1": "x", "r2": "x", "flight": "x"})
    redis_client.zadd(keys.timeout_zset, {"late": now - 60_000, "later": now - 30_000, "future": now + 60_000})
    redis_client.zadd(keys.xq, {"d1": now, "d2": now, "d3": now, "d4": now})
    redis_client.set(keys.lease, f"tok-1 {now + 5_000}")
    redis_client.zadd(keys.consumers, {"tok-1": now, "tok-2": now - 10_000, "gone": now - 3_600_000})
    redis_client.rpush(keys.legacy_dq, "old")
    redis_client.set(keys.paused, now - 2_000)
    reply = stats(1_000, 60_000)
    # (the ready ids' wait is not timed: no record, no sort key, no message_timestamp: 0)
    assert reply[1:] == [2, 3, 3, 2, now - 60_000, 4, b"tok-1", 2, 1, now - 2_000, 0, 0]


def test_stats_reads_the_count_of_messages_put_back_for_an_unknown_actor(
    stats: Callable[[int, int], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # Given three put-backs counted (as _unknown_actors.py counts them)
    redis_client.hincrby(keys.counts, "unknown_actor", 3)
    # Then the slot after the latency reads 3
    assert stats(0, 0)[12] == 3


def test_stats_counts_as_overdue_only_entries_due_more_than_the_grace_ago(
    stats: Callable[[int, int], Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    redis_client.zadd(keys.timeout_zset, {"hour": now - 3_600_000, "minute": now - 60_000, "second": now - 1_000})
    assert stats(30_000, 0)[4] == 2
    assert stats(600_000, 0)[4] == 1
    assert stats(7_200_000, 0)[4] == 0
    assert stats(-3_600_000, 0)[4] == 3


def test_stats_counts_as_live_only_consumers_seen_within_the_window(
    stats: Callable[[int, int], Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    redis_client.zadd(keys.consumers, {"a": now - 1_000, "b": now - 20_000, "c": now - 120_000})
    assert stats(0, 10_000)[8] == 1
    assert stats(0, 60_000)[8] == 2
    assert stats(0, 600_000)[8] == 3


def test_stats_reads_the_lease_holder_token_before_its_expiry(
    stats: Callable[[int, int], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.lease, "host a:123 1700000000000")
    assert stats(0, 0)[7] == b"host a:123"
    redis_client.set(keys.lease, "malformed")
    assert stats(0, 0)[7] == b""


def test_stats_reads_a_pause_mark_without_a_time_as_0(
    stats: Callable[[int, int], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.paused, "yes")
    assert stats(0, 0)[10] == 0


def test_stats_writes_nothing(
    stats: Callable[[int, int], Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    now = server_ms()
    redis_client.rpush(keys.ready, "r1")
    redis_client.zadd(keys.timeout_zset, {"late": now - 60_000})
    redis_client.set(keys.lease, f"tok {now}")
    redis_client.zadd(keys.consumers, {"tok": now})
    redis_client.set(keys.paused, now)
    before = snapshot(redis_client)
    stats(0, 1_000)
    assert snapshot(redis_client) == before


def test_stats_with_lanes_counts_each_waiting_priority_and_its_lanes(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    flow_keys = [*_keys(keys), keys.flow, keys.levels]
    script = lua("stats")
    # Without the flow hash: the reply ends where it always did, though lanes are passed
    assert len(script(keys=flow_keys, args=[1_000, 30_000, keys.ring_prefix])) == 13
    # Given lanes at priorities 0 and 3 (counters as flow_push.lua keeps them)
    redis_client.rpush(keys.ready, "plain")
    turn_flow_on(redis_client, keys, **{"p3": 5, "p0": 2, "blocked": 4})
    redis_client.zadd(keys.levels, {"0": 0, "3": 3})
    redis_client.rpush(keys.ring(0), "0:", "0:61")
    redis_client.rpush(keys.ring(3), "3:", "3:61", "3:62")
    before = snapshot(redis_client)
    reply = script(keys=flow_keys, args=[1_000, 30_000, keys.ring_prefix])
    # Then the lanes blocked by their group's limit, the lanes in the rings, and each
    # priority with ids waiting in its lanes (the plain lane's are the ready count)
    assert reply[13:] == [4, 5, 0, 2, 3, 5]
    assert snapshot(redis_client) == before


def test_the_latency_is_the_oldest_ready_head_s_wait_by_its_record_its_sort_key_or_its_send(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    script = lua("stats")
    flow_keys = [*_keys(keys), keys.flow, keys.levels]

    def latency() -> int:
        reply = script(keys=flow_keys, args=[1_000, 30_000, keys.ring_prefix, keys.rate_prefix, keys.lane_prefix])
        return int(reply[11])

    now = server_ms()
    # The head of the ready list, recorded as ready 5 s ago (enqueue.lua, transfer.lua)
    redis_client.rpush(keys.ready, "m1", "m2")
    redis_client.zadd(keys.sent, {"m1": now - 5_000, "m2": now - 1_000})
    assert 5_000 <= latency() <= 5_000 + 200
    # A head without a record: a delayed one by its sort key (sent 9 s ago), an immediate
    # one by its message_timestamp (sent 7 s ago)
    redis_client.delete(keys.ready, keys.sent)
    redis_client.rpush(keys.ready, sort_key_at(now - 9_000) + "m3")
    assert 9_000 <= latency() <= 9_000 + 200
    redis_client.delete(keys.ready)
    redis_client.rpush(keys.ready, "m4")
    redis_client.hset(keys.ready_msgs, "m4", f'{{"message_timestamp":{now - 7_000}}}')
    assert 7_000 <= latency() <= 7_000 + 200
    # With lanes: a lane's head older than the ready list's counts
    turn_flow_on(redis_client, keys, p3=1)
    redis_client.zadd(keys.levels, {"3": 3})
    redis_client.rpush(keys.ring(3), "3:61")
    redis_client.rpush(keys.lane("3:61"), "m5")
    redis_client.zadd(keys.sent, {"m5": now - 20_000})
    assert 20_000 <= latency() <= 20_000 + 200
    # Nothing ready: 0
    redis_client.delete(keys.ready, keys.lane("3:61"))
    assert latency() == 0
