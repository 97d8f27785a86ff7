"""Shared helpers of the one-script Lua tests: the ``lua`` fixture's types, a snapshot of
everything on the server, a scheduled entry written the way the broker writes one, and the
check that a call's KEYS follow its script's header (:func:`check_key_order`)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from dramatiq_redisson._ids import next_sort_key
from dramatiq_redisson._keys import QueueKeys, key_slots

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
    status ("" without one; "slots", "wait:<ms>" or both)."""
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
    assert status in ("", "slots", "more")
    return ids


def turn_flow_on(client: redis.Redis, keys: QueueKeys, **fields: Any) -> None:
    """A queue's flow on, as flow_enable.lua leaves it (its HASH and its flag), with
    ``fields`` more in the HASH (limits, counts)."""
    client.hset(keys.flow, mapping={"on": 1, **fields})
    client.set(keys.flow_flag, 1)


#: QueueKeys attributes that are no key: the queue's names, and the prefixes keys are built from.
_NOT_KEYS = frozenset({"name", "namespace", "queue_name", "cluster", "reaches_namespace"})


def key_names(keys: QueueKeys) -> dict[str, str]:
    """Each key string of the queue that a script header may name -> its QueueKeys
    attribute (the per-worker ack sets aside: see :func:`key_name`)."""
    names: dict[str, str] = {}
    for name in dir(QueueKeys):
        if name.startswith("_") or name in _NOT_KEYS or not isinstance(getattr(QueueKeys, name), property):
            continue
        value = getattr(keys, name)
        if isinstance(value, str) and not value.endswith("{"):
            names[value] = name
    return names


def key_name(keys: QueueKeys, key: str) -> str | None:
    """The QueueKeys attribute that gives ``key`` for the queue of ``keys`` (``acks`` and
    ``legacy_dq_acks`` for any worker), or None."""
    if key in (names := key_names(keys)):
        return names[key]
    prefix, end = keys.acks("").split("..", 1)
    for name, suffix in (("legacy_dq_acks", f".{end}.DQ"), ("acks", f".{end}")):
        if key.startswith(f"{prefix}.") and key.endswith(suffix):
            worker = key[len(prefix) + 1 : -len(suffix)]
            if getattr(keys, name)(worker) == key:
                return name
    return None


def header_orders(script: str) -> list[list[tuple[str, ...]]]:
    """Every KEYS list ``script``'s header allows, without a tail: per slot the names it
    may take, for each choice of optional groups (a group left out moves later keys up)."""
    slots = key_slots(script)
    groups = sorted({slot.group for slot in slots if slot.group})
    return [
        [slot.names for slot in slots if not slot.per_worker and (not slot.group or slot.group in given)]
        for n in range(len(groups) + 1)
        for given in itertools.combinations(groups, n)
    ]


def follows_header(script: str, names: Sequence[str | None]) -> bool:
    """Whether the key names ``names`` are a KEYS list ``script``'s header allows."""
    tail = next((slot.names for slot in key_slots(script) if slot.per_worker), ())
    for order in header_orders(script):
        head, rest = names[: len(order)], names[len(order) :]
        if len(head) < len(order) or any(name not in allowed for name, allowed in zip(head, order, strict=True)):
            continue
        if not rest or (
            tail and len(rest) % len(tail) == 0 and all(n == tail[i % len(tail)] for i, n in enumerate(rest))
        ):
            return True
    return False


def queues_named_in(call_keys: Sequence[str]) -> list[QueueKeys]:
    """The queues (either layout) whose hash tag ``{ns:Q}`` appears in ``call_keys``."""
    found: list[QueueKeys] = []
    for key in call_keys:
        if "{" in key and "}" in key[key.index("{") :]:
            tag = key[key.index("{") + 1 : key.index("}", key.index("{"))]
            for at in (i for i, c in enumerate(tag) if c == ":"):
                found.extend(QueueKeys(tag[:at], tag[at + 1 :], cluster) for cluster in (False, True))
    return found


def check_key_order(script: str, call_keys: Sequence[Any], keys: QueueKeys | None = None) -> None:
    """Fail unless ``call_keys`` are the keys of one queue (``keys``, or one named in them)
    in an order ``script``'s header (its one source) allows."""
    strings = [k.decode() if isinstance(k, bytes) else str(k) for k in call_keys]
    tried = []
    for queue in ([keys] if keys is not None else []) + queues_named_in(strings):
        names = [key_name(queue, key) for key in strings]
        if None not in names and follows_header(script, names):
            return
        tried.append(names)
    raise AssertionError(
        f"{script}.lua's KEYS are not in its header's order: given {tried or strings}; "
        f"the header allows {header_orders(script)}"
    )
