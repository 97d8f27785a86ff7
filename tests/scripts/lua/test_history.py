"""history.lua: read a queue's activity history, the rings of per-minute and per-hour
counters that ack.lua and nack.lua write (lua/include/record_history.lua): the last minutes' and hours'
slots oldest first, and the last active minute not yet added to its hour. Reads only."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua

HISTORY_MINUTES, HISTORY_HOURS = 1500, 744
ZERO = bytes(16)


def _slot(stamp: int, processed: int = 0, failed: int = 0, retried: int = 0) -> bytes:
    return struct.pack(">IIII", stamp, processed, failed, retried)


def _put_minute(client: redis.Redis, keys: QueueKeys, minute: int, slot: bytes) -> None:
    client.setrange(keys.minutes, 16 + 16 * (minute % HISTORY_MINUTES), slot)


def _put_hour(client: redis.Redis, keys: QueueKeys, hour: int, slot: bytes) -> None:
    client.setrange(keys.hours, 16 * (hour % HISTORY_HOURS), slot)


def _split(blob: bytes) -> list[bytes]:
    assert len(blob) % 16 == 0
    return [blob[i : i + 16] for i in range(0, len(blob), 16)]


@pytest.fixture
def history(lua: Lua, keys: QueueKeys) -> Callable[[int, int], Any]:
    script = lua("history")
    return lambda minutes, hours: script(keys=[*keys.history_keys], args=[minutes, hours])


@pytest.fixture
def read_now(
    history: Callable[[int, int], Any], server_ms: Callable[[], int]
) -> Callable[[Callable[[int], None], int, int], Any]:
    """Write rings for the current minute (``write(now_ms)``), then read them; tried again if
    the minute turned between the write and the read."""

    def run(write: Callable[[int], None], minutes: int, hours: int) -> Any:
        for _ in range(3):
            now = server_ms()
            write(now)
            reply = history(minutes, hours)
            if reply[0] // 60_000 == now // 60_000:
                return reply
        raise AssertionError("the minute kept turning")

    return run


def test_history_of_a_queue_without_events_reads_zeros_and_writes_nothing(
    history: Callable[[int, int], Any], redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    before = server_ms()
    now, minutes, hours, pending, pending_slot = history(3, 2)
    assert before <= now <= server_ms()
    assert minutes == bytes(3 * 16)
    assert hours == bytes(2 * 16)
    assert pending == 0
    assert pending_slot == ZERO
    assert redis_client.keys("*") == []


def test_history_reads_the_current_minute_and_hour_last(
    read_now: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    def write(now: int) -> None:
        minute = now // 60_000
        _put_minute(redis_client, keys, minute, _slot(minute, 5, 1, 2))
        _put_minute(redis_client, keys, minute - 2, _slot(minute - 2, 7))
        _put_hour(redis_client, keys, minute // 60, _slot(minute // 60, 40, 3))
        _put_hour(redis_client, keys, minute // 60 - 1, _slot(minute // 60 - 1, 90))

    now, minutes, hours, _, _ = read_now(write, 3, 3)
    minute = now // 60_000
    assert _split(minutes) == [_slot(minute - 2, 7), ZERO, _slot(minute, 5, 1, 2)]
    assert _split(hours) == [ZERO, _slot(minute // 60 - 1, 90), _slot(minute // 60, 40, 3)]


def test_history_returns_the_last_active_minute_named_in_the_header_and_its_slot(
    read_now: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    def write(now: int) -> None:
        last = now // 60_000 - 4
        _put_minute(redis_client, keys, last, _slot(last, 3, 2, 1))
        redis_client.setrange(keys.minutes, 0, struct.pack(">I", last))

    now, _, _, pending, pending_slot = read_now(write, 1, 1)
    assert pending == now // 60_000 - 4
    assert pending_slot == _slot(pending, 3, 2, 1)


def test_history_returns_slots_as_stored_even_when_their_stamp_is_from_a_lap_before(
    read_now: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    # The reader (_history.py) tells stale slots by their stamp: the script hands them over.
    def write(now: int) -> None:
        minute = now // 60_000
        _put_minute(redis_client, keys, minute, _slot(minute - HISTORY_MINUTES, 9))

    now, minutes, _, _, _ = read_now(write, 1, 1)
    assert minutes == _slot(now // 60_000 - HISTORY_MINUTES, 9)


def test_history_reads_the_whole_ring_across_its_wrap_oldest_first(
    read_now: Callable[..., Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    def write(now: int) -> None:
        minute = now // 60_000
        oldest = minute - HISTORY_MINUTES + 1
        _put_minute(redis_client, keys, oldest, _slot(oldest, 1))
        _put_minute(redis_client, keys, minute, _slot(minute, 2))
        hour = minute // 60
        _put_hour(redis_client, keys, hour - HISTORY_HOURS + 1, _slot(hour - HISTORY_HOURS + 1, 3))
        _put_hour(redis_client, keys, hour, _slot(hour, 4))

    now, minutes, hours, _, _ = read_now(write, HISTORY_MINUTES, HISTORY_HOURS)
    minute, hour = now // 60_000, now // 3_600_000
    got_minutes, got_hours = _split(minutes), _split(hours)
    assert len(got_minutes) == HISTORY_MINUTES
    assert got_minutes[0] == _slot(minute - HISTORY_MINUTES + 1, 1)
    assert got_minutes[-1] == _slot(minute, 2)
    assert set(got_minutes[1:-1]) == {ZERO}
    assert len(got_hours) == HISTORY_HOURS
    assert got_hours[0] == _slot(hour - HISTORY_HOURS + 1, 3)
    assert got_hours[-1] == _slot(hour, 4)
    assert set(got_hours[1:-1]) == {ZERO}


@pytest.mark.parametrize(
    ("asked", "expected"),
    [((0, 0), (1, 1)), ((-5, -5), (1, 1)), ((10**6, 10**6), (HISTORY_MINUTES, HISTORY_HOURS))],
)
def test_history_clamps_the_counts_asked_to_the_rings(
    history: Callable[[int, int], Any], asked: tuple[int, int], expected: tuple[int, int]
) -> None:
    _, minutes, hours, _, _ = history(*asked)
    assert (len(minutes) // 16, len(hours) // 16) == expected


def test_history_writes_nothing_on_written_rings(
    history: Callable[[int, int], Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    minute = server_ms() // 60_000
    _put_minute(redis_client, keys, minute - 1, _slot(minute - 1, 1))
    redis_client.setrange(keys.minutes, 0, struct.pack(">I", minute - 1))
    _put_hour(redis_client, keys, minute // 60, _slot(minute // 60, 1))
    before = {key: redis_client.get(key) for key in keys.history_keys}
    history(60, 24)
    assert {key: redis_client.get(key) for key in keys.history_keys} == before
