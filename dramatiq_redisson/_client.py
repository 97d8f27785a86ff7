"""The redis client a broker makes, how long it may retry one command, and a probe that
tells when a server that went away accepts connections again.

A broker given a ``url`` (or ``cluster=True``) makes its own client, with every connection
parameter applied. :func:`client_retry_span_ms` bounds how long that client
(or one passed in) may retry a command, which sizes the broker's ``dedupe_window``;
:func:`close_client` closes what the broker opened. :class:`Probe` is the consumers'
cheap check, while the server is away, of whether it is back.
"""

from __future__ import annotations

import math
import socket
from typing import Any, cast

import redis
from redis.cluster import RedisCluster


def make_client(url: str | None, cluster: bool, parameters: dict[str, Any]) -> redis.Redis | RedisCluster:
    """A client for ``url`` (or the ``host``/``port`` parameters on a cluster).

    The built-in broker drops every connection parameter when a url is given; here they
    apply too (url query options still win), so ``url="rediss://…", ssl_ca_certs=…``
    verifies against that CA instead of failing."""
    if cluster:
        return RedisCluster.from_url(url, **parameters) if url else RedisCluster(**parameters)
    return redis.Redis.from_url(cast(str, url), **parameters)


def close_client(client: redis.Redis | RedisCluster) -> None:
    """Close the connections of a client the broker made."""
    if isinstance(client, RedisCluster):
        # RedisCluster.close() leaves its nodes' connection pools open (their sockets
        # close only when collected): disconnect them too.
        for node in client.get_nodes():
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect()
        client.close()
    else:
        client.connection_pool.disconnect()


def client_retry_span_ms(client: redis.Redis | RedisCluster) -> int | None:
    """The longest time (ms) from a command's first run to the last automatic retry of it
    by ``client`` (redis-py retries a command on a connection error or timeout, and the
    first attempt may have run before its reply was lost), estimated from the client's
    ``Retry`` (retries, backoff cap) and socket timeouts; ``None`` when it retries
    forever or its settings cannot be read. A socket timeout of ``None`` counts as 0:
    such a client waits for a reply instead of retrying.

    A cluster client retries a command on top of its node connection's own retries:
    each of its attempts may take a node connection's whole span.
    """
    try:
        if isinstance(client, RedisCluster):
            node = client.get_redis_connection(client.get_default_node())
            per_node = client_retry_span_ms(node)
            retries = int(client.retry.get_retries())
            if per_node is None or retries < 0:
                return None
            return (retries + 1) * per_node + _backoff_total_ms(client.retry._backoff, retries)
        pool = client.connection_pool
        connection = pool.connection_class(**pool.connection_kwargs)  # not connected
        retry = connection.retry
        retries = int(retry.get_retries())
        socket_timeout = float(connection.socket_timeout or 0)
        connect_timeout = float(connection.socket_connect_timeout or 0)
        backoff = retry._backoff
    except Exception:
        return None
    if retries < 0:
        return None
    if retries == 0:
        return 0
    timeouts = 1000 * (socket_timeout + retries * (connect_timeout + socket_timeout))
    return math.ceil(timeouts) + _backoff_total_ms(backoff, retries)


def _backoff_total_ms(backoff: Any, retries: int) -> int:
    """The longest total pause (ms) of ``retries`` retries with ``backoff``."""
    cap = getattr(backoff, "_cap", None)
    base = getattr(backoff, "_base", None)
    total = 0.0
    for failures in range(1, retries + 1):
        if type(backoff).__name__ == "DecorrelatedJitterBackoff" and cap is not None:
            total += float(cap)
        elif cap is not None and base is not None:  # exponential ones, with or without jitter
            total += min(float(cap), float(base) * 2**failures)
        else:  # constant (or unknown): its value
            total += float(backoff.compute(failures))
    return math.ceil(1000 * total)


class Probe:
    """Whether the server of a client accepts TCP connections (a connect and a close: no
    command, no authentication, nothing for the server to do). ``None`` address: the
    client's server cannot be told (Sentinel, a cluster, a custom connection class) and
    :meth:`accepting` always says ``None``."""

    def __init__(self, client: Any, timeout: float = 0.05) -> None:
        self.timeout = timeout
        self.address: tuple[str, int] | str | None = None
        if isinstance(client, RedisCluster):
            return
        pool = getattr(client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", {})
        connection_class = getattr(pool, "connection_class", None)
        if connection_class is redis.UnixDomainSocketConnection and kwargs.get("path"):
            self.address = str(kwargs["path"])
        elif connection_class in (redis.Connection, redis.SSLConnection) and kwargs.get("host"):
            self.address = (str(kwargs["host"]), int(kwargs.get("port") or 6379))

    def accepting(self) -> bool | None:
        if self.address is None:
            return None
        family = socket.AF_UNIX if isinstance(self.address, str) else socket.AF_INET
        try:
            if family == socket.AF_INET:
                with socket.create_connection(cast("tuple[str, int]", self.address), timeout=self.timeout):
                    return True
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.address)
                return True
        except OSError:
            return False
