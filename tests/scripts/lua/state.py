"""Shared helpers of the one-script Lua tests: the ``lua`` fixture's types, a snapshot of
everything on the server, and a scheduled entry written the way the broker writes one."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from dramatiq_redisson._ids import next_sort_key
from dramatiq_redisson._keys import QueueKeys

Script = Callable[..., Any]
Lua = Callable[[str], Script]


def snapshot(client: redis.Redis) -> dict[bytes, Any]:
    """Every key's DUMP: equal snapshots mean nothing was written."""
    return {key: client.dump(key) for key in client.keys("*")}


@dataclass(frozen=True)
class Scheduled:
    """A scheduled entry: its sort key and its member (sort key + message id)."""

    sort_key: str
    member: bytes


def schedule_entry(
    client: redis.Redis,
    keys: QueueKeys,
    message_id: str,
    due: int,
    *,
    data: bytes = b"{}",
    key: str = "",
    ttl: int = 0,
    sort_key: str = "",
) -> Scheduled:
    """Schedule ``message_id`` at ``due`` (epoch ms): its member in the ZSET and the backup
    list, its payload (sort key + ``data``); with ``key``, the dedupe key it holds for
    ``ttl`` ms. A fresh sort key unless ``sort_key`` is given."""
    sort_key = sort_key or next_sort_key()
    member = sort_key + message_id
    client.zadd(keys.timeout_zset, {member: due})
    client.rpush(keys.backup_list, member)
    client.hset(keys.payloads, message_id, sort_key.encode() + data)
    if key:
        client.hset(keys.dedupe, key, message_id)
        client.hset(keys.keyed, message_id, f"{ttl}:{key}")
    return Scheduled(sort_key, member.encode())


def fetch_flow(lua: Lua, keys: QueueKeys, count: int, clock_ms: int, token: str = "") -> tuple[list[bytes], str]:
    """fetch.lua as worker "w1" (consumer ``token``, "" by default) calls it with the flow
    keys, on the server clock estimate ``clock_ms``: the ids taken and the reply's trailing
    status ("" without one; "held", "wait:<ms>" or both)."""
    reply = lua("fetch")(
        keys=[
            keys.ready,
            keys.ready_msgs,
            keys.acks("w1"),
            keys.heartbeats,
            keys.idle,
            keys.paused,
            keys.fetched,
            *keys.flow_keys,
        ],
        args=[
            count,
            "w1",
            token,
            "0",
            f"w1|{token or 'tok'}",
            clock_ms,
            *keys.flow_affixes,
            keys.rate_prefix,
            keys.wake_prefix,
        ],
    )
    status = reply.pop().decode() if len(reply) % 2 else ""
    return [reply[i] for i in range(0, len(reply), 2)], status


def fetch_ids(lua: Lua, keys: QueueKeys, count: int, clock_ms: int) -> list[bytes]:
    """The ids :func:`fetch_flow` takes (a status, if any, says they hold slots, or, off
    the lanes, that more are ready)."""
    ids, status = fetch_flow(lua, keys, count, clock_ms)
    assert status in ("", "held", "more")
    return ids


def turn_flow_on(client: redis.Redis, keys: QueueKeys, **fields: Any) -> None:
    """A queue's flow on, as flow_enable.lua leaves it (its HASH and its flag), with
    ``fields`` more in the HASH (limits, counts)."""
    client.hset(keys.flow, mapping={"on": 1, **fields})
    client.set(keys.flow_flag, 1)
