"""Weighted fair share (flow_take.lua, limits.lua's "weights"): within a priority, a
group of weight w takes up to w ids per turn of the round-robin (it stays at its ring's head
for the rest of its turn, "c<lane>" in the flow hash), whatever the fetch sizes; a turn cut
short by a limit, or by the lane running dry, starts over next time."""

from __future__ import annotations

import redis

from dramatiq_redisson._keys import QueueKeys, lane_id

from .state import Lua, fetch_ids, turn_flow_on

CLOCK = 1_700_000_000_000


def _ready(client: redis.Redis, keys: QueueKeys, lane: str, *ids: str) -> None:
    if client.rpush(keys.lane(lane), *ids) == len(ids):
        priority = int(lane.split(":")[0])
        client.rpush(keys.ring(priority), lane)
        client.zadd(keys.levels, {str(priority): priority})
    client.hset(keys.ready_msgs, mapping={i: f"data-{i}".encode() for i in ids})


def _weights(lua: Lua, keys: QueueKeys, **weights: int) -> list[int]:
    pairs: list[object] = []
    for group, weight in weights.items():
        pairs += [group.encode().hex(), weight]
    return lua("limits")(
        keys=[keys.flow, keys.ready, keys.levels, keys.idle],
        args=["weights", "", "", "", "", "", *keys.flow_affixes, keys.wake_prefix, keys.rate_prefix, *pairs],
    )


def _letters(ids: list[bytes]) -> str:
    return "".join(i.decode()[0] for i in ids)


def test_a_group_of_weight_3_takes_three_ids_per_turn(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    turn_flow_on(redis_client, keys)
    _weights(lua, keys, a=3)
    _ready(redis_client, keys, lane_id(0, "a"), *(f"a{n}" for n in range(10)))
    _ready(redis_client, keys, lane_id(0, "b"), *(f"b{n}" for n in range(10)))
    assert _letters(fetch_ids(lua, keys, 12, CLOCK)) == "aaabaaabaaab"


def test_a_turn_goes_on_across_fetches_of_one_message(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    turn_flow_on(redis_client, keys)
    _weights(lua, keys, a=3, b=2)
    _ready(redis_client, keys, lane_id(0, "a"), *(f"a{n}" for n in range(10)))
    _ready(redis_client, keys, lane_id(0, "b"), *(f"b{n}" for n in range(10)))
    _ready(redis_client, keys, lane_id(0, "c"), *(f"c{n}" for n in range(10)))
    taken = "".join(_letters(fetch_ids(lua, keys, 1, CLOCK)) for _ in range(12))
    assert taken == "aaabbcaaabbc"
    assert redis_client.hget(keys.flow, "c" + lane_id(0, "a")) is None  # between turns


def test_a_turn_cut_short_by_a_group_limit_starts_over(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    turn_flow_on(redis_client, keys, group_concurrency=2)
    _weights(lua, keys, a=3)
    a = lane_id(0, "a")
    _ready(redis_client, keys, a, *(f"a{n}" for n in range(10)))
    _ready(redis_client, keys, lane_id(0, "b"), *(f"b{n}" for n in range(10)))
    # a is at its limit after 2 of its 3, b after 2 of its 1-id turns
    assert _letters(fetch_ids(lua, keys, 5, CLOCK)) == "aabb"
    assert redis_client.hget(keys.flow, "c" + a) is None  # its next turn is a whole one
    assert redis_client.hget(keys.flow, "b" + b"a".hex()) == a.encode()


def test_weights_are_set_exactly_and_turns_under_way_start_over(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    _weights(lua, keys, a=3, b=5)
    redis_client.hset(keys.flow, "c" + lane_id(0, "a"), 2)  # a turn under way
    _weights(lua, keys, b=4)
    flow = redis_client.hgetall(keys.flow)
    assert flow == {b"on": b"1", b"w62": b"4", b"weights": b"1"}
    _weights(lua, keys)
    assert redis_client.hgetall(keys.flow) == {b"on": b"1"}


def test_a_weight_of_a_group_not_waiting_changes_nothing_for_the_others(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    _weights(lua, keys, z=5)
    _ready(redis_client, keys, lane_id(0, "a"), "a0", "a1")
    _ready(redis_client, keys, lane_id(0, "b"), "b0", "b1")
    assert _letters(fetch_ids(lua, keys, 4, CLOCK)) == "abab"
    assert [f for f in redis_client.hkeys(keys.flow) if f.startswith(b"c")] == []
