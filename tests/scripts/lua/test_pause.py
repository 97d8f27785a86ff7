"""pause.lua: pause or resume a queue fleet-wide. The paused key holds since when the queue
is paused (server clock); pausing twice keeps the first time, resuming deletes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from dramatiq_redisson._keys import QueueKeys

from .state import Lua


@pytest.fixture
def pause(lua: Lua, keys: QueueKeys) -> Callable[[str], Any]:
    script = lua("pause")
    return lambda op: script(keys=[keys.paused], args=[op])


def test_pause_of_a_running_queue_marks_it_paused_since_the_server_now(
    pause: Callable[[str], Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    before = server_ms()
    changed, since = pause("pause")
    assert changed == 1
    assert before <= since <= server_ms()
    assert redis_client.get(keys.paused) == str(since).encode()
    assert redis_client.pttl(keys.paused) == -1  # lasts until resumed
    assert redis_client.keys("*") == [keys.paused.encode()]


def test_pause_of_a_paused_queue_changes_nothing_and_reports_the_first_time(
    pause: Callable[[str], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.paused, 1_700_000_000_000)
    assert pause("pause") == [0, 1_700_000_000_000]
    assert redis_client.get(keys.paused) == b"1700000000000"


def test_pause_of_a_queue_marked_without_a_time_reports_the_server_now(
    pause: Callable[[str], Any], keys: QueueKeys, redis_client: redis.Redis, server_ms: Callable[[], int]
) -> None:
    redis_client.set(keys.paused, "yes")
    before = server_ms()
    changed, since = pause("pause")
    assert changed == 0
    assert before <= since <= server_ms()
    assert redis_client.get(keys.paused) == b"yes"


def test_resume_of_a_paused_queue_deletes_the_mark(
    pause: Callable[[str], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.paused, 1_700_000_000_000)
    assert pause("resume") == [1, -1]
    assert redis_client.exists(keys.paused) == 0


def test_resume_of_a_running_queue_changes_nothing(pause: Callable[[str], Any], redis_client: redis.Redis) -> None:
    assert pause("resume") == [0, -1]
    assert redis_client.keys("*") == []


def test_pause_then_resume_then_pause_again_starts_a_new_pause(
    pause: Callable[[str], Any], keys: QueueKeys, redis_client: redis.Redis
) -> None:
    redis_client.set(keys.paused, 1)
    assert pause("resume") == [1, -1]
    changed, since = pause("pause")
    assert changed == 1
    assert since > 1
    assert redis_client.get(keys.paused) == str(since).encode()


@pytest.mark.parametrize("op", ["Pause", "resum", ""])
def test_an_unknown_operation_is_refused_and_leaves_the_mark_alone(
    pause: Callable[[str], Any], keys: QueueKeys, redis_client: redis.Redis, op: str
) -> None:
    redis_client.set(keys.paused, 1_700_000_000_000)
    with pytest.raises(redis.ResponseError, match='the operation is "pause" or "resume"'):
        pause(op)
    assert redis_client.get(keys.paused) == b"1700000000000"
