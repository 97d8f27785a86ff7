"""Sort keys: 16 hex characters that order a process's offers by time of offer."""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_last = 0

#: Bits of the sort key below the millisecond timestamp (a per-process counter).
COUNTER_BITS = 20


def next_sort_keys(count: int) -> list[str]:
    """Return ``count`` consecutive sort keys, each greater than every key returned before."""
    global _last
    with _lock:
        first = max(time.time_ns() // 1_000_000 << COUNTER_BITS, _last + 1)
        _last = first + count - 1
    return [f"{key:016x}" for key in range(first, first + count)]


def next_sort_key() -> str:
    """Return a sort key greater than every key this process returned before.

    The high bits are the wall-clock millisecond, the low bits a counter, so keys
    from one process are strictly increasing even if the clock steps back; keys
    from different processes interleave by their clocks. Only the order among
    equal due times depends on it, never when a message runs.
    """
    return next_sort_keys(1)[0]
