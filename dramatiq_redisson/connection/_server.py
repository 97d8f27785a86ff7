"""What the broker needs of its Redis server, by version, and the check that refuses a
server lacking it.

The facts behind the minimums (each checked against the server's source in
``../shared/servers`` and by the compatibility matrix, ``python -m tests.compat``):

* **Redis 6.2** is the oldest server the scripts run on: they call ZMSCORE and LPOP with a
  count, both new in 6.2. A 6.0 server would fail the first fetch or transfer with
  ``unknown command``; the check below refuses it at start instead. HELLO with no
  protocol version, which the check sends, is 6.2's too: a 6.0 server refuses it, an
  older one does not know HELLO at all, and either is reported as "older than 6.2".
* **Redis 7.0** on a cluster: the broker announces due times with sharded pub/sub
  (SPUBLISH in the scripts, SSUBSCRIBE in the consumer), new in 7.0. Plain PUBLISH on a
  cluster reaches every node, which is the cost sharded pub/sub avoids, so there is no
  fallback: a 6.2 cluster is refused.
* Valkey forked from Redis 7.2.4 and numbers its releases on (7.2.x, 8.x, 9.x); both
  report their version in HELLO's ``version`` field, so one comparison serves both.

HELLO needs no ACL permission (the server runs it for any user, like AUTH), so the check
works for a user with exactly :func:`dramatiq_redisson.acl_rule`.
"""

from __future__ import annotations

import re
from typing import Any

import redis
from redis.cluster import RedisCluster

from .._errors import UnsupportedServer

_LEADING_DIGITS = re.compile(r"\d+")

#: The oldest server version the broker runs on.
MIN_VERSION = (6, 2, 0)
#: The oldest server version the broker runs on as a cluster (sharded pub/sub).
MIN_CLUSTER_VERSION = (7, 0, 0)


def parse_version(text: str) -> tuple[int, int, int]:
    """``"7.2.6"`` -> ``(7, 2, 6)`` (missing parts are 0; a suffix such as ``-rc1`` is dropped)."""
    parts = [int(m.group()) if (m := _LEADING_DIGITS.match(part)) else 0 for part in text.split(".")[:3]]
    parts += [0] * (3 - len(parts))
    return parts[0], parts[1], parts[2]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def server_versions(client: redis.Redis | RedisCluster) -> dict[str, tuple[str, tuple[int, int, int]]]:
    """Each server's name and version, from HELLO: ``{node: ("redis", (7, 2, 6))}``
    (one entry for a single server, ``""``; one per node on a cluster).

    A server older than 6.2 refuses HELLO without a protocol version (or HELLO itself):
    it is reported as ``("redis", (0, 0, 0))``.

    Raises:
      redis.ConnectionError, redis.TimeoutError: When the server cannot be reached.
    """
    if isinstance(client, RedisCluster):
        # Each node through its own client (the pool the cluster client closes).
        return {node.name: _hello(client.get_redis_connection(node)) for node in client.get_nodes()}
    return {"": _hello(client)}


def _hello(client: redis.Redis) -> tuple[str, tuple[int, int, int]]:
    try:
        reply = client.execute_command("HELLO")
    except (redis.ConnectionError, redis.TimeoutError):
        raise
    except redis.ResponseError:
        return "redis", (0, 0, 0)
    if isinstance(reply, list):  # RESP2 without redis-py's HELLO parser: a flat list
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    fields = {_text(k): v for k, v in reply.items()}
    return _text(fields.get("server", "redis")), parse_version(_text(fields.get("version", "0")))


def describe(name: str, version: tuple[int, int, int]) -> str:
    """``"Redis 7.0.15"``, ``"Valkey 8.0.1"``; a server older than 6.2 is ``"Redis < 6.2"``."""
    product = "Valkey" if name.lower() == "valkey" else "Redis"
    if version == (0, 0, 0):
        return f"{product} < 6.2"
    return f"{product} {'.'.join(map(str, version))}"


def _dotted(version: tuple[int, int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def refusal(name: str, version: tuple[int, int, int], *, cluster: bool, node: str = "") -> str | None:
    """Why the broker cannot run on this server (one sentence naming the server, the
    missing feature and the minimum version), or None when it can."""
    where = f" (node {node})" if node else ""
    if version < MIN_VERSION:
        return (
            f"{describe(name, version)}{where} is too old for RedissonBroker: its scripts need ZMSCORE and "
            f"LPOP with a count, which Redis {_dotted(MIN_VERSION)} added. Use Redis >= {_dotted(MIN_VERSION)} "
            f"or Valkey >= 7.2."
        )
    if cluster and version < MIN_CLUSTER_VERSION:
        return (
            f"{describe(name, version)}{where} has no sharded pub/sub (SPUBLISH/SSUBSCRIBE), which "
            f"RedissonBroker(cluster=True) needs to announce due times on a cluster; Redis "
            f"{_dotted(MIN_CLUSTER_VERSION)} added it. Use Redis >= {_dotted(MIN_CLUSTER_VERSION)} or "
            f"Valkey >= 7.2 for a cluster."
        )
    return None


def check_server(client: redis.Redis | RedisCluster, *, cluster: bool) -> dict[str, tuple[str, tuple[int, int, int]]]:
    """Ask each server its version and refuse one the broker cannot run on.

    Returns:
      What :func:`server_versions` returned.

    Raises:
      UnsupportedServer: Naming the server's version, the missing feature and the
        minimum version.
      redis.ConnectionError, redis.TimeoutError: When a server cannot be reached (the
        check is then still to do).
    """
    versions = server_versions(client)
    for node, (name, version) in versions.items():
        reason = refusal(name, version, cluster=cluster, node=node)
        if reason is not None:
            raise UnsupportedServer(reason, server=name, version=version)
    return versions
