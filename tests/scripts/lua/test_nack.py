"""nack.lua: move a fetched message from the worker's ack set and the ready queue's hash to the
queue's dead letters (scored by the time of death, with the message as it failed when given),
count it as failed in the activity history, and beat the worker's heartbeat."""

from __future__ import annotations

import struct
from collections.abc import Callable

import redis

from dramatiq_redisson._keys import QueueKeys
from dramatiq_redisson.admin._history import RING_MINUTES

from .state import Lua


def nack_keys(keys: QueueKeys, worker_id: str = "w1") -> list[str]:
    return [
        keys.acks(worker_id),
        keys.ready_msgs,
        keys.xq,
        keys.xq_msgs,
        keys.heartbeats,
        keys.fetched,
        *keys.history_keys,
    ]


def fetched(client: redis.Redis, keys: QueueKeys, *ids: str, worker_id: str = "w1") -> None:
    """``ids`` as a fetch leaves them: in the ack set, with their payload and fetch record."""
    client.sadd(keys.acks(worker_id), *ids)
    client.hset(keys.ready_msgs, mapping={i: f"data-{i}".encode() for i in ids})
    client.hset(keys.fetched, mapping={i: f"1|{worker_id}|tok" for i in ids})


def history_now(client: redis.Redis, keys: QueueKeys) -> tuple[int, tuple[int, ...]]:
    """The last active minute and its slot {stamp, processed, failed, retried}."""
    minute = struct.unpack(">I", client.getrange(keys.minutes, 0, 3).ljust(4, b"\0"))[0]
    at = 16 + 16 * (minute % RING_MINUTES)
    return minute, struct.unpack(">IIII", client.getrange(keys.minutes, at, at + 15).ljust(16, b"\0"))


def test_nack_moves_the_message_to_the_dead_letters_and_counts_it_failed(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    fetched(redis_client, keys, "m1", "m2")

    before = server_ms()
    assert lua("nack")(keys=nack_keys(keys), args=["m1", "w1"]) == 1
    after = server_ms()

    assert redis_client.smembers(keys.acks("w1")) == {b"m2"}
    assert list(redis_client.hgetall(keys.ready_msgs)) == [b"m2"]
    assert list(redis_client.hgetall(keys.fetched)) == [b"m2"]
    [(member, died)] = redis_client.zrange(keys.xq, 0, -1, withscores=True)
    assert member == b"m1" and before <= died <= after
    assert redis_client.hgetall(keys.xq_msgs) == {b"m1": b"data-m1"}
    assert redis_client.zrange(keys.heartbeats, 0, -1, withscores=True) == [(b"w1", died)]
    minute, slot = history_now(redis_client, keys)
    assert minute == died // 60_000
    assert slot == (minute, 0, 1, 0)


def test_nack_with_the_failed_message_stores_it_instead_of_the_fetched_copy(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1")

    assert lua("nack")(keys=nack_keys(keys), args=["m1", "w1", b"with traceback"]) == 1

    assert redis_client.hgetall(keys.xq_msgs) == {b"m1": b"with traceback"}
    assert not redis_client.exists(keys.ready_msgs)


def test_nack_repeated_after_a_lost_reply_returns_0_and_counts_once(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    fetched(redis_client, keys, "m1")
    nack = lua("nack")

    assert nack(keys=nack_keys(keys), args=["m1", "w1"]) == 1
    died = redis_client.zscore(keys.xq, "m1")
    assert nack(keys=nack_keys(keys), args=["m1", "w1", b"again"]) == 0

    assert redis_client.zscore(keys.xq, "m1") == died
    assert redis_client.hgetall(keys.xq_msgs) == {b"m1": b"data-m1"}
    assert history_now(redis_client, keys)[1][1:] == (0, 1, 0)


def test_nack_of_a_message_not_in_the_ack_set_moves_nothing_but_still_beats(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.rpush(keys.ready, "m1")  # requeued meanwhile: queued again
    redis_client.hset(keys.ready_msgs, "m1", b"data-m1")

    before = server_ms()
    assert lua("nack")(keys=nack_keys(keys), args=["m1", "w1"]) == 0

    assert redis_client.hget(keys.ready_msgs, "m1") == b"data-m1"
    assert not redis_client.exists(keys.xq, keys.xq_msgs, keys.minutes, keys.hours)
    beat = redis_client.zscore(keys.heartbeats, "w1")
    assert beat is not None and beat >= before


def test_nack_of_a_held_id_without_a_payload_only_lets_it_go(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.sadd(keys.acks("w1"), "m1")
    redis_client.hset(keys.fetched, "m1", "1|w1|tok")

    assert lua("nack")(keys=nack_keys(keys), args=["m1", "w1"]) == 0

    assert not redis_client.exists(keys.acks("w1"), keys.fetched)
    assert not redis_client.exists(keys.xq, keys.xq_msgs, keys.minutes)
