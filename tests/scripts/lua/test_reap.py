"""reap.lua: put back on the ready queue the messages in the ack sets of a queue's dead
workers (dead by their connections, or by a liveness beat more than the timeout older than
the newest beat, checked again here), dropping their fetch records, waking idle consumers,
and forgetting the beats of processes long gone."""

from __future__ import annotations

from collections.abc import Sequence

import redis

from dramatiq_redisson._keys import QueueKeys

from .pubsub import listening
from .state import Lua

NEWEST = 1_700_000_000_000
TIMEOUT = 5_000
FORGET = 3_600_000


def reap(lua: Lua, keys: QueueKeys, by_beat: Sequence[str], by_connection: Sequence[str] = ()) -> list[int]:
    """Run reap.lua as the broker does (``scripts._calls.Scripts.reap``)."""
    workers = [*by_connection, *by_beat]
    result: list[int] = lua("reap")(
        keys=[
            keys.alive,
            keys.ready,
            keys.ready_msgs,
            keys.idle,
            keys.channel,
            keys.fetched,
            *keys.flow_keys,
            *map(keys.acks, workers),
        ],
        args=[TIMEOUT, FORGET, len(by_connection), *keys.flow_affixes, *workers],
    )
    return result


def holding(client: redis.Redis, keys: QueueKeys, worker_id: str, *ids: str) -> None:
    """``worker_id`` fetched ``ids``: in its ack set, with payloads and fetch records."""
    client.sadd(keys.acks(worker_id), *ids)
    client.hset(keys.ready_msgs, mapping={i: f"data-{i}".encode() for i in ids})
    client.hset(keys.fetched, mapping={i: f"1|{worker_id}|tok" for i in ids})


def test_reap_puts_back_the_messages_of_a_worker_whose_beat_is_too_old(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.alive, {"live": NEWEST, "dead": NEWEST - TIMEOUT - 1})
    holding(redis_client, keys, "dead", "a", "b")
    holding(redis_client, keys, "live", "c")
    redis_client.rpush(keys.ready, "queued")

    assert reap(lua, keys, by_beat=["dead"]) == [2, 1]

    ready = redis_client.lrange(keys.ready, 0, -1)
    assert sorted(ready[:2]) == [b"a", b"b"] and ready[2:] == [b"queued"]  # at the head
    assert not redis_client.exists(keys.acks("dead"))
    assert redis_client.smembers(keys.acks("live")) == {b"c"}
    assert list(redis_client.hgetall(keys.fetched)) == [b"c"]
    assert redis_client.hlen(keys.ready_msgs) == 3  # payloads stay
    # A dead worker stays listed until forgotten.
    assert redis_client.zscore(keys.alive, "dead") == NEWEST - TIMEOUT - 1


def test_reap_leaves_a_worker_whose_beat_is_exactly_the_timeout_old(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.alive, {"live": NEWEST, "slow": NEWEST - TIMEOUT})
    holding(redis_client, keys, "slow", "a")

    assert reap(lua, keys, by_beat=["slow"]) == [0, 0]

    assert redis_client.smembers(keys.acks("slow")) == {b"a"}
    assert redis_client.hget(keys.fetched, "a") == b"1|slow|tok"
    assert not redis_client.exists(keys.ready)


def test_reap_takes_workers_found_dead_by_their_connections_as_dead_whatever_their_beat(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.alive, {"cut": NEWEST, "beating": NEWEST - 1})
    holding(redis_client, keys, "cut", "a")
    holding(redis_client, keys, "beating", "b")

    assert reap(lua, keys, by_beat=["beating"], by_connection=["cut"]) == [1, 1]

    assert redis_client.lrange(keys.ready, 0, -1) == [b"a"]
    assert not redis_client.exists(keys.acks("cut"))
    assert redis_client.smembers(keys.acks("beating")) == {b"b"}


def test_reap_by_beat_of_a_worker_without_a_beat_leaves_it_alone(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.alive, {"live": NEWEST})
    holding(redis_client, keys, "unknown", "a")

    assert reap(lua, keys, by_beat=["unknown"]) == [0, 0]

    assert redis_client.smembers(keys.acks("unknown")) == {b"a"}


def test_reap_finds_nobody_dead_when_every_beat_is_equally_old(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # The server was stopped for longer than the timeout: nobody could beat.
    redis_client.zadd(keys.alive, {"w1": NEWEST - 60_000, "w2": NEWEST - 60_000})
    holding(redis_client, keys, "w1", "a")

    assert reap(lua, keys, by_beat=["w1", "w2"]) == [0, 0]

    assert redis_client.smembers(keys.acks("w1")) == {b"a"}


def test_reap_drops_a_held_id_without_a_payload_without_pushing_it(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.alive, {"live": NEWEST, "dead": NEWEST - TIMEOUT - 1})
    holding(redis_client, keys, "dead", "a")
    redis_client.sadd(keys.acks("dead"), "acked")  # its payload is gone

    assert reap(lua, keys, by_beat=["dead"]) == [1, 1]

    assert redis_client.lrange(keys.ready, 0, -1) == [b"a"]
    assert not redis_client.exists(keys.acks("dead"))


def test_reap_repeated_puts_back_only_what_landed_in_a_dead_workers_set_since(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.alive, {"live": NEWEST, "dead": NEWEST - TIMEOUT - 1})
    holding(redis_client, keys, "dead", "a")

    assert reap(lua, keys, by_beat=["dead"]) == [1, 1]
    assert reap(lua, keys, by_beat=["dead"]) == [0, 1]
    holding(redis_client, keys, "dead", "late")  # a fetch it sent before it died
    assert reap(lua, keys, by_beat=["dead"]) == [1, 1]

    assert redis_client.lrange(keys.ready, 0, -1) == [b"late", b"a"]


def test_reap_forgets_beats_older_than_forget_after_relative_to_the_newest(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(
        keys.alive,
        {"live": NEWEST, "dead": NEWEST - TIMEOUT - 1, "edge": NEWEST - FORGET, "gone": NEWEST - FORGET - 1},
    )

    assert reap(lua, keys, by_beat=[]) == [0, 0]

    assert redis_client.zrange(keys.alive, 0, -1) == [b"edge", b"dead", b"live"]


def test_reap_with_no_beats_at_all_reaps_only_by_connection_and_writes_no_beats(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    holding(redis_client, keys, "cut", "a")
    holding(redis_client, keys, "other", "b")

    assert reap(lua, keys, by_beat=["other"], by_connection=["cut"]) == [1, 1]

    assert redis_client.lrange(keys.ready, 0, -1) == [b"a"]
    assert redis_client.smembers(keys.acks("other")) == {b"b"}
    assert not redis_client.exists(keys.alive)


def test_reap_wakes_idle_consumers_for_the_messages_put_back(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.zadd(keys.alive, {"live": NEWEST, "dead": NEWEST - TIMEOUT - 1})
    holding(redis_client, keys, "dead", "a", "b")
    redis_client.zadd(keys.idle, {"one": 1, "two": 1, "three": 1})

    with listening(redis_client, *(keys.wake_channel(t) for t in ("one", "two", "three"))) as received:
        assert reap(lua, keys, by_beat=["dead"]) == [2, 1]
        woken = received()
        assert reap(lua, keys, by_beat=["dead"]) == [0, 1]
        assert received() == []

    assert len(woken) == 2 and all(data == b"0" for _, data in woken)
    assert redis_client.zcard(keys.idle) == 1
