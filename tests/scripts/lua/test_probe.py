"""probe.lua: the worker's permission probe. It tries, without changing anything, every
command the broker's scripts issue on a queue's real key names (given in ARGV, no KEYS) and
reports the calls the user's ACL denies, with the key or channel each concerns, and the
commands it could not try because nothing the user may run would undo them."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys
from dramatiq_redisson.scripts._runner import load_source

from .state import Lua

TOKEN = "__probe_token__"

#: A key the user may not touch, word for word as Redis 7+/Valkey and as Redis 6.2 say it
#: (6.2 puts the script's line first).
KEY_DENIED = re.compile(
    rb"ERR ACL failure in script: No permissions to access a key"
    rb"|@user_script: \d+: The user executing the script can't access at least one of the keys"
    rb" mentioned in the command arguments"
)
#: A command the user may not run (6.2 does not name it).
COMMAND_DENIED = re.compile(rb"ERR ACL failure in script: .*'hset'|can't run this command")


def _scratch(keys: QueueKeys) -> str:
    return f"{keys.ready}.__permission_probe__"


def _args(keys: QueueKeys, *pairs: str) -> list[str]:
    return [TOKEN, _scratch(keys), keys.channel, *pairs]


def _every_kind(keys: QueueKeys) -> list[str]:
    return [
        "list",
        keys.ready,
        "hash",
        keys.ready_msgs,
        "set",
        keys.acks("w1"),
        "zset",
        keys.timeout_zset,
        "string",
        keys.paused,
        "none",
        keys.channel,
    ]


def _triples(denied: list[bytes]) -> list[tuple[bytes, bytes, bytes]]:
    assert len(denied) % 3 == 0
    return [(denied[i], denied[i + 1], denied[i + 2]) for i in range(0, len(denied), 3)]


def _snapshot(client: redis.Redis) -> dict[Any, Any]:
    return {key: (client.dump(key), client.pttl(key)) for key in client.keys("*")}


def _fill(client: redis.Redis, keys: QueueKeys) -> None:
    client.rpush(keys.ready, "m1", "m2")
    client.hset(keys.ready_msgs, mapping={"m1": "one", "m2": "two"})
    client.sadd(keys.acks("w1"), "m0")
    client.zadd(keys.timeout_zset, {"s1": 1, "s2": 2})
    client.set(keys.paused, "1700000000000")


@pytest.fixture
def probe_as(redis_url: str, redis_client: redis.Redis) -> Iterator[Callable[..., Any]]:
    """Run the probe as a new ACL user with the given rules (deleted at teardown)."""
    users: list[str] = []
    clients: list[redis.Redis] = []
    source = load_source("probe").decode()

    def run(rules: list[str], args: list[str]) -> Any:
        name = f"probe-test-{secrets.token_hex(4)}"
        password = secrets.token_urlsafe(12)
        redis_client.execute_command("ACL SETUSER", name, "reset", "on", f">{password}", *rules)
        users.append(name)
        client = redis.Redis.from_url(redis_url, username=name, password=password)
        clients.append(client)
        return client.eval(source, 0, *args)

    yield run
    for client in clients:
        client.close()
    for name in users:
        redis_client.execute_command("ACL DELUSER", name)


def test_probe_of_a_user_allowed_everything_reports_nothing_and_changes_nothing(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _fill(redis_client, keys)
    before = _snapshot(redis_client)
    assert lua("probe")(args=_args(keys, *_every_kind(keys))) == [[], []]
    assert _snapshot(redis_client) == before
    assert redis_client.exists(_scratch(keys)) == 0


def test_probe_on_missing_keys_creates_none_of_them(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    assert lua("probe")(args=_args(keys, *_every_kind(keys))) == [[], []]
    assert redis_client.keys("*") == []


def test_probe_ignores_errors_that_are_not_acl_denials(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    # Every key of the wrong type: WRONGTYPE (and the invalid forms' errors) mean "allowed".
    for key in (keys.ready, keys.ready_msgs, keys.acks("w1"), keys.timeout_zset):
        redis_client.set(key, "a string")
    redis_client.rpush(keys.paused, "a list")
    before = _snapshot(redis_client)
    assert lua("probe")(args=_args(keys, *_every_kind(keys))) == [[], []]
    assert _snapshot(redis_client) == before


def test_probe_publishes_0_on_the_queue_channel(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    pubsub = redis_client.pubsub()
    try:
        pubsub.subscribe(keys.channel)
        assert pubsub.get_message(timeout=1.0)["type"] == "subscribe"
        lua("probe")(args=_args(keys))
        message = pubsub.get_message(timeout=1.0)
        assert message is not None
        assert (message["channel"], message["data"]) == (keys.channel.encode(), b"0")
    finally:
        pubsub.close()


def test_probe_reports_a_denied_command_on_each_key_it_concerns(
    probe_as: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _fill(redis_client, keys)
    before = _snapshot(redis_client)
    other_hash = keys.payloads
    denied, unchecked = probe_as(["+@all", "-hset", "~*", "&*"], _args(keys, *_every_kind(keys), "hash", other_hash))
    assert [(c, target) for c, target, _ in _triples(denied)] == [
        (b"hset", keys.ready_msgs.encode()),
        (b"hset", other_hash.encode()),
    ]
    assert all(COMMAND_DENIED.search(e) for _, _, e in _triples(denied)), _triples(denied)
    assert unchecked == []
    assert _snapshot(redis_client) == before


def test_probe_reports_every_call_on_a_key_outside_the_users_patterns(
    probe_as: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    _fill(redis_client, keys)
    before = _snapshot(redis_client)
    # The user reaches the delayed-queue keys only: the ready queue's hash and the
    # scratch key (ns:Q.__permission_probe__) are out of reach.
    denied, unchecked = probe_as(
        ["+@all", "~redisson_delay_queue*", "&*"], _args(keys, "hash", keys.ready_msgs, "zset", keys.timeout_zset)
    )
    triples = _triples(denied)
    assert triples and all(KEY_DENIED.fullmatch(e) for _, _, e in triples), triples
    on_hash = [c for c, target, _ in triples if target == keys.ready_msgs.encode()]
    assert on_hash == [b"hlen", b"hexists", b"hget", b"hmget", b"hdel", b"hset"]
    on_scratch = [c for c, target, _ in triples if target == _scratch(keys).encode()]
    assert on_scratch == [b"hgetall", b"hkeys", b"del", b"unlink", b"ltrim", b"srem", b"hdel", b"lrem", b"pexpire"]
    assert all(target != keys.timeout_zset.encode() for _, target, _ in triples)
    # Nothing could remove the scratch key again: the commands that create it were not tried.
    assert unchecked == [b"lpush", b"rpush", b"sadd", b"hsetnx", b"hincrby"]
    assert _snapshot(redis_client) == before


def test_probe_reports_a_denied_channel(
    probe_as: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    denied, unchecked = probe_as(["+@all", "~*", "resetchannels"], _args(keys))
    assert [(c, target) for c, target, _ in _triples(denied)] == [(b"publish", keys.channel.encode())]
    assert b"channel" in _triples(denied)[0][2]
    assert unchecked == []
    assert redis_client.keys("*") == []


def test_probe_undoes_its_scratch_writes_with_the_removals_the_user_may_run(
    probe_as: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # Without DEL and UNLINK, LPUSH / RPUSH are undone by LTRIM, SADD by SREM, HSETNX by HDEL.
    denied, unchecked = probe_as(["+@all", "-del", "-unlink", "~*", "&*"], _args(keys))
    assert [(c, target) for c, target, _ in _triples(denied)] == [
        (b"del", _scratch(keys).encode()),
        (b"unlink", _scratch(keys).encode()),
    ]
    assert unchecked == []
    assert redis_client.keys("*") == []


def test_probe_leaves_untried_the_creation_nothing_could_undo(
    probe_as: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    denied, unchecked = probe_as(["+@all", "-del", "-unlink", "-hdel", "~*", "&*"], _args(keys))
    assert [c for c, _, _ in _triples(denied)] == [b"del", b"unlink", b"hdel"]
    assert unchecked == [b"hsetnx", b"hincrby"]
    assert redis_client.keys("*") == []
