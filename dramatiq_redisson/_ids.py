"""Sort keys: 14 characters that order a process's offers by time of offer.

A member of the delayed queue is a sort key followed by the message id, and a payload
starts with its member's sort key. Earlier releases wrote 16 hex characters; a key of
this release starts with one of ``g``..``v`` (the top hex digit moved up by 16 places),
so the two are told apart by their first character (:func:`sort_key_length`), and keys of
this release sort after every earlier one. Lua does the same (``scripts/lua/include/key_len.lua``).
"""

from __future__ import annotations

import re
import threading
import time

_lock = threading.Lock()
_last = 0

#: Bits of the sort key below the millisecond timestamp (a per-process counter). 42 bits of
#: milliseconds above them last until the year 2109.
COUNTER_BITS = 14

#: Characters in a sort key of this release (16 in earlier releases).
SORT_KEY_LENGTH = 14

#: The first character of a key of this release, by the key's top hex digit.
_FIRST = "ghijklmnopqrstuv"


def _text(key: int) -> str:
    digits = f"{key:014x}"
    return _FIRST[int(digits[0], 16)] + digits[1:]


def next_sort_keys(count: int) -> list[str]:
    """Return ``count`` consecutive sort keys, each greater than every key returned before."""
    global _last
    with _lock:
        first = max(time.time_ns() // 1_000_000 << COUNTER_BITS, _last + 1)
        _last = first + count - 1
    return [_text(key) for key in range(first, first + count)]


def next_sort_key() -> str:
    """Return a sort key greater than every key this process returned before.

    The high bits are the wall-clock millisecond, the low bits a counter, so keys
    from one process are strictly increasing even if the clock steps back; keys
    from different processes interleave by their clocks. Only the order among
    equal due times depends on it, never when a message runs.
    """
    return next_sort_keys(1)[0]


def sort_key_length(text: str | bytes) -> int:
    """The length of the sort key that ``text`` (a member or a stored payload) starts with:
    14 for this release's, 16 for an earlier release's (hex)."""
    first = text[:1].decode("latin-1") if isinstance(text, bytes) else text[:1]
    return SORT_KEY_LENGTH if first >= "g" else 16


def message_id_of(member: str | bytes) -> str:
    """The message id of a member (its text after the sort key)."""
    rest = member[sort_key_length(member) :]
    return rest.decode() if isinstance(rest, bytes) else rest


#: A delayed message's redis id (its member): a sort key of this release or an earlier
#: one's, then the message id.
_MEMBER = re.compile(r"(?:[g-v][0-9a-f]{13}|[0-9a-f]{16})(.+)", re.DOTALL)


def redis_id_message_id(redis_message_id: str) -> str:
    """The message id a redis message id names: a delayed message's member ends with it, an
    immediate send's is it. (A retry sent without a delay has a fresh uuid as redis id,
    which names nothing of its message: it comes back as it is.)"""
    member = _MEMBER.fullmatch(redis_message_id)
    return member[1] if member else redis_message_id


def same_sort_key(stored: bytes, member: bytes) -> bool:
    """Whether a stored payload starts with its member's sort key (it was not rescheduled)."""
    n = sort_key_length(member)
    return stored[:n] == member[:n]


def sort_key_ms(sort_key: str) -> int:
    """The millisecond a sort key of this release was taken at (its bits above the counter)."""
    return int(f"{_FIRST.index(sort_key[0]):x}{sort_key[1:]}", 16) >> COUNTER_BITS


def sort_key_at(ms: int) -> str:
    """The sort key of a message that belongs to millisecond ``ms`` itself (counter 0): a
    periodic tick's, so that its member is the same whoever writes it
    (``scripts/lua/include/key_at.lua`` writes the same)."""
    return _text(ms << COUNTER_BITS)
