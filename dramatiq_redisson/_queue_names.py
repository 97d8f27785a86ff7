"""The names of a queue's shards (issue 36; docs/sharding-design.md), as the core reads them.

Shard 0 of queue ``Q`` is the queue itself; shard ``j`` > 0 is the internal queue
``Q~j``. Dramatiq's queue names allow ``[a-zA-Z0-9._-]`` only, so a shard's name never
clashes with a user's queue. Naming is all the core knows of sharding: where the shards
live, and which one a send goes to, is the sharding package's (``sharding._shards``).
"""

from __future__ import annotations

#: Between a queue's name and a shard's suffix.
SHARD_SEPARATOR = "~"

#: The most shards a queue may have.
MAX_SHARDS = 64


def shard_name(queue_name: str, suffix: int) -> str:
    """The internal queue name of shard ``suffix`` (0: the queue itself)."""
    return queue_name if suffix == 0 else f"{queue_name}{SHARD_SEPARATOR}{suffix}"


def base_queue(name: str) -> str:
    """The queue a shard's name belongs to (a queue's own name: itself)."""
    return name.split(SHARD_SEPARATOR, 1)[0]
