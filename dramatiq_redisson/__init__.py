"""dramatiq-redisson: a drop-in Dramatiq Redis broker whose delayed messages run on
Redisson's delayed-queue scheme (ZSET + backup list + channel), with its flaws fixed."""

from ._broker import MAX_DELAY, EnqueueNotReplicated, RedissonBroker, validate_delay
from ._dead_letters import DeadLetters
from ._delayed_queue import DelayedQueue
from ._errors import EnqueueError, ServerMemoryFull
from ._keys import QueueKeys
from ._scripts import NotReplicated
from ._stats import QueueStats, Stats

__version__ = "0.1.0"

__all__ = [
    "DeadLetters",
    "DelayedQueue",
    "EnqueueError",
    "EnqueueNotReplicated",
    "MAX_DELAY",
    "NotReplicated",
    "QueueKeys",
    "QueueStats",
    "RedissonBroker",
    "ServerMemoryFull",
    "Stats",
    "validate_delay",
    "__version__",
]
