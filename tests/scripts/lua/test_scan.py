"""scan.lua: one page of scheduled messages in due order (equal due times in offer
order), after a cursor (the due time and member of the previous page's last entry),
with their stored payloads; the cursor of the next page, or "" at the end. A cursor
whose entry is gone resumes at the first entry after its place. Reads only."""

from __future__ import annotations

from typing import Any

import redis

from dramatiq_redisson._ids import next_sort_keys
from dramatiq_redisson._keys import QueueKeys

from .state import Lua, schedule_entry


def _scan(lua: Lua, keys: QueueKeys, size: int, due: Any = "", member: Any = "") -> Any:
    return lua("scan")(keys=[keys.timeout_zset, keys.payloads], args=[size, due, member])


def _schedule(client: redis.Redis, keys: QueueKeys, dues: list[tuple[str, int]]) -> list[bytes]:
    """Schedule (message id, due) in offer order; returns their members."""
    members = []
    for sort_key, (message_id, due) in zip(next_sort_keys(len(dues)), dues, strict=True):
        entry = schedule_entry(client, keys, message_id, due, data=f"data-{message_id}".encode(), sort_key=sort_key)
        members.append(entry.member)
    return members


def _page(members: list[bytes], dues: list[int]) -> list[Any]:
    flat: list[Any] = []
    for member, due in zip(members, dues, strict=True):
        flat += [member, str(due).encode(), member[:14] + b"data-" + member[14:]]
    return flat


def test_scan_of_an_empty_queue_is_an_empty_last_page(lua: Lua, keys: QueueKeys) -> None:
    assert _scan(lua, keys, 10) == [[], b"", b""]


def test_scan_pages_through_in_due_order_with_cursors(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    # Offered in another order than they come due.
    a, b, c, d, e = _schedule(
        redis_client, keys, [("a", 5_000), ("b", 1_000), ("c", 4_000), ("d", 2_000), ("e", 3_000)]
    )
    first = _scan(lua, keys, 2)
    assert first == [_page([b, d], [1_000, 2_000]), b"2000", d]
    second = _scan(lua, keys, 2, first[1], first[2])
    assert second == [_page([e, c], [3_000, 4_000]), b"4000", c]
    # A short page is the last one: its cursor is "".
    assert _scan(lua, keys, 2, second[1], second[2]) == [_page([a], [5_000]), b"", b""]


def test_scan_a_full_last_page_gives_a_cursor_and_then_an_empty_page(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    a, b = _schedule(redis_client, keys, [("a", 1_000), ("b", 2_000)])
    page = _scan(lua, keys, 2)
    assert page == [_page([a, b], [1_000, 2_000]), b"2000", b]
    assert _scan(lua, keys, 2, page[1], page[2]) == [[], b"", b""]


def test_scan_keeps_offer_order_among_equal_due_times(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    # Message ids that sort the other way round: the sort key decides.
    members = _schedule(redis_client, keys, [("z", 1_000), ("y", 1_000), ("x", 1_000), ("w", 1_000)])
    first = _scan(lua, keys, 3)
    assert first == [_page(members[:3], [1_000] * 3), b"1000", members[2]]
    assert _scan(lua, keys, 3, first[1], first[2]) == [_page(members[3:], [1_000]), b"", b""]


def test_scan_after_a_cursor_entry_that_moved_resumes_after_its_place(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    members = _schedule(redis_client, keys, [("a", 1_000), ("b", 1_000), ("c", 1_000), ("d", 1_000), ("e", 2_000)])
    first = _scan(lua, keys, 2)
    assert first[1:] == [b"1000", members[1]]
    # The cursor's entry, and the one before it, leave (moved, cancelled).
    redis_client.zrem(keys.timeout_zset, members[0], members[1])
    page = _scan(lua, keys, 2, first[1], first[2])
    assert page == [_page(members[2:4], [1_000, 1_000]), b"1000", members[3]]


def test_scan_after_a_cursor_entry_that_was_rescheduled_resumes_after_its_old_place(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    members = _schedule(redis_client, keys, [("a", 1_000), ("b", 1_000), ("c", 1_000), ("d", 3_000)])
    first = _scan(lua, keys, 2)
    # The cursor's entry (b) is now due later than the rest: it is not seen twice, c is not skipped.
    redis_client.zadd(keys.timeout_zset, {members[1]: 9_000})
    page = _scan(lua, keys, 2, first[1], first[2])
    assert page == [_page([members[2], members[3]], [1_000, 3_000]), b"3000", members[3]]


def test_scan_after_a_gone_cursor_at_the_end_of_its_due_time_starts_at_the_next_due_time(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    members = _schedule(redis_client, keys, [("a", 1_000), ("b", 2_000), ("c", 3_000)])
    redis_client.zrem(keys.timeout_zset, members[0])
    assert _scan(lua, keys, 5, b"1000", members[0]) == [_page(members[1:], [2_000, 3_000]), b"", b""]


def test_scan_gives_a_false_payload_for_an_entry_whose_payload_is_gone(
    lua: Lua, keys: QueueKeys, redis_client: redis.Redis
) -> None:
    a, b = _schedule(redis_client, keys, [("a", 1_000), ("b", 2_000)])
    redis_client.hdel(keys.payloads, "a")
    page = _scan(lua, keys, 5)
    assert page == [[a, b"1000", None, *_page([b], [2_000])], b"", b""]


def test_scan_writes_nothing(lua: Lua, keys: QueueKeys, redis_client: redis.Redis) -> None:
    members = _schedule(redis_client, keys, [("a", 1_000), ("b", 2_000), ("c", 3_000)])
    before = {key: redis_client.dump(key) for key in redis_client.keys("*")}
    _scan(lua, keys, 1)
    _scan(lua, keys, 1, b"1000", members[0])
    _scan(lua, keys, 1, b"1500", b"gone")
    assert {key: redis_client.dump(key) for key in redis_client.keys("*")} == before
