"""Small helpers shared by the tests."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import redis

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


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` seconds pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
