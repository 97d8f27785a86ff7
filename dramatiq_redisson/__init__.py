"""dramatiq-redisson: a drop-in Dramatiq Redis broker whose delayed messages run on
Redisson's delayed-queue scheme (ZSET + backup list + channel), with its flaws fixed."""

from ._broker import RedissonBroker
from ._errors import (
    EnqueueError,
    EnqueueNotReplicated,
    MissingPermission,
    NotReplicated,
    ServerMemoryFull,
    UnsupportedServer,
)
from ._keys import QueueKeys
from ._message import MAX_DELAY, validate_delay
from .admin._dead_letters import AmbiguousDeadLetter, DeadLetters
from .admin._delayed_queue import DelayedQueue
from .admin._history import Bucket, Counts, History, QueueHistory
from .admin._message_state import MessageState
from .admin._running import RunningMessage
from .admin._stats import QueueStats, Stats, WaitingLane
from .connection._permissions import acl_rule, acl_tokens, check_permissions, is_permission_error
from .periodic._schedules import Schedule, ScheduleInfo, Schedules, periodic
from .periodic._spec import InvalidSchedule

__version__ = "0.2.0.dev0"

__all__ = [
    "AmbiguousDeadLetter",
    "Bucket",
    "Counts",
    "DeadLetters",
    "DelayedQueue",
    "EnqueueError",
    "EnqueueNotReplicated",
    "History",
    "InvalidSchedule",
    "MAX_DELAY",
    "MessageState",
    "MissingPermission",
    "NotReplicated",
    "QueueHistory",
    "QueueKeys",
    "QueueStats",
    "RedissonBroker",
    "RunningMessage",
    "Schedule",
    "ScheduleInfo",
    "Schedules",
    "ServerMemoryFull",
    "Stats",
    "UnsupportedServer",
    "WaitingLane",
    "acl_rule",
    "acl_tokens",
    "check_permissions",
    "is_permission_error",
    "periodic",
    "validate_delay",
    "__version__",
]
