"""What a script published: subscribe first, run the script, then read."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

Received = Callable[[], list[tuple[str, bytes]]]

#: Published last on the first channel when reading: every message published before it, on
#: any channel of the subscription, arrives before it (one connection, in PUBLISH order).
MARKER = b"--end of what was published--"


@contextmanager
def listening(client: redis.Redis, *channels: str) -> Iterator[Received]:
    """Subscribe to ``channels``; yields a function that returns the (channel, data) pairs
    published on them since the last call, without waiting on a timeout."""
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(*channels)
        for _ in channels:
            confirmation = pubsub.get_message(timeout=1.0)
            assert confirmation is not None and confirmation["type"] == "subscribe", confirmation

        def received() -> list[tuple[str, bytes]]:
            client.publish(channels[0], MARKER)
            got: list[tuple[str, bytes]] = []
            while True:
                message = pubsub.get_message(timeout=1.0)
                assert message is not None, f"the marker never came back; so far {got}"
                if message["data"] == MARKER:
                    return got
                got.append((message["channel"].decode(), message["data"]))

        yield received
    finally:
        pubsub.close()
