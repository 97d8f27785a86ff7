"""dramatiq-redisson: a drop-in Dramatiq Redis broker whose delayed messages run on
Redisson's delayed-queue scheme (ZSET + backup list + channel), with its flaws fixed."""

from ._broker import MAX_DELAY, RedissonBroker, validate_delay
from ._dead_letters import DeadLetters
from ._delayed_queue import DelayedQueue
from ._errors import (
    EnqueueError,
    EnqueueNotReplicated,
    MissingPermission,
    NotReplicated,
    ServerMemoryFull,
    UnsupportedServer,
)
from ._keys import QueueKeys
from ._permissions import acl_rule, acl_tokens, check_permissions
from ._stats import QueueStats, Stats

__version__ = "0.1.0"

__all__ = [
    "DeadLetters",
    "DelayedQueue",
    "EnqueueError",
    "EnqueueNotReplicated",
    "MAX_DELAY",
    "MissingPermission",
    "NotReplicated",
    "QueueKeys",
    "QueueStats",
    "RedissonBroker",
    "ServerMemoryFull",
    "Stats",
    "UnsupportedServer",
    "acl_rule",
    "acl_tokens",
    "check_permissions",
    "validate_delay",
    "__version__",
]
