"""Small helpers shared by the tests."""

from __future__ import annotations

import gc
import json
import time
from typing import Any

import redis

from .harness.topology import wait_for

__all__ = ["RECORD_KEY", "fill_to_maxmemory", "record", "records", "server_ms", "wait_for"]

RECORD_KEY = "test:record"


def server_ms(client: redis.Redis) -> int:
    """The server's clock in epoch ms."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def record(client: redis.Redis, **fields: Any) -> None:
    """Append a run record, stamped with the server's clock and this process's pid."""
    import os

    fields.setdefault("at_ms", server_ms(client))
    fields.setdefault("pid", os.getpid())
    client.rpush(RECORD_KEY, json.dumps(fields))


def records(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(r) for r in client.lrange(RECORD_KEY, 0, -1)]


def fill_to_maxmemory(client: redis.Redis) -> None:
    """Set ``noeviction`` and ``maxmemory`` just above what is used, then add ballast
    (``ballast:<n>``) until writes are refused, in smaller and smaller pieces (a refused
    write's own query buffer counts: after it, a few KB may be free again), once the memory
    of earlier flushes is back.

    Clients of earlier tests left to the garbage collector close their connections when it
    runs, and each closed connection gives the server back its buffers (tens of KB):
    collect first, then fill twice, a moment apart, so memory freed by a late close is
    taken up again (a CI run saw a 100-message chunk fit after a single fill)."""
    gc.collect()
    client.config_set("maxmemory-policy", "noeviction")
    assert wait_for(lambda: int(client.info("memory").get("lazyfree_pending_objects", 0)) == 0)
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 256 * 1024)
    n = 0
    for round_ in range(2):
        if round_:
            time.sleep(0.3)
        for size in (4096, 512, 64, 8):
            while n < 4096:
                try:
                    client.set(f"ballast:{n}", b"x" * size)
                    n += 1
                except redis.exceptions.OutOfMemoryError:
                    break
            else:
                raise AssertionError("the server never became full")
