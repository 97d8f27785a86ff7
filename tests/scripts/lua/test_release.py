"""release.lua: a consumer leaves its queue: drop it from the idle and consumer registries
and, if it holds the transfer lease, give the lease up and ask the most recently seen
consumer still listening on its wake channel to take it over ("-1")."""

from __future__ import annotations

import redis

from dramatiq_redisson._keys import QueueKeys

from .pubsub import listening
from .state import Lua


def release_keys(keys: QueueKeys) -> list[str]:
    return [keys.lease, keys.consumers, keys.idle, keys.channel]


def test_release_by_a_consumer_without_the_lease_unregisters_it_only(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.lease, "holder 1700000000000", px=60_000)
    redis_client.zadd(keys.consumers, {"leaving": 100, "holder": 200})
    redis_client.zadd(keys.idle, {"leaving": 2, "holder": 1})

    assert lua("release")(keys=release_keys(keys), args=["leaving"]) == 0

    assert redis_client.get(keys.lease) == b"holder 1700000000000"
    assert redis_client.zrange(keys.consumers, 0, -1) == [b"holder"]
    assert redis_client.zrange(keys.idle, 0, -1) == [b"holder"]


def test_release_by_the_lease_holder_gives_it_up_to_the_latest_listening_consumer(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.lease, "leaving 1700000000000", px=60_000)
    # "latest" was seen last but nobody listens for it (gone): "second" is asked.
    redis_client.zadd(keys.consumers, {"leaving": 400, "first": 100, "second": 200, "latest": 300})
    redis_client.zadd(keys.idle, {"leaving": 1})

    channels = [keys.wake_channel(t) for t in ("first", "second")]
    with listening(redis_client, *channels) as received:
        assert lua("release")(keys=release_keys(keys), args=["leaving"]) == 1
        assert received() == [(keys.wake_channel("second"), b"-1")]

    assert not redis_client.exists(keys.lease, keys.idle)
    assert redis_client.zrange(keys.consumers, 0, -1) == [b"first", b"second", b"latest"]


def test_release_by_the_lease_holder_with_nobody_listening_still_gives_it_up(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.lease, "leaving 1700000000000", px=60_000)
    redis_client.zadd(keys.consumers, {"leaving": 400, "other": 100})

    assert lua("release")(keys=release_keys(keys), args=["leaving"]) == 1

    assert not redis_client.exists(keys.lease)
    assert redis_client.zrange(keys.consumers, 0, -1) == [b"other"]


def test_release_by_a_token_that_only_prefixes_the_holders_keeps_the_lease(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.lease, "tok2 1700000000000", px=60_000)

    assert lua("release")(keys=release_keys(keys), args=["tok"]) == 0

    assert redis_client.get(keys.lease) == b"tok2 1700000000000"


def test_release_repeated_returns_0_and_asks_no_successor_again(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.lease, "leaving 1700000000000", px=60_000)
    redis_client.zadd(keys.consumers, {"leaving": 400, "other": 100})
    release = lua("release")

    with listening(redis_client, keys.wake_channel("other")) as received:
        assert release(keys=release_keys(keys), args=["leaving"]) == 1
        assert received() == [(keys.wake_channel("other"), b"-1")]
        assert release(keys=release_keys(keys), args=["leaving"]) == 0
        assert received() == []


def test_release_with_nothing_registered_returns_0_and_writes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    assert lua("release")(keys=release_keys(keys), args=["leaving"]) == 0
    assert redis_client.keys("*") == []
