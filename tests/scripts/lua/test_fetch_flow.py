"""fetch.lua through lanes (flow_take.lua): with the queue's ``flow`` key set, a fetch takes the
highest priority first and the lanes of one priority in turn (one id per lane per turn), so
one group's backlog does not delay another's; the fetch record names the lane; emptied
lanes leave their ring and emptied rings leave ``levels``. Without the key, the lanes are
not looked at (a plain queue's fetch is today's)."""

from __future__ import annotations

import redis

from dramatiq_redisson._keys import PLAIN_LANE, QueueKeys, lane_id

from .state import Lua, fetch_ids, turn_flow_on

CLOCK = 1_700_000_000_000


def _fetch(lua: Lua, keys: QueueKeys, count: int) -> list[bytes]:
    return fetch_ids(lua, keys, count, CLOCK)


def _ready(client: redis.Redis, keys: QueueKeys, lane: str, *ids: str) -> None:
    """Ids made ready in ``lane`` as the pushing scripts leave them: a lane that was empty
    joins its priority's ring, but the plain lane (the fetch takes it in turn)."""
    if client.rpush(keys.lane(lane), *ids) == len(ids) and lane != PLAIN_LANE:
        priority = int(lane.split(":")[0])
        client.rpush(keys.ring(priority), lane)
        client.zadd(keys.levels, {str(priority): priority})
    client.hset(keys.ready_msgs, mapping={i: f"data-{i}".encode() for i in ids})


def test_without_the_flow_key_a_fetch_takes_the_head_of_the_ready_queue_and_ignores_lanes(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _ready(redis_client, keys, lane_id(5, None), "high")
    _ready(redis_client, keys, PLAIN_LANE, "plain")
    assert _fetch(lua, keys, 5) == [b"plain"]
    assert redis_client.lrange(keys.lane(lane_id(5, None)), 0, -1) == [b"high"]


def test_the_highest_priority_comes_first_and_fifo_within_a_priority(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    _ready(redis_client, keys, PLAIN_LANE, "p0-a", "p0-b")
    _ready(redis_client, keys, lane_id(1, None), "p1-a")
    _ready(redis_client, keys, lane_id(9, None), "p9-a", "p9-b")
    assert _fetch(lua, keys, 3) == [b"p9-a", b"p9-b", b"p1-a"]
    assert _fetch(lua, keys, 5) == [b"p0-a", b"p0-b"]
    assert _fetch(lua, keys, 5) == []
    assert redis_client.exists(keys.levels, keys.ring(0), keys.ring(1), keys.ring(9)) == 0


def test_groups_of_one_priority_take_turns_so_a_backlog_does_not_delay_another_group(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    big, small = lane_id(0, "tenant-big"), lane_id(0, "tenant-small")
    _ready(redis_client, keys, big, *(f"big-{n}" for n in range(50)))
    _ready(redis_client, keys, small, "small-0", "small-1")
    _ready(redis_client, keys, PLAIN_LANE, "plain-0")
    taken = _fetch(lua, keys, 6)
    assert taken == [b"big-0", b"small-0", b"plain-0", b"big-1", b"small-1", b"big-2"]
    # The emptied lanes left the ring; the big one is the only one left in it.
    assert redis_client.lrange(keys.ring(0), 0, -1) == [big.encode()]
    assert redis_client.llen(keys.lane(big)) == 47


def test_each_fetch_record_holds_a_slot_and_names_its_lane_but_the_plain_lanes(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    group = lane_id(2, "a{b}c")
    _ready(redis_client, keys, group, "g")
    _ready(redis_client, keys, PLAIN_LANE, "p")
    assert _fetch(lua, keys, 2) == [b"g", b"p"]
    assert redis_client.hgetall(keys.fetched) == {
        b"g": f"{CLOCK}|w1|tok|held|lane:{group}".encode(),
        b"p": f"{CLOCK}|w1|tok|held".encode(),
    }
    assert redis_client.smembers(keys.acks("w1")) == {b"g", b"p"}
    # Both hold a slot of the queue, and "g" one of its group
    flow = redis_client.hgetall(keys.flow)
    assert (flow[b"inuse"], flow[b"g" + b"a{b}c".hex().encode()], flow[b"groups"]) == (b"2", b"1", b"1")


def test_a_lane_key_stays_in_the_queues_slot_whatever_the_group_name(keys: QueueKeys) -> None:
    from redis.crc import key_slot

    for group in ("a{b}c", "}", "{", "tenant:1", "ü"):
        assert key_slot(keys.lane(lane_id(3, group)).encode()) == key_slot(keys.timeout_zset.encode())
        assert keys.lane(lane_id(3, group)).endswith("}")


def _requeue(lua: Lua, keys: QueueKeys, *ids: str) -> int:
    return lua("requeue")(
        keys=[keys.acks("w1"), keys.ready_msgs, keys.ready, keys.idle, keys.channel, keys.fetched, *keys.flow_keys],
        args=[*keys.flow_affixes, *ids],
    )


def test_a_requeue_puts_each_id_back_at_the_head_of_its_own_lane_in_fetch_order(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    a, b = lane_id(0, "a"), lane_id(4, "b")
    _ready(redis_client, keys, a, "a1", "a2", "a3")
    _ready(redis_client, keys, b, "b1", "b2")
    _ready(redis_client, keys, PLAIN_LANE, "p1")
    taken = _fetch(lua, keys, 4)
    assert taken == [b"b1", b"b2", b"a1", b"p1"]
    assert _requeue(lua, keys, "b1", "b2", "a1", "p1") == 4
    assert redis_client.lrange(keys.lane(b), 0, -1) == [b"b1", b"b2"]
    assert redis_client.lrange(keys.lane(a), 0, -1) == [b"a1", b"a2", b"a3"]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"p1"]
    assert redis_client.hlen(keys.fetched) == 0
    assert redis_client.scard(keys.acks("w1")) == 0
    # The emptied lanes came back to their rings: the same fetch again takes the same ids.
    assert _fetch(lua, keys, 4) == taken


def test_a_requeue_without_flow_puts_ids_back_at_the_head_of_the_ready_queue(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _ready(redis_client, keys, PLAIN_LANE, "p1", "p2", "p3")
    redis_client.delete(keys.ring(0), keys.levels)  # as a queue without flow has them
    assert _fetch(lua, keys, 2) == [b"p1", b"p2"]
    assert _requeue(lua, keys, "p1", "p2") == 2
    assert redis_client.lrange(keys.ready, 0, -1) == [b"p1", b"p2", b"p3"]
    assert redis_client.exists(keys.levels, keys.ring(0)) == 0


def test_a_dead_workers_messages_go_back_to_the_heads_of_their_own_lanes(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    a = lane_id(2, "a")
    _ready(redis_client, keys, a, "a1", "a2")
    _ready(redis_client, keys, PLAIN_LANE, "p1")
    assert _fetch(lua, keys, 3) == [b"a1", b"a2", b"p1"]
    # w1 stopped beating 60 s before the newest beat (w2's).
    redis_client.zadd(keys.alive, {"w1": CLOCK - 60_000, "w2": CLOCK})
    reply = lua("reap")(
        keys=[
            keys.alive,
            keys.ready,
            keys.ready_msgs,
            keys.idle,
            keys.channel,
            keys.fetched,
            *keys.flow_keys,
            keys.acks("w1"),
        ],
        args=[10_000, 3_600_000, 0, *keys.flow_affixes, "w1"],
    )
    assert reply == [3, 1]
    # Back in their own lanes. The order of a dead worker's ids within a lane is its ack
    # set's (SMEMBERS): insertion order on Valkey 9, any order on Redis 6.2, as on a plain
    # queue. (With a group limit of 1 a group has one message in flight: nothing to order.)
    assert sorted(redis_client.lrange(keys.lane(a), 0, -1)) == [b"a1", b"a2"]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"p1"]
    assert redis_client.hlen(keys.fetched) == 0
    again = _fetch(lua, keys, 3)
    assert sorted(again[:2]) == [b"a1", b"a2"] and again[2] == b"p1"


def test_maintenance_puts_a_dead_workers_messages_back_to_their_own_lanes(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    a = lane_id(1, "a")
    _ready(redis_client, keys, a, "a1")
    _ready(redis_client, keys, PLAIN_LANE, "p1")
    assert _fetch(lua, keys, 2) == [b"a1", b"p1"]
    reply = lua("maintenance")(
        keys=[
            keys.ready,
            keys.ready_msgs,
            keys.xq,
            keys.xq_msgs,
            keys.legacy_dq,
            keys.legacy_dq_msgs,
            keys.fetched,
            *keys.flow_keys,
            keys.acks("w1"),
            keys.legacy_dq_acks("w1"),
        ],
        args=[86_400_000, 100, *keys.flow_affixes],
    )
    assert reply == [2, 0]
    assert redis_client.lrange(keys.lane(a), 0, -1) == [b"a1"]
    assert redis_client.lrange(keys.ready, 0, -1) == [b"p1"]
    assert _fetch(lua, keys, 2) == [b"a1", b"p1"]


def test_a_dead_letter_keeps_its_lane_and_a_requeue_puts_it_back_there(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys)
    lane = lane_id(6, "acme")
    _ready(redis_client, keys, lane, "m1", "m2")
    assert _fetch(lua, keys, 2) == [b"m1", b"m2"]
    for message_id in ("m1", "m2"):
        moved = lua("nack")(
            keys=[
                keys.acks("w1"),
                keys.ready_msgs,
                keys.xq,
                keys.xq_msgs,
                keys.heartbeats,
                keys.fetched,
                *keys.history_keys,
                keys.lane_of,
            ],
            args=[message_id, "w1"],
        )
        assert moved == 1
    assert redis_client.hgetall(keys.lane_of) == {b"m1": lane.encode(), b"m2": lane.encode()}
    assert redis_client.exists(keys.levels) == 0  # nothing ready

    dead = lua("dead")
    dead_keys = [keys.xq, keys.xq_msgs, keys.ready, keys.ready_msgs, keys.idle, keys.channel, *keys.flow_keys]
    assert dead(keys=dead_keys, args=["requeue", 10, *keys.flow_affixes, "m1"]) == 1
    assert redis_client.lrange(keys.lane(lane), 0, -1) == [b"m1"]
    assert redis_client.lrange(keys.ring(6), 0, -1) == [lane.encode()]
    assert dead(keys=dead_keys, args=["remove", 10, *keys.flow_affixes, "m2"]) == 1
    assert redis_client.exists(keys.lane_of) == 0
    assert _fetch(lua, keys, 2) == [b"m1"]


def test_a_queue_at_its_concurrency_limit_takes_no_more(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    turn_flow_on(redis_client, keys, **{"concurrency": 3, "inuse": 1})
    _ready(redis_client, keys, PLAIN_LANE, *(f"p{i}" for i in range(5)))
    # Given 1 of 3 slots in use, a fetch of 5 takes 2
    assert _fetch(lua, keys, 5) == [b"p0", b"p1"]
    assert redis_client.hget(keys.flow, "inuse") == b"3"
    # and the next takes nothing, leaving the rest where it was
    assert _fetch(lua, keys, 5) == []
    assert redis_client.lrange(keys.ready, 0, -1) == [b"p2", b"p3", b"p4"]


def test_a_group_at_its_limit_waits_off_its_ring_while_other_groups_run(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    turn_flow_on(redis_client, keys, **{"group_concurrency": 1})
    a, b = lane_id(0, "a"), lane_id(0, "b")
    _ready(redis_client, keys, a, "a1", "a2", "a3")
    _ready(redis_client, keys, b, "b1", "b2")
    # One at a time per group: a fetch of 5 takes one of each
    assert _fetch(lua, keys, 5) == [b"a1", b"b1"]
    assert redis_client.llen(keys.ring(0)) == 0
    assert redis_client.hget(keys.flow, "b" + b"a".hex()) == a.encode()
    assert redis_client.hget(keys.flow, "blocked") == b"2"
    assert _fetch(lua, keys, 5) == []
    assert redis_client.lrange(keys.lane(a), 0, -1) == [b"a2", b"a3"]
