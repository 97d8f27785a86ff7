"""ack.lua: a fetched message was processed: drop it from the worker's ack set, its payload
and its fetch record, count it in the queue's activity history (processed, or retried) once,
and beat the worker's heartbeat."""

from __future__ import annotations

import struct
from collections.abc import Callable

import redis

from dramatiq_redisson._keys import QueueKeys
from dramatiq_redisson.admin._history import RING_HOURS, RING_MINUTES

from .pubsub import listening
from .state import Lua

CLOCK = 1_700_000_000_000  # epoch ms, mid-minute
MINUTE = CLOCK // 60_000


def ack_keys(keys: QueueKeys, worker_id: str = "w1") -> list[str]:
    return [keys.acks(worker_id), keys.ready_msgs, keys.heartbeats, keys.fetched, *keys.history_keys]


def fetched(client: redis.Redis, keys: QueueKeys, *ids: str, worker_id: str = "w1") -> None:
    """``ids`` as a fetch leaves them: in the ack set, with their payload and fetch record."""
    client.sadd(keys.acks(worker_id), *ids)
    client.hset(keys.ready_msgs, mapping={i: b"data" for i in ids})
    client.hset(keys.fetched, mapping={i: f"{CLOCK}|{worker_id}|tok" for i in ids})


def minute_slot(client: redis.Redis, keys: QueueKeys, minute: int) -> tuple[int, ...]:
    """{stamp, processed, failed, retried} of ``minute``'s slot (see lua/include/record_history.lua)."""
    at = 16 + 16 * (minute % RING_MINUTES)
    return struct.unpack(">IIII", client.getrange(keys.minutes, at, at + 15).ljust(16, b"\0"))


def hour_slot(client: redis.Redis, keys: QueueKeys, hour: int) -> tuple[int, ...]:
    at = 16 * (hour % RING_HOURS)
    return struct.unpack(">IIII", client.getrange(keys.hours, at, at + 15).ljust(16, b"\0"))


def last_minute(client: redis.Redis, keys: QueueKeys) -> int:
    """The minutes ring's header: the last active minute not yet added to its hour."""
    return int(struct.unpack(">I", client.getrange(keys.minutes, 0, 3).ljust(4, b"\0"))[0])


def test_ack_forgets_the_message_counts_it_processed_and_beats(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1", "m2")

    assert lua("ack")(keys=ack_keys(keys), args=["m1", "w1", "1", "1", CLOCK]) == 1

    assert redis_client.smembers(keys.acks("w1")) == {b"m2"}
    assert list(redis_client.hgetall(keys.ready_msgs)) == [b"m2"]
    assert list(redis_client.hgetall(keys.fetched)) == [b"m2"]
    assert redis_client.zrange(keys.heartbeats, 0, -1, withscores=True) == [(b"w1", CLOCK)]
    assert minute_slot(redis_client, keys, MINUTE) == (MINUTE, 1, 0, 0)
    assert last_minute(redis_client, keys) == MINUTE
    assert not redis_client.exists(keys.hours)  # nothing rolled up yet


def test_ack_repeated_after_a_lost_reply_returns_0_and_counts_once(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1")
    ack = lua("ack")

    assert ack(keys=ack_keys(keys), args=["m1", "w1", "0", "1", CLOCK]) == 1
    assert ack(keys=ack_keys(keys), args=["m1", "w1", "0", "1", CLOCK + 1]) == 0

    assert minute_slot(redis_client, keys, MINUTE) == (MINUTE, 1, 0, 0)


def test_ack_of_a_retried_message_counts_it_as_retried(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    fetched(redis_client, keys, "m1", "m2")
    ack = lua("ack")

    ack(keys=ack_keys(keys), args=["m1", "w1", "0", "3", CLOCK])
    ack(keys=ack_keys(keys), args=["m2", "w1", "0", "1", CLOCK + 5])

    assert minute_slot(redis_client, keys, MINUTE) == (MINUTE, 1, 0, 1)


def test_ack_of_a_message_not_in_the_ack_set_leaves_its_payload_and_counts_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # Requeued meanwhile (by a reap): queued again, its payload is the queued copy's.
    redis_client.rpush(keys.ready, "m1")
    redis_client.hset(keys.ready_msgs, "m1", b"data")

    assert lua("ack")(keys=ack_keys(keys), args=["m1", "w1", "1", "1", CLOCK]) == 0

    assert redis_client.hget(keys.ready_msgs, "m1") == b"data"
    assert not redis_client.exists(keys.minutes, keys.hours)
    assert redis_client.zscore(keys.heartbeats, "w1") == CLOCK  # the beat is written anyway


def test_ack_with_beat_zero_leaves_the_heartbeat_alone(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    fetched(redis_client, keys, "m1")
    redis_client.zadd(keys.heartbeats, {"w1": 5})

    assert lua("ack")(keys=ack_keys(keys), args=["m1", "w1", "0", "1", CLOCK]) == 1

    assert redis_client.zscore(keys.heartbeats, "w1") == 5


def test_ack_without_a_clock_estimate_uses_the_server_clock(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    fetched(redis_client, keys, "m1")

    before = server_ms()
    assert lua("ack")(keys=ack_keys(keys), args=["m1", "w1", "1", "1"]) == 1
    after = server_ms()

    beat = redis_client.zscore(keys.heartbeats, "w1")
    assert beat is not None and before <= beat <= after
    minute = last_minute(redis_client, keys)
    assert before // 60_000 <= minute <= after // 60_000
    assert minute_slot(redis_client, keys, minute) == (minute, 1, 0, 0)


def test_ack_in_a_new_minute_adds_the_last_active_minute_to_its_hour(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1", "m2", "m3")
    ack = lua("ack")

    ack(keys=ack_keys(keys), args=["m1", "w1", "0", "1", CLOCK])
    ack(keys=ack_keys(keys), args=["m2", "w1", "0", "3", CLOCK + 1])
    ack(keys=ack_keys(keys), args=["m3", "w1", "0", "1", CLOCK + 60_000])

    assert last_minute(redis_client, keys) == MINUTE + 1
    assert minute_slot(redis_client, keys, MINUTE + 1) == (MINUTE + 1, 1, 0, 0)
    assert hour_slot(redis_client, keys, MINUTE // 60) == (MINUTE // 60, 1, 0, 1)


def _held_ack(lua: Lua, keys: QueueKeys, message_id: str) -> int:
    """ack.lua as the broker calls it for a message fetched through lanes (it holds slots)."""
    return int(
        lua("ack")(
            keys=[*ack_keys(keys), keys.flow, keys.levels, keys.idle],
            args=[message_id, "w1", "0", "1", CLOCK, *keys.flow_affixes, keys.wake_prefix],
        )
    )


def test_an_ack_gives_back_the_slots_of_its_queue_and_group_and_wakes_an_idle_consumer(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, listen: Callable[[str], Callable[[], list[bytes]]]
) -> None:
    from dramatiq_redisson._keys import lane_id

    group = b"a".hex()
    lane = lane_id(0, "a")
    # Given a message of group "a" holding the group's only slot, the group's lane blocked
    # with one more id, and an idle consumer
    fetched(redis_client, keys, "m1")
    redis_client.hset(keys.fetched, "m1", f"{CLOCK}|w1|tok|held|lane:{lane}")
    redis_client.hset(
        keys.flow, mapping={"on": 1, "group_concurrency": 1, "inuse": 1, "groups": 1, f"g{group}": 1, "blocked": 1}
    )
    redis_client.hset(keys.flow, f"b{group}", lane)
    redis_client.rpush(keys.lane(lane), "m2")
    redis_client.zadd(keys.idle, {"tok-2": 1})
    woken = listen(keys.wake_channel("tok-2"))
    # When it is acked
    assert _held_ack(lua, keys, "m1") == 1
    # Then its slots are free, the lane is back on its ring, and the idle consumer woken
    assert redis_client.hgetall(keys.flow) == {
        b"on": b"1",
        b"group_concurrency": b"1",
        b"inuse": b"0",
        b"groups": b"0",
        b"blocked": b"0",
    }
    assert redis_client.lrange(keys.ring(0), 0, -1) == [lane.encode()]
    assert redis_client.zrange(keys.levels, 0, -1) == [b"0"]
    assert woken() == [b"0"]
    # and a repeated ack (a lost reply) gives nothing back twice
    assert _held_ack(lua, keys, "m1") == 0
    assert redis_client.hget(keys.flow, "inuse") == b"0"


# -- a thread free again: the idle registry (issue 46) ------------------------------------


def _idle_args(keys: QueueKeys, token: str, score: int) -> list[object]:
    return ["idle", token, score, keys.wake_channel(token)]


def test_ack_raises_the_consumers_listing_to_what_it_can_start(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1")
    redis_client.zadd(keys.idle, {"tok": 1})
    args = ["m1", "w1", "0", "1", CLOCK, *_idle_args(keys, "tok", 3)]
    assert lua("ack")(keys=[*ack_keys(keys), keys.idle, keys.ready], args=args) == 1
    assert redis_client.zscore(keys.idle, "tok") == 3


def test_ack_leaves_a_consumer_woken_meanwhile_out_of_the_registry(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1")
    args = ["m1", "w1", "0", "1", CLOCK, *_idle_args(keys, "tok", 3)]
    lua("ack")(keys=[*ack_keys(keys), keys.idle, keys.ready], args=args)
    assert redis_client.zcard(keys.idle) == 0


def test_ack_of_a_busy_listed_consumer_wakes_it_when_messages_wait(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # Listed at 0, every wake-up passed it over: messages that came meanwhile wait in the
    # ready queue. Its first free thread fetches them.
    fetched(redis_client, keys, "m1")
    redis_client.zadd(keys.idle, {"tok": 0})
    redis_client.rpush(keys.ready, "waiting")
    with listening(redis_client, keys.wake_channel("tok")) as got:
        args = ["m1", "w1", "0", "1", CLOCK, *_idle_args(keys, "tok", 1)]
        lua("ack")(keys=[*ack_keys(keys), keys.idle, keys.ready], args=args)
        assert got() == [(keys.wake_channel("tok"), b"0")]
    assert redis_client.zscore(keys.idle, "tok") == 0  # its fetch lists it again


def test_ack_of_a_busy_listed_consumer_with_nothing_waiting_only_lists_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1")
    redis_client.zadd(keys.idle, {"tok": 0})
    with listening(redis_client, keys.wake_channel("tok")) as got:
        args = ["m1", "w1", "0", "1", CLOCK, *_idle_args(keys, "tok", 1)]
        lua("ack")(keys=[*ack_keys(keys), keys.idle, keys.ready], args=args)
        assert got() == []
    assert redis_client.zscore(keys.idle, "tok") == 1


def test_ack_wakes_a_consumer_listed_above_zero_too_when_messages_wait(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # Its listing lagged (a fetch and an ack crossed): wake-ups may have passed it over.
    fetched(redis_client, keys, "m1")
    redis_client.zadd(keys.idle, {"tok": 1})
    redis_client.rpush(keys.ready, "waiting")
    with listening(redis_client, keys.wake_channel("tok")) as got:
        args = ["m1", "w1", "0", "1", CLOCK, *_idle_args(keys, "tok", 2)]
        lua("ack")(keys=[*ack_keys(keys), keys.idle, keys.ready], args=args)
        assert got() == [(keys.wake_channel("tok"), b"0")]
