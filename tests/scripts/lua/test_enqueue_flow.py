"""enqueue.lua with the flow keys (flow_context.lua): a message with a lane turns the queue's flow
on and goes to its lane (which joins its priority's ring); while flow is on, plain messages
still go to the ready queue, and the ready queue joins ring 0 when it gets its first id; a
call without lanes on a queue without flow is today's enqueue."""

from __future__ import annotations

import redis

from dramatiq_redisson._keys import PLAIN_LANE, QueueKeys, lane_id

from .state import Lua, fetch_ids


def _enqueue(lua: Lua, keys: QueueKeys, *triples: tuple[str, str, str]) -> list[int]:
    args: list[str | int] = [0, "", "", *keys.flow_affixes]
    for triple in triples:
        args.extend(triple)
    return lua("enqueue")(
        keys=[keys.ready, keys.ready_msgs, keys.channel, keys.sent, keys.idle, *keys.flow_keys], args=args
    )


def _fetch(lua: Lua, keys: QueueKeys, count: int) -> list[bytes]:
    return fetch_ids(lua, keys, count, 1)


def test_plain_messages_on_a_queue_without_flow_go_to_the_ready_queue_and_turn_nothing_on(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert _enqueue(lua, keys, ("a", "A", ""), ("b", "B", PLAIN_LANE)) == [2, 2, 0]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"a", b"b"]
    assert redis_client.exists(keys.flow, keys.levels, keys.ring(0)) == 0


def test_a_message_with_a_lane_turns_flow_on_and_the_fetch_takes_the_waiting_ready_queue_in_turn(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _enqueue(lua, keys, ("old", "O", ""))
    high = lane_id(7, "acme")
    _enqueue(lua, keys, ("h1", "H1", high), ("p1", "P1", ""))
    assert redis_client.get(keys.flow_flag) == b"1"
    assert redis_client.lrange(keys.lane(high), 0, -1) == [b"h1"]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"old", b"p1"]
    assert redis_client.lrange(keys.ring(7), 0, -1) == [high.encode()]
    # The plain lane is in no ring yet: the fetch puts it in ring 0 when it finds ids there
    assert redis_client.exists(keys.ring(0)) == 0
    assert redis_client.zrange(keys.levels, 0, -1, withscores=True) == [(b"7", 7.0)]
    assert redis_client.hgetall(keys.ready_msgs) == {b"old": b"O", b"h1": b"H1", b"p1": b"P1"}
    assert _fetch(lua, keys, 3) == [b"h1", b"old", b"p1"]


def test_while_flow_is_on_a_plain_send_writes_as_without_lanes_and_the_fetch_takes_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _enqueue(lua, keys, ("g", "G", lane_id(0, "g")))
    assert _fetch(lua, keys, 5) == [b"g"]
    assert redis_client.exists(keys.levels) == 0
    _enqueue(lua, keys, ("p", "P", ""))
    assert redis_client.lrange(keys.ready, 0, -1) == [b"p"]
    assert redis_client.exists(keys.ring(0), keys.levels) == 0
    assert _fetch(lua, keys, 5) == [b"p"]
    # The plain lane left ring 0 with its last id
    assert redis_client.exists(keys.ring(0), keys.levels) == 0
    assert redis_client.hexists(keys.flow, "plain") == 0


def test_a_duplicate_goes_nowhere_and_a_lane_keeps_send_order(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    lane = lane_id(3, None)
    _enqueue(lua, keys, ("a", "A", lane), ("b", "B", lane))
    assert _enqueue(lua, keys, ("a", "A2", lane), ("c", "C", lane))[1] == 1
    assert redis_client.lrange(keys.lane(lane), 0, -1) == [b"a", b"b", b"c"]
    assert redis_client.hget(keys.ready_msgs, "a") == b"A"
    assert redis_client.lrange(keys.ring(3), 0, -1) == [lane.encode()]
